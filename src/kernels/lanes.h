/* lanes.h — row reductions in a fixed tree that depends on the row length alone
 * (docs/numerics.md §5).
 *
 * Lane k (of LANES = 32) takes the elements whose index is ≡ k (mod 32), in ascending order,
 * starting from the operation's identity; then a halving tree combines the lanes: for
 * w = 16, 8, 4, 2, 1, lane k ← lane k ⊕ lane k + w (k < w). A CUDA warp computes exactly this
 * with one thread per lane and __shfl_down_sync(w) (cuda/), and the CPU loops below vectorize
 * without -ffast-math (the lanes are independent chains). The order of every operation depends
 * only on n: never on the thread count, the schedule, or where a row is reduced.
 *
 * Used for reductions that are not sums over tokens: the softmax over the vocabulary, RMSNorm
 * over C, attention over a key tile. Sums over tokens are single ascending chains instead. */
#ifndef SBP_LANES_H
#define SBP_LANES_H

#include "real.h"
#include "vexp.h"

enum { LANES = 32 }; /* vexp_lane_sums (vexp.h) fills 32 lanes */

static inline real lanes_tree_sum(real s[LANES]) {
    for (int w = LANES / 2; w; w /= 2)
        for (int k = 0; k < w; k++) s[k] = s[k] + s[k + w];
    return s[0];
}

static inline double lanes_tree_sum_d(double s[LANES]) {
    for (int w = LANES / 2; w; w /= 2)
        for (int k = 0; k < w; k++) s[k] = s[k] + s[k + w];
    return s[0];
}

/* max_c x[c] (−inf for n = 0); a NaN element is skipped, as by `x > m ? x : m` */
static inline real lanes_max(const real *x, int n) {
    real s[LANES];
    for (int k = 0; k < LANES; k++) s[k] = -INFINITY;
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int k = 0; k < LANES; k++) s[k] = x[c + k] > s[k] ? x[c + k] : s[k];
    for (int k = 0; c + k < n; k++) s[k] = x[c + k] > s[k] ? x[c + k] : s[k];
    for (int w = LANES / 2; w; w /= 2)
        for (int k = 0; k < w; k++) s[k] = s[k + w] > s[k] ? s[k + w] : s[k];
    return s[0];
}

/* Σ_c a[c]·b[c], each lane a chain of fma */
static inline real lanes_dot(const real *a, const real *b, int n) {
    real s[LANES] = {0};
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int k = 0; k < LANES; k++) s[k] = rfma(a[c + k], b[c + k], s[k]);
    for (int k = 0; c + k < n; k++) s[k] = rfma(a[c + k], b[c + k], s[k]);
    return lanes_tree_sum(s);
}

/* Σ_c x[c] */
static inline real lanes_sum(const real *x, int n) {
    real s[LANES] = {0};
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int k = 0; k < LANES; k++) s[k] = s[k] + x[c + k];
    for (int k = 0; c + k < n; k++) s[k] = s[k] + x[c + k];
    return lanes_tree_sum(s);
}

/* Σ_c exp(x[c] − shift), the exps in the working precision, the sum in double */
static inline double lanes_exp_sum_d(const real *x, int n, real shift) {
    double s[LANES] = {0};
#ifdef SBP_VEXP /* the same lanes in SIMD registers (vexp.h) */
    vexp_lane_sums(s, x, n, shift);
#else
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int k = 0; k < LANES; k++) s[k] = s[k] + (double)rexp(x[c + k] - shift);
    for (int k = 0; c + k < n; k++) s[k] = s[k] + (double)rexp(x[c + k] - shift);
#endif
    return lanes_tree_sum_d(s);
}

#endif
