/* test_accum.c — gradient accumulation: one step over micro-batches equals the same step over
 * the concatenated batch, for every objective, within rounding. Never bitwise: each micro-batch's
 * gradient is formed from zero and the micro-batch gradients are folded in order (the fold,
 * docs/distributed.md; tests/test_fold.c checks its bits), where the concatenated batch continues
 * one chain per element through all rows. Also: in stream, a DPO step never holds more than one
 * chunk of logits. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rows [r0, r0+n) of b as a batch of their own (sharing nothing with b). */
static sbp_batch slice(const sbp_batch *b, int r0, int n) {
    sbp_batch s = {.B = n, .T = b->T, .kind = b->kind};
    size_t cells = (size_t)n * b->T, off = (size_t)r0 * b->T;
    s.ids = malloc(sizeof *s.ids * cells), s.labels = malloc(sizeof *s.labels * cells);
    s.mask = malloc(cells);
    memcpy(s.ids, b->ids + off, sizeof *s.ids * cells);
    memcpy(s.labels, b->labels + off, sizeof *s.labels * cells);
    memcpy(s.mask, b->mask + off, cells);
    if (b->advantages) {
        s.advantages = malloc(sizeof(double) * n);
        memcpy(s.advantages, b->advantages + r0, sizeof(double) * n);
    }
    if (b->old_logps) {
        s.old_logps = malloc(sizeof(double) * cells);
        memcpy(s.old_logps, b->old_logps + off, sizeof(double) * cells);
    }
    if (b->ref_logps) {
        s.ref_logps = malloc(sizeof(double) * cells);
        memcpy(s.ref_logps, b->ref_logps + off, sizeof(double) * cells);
    }
    for (int r = 0; r < n; r++)
        for (int t = 0; t + 1 < s.T; t++)
            if (s.labels[(size_t)r * s.T + t + 1] != SBP_IGNORE) {
                s.n_targets++;
                s.n_pad_targets += s.mask[(size_t)r * s.T + t] == 0;
            }
    return s;
}

/* DPO pair p of b (chosen row p, rejected row pairs + p) as a batch of one pair. */
static sbp_batch dpo_pair(const sbp_batch *b, int p) {
    sbp_batch c = slice(b, p, 1), r = slice(b, b->pairs + p, 1), s = slice(b, 0, 2);
    memcpy(s.ids, c.ids, sizeof *s.ids * b->T), memcpy(s.ids + b->T, r.ids, sizeof *s.ids * b->T);
    memcpy(s.labels, c.labels, sizeof *s.labels * b->T);
    memcpy(s.labels + b->T, r.labels, sizeof *s.labels * b->T);
    memcpy(s.mask, c.mask, b->T), memcpy(s.mask + b->T, r.mask, b->T);
    s.n_targets = c.n_targets + r.n_targets, s.n_pad_targets = c.n_pad_targets + r.n_pad_targets;
    s.pairs = 1;
    s.ref_seq_logps = malloc(2 * sizeof(double));
    s.ref_seq_logps[0] = b->ref_seq_logps[p], s.ref_seq_logps[1] = b->ref_seq_logps[b->pairs + p];
    sbp_batch_free(&c), sbp_batch_free(&r);
    return s;
}

/* The step over micro-batches against the step over the whole batch. */
static void check(const char *model, const char *batch, sbp_objective_kind kind, sbp_objective obj,
                  sbp_precision prec) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, NULL, tu_model(model, 1), NULL, prec);
    sbp_err err = {0};
    if (sbp_batch_load_as(&b, batch, &m.cfg, kind, 1, &err)) ck_abort_msg("%s", err.msg);
    obj.kind = kind;
    sbp_grad_opts o = {
        .schedule = SBP_STREAM, .block = 4, .chunk = 8, .logit_chunk = 8, .objective = obj};
    /* SFT: one row per micro-batch; GRPO: one group of 2; DPO: one pair */
    int per = kind == SBP_OBJ_GRPO ? 2 : 1, n = kind == SBP_OBJ_DPO ? b.pairs : b.B / per;
    sbp_batch *micro = calloc((size_t)n, sizeof *micro);
    for (int i = 0; i < n; i++)
        micro[i] = kind == SBP_OBJ_DPO ? dpo_pair(&b, i) : slice(&b, per * i, per);
    sbp_grad_result whole, acc;
    if (sbp_grad(&whole, &m, &b, &o, NULL, &err)) ck_abort_msg("whole: %s", err.msg);
    if (sbp_grad_batches(&acc, &m, micro, n, &o, NULL, &err)) ck_abort_msg("micro: %s", err.msg);
    double worst = 0;
    for (int i = 0; i < m.params.n; i++)
        worst = fmax(worst, tu_rel_l2(&m, acc.grads, &m, whole.grads, &m.params.p[i]));
    double tol = prec == SBP_FP64 ? 1e-13 : 1e-5;
    ck_assert_msg(worst <= tol, "%s %s: micro-batches differ from the whole batch: rel. L2 %.3g",
                  model, batch, worst);
    ck_assert_msg(fabs(acc.loss - whole.loss) <= tol * fabs(whole.loss),
                  "%s %s: loss %.17g vs %.17g", model, batch, acc.loss, whole.loss);
    sbp_grad_result_free(&whole, NULL), sbp_grad_result_free(&acc, NULL);
    for (int i = 0; i < n; i++) sbp_batch_free(&micro[i]);
    free(micro);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}

