/* vtanh.h — GELU's tanh over a row in SIMD registers, with gelu.h's bits.
 *
 *   gelu_t_row(t, g, n):   t[i] = gelu_tanh_t(g[i]) = tanh(β·(g + κ·g³)),  i < n  (float only)
 *
 * Gemma-3's GeGLU evaluates this tanh three times per element of the MLP's intermediate and
 * layer (the forward, the forward formed again in the backward, the backward), and pmath.h's
 * sbp_ptanhf is a double expm1 (an exp, a log, three divisions) one element at a time: 28.6% of
 * a Gemma-3-1B step before this file (docs/performance.md). Here the argument is formed in float
 * lanes, as gelu_tanh_t does, widened exactly to double lanes, and sbp_ptanh's operations run on
 * them in its order:
 *   a = |x| (−0 stays −0, as `x < 0 ? −x : x`), y = 2a, u = sbp_pexp(y),
 *   e = y where u = 1, else ((u − 1)·y) / sbp_plog(u),  t = e / (e + 2),  ±t by x's sign,
 *   ±1 where |x| > 22, x itself where it is NaN,
 * then rounded once to float. For y ∈ [0, 44] sbp_pexp's clamps and its tiny path never act and
 * 2^n·p is exact, so vscalefpd (AVX-512) or the exponent built in integer lanes (AVX2) gives its
 * bits; sbp_plog's argument is a normal u ≥ 1, so its special cases never act either. Lanes
 * past |x| = 22 or NaN compute on 0 and are replaced. The result is the float sbp_ptanhf gives
 * for every one of the 2^32 inputs (tests/test_vtanh.c: a sample in CI, all of them with
 * SBP_VTANH_EXHAUSTIVE=1), so no bit of either numerics mode changes and the CUDA kernel, which
 * runs gelu.h, still matches. Each lane is its own element's function: nothing depends on n.
 *
 * Other builds (plain x86-64, real = double) run the scalar loop. */
#ifndef SBP_VTANH_H
#define SBP_VTANH_H

#include "gelu.h"
#include "real.h"

#if !defined(SBP_REAL_F64) && (defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)))
#include <immintrin.h>
#include <stdint.h>
#define SBP_VTANH 1
#endif

#if defined(SBP_VTANH) && defined(__AVX512F__)
#define VT_PD           __m512d
#define VT_PI           __m512i
#define vt_set1(c)      _mm512_set1_pd(c)
#define vt_seti(c)      _mm512_set1_epi64(c)
#define vt_add(a, b)    _mm512_add_pd(a, b)
#define vt_sub(a, b)    _mm512_sub_pd(a, b)
#define vt_mul(a, b)    _mm512_mul_pd(a, b)
#define vt_div(a, b)    _mm512_div_pd(a, b)
#define vt_fma(a, b, c) _mm512_fmadd_pd(a, b, c)
#define vt_as_i(a)      _mm512_castpd_si512(a)
#define vt_as_d(a)      _mm512_castsi512_pd(a)
#define vt_addi(a, b)   _mm512_add_epi64(a, b)
#define vt_subi(a, b)   _mm512_sub_epi64(a, b)
#define vt_andi(a, b)   _mm512_and_si512(a, b)
#define vt_srli(a, c)   _mm512_srli_epi64(a, c)
#define vt_xori(a, b)   _mm512_xor_si512(a, b)
typedef __mmask8 vt_mask;
#define vt_lt(a, b)         _mm512_cmp_pd_mask(a, b, _CMP_LT_OQ)
#define vt_le(a, b)         _mm512_cmp_pd_mask(a, b, _CMP_LE_OQ)
#define vt_eq(a, b)         _mm512_cmp_pd_mask(a, b, _CMP_EQ_OQ)
#define vt_unord(a)         _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q)
#define vt_pick(m, yes, no) _mm512_mask_blend_pd(m, no, yes)
#define vt_scale2n(p, n)    _mm512_scalef_pd(p, n) /* p·2^n, exact here */
#elif defined(SBP_VTANH)
#define VT_PD               __m256d
#define VT_PI               __m256i
#define vt_set1(c)          _mm256_set1_pd(c)
#define vt_seti(c)          _mm256_set1_epi64x(c)
#define vt_add(a, b)        _mm256_add_pd(a, b)
#define vt_sub(a, b)        _mm256_sub_pd(a, b)
#define vt_mul(a, b)        _mm256_mul_pd(a, b)
#define vt_div(a, b)        _mm256_div_pd(a, b)
#define vt_fma(a, b, c)     _mm256_fmadd_pd(a, b, c)
#define vt_as_i(a)          _mm256_castpd_si256(a)
#define vt_as_d(a)          _mm256_castsi256_pd(a)
#define vt_addi(a, b)       _mm256_add_epi64(a, b)
#define vt_subi(a, b)       _mm256_sub_epi64(a, b)
#define vt_andi(a, b)       _mm256_and_si256(a, b)
#define vt_srli(a, c)       _mm256_srli_epi64(a, c)
#define vt_xori(a, b)       _mm256_xor_si256(a, b)
typedef __m256d vt_mask;
#define vt_lt(a, b)         _mm256_cmp_pd(a, b, _CMP_LT_OQ)
#define vt_le(a, b)         _mm256_cmp_pd(a, b, _CMP_LE_OQ)
#define vt_eq(a, b)         _mm256_cmp_pd(a, b, _CMP_EQ_OQ)
#define vt_unord(a)         _mm256_cmp_pd(a, a, _CMP_UNORD_Q)
#define vt_pick(m, yes, no) _mm256_blendv_pd(no, yes, m)
#endif

