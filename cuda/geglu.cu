/* geglu.cu — Gemma-3's h = gelu_tanh(g) ⊙ u on the GPU (src/kernels/geglu.c is the CPU's), one
 * thread per element, the scalar GELU of src/kernels/gelu.h (the CPU's very operations). */
#include "cuda.cuh"

extern "C" {
#include "../src/kernels/gelu.h"
}

namespace SBP_CUDA_NS {

__global__ void geglu_forward_kernel(real *h, const real *g, const real *u, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    h[i] = gelu_tanh_value(g[i], gelu_tanh_t(g[i])) * u[i];
}

/* dg += (dh·u)·gelu'(g), du += dh·gelu(g) */
__global__ void geglu_backward_kernel(real *dg, real *du, const real *dh, const real *g,
                                      const real *u, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const real x = g[i], t = gelu_tanh_t(x);
    dg[i] = dg[i] + (dh[i] * u[i]) * gelu_tanh_grad(x, t);
    du[i] = du[i] + dh[i] * gelu_tanh_value(x, t);
}

void geglu_forward(const eng *e, real *h, const real *g, const real *u, size_t n) {
    SBP_LAUNCH(geglu_forward_kernel, blocks_for(n, THREADS), THREADS, 0, h, g, u, n);
    check(e, "geglu_forward_kernel");
}

void geglu_backward(const eng *e, real *dg, real *du, const real *dh, const real *g, const real *u,
                    size_t n) {
    SBP_LAUNCH(geglu_backward_kernel, blocks_for(n, THREADS), THREADS, 0, dg, du, dh, g, u, n);
    check(e, "geglu_backward_kernel");
}

} // namespace SBP_CUDA_NS
