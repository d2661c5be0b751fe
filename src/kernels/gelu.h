/* gelu.h — GELU with the tanh approximation (HF "gelu_pytorch_tanh", torch's
 * gelu(approximate="tanh")), one element at a time, shared by the CPU kernel (geglu.c) and the
 * CUDA one (cuda/geglu.cu) so that both compute the very same operations.
 *
 * The operations are torch's CPU kernel's (aten/src/ATen/native/cpu/Activation.cpp, GeluKernel
 * and GeluBackwardKernel, approximate tanh), in its order, in the working precision:
 *   gelu(x)  = (0.5·x)·(1 + t),   t = tanh(β·(x + κ·((x·x)·x))),   β = √2·(2/√π)·0.5, κ = 0.044715
 *   gelu'(x) = 0.5·(1 + t) + ((0.5·x)·(1 − t·t))·(β·(1 + (3·κ)·(x·x)))
 * β rounded once from its double value, as torch's `scalar_t(M_SQRT2 * M_2_SQRTPI * 0.5)`, and
 * tanh the portable one of pmath.h (no libm transcendental: the same bits on every machine). */
#ifndef SBP_GELU_H
#define SBP_GELU_H

#include "real.h"

#ifdef SBP_REAL_F64
#define rtanh sbp_ptanh
#else
#define rtanh sbp_ptanhf
#endif

#define GELU_BETA  ((real)(1.41421356237309504880 * 1.12837916709551257390 * 0.5))
#define GELU_KAPPA ((real)0.044715)

/* t = tanh(β·(x + κ·x³)) */
static inline SBP_HD real gelu_tanh_t(real x) {
    const real x_cube = (x * x) * x;
    return rtanh(GELU_BETA * (x + GELU_KAPPA * x_cube));
}

/* gelu(x) from x and its t */
static inline SBP_HD real gelu_tanh_value(real x, real t) {
    return ((real)0.5 * x) * ((real)1 + t);
}

/* gelu'(x) from x and its t */
static inline SBP_HD real gelu_tanh_grad(real x, real t) {
    const real x_sq = x * x, left = (real)0.5 * x, right = (real)1 + t;
    const real left_derivative = (real)0.5 * right;
    const real tanh_derivative = (real)1 - t * t;
    const real inner_derivative = GELU_BETA * ((real)1 + (real)3 * GELU_KAPPA * x_sq);
    const real right_derivative = left * tanh_derivative * inner_derivative;
    return left_derivative + right_derivative;
}

#endif
