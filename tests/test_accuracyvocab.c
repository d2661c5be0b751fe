/* test_accuracyvocab.c — the LM-head dx with a real-sized vocabulary (issue 37).
 *
 * dx of the final norm's output is Σ_v dlogits(t, v)·W(v, :), a sum over the vocabulary that
 * every tensor below the head inherits. As one float chain of V terms it made every gradient of
 * a Qwen2 measuring model with V = 151936 1.8–3.5 × torch float32's error; the fast mode sums it
 * per k block of the product (pgemm_fold, kernels.h), the portable mode in vocabulary blocks of
 * VOCAB_BLOCK (sum_vocab_dx, docs/numerics.md §4). Here: bench/accuracy.h's Qwen2 measuring
 * model with V = 32768 at T = 256 (block 128), every tensor's error against the float64 truth,
 * summed over the tensors, for each mode against ONE_CHAIN, the portable sum with the head's dx
 * as one chain (8.79e-5, measured; portable's bits are the same on every machine): both must be
 * at most 0.6 of it (measured: fast 4.08e-5, 0.46; portable 4.20e-5, 0.48; a mode's dx as one
 * chain: 1.00). SBP_ACC_PRINT=1 prints every tensor's errors. */
#include "../bench/accuracy.h"
#include "testutil.h"

enum { VOCAB_T = 256, VOCAB_TOKEN_BLOCK = 128 };
static const double ONE_CHAIN = 8.79e-5;

static const char vocab_json[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", "
    "\"vocab_size\": 32768, \"hidden_size\": 128, \"intermediate_size\": 256, "
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
    "\"head_dim\": 32, \"max_position_embeddings\": 4096, \"initializer_range\": 0.1, "
    "\"torch_dtype\": \"float32\", \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-06, "
    "\"rope_theta\": 1000000.0, \"use_sliding_window\": false, \"tie_word_embeddings\": false}";

START_TEST(head_dx_folded) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/acc-vocab", tu_tmpdir());
    sbp_err err = {0};
    sbp_config cfg;
    ck_assert_msg(!sbp_config_parse(&cfg, vocab_json, "qwen2-vocab", &err), "%s", err.msg);
    ck_assert_msg(!sbp_model_init(&cfg, 1, dir, &err), "%s", err.msg);
    acc_row *rows = NULL;
    int n = 0;
    ck_assert_msg(!acc_measure(&rows, &n, dir, VOCAB_T, VOCAB_TOKEN_BLOCK, 1, &err), "%s", err.msg);
    double fast = 0, portable = 0;
    for (int i = 0; i < n; i++) {
        fast += rows[i].err[ACC_FAST], portable += rows[i].err[ACC_PORTABLE];
        if (getenv("SBP_ACC_PRINT"))
            printf("%-48s fast %.3e portable %.3e\n", rows[i].name, rows[i].err[ACC_FAST],
                   rows[i].err[ACC_PORTABLE]);
    }
    free(rows);
    ck_assert_msg(n > 0 && fast <= 0.6 * ONE_CHAIN,
                  "V = 32768: the fast errors sum to %.3e, %.2f of the one chain's %.3e: the "
                  "head's dx is not folded",
                  fast, fast / ONE_CHAIN, ONE_CHAIN);
    ck_assert_msg(portable <= 0.6 * ONE_CHAIN,
                  "V = 32768: the portable errors sum to %.3e, %.2f of the one chain's %.3e: the "
                  "head's dx is not summed in vocabulary blocks",
                  portable, portable / ONE_CHAIN, ONE_CHAIN);
}
END_TEST

int main(void) {
    Suite *s = suite_create("accuracyvocab");
    TCase *tc = tcase_create("accuracyvocab");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, head_dx_folded);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
