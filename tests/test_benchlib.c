/* test_benchlib.c — the bench module (src/bench/bench.h) called directly: a tiny run completes
 * and fills its rows (every schedule asked, then the training steps, each with a time, a FLOP
 * count, a ledger, a plan, an RSS and a loss); a bad option is an sbp_err naming it and measures
 * nothing; --largest's search decides T and a schedule that fits nowhere is a note; a measurement
 * that fails is reported and counted while the others are still made; the random model's
 * temporary directory is removed. */
#include "testutil.h"
#include "../src/bench/bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What a run handed its sink. */
typedef struct {
    sbp_bench_row rows[16];
    int n_rows;
    char notes[64][200];
    sbp_bench_note kinds[64];
    int n_notes;
} got_t;

static void got_row(void *ctx, const sbp_bench_row *r) {
    got_t *g = ctx;
    ck_assert_int_lt(g->n_rows, 16);
    g->rows[g->n_rows++] = *r;
}

static void got_note(void *ctx, sbp_bench_note kind, const char *text) {
    got_t *g = ctx;
    ck_assert_int_lt(g->n_notes, 64);
    g->kinds[g->n_notes] = kind;
    snprintf(g->notes[g->n_notes++], sizeof g->notes[0], "%s", text);
}

static const sbp_bench_schedule full = {"full", SBP_FULL, 0}, stream = {"stream", SBP_STREAM, 0};

/* One T of the tiny Qwen3, fast numerics, one timed round. */
static sbp_bench_opts tiny_opts(const sbp_bench_model *bm, const int *seqs,
                                const sbp_bench_schedule *sc, int n_sc) {
    return (sbp_bench_opts){.model = bm,
                            .seqs = seqs,
                            .n_seqs = 1,
                            .schedules = sc,
                            .n_schedules = n_sc,
                            .numerics = 1 << SBP_NUMERICS_FAST,
                            .threads = 1,
                            .reps = 1,
                            .warmup = 0,
                            .block = 16,
                            .chunk = 16,
                            .logit_chunk = 16,
                            .device = SBP_DEVICE_CPU,
                            .train = 1};
}

static int has_note(const got_t *g, sbp_bench_note kind, const char *text) {
    for (int i = 0; i < g->n_notes; i++)
        if (g->kinds[i] == kind && strstr(g->notes[i], text)) return 1;
    return 0;
}

/* The FMA probe counts what it ran: the product kernel's accumulators (12 × 2 vectors of 16
 * floats with AVX-512, 6 × 2 of 8 with AVX2 + FMA), 2 operations a lane per step, linear in the
 * steps; nothing without a vector fma. */
START_TEST(the_fma_probe_counts_its_operations) {
#if defined(__AVX512F__)
    const int64_t per_step = 12 * 2 * 16 * 2;
#elif defined(__AVX2__) && defined(__FMA__)
    const int64_t per_step = 6 * 2 * 8 * 2;
#else
    const int64_t per_step = 0;
#endif
    ck_assert_int_eq(sbp_bench_fma_chains(0), 0);
    ck_assert_int_eq(sbp_bench_fma_chains(1), per_step);
    ck_assert_int_eq(sbp_bench_fma_chains(1000), 1000 * per_step);
}
END_TEST

