/* vexp.h — rexp over a row in SIMD registers, with rexp's bits.
 *
 *   exp_shift(y, x, n, shift, scale):   y[i] = scale · rexp(x[i] − shift),  i < n  (y may be x)
 *   exp_neg(y, x, n):                   y[i] = rexp(−x[i])  (SwiGLU's sigmoids; y may be x)
 *   vexp_lane_sums(s, x, n, shift):     s[k] = Σ_{i ≡ k mod 32} (double)rexp(x[i] − shift),
 *                                       i ascending (lanes.h's lanes_exp_sum_d before its tree)
 *
 * The exponentials of attention's softmax (T²/2 per head and layer, forward and backward) and of
 * the vocabulary's log-softmax (T·V, twice) are the step's largest elementwise work. GCC
 * vectorizes sbp_pexpf's scalar code as written, selects and all; written in intrinsics it runs
 * faster (the dated rates: docs/performance-log.md, "The softmaxes' exponentials"): with
 * AVX-512, vscalefps computes p·2^n with one correct rounding, subnormals included, which is
 * what sbp_pexpf spells out in two exact products and a rounded one; with AVX2 those steps
 * stay, in integer lanes. The result is the
 * same float as rexp's for every one of the 2^32 inputs (tests/test_vexp.c: a sample of every
 * exponent and every float around each threshold in CI, all 2^32 with SBP_VEXP_EXHAUSTIVE=1),
 * so no bit of either numerics mode changes, the portable ones included, and the CUDA kernels
 * still match. Each lane is rexp of its own element: nothing depends on n or the lane.
 *
 * Other builds (plain x86-64, real = double) run the scalar loops. */
#ifndef SBP_VEXP_H
#define SBP_VEXP_H

#include "real.h"

#if !defined(SBP_REAL_F64) && (defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)))
#include <immintrin.h>
#define SBP_VEXP 1
#endif

#if defined(SBP_VEXP) && defined(__AVX512F__)
/* sbp_pexpf's reduction and polynomial on xc (clamped): p = exp(r) and n, xc = n·ln 2 + r */
static inline __m512 vexp16_poly(__m512 xc, __m512 *n) {
    const __m512 shifter = _mm512_set1_ps(SBP_EXPF_ROUND);
    *n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(SBP_EXPF_LOG2E), shifter), shifter);
    __m512 r = _mm512_fmadd_ps(*n, _mm512_set1_ps(-SBP_EXPF_LN2_HI), xc);
    r = _mm512_fmadd_ps(*n, _mm512_set1_ps(-SBP_EXPF_LN2_LO), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
}

/* rexp of each lane: sbp_pexpf's clamps, reduction and polynomial, then 2^n by vscalefps */
static inline __m512 vexp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(SBP_EXPF_LO), hi = _mm512_set1_ps(SBP_EXPF_HI);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    /* max and min return their second operand for a NaN first: NaN lanes compute on −104 */
    __m512 n;
    const __m512 p = vexp16_poly(_mm512_min_ps(_mm512_max_ps(x, lo), hi), &n);
    __m512 y = _mm512_scalef_ps(p, n);
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), y, _mm512_setzero_ps());
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), y, _mm512_set1_ps(INFINITY));
    return _mm512_mask_blend_ps(nan, y, x);
}

/* vexp16, without its clamps and selects where every lane is in [−104, 88.7] (not NaN): there
 * they change nothing, so the bits are the same (the softmaxes' rows, but for masked and
 * underflowing entries; about a quarter fewer instructions) */
static inline __m512 vexp16_row(__m512 x) {
    const __mmask16 in = _mm512_cmp_ps_mask(x, _mm512_set1_ps(SBP_EXPF_LO), _CMP_GE_OQ) &
                         _mm512_cmp_ps_mask(x, _mm512_set1_ps(SBP_EXPF_HI), _CMP_LE_OQ);
    if (in != 0xffff) return vexp16(x);
    __m512 n;
    const __m512 p = vexp16_poly(x, &n);
    return _mm512_scalef_ps(p, n);
}

