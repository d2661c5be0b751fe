/* transpose.h — 16 × 16 float transposes in AVX-512 registers, for the operand packs of gemm.c
 * and the key tiles of the fast attention (blas/attention.c). Copies, so no bit depends on them.
 * Defined only where they are used: AVX-512 and real = float. */
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
#endif

#endif
