/* fast/linear.c — y = x·Wᵀ + b and its backward on BLAS (the fast mode): every product is cut
 * into tiles on a fixed grid, and each tile is one single-threaded BLAS call.
 *
 * The grid: rows of tokens in the global blocks [kB, (k+1)B) ∩ [s, e), columns of features in
 * fixed panels. Full BP, checkpointing and StreamBP cut their chunks on block multiples, so they
 * make the very same calls on the very same operands, and their results agree bit for bit. The
 * weight gradient sums over tokens block by block, in ascending order, with beta = 1.
 *
 * Why tiles and not OpenBLAS's own threads: a threaded OpenBLAS call does not give the bits of
 * the same call on one thread. Its threaded driver splits K otherwise than its serial one
 * (0.3.21: any K over GEMM_Q that is not a multiple of 32, e.g. a vocabulary of 50257), and with
 * its Haswell/Zen sgemm kernels nearly every product of more than 8 terms differed. So the calls
 * run inside OpenMP loops over the tiles, where the OpenMP build of OpenBLAS uses one thread;
 * each tile has one owner, and the thread count changes no bit.
 *
 * The panels: a serial call packs both of its operands, so an operand shared by several tiles is
 * packed once per tile. Output features go in panels of NP = 1024: the forward's x block and
 * dW's x columns are packed once per panel (the bench model's layers are one or two panels, the
 * LM head's 32000 are 32: measured, the LM head's forward costs ~30% more than one threaded call
 * per block did, docs/performance-log.md). dW's input features go in panels of KP = 256, so that
 * its tiles are many even where a call holds one block (StreamBP's logits chunk); dx's go in
 * panels of XKP = 512, since each dx tile packs the whole dy block: on the LM head (dy of 512 ×
 * 32000, K = 512) one panel instead of two made dx 9% faster (docs/performance-log.md). The dx and
 * dW tiles share one loop, so that a call of one block still has work for every thread.
 *
 * Shapes: x (e−s, K), w (N, K), y (e−s, N), dy (e−s, N), dx (e−s, K), dw (N, K). */
#include "fast.h"

enum { NP = BLAS_LINEAR_N_PANEL, KP = BLAS_LINEAR_K_PANEL, XKP = BLAS_LINEAR_DX_K_PANEL };

static int ceil_div(int a, int b) {
    return (a + b - 1) / b;
}

/* How many global blocks rows [s, e) touch. */
static int n_blocks(int s, int e, int blk) {
    return e > s ? (e - 1) / blk - s / blk + 1 : 0;
}

/* Rows [*r0, *r1) of block number i (counted from the one holding s). */
static void block_rows(int *r0, int *r1, int i, int s, int e, int blk) {
    const int b = s / blk + i;
    *r0 = b * blk > s ? b * blk : s;
    *r1 = block_end(*r0, e, blk);
}

/* Width of panel j of n columns cut every p. */
static int panel_width(int j, int n, int p) {
    return n - j * p < p ? n - j * p : p;
}

void blas_linear_forward(real *y, const real *x, const real *w, const real *b, int s, int e, int N,
                         int K, int blk) {
    const int nb = n_blocks(s, e, blk), np = ceil_div(N, NP);
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < nb * np; t++) {
        int r0, r1;
        block_rows(&r0, &r1, t / np, s, e, blk);
        const size_t n0 = (size_t)(t % np) * NP;
        /* y[r0:r1, n0 : n0 + w) = x[r0:r1] · W[n0 : n0 + w)ᵀ */
        gemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, panel_width(t % np, N, NP), K, 1,
             x + (size_t)(r0 - s) * K, K, w + n0 * K, K, 0, y + (size_t)(r0 - s) * N + n0, N);
    }
    if (!b) return;
    for (int r = 0; r < e - s; r++)
        for (int n = 0; n < N; n++) y[(size_t)r * N + n] += b[n];
}

void blas_linear_backward(real *dx, real *dw, real *db, const real *dy, const real *x,
                          const real *w, int s, int e, int N, int K, int blk) {
    const int nb = n_blocks(s, e, blk), nN = ceil_div(N, NP), nK = ceil_div(K, KP);
    const int nX = ceil_div(K, XKP), tx = dx ? nb * nX : 0, tw = dw ? nN * nK : 0;
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < tx + tw; t++) {
        if (t < tx) {
            /* dx[r0:r1, k0 : ) += dy[r0:r1] · W[:, k0 : ) */
            int r0, r1;
            block_rows(&r0, &r1, t / nX, s, e, blk);
            const size_t k0 = (size_t)(t % nX) * XKP;
            gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, panel_width(t % nX, K, XKP), N,
                 1, dy + (size_t)(r0 - s) * N, N, w + k0, K, 1, dx + (size_t)(r0 - s) * K + k0, K);
            continue;
        }
        /* dW[n0 : , k0 : ) += dy[r0:r1, n0 : )ᵀ · x[r0:r1, k0 : ), the blocks in ascending order */
        const int u = t - tx;
        const size_t n0 = (size_t)(u / nK) * NP, k0 = (size_t)(u % nK) * KP;
        for (int i = 0; i < nb; i++) {
            int r0, r1;
            block_rows(&r0, &r1, i, s, e, blk);
            gemm(CblasRowMajor, CblasTrans, CblasNoTrans, panel_width(u / nK, N, NP),
                 panel_width(u % nK, K, KP), r1 - r0, 1, dy + (size_t)(r0 - s) * N + n0, N,
                 x + (size_t)(r0 - s) * K + k0, K, 1, dw + n0 * K + k0, K);
        }
    }
    if (db) linear_bias_blocked(db, dy, s, e, N, blk); /* per token block, in double */
}
