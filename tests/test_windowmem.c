/* test_windowmem.c — a Gemma-3 local layer's K/V side in StreamBP is bounded by the window
 * (issue 34: "a local layer's peak does not grow with T beyond the window").
 *
 * The stream schedule holds a local layer's K, V, the keys before k_norm, their rstd, dK, dV and
 * dK before k_norm for keys [lo, e) only (engine.h, kv_window_*): lo the start of the token
 * block (and key tile) holding s − W + 1 for the chunk [s, e), at most c + W + grain − 2 rows.
 * Checked here:
 *   - the planner's layer working set of an all-local model (sliding_window_pattern past the
 *     layer count) against the same model all global (pattern 1): the global one's K/V rows are
 *     T, so the difference is (T − R)·(6·KV + NKV) reals with R the local bound, the same R at
 *     T = 4W and T = 16W (with the old, T-row sizing the difference is 0);
 *   - a measured step's peak equals the planner's for the windowed side (plan = measured);
 *   - the bits: full, ckpt and stream (chunks smaller and larger than the window, ragged ones,
 *     both numerics) give the same gradient bit for bit at T long enough for keys to retire and
 *     the buffers to slide (T > W + 64), all-local and mixed, with right padding; and a
 *     left-padded batch under --unattended hf-eager (rows that attend to all T keys: the
 *     full-T path) likewise;
 *   - the CUDA kernels in the SIMT emulator: the same bits as full BP on the CPU. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { W = 64, CHUNK = 64, BLOCK = 64 };

/* data/models/gemma3-tiny.json with window W and the given pattern (1: every layer global; 1000:
 * every layer local; 3: mixed) */
static sbp_config config_of(int pattern) {
    sbp_config c;
    sbp_err err = {0};
    ck_assert_msg(!sbp_config_load(&c, "data/models/gemma3-tiny.json", &err), "%s", err.msg);
    c.sliding_window = W, c.sliding_window_pattern = pattern;
    return c;
}

/* the planner's peak of the layer working set of a stream step, B = 1 */
static int64_t layer_peak(int pattern, int T) {
    const sbp_config c = config_of(pattern);
    sbp_plan_opts po = {
        .grad = {.schedule = SBP_STREAM, .block = BLOCK, .chunk = CHUNK, .logit_chunk = 16},
        .B = 1,
        .T = T,
        .storage_bytes = 4};
    sbp_ledger lg;
    sbp_err err = {0};
    ck_assert_msg(!sbp_plan(&lg, &c, &po, &err), "plan: %s", err.msg);
    return lg.peak[SBP_MEM_LAYER];
}

/* A local layer's K/V bytes: the same at T = 4W and T = 16W, while the global layer's grow with
 * T. The planner's layer peak differs between the all-global and the all-local model by the K/V
 * rows the local one does not hold, (T − R) rows of 6·KV + NKV reals, R the same at both T. */
START_TEST(kv_bytes_bounded) {
    const sbp_config c = config_of(1);
    const int64_t row = (int64_t)(6 * c.kv_heads * c.head_dim + c.kv_heads) * 4;
    const int R = CHUNK + W + BLOCK - 2; /* c + W + grain − 2, grain = lcm(block, key tile) */
    int64_t held[2];
    const int Ts[2] = {4 * W, 16 * W};
    for (int i = 0; i < 2; i++) {
        const int T = Ts[i];
        const int64_t diff = layer_peak(1, T) - layer_peak(1000, T);
        ck_assert_msg(diff % row == 0,
                      "T = %d: the all-global step holds %lld bytes more, not a "
                      "whole number of K/V rows (%lld bytes)",
                      T, (long long)diff, (long long)row);
        held[i] = T - diff / row; /* the local layer's K/V rows */
        ck_assert_msg(held[i] == R, "T = %d: a local layer holds %lld K/V rows, want %d", T,
                      (long long)held[i], R);
    }
    ck_assert_int_eq(held[0], held[1]);
    /* and the all-global model's layer peak grows by at least its K/V rows */
    ck_assert_int_ge(layer_peak(1, 16 * W) - layer_peak(1, 4 * W), (int64_t)12 * W * row);
}
END_TEST

