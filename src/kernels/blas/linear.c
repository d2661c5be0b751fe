/* blas/linear.c — y = x·Wᵀ + b and its backward, on BLAS, one call per token block (the fast
 * mode).
 *
 * Why per block: OpenBLAS results depend on call shapes (its small-matrix path is not row
 * invariant, and a K dimension is split differently for different K). Issuing every product over
 * the fixed global blocks [kB, (k+1)B) ∩ [s, e) means full BP, checkpointing and StreamBP make
 * the very same calls on the very same rows whenever their chunks are multiples of B, so their
 * results agree bit for bit. The weight-gradient sum over tokens is accumulated block by block in
 * ascending order with beta = 1. B = 256 costs nothing measurable (notes/env.md). */
#include "blas.h"

void blas_linear_forward(real *y, const real *x, const real *w, const real *b, int s, int e, int N,
                         int K, int blk) {
    for (int r0 = s, r1; r0 < e; r0 = r1) {
        r1 = block_end(r0, e, blk);
        real *y_r = y + (size_t)(r0 - s) * N;
        gemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, N, K, 1, x + (size_t)(r0 - s) * K, K,
             w, K, 0, y_r, N);
    }
    if (!b) return;
    for (int r = 0; r < e - s; r++)
        for (int n = 0; n < N; n++) y[(size_t)r * N + n] += b[n];
}

void blas_linear_backward(real *dx, real *dw, real *db, const real *dy, const real *x,
                          const real *w, int s, int e, int N, int K, int blk) {
    for (int r0 = s, r1; r0 < e; r0 = r1) {
        r1 = block_end(r0, e, blk);
        const real *dy_r = dy + (size_t)(r0 - s) * N, *x_r = x + (size_t)(r0 - s) * K;
        /* dW += dy_rᵀ·x_r: a sum over the block's tokens */
        if (dw)
            gemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, r1 - r0, 1, dy_r, N, x_r, K, 1, dw,
                 K);
        /* dx_r += dy_r·W */
        if (dx)
            gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, K, N, 1, dy_r, N, w, K, 1,
                 dx + (size_t)(r0 - s) * K, K);
    }
    if (!db) return;
    for (int r = 0; r < e - s; r++) /* ascending tokens, straight into db */
        for (int n = 0; n < N; n++) db[n] += dy[(size_t)r * N + n];
}
