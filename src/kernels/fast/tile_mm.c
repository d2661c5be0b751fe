/* fast/tile_mm.c — the attention tiles' matrix product, register-blocked, A read in place.
 *
 *   C[i][j] = (beta ? C[i][j] : 0) + alpha · acc[i][j],
 *   acc[i][j] = fma(A(i,k−1), B[k−1][j], … fma(A(i,1), B[1][j], fma(A(i,0), B[0][j], 0)))
 *
 * one ascending fma chain per element over p = 0 .. k−1. A(i,p) = A[i·ars + p·acs], so A or Aᵀ
 * is read in place; B is row-major. Every element is computed by this same chain whichever
 * register block, vector or scalar tail it falls in (a vector fma rounds as the scalar one),
 * so an element's bits depend on its operands and k alone — not on m, n, the block shape or
 * the machine's vector width.
 *
 * Why not BLAS: the attention tiles are small (≤ 128 × 128 × 128) and read strided rows of
 * Q, K, V and their gradients; a BLAS call packs both operands for every tile and its packing
 * took a fifth of the step at these shapes (perf, bench model). Here A is broadcast an element
 * at a time where it lies and B's rows are streamed as vectors, on AVX2 from a copy of one
 * column strip at a time (PACK_B below). */
#include "fast.h"

#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#ifdef SBP_REAL_F64
typedef __m512d vreal;
#define VL       8
#define vzero()  _mm512_setzero_pd()
#define vset(x)  _mm512_set1_pd(x)
#define vload(p) _mm512_loadu_pd(p)
#define vstore   _mm512_storeu_pd
#define vfma     _mm512_fmadd_pd
#define vmul     _mm512_mul_pd
#define vadd     _mm512_add_pd
#else
typedef __m512 vreal;
#define VL       16
#define vzero()  _mm512_setzero_ps()
#define vset(x)  _mm512_set1_ps(x)
#define vload(p) _mm512_loadu_ps(p)
#define vstore   _mm512_storeu_ps
#define vfma     _mm512_fmadd_ps
#define vmul     _mm512_mul_ps
#define vadd     _mm512_add_ps
#endif
enum { MR = 6, NV = 4 }; /* 24 accumulators, 4 rows of B and a broadcast: 29 of 32 registers */
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#ifdef SBP_REAL_F64
typedef __m256d vreal;
#define VL       4
#define vzero()  _mm256_setzero_pd()
#define vset(x)  _mm256_set1_pd(x)
#define vload(p) _mm256_loadu_pd(p)
#define vstore   _mm256_storeu_pd
#define vfma     _mm256_fmadd_pd
#define vmul     _mm256_mul_pd
#define vadd     _mm256_add_pd
#else
typedef __m256 vreal;
#define VL       8
#define vzero()  _mm256_setzero_ps()
#define vset(x)  _mm256_set1_ps(x)
#define vload(p) _mm256_loadu_ps(p)
#define vstore   _mm256_storeu_ps
#define vfma     _mm256_fmadd_ps
#define vmul     _mm256_mul_ps
#define vadd     _mm256_add_ps
#endif
enum { MR = 6, NV = 2 }; /* 12 accumulators, 2 rows of B and a broadcast: 15 of 16 registers */
#define PACK_B 1 /* measured here only: tile_mm below */
#else
/* no vector fma: one-lane "vectors", the same chains through rfma */
typedef real vreal;
#define VL           1
#define vzero()      ((real)0)
#define vset(x)      (x)
#define vload(p)     (*(p))
#define vstore(p, x) (*(p) = (x))
#define vfma         rfma
#define vmul(a, b)   ((a) * (b))
#define vadd(a, b)   ((a) + (b))
enum { MR = 4, NV = 4 };
#endif

/* One mr × nv·VL block of C; mr and nv are constants at every call, so the loops unroll and
 * the accumulators live in registers. */
static inline __attribute__((always_inline)) void block(real *C, size_t ldc, const real *A,
                                                        size_t ars, size_t acs, const real *B,
                                                        size_t ldb, int k, real alpha, int beta,
                                                        const int mr, const int nv) {
    vreal acc[6][NV]; /* mr ≤ 6: MR, or a remainder block of ROWS (plain C: MR = 4) */
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++) acc[i][v] = vzero();
    for (int p = 0; p < k; p++) {
        const real *b = B + (size_t)p * ldb, *a = A + (size_t)p * acs;
        vreal bv[NV];
        for (int v = 0; v < nv; v++) bv[v] = vload(b + v * VL);
        for (int i = 0; i < mr; i++) {
            const vreal ai = vset(a[(size_t)i * ars]);
            for (int v = 0; v < nv; v++) acc[i][v] = vfma(ai, bv[v], acc[i][v]);
        }
    }
    const vreal al = vset(alpha);
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++) {
            real *c = C + (size_t)i * ldc + v * VL;
            const vreal t = vmul(al, acc[i][v]);
            vstore(c, beta ? vadd(vload(c), t) : t);
        }
}