/* lanes [0, n) of 16: none for n ≤ 0, all for n ≥ 16 */
static inline __mmask16 vexp_mask16(int n) {
    return n <= 0 ? 0 : n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* rexp(x[i] − shift) for i < n (≤ 16), 0 in the lanes past n (no memory read there) */
static inline __m512 vexp_row16(const float *x, int n, __m512 shift) {
    return _mm512_maskz_mov_ps(
        vexp_mask16(n), vexp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(vexp_mask16(n), x), shift)));
}

static inline void exp_shift(real *y, const real *x, int n, real shift, real scale) {
    const __m512 sh = _mm512_set1_ps(shift), sc = _mm512_set1_ps(scale);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i,
                         _mm512_mul_ps(sc, vexp16_row(_mm512_sub_ps(_mm512_loadu_ps(x + i), sh))));
    if (i < n) /* the tail, masked */
        _mm512_mask_storeu_ps(y + i, vexp_mask16(n - i),
                              _mm512_mul_ps(sc, vexp_row16(x + i, n - i, sh)));
}

static inline void exp_neg(real *y, const real *x, int n) {
    const __m512i sign = _mm512_set1_epi32(INT32_MIN); /* −x exactly, NaNs' signs included */
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, vexp16_row(_mm512_castsi512_ps(_mm512_xor_si512(
                                    _mm512_castps_si512(_mm512_loadu_ps(x + i)), sign))));
    for (; i < n; i++) y[i] = rexp(-x[i]);
}

/* 16 floats widened (exactly) into two vectors of 8 doubles, added to lanes a and b; a lane
 * past n adds +0, which changes no sum (the lanes start at +0 and add values ≥ 0 or NaN) */
static inline void vexp_acc16(__m512d *a, __m512d *b, __m512 e) {
    *a = _mm512_add_pd(*a, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    *b = _mm512_add_pd(
        *b, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
}

static inline void vexp_lane_sums(double s[32], const real *x, int n, real shift) {
    const __m512 sh = _mm512_set1_ps(shift);
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    int c = 0;
    for (; c + 32 <= n; c += 32) {
        vexp_acc16(&a0, &a1, vexp16_row(_mm512_sub_ps(_mm512_loadu_ps(x + c), sh)));
        vexp_acc16(&a2, &a3, vexp16_row(_mm512_sub_ps(_mm512_loadu_ps(x + c + 16), sh)));
    }
    if (c < n) { /* the tail, masked */
        vexp_acc16(&a0, &a1, vexp_row16(x + c, n - c, sh));
        vexp_acc16(&a2, &a3, vexp_row16(x + c + 16, n - c - 16, sh));
    }
    _mm512_storeu_pd(s, a0), _mm512_storeu_pd(s + 8, a1);
    _mm512_storeu_pd(s + 16, a2), _mm512_storeu_pd(s + 24, a3);
}
#elif defined(SBP_VEXP)
/* AVX2 + FMA: the same steps in 8 lanes, 2^n assembled as sbp_pexpf does. The reduction and
 * polynomial on xc (clamped): p = exp(r) and n, xc = n·ln 2 + r */
static inline __m256 vexp8_poly(__m256 xc, __m256 *n) {
    const __m256 shifter = _mm256_set1_ps(SBP_EXPF_ROUND);
    *n = _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(SBP_EXPF_LOG2E), shifter), shifter);
    __m256 r = _mm256_fmadd_ps(*n, _mm256_set1_ps(-SBP_EXPF_LN2_HI), xc);
    r = _mm256_fmadd_ps(*n, _mm256_set1_ps(-SBP_EXPF_LN2_LO), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    return _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
}

static inline __m256 vexp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(SBP_EXPF_LO), hi = _mm256_set1_ps(SBP_EXPF_HI);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 n; /* NaN lanes compute on −104 */
    const __m256 p = vexp8_poly(_mm256_min_ps(_mm256_max_ps(x, lo), hi), &n);
    /* (p · 2^(n−1)) · 2, or for n < SBP_EXPF_TINY_N (p · 2^(n+64)) · 2^−64: n integral, exact */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(SBP_EXPF_TINY_N), ni);
    const __m256i bias =
        _mm256_blendv_epi8(_mm256_set1_epi32(127 - 1), _mm256_set1_epi32(127 + 64), tiny);
    const __m256 s = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, bias), 23));
    const __m256 post =
        _mm256_blendv_ps(_mm256_set1_ps(2.0f), _mm256_set1_ps(0x1p-64f), _mm256_castsi256_ps(tiny));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s), post);
    y = _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), y); /* +0 below −104 */
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
    return _mm256_blendv_ps(y, x, nan);
}

