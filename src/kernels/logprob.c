/* logprob.c — log p(target) under softmax(logits) and its gradient, row by row. The sums over
 * the vocabulary accumulate in double: V is up to ~150k terms, and the float build should lose
 * no more than the logits themselves carry. */
#include "kernels.h"

/* The max and the sum run in LANES interleaved partial results (lane k takes v ≡ k mod LANES,
 * in order), combined in a fixed tree: GCC vectorizes that without -ffast-math, and the order
 * depends only on V, so every schedule and thread count sees the same bits for a row. */
enum { LANES = 8 };

void logprob_forward(double *logp, double *lse, const real *logits, const int32_t *target, int M,
                     int V) {
    const int Vl = V - V % LANES;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < M; r++) {
        if (target[r] < 0) {
            logp[r] = lse[r] = 0;
            continue;
        }
        const real *z = logits + (size_t)r * V;
        real m[LANES];
        for (int k = 0; k < LANES; k++) m[k] = z[0];
        for (int v = 0; v < Vl; v += LANES)
            for (int k = 0; k < LANES; k++) m[k] = z[v + k] > m[k] ? z[v + k] : m[k];
        real mx = z[0];
        for (int k = 0; k < LANES; k++) mx = m[k] > mx ? m[k] : mx;
        for (int v = Vl; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        double s[LANES] = {0};
        for (int v = 0; v < Vl; v += LANES)
            for (int k = 0; k < LANES; k++) s[k] += rexp(z[v + k] - mx);
        for (int v = Vl; v < V; v++) s[v - Vl] += rexp(z[v] - mx);
        double sum = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
        lse[r] = mx + log(sum);
        logp[r] = z[target[r]] - lse[r];
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
        real c = (real)coef[r], l = (real)lse[r];
        real zy = z[target[r]];
        for (int v = 0; v < V; v++) z[v] = -c * rexp(z[v] - l);
        z[target[r]] = c * (1 - rexp(zy - l));
    }
}
