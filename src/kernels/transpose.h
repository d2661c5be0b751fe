/* transpose.h — float transposes in registers, 16 × 16 with AVX-512 and 8 × 8 with AVX2, for the
 * operand packs of gemm.c and the key tiles of the fast attention (fast/attention.c). Copies, so
 * no bit depends on them. Defined only where they are used: real = float, AVX-512 or AVX2 + FMA
 * (the instruction sets gemm.c has kernels for). */
#ifndef SBP_TRANSPOSE_H
#define SBP_TRANSPOSE_H

#include "real.h"

#include <stddef.h>

#if defined(__AVX512F__) && !defined(SBP_REAL_F64)
#include <immintrin.h>

/* r[q] lane i = r[i] lane q, i, q < 16: 2×2 blocks of lanes (unpack ps), 4×4 (unpack pd),
 * then 128-bit lanes across registers in two rounds (shuffle f32x4). */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int h = 0; h < 2; h++) {
            const __m512d a = _mm512_castps_pd(t[i + h]), b = _mm512_castps_pd(t[i + h + 2]);
            r[i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

/* d[q·ld + i] = src[i·rs + q] for q < 16 and i < rows (≤ 16), 0 for rows ≤ i; only the lanes
 * in `lanes` of each d row are written. */
static inline void transpose_block(real *d, size_t ld, const real *src, size_t rs, int rows,
                                   __mmask16 lanes) {
    __m512 r[16];
    for (int i = 0; i < 16; i++)
        r[i] = i < rows ? _mm512_loadu_ps(src + (size_t)i * rs) : _mm512_setzero_ps();
    transpose16(r);
    for (int q = 0; q < 16; q++) _mm512_mask_storeu_ps(d + (size_t)q * ld, lanes, r[q]);
}
#elif defined(__AVX2__) && defined(__FMA__) && !defined(SBP_REAL_F64)
#include <immintrin.h>

/* r[q] lane i = r[i] lane q, i, q < 8: 2×2 blocks of lanes (unpack), 4×4 (shuffle), then the
 * 128-bit halves across registers (permute2f128). */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
    for (int i = 0; i < 8; i++) r[i] = t[i];
}

/* d[q·ld + i] = src[i·rs + q] for q < 8 and i < rows (≤ 8), 0 for rows ≤ i; lanes (8, or 6 for
 * an A panel) of each d row are written: a 6-lane row as 4 + 2, never past the row. */
static inline void transpose_block(real *d, size_t ld, const real *src, size_t rs, int rows,
                                   int lanes) {
    __m256 r[8];
    for (int i = 0; i < 8; i++)
        r[i] = i < rows ? _mm256_loadu_ps(src + (size_t)i * rs) : _mm256_setzero_ps();
    transpose8(r);
    for (int q = 0; q < 8; q++)
        if (lanes == 8)
            _mm256_storeu_ps(d + (size_t)q * ld, r[q]);
        else {
            _mm_storeu_ps(d + (size_t)q * ld, _mm256_castps256_ps128(r[q]));
            _mm_storel_pi((__m64 *)(d + (size_t)q * ld + 4), _mm256_extractf128_ps(r[q], 1));
        }
}
#endif

#endif
