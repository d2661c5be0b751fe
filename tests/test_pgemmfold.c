/* test_pgemmfold.c — the products in panels (pgemm_fold, pgemm_fold_set, pgemm_panels,
 * src/kernels/gemm.c) bit for bit against their scalar definition, and the reason they exist.
 *
 * pgemm_fold(C += A·B, panel) cuts every element's sum over k into panels [q, q + panel): each
 * panel's chain acc ← fma(a(i,p), b(p,j), acc) from +0, p ascending, then c ← c + acc, panels in
 * ascending order (kernels.h); pgemm_fold_set takes the first panel's sum as c. Checked in
 * float32 (gemm.c compiled here a second time with its names renamed, as tests/test_pgemm.c does;
 * the float32 build is what the fast mode runs) in panels of PGEMM_PANEL (the products, dW's
 * token panels) and of KC (the largest panel a fold takes), on shapes from one panel to past KF
 * (two long k blocks), ragged against every panel and tile, with row strides and the dx operand
 * layout of linear_backward_blocked; the result must not depend on the thread count or on how the
 * rows are split between calls (the schedules' bitwise promise); pgemm_panels (the portable dx)
 * too, its first panel continuing C's chain. linear_forward (linear.c, compiled here too) is both
 * numerics' forward: the panel sums plus the bias. Then the error: a sum over 65536 terms (the LM
 * head's dx over a vocabulary) must be at least 4 times closer to the float64 sum folded than as
 * one chain (pgemm), the forward at K = 1024 at least twice, and dW over 2048 tokens at the
 * default block in panels at most 0.75 of the error of its blocks as one chain each. Last,
 * linear_backward_blocked's dW against its definition: per token panel (or block, where
 * PGEMM_PANEL does not divide it) a chain from +0, folded in ascending order, on both paths. */
#undef SBP_REAL_F64
#define pgemm                 fold_pgemm_f32
#define pgemm_set             fold_pgemm_set_f32
#define pgemm_fold            fold_pgemm_fold_f32
#define pgemm_fold_set        fold_pgemm_fold_set_f32
#define pgemm_panels          fold_pgemm_panels_f32
#define pgemm_workspace       fold_pgemm_workspace_f32
#define sbp_portable_gemm_f32 fold_portable_gemm_f32
#include "../src/kernels/gemm.c"
#define linear_forward           fold_linear_forward_f32
#define linear_backward          fold_linear_backward_f32
#define linear_backward_blocked  fold_linear_backward_blocked_f32
#define linear_bias_blocked      fold_linear_bias_blocked_f32
#define linear_blocked_workspace fold_linear_blocked_workspace_f32
#include "../src/kernels/linear.c"
#undef pgemm
#undef pgemm_set
#undef pgemm_fold
#undef pgemm_fold_set
#undef pgemm_panels
#undef pgemm_workspace
#undef sbp_portable_gemm_f32

#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The last two are as wide as a real model's products (gemm.c's column blocks and its
 * workspace's sizing then matter) and three and six k blocks deep */
static const int shapes[][3] = {{1, 1, 1},
                                {7, 17, 9},
                                {13, 31, KC - 1},
                                {25, 47, KC},
                                {61, 45, KC + 1},
                                {19, 9, 2 * KC + 37},
                                {3, 300, 3 * KC},
                                {50, 33, 700},
                                {40, 1300, 2 * KC + 5},
                                {9, 2100, 5 * KC + 3},
                                {5, 40, PGEMM_PANEL + 1},
                                {11, 260, 4 * KF + 1}};
enum { NSHAPES = sizeof shapes / sizeof shapes[0] };

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

static float value(uint64_t *s) {
    return (float)((double)(lcg(s) & 0xfffff) / 524288.0 - 1.0);
}

/* the definition: c + panel sums, each an fma chain from +0 over [q, q + panel), ascending q;
 * set: the first panel's sum is the first value (c is ignored); cont: the first panel's chain
 * continues from c (the portable rule) */