START_TEST(a_tiny_run_fills_its_rows) {
    sbp_err err = {0};
    sbp_bench_model bm;
    ck_assert_msg(sbp_bench_model_open(&bm, NULL, "data/models/qwen3-tiny.json", &err) == SBP_OK,
                  "%s", err.msg);
    ck_assert_msg(bm.tmp[0] && tu_exists(tu_join(bm.dir, "model.safetensors")), "%s", bm.dir);
    ck_assert_int_eq(bm.cfg.hidden, 64);
    ck_assert_int_gt(bm.n_params, 0);
    sbp_bench_rates rates;
    sbp_bench_gemm_rates(&rates, &bm.cfg, 1, 1);
    ck_assert_msg(rates.sgemm > 0 && rates.portable > 0, "%g %g", rates.sgemm, rates.portable);
    /* a build with vector fma has a peak; one without says so (NaN), and no row claims one */
    const int vector_fma = sbp_bench_fma_chains(1) > 0;
    ck_assert_msg(vector_fma ? rates.fma_peak > 0 : isnan(rates.fma_peak), "%g", rates.fma_peak);
    const int seqs[] = {24};
    const sbp_bench_schedule sc[] = {full, stream};
    sbp_bench_opts o = tiny_opts(&bm, seqs, sc, 2);
    got_t g = {0};
    const sbp_bench_sink sink = {.ctx = &g, .row = got_row, .note = got_note};
    int failures = -1;
    ck_assert_msg(sbp_bench_run(&o, &rates, &sink, &failures, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(failures, 0);
    static const char *const names[] = {"full", "stream", "train-stream", "train-stream-lora"};
    ck_assert_int_eq(g.n_rows, 4);
    for (int i = 0; i < 4; i++) {
        const sbp_bench_row *r = &g.rows[i];
        ck_assert_str_eq(r->name, names[i]);
        ck_assert_int_eq(r->T, 24);
        ck_assert_int_eq(r->numerics, SBP_NUMERICS_FAST);
        ck_assert_int_eq(r->runs, 1);
        ck_assert_msg(r->seconds > 0 && r->gflop > 0 && r->gflops > 0 && r->tokens_per_s > 0,
                      "%s: %g s, %g GFLOP", r->name, r->seconds, r->gflop);
        ck_assert_msg(fabs(r->gflops - r->gflop / r->seconds) <= 1e-9 * r->gflops, "%s", r->name);
        ck_assert_msg(isfinite(r->of_sgemm) && r->of_sgemm > 0, "%s: %g", r->name, r->of_sgemm);
        if (vector_fma) /* no warm-up: each step timed alone, against the run's peak */
            ck_assert_msg(fabs(r->of_peak - r->gflops / rates.fma_peak) <= 1e-12 * r->of_peak,
                          "%s: %g", r->name, r->of_peak);
        else
            ck_assert_msg(isnan(r->of_peak), "%s: %g", r->name, r->of_peak);
        ck_assert_msg(r->lg.peak_total > 0 && r->planned_peak > 0 && r->rss > 0, "%s", r->name);
        /* random weights, random tokens: about log V */
        ck_assert_msg(fabs(r->loss - log(bm.cfg.vocab)) < 1.0, "%s: loss %g", r->name, r->loss);
    }
    /* the optimizer's moments are in the training rows' ledgers, not in the schedules' */
    ck_assert_int_eq(g.rows[1].lg.peak[SBP_MEM_OPTIMIZER], 0);
    ck_assert_int_gt(g.rows[2].lg.peak[SBP_MEM_OPTIMIZER], 0);
    ck_assert(g.rows[3].lg.peak[SBP_MEM_OPTIMIZER] < g.rows[2].lg.peak[SBP_MEM_OPTIMIZER]);
    ck_assert(has_note(&g, SBP_BENCH_PROGRESS, "T = 24, stream, fast numerics: memory"));
    ck_assert(has_note(&g, SBP_BENCH_PROGRESS,
                       "T = 24: 1 training step (stream + clipping + AdamW, LoRA r 32)..."));
    /* after a warm-up round the schedules are timed in rounds, each round's steps against the
     * sgemm rate and FMA peak timed right after it */
    o.warmup = 1, o.train = 0;
    got_t w = {0};
    const sbp_bench_sink wsink = {.ctx = &w, .row = got_row, .note = got_note};
    ck_assert_msg(sbp_bench_run(&o, &rates, &wsink, &failures, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(w.n_rows, 2);
    ck_assert(has_note(&w, SBP_BENCH_PROGRESS, "T = 24: 1 warm-up and 1 timed round of 2"));
    for (int i = 0; i < 2; i++) {
        const sbp_bench_row *r = &w.rows[i];
        ck_assert_msg(isfinite(r->of_sgemm) && r->of_sgemm > 0, "%s: %g", r->name, r->of_sgemm);
        ck_assert_msg(vector_fma ? isfinite(r->of_peak) && r->of_peak > 0 : isnan(r->of_peak),
                      "%s: %g", r->name, r->of_peak);
    }
    /* the temporary model goes with the model */
    char tmp[sizeof bm.tmp];
    snprintf(tmp, sizeof tmp, "%s", bm.tmp);
    sbp_bench_model_close(&bm);
    ck_assert(!tu_exists(tmp));
}
END_TEST

/* Each option out of range: an error naming it, nothing measured, the sink not called. */
START_TEST(a_bad_option_is_an_error) {
    sbp_err err = {0};
    sbp_bench_model bm;
    ck_assert_msg(sbp_bench_model_open(&bm, tu_model("qwen3-tiny", 1), NULL, &err) == SBP_OK, "%s",
                  err.msg);
    ck_assert(!bm.tmp[0]);
    const int seqs[] = {16}, bad_seq[] = {0};
    const sbp_bench_rates rates = {.sgemm = 1, .portable = 1};
    for (int i = 0; i < 8; i++) {
        sbp_bench_opts o = tiny_opts(&bm, seqs, &stream, 1);
        const char *want = NULL;
        switch (i) {
        case 0: o.n_seqs = 0, want = "--seq"; break;
        case 1: o.seqs = bad_seq, want = "--seq"; break;
        case 2: o.n_schedules = 0, want = "--schedules"; break;
        case 3: o.reps = 16, want = "--reps"; break;
        case 4: o.warmup = 16, want = "--warmup"; break;
        case 5: o.threads = 0, want = "--threads"; break;
        case 6: o.largest = 1 << 20, want = "--largest"; break; /* and no search */
        case 7: o.numerics = 1 << 5, want = "--numerics"; break;
        }
        got_t g = {0};
        const sbp_bench_sink sink = {.ctx = &g, .row = got_row, .note = got_note};
        int failures = -1;
        ck_assert_int_eq(sbp_bench_check(&o, &err), SBP_EUSAGE);
        ck_assert_msg(strstr(err.msg, want), "case %d: %s", i, err.msg);
        ck_assert_int_eq(sbp_bench_run(&o, &rates, &sink, &failures, &err), SBP_EUSAGE);
        ck_assert_int_eq(failures, 0);
        ck_assert_int_eq(g.n_rows + g.n_notes, 0);
    }
    sbp_bench_model_close(&bm);
    ck_assert(tu_exists(tu_join(tu_model("qwen3-tiny", 1), "model.safetensors"))); /* not ours */
    /* the model: one of a directory and a config; a config that is not there is named */
    ck_assert_int_eq(sbp_bench_model_open(&bm, "a", "b", &err), SBP_EUSAGE);
    ck_assert_int_eq(sbp_bench_model_open(&bm, NULL, "/nonexistent/c.json", &err), SBP_EIO);
    ck_assert_msg(strstr(err.msg, "/nonexistent/c.json"), "%s", err.msg);
}
END_TEST

/* A stand-in for the planner's search: every schedule fits at T = 20 but full, at none. */
static int fake_largest(const sbp_config *cfg, const sbp_plan_opts *o, int64_t budget,
                        sbp_ledger *at) {
    memset(at, 0, sizeof *at);
    if (o->grad.schedule == SBP_FULL) return 0;
    at->peak_total = budget / 2;
    return 20;
}

START_TEST(largest_takes_its_T_from_the_search) {
    sbp_err err = {0};
    sbp_bench_model bm;
    ck_assert_msg(sbp_bench_model_open(&bm, tu_model("qwen3-tiny", 1), NULL, &err) == SBP_OK, "%s",
                  err.msg);
    const int seqs[] = {512, 1024};
    const sbp_bench_schedule sc[] = {full, stream};
    sbp_bench_opts o = tiny_opts(&bm, seqs, sc, 2);
    o.n_seqs = 2, o.largest = 64 << 20, o.largest_T = fake_largest;
    const sbp_bench_rates rates = {.sgemm = 50, .portable = 50};
    got_t g = {0};
    const sbp_bench_sink sink = {.ctx = &g, .row = got_row, .note = got_note};
    int failures = -1;
    ck_assert_msg(sbp_bench_run(&o, &rates, &sink, &failures, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(failures, 0);
    ck_assert(has_note(&g, SBP_BENCH_NO_FIT, "full          does not fit in 64 MiB at any T"));
    ck_assert_int_eq(g.n_rows, 1); /* one row only, and no training rows */
    ck_assert_str_eq(g.rows[0].name, "stream");
    ck_assert_int_eq(g.rows[0].T, 20);
    ck_assert_int_eq(g.rows[0].planned_peak, 32 << 20);
    ck_assert_msg(fabs(g.rows[0].of_sgemm - g.rows[0].gflops / 50) < 1e-12, "%g",
                  g.rows[0].of_sgemm);
    ck_assert_msg(isnan(g.rows[0].of_peak), "%g", g.rows[0].of_peak); /* no peak measured */
    sbp_bench_model_close(&bm);
}
END_TEST

/* A model whose weights vanish after it was opened: every measurement fails, is reported with
 * why, and is counted; the run itself returns. */
START_TEST(a_failed_measurement_is_reported_and_counted) {
    sbp_err err = {0};
    const char *dir = tu_keep(tu_new_dir("benchlib-vanishing"));
    ck_assert_int_eq(tu_sh("cp '%s'/* '%s'/", tu_model("qwen3-tiny", 1), dir), 0);
    sbp_bench_model bm;
    ck_assert_msg(sbp_bench_model_open(&bm, dir, NULL, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(unlink(tu_join(dir, "model.safetensors")), 0);
    const int seqs[] = {16};
    const sbp_bench_schedule sc[] = {full, stream};
    sbp_bench_opts o = tiny_opts(&bm, seqs, sc, 2);
    const sbp_bench_rates rates = {.sgemm = 50, .portable = 50};
    got_t g = {0};
    const sbp_bench_sink sink = {.ctx = &g, .row = got_row, .note = got_note};
    int failures = 0;
    ck_assert_msg(sbp_bench_run(&o, &rates, &sink, &failures, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(g.n_rows, 0);
    ck_assert_int_eq(failures, 4); /* full, stream, and the two training steps */
    ck_assert(has_note(&g, SBP_BENCH_FAILURE, "T = 16, full: "));
    ck_assert(has_note(&g, SBP_BENCH_FAILURE, "model.safetensors"));
    ck_assert(has_note(&g, SBP_BENCH_FAILURE, "T = 16, training step (LoRA): "));
    sbp_bench_model_close(&bm);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("benchlib");
    TCase *tc = tcase_create("benchlib");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, the_fma_probe_counts_its_operations);
    tcase_add_test(tc, a_tiny_run_fills_its_rows);
    tcase_add_test(tc, a_bad_option_is_an_error);
    tcase_add_test(tc, largest_takes_its_T_from_the_search);
    tcase_add_test(tc, a_failed_measurement_is_reported_and_counted);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