/* Columns [j0, n) (fewer than VL): the same chain per element, in scalars. */
static void tail(real *C, size_t ldc, const real *A, size_t ars, size_t acs, const real *B,
                 size_t ldb, int m, int j0, int n, int k, real alpha, int beta) {
    for (int i = 0; i < m; i++)
        for (int j = j0; j < n; j++) {
            real acc = 0;
            for (int p = 0; p < k; p++)
                acc = rfma(A[(size_t)i * ars + (size_t)p * acs], B[(size_t)p * ldb + j], acc);
            const real t = alpha * acc;
            C[(size_t)i * ldc + j] = beta ? C[(size_t)i * ldc + j] + t : t;
        }
}

/* Rows [0, m) of columns j .. j + nv·VL: full MR-row blocks, then the last m mod MR rows in one
 * block of that many (MR ≤ 6); single rows there read B once a row, and a 64-row tile (10 blocks
 * of 6, then 4 rows) ran 8-15% slower than with one 4-row block (AVX2 and AVX-512, 1 thread). */
#define ROWS(nv, Bj, ldbj)                                                                         \
    do {                                                                                           \
        int i = 0;                                                                                 \
        for (; i + MR <= m; i += MR) ROW_BLOCK(MR, nv, Bj, ldbj);                                  \
        switch (m - i) {                                                                           \
        case 5: ROW_BLOCK(5, nv, Bj, ldbj); break;                                                 \
        case 4: ROW_BLOCK(4, nv, Bj, ldbj); break;                                                 \
        case 3: ROW_BLOCK(3, nv, Bj, ldbj); break;                                                 \
        case 2: ROW_BLOCK(2, nv, Bj, ldbj); break;                                                 \
        case 1: ROW_BLOCK(1, nv, Bj, ldbj); break;                                                 \
        }                                                                                          \
    } while (0)
#define ROW_BLOCK(mr, nv, Bj, ldbj)                                                                \
    block(C + (size_t)i * ldc + j, ldc, A + (size_t)i * ars, ars, acs, Bj, ldbj, k, alpha, beta,   \
          mr, nv)
_Static_assert(MR <= 6, "ROWS's remainder cases");

#ifdef PACK_B
/* Why B's column strips are copied (AVX2): a strip of NV·VL columns is k rows of 64 bytes, and
 * in the tiles B's rows are W or HD reals apart (512 bytes at 128), so the strip's 128 lines fall
 * into 8 of L1's 64 sets, twice as many as their 8 ways hold: every block of MR rows read it
 * again from L2. Copied into k contiguous rows it stays in L1 for all m / MR blocks. Qwen3-0.6B,
 * T = 2048, 2 threads, Zen 3: the attention's time in a step 1-9% less, the step's 1-5%
 * (docs/performance.md, "The AVX2 path"). A copy changes no value, so no bit. Not measured on
 * AVX-512, whose strip of 64 columns at k = 128 would fill L1 by itself: not done there (the
 * float64 build copies, unmeasured: its strip rows are 64 bytes too). */
enum { PACK_K = 256 }; /* the largest k copied: W ≤ 128, HD ≤ 256 in the shipped configs */

static void pack_strip(real *pb, const real *B, size_t ldb, int k) {
    for (int p = 0; p < k; p++)
        memcpy(pb + (size_t)p * NV * VL, B + (size_t)p * ldb, sizeof(real) * NV * VL);
}
#endif

void tile_mm(real *C, size_t ldc, const real *A, size_t ars, size_t acs, const real *B, size_t ldb,
             int m, int n, int k, real alpha, int beta) {
    int j = 0;
#ifdef PACK_B
    if (m > MR && k <= PACK_K) {
        real pb[PACK_K * NV * VL] __attribute__((aligned(64)));
        for (; j + NV * VL <= n; j += NV * VL) {
            pack_strip(pb, B + j, ldb, k);
            ROWS(NV, pb, (size_t)NV * VL);
        }
    }
#endif
    for (; j + NV * VL <= n; j += NV * VL) ROWS(NV, B + j, ldb);
    for (; j + VL <= n; j += VL) ROWS(1, B + j, ldb);
    if (j < n) tail(C, ldc, A, ars, acs, B, ldb, m, j, n, k, alpha, beta);
}
