/* test_plan.c — the planner walks the real schedule code: its ledger must equal, byte for byte,
 * the ledger of a real float32 run of the same model, batch shape and options. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

static void assert_same_ledger(const sbp_ledger *plan, const sbp_ledger *real, const char *what) {
    ck_assert_msg(plan->peak_total == real->peak_total, "%s: planned peak %lld, measured %lld",
                  what, (long long)plan->peak_total, (long long)real->peak_total);
    for (int c = 0; c < SBP_MEM_NCATS; c++) {
        ck_assert_msg(plan->peak[c] == real->peak[c], "%s: %s peak planned %lld, measured %lld",
                      what, sbp_mem_cat_name(c), (long long)plan->peak[c],
                      (long long)real->peak[c]);
        ck_assert_msg(plan->at_peak[c] == real->at_peak[c],
                      "%s: %s at total peak planned %lld, measured %lld", what, sbp_mem_cat_name(c),
                      (long long)plan->at_peak[c], (long long)real->at_peak[c]);
    }
    ck_assert_msg(plan->n_allocs == real->n_allocs, "%s: %lld planned allocations, %lld real", what,
                  (long long)plan->n_allocs, (long long)real->n_allocs);
}

START_TEST(plan_equals_measured) {
    static const char *families[] = {"qwen3-tiny", "qwen2-tiny", "llama3-tiny"};
    const char *family = families[_i % 3];
    sbp_schedule s = (sbp_schedule)(_i / 3);
    for (int chunked = 0; chunked <= (s == SBP_STREAM ? 0 : 1); chunked++) {
        sbp_ledger real = {0}, plan;
        sbp_model m;
        sbp_batch b;
        sbp_err err = {0};
        if (sbp_model_load(&m, tu_model(family, 1), SBP_FP32, &real, &err))
            ck_abort_msg("%s", err.msg);
        if (sbp_batch_load(&b, "data/batches/sft-demo.safetensors", &m.cfg, &err))
            ck_abort_msg("%s", err.msg);
        sbp_grad_opts o = {
            .schedule = s, .block = 16, .chunk = 32, .logit_chunk = 16, .chunked_logits = chunked};
        sbp_grad_result r;
        if (sbp_grad(&r, &m, &b, &o, &real, &err)) ck_abort_msg("%s", err.msg);
        sbp_plan_opts po = {.grad = o, .B = b.B, .T = b.T, .storage_bytes = 4};
        if (sbp_plan(&plan, &m.cfg, &po, &err)) ck_abort_msg("plan: %s", err.msg);
        char what[96];
        snprintf(what, sizeof what, "%s %s%s", family, sbp_schedule_name(s),
                 chunked ? " chunked logits" : "");
        /* the real ledger still holds weights and grads; the planner has freed everything */
        ck_assert_int_eq(plan.cur_total, 0);
        assert_same_ledger(&plan, &real, what);
        sbp_grad_result_free(&r, &real);
        sbp_batch_free(&b);
        sbp_model_free(&m, &real);
        ck_assert_int_eq(real.cur_total, 0);
    }
}
END_TEST

/* Plans of a model far too large to allocate: Qwen3-8B-sized at 100k tokens. The planning
 * ledger only reserves address space, so this runs in well under a second. */
START_TEST(plan_large_model) {
    sbp_config c = {.family = SBP_QWEN3,
                    .model_type = "qwen3",
                    .vocab = 151936,
                    .hidden = 4096,
                    .ffn = 12288,
                    .layers = 36,
                    .heads = 32,
                    .kv_heads = 8,
                    .head_dim = 128,
                    .eps = 1e-6,
                    .rope_theta = 1e6,
                    .qk_norm = 1};
    sbp_ledger full, stream;
    sbp_err err = {0};
    sbp_plan_opts o = {.grad = {.schedule = SBP_STREAM, .chunk = 4096, .logit_chunk = 1024},
                       .B = 1,
                       .T = 100000,
                       .storage_bytes = 2};
    if (sbp_plan(&stream, &c, &o, &err)) ck_abort_msg("%s", err.msg);
    o.grad.schedule = SBP_CKPT;
    if (sbp_plan(&full, &c, &o, &err)) ck_abort_msg("%s", err.msg);
    /* checkpoints: (L + 1) layer inputs of T x C at 2 bytes */
    ck_assert_int_eq(stream.peak[SBP_MEM_CHECKPOINTS], 37LL * 100000 * 4096 * 2);
    /* ckpt materialises T x V logits; stream never holds more than one chunk of them */
    ck_assert_int_ge(full.peak[SBP_MEM_LOGITS], 100000LL * 151936 * 2);
    /* one chunk of logits plus the chunk's final-norm output and its gradient */
    ck_assert_int_lt(stream.peak[SBP_MEM_LOGITS], 1024LL * (151936 + 2 * 4096) * 2 + (1 << 20));
    ck_assert_int_lt(stream.peak_total, full.peak_total);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("plan");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, plan_equals_measured, 0, 9);
    tcase_add_test(tc, plan_large_model);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
