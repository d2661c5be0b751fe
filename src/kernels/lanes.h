/* lanes.h — row reductions that vectorize without -ffast-math and stay reproducible.
 *
 * GCC may not reorder floating-point additions or max selections on its own, so a plain
 * `for (c) sum += x[c]` runs one element at a time. Here lane k takes the elements c ≡ k
 * (mod LANES), in order, and the lanes are combined in one fixed tree at the end: the order of
 * every operation depends only on n, never on the thread count, the schedule or where a buffer
 * sits, so a row gives the same bits wherever it is reduced. The first n − n % LANES elements
 * go through the lanes; the tail joins lanes 0, 1, ... in order. */
#ifndef SBP_LANES_H
#define SBP_LANES_H

#include "real.h"

enum { LANES = 8 };

static inline real lanes_combine(const real s[LANES]) {
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

static inline double lanes_combine_d(const double s[LANES]) {
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* max_c x[c], n ≥ 1 (a NaN in x[0] stays; later NaNs are skipped, as by `x > m ? x : m`) */
static inline real lanes_max(const real *x, int n) {
    const int nl = n - n % LANES;
    real m[LANES];
    for (int k = 0; k < LANES; k++) m[k] = x[0];
    for (int c = 0; c < nl; c += LANES)
        for (int k = 0; k < LANES; k++) m[k] = x[c + k] > m[k] ? x[c + k] : m[k];
    real mx = x[0];
    for (int k = 0; k < LANES; k++) mx = m[k] > mx ? m[k] : mx;
    for (int c = nl; c < n; c++) mx = x[c] > mx ? x[c] : mx;
    return mx;
}

/* x[c] ← exp(x[c] − shift); returns Σ_c x[c] (the new values) */
static inline real lanes_exp_sum(real *x, int n, real shift) {
    const int nl = n - n % LANES;
    real s[LANES] = {0};
    for (int c = 0; c < nl; c += LANES)
        for (int k = 0; k < LANES; k++) {
            x[c + k] = rexp(x[c + k] - shift);
            s[k] += x[c + k];
        }
    for (int c = nl; c < n; c++) {
        x[c] = rexp(x[c] - shift);
        s[c - nl] += x[c];
    }
    return lanes_combine(s);
}

/* Σ_c exp(x[c] − shift), accumulated in double */
static inline double lanes_exp_sum_d(const real *x, int n, real shift) {
    const int nl = n - n % LANES;
    double s[LANES] = {0};
    for (int c = 0; c < nl; c += LANES)
        for (int k = 0; k < LANES; k++) s[k] += rexp(x[c + k] - shift);
    for (int c = nl; c < n; c++) s[c - nl] += rexp(x[c] - shift);
    return lanes_combine_d(s);
}

#endif