/* vexp8, without its clamps and selects where every lane is in [SBP_VEXP_FAST_LO, 88.7] (not
 * NaN): there they change nothing and n ≥ SBP_EXPF_TINY_N (x ≥ −69 gives n ≥ −100), so the same
 * bits (the softmaxes' rows, but for masked and underflowing entries; 11 of about 32
 * instructions fewer) */
#define SBP_VEXP_FAST_LO (-69.0f)
static inline __m256 vexp8_row(__m256 x) {
    const __m256 in = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(SBP_VEXP_FAST_LO), _CMP_GE_OQ),
                                    _mm256_cmp_ps(x, _mm256_set1_ps(SBP_EXPF_HI), _CMP_LE_OQ));
    if (_mm256_movemask_ps(in) != 0xff) return vexp8(x);
    __m256 n;
    const __m256 p = vexp8_poly(x, &n);
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127 - 1));
    const __m256 s = _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s), _mm256_set1_ps(2.0f));
}

/* lanes [0, n) of 8 as an integer mask: none for n ≤ 0, all for n ≥ 8 */
static inline __m256i vexp_mask8(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* rexp(x[i] − shift) for i < n (≤ 8), +0 in the lanes past n (no memory read there) */
static inline __m256 vexp_row8(const float *x, int n, __m256 shift) {
    const __m256i k = vexp_mask8(n);
    return _mm256_and_ps(_mm256_castsi256_ps(k),
                         vexp8(_mm256_sub_ps(_mm256_maskload_ps(x, k), shift)));
}

/* masked loads and stores (vmaskmovps) in the tail only: on Zen 4 a loop of them ran a row
 * slower than GCC's vectorized scalar code (0.95 against 0.78 ns an element) */
static inline void exp_shift(real *y, const real *x, int n, real shift, real scale) {
    const __m256 sh = _mm256_set1_ps(shift), sc = _mm256_set1_ps(scale);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_mul_ps(sc, vexp8_row(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh))));
    if (i < n)
        _mm256_maskstore_ps(y + i, vexp_mask8(n - i),
                            _mm256_mul_ps(sc, vexp_row8(x + i, n - i, sh)));
}

static inline void exp_neg(real *y, const real *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f); /* −x exactly, NaNs' signs included */
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, vexp8_row(_mm256_xor_ps(_mm256_loadu_ps(x + i), sign)));
    for (; i < n; i++) y[i] = rexp(-x[i]);
}

/* 8 floats widened (exactly) into two vectors of 4 doubles, added to lanes a and b; a lane past
 * n adds +0, which changes no sum (the lanes start at +0 and add values ≥ 0 or NaN) */
static inline void vexp_acc8(__m256d *a, __m256d *b, __m256 e) {
    *a = _mm256_add_pd(*a, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    *b = _mm256_add_pd(*b, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
}

static inline void vexp_lane_sums(double s[32], const real *x, int n, real shift) {
    const __m256 sh = _mm256_set1_ps(shift);
    __m256d a[8];
    for (int v = 0; v < 8; v++) a[v] = _mm256_setzero_pd();
    int c = 0;
    for (; c + 32 <= n; c += 32)
        for (int q = 0; q < 4; q++) /* lanes 8q .. 8q + 7 */
            vexp_acc8(&a[2 * q], &a[2 * q + 1],
                      vexp8_row(_mm256_sub_ps(_mm256_loadu_ps(x + c + 8 * q), sh)));
    if (c < n) /* the tail, masked */
        for (int q = 0; q < 4; q++)
            vexp_acc8(&a[2 * q], &a[2 * q + 1], vexp_row8(x + c + 8 * q, n - c - 8 * q, sh));
    for (int v = 0; v < 8; v++) _mm256_storeu_pd(s + 4 * v, a[v]);
}
#else
static inline void exp_shift(real *y, const real *x, int n, real shift, real scale) {
    for (int i = 0; i < n; i++) y[i] = scale * rexp(x[i] - shift);
}

static inline void exp_neg(real *y, const real *x, int n) {
    for (int i = 0; i < n; i++) y[i] = rexp(-x[i]);
}
#endif

#endif
