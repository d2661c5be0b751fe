/* pmath.h — exp, log, log1p, sin and cos built from +, −, ×, / and fused multiply-add only
 * (docs/numerics.md §3), so that every platform, compiler and backend computes the same bits.
 *
 * libm's functions are accurate but not reproducible: glibc picks FMA or non-FMA variants at
 * run time, other libcs and CUDA's math library round differently. These functions are written
 * with explicit fma()/fmaf() and must be compiled with -ffp-contract=off (the Makefile does):
 * then each line is a fixed sequence of correctly rounded IEEE-754 operations. A machine
 * without hardware FMA computes fma() in software and gets the same bits.
 *
 * Accuracy against libm (measured on 2·10^6 random arguments; tests/test_kernels.c checks it):
 * exp 0.87 ULP, expf 0.92 (subnormal results included), log 0.74, logf 0.83, log1p 1.0, sin and
 * cos 2.4 ULP for |x| < 10^6
 * (the argument reduction is exact while |x| < 2^20·π/2; past it the error grows with |x|, and
 * the bits stay reproducible).
 *
 *   exp(x) = 2^n · exp(r),  n = round(x / ln 2),  r = x − n·ln 2 (Cody–Waite, ln 2 in two parts
 *            so that n·hi is exact), exp(r) by its Taylor polynomial in Horner form
 *   log(x) = k·ln 2 + log(m),  m ∈ [√½, √2),  f = m − 1,  s = f / (2 + f),
 *            log(m) = f − f²/2 + s·(f²/2 + R(s²)),  R the tail of 2·atanh(s) = 2s + 2s³/3 + …
 *   sin, cos: n = round(x · 2/π), r = x − n·π/2 with π/2 in three parts, Taylor polynomials on
 *            [−π/4, π/4], the quadrant n mod 4 picks sin or cos and the sign. */
#ifndef SBP_PMATH_H
#define SBP_PMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Callable from CUDA kernels too (cuda/): the device computes the very same operations. */
#ifdef __CUDACC__
#define SBP_HD __host__ __device__
#else
#define SBP_HD
#endif

/* ---- exp ------------------------------------------------------------------------------------ */

/* sbp_pexpf's constants, shared with its SIMD forms (src/kernels/vexp.h) */
#define SBP_EXPF_LO     (-104.0f)            /* below: +0 */
#define SBP_EXPF_HI     88.7f                /* above: +inf */
#define SBP_EXPF_ROUND  12582912.0f          /* 1.5·2^23: (y + it) − it = round(y) */
#define SBP_EXPF_LOG2E  1.44269504088896341f /* 1 / ln 2 */
#define SBP_EXPF_LN2_HI 0.693145751953125f   /* ln 2 = HI + LO, n·HI exact */
#define SBP_EXPF_LN2_LO 1.42860682030941723212e-6f
#define SBP_EXPF_TINY_N (-100) /* n below it: 2^n assembled as 2^(n+64)·2^−64 */

/* The result 2^n·exp(r) is assembled as (exp(r)·2^(n−1))·2, or for very small results as
 * (exp(r)·2^(n+64))·2^−64, so that a subnormal result is rounded once, correctly. */
static inline SBP_HD float sbp_pexpf(float x) {
    float xc = x < SBP_EXPF_LO ? SBP_EXPF_LO : x;
    xc = xc > SBP_EXPF_HI ? SBP_EXPF_HI : xc;
    xc = xc == xc ? xc : 0.0f; /* NaN: computed on 0, replaced below */
    float n = fmaf(xc, SBP_EXPF_LOG2E, SBP_EXPF_ROUND) - SBP_EXPF_ROUND; /* round(x / ln 2) */
    float r = fmaf(n, -SBP_EXPF_LN2_HI, xc);
    r = fmaf(n, -SBP_EXPF_LN2_LO, r);
    float p = 1.0f / 5040;
    p = fmaf(p, r, 1.0f / 720);
    p = fmaf(p, r, 1.0f / 120);
    p = fmaf(p, r, 1.0f / 24);
    p = fmaf(p, r, 1.0f / 6);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    const int32_t ni = (int32_t)n, tiny = ni < SBP_EXPF_TINY_N;
    union {
        int32_t i;
        float f;
    } s = {.i = ((tiny ? ni + 64 : ni - 1) + 127) << 23};
    float y = (p * s.f) * (tiny ? 0x1p-64f : 2.0f);
    y = x < SBP_EXPF_LO ? 0.0f : y;
    y = x > SBP_EXPF_HI ? INFINITY : y;
    return x == x ? y : x;
}

