/* geglu.c — Gemma-3's gated MLP activation h = gelu_tanh(g) ⊙ u, HF's
 * ACT2FN["gelu_pytorch_tanh"](gate_proj(x)) * up_proj(x); the scalar GELU is gelu.h's. */
#include "gelu.h"
#include "kernels.h"

void geglu_forward(real *h, const real *g, const real *u, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) h[i] = gelu_tanh_value(g[i], gelu_tanh_t(g[i])) * u[i];
}

/* h = gelu(g)·u: dg += (dh·u)·gelu'(g), du += dh·gelu(g) (autograd's mul, then GeluBackward). */
void geglu_backward(real *dg, real *du, const real *dh, const real *g, const real *u, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const real x = g[i], t = gelu_tanh_t(x);
        dg[i] = dg[i] + (dh[i] * u[i]) * gelu_tanh_grad(x, t);
        du[i] = du[i] + dh[i] * gelu_tanh_value(x, t);
    }
}
