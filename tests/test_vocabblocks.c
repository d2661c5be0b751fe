/* test_vocabblocks.c — the portable LM head's dx summed in vocabulary blocks of VOCAB_BLOCK
 * (docs/numerics.md §4, src/engine/steps/sums.c's sum_vocab_dx), on vocabularies of several
 * blocks: the golden models have V ≤ 512, one block, so they say nothing about the blocks.
 *
 * Two models of V = 2·512 + 276 (blocks [0, 512), [512, 1024) and [1024, 1300)): Qwen3 with tied
 * embeddings (the head is the embedding: its gradient takes the head's and the embedding's) and
 * Qwen2 untied with biases; one sequence of T = 150 tokens (past one token block: the head's
 * dW carries its token blocks too) and one left-padded:
 *  - every schedule, layer chunk and logits chunk (1, 7, 64, T − 1, T + 5) gives full BP's bits,
 *    in float32 and float64;
 *  - the CUDA tables in the SIMT emulator give the CPU's bits (the blocks go through the op
 *    table: copy, zero, linear_backward, add);
 *  - the planner's ledger equals the measured one (the blocks' scratch is charged). */
#include "../src/engine/engine.h" /* VOCAB_BLOCK */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

enum { VB_T = 150, VB_V = 2 * VOCAB_BLOCK + 276 };

static const char *const vb_json[] = {
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": 1300, "
    "\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32, "
    "\"hidden_act\": \"silu\", \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-06, "
    "\"rope_theta\": 1000000.0, \"attention_bias\": false, \"tie_word_embeddings\": true, "
    "\"initializer_range\": 0.1, \"torch_dtype\": \"float32\"}",
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 1300, "
    "\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
    "\"hidden_act\": \"silu\", \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-06, "
    "\"rope_theta\": 1000000.0, \"use_sliding_window\": false, \"tie_word_embeddings\": false, "
    "\"initializer_range\": 0.1, \"torch_dtype\": \"float32\"}"};

/* The model of case i (0 Qwen3 tied, 1 Qwen2) in a fresh directory. */
static const char *vb_model(int i) {
    sbp_err err = {0};
    sbp_config cfg;
    const char *dir = tu_path("vocabblocks-%d", i);
    ck_assert_msg(!sbp_config_parse(&cfg, vb_json[i], "vocabblocks", &err), "%s", err.msg);
    ck_assert_int_eq(cfg.vocab, VB_V);
    ck_assert_msg(!sbp_model_init(&cfg, 11 + i, dir, &err), "%s", err.msg);
    return dir;
}

/* B = 2 rows of T tokens: row 0 full, row 1 left-padded by 9; ids over the whole vocabulary
 * (every block has targets). */
static void vb_batch(sbp_batch *b) {
    tu_lcg_batch(b, VB_T, VB_V, 9, 0, 777);
}

static const sbp_grad_opts vb_base = {.schedule = SBP_FULL,
                                      .block = 4,
                                      .numerics = SBP_NUMERICS_PORTABLE,
                                      .objective = {.kind = SBP_OBJ_SFT}};

/* _i: model (_i / 2), precision (_i % 2) */
START_TEST(schedules_bitwise) {
    sbp_model m;
    sbp_batch b;
    sbp_err err = {0};
    ck_assert_msg(!sbp_model_load(&m, vb_model(_i / 2), _i % 2 ? SBP_FP64 : SBP_FP32, NULL, &err),
                  "%s", err.msg);
    vb_batch(&b);
    const int sizes[] = {1, 7, 64, VB_T - 1, VB_T + 5};
    const int n = sizeof sizes / sizeof *sizes;
    sbp_grad_result ref, r;
    tu_grad_opts(&ref, &m, &b, vb_base);
    for (int i = 0; i < n; i++)
        for (int v = 0; v < 3; v++) {
            sbp_grad_opts o = vb_base;
            o.schedule = v == 0 ? SBP_STREAM : v == 1 ? SBP_CKPT : SBP_FULL;
            o.chunk = v == 0 ? sizes[(i + 2) % n] : 0;
            o.logit_chunk = sizes[i];
            o.chunked_logits = v >= 1;
            tu_grad_opts(&r, &m, &b, o);
            char what[160];
            snprintf(what, sizeof what, "model %d %s, %s chunk %d logit chunk %d", _i / 2,
                     _i % 2 ? "fp64" : "fp32", sbp_schedule_name(o.schedule), o.chunk,
                     o.logit_chunk);
            tu_assert_same_grads(&m, NULL, &ref, &r, what);
            sbp_grad_result_free(&r, NULL);
        }
    sbp_grad_result_free(&ref, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* The CUDA tables in the emulator, stream with logits chunks that split the rows: the CPU's
 * full-BP bits. _i: model. */
START_TEST(emulator_matches_cpu) {
    sbp_model m;
    sbp_batch b;
    sbp_err err = {0};
    ck_assert_msg(!sbp_model_load(&m, vb_model(_i), SBP_FP32, NULL, &err), "%s", err.msg);
    vb_batch(&b);
    sbp_grad_result ref, r;
    tu_grad_opts(&ref, &m, &b, vb_base);
    sbp_grad_opts emu = vb_base;
    emu.device = SBP_DEVICE_CUDA_EMU, emu.schedule = SBP_STREAM, emu.chunk = 64;
    emu.logit_chunk = 37;
    tu_grad_opts(&r, &m, &b, emu);
    tu_assert_same_grads(&m, NULL, &ref, &r, "cuda-emu stream chunk 64, logit chunk 37");
    sbp_grad_result_free(&r, NULL);
    sbp_grad_result_free(&ref, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* sbp_plan's ledger against the measured one. _i: 0 portable (the blocks' scratch), 1 fast
 * (none). */
START_TEST(plan_equals_measured) {
    sbp_set_threads(2); /* per-thread workspaces, whatever OMP_NUM_THREADS says */
    sbp_model m;
    sbp_batch b;
    sbp_ledger meas = {0}, plan;
    sbp_err err = {0};
    ck_assert_msg(!sbp_model_load(&m, vb_model(1), SBP_FP32, &meas, &err), "%s", err.msg);
    vb_batch(&b);
    sbp_grad_opts o = vb_base;
    o.schedule = SBP_STREAM, o.chunk = 64, o.logit_chunk = 37;
    o.numerics = _i ? SBP_NUMERICS_FAST : SBP_NUMERICS_PORTABLE;
    sbp_grad_result r;
    if (sbp_grad(&r, &m, &b, &o, &meas, &err)) ck_abort_msg("%s", err.msg);
    sbp_grad_result_free(&r, &meas);
    const sbp_plan_opts po = {.grad = o, .B = b.B, .T = b.T, .storage_bytes = 4};
    if (sbp_plan(&plan, &m.cfg, &po, &err)) ck_abort_msg("plan: %s", err.msg);
    char what[32];
    snprintf(what, sizeof what, "case %d", _i);
    tu_assert_same_ledger(&plan, &meas, what);
    sbp_batch_free(&b);
    sbp_model_free(&m, &meas);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("vocabblocks");
    TCase *tc = tcase_create("vocabblocks");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, schedules_bitwise, 0, 4);
    tcase_add_loop_test(tc, emulator_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, plan_equals_measured, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
