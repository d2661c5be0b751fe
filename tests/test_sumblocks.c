/* test_sumblocks.c — the portable numerics' sums over tokens in blocks of SUM_BLOCK tokens
 * (docs/numerics.md §4, src/engine/steps/sums.c), on sequences longer than a block: the first
 * block's tokens continue the stored chain, every later block is a chain from +0 added once it
 * is complete, and a call that ends inside a block carries its partial sum to the next call.
 *
 * The golden digests (tests/test_golden.c) have at most 24 tokens a sequence: one block, so they
 * say nothing about the blocks. Here, B = 2 sequences of T = 2·128 + 37 tokens (blocks [0, 128),
 * [128, 256) complete, [256, 293) complete at T; one row left-padded, prompt-masked labels):
 *  - every schedule, layer chunks and logits chunks that split blocks (1, 7, 100, 129, T − 1,
 *    T + 5) and block multiples, token blocks 4 and 16, 1 and 2 threads, gives the bits of
 *    full BP on one thread, in float32 and float64, on Qwen3 (q/k norms), Qwen2 (biases), Llama-3
 *    and Gemma-3 (local layers: the K/V path key block by key block, the input norm's K/V chain);
 *  - the same with a LoRA adapter (the adapters' gradients carry their blocks too);
 *  - the CUDA tables in the SIMT emulator give the CPU's bits (they run the same sums through
 *    the op table);
 *  - the planner's ledger equals the measured one (the pending partial sums are charged). */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

enum { T_LONG = 2 * 128 + 37 };

/* B = 2 rows of T tokens: row 0 full, row 1 left-padded by 20; the first 10 real tokens' labels
 * masked (a prompt). */
static void long_batch(sbp_batch *b, int T, int V) {
    tu_lcg_batch(b, T, V, 20, 10, 12345);
}

/* ps: the tensors the gradients hold (the model's, or an adapter's) */
/* Every schedule and chunking of model m (and adapter a, or NULL) against full BP on 1 thread;
 * all: also chunks 1, T − 1 and 128 (the others suffice to split every kind of block). */
static void check_runs(const sbp_model *m, const sbp_batch *b, sbp_lora *a, const char *name,
                       int all) {
    const int T = b->T, sizes[] = {T, 7, 100, 129, T - 1, T + 5, 128, 1};
    const int n = sizeof sizes / sizeof *sizes;
    const sbp_grad_opts base = {.schedule = SBP_FULL,
                                .block = 4,
                                .numerics = SBP_NUMERICS_PORTABLE,
                                .objective = {.kind = SBP_OBJ_SFT},
                                .lora = a};
    sbp_grad_result ref, r;
    sbp_set_threads(1);
    tu_grad_opts(&ref, m, b, base);
    for (int threads = 1; threads <= 2; threads++) {
        sbp_set_threads(threads);
        for (int i = 0; i < n; i++)
            for (int v = 0; v < 4; v++) { /* stream (layer chunk i, logits chunk i and 7 + i) */
                if (sizes[i] == 1 && v > 0) continue; /* chunk 1: once */
                if (!all && (sizes[i] == 1 || sizes[i] == T - 1 || sizes[i] == 128)) continue;
                if (threads == 2 && (v > 0 || sizes[i] != 100)) continue; /* 2 threads: once */
                sbp_grad_opts o = base;
                o.schedule = v <= 1 ? SBP_STREAM : v == 2 ? SBP_CKPT : SBP_FULL;
                o.chunk = v == 0 ? sizes[i] : v == 1 ? sizes[(i + 3) % n] : 0;
                o.logit_chunk = v == 0 ? sizes[(i + 1) % n] : sizes[i];
                o.chunked_logits = v >= 2;
                o.block = i % 2 ? 16 : 4; /* the token block changes nothing */
                tu_grad_opts(&r, m, b, o);
                char what[200];
                snprintf(what, sizeof what,
                         "%s %s, %s chunk %d logit chunk %d (block %d, %d threads)", name,
                         m->prec == SBP_FP64 ? "fp64" : "fp32", sbp_schedule_name(o.schedule),
                         o.chunk, o.logit_chunk, o.block, threads);
                tu_assert_same_grads(m, a ? &a->params : NULL, &ref, &r, what);
                sbp_grad_result_free(&r, NULL);
            }
    }
    sbp_set_threads(1);
    sbp_grad_result_free(&ref, NULL);
}

static const char *families[] = {"qwen3-tiny", "qwen2-tiny", "llama3-tiny", "gemma3-tiny"};

/* _i: family (_i / 2), precision (_i % 2) */
START_TEST(schedules_bitwise) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, NULL, tu_model(families[_i / 2], 7), NULL, _i % 2 ? SBP_FP64 : SBP_FP32);
    long_batch(&b, T_LONG, m.cfg.vocab);
    check_runs(&m, &b, NULL, families[_i / 2], _i % 2 == 0);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