#ifdef SBP_VTANH
/* The rounding constant of sbp_pexp, 1.5·2^52: (v + it) − it = round(v) for |v| < 2^51, and the
 * bits of it + k hold the integer k in their low half (used both ways below). */
#define VT_ROUND 6755399441055744.0

#ifndef __AVX512F__
/* p·2^n for an integral n ∈ [0, 64] and p ∈ [½, 2]: sbp_pexp's (p·2^(n−1))·2, both products
 * exact; 2^(n−1) assembled in integer lanes from the low bits of n + 1.5·2^52 */
static inline VT_PD vt_scale2n(VT_PD p, VT_PD n) {
    const VT_PI ni = vt_subi(vt_as_i(vt_add(n, vt_set1(VT_ROUND))), vt_as_i(vt_set1(VT_ROUND)));
    const VT_PD s = vt_as_d(_mm256_slli_epi64(vt_addi(ni, vt_seti(1023 - 1)), 52));
    return vt_mul(vt_mul(p, s), vt_set1(2.0));
}
#endif

/* sbp_pexp(y) for y ∈ [0, 44]: its reduction and polynomial, 2^n·p exact */
static inline VT_PD vt_exp(VT_PD y) {
    const VT_PD n =
        vt_sub(vt_fma(y, vt_set1(1.4426950408889634074), vt_set1(VT_ROUND)), vt_set1(VT_ROUND));
    VT_PD r = vt_fma(n, vt_set1(-6.93147180369123816490e-01), y);
    r = vt_fma(n, vt_set1(-1.90821492927058770002e-10), r);
    VT_PD p = vt_set1(1.0 / 6227020800.0);
    p = vt_fma(p, r, vt_set1(1.0 / 479001600.0));
    p = vt_fma(p, r, vt_set1(1.0 / 39916800.0));
    p = vt_fma(p, r, vt_set1(1.0 / 3628800.0));
    p = vt_fma(p, r, vt_set1(1.0 / 362880.0));
    p = vt_fma(p, r, vt_set1(1.0 / 40320.0));
    p = vt_fma(p, r, vt_set1(1.0 / 5040.0));
    p = vt_fma(p, r, vt_set1(1.0 / 720.0));
    p = vt_fma(p, r, vt_set1(1.0 / 120.0));
    p = vt_fma(p, r, vt_set1(1.0 / 24.0));
    p = vt_fma(p, r, vt_set1(1.0 / 6.0));
    p = vt_fma(p, r, vt_set1(0.5));
    p = vt_fma(p, r, vt_set1(1.0));
    p = vt_fma(p, r, vt_set1(1.0));
    return vt_scale2n(p, n);
}

