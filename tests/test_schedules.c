/* test_schedules.c — the exactness promises of docs/numerics.md §1 (fast numerics, then the
 * portable numerics at the end):
 *  - full, ckpt and stream give bit-identical gradients and loss whenever the chunk (and logits
 *    chunk) is a multiple of the token block, in float32 and float64, on every bundled family;
 *  - the result does not depend on the thread count (1 vs 2);
 *  - chunks that are not block multiples agree with full within the measured tolerance;
 *    full BP itself gives the same bits whatever its --chunk (its forward uses whole blocks).
 * All comparisons are made within one process (bit patterns depend on the OpenBLAS kernels of
 * the machine, so nothing here is compared against stored bits). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *families[] = {"qwen3-tiny", "qwen2-tiny", "llama3-tiny"};

/* Reference: full BP with materialised logits. */
static void reference(sbp_grad_result *r, const sbp_model *m, const sbp_batch *b, int block) {
    tu_grad(r, m, b, SBP_FULL, block, 0, 0, 0);
}

static void assert_bitwise(const sbp_model *m, const sbp_grad_result *ref, const sbp_grad_result *r,
                           const char *what) {
    int i = tu_first_diff(m, ref->grads, r->grads);
    ck_assert_msg(i < 0, "%s: gradient of %s differs from full BP", what,
                  i < 0 ? "" : m->params.p[i].name);
    ck_assert_msg(memcmp(&ref->loss, &r->loss, sizeof r->loss) == 0,
                  "%s: loss %.17g differs from full BP's %.17g", what, r->loss, ref->loss);
}

/* Every schedule and block-multiple chunk against full BP, for one family and precision. */
static void check_family(const char *family, sbp_precision prec, const char *batch, int block,
                         const int *chunks, int nchunks) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model(family, 7), batch, prec);
    sbp_grad_result ref, r;
    reference(&ref, &m, &b, block);
    char what[160];
    snprintf(what, sizeof what, "%s %s ckpt", family, prec == SBP_FP64 ? "fp64" : "fp32");
    tu_grad(&r, &m, &b, SBP_CKPT, block, 0, 0, 0);
    assert_bitwise(&m, &ref, &r, what);
    sbp_grad_result_free(&r, NULL);
    for (int i = 0; i < nchunks; i++) {
        snprintf(what, sizeof what, "%s %s stream chunk %d", family,
                 prec == SBP_FP64 ? "fp64" : "fp32", chunks[i]);
        tu_grad(&r, &m, &b, SBP_STREAM, block, chunks[i], block, 0);
        assert_bitwise(&m, &ref, &r, what);
        sbp_grad_result_free(&r, NULL);
        /* the logits chunk independently of the layer chunk */
        snprintf(what, sizeof what, "%s stream chunk %d logit chunk %d", family, chunks[i],
                 chunks[i]);
        tu_grad(&r, &m, &b, SBP_STREAM, block, block, chunks[i], 0);
        assert_bitwise(&m, &ref, &r, what);
        sbp_grad_result_free(&r, NULL);
        snprintf(what, sizeof what, "%s ckpt with chunked logits %d", family, chunks[i]);
        tu_grad(&r, &m, &b, SBP_CKPT, block, 0, chunks[i], 1);
        assert_bitwise(&m, &ref, &r, what);
        sbp_grad_result_free(&r, NULL);
    }
    /* full BP's forward runs in whole token blocks near --chunk (driver.c, forward_rows): its
     * bits depend on no chunk, ragged ones included */
    const int full_chunks[] = {1, 7, block + 1, chunks[nchunks - 1] + 5};
    for (int i = 0; i < 4; i++) {
        snprintf(what, sizeof what, "%s full with chunk %d", family, full_chunks[i]);
        tu_grad(&r, &m, &b, SBP_FULL, block, full_chunks[i], 0, 0);
        assert_bitwise(&m, &ref, &r, what);
        sbp_grad_result_free(&r, NULL);
    }
    sbp_grad_result_free(&ref, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}

/* sft-tiny: B = 2, T = 24, one right-padded and one left-padded row, prompt-masked labels. */
static const int tiny_chunks[] = {4, 8, 12, 20, 24};

START_TEST(bitwise_fp32) {
    check_family(families[_i], SBP_FP32, "data/batches/sft-tiny.safetensors", 4, tiny_chunks, 5);
}
END_TEST

START_TEST(bitwise_fp64) {
    check_family(families[_i], SBP_FP64, "data/batches/sft-tiny.safetensors", 4, tiny_chunks, 5);
}
END_TEST

/* sft-demo: T = 96 with blocks of 16 (several attention tiles per sequence is not reached at
 * T = 96, but several blocks per chunk are). */
START_TEST(bitwise_demo_blocks) {
    static const int chunks[] = {16, 32, 48, 80};
    check_family("qwen3-tiny", _i ? SBP_FP64 : SBP_FP32, "data/batches/sft-demo.safetensors", 16,
                 chunks, 4);
}
END_TEST

