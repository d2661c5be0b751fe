/* test_accuracy.c — float32 gradient error against a float64 truth, per tensor, within committed
 * bounds (issue 37; docs/accuracy.md).
 *
 * For each family's measuring model (bench/accuracy.h) at T = 1024 tokens with a token block of
 * 128 (8 blocks: the fast mode's per-block weight and norm sums are exercised), every tensor's
 * relative L2 error ‖g32 − g64‖/‖g64‖ of float32 fast and float32 portable must stay within the
 * bound of its kind in `bounds` below. The bounds are the errors measured on 2026-12-04 (AMD EPYC
 * Zen 4, AVX-512; the portable ones are the same bits on every machine) times 1.25, rounded up:
 * room for the fast mode's other products (OpenBLAS, an AVX2 kernel) whose roundings differ,
 * little enough that undoing a fix fails (reverting the fast mode's per-block norm sums raised
 * norm weights' errors past their bounds in every family). The per-block sums of the projection
 * weights gain less than that margin at this T, so the gains are checked against the single
 * chains the portable numerics summed over tokens before its token blocks (measured at this T
 * and block on 2026-12-04, commit 4bc8880; `chains` below): the fast errors summed over the
 * projection weights must be at most FAST_GAIN of the chains' (0.71-0.79 measured), and the
 * portable errors summed over every tensor summed over tokens (projection weights, biases, norm
 * weights) at most PORTABLE_GAIN of the chains' (0.68-0.80 measured since the products sum over
 * features in panels of 128, 0.83-0.94 with the token blocks undone; docs/numerics.md §4).
 *
 * SBP_ACC_PRINT=1 prints the measured table in the form of `bounds` (errors × 1.25). */
#include "../bench/accuracy.h"
#include "testutil.h"

enum { ACC_T = 1024, ACC_BLOCK = 128 };

typedef struct {
    const char *family, *key;
    double fast, portable;
} acc_bound;

static const acc_bound bounds[] = {
#include "accuracy_bounds.h"
};

/* The portable single chains over tokens at ACC_T (before SUM_BLOCK): per family, the errors
 * summed over the projection weights, and over every tensor summed over tokens (the projection
 * weights, the biases and the norm weights, the head's included) */
static const struct {
    const char *family;
    double proj, tokens;
} chains[] = {
    {"qwen3", 2.115e-5, 3.762e-5},
    {"qwen2", 2.426e-5, 4.465e-5},
    {"llama3", 2.472e-5, 3.400e-5},
    {"gemma3", 1.537e-5, 2.837e-5},
};
enum { N_CHAINS = sizeof chains / sizeof chains[0] };
#define PORTABLE_GAIN 0.81 /* 0.95 until the products' panels (2026-12-07) */
#define FAST_GAIN     0.81

/* Whether a tensor kind is a sum over tokens: a projection's weight or bias, a norm weight, an
 * untied head (a tied one shares its tensor with the embedding's scatter-add). */
static int token_sum(const char *key) {
    return strstr(key, "proj.") || strstr(key, "norm.weight") || strstr(key, "lm_head.");
}

static const acc_bound *find_bound(const char *family, const char *key) {
    for (size_t i = 0; i < sizeof bounds / sizeof *bounds; i++)
        if (!strcmp(bounds[i].family, family) && !strcmp(bounds[i].key, key)) return &bounds[i];
    return NULL;
}

static void check_family(const char *family) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/acc-%s", tu_tmpdir(), family);
    sbp_err err = {0};
    ck_assert_msg(!acc_make_model(family, 0, 1, dir, &err), "%s", err.msg);
    acc_row *rows = NULL;
    int n = 0;
    ck_assert_msg(!acc_measure(&rows, &n, dir, ACC_T, ACC_BLOCK, 1, &err), "%s", err.msg);
    const int print = getenv("SBP_ACC_PRINT") != NULL;
    int bad = 0;
    double proj_fast = 0, tok_portable = 0; /* summed: projection weights, token sums */
    for (int i = 0; i < n; i++) {
        char key[96];
        acc_kind_key(key, sizeof key, rows[i].name);
        const double f = rows[i].err[ACC_FAST], p = rows[i].err[ACC_PORTABLE];
        if (strstr(key, "proj.weight")) proj_fast += f;
        if (token_sum(key)) tok_portable += p;
        if (print)
            printf("    {\"%s\", \"%s\", %.2e, %.2e}, /* %s */\n", family, key, f * 1.25, p * 1.25,
                   rows[i].name);
        const acc_bound *b = find_bound(family, key);
        if (!b) {
            fprintf(stderr, "%s: %s has no committed bound\n", family, rows[i].name);
            bad++;
            continue;
        }
        if (!(f <= b->fast) || !(p <= b->portable)) {
            fprintf(stderr, "%s: %s: fast %.3e (bound %.3e), portable %.3e (bound %.3e)\n", family,
                    rows[i].name, f, b->fast, p, b->portable);
            bad++;
        }
    }
    free(rows);
    fflush(stdout);
    int c = 0;
    while (c < N_CHAINS && strcmp(chains[c].family, family)) c++;
    ck_assert_msg(c < N_CHAINS, "%s: no single-chain errors committed", family);
    if (print)
        printf("    /* %s: fast projections %.3f of the chains', portable token sums %.3f */\n",
               family, proj_fast / chains[c].proj, tok_portable / chains[c].tokens);
    /* The fast mode's per-block weight gradients against the single chains, on any machine
     * with a tuned product (its panels' bits do not depend on the instruction set): 0.71-0.79
     * measured, 0.83-0.85 with dW as one chain (before the products summed in panels of 128:
     * 0.79-0.85, and 0.89-0.95, against a limit of 0.88) */
    ck_assert_msg(proj_fast <= FAST_GAIN * chains[c].proj,
                  "%s: projection weights' errors fast %.3e against the single chains' %.3e: the "
                  "per-block sums do not pay",
                  family, proj_fast, chains[c].proj);
    /* The portable token blocks against the single chains (the same bits on every machine, so
     * the limit may sit close: 0.68-0.80 with the blocks, 0.83-0.94 without) */
    ck_assert_msg(tok_portable <= PORTABLE_GAIN * chains[c].tokens,
                  "%s: token sums' errors portable %.3e against the single chains' %.3e: the "
                  "token blocks do not pay",
                  family, tok_portable, chains[c].tokens);
    ck_assert_msg(bad == 0, "%s: %d tensors past their error bounds (stderr)", family, bad);
}

START_TEST(qwen3) {
    check_family("qwen3");
}
END_TEST

START_TEST(qwen2) {
    check_family("qwen2");
}
END_TEST

START_TEST(llama3) {
    check_family("llama3");
}
END_TEST

START_TEST(gemma3) {
    check_family("gemma3");
}
END_TEST

int main(void) {
    Suite *s = suite_create("accuracy");
    TCase *tc = tcase_create("accuracy");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, qwen3);
    tcase_add_test(tc, qwen2);
    tcase_add_test(tc, llama3);
    tcase_add_test(tc, gemma3);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
