/* swiglu.c — the gated MLP activation h = silu(g) ⊙ u, silu(z) = z·sigmoid(z).
 *
 * The elements go in blocks of SWB: the block's exponentials rexp(−g) first, in SIMD registers
 * where the build has them (vexp.h's exp_neg: rexp's bits for every input), then the rest of
 * each element's arithmetic as before. The same operations on every element, so the same bits
 * in both numerics modes; a scalar rexp per element had been about 60% of these passes. */
#include "kernels.h"
#include "vexp.h"

enum { SWB = 512 }; /* elements per block */

/* e = rexp(−g) over block b of n elements; returns the block's length */
static int block_exps(real e[SWB], const real *g, size_t b, size_t n) {
    const int m = n - b * SWB < SWB ? (int)(n - b * SWB) : SWB;
    exp_neg(e, g + b * SWB, m);
    return m;
}

void swiglu_forward(real *h, const real *g, const real *u, size_t n) {
    const size_t nb = (n + SWB - 1) / SWB;
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        real e[SWB];
        const size_t i0 = b * SWB;
        const int m = block_exps(e, g, b, n);
        for (int j = 0; j < m; j++) {
            const real sg = 1 / (1 + e[j]);
            h[i0 + j] = (g[i0 + j] * sg) * u[i0 + j];
        }
    }
}

/* dh/dg = u · silu'(g), silu'(z) = sig(z)·(1 + z·(1 − sig(z))); dh/du = silu(g). */
void swiglu_backward(real *dg, real *du, const real *dh, const real *g, const real *u, size_t n) {
    const size_t nb = (n + SWB - 1) / SWB;
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        real e[SWB];
        const size_t i0 = b * SWB;
        const int m = block_exps(e, g, b, n);
        for (int j = 0; j < m; j++) {
            const size_t i = i0 + (size_t)j;
            const real sg = 1 / (1 + e[j]);
            dg[i] = dg[i] + (dh[i] * u[i]) * (sg * (1 + g[i] * (1 - sg)));
            du[i] = du[i] + dh[i] * (g[i] * sg);
        }
    }
}
