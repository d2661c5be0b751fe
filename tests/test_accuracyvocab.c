/* test_accuracyvocab.c — the fast mode's LM-head dx with a real-sized vocabulary (issue 37).
 *
 * dx of the final norm's output is Σ_v dlogits(t, v)·W(v, :), a sum over the vocabulary that
 * every tensor below the head inherits. As one float chain of V terms it made every gradient of
 * a Qwen2 measuring model with V = 151936 1.8–3.5 × torch float32's error; the fast mode sums it
 * per k block of the product (pgemm_fold, kernels.h). Here: bench/accuracy.h's Qwen2 measuring
 * model with V = 32768 at T = 256 (block 128), every tensor's error against the float64 truth,
 * fast against portable (whose dx stays one chain, docs/numerics.md §4): the fast errors summed
 * over the tensors must be at most 0.6 of the portable ones (0.33 measured; 1.00 with the
 * fast dx as one chain). SBP_ACC_PRINT=1 prints every tensor's errors. */
#include "../bench/accuracy.h"
#include "testutil.h"

enum { VOCAB_T = 256, VOCAB_BLOCK = 128 };

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
    ck_assert_msg(!acc_measure(&rows, &n, dir, VOCAB_T, VOCAB_BLOCK, &err), "%s", err.msg);
    double fast = 0, portable = 0;
    for (int i = 0; i < n; i++) {
        fast += rows[i].err[ACC_FAST], portable += rows[i].err[ACC_PORTABLE];
        if (getenv("SBP_ACC_PRINT"))
            printf("%-48s fast %.3e portable %.3e\n", rows[i].name, rows[i].err[ACC_FAST],
                   rows[i].err[ACC_PORTABLE]);
    }
    free(rows);
    ck_assert_msg(n > 0 && fast <= 0.6 * portable,
                  "V = 32768: the fast errors sum to %.3e against portable's %.3e (ratio %.2f): "
                  "the head's dx is not folded",
                  fast, portable, fast / portable);
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
