/* swiglu.cu — h = silu(g) ⊙ u on the GPU (src/kernels/swiglu.c is the CPU's), one thread per
 * element, pmath.h's exp. */
#include "cuda.cuh"

namespace SBP_CUDA_NS {

__global__ void swiglu_forward_kernel(real *h, const real *g, const real *u, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const real sg = 1 / (1 + rexp(-g[i]));
    h[i] = (g[i] * sg) * u[i];
}

/* dh/dg = u · silu'(g), silu'(z) = sig(z)·(1 + z·(1 − sig(z))); dh/du = silu(g) */
__global__ void swiglu_backward_kernel(real *dg, real *du, const real *dh, const real *g,
                                       const real *u, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const real sg = 1 / (1 + rexp(-g[i]));
    dg[i] = dg[i] + (dh[i] * u[i]) * (sg * (1 + g[i] * (1 - sg)));
    du[i] = du[i] + dh[i] * (g[i] * sg);
}

void swiglu_forward(const eng *e, real *h, const real *g, const real *u, size_t n) {
    SBP_LAUNCH(swiglu_forward_kernel, blocks_for(n, THREADS), THREADS, 0, h, g, u, n);
    check(e, "swiglu_forward_kernel");
}

void swiglu_backward(const eng *e, real *dg, real *du, const real *dh, const real *g, const real *u,
                     size_t n) {
    SBP_LAUNCH(swiglu_backward_kernel, blocks_for(n, THREADS), THREADS, 0, dg, du, dh, g, u, n);
    check(e, "swiglu_backward_kernel");
}

} // namespace SBP_CUDA_NS
