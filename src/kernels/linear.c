/* linear.c — y = x·Wᵀ + b and its backward on the portable product (gemm.c).
 *
 * y sums over k and dx over n in panels of PGEMM_PANEL (docs/numerics.md §4: y's first panel from
 * +0, dx's continuing what dx holds, every later panel from +0 and added; then y + b); dW and db
 * are one fma chain each over the rows in ascending order, continuing from what they hold. A sum
 * over tokens split between calls (chunk after chunk, sequence after sequence) therefore continues
 * the same chain whatever the split, so the schedules agree bit for bit for any chunk size.
 *
 * The fast mode's backward (linear_backward_blocked, docs/numerics.md §10) sums dW over the global
 * token panels of PGEMM_PANEL (where the token block is a multiple of it; else over the blocks)
 * and db over the blocks instead: each panel's or block's part is a sum from zero, folded into dW
 * and db in ascending order, so a sum over T tokens is T/P sums of P terms and T/P folds instead
 * of one chain of T terms (its rounding error grows with P + T/P, not T: docs/accuracy.md). */
#include "kernels.h"

void linear_forward(real *y, real *ws, const real *x, const real *w, const real *b, int s, int e,
                    int N, int K) {
    const int M = e - s;
    /* y(t, n) = Σ_k x(t, k)·w(n, k) in panels: a = x (rows t), b(k, n) = w[n·K + k] */
    pgemm_fold_set(y, (size_t)N, ws, x, (size_t)K, 1, w, 1, (size_t)K, M, N, K, PGEMM_PANEL);
    if (!b) return;
    for (int r = 0; r < M; r++)
        for (int n = 0; n < N; n++) y[(size_t)r * N + n] = y[(size_t)r * N + n] + b[n];
}

void linear_backward(real *dx, real *dw, real *db, real *ws, const real *dy, const real *x,
                     const real *w, int s, int e, int N, int K) {
    const int M = e - s;
    /* dW(n, k) += Σ_t dy(t, n)·x(t, k): a(n, t) = dy[t·N + n], b(t, k) = x[t·K + k] */
    if (dw) pgemm(dw, (size_t)K, ws, dy, 1, (size_t)N, x, (size_t)K, 1, N, K, M);
    /* dx(t, k) += Σ_n dy(t, n)·w(n, k), in panels over n */
    if (dx)
        pgemm_panels(dx, (size_t)K, ws, dy, (size_t)N, 1, w, (size_t)K, 1, M, K, N, PGEMM_PANEL);
    if (!db) return;
    for (int r = 0; r < M; r++) /* ascending tokens, straight into db */
        for (int n = 0; n < N; n++) db[n] = db[n] + dy[(size_t)r * N + n];
}

size_t linear_blocked_workspace(int width, int blk) {
    if (blk % PGEMM_PANEL == 0) return 0;
    return (size_t)LINEAR_PANEL * (size_t)(width > 0 ? width : 0);
}

/* db[n] ← db[n] + Σ_{rows} dy(t, n) over one block of rows: the block's sum in double from +0,
 * ascending rows, and one rounding of the fold (the bias of a projection: cheap, and the sum that
 * cancels most, e.g. k_proj's, issue 37) */
static void bias_block(real *db, const real *dy, int rows, int N) {
    enum { NB = 256 };
    for (int n0 = 0; n0 < N; n0 += NB) {
        const int nb = N - n0 < NB ? N - n0 : NB;
        double p[NB];
        for (int n = 0; n < nb; n++) p[n] = 0;
        for (int r = 0; r < rows; r++)
            for (int n = 0; n < nb; n++) p[n] = p[n] + (double)dy[(size_t)r * N + n0 + n];
        for (int n = 0; n < nb; n++) db[n0 + n] = (real)((double)db[n0 + n] + p[n]);
    }
}

/* The end of the token block that holds row b0, or e. */
static int block_end_(int b0, int e, int blk) {
    const int next = (b0 / blk + 1) * blk;
    return next < e ? next : e;
}

void linear_bias_blocked(real *db, const real *dy, int s, int e, int N, int blk) {
    for (int b0 = s, b1; b0 < e; b0 = b1) {
        b1 = block_end_(b0, e, blk);
        bias_block(db, dy + (size_t)(b0 - s) * N, b1 - b0, N);
    }
}

void linear_backward_blocked(real *dx, real *dw, real *db, real *ws, real *part, const real *dy,
                             const real *x, const real *w, int s, int e, int N, int K, int blk) {
    const int M = e - s;
    /* dx += dy·W, the sum over N in panels of PGEMM_PANEL (pgemm_fold): the LM head's over
     * the vocabulary was one chain of V terms (docs/accuracy.md) */
    if (dx) pgemm_fold(dx, (size_t)K, ws, dy, (size_t)N, 1, w, (size_t)K, 1, M, K, N, PGEMM_PANEL);
    if (dw && blk % PGEMM_PANEL == 0) {
        /* dW in the global token panels of PGEMM_PANEL, as the products sum over k: pgemm_fold's
         * panels are those once its k range starts on one, each panel's dW a chain from +0 added
         * to dw in ascending order. Chunks end on blocks, so on panels: every schedule sums the
         * same panels. A ragged first panel (s inside one) is a call of its own. With blocks of
         * 512 as one chain each, the weights' errors were 1.05x the portable mode's (median, up
         * to 1.15x) and up to 1.14x torch float32's; in panels of 128, 0.94-0.99x torch's
         * (docs/accuracy.md, over several draws). */
        const int P = PGEMM_PANEL, b1 = block_end_(s, e, P), first = s % P ? b1 : s;
        if (first > s)
            pgemm_fold(dw, (size_t)K, ws, dy, 1, (size_t)N, x, (size_t)K, 1, N, K, first - s, P);
        if (first < e)
            pgemm_fold(dw, (size_t)K, ws, dy + (size_t)(first - s) * N, 1, (size_t)N,
                       x + (size_t)(first - s) * K, (size_t)K, 1, N, K, e - first, P);
    } else
        for (int b0 = s, b1; dw && b0 < e; b0 = b1) {
            b1 = block_end_(b0, e, blk);
            const real *dy_b = dy + (size_t)(b0 - s) * N, *x_b = x + (size_t)(b0 - s) * K;
            for (int n0 = 0; n0 < N; n0 += LINEAR_PANEL) {
                const int np = N - n0 < LINEAR_PANEL ? N - n0 : LINEAR_PANEL;
                /* part(n, k) = Σ_{t in the block} dy(t, n0 + n)·x(t, k), a chain from +0 */
                pgemm_set(part, (size_t)K, ws, dy_b + n0, 1, (size_t)N, x_b, (size_t)K, 1, np, K,
                          b1 - b0);
                real *dw_p = dw + (size_t)n0 * K;
                const size_t n = (size_t)np * K;
#pragma omp parallel for schedule(static)
                for (size_t i = 0; i < n; i++) dw_p[i] = dw_p[i] + part[i];
            }
        }
    if (db) linear_bias_blocked(db, dy, s, e, N, blk);
}
