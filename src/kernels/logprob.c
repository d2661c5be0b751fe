/* logprob.c — log p(target) under softmax(logits) and its gradient, row by row. The max and the
 * sum over the vocabulary use the fixed lane tree (lanes.h); the sum accumulates in double: V is
 * up to ~150k terms, and the float build should lose no more than the logits themselves carry. */
#include "kernels.h"
#include "lanes.h"
#include "vexp.h"

void logprob_forward(double *logp, double *lse, const real *logits, const int32_t *target, int M,
                     int V) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < M; r++) {
        if (target[r] < 0) {
            logp[r] = lse[r] = 0;
            continue;
        }
        const real *z = logits + (size_t)r * V;
        const real mx = lanes_max(z, V);
        lse[r] = (double)mx + sbp_plog(lanes_exp_sum_d(z, V, mx));
        logp[r] = (double)z[target[r]] - lse[r];
    }
}

void logprob_backward(real *logits, const double *coef, const double *lse, const int32_t *target,
                      int M, int V) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < M; r++) {
        real *z = logits + (size_t)r * V;
        if (target[r] < 0 || coef[r] == 0) {
            for (int v = 0; v < V; v++) z[v] = 0;
            continue;
        }
        /* dL/dz_v = coef · (δ_vy − softmax_v) */
        const real c = (real)coef[r], l = (real)lse[r], zy = z[target[r]];
        exp_shift(z, z, V, l, -c); /* z[v] = −c · exp(z[v] − l) */
        z[target[r]] = c * (1 - rexp(zy - l));
    }
}