/* sft-demo with blocks of 4: attention tiles of 4, so the fast backward of a whole sequence (full
 * BP, ckpt) runs in three passes of 8 tiles (32 queries, fast/attention.c) while stream's chunks
 * start and end inside and across them; every chunking gives full BP's bits. _i: fp32, fp64. */
START_TEST(bitwise_attention_passes) {
    static const int chunks[] = {4, 12, 36, 44};
    check_family("llama3-tiny", _i ? SBP_FP64 : SBP_FP32, "data/batches/sft-demo.safetensors", 4,
                 chunks, 4);
}
END_TEST

/* qwen3-wide: qwen3-tiny with V = 8300, so the LM head's products run on several feature panels
 * of the fast mode's tile grid (fast/linear.c), the last one ragged, and sum over a K that is no
 * multiple of 32; the embedding tied. _i: fp32, fp64. */
START_TEST(bitwise_wide_vocab) {
    check_family("qwen3-wide", _i ? SBP_FP64 : SBP_FP32, "data/batches/sft-tiny.safetensors", 4,
                 tiny_chunks, 5);
}
END_TEST

/* Default options (block 512 > T): one block, one chunk; still all three identical. */
START_TEST(bitwise_defaults) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model("llama3-tiny", 3), "data/batches/sft-demo.safetensors", SBP_FP32);
    sbp_grad_result ref, r;
    reference(&ref, &m, &b, 0);
    for (sbp_schedule s = SBP_CKPT; s <= SBP_STREAM; s++) {
        tu_grad(&r, &m, &b, s, 0, 0, 0, 0);
        assert_bitwise(&m, &ref, &r, sbp_schedule_name(s));
        sbp_grad_result_free(&r, NULL);
    }
    sbp_grad_result_free(&ref, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* 1 vs 2 and 3 threads, each schedule, both precisions (_i % 2), qwen3-tiny and qwen3-wide (the
 * LM head on several feature panels). Both have 2 kv heads: at 1 and 2 threads the attention
 * backward takes its one-pass form, at 3 its two-pass form (src/kernels/fast/attention.c), which
 * must give the same bits. */
START_TEST(thread_count_invariance) {
    sbp_precision prec = _i % 2 ? SBP_FP64 : SBP_FP32;
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model(_i / 2 ? "qwen3-wide" : "qwen3-tiny", 7),
            "data/batches/sft-demo.safetensors", prec);
    for (sbp_schedule s = SBP_FULL; s <= SBP_STREAM; s++) {
        sbp_grad_result one, more;
        sbp_set_threads(1);
        tu_grad(&one, &m, &b, s, 16, 32, 16, 0);
        for (int threads = 2; threads <= 3; threads++) {
            sbp_set_threads(threads);
            tu_grad(&more, &m, &b, s, 16, 32, 16, 0);
            char what[64];
            snprintf(what, sizeof what, "%s, %d threads vs 1", sbp_schedule_name(s), threads);
            assert_bitwise(&m, &one, &more, what);
            sbp_grad_result_free(&more, NULL);
        }
        sbp_grad_result_free(&one, NULL);
    }
    sbp_set_threads(2);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* Chunks that are not block multiples split token blocks, so BLAS sums group differently: the
 * result differs from full BP by rounding only. The bounds below are measured (docs/numerics.md
 * §1): worst relative L2 over all parameters, families and chunk sizes, with margin. */
#define RAGGED_TOL_FP32 1e-5
#define RAGGED_TOL_FP64 2e-14

START_TEST(ragged_chunks_within_tolerance) {
    sbp_precision prec = _i % 2 ? SBP_FP64 : SBP_FP32;
    const char *family = families[_i / 2];
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model(family, 7), "data/batches/sft-tiny.safetensors", prec);
    const int T = b.T, chunks[] = {1, 7, T - 1, T + 5};
    sbp_grad_result ref, r;
    reference(&ref, &m, &b, 4);
    double tol = prec == SBP_FP64 ? RAGGED_TOL_FP64 : RAGGED_TOL_FP32;
    for (int c = 0; c < 4; c++) {
        tu_grad(&r, &m, &b, SBP_STREAM, 4, chunks[c], chunks[c] > T ? T : chunks[c], 0);
        for (int i = 0; i < m.params.n; i++) {
            double e = tu_rel_l2(&m, r.grads, &m, ref.grads, &m.params.p[i]);
            ck_assert_msg(e <= tol, "%s chunk %d: %s rel. L2 %.3g > %.3g", family, chunks[c],
                          m.params.p[i].name, e, tol);
        }
        ck_assert_msg(fabs(r.loss - ref.loss) <= tol * fabs(ref.loss), "%s chunk %d: loss", family,
                      chunks[c]);
        sbp_grad_result_free(&r, NULL);
    }
    sbp_grad_result_free(&ref, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* Portable numerics (docs/numerics.md §1): every run is bit-identical to full BP on one thread —
 * every schedule, layer chunks and logits chunks of 1, 7, T − 1, T + 5 and block multiples, other
 * token blocks, 2 threads — for every family, both precisions and every objective. _i: family
 * (_i / 6), objective (_i / 2 % 3), precision (_i % 2). */
START_TEST(portable_every_run) {
    static const struct {
        const char *batch;
        sbp_objective o;
    } objs[] = {
        {"data/batches/sft-tiny.safetensors", {.kind = SBP_OBJ_SFT}},
        {"data/batches/dpo-tiny.safetensors", {.kind = SBP_OBJ_DPO, .beta = 0.1}},
        {"data/batches/grpo-tiny.safetensors",
         {.kind = SBP_OBJ_GRPO,
          .grpo_loss = SBP_GRPO_GRPO,
          .beta = 0.04,
          .epsilon_low = 0.2,
          .epsilon_high = 0.28,
          .temperature = 0.7}},
    };
    const char *family = families[_i / 6];
    const int k = _i / 2 % 3;
    const sbp_precision prec = _i % 2 ? SBP_FP64 : SBP_FP32;
    sbp_model m;
    sbp_batch b;
    sbp_err err = {0};
    tu_load(&m, NULL, tu_model(family, 7), NULL, prec);
    if (sbp_batch_load_as(&b, objs[k].batch, &m.cfg, objs[k].o.kind, 1, &err))
        ck_abort_msg("%s: %s", objs[k].batch, err.msg);
    const int T = b.T, sizes[] = {1, 7, T - 1, T + 5, 4, 8};
    sbp_grad_opts op = {.schedule = SBP_FULL,
                        .block = 4,
                        .objective = objs[k].o,
                        .numerics = SBP_NUMERICS_PORTABLE};
    sbp_grad_result ref, r;
    sbp_set_threads(1);
    if (sbp_grad(&ref, &m, &b, &op, NULL, &err)) ck_abort_msg("full: %s", err.msg);
    int runs = 0;
    for (int threads = 1; threads <= 2; threads++) {
        sbp_set_threads(threads);
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 6; j++)
                for (int v = 0; v < 4; v++) {     /* stream; ckpt, full with chunked logits */
                    if (v > 0 && i > 0) continue; /* their layer chunk is T: vary logits only */
                    if (threads == 2 && j != i) continue; /* 2 threads: a diagonal */
                    sbp_grad_opts o = op;
                    o.schedule = v == 0 ? SBP_STREAM : v == 1 ? SBP_CKPT : SBP_FULL;
                    o.chunk = sizes[i], o.logit_chunk = sizes[j];
                    o.chunked_logits = v > 0;
                    o.block = v == 3 ? 16 : 4; /* another token block changes nothing either */
                    if (sbp_grad(&r, &m, &b, &o, NULL, &err)) ck_abort_msg("%s", err.msg);
                    char what[160];
                    snprintf(what, sizeof what,
                             "portable %s %s %s %s chunk %d logit chunk %d, "
                             "block %d, %d threads",
                             family, prec == SBP_FP64 ? "fp64" : "fp32", objs[k].batch + 13,
                             sbp_schedule_name(o.schedule), o.chunk, o.logit_chunk, o.block,
                             threads);
                    assert_bitwise(&m, &ref, &r, what);
                    sbp_grad_result_free(&r, NULL);
                    runs++;
                }
    }
    ck_assert_int_eq(runs, 36 + 3 * 6 + 6 + 3);
    sbp_set_threads(1);
    sbp_grad_result_free(&ref, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* A chunk larger than T is clamped, and the result is then identical to chunk = T. */
START_TEST(chunk_clamped_to_T) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model("qwen2-tiny", 7), "data/batches/sft-tiny.safetensors", SBP_FP32);
    sbp_grad_result a, c;
    tu_grad(&a, &m, &b, SBP_STREAM, 4, b.T, b.T, 0);
    tu_grad(&c, &m, &b, SBP_STREAM, 4, 10 * b.T, 10 * b.T, 0);
    ck_assert_int_eq(c.chunk, b.T);
    ck_assert_int_eq(c.logit_chunk, b.T);
    assert_bitwise(&m, &a, &c, "chunk 10T vs T");
    sbp_grad_result_free(&a, NULL);
    sbp_grad_result_free(&c, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("schedules");
    TCase *tc = tcase_create("bitwise");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, bitwise_fp32, 0, 3);
    tcase_add_loop_test(tc, bitwise_fp64, 0, 3);
    tcase_add_loop_test(tc, bitwise_demo_blocks, 0, 2);
    tcase_add_loop_test(tc, bitwise_attention_passes, 0, 2);
    tcase_add_test(tc, bitwise_defaults);
    tcase_add_loop_test(tc, bitwise_wide_vocab, 0, 2);
    tcase_add_loop_test(tc, thread_count_invariance, 0, 4);
    tcase_add_test(tc, chunk_clamped_to_T);
    suite_add_tcase(s, tc);
    TCase *pt = tcase_create("portable");
    tcase_set_timeout(pt, 300);
    tcase_add_loop_test(pt, portable_every_run, 0, 18);
    suite_add_tcase(s, pt);
    TCase *tol = tcase_create("tolerance");
    tcase_set_timeout(tol, 120);
    tcase_add_loop_test(tol, ragged_chunks_within_tolerance, 0, 6);
    suite_add_tcase(s, tol);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