static float fold_ref(float c, const float *a, size_t acs, const float *b, size_t brs, int K,
                      int panel, int set, int cont) {
    for (int q = 0; q < K; q += panel) {
        float acc = cont && q == 0 ? c : 0;
        for (int p = q; p < K && p < q + panel; p++) acc = fmaf(a[p * acs], b[p * brs], acc);
        c = (set || cont) && q == 0 ? acc : c + acc;
    }
    return set && K == 0 ? 0 : c;
}

/* dx (M, N) += dy (M, K) · w (K, N), the operands as linear_backward_blocked passes them
 * (a(i, p) = dy[i·K + p], b(p, j) = w[p·N + j]), C with row stride ldc > N; in panels of
 * PGEMM_PANEL (a product's) and of KC (the largest a fold takes), added to C and set (the
 * forward) */
START_TEST(fold_chains) {
    /* {panel, set, cont}: the fast dx and dW, both numerics' forward, one panel a k block, the
     * portable dx */
    static const int ways[][3] = {
        {PGEMM_PANEL, 0, 0}, {PGEMM_PANEL, 1, 0}, {KC, 0, 0}, {PGEMM_PANEL, 0, 1}};
    uint64_t seed = 7;
    for (int sh = 0; sh < NSHAPES; sh++)
        for (int wy = 0; wy < 4; wy++) {
            const int M = shapes[sh][0], N = shapes[sh][1], K = shapes[sh][2];
            const int panel = ways[wy][0], set = ways[wy][1], cont = ways[wy][2];
            const size_t ldc = (size_t)N + 3;
            float *a = malloc(sizeof(float) * (size_t)M * K),
                  *b = malloc(sizeof(float) * (size_t)K * N);
            float *c0 = malloc(sizeof(float) * (size_t)M * ldc),
                  *c = malloc(sizeof(float) * M * ldc);
            float *c2 = malloc(sizeof(float) * (size_t)M * ldc);
            for (size_t x = 0; x < (size_t)M * K; x++) a[x] = value(&seed);
            for (size_t x = 0; x < (size_t)K * N; x++) b[x] = value(&seed);
            for (size_t x = 0; x < (size_t)M * ldc; x++) c0[x] = value(&seed);
            void (*fold)(float *, size_t, float *, const float *, size_t, size_t, const float *,
                         size_t, size_t, int, int, int, int) = set    ? fold_pgemm_fold_set_f32
                                                               : cont ? fold_pgemm_panels_f32
                                                                      : fold_pgemm_fold_f32;
            for (int th = 1; th <= 3; th += 2) {
                omp_set_num_threads(th); /* the workspace is sized for the thread count */
                float *ws = malloc(sizeof(float) * fold_pgemm_workspace_f32(N, K));
                memcpy(c, c0, sizeof(float) * (size_t)M * ldc);
                fold(c, ldc, ws, a, (size_t)K, 1, b, (size_t)N, 1, M, N, K, panel);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        const float want = fold_ref(c0[(size_t)i * ldc + j], a + (size_t)i * K, 1,
                                                    b + j, (size_t)N, K, panel, set, cont);
                        const float got = c[(size_t)i * ldc + j];
                        ck_assert_msg(!memcmp(&want, &got, sizeof got),
                                      "%dx%dx%d, panel %d%s, %d threads: c[%d][%d] = %a, the "
                                      "folded chains %a",
                                      M, N, K, panel,
                                      set    ? " (set)"
                                      : cont ? " (continuing)"
                                             : "",
                                      th, i, j, (double)got, (double)want);
                    }
                /* the rows in two calls: the same bits */
                memcpy(c2, c0, sizeof(float) * (size_t)M * ldc);
                const int m = M / 2;
                fold(c2, ldc, ws, a, (size_t)K, 1, b, (size_t)N, 1, m, N, K, panel);
                fold(c2 + (size_t)m * ldc, ldc, ws, a + (size_t)m * K, (size_t)K, 1, b, (size_t)N,
                     1, M - m, N, K, panel);
                ck_assert_msg(!memcmp(c, c2, sizeof(float) * (size_t)M * ldc),
                              "%dx%dx%d: rows split between two calls changed a bit", M, N, K);
                free(ws);
            }
            omp_set_num_threads(2);
            free(a), free(b), free(c0), free(c), free(c2);
        }
}
END_TEST

