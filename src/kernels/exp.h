/* exp.h — exp written so that GCC vectorizes the loops that call it (glibc's vector exp needs
 * -ffast-math, which this project does not use). Measured error (tests/test_kernels.c, exp_ulp):
 * at most 0.91 ULP in float and 0.89 ULP in double at -O3 (1.22 and 1.16 at -O1, where GCC
 * fuses the multiply-adds differently), 1.73 ULP for double results below exp(−700), which are
 * subnormal before the final scaling; the test asserts 1.5 and 2.5. Outside the range the result is
 * 0 below about exp(−86.5) = 2.6e-38 in float (the subnormals are flushed; exp(−708) in double) and
 * +inf above overflow; NaN stays NaN.
 *
 *   exp(x) = 2^n · exp(r),  n = round(x / ln 2),  r = x − n·ln 2 ∈ [−ln2/2, ln2/2]
 * with ln 2 split in a high part with few significant bits (so n·hi is exact) and a low part
 * (Cody–Waite), exp(r) as its Taylor polynomial in Horner form (degree 7 in float: remainder
 * below 5.3e-9; degree 13 in double: below 4.1e-18), and 2^n built in the exponent bits.
 * Rounding to nearest uses the 1.5·2^23 (2^52) trick, which is exact for |n| < 2^22. The
 * comparisons are written as selects; with -fno-trapping-math GCC turns them into blends. */
#ifndef SBP_EXP_H
#define SBP_EXP_H

#include <math.h>
#include <stdint.h>

static inline float sbp_expf(float x) {
    float xc = x < -86.5f ? -86.5f : x;
    xc = xc > 88.7f ? 88.7f : xc;
    xc = xc == xc ? xc : 0; /* NaN: computed on 0, replaced below */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = n * -0.693145751953125f + xc;
    r = n * -1.42860682030941723212e-6f + r;
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } s = {.i = ((int32_t)n + 126) << 23}; /* 2^(n−1): n reaches 128 */
    float y = (p * s.f) * 2.0f;
    y = x < -86.5f ? 0.0f : y;
    y = x > 88.7f ? INFINITY : y;
    return x == x ? y : x;
}

static inline double sbp_exp(double x) {
    double xc = x < -708.0 ? -708.0 : x;
    xc = xc > 709.7 ? 709.7 : xc;
    xc = xc == xc ? xc : 0;
    double n = (xc * 1.4426950408889634074 + 6755399441055744.0) - 6755399441055744.0;
    double r = n * -6.93147180369123816490e-01 + xc;
    r = n * -1.90821492927058770002e-10 + r;
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    union {
        int64_t i;
        double f;
    } s = {.i = ((int64_t)n + 1022) << 52};
    double y = (p * s.f) * 2.0;
    y = x < -708.0 ? 0.0 : y;
    y = x > 709.7 ? INFINITY : y;
    return x == x ? y : x;
}

#endif
