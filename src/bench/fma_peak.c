/* fma_peak.c — the machine's vector FMA peak (bench.h, sbp_bench_fma_chains): the ceiling of
 * every product on this CPU, which the sgemm rate is not where the BLAS has no kernels for it
 * (Debian's OpenBLAS 0.3.21 runs its AVX2 kernels on AMD Zen 5). The chains are as many as the
 * product kernel's accumulators (src/kernels/gemm.c: 12 × 2 vectors with AVX-512, 6 × 2 with
 * AVX2 + FMA), more than an FMA unit's latency times its ports on every CPU we know, and nothing
 * is loaded or stored inside the loop. Each chain tends to 1 (x ← 0.5·x + 0.5), so no value
 * overflows or turns subnormal. */
#include "bench.h"

#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 vfloat;
#define VSET1(x)      _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VADD(a, b)    _mm512_add_ps(a, b)
#define VSTORE(p, a)  _mm512_storeu_ps(p, a)
enum { LANES = 16, CHAINS = 24 };
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 vfloat;
#define VSET1(x)      _mm256_set1_ps(x)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VADD(a, b)    _mm256_add_ps(a, b)
#define VSTORE(p, a)  _mm256_storeu_ps(p, a)
enum { LANES = 8, CHAINS = 12 };
#endif

int64_t sbp_bench_fma_chains(int64_t steps) {
#ifdef VFMA
    vfloat acc[CHAINS];
    const vfloat half = VSET1(0.5f);
    for (int i = 0; i < CHAINS; i++) acc[i] = VSET1((float)i);
    for (int64_t p = 0; p < steps; p++)
#pragma GCC unroll 24
        for (int i = 0; i < CHAINS; i++) acc[i] = VFMA(acc[i], half, half);
    vfloat sum = acc[0];
    for (int i = 1; i < CHAINS; i++) sum = VADD(sum, acc[i]);
    float out[LANES];
    VSTORE(out, sum);
    volatile float used = out[0]; /* the chains' results are used */
    (void)used;
    return steps * CHAINS * LANES * 2;
#else
    (void)steps; /* no vector fma in this build: its products run a scalar tile */
    return 0;
#endif
}
