/* swiglu.c — the gated MLP activation h = silu(g) ⊙ u, silu(z) = z·sigmoid(z). */
#include "kernels.h"

void swiglu_forward(real *h, const real *g, const real *u, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const real sg = 1 / (1 + rexp(-g[i]));
        h[i] = (g[i] * sg) * u[i];
    }
}

/* dh/dg = u · silu'(g), silu'(z) = sig(z)·(1 + z·(1 − sig(z))); dh/du = silu(g). */
void swiglu_backward(real *dg, real *du, const real *dh, const real *g, const real *u, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const real sg = 1 / (1 + rexp(-g[i]));
        dg[i] = dg[i] + (dh[i] * u[i]) * (sg * (1 + g[i] * (1 - sg)));
        du[i] = du[i] + dh[i] * (g[i] * sg);
    }
}