/* linear_forward (both numerics' forward): y = the panel sums over K, then + b */
START_TEST(forward_folded) {
    enum { M = 37, N = 70, K = 2 * KC + 300 };
    uint64_t seed = 17;
    float *x = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K);
    float *bias = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * M * N);
    for (int i = 0; i < M * K; i++) x[i] = value(&seed);
    for (int i = 0; i < N * K; i++) w[i] = value(&seed);
    for (int i = 0; i < N; i++) bias[i] = value(&seed);
    float *ws = malloc(sizeof(float) * fold_pgemm_workspace_f32(N, K));
    for (int withb = 0; withb < 2; withb++) {
        for (int i = 0; i < M * N; i++) y[i] = NAN; /* set: the prior contents never read */
        fold_linear_forward_f32(y, ws, x, w, withb ? bias : NULL, 0, M, N, K);
        for (int r = 0; r < M; r++)
            for (int n = 0; n < N; n++) {
                float want =
                    fold_ref(0, x + (size_t)r * K, 1, w + (size_t)n * K, 1, K, PGEMM_PANEL, 1, 0);
                if (withb) want = want + bias[n];
                const float got = y[r * N + n];
                ck_assert_msg(!memcmp(&want, &got, sizeof got),
                              "y[%d][%d] = %a, the folded chains%s %a", r, n, (double)got,
                              withb ? " + b" : "", (double)want);
            }
    }
    free(x), free(w), free(bias), free(y), free(ws);
}
END_TEST

/* one row, one column, K = 65536 terms of mixed sign: the folded sum's error against the float64
 * sum is at least 4 times smaller than the single chain's (pgemm) */
START_TEST(fold_error) {
    enum { K = 65536, N = 16 };
    uint64_t seed = 11;
    float *a = malloc(sizeof(float) * K), *b = malloc(sizeof(float) * (size_t)K * N);
    for (int p = 0; p < K; p++) a[p] = value(&seed);
    for (size_t x = 0; x < (size_t)K * N; x++) b[x] = value(&seed);
    float *ws = malloc(sizeof(float) * fold_pgemm_workspace_f32(N, K));
    float chain[N] = {0}, fold[N] = {0};
    fold_pgemm_f32(chain, N, ws, a, K, 1, b, N, 1, 1, N, K);
    fold_pgemm_fold_f32(fold, N, ws, a, K, 1, b, N, 1, 1, N, K, PGEMM_PANEL);
    double e_chain = 0, e_fold = 0, norm = 0;
    for (int j = 0; j < N; j++) {
        double t = 0;
        for (int p = 0; p < K; p++) t += (double)a[p] * b[(size_t)p * N + j];
        e_chain += (chain[j] - t) * (chain[j] - t), e_fold += (fold[j] - t) * (fold[j] - t);
        norm += t * t;
    }
    e_chain = sqrt(e_chain / norm), e_fold = sqrt(e_fold / norm);
    ck_assert_msg(e_fold * 4 <= e_chain, "folded error %.3e, one chain %.3e", e_fold, e_chain);
    free(a), free(b), free(ws);
}
END_TEST

/* The forward at a real model's depth (K = 1024, Qwen3-0.6B's hidden size): its error against
 * the float64 product must be at most half the single chain's (pgemm_set). Measured 0.36; in
 * panels of 512 it is 0.69, as one chain 1. */