/* A model of config c (seeded), loaded in prec. */
static void model_of(sbp_model *m, int pattern, sbp_precision prec, sbp_ledger *lg) {
    const sbp_config c = config_of(pattern);
    const char *dir = tu_path("windowmem-%d", pattern);
    sbp_err err = {0};
    if (!tu_exists(dir)) ck_assert_msg(!sbp_model_init(&c, 3, dir, &err), "init: %s", err.msg);
    ck_assert_msg(!sbp_model_load(m, dir, prec, lg, &err), "load: %s", err.msg);
}

/* B = 2 rows of T tokens: row 0 real (left-padded by `left`), row 1 right-padded by 9 */
static void batch_of(sbp_batch *b, int T, int left, int V) {
    memset(b, 0, sizeof *b);
    b->B = 2, b->T = T;
    const size_t n = (size_t)2 * T;
    b->ids = calloc(n, sizeof *b->ids);
    b->labels = calloc(n, sizeof *b->labels);
    b->mask = calloc(n, 1);
    ck_assert(b->ids && b->labels && b->mask);
    uint64_t z = 777;
    for (size_t i = 0; i < n; i++) {
        z = z * 6364136223846793005ULL + 1442695040888963407ULL;
        const int r = (int)(i / (size_t)T), t = (int)(i % (size_t)T);
        const int real = r == 0 ? t >= left : t < T - 9;
        b->ids[i] = real ? (int32_t)(1 + (z >> 33) % (uint64_t)(V - 1)) : 0;
        b->mask[i] = (uint8_t)real;
        b->labels[i] = real && t >= left + 1 ? b->ids[i] : SBP_IGNORE;
    }
    sbp_batch_count_targets(b);
}

/* The planner's peak equals a measured stream step's on the all-local model (the windowed K/V
 * buffers are charged through the same code). */
START_TEST(plan_equals_measured) {
    sbp_set_threads(2); /* per-thread workspaces, whatever OMP_NUM_THREADS says */
    sbp_ledger real = {0}, plan;
    sbp_model m;
    sbp_batch b;
    sbp_err err = {0};
    model_of(&m, 1000, SBP_FP32, &real);
    batch_of(&b, 4 * W, 0, m.cfg.vocab);
    sbp_grad_opts o = {.schedule = SBP_STREAM, .block = BLOCK, .chunk = CHUNK, .logit_chunk = 16};
    sbp_grad_result r;
    ck_assert_msg(!sbp_grad(&r, &m, &b, &o, &real, &err), "%s", err.msg);
    sbp_plan_opts po = {.grad = o, .B = b.B, .T = b.T, .storage_bytes = 4};
    ck_assert_msg(!sbp_plan(&plan, &m.cfg, &po, &err), "plan: %s", err.msg);
    ck_assert_msg(plan.peak_total == real.peak_total, "planned peak %lld, measured %lld",
                  (long long)plan.peak_total, (long long)real.peak_total);
    ck_assert_int_eq(plan.peak[SBP_MEM_LAYER], real.peak[SBP_MEM_LAYER]);
    ck_assert_int_eq(plan.n_allocs, real.n_allocs);
    sbp_grad_result_free(&r, &real);
    sbp_batch_free(&b);
    sbp_model_free(&m, &real);
}
END_TEST

static void grad_of(sbp_grad_result *r, const sbp_model *m, const sbp_batch *b, sbp_numerics nu,
                    sbp_schedule s, int chunk, sbp_unattended un) {
    sbp_grad_opts o = {.schedule = s,
                       .block = BLOCK,
                       .chunk = chunk,
                       .logit_chunk = BLOCK, /* the fast head's products per token block */
                       .numerics = nu,
                       .unattended = un};
    sbp_err err = {0};
    ck_assert_msg(!sbp_grad(r, m, b, &o, NULL, &err), "sbp_grad (%s, chunk %d): %s",
                  sbp_schedule_name(s), chunk, err.msg);
}