static inline SBP_HD double sbp_pexp(double x) {
    double xc = x < -746.0 ? -746.0 : x;
    xc = xc > 709.7 ? 709.7 : xc;
    xc = xc == xc ? xc : 0.0;
    double n = fma(xc, 1.4426950408889634074, 6755399441055744.0) - 6755399441055744.0;
    double r = fma(n, -6.93147180369123816490e-01, xc);
    r = fma(n, -1.90821492927058770002e-10, r);
    double p = 1.0 / 6227020800.0;
    p = fma(p, r, 1.0 / 479001600.0);
    p = fma(p, r, 1.0 / 39916800.0);
    p = fma(p, r, 1.0 / 3628800.0);
    p = fma(p, r, 1.0 / 362880.0);
    p = fma(p, r, 1.0 / 40320.0);
    p = fma(p, r, 1.0 / 5040.0);
    p = fma(p, r, 1.0 / 720.0);
    p = fma(p, r, 1.0 / 120.0);
    p = fma(p, r, 1.0 / 24.0);
    p = fma(p, r, 1.0 / 6.0);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    const int64_t ni = (int64_t)n, tiny = ni < -1000;
    union {
        int64_t i;
        double f;
    } s = {.i = ((tiny ? ni + 128 : ni - 1) + 1023) << 52};
    double y = (p * s.f) * (tiny ? 0x1p-128 : 2.0);
    y = x < -746.0 ? 0.0 : y;
    y = x > 709.7 ? INFINITY : y;
    return x == x ? y : x;
}

/* ---- log ------------------------------------------------------------------------------------ */

static inline SBP_HD float sbp_plogf(float x) {
    if (!(x > 0.0f)) return x == 0.0f ? -INFINITY : NAN; /* also NaN for NaN */
    if (x == INFINITY) return x;
    int k = 0;
    if (x < 0x1p-126f) x *= 0x1p25f, k = -25; /* subnormal: scale into the normal range */
    uint32_t u;
    memcpy(&u, &x, 4);
    /* m in [√½, √2): bias the exponent split by the mantissa of √½ (0x3f3504f3) */
    u += 0x3f800000u - 0x3f3504f3u;
    k += (int)(u >> 23) - 127;
    u = (u & 0x007fffffu) + 0x3f3504f3u;
    float m;
    memcpy(&m, &u, 4);
    const float f = m - 1.0f, hfsq = 0.5f * f * f, s = f / (2.0f + f), z = s * s;
    float R = 2.0f / 9;
    R = fmaf(R, z, 2.0f / 7);
    R = fmaf(R, z, 2.0f / 5);
    R = fmaf(R, z, 2.0f / 3);
    R = R * z;
    const float kf = (float)k;
    /* k·ln2 in two parts: hi has few significant bits, so k·hi is exact */
    return fmaf(kf, 0.693145751953125f,
                f - (hfsq - fmaf(s, hfsq + R, kf * 1.42860682030941723212e-6f)));
}

static inline SBP_HD double sbp_plog(double x) {
    if (!(x > 0.0)) return x == 0.0 ? -INFINITY : NAN;
    if (x == INFINITY) return x;
    int k = 0;
    if (x < 0x1p-1022) x *= 0x1p54, k = -54;
    uint64_t u;
    memcpy(&u, &x, 8);
    u += 0x3ff0000000000000ull - 0x3fe6a09e667f3bcdull; /* √½ = 0x3fe6a09e667f3bcd */
    k += (int)(u >> 52) - 1023;
    u = (u & 0x000fffffffffffffull) + 0x3fe6a09e667f3bcdull;
    double m;
    memcpy(&m, &u, 8);
    const double f = m - 1.0, hfsq = 0.5 * f * f, s = f / (2.0 + f), z = s * s;
    double R = 2.0 / 21;
    R = fma(R, z, 2.0 / 19);
    R = fma(R, z, 2.0 / 17);
    R = fma(R, z, 2.0 / 15);
    R = fma(R, z, 2.0 / 13);
    R = fma(R, z, 2.0 / 11);
    R = fma(R, z, 2.0 / 9);
    R = fma(R, z, 2.0 / 7);
    R = fma(R, z, 2.0 / 5);
    R = fma(R, z, 2.0 / 3);
    R = R * z;
    const double kd = (double)k;
    return fma(kd, 6.93147180369123816490e-01,
               f - (hfsq - fma(s, hfsq + R, kd * 1.90821492927058770002e-10)));
}

/* log(1 + x), accurate for small x: log(u) with u = 1 + x rounded, corrected by the rounding
 * error of u to first order: log(1 + x) ≈ log(u) + (x − (u − 1)) / u. */
static inline SBP_HD double sbp_plog1p(double x) {
    double u = 1.0 + x;
    if (u == 1.0) return x;
    if (!(u > 0.0) || u == INFINITY) return sbp_plog(u);
    return sbp_plog(u) + (x - (u - 1.0)) / u;
}

/* ---- tanh ----------------------------------------------------------------------------------- */

/* exp(y) − 1 without the cancellation near 0 (Kahan): with u = exp(y) rounded,
 * (u − 1)·y / log(u) is accurate to a few ulps for every y (the errors of u − 1 and log(u)
 * cancel in the ratio). */
static inline SBP_HD double sbp_pexpm1(double y) {
    const double u = sbp_pexp(y);
    if (u == 1.0) return y;
    const double um1 = u - 1.0;
    if (um1 == -1.0) return -1.0;
    if (u == INFINITY) return u;
    return um1 * y / sbp_plog(u);
}

