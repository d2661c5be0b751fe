/* geglu.c — Gemma-3's gated MLP activation h = gelu_tanh(g) ⊙ u, HF's
 * ACT2FN["gelu_pytorch_tanh"](gate_proj(x)) * up_proj(x); the scalar GELU is gelu.h's.
 *
 * The elements go in blocks of GEB: the block's tanh values t = gelu_tanh_t(g) first, in SIMD
 * registers where the build has them (vtanh.h's gelu_t_row: gelu_tanh_t's bits for every input),
 * then the rest of each element's arithmetic from x and t. The same operations on every element,
 * so the same bits in both numerics modes and on the CUDA mirror. */
#include "gelu.h"
#include "kernels.h"
#include "vtanh.h"

enum { GEB = 512 }; /* elements per block */

/* t = gelu_tanh_t(g) over block b of n elements; returns the block's length */
static int block_tanh(real t[GEB], const real *g, size_t b, size_t n) {
    const int m = n - b * GEB < GEB ? (int)(n - b * GEB) : GEB;
    gelu_t_row(t, g + b * GEB, m);
    return m;
}

void geglu_forward(real *h, const real *g, const real *u, size_t n) {
    const size_t nb = (n + GEB - 1) / GEB;
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        real t[GEB];
        const size_t i0 = b * GEB;
        const int m = block_tanh(t, g, b, n);
        for (int j = 0; j < m; j++) h[i0 + j] = gelu_tanh_value(g[i0 + j], t[j]) * u[i0 + j];
    }
}

/* h = gelu(g)·u: dg += (dh·u)·gelu'(g), du += dh·gelu(g) (autograd's mul, then GeluBackward). */
void geglu_backward(real *dg, real *du, const real *dh, const real *g, const real *u, size_t n) {
    const size_t nb = (n + GEB - 1) / GEB;
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        real t[GEB];
        const size_t i0 = b * GEB;
        const int m = block_tanh(t, g, b, n);
        for (int j = 0; j < m; j++) {
            const size_t i = i0 + (size_t)j;
            dg[i] = dg[i] + (dh[i] * u[i]) * gelu_tanh_grad(g[i], t[j]);
            du[i] = du[i] + dh[i] * gelu_tanh_value(g[i], t[j]);
        }
    }
}