/* Full BP against ckpt and stream, bit for bit. _i: pattern (all-local, mixed) × numerics ×
 * padding (right; left under hf-eager). Portable: any chunk; fast: block multiples. */
START_TEST(schedules_agree) {
    const int pattern = _i % 2 ? 3 : 1000;
    const sbp_numerics nu = (_i / 2) % 2 ? SBP_NUMERICS_FAST : SBP_NUMERICS_PORTABLE;
    const int left = _i / 4 ? 70 : 0; /* row 0's first 70 rows see no key */
    const sbp_unattended un = left ? SBP_UNATTENDED_HF_EAGER : SBP_UNATTENDED_ZERO;
    const int T = 5 * W + 13;
    sbp_model m;
    sbp_batch b;
    model_of(&m, pattern, SBP_FP32, NULL);
    batch_of(&b, T, left, m.cfg.vocab);
    sbp_grad_result full, other;
    grad_of(&full, &m, &b, nu, SBP_FULL, 0, un);
    const int portable_chunks[] = {7, 40, 64, 100, T}, fast_chunks[] = {64, 128, 192};
    const int *chunks = nu == SBP_NUMERICS_FAST ? fast_chunks : portable_chunks;
    const int n = nu == SBP_NUMERICS_FAST ? 3 : 5;
    for (int k = -1; k < n; k++) {
        const sbp_schedule s = k < 0 ? SBP_CKPT : SBP_STREAM;
        grad_of(&other, &m, &b, nu, s, k < 0 ? 0 : chunks[k], un);
        const int d = tu_first_diff(&m, full.grads, other.grads);
        ck_assert_msg(d < 0 && full.loss == other.loss,
                      "pattern %d, %s, left %d: %s chunk %d differs from full BP at %s", pattern,
                      sbp_numerics_name(nu), left, sbp_schedule_name(s), k < 0 ? T : chunks[k],
                      d < 0 ? "the loss" : m.params.p[d].name);
        sbp_grad_result_free(&other, NULL);
    }
    sbp_grad_result_free(&full, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* The CUDA kernels in the SIMT emulator run the same steps (cuda/ops.cu): the windowed K/V side
 * (keys retired, buffers slid, the attention on the shifted keys) gives the portable CPU's bits,
 * and those of full BP. */
START_TEST(cuda_emu_agrees) {
    if (!sbp_device_built(SBP_DEVICE_CUDA_EMU)) return;
    const int T = 2 * W + 13;
    sbp_model m;
    sbp_batch b;
    model_of(&m, 1000, _i ? SBP_FP64 : SBP_FP32, NULL);
    batch_of(&b, T, 0, m.cfg.vocab);
    sbp_grad_result full, emu;
    grad_of(&full, &m, &b, SBP_NUMERICS_PORTABLE, SBP_FULL, 0, SBP_UNATTENDED_ZERO);
    sbp_grad_opts o = {.schedule = SBP_STREAM,
                       .block = BLOCK,
                       .chunk = 16,
                       .logit_chunk = BLOCK,
                       .numerics = SBP_NUMERICS_PORTABLE,
                       .device = SBP_DEVICE_CUDA_EMU};
    sbp_err err = {0};
    ck_assert_msg(!sbp_grad(&emu, &m, &b, &o, NULL, &err), "cuda-emu: %s", err.msg);
    const int d = tu_first_diff(&m, full.grads, emu.grads);
    ck_assert_msg(d < 0 && full.loss == emu.loss, "%s: cuda-emu stream differs from full BP at %s",
                  _i ? "fp64" : "fp32", d < 0 ? "the loss" : m.params.p[d].name);
    sbp_grad_result_free(&full, NULL), sbp_grad_result_free(&emu, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

int main(void) {
    Suite *s = suite_create("windowmem");
    TCase *tc = tcase_create("windowmem");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, kv_bytes_bounded);
    tcase_add_test(tc, plan_equals_measured);
    tcase_add_loop_test(tc, schedules_agree, 0, 8);
    tcase_add_loop_test(tc, cuda_emu_agrees, 0, 2);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