/* tanh(x) = e / (e + 2), e = expm1(2|x|), with the sign of x; ±1 past |x| = 22 (tanh(22) is
 * 1 − 1.6e-19, which rounds to 1). A few ulps from the exact value over the whole range
 * (tests/test_gemma3kernels.c measures it against libm). */
static inline SBP_HD double sbp_ptanh(double x) {
    if (x != x) return x;
    const double a = x < 0 ? -x : x;
    double t = 1.0;
    if (a <= 22.0) {
        const double e = sbp_pexpm1(2.0 * a);
        t = e / (e + 2.0);
    }
    return x < 0 ? -t : t;
}

/* The float tanh: the double one rounded once (a correctly rounded float in all but the
 * rarest cases, and the same bits everywhere). */
static inline SBP_HD float sbp_ptanhf(float x) {
    return (float)sbp_ptanh((double)x);
}

/* ---- sin and cos ---------------------------------------------------------------------------- */

/* sin(r), cos(r) for |r| ≤ π/4 + a little; Taylor to r^17 and r^16. */
static inline SBP_HD double sbp_psin_kernel(double r) {
    const double z = r * r;
    double p = -1.0 / 355687428096000.0; /* −1/17! */
    p = fma(p, z, 1.0 / 1307674368000.0);
    p = fma(p, z, -1.0 / 6227020800.0);
    p = fma(p, z, 1.0 / 39916800.0);
    p = fma(p, z, -1.0 / 362880.0);
    p = fma(p, z, 1.0 / 5040.0);
    p = fma(p, z, -1.0 / 120.0);
    p = fma(p, z, 1.0 / 6.0);
    return fma(-(r * z), p, r); /* r − r³·(1/6 − r²/120 + …) */
}

static inline SBP_HD double sbp_pcos_kernel(double r) {
    const double z = r * r;
    double p = 1.0 / 20922789888000.0; /* 1/16! */
    p = fma(p, z, -1.0 / 87178291200.0);
    p = fma(p, z, 1.0 / 479001600.0);
    p = fma(p, z, -1.0 / 3628800.0);
    p = fma(p, z, 1.0 / 40320.0);
    p = fma(p, z, -1.0 / 720.0);
    p = fma(p, z, 1.0 / 24.0);
    const double hz = 0.5 * z, w = 1.0 - hz;
    /* 1 − z/2 + z²·p, with the rounding error of w = 1 − z/2 added back */
    return w + (((1.0 - w) - hz) + z * (z * p));
}

/* sin(x) and cos(x) together (the RoPE tables need both). */
static inline SBP_HD void sbp_psincos(double x, double *sn, double *cs) {
    if (!(fabs(x) < INFINITY)) {
        *sn = *cs = x - x; /* NaN for ±inf and NaN */
        return;
    }
    /* n = round(x·2/π); π/2 = p1 + p2 + p3, p1 and p2 with 33 significant bits (exact n·p) */
    const double n = fma(x, 6.36619772367581382433e-01, 6755399441055744.0) - 6755399441055744.0;
    double r = fma(-n, 1.57079632673412561417e+00, x);
    r = fma(-n, 6.07710050630396597660e-11, r);
    r = fma(-n, 2.02226624871116645580e-21, r);
    const double s = sbp_psin_kernel(r), c = sbp_pcos_kernel(r);
    const int64_t q = (int64_t)n & 3;
    *sn = q == 0 ? s : q == 1 ? c : q == 2 ? -s : -c;
    *cs = q == 0 ? c : q == 1 ? -s : q == 2 ? -c : s;
}

static inline SBP_HD double sbp_psin(double x) {
    double s, c;
    sbp_psincos(x, &s, &c);
    return s;
}

static inline SBP_HD double sbp_pcos(double x) {
    double s, c;
    sbp_psincos(x, &s, &c);
    return c;
}

/* theta^y for theta > 0, as exp(y·log(theta)). */
static inline SBP_HD double sbp_ppow_pos(double theta, double y) {
    return sbp_pexp(y * sbp_plog(theta));
}

/* RoPE's inverse frequency of pair i (of HD/2): theta^(−2i/HD), with HF's llama3 scaling
 * (_compute_llama3_parameters) when llama3 is 1, and its linear scaling
 * (_compute_linear_scaling_rope_parameters: f / factor; Gemma-3 4B and up) when llama3 is 2.
 * Shared by the CPU and CUDA tables. */
static inline SBP_HD double sbp_rope_inv_freq(int i, int HD, double theta, int llama3,
                                              double factor, double low_freq, double high_freq,
                                              double orig_max) {
    double f = sbp_ppow_pos(theta, -2.0 * i / HD);
    if (!llama3) return f;
    if (llama3 == 2) return f / factor;
    const double wavelen = 2 * 3.14159265358979323846 / f;
    if (wavelen > orig_max / low_freq) return f / factor;
    if (wavelen < orig_max / high_freq) return f;
    const double smooth = (orig_max / wavelen - low_freq) / (high_freq - low_freq);
    return (1 - smooth) * f / factor + smooth * f;
}

#endif
