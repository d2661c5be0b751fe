/* linear.c — y = x·Wᵀ + b and its backward on the portable product (gemm.c).
 *
 * Every output element is one fma chain: y over k (from 0, then + b), dx over n and dW, db over
 * the rows in ascending order, continuing from what dx, dW and db hold. A sum over tokens split
 * between calls (chunk after chunk, sequence after sequence) therefore continues the same chain
 * whatever the split, so the schedules agree bit for bit for any chunk size. */
#include "kernels.h"

void linear_forward(real *y, real *ws, const real *x, const real *w, const real *b, int s, int e,
                    int N, int K) {
    const int M = e - s;
    /* y(t, n) = Σ_k x(t, k)·w(n, k): a = x (rows t), b(k, n) = w[n·K + k] */
    pgemm_set(y, (size_t)N, ws, x, (size_t)K, 1, w, 1, (size_t)K, M, N, K);
    if (!b) return;
    for (int r = 0; r < M; r++)
        for (int n = 0; n < N; n++) y[(size_t)r * N + n] = y[(size_t)r * N + n] + b[n];
}

void linear_backward(real *dx, real *dw, real *db, real *ws, const real *dy, const real *x,
                     const real *w, int s, int e, int N, int K) {
    const int M = e - s;
    /* dW(n, k) += Σ_t dy(t, n)·x(t, k): a(n, t) = dy[t·N + n], b(t, k) = x[t·K + k] */
    if (dw) pgemm(dw, (size_t)K, ws, dy, 1, (size_t)N, x, (size_t)K, 1, N, K, M);
    /* dx(t, k) += Σ_n dy(t, n)·w(n, k) */
    if (dx) pgemm(dx, (size_t)K, ws, dy, (size_t)N, 1, w, (size_t)K, 1, M, K, N);
    if (!db) return;
    for (int r = 0; r < M; r++) /* ascending tokens, straight into db */
        for (int n = 0; n < N; n++) db[n] = db[n] + dy[(size_t)r * N + n];
}