START_TEST(sft_micro_batches) {
    sbp_objective o = {0};
    sbp_precision p = _i ? SBP_FP64 : SBP_FP32;
    /* untied, then tied (the embedding gradient sums head and lookup per micro-batch) */
    check("llama3-tiny", "data/batches/suite-unequal-rows.safetensors", SBP_OBJ_SFT, o, p);
    check("qwen2-tiny", "data/batches/sft-tiny.safetensors", SBP_OBJ_SFT, o, p);
    check("qwen3-tiny", "data/batches/sft-tiny.safetensors", SBP_OBJ_SFT, o, p);
}
END_TEST

START_TEST(grpo_micro_batches) {
    static const sbp_grpo_loss losses[] = {SBP_GRPO_GRPO, SBP_GRPO_BNPO, SBP_GRPO_DR_GRPO,
                                           SBP_GRPO_DAPO};
    sbp_objective o = {.grpo_loss = losses[_i],
                       .beta = 0.04,
                       .epsilon_low = 0.2,
                       .epsilon_high = 0.28,
                       .temperature = 0.7,
                       .max_completion_length = 20};
    check("llama3-tiny", "data/batches/grpo-tiny.safetensors", SBP_OBJ_GRPO, o, SBP_FP64);
    check("qwen3-tiny", "data/batches/grpo-tiny.safetensors", SBP_OBJ_GRPO, o, SBP_FP32);
}
END_TEST

START_TEST(dpo_micro_batches) {
    sbp_objective o = {.dpo_loss = _i ? SBP_DPO_IPO : SBP_DPO_SIGMOID,
                       .beta = 0.1,
                       .label_smoothing = _i ? 0 : 0.1};
    check("qwen2-tiny", "data/batches/dpo-tiny.safetensors", SBP_OBJ_DPO, o, SBP_FP64);
    check("qwen3-tiny", "data/batches/dpo-tiny.safetensors", SBP_OBJ_DPO, o, SBP_FP32);
}
END_TEST

/* In stream, no more than one chunk of logits is alive in a DPO step (both passes), where ckpt
 * with materialised logits holds all rows · T · V. */
START_TEST(dpo_stream_holds_one_logits_chunk) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, NULL, tu_model("llama3-tiny", 1), NULL, SBP_FP32);
    sbp_err err = {0};
    if (sbp_batch_load_as(&b, "data/batches/dpo-tiny.safetensors", &m.cfg, SBP_OBJ_DPO, 1, &err))
        ck_abort_msg("%s", err.msg);
    const int chunk = 4, V = m.cfg.vocab, C = m.cfg.hidden;
    sbp_grad_opts o = {.schedule = SBP_STREAM,
                       .block = 4,
                       .chunk = 8,
                       .logit_chunk = chunk,
                       .objective = {.kind = SBP_OBJ_DPO, .beta = 0.1}};
    sbp_ledger st = {0}, ck = {0};
    sbp_grad_result r;
    ck_assert_int_eq(sbp_grad(&r, &m, &b, &o, &st, &err), SBP_OK);
    sbp_grad_result_free(&r, &st);
    o.schedule = SBP_CKPT;
    ck_assert_int_eq(sbp_grad(&r, &m, &b, &o, &ck, &err), SBP_OK);
    sbp_grad_result_free(&r, &ck);
    /* one chunk of logits, the chunk's final-norm output and its gradient, per-row scalars,
     * and every target's log-prob (8 bytes per position) */
    int64_t one_chunk =
        (int64_t)chunk * (V + 2 * C + 1) * 4 + chunk * (3 * 8 + 4) + (int64_t)b.B * b.T * 8;
    ck_assert_msg(st.peak[SBP_MEM_LOGITS] <= one_chunk,
                  "stream DPO logits peak %lld > one chunk %lld",
                  (long long)st.peak[SBP_MEM_LOGITS], (long long)one_chunk);
    ck_assert_int_ge(ck.peak[SBP_MEM_LOGITS], (int64_t)b.B * b.T * V * 4);
    printf("DPO logits peak: stream %lld bytes (chunk of %d rows), ckpt %lld bytes\n",
           (long long)st.peak[SBP_MEM_LOGITS], chunk, (long long)ck.peak[SBP_MEM_LOGITS]);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("accumulation");
    TCase *tc = tcase_create("accumulation");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, sft_micro_batches, 0, 2);
    tcase_add_loop_test(tc, grpo_micro_batches, 0, 4);
    tcase_add_loop_test(tc, dpo_micro_batches, 0, 2);
    tcase_add_test(tc, dpo_stream_holds_one_logits_chunk);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