START_TEST(lora_bitwise) {
    sbp_model m;
    sbp_batch b;
    sbp_lora a;
    sbp_err err = {0};
    tu_load(&m, NULL, tu_model("qwen3-tiny", 7), NULL, SBP_FP32);
    const sbp_lora_config c = {.r = 4, .alpha = 8, .targets = SBP_LORA_ALL};
    if (sbp_lora_init(&a, &m.cfg, &c, 3, 0.05, SBP_FP32, &err)) ck_abort_msg("%s", err.msg);
    long_batch(&b, T_LONG, m.cfg.vocab);
    check_runs(&m, &b, &a, "qwen3-tiny + LoRA", 0);
    sbp_lora_free(&a, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* The CUDA tables in the emulator: stream with chunks that split blocks, the CPU's full-BP bits.
 * _i: family (qwen3-tiny, qwen2-tiny). */
START_TEST(emulator_matches_cpu) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, NULL, tu_model(families[_i], 7), NULL, SBP_FP32);
    long_batch(&b, T_LONG, m.cfg.vocab);
    const sbp_grad_opts cpu = {.schedule = SBP_FULL,
                               .block = 4,
                               .numerics = SBP_NUMERICS_PORTABLE,
                               .objective = {.kind = SBP_OBJ_SFT}};
    sbp_grad_result ref, r;
    tu_grad_opts(&ref, &m, &b, cpu);
    sbp_grad_opts emu = cpu;
    emu.device = SBP_DEVICE_CUDA_EMU, emu.schedule = SBP_STREAM, emu.chunk = 100;
    emu.logit_chunk = 129;
    tu_grad_opts(&r, &m, &b, emu);
    tu_assert_same_grads(&m, NULL, &ref, &r, "cuda-emu stream chunk 100, logit chunk 129");
    sbp_grad_result_free(&r, NULL);
    sbp_grad_result_free(&ref, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* sbp_plan's ledger against the measured one, with the pending partial sums allocated (T > 128,
 * chunks that split blocks), and none in the fast numerics. _i: 0 portable, 1 portable + LoRA,
 * 2 fast. */
START_TEST(plan_equals_measured) {
    sbp_model m;
    sbp_batch b;
    sbp_lora a = {0};
    sbp_ledger real = {0}, plan;
    sbp_err err = {0};
    if (sbp_model_load(&m, tu_model("qwen2-tiny", 7), SBP_FP32, &real, &err))
        ck_abort_msg("%s", err.msg);
    const sbp_lora_config c = {.r = 4, .alpha = 8, .targets = SBP_LORA_ALL};
    if (_i == 1) { /* through a file, so that the adapter is charged as the planner charges it */
        sbp_lora a0;
        const char *dir = tu_path("sumblocks-adapter");
        if (sbp_lora_init(&a0, &m.cfg, &c, 3, 0.05, SBP_FP32, &err) ||
            sbp_lora_save(dir, &a0, "qwen2-tiny", &err) ||
            sbp_lora_load(&a, dir, &m.cfg, SBP_FP32, &real, &err))
            ck_abort_msg("%s", err.msg);
        sbp_lora_free(&a0, NULL);
    }
    long_batch(&b, T_LONG, m.cfg.vocab);
    const sbp_grad_opts o = {.schedule = SBP_STREAM,
                             .block = 4,
                             .chunk = 100,
                             .logit_chunk = 129,
                             .numerics = _i == 2 ? SBP_NUMERICS_FAST : SBP_NUMERICS_PORTABLE,
                             .objective = {.kind = SBP_OBJ_SFT},
                             .lora = _i == 1 ? &a : NULL};
    sbp_grad_result r;
    if (sbp_grad(&r, &m, &b, &o, &real, &err)) ck_abort_msg("%s", err.msg);
    sbp_grad_result_free(&r, &real);
    sbp_plan_opts po = {.grad = o, .B = b.B, .T = b.T, .storage_bytes = 4};
    po.grad.lora = NULL;
    if (_i == 1) po.lora = c;
    if (sbp_plan(&plan, &m.cfg, &po, &err)) ck_abort_msg("plan: %s", err.msg);
    char what[32];
    snprintf(what, sizeof what, "case %d", _i);
    tu_assert_same_ledger(&plan, &real, what);
    sbp_batch_free(&b);
    sbp_lora_free(&a, &real);
    sbp_model_free(&m, &real);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("sumblocks");
    TCase *tc = tcase_create("sumblocks");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, schedules_bitwise, 0, 8);
    tcase_add_test(tc, lora_bitwise);
    tcase_add_loop_test(tc, emulator_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, plan_equals_measured, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