/* sbp_plog(u) for a normal u ≥ 1: m ∈ [√½, √2) and k from the bits, its polynomial */
static inline VT_PD vt_log(VT_PD u) {
    const int64_t sqrt_half = 0x3fe6a09e667f3bcdll;
    const VT_PI b = vt_addi(vt_as_i(u), vt_seti(0x3ff0000000000000ll - sqrt_half));
    const VT_PI ki = vt_subi(vt_srli(b, 52), vt_seti(1023));
    const VT_PD kd = vt_sub(vt_as_d(vt_addi(ki, vt_as_i(vt_set1(VT_ROUND)))), vt_set1(VT_ROUND));
    const VT_PD m = vt_as_d(vt_addi(vt_andi(b, vt_seti(0x000fffffffffffffll)), vt_seti(sqrt_half)));
    const VT_PD f = vt_sub(m, vt_set1(1.0));
    const VT_PD hfsq = vt_mul(vt_mul(vt_set1(0.5), f), f);
    const VT_PD s = vt_div(f, vt_add(vt_set1(2.0), f)), z = vt_mul(s, s);
    VT_PD R = vt_set1(2.0 / 21);
    R = vt_fma(R, z, vt_set1(2.0 / 19));
    R = vt_fma(R, z, vt_set1(2.0 / 17));
    R = vt_fma(R, z, vt_set1(2.0 / 15));
    R = vt_fma(R, z, vt_set1(2.0 / 13));
    R = vt_fma(R, z, vt_set1(2.0 / 11));
    R = vt_fma(R, z, vt_set1(2.0 / 9));
    R = vt_fma(R, z, vt_set1(2.0 / 7));
    R = vt_fma(R, z, vt_set1(2.0 / 5));
    R = vt_fma(R, z, vt_set1(2.0 / 3));
    R = vt_mul(R, z);
    const VT_PD in = vt_fma(s, vt_add(hfsq, R), vt_mul(kd, vt_set1(1.90821492927058770002e-10)));
    return vt_fma(kd, vt_set1(6.93147180369123816490e-01), vt_sub(f, vt_sub(hfsq, in)));
}

/* −v: its sign bit flipped, as C's unary minus */
static inline VT_PD vt_neg(VT_PD v) {
    return vt_as_d(vt_xori(vt_as_i(v), vt_seti(INT64_MIN)));
}

/* sbp_ptanh of each lane (see the head of the file) */
static inline VT_PD vt_tanh(VT_PD x) {
    const VT_PD zero = vt_set1(0.0);
    const vt_mask negative = vt_lt(x, zero), nan = vt_unord(x);
    const VT_PD a = vt_pick(negative, vt_neg(x), x);
    const vt_mask small = vt_le(a, vt_set1(22.0));
    const VT_PD y = vt_mul(vt_set1(2.0), vt_pick(small, a, zero));
    const VT_PD u = vt_exp(y);
    const VT_PD q = vt_div(vt_mul(vt_sub(u, vt_set1(1.0)), y), vt_log(u));
    const VT_PD e = vt_pick(vt_eq(u, vt_set1(1.0)), y, q);
    VT_PD t = vt_pick(small, vt_div(e, vt_add(e, vt_set1(2.0))), vt_set1(1.0));
    t = vt_pick(negative, vt_neg(t), t);
    return vt_pick(nan, x, t);
}
#endif

#if defined(SBP_VTANH) && defined(__AVX512F__)
/* 16 lanes of gelu_tanh_t: the argument in float, its tanh in two halves of 8 doubles */
static inline __m512 vt_gelu_t16(__m512 g) {
    const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
    const __m512 arg =
        _mm512_mul_ps(_mm512_set1_ps(GELU_BETA),
                      _mm512_add_ps(g, _mm512_mul_ps(_mm512_set1_ps(GELU_KAPPA), cube)));
    const __m256 lo = _mm512_cvtpd_ps(vt_tanh(_mm512_cvtps_pd(_mm512_castps512_ps256(arg))));
    const __m256 hi = _mm512_cvtpd_ps(vt_tanh(
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(arg), 1)))));
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}

static inline void gelu_t_row(real *t, const real *g, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(t + i, vt_gelu_t16(_mm512_loadu_ps(g + i)));
    if (i < n) { /* the tail, masked: lanes past n compute on 0 and are not stored */
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(t + i, m, vt_gelu_t16(_mm512_maskz_loadu_ps(m, g + i)));
    }
}
#elif defined(SBP_VTANH)
/* 8 lanes of gelu_tanh_t: the argument in float, its tanh in two halves of 4 doubles */
static inline __m256 vt_gelu_t8(__m256 g) {
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    const __m256 arg =
        _mm256_mul_ps(_mm256_set1_ps(GELU_BETA),
                      _mm256_add_ps(g, _mm256_mul_ps(_mm256_set1_ps(GELU_KAPPA), cube)));
    const __m128 lo = _mm256_cvtpd_ps(vt_tanh(_mm256_cvtps_pd(_mm256_castps256_ps128(arg))));
    const __m128 hi = _mm256_cvtpd_ps(vt_tanh(_mm256_cvtps_pd(_mm256_extractf128_ps(arg, 1))));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}

static inline void gelu_t_row(real *t, const real *g, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(t + i, vt_gelu_t8(_mm256_loadu_ps(g + i)));
    for (; i < n; i++) t[i] = gelu_tanh_t(g[i]);
}
#else
static inline void gelu_t_row(real *t, const real *g, int n) {
    for (int i = 0; i < n; i++) t[i] = gelu_tanh_t(g[i]);
}
#endif

#endif