START_TEST(forward_error) {
    enum { M = 16, N = 256, K = 1024 };
    uint64_t seed = 19;
    float *x = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K);
    float *yc = malloc(sizeof(float) * M * N), *yf = malloc(sizeof(float) * M * N);
    for (int i = 0; i < M * K; i++) x[i] = value(&seed);
    for (int i = 0; i < N * K; i++) w[i] = value(&seed);
    float *ws = malloc(sizeof(float) * fold_pgemm_workspace_f32(N, K));
    fold_pgemm_set_f32(yc, N, ws, x, K, 1, w, 1, K, M, N, K);
    fold_linear_forward_f32(yf, ws, x, w, NULL, 0, M, N, K);
    double e_chain = 0, e_fold = 0;
    for (int r = 0; r < M; r++)
        for (int n = 0; n < N; n++) {
            double t = 0;
            for (int k = 0; k < K; k++) t += (double)x[r * K + k] * w[n * K + k];
            e_chain += (yc[r * N + n] - t) * (yc[r * N + n] - t);
            e_fold += (yf[r * N + n] - t) * (yf[r * N + n] - t);
        }
    ck_assert_msg(e_fold * 4 <= e_chain, "the folded forward's error is %.2f of one chain's",
                  sqrt(e_fold / e_chain));
    free(x), free(w), free(yc), free(yf), free(ws);
}
END_TEST

/* dW over a sequence at the default token block (KC): its error against the float64 sum must be
 * well below that of the blocks as one chain each, the rule before dW took the products' panels
 * (the weights' errors up to 1.14x torch float32's, docs/accuracy.md). Measured 0.53. */
START_TEST(dw_error) {
    enum { N = 64, K = 48, T = 2048 };
    uint64_t seed = 23;
    float *dy = malloc(sizeof(float) * T * N), *x = malloc(sizeof(float) * T * K);
    float *dw = calloc((size_t)N * K, sizeof(float));
    for (int i = 0; i < T * N; i++) dy[i] = value(&seed);
    for (int i = 0; i < T * K; i++) x[i] = value(&seed);
    float *ws = malloc(sizeof(float) * fold_pgemm_workspace_f32(K, T));
    fold_linear_backward_blocked_f32(NULL, dw, NULL, ws, NULL, dy, x, NULL, 0, T, N, K, KC);
    double e_blocks = 0, e_panels = 0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            double t = 0;
            float blocks = 0;
            for (int b0 = 0; b0 < T; b0 += KC) {
                float acc = 0;
                for (int r = b0; r < b0 + KC; r++) {
                    t += (double)dy[r * N + n] * x[r * K + k];
                    acc = fmaf(dy[r * N + n], x[r * K + k], acc);
                }
                blocks = blocks + acc;
            }
            e_blocks += (blocks - t) * (blocks - t);
            e_panels += (dw[n * K + k] - t) * (dw[n * K + k] - t);
        }
    ck_assert_msg(sqrt(e_panels / e_blocks) <= 0.75, "dW in panels: %.2f of the blocks' error",
                  sqrt(e_panels / e_blocks));
    free(dy), free(x), free(dw), free(ws);
}
END_TEST

/* linear_backward_blocked's dW (the fast mode, docs/numerics.md §10): per global token panel
 * [kP, (k+1)P) ∩ [s, e) a chain from +0 over its rows, added to dW in ascending order, with
 * P = PGEMM_PANEL where it divides the block B (pgemm_fold straight into dW), else P = B (a product
 * per panel of LINEAR_PANEL rows into part, then added); from a panel boundary or inside one; on 1
 * and 3 threads; and two calls split at a block boundary give one call's bits. */
START_TEST(blocked_dw) {
    enum { N = LINEAR_PANEL + 21, K = 37, T = 1200 };
    static const int cases[][3] = {{0, T, KC},       {300, T, KC},     {600, 700, KC},
                                   {256, 1100, 256}, {128, T, 2 * KC}, {0, 1100, 200},
                                   {130, 900, 200}};
    uint64_t seed = 13;
    float *dy = malloc(sizeof(float) * T * N), *x = malloc(sizeof(float) * T * K);
    float *dw0 = malloc(sizeof(float) * N * K), *dw = malloc(sizeof(float) * N * K);
    float *dw2 = malloc(sizeof(float) * N * K);
    for (int i = 0; i < T * N; i++) dy[i] = value(&seed);
    for (int i = 0; i < T * K; i++) x[i] = value(&seed);
    for (int i = 0; i < N * K; i++) dw0[i] = value(&seed);
    for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        const int s = cases[c][0], e = cases[c][1], blk = cases[c][2];
        /* part as the workspace sizes it: none where the panels divide the block (the path
         * must not touch it) */
        const size_t np = fold_linear_blocked_workspace_f32(K, blk);
        const int P = blk % PGEMM_PANEL ? blk : PGEMM_PANEL;
        float *part = np ? malloc(sizeof(float) * np) : NULL;
        ck_assert_msg((np == 0) == (P == PGEMM_PANEL), "block %d: part of %zu reals", blk, np);
        for (int th = 1; th <= 3; th += 2) {
            omp_set_num_threads(th);
            /* as linear_backward_blocked asks: k up to the call's rows (e - s <= T) */
            float *ws = malloc(sizeof(float) * fold_pgemm_workspace_f32(K, N > T ? N : T));
            memcpy(dw, dw0, sizeof(float) * N * K);
            fold_linear_backward_blocked_f32(NULL, dw, NULL, ws, part, dy + (size_t)s * N,
                                             x + (size_t)s * K, NULL, s, e, N, K, blk);
            for (int n = 0; n < N; n++)
                for (int k = 0; k < K; k++) {
                    float want = dw0[n * K + k];
                    for (int b0 = s, b1; b0 < e; b0 = b1) {
                        b1 = (b0 / P + 1) * P < e ? (b0 / P + 1) * P : e;
                        float acc = 0;
                        for (int t = b0; t < b1; t++)
                            acc = fmaf(dy[(size_t)t * N + n], x[(size_t)t * K + k], acc);
                        want = want + acc;
                    }
                    const float got = dw[n * K + k];
                    ck_assert_msg(!memcmp(&want, &got, sizeof got),
                                  "rows [%d, %d), block %d, %d threads: dw[%d][%d] = %a, the "
                                  "panel sums folded %a",
                                  s, e, blk, th, n, k, (double)got, (double)want);
                }
            /* split at the first block boundary past s: the same bits */
            const int m = (s / blk + 1) * blk;
            if (m < e) {
                memcpy(dw2, dw0, sizeof(float) * N * K);
                fold_linear_backward_blocked_f32(NULL, dw2, NULL, ws, part, dy + (size_t)s * N,
                                                 x + (size_t)s * K, NULL, s, m, N, K, blk);
                fold_linear_backward_blocked_f32(NULL, dw2, NULL, ws, part, dy + (size_t)m * N,
                                                 x + (size_t)m * K, NULL, m, e, N, K, blk);
                ck_assert_msg(!memcmp(dw, dw2, sizeof(float) * N * K),
                              "rows [%d, %d) split at %d, block %d: a bit changed", s, e, m, blk);
            }
            free(ws);
        }
        free(part);
    }
    omp_set_num_threads(2);
    free(dy), free(x), free(dw0), free(dw), free(dw2);
}
END_TEST

int main(void) {
    Suite *s = suite_create("pgemmfold");
    TCase *tc = tcase_create("pgemmfold");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fold_chains);
    tcase_add_test(tc, forward_folded);
    tcase_add_test(tc, forward_error);
    tcase_add_test(tc, dw_error);
    tcase_add_test(tc, fold_error);
    tcase_add_test(tc, blocked_dw);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
