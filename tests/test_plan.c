/* test_plan.c — the planner walks the real schedule code: its ledger must equal, byte for byte,
 * the ledger of a real float32 run of the same model, batch shape and options. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SBP_TEST_HAS_ASAN 1
#endif
#endif
#ifndef SBP_TEST_HAS_ASAN
#define SBP_TEST_HAS_ASAN 0
#endif

/* Under the sanitizers (CI's 20 minutes) the emulated device's cases below run a third of their
 * _i (4 s each there): each family, schedule and objective, and the adapter, still once; the
 * plain build runs them all. */
static int skipped_under_asan(int i, int k0, int k1, int k2) {
#if defined(__SANITIZE_ADDRESS__) || SBP_TEST_HAS_ASAN
    return i >= 18 && i != k0 && i != k1 && i != k2;
#else
    (void)i, (void)k0, (void)k1, (void)k2;
    return 0;
#endif
}

/* _i: family (_i % 3), schedule (_i / 3 % 3), numerics (_i / 9 % 2): every row of the driver's
 * table, in both numerics (their workspaces differ); _i >= 18: the CUDA kernels in the SIMT
 * emulator (portable numerics), whose device ledger the plan for that device must equal (its
 * workspace is the device table's, not the CPU's). */
START_TEST(plan_equals_measured) {
    static const char *families[] = {"qwen3-tiny", "qwen2-tiny", "llama3-tiny"};
    const char *family = families[_i % 3];
    sbp_schedule s = (sbp_schedule)(_i / 3 % 3);
    const sbp_device dev = _i >= 18 ? SBP_DEVICE_CUDA_EMU : SBP_DEVICE_CPU;
    sbp_numerics num = dev != SBP_DEVICE_CPU ? SBP_NUMERICS_PORTABLE : (sbp_numerics)(_i / 9 % 2);
    if (!sbp_device_built(dev) || skipped_under_asan(_i, 18, 22, 26)) return; /* (f, s) 00 11 22 */
    /* one thread and two, whatever OMP_NUM_THREADS says (tests/run.sh sets 1): the products' and
     * the attention's workspaces are per thread */
    sbp_set_threads(1 + _i % 2);
    for (int chunked = 0; chunked <= (s == SBP_STREAM ? 0 : 1); chunked++) {
        sbp_ledger real = {0}, plan;
        /* on a device the ledger records the device's memory only (as streambp bench's) */
        sbp_ledger *host = dev == SBP_DEVICE_CPU ? &real : NULL;
        sbp_model m;
        sbp_batch b;
        sbp_err err = {0};
        if (sbp_model_load(&m, tu_model(family, 1), SBP_FP32, host, &err))
            ck_abort_msg("%s", err.msg);
        if (sbp_batch_load(&b, "data/batches/sft-demo.safetensors", &m.cfg, &err))
            ck_abort_msg("%s", err.msg);
        sbp_grad_opts o = {.schedule = s,
                           .block = 16,
                           .chunk = 32,
                           .logit_chunk = 16,
                           .chunked_logits = chunked,
                           .numerics = num,
                           .device = dev};
        sbp_grad_result r;
        if (sbp_grad(&r, &m, &b, &o, &real, &err)) ck_abort_msg("%s", err.msg);
        sbp_plan_opts po = {.grad = o, .B = b.B, .T = b.T, .storage_bytes = 4};
        if (sbp_plan(&plan, &m.cfg, &po, &err)) ck_abort_msg("plan: %s", err.msg);
        char what[96];
        snprintf(what, sizeof what, "%s %s%s, %s numerics, %s", family, sbp_schedule_name(s),
                 chunked ? " chunked logits" : "", sbp_numerics_name(num), sbp_device_name(dev));
        /* the real ledger still holds weights and grads; the planner has freed everything */
        ck_assert_int_eq(plan.cur_total, 0);
        tu_assert_same_ledger(&plan, &real, what);
        sbp_grad_result_free(&r, &real);
        sbp_batch_free(&b);
        sbp_model_free(&m, host);
        ck_assert_int_eq(real.cur_total, 0);
    }
}
END_TEST

/* The same for LoRA adapters, DPO and GRPO, and a whole training step: _i: family (_i % 3),
 * objective (_i / 3 % 3), full weights or an adapter (_i / 9 % 2). Every schedule and chunked
 * logits; the training step (AdamW's moments, the gradient freed inside the step) on odd _i,
 * portable numerics on _i >= 9. _i >= 18: the gradient (no training step: AdamW runs on the host)
 * on the emulated CUDA device, whose ledger holds the device's memory only, an adapter on odd _i.
 * The measured side is the library as a user runs it: the model and the adapter loaded from
 * directories, the batch from its file, sbp_grad or sbp_train_step. */
START_TEST(plan_equals_measured_objectives_lora) {
    static const char *families[] = {"qwen3-tiny", "qwen2-tiny", "llama3-tiny"};
    static const char *batches[] = {"data/batches/sft-demo.safetensors",
                                    "data/batches/dpo-tiny.safetensors",
                                    "data/batches/grpo-tiny.safetensors"};
    static const char *targets[] = {"all-linear", "q_proj,v_proj", "k_proj,o_proj,down_proj"};
    const char *family = families[_i % 3];
    const sbp_objective_kind kind = (sbp_objective_kind)(_i / 3 % 3);
    const sbp_device dev = _i >= 18 ? SBP_DEVICE_CUDA_EMU : SBP_DEVICE_CPU;
    const int lora = dev != SBP_DEVICE_CPU ? _i % 2 : _i / 9 % 2;
    const int train = dev == SBP_DEVICE_CPU && _i % 2;
    const sbp_numerics num = _i >= 9 ? SBP_NUMERICS_PORTABLE : SBP_NUMERICS_FAST;
    /* under the sanitizers one device case, llama3 DPO with an adapter: on one idle core each of
     * these took 85-140 s there (2026-12-06), the three of them 5 of test_plan's 7.8 minutes */
    if (!sbp_device_built(dev) || skipped_under_asan(_i, 23, -1, -1)) return;
    sbp_set_threads(2); /* per-thread workspaces, whatever OMP_NUM_THREADS says */
    const char *adir = tu_path("plan-adapter-%d", _i);
    if (lora)
        ck_assert_msg(tu_sh("%s lora init --model %s --out %s --r %d --alpha 8 --targets %s",
                            tu_bin(), tu_model(family, 1), adir, 2 + _i % 5, targets[_i % 3]) == 0,
                      "%s", tu_last_output());
    sbp_objective obj = {.kind = kind,
                         .beta = kind == SBP_OBJ_DPO ? 0.1 : 0.04,
                         .epsilon_low = 0.2,
                         .epsilon_high = 0.2};
    for (int k = 0; k < 4; k++) {
        const sbp_schedule s = (sbp_schedule)(k < 3 ? k : SBP_CKPT);
        sbp_ledger real = {0}, plan;
        sbp_model m;
        sbp_batch b;
        sbp_lora a = {0};
        sbp_err err = {0};
        sbp_ledger *host = dev == SBP_DEVICE_CPU ? &real : NULL; /* a device's: its memory only */
        if (sbp_model_load(&m, tu_model(family, 1), SBP_FP32, host, &err))
            ck_abort_msg("%s", err.msg);
        if (lora && sbp_lora_load(&a, adir, &m.cfg, SBP_FP32, host, &err))
            ck_abort_msg("%s", err.msg);
        if (sbp_batch_load_as(&b, batches[kind], &m.cfg, kind, 1, &err))
            ck_abort_msg("%s", err.msg);
        sbp_grad_opts o = {.schedule = s,
                           .block = 8,
                           .chunk = 16,
                           .logit_chunk = 8,
                           .chunked_logits = k == 3,
                           .numerics = num,
                           .objective = obj,
                           .lora = lora ? &a : NULL,
                           .device = dev};
        sbp_adamw opt = {0};
        const sbp_adamw_opts ao = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
        if (train) {
            if (sbp_adamw_init(&opt, &ao, SBP_FP32, lora ? a.params.total : m.params.total, &real,
                               &err))
                ck_abort_msg("%s", err.msg);
            sbp_step_result sr;
            if (sbp_train_step(&sr, &m, lora ? &a : NULL, &opt, &b, 1, &o, 1e-3, 1.0, &real, &err))
                ck_abort_msg("train step: %s", err.msg);
        } else {
            sbp_grad_result r;
            if (sbp_grad(&r, &m, &b, &o, &real, &err)) ck_abort_msg("%s", err.msg);
            sbp_grad_result_free(&r, &real);
        }
        /* the planner's batch: SFT rows, DPO pairs, GRPO the group's rows */
        sbp_plan_opts po = {.grad = o,
                            .B = kind == SBP_OBJ_DPO ? b.pairs : b.B,
                            .T = b.T,
                            .storage_bytes = 4,
                            .optimizer = train};
        po.grad.lora = NULL; /* the planner takes the adapter's configuration, not its tensors */
        if (lora) po.lora = (sbp_lora_config){.r = a.cfg.r, .targets = a.cfg.targets};
        if (sbp_plan(&plan, &m.cfg, &po, &err)) ck_abort_msg("plan: %s", err.msg);
        char what[160];
        snprintf(what, sizeof what, "%s %s %s%s%s%s, %s numerics, %s", family,
                 kind == SBP_OBJ_SFT   ? "sft"
                 : kind == SBP_OBJ_DPO ? "dpo"
                                       : "grpo",
                 sbp_schedule_name(s), k == 3 ? " chunked logits" : "", lora ? ", LoRA" : "",
                 train ? ", training step" : "", sbp_numerics_name(num), sbp_device_name(dev));
        ck_assert_int_eq(plan.cur_total, 0);
        /* the batch's host arrays are in a CPU plan only */
        ck_assert(dev == SBP_DEVICE_CPU ? plan.peak[SBP_MEM_BATCH] > 0
                                        : plan.peak[SBP_MEM_BATCH] == 0);
        /* a frozen base has no gradient: only the adapter's */
        if (lora) ck_assert_int_eq(plan.peak[SBP_MEM_GRADS], 4 * a.params.total);
        tu_assert_same_ledger(&plan, &real, what);
        sbp_adamw_free(&opt, &real);
        sbp_batch_free(&b);
        sbp_lora_free(&a, host);
        sbp_model_free(&m, host);
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

/* A plan for a device equals that device's ledger, and no training step runs on a device: a plan
 * for one with the optimizer's moments is refused, naming the device; the same plan for the CPU,
 * and the device's plan of the gradient step, are made. */
START_TEST(plan_device_without_optimizer) {
    sbp_config c;
    sbp_err err = {0};
    if (sbp_config_load(&c, "data/models/llama3-tiny.json", &err)) ck_abort_msg("%s", err.msg);
    sbp_ledger lg;
    sbp_plan_opts o = {.grad = {.schedule = SBP_STREAM,
                                .block = 16,
                                .chunk = 32,
                                .logit_chunk = 16,
                                .device = SBP_DEVICE_CUDA_EMU,
                                .numerics = SBP_NUMERICS_PORTABLE},
                       .B = 1,
                       .T = 64,
                       .storage_bytes = 4,
                       .optimizer = 1};
    ck_assert_int_eq(sbp_plan(&lg, &c, &o, &err), SBP_EUSAGE);
    ck_assert_msg(strstr(err.msg, "cuda-emu") && strstr(err.msg, "optimizer"), "%s", err.msg);
    o.grad.device = SBP_DEVICE_CPU;
    if (sbp_plan(&lg, &c, &o, &err)) ck_abort_msg("%s", err.msg);
    ck_assert_int_gt(lg.peak[SBP_MEM_OPTIMIZER], 0);
    if (!sbp_device_built(SBP_DEVICE_CUDA_EMU)) return;
    o.grad.device = SBP_DEVICE_CUDA_EMU, o.optimizer = 0;
    if (sbp_plan(&lg, &c, &o, &err)) ck_abort_msg("%s", err.msg);
    ck_assert_int_eq(lg.peak[SBP_MEM_OPTIMIZER], 0);
}
END_TEST

/* What full BP keeps, to the byte: the L + 1 hidden states, and per layer K and V, the queries,
 * the attention output and its row log-sum-exp, the attention residual x2, the gate and up
 * projections (Qwen3: also q and k before their norms and those norms' rstd). Not the outputs of
 * the two RMSNorms nor silu(g)·u: those are formed again in the backward (engine.h,
 * chunk_formed); keeping any of them again fails here. */
START_TEST(full_keeps_no_formed_rows) {
    static const char *models[] = {"data/models/bench.json", "data/models/qwen3-tiny.json"};
    sbp_config c;
    sbp_err err = {0};
    if (sbp_config_load(&c, models[_i], &err)) ck_abort_msg("%s", err.msg);
    const int64_t B = 2, T = 96, eb = 4, L = c.layers, C = c.hidden, F = c.ffn;
    const int64_t Q = (int64_t)c.heads * c.head_dim, KV = (int64_t)c.kv_heads * c.head_dim;
    sbp_plan_opts o = {.grad = {.schedule = SBP_FULL, .block = 32, .logit_chunk = 32},
                       .B = (int)B,
                       .T = (int)T,
                       .storage_bytes = (int)eb};
    sbp_ledger lg;
    if (sbp_plan(&lg, &c, &o, &err)) ck_abort_msg("%s", err.msg);
    int64_t per_layer = 2 * KV + 2 * Q + c.heads + C + 2 * F;
    if (c.qk_norm) per_layer += KV + c.kv_heads + Q + c.heads;
    const int64_t kept = B * T * eb * ((L + 1) * C + L * per_layer);
    ck_assert_msg(lg.peak[SBP_MEM_ACTIVATIONS] == kept, "%s: full keeps %lld bytes, expected %lld",
                  models[_i], (long long)lg.peak[SBP_MEM_ACTIVATIONS], (long long)kept);
}
END_TEST

/* At the total peak the categories add up to the total; no category's own peak is below its
 * share at the total peak; the whole ledger is returned by the end of the step. */
START_TEST(categories_sum_to_total) {
    static const char *families[] = {"qwen3-tiny", "qwen2-tiny", "llama3-tiny"};
    sbp_config c;
    sbp_err err = {0};
    char path[256];
    snprintf(path, sizeof path, "data/models/%s.json", families[_i % 3]);
    if (sbp_config_load(&c, path, &err)) ck_abort_msg("%s", err.msg);
    for (int k = 0; k < 4; k++) {
        sbp_plan_opts o = {.grad = {.schedule = (sbp_schedule)(k < 3 ? k : SBP_CKPT),
                                    .chunked_logits = k == 3,
                                    .block = 16,
                                    .chunk = 32,
                                    .logit_chunk = 16},
                           .B = 1 + _i / 3,
                           .T = 40 + 17 * _i,
                           .storage_bytes = _i % 2 ? 2 : 4,
                           .optimizer = _i % 2};
        sbp_ledger lg;
        if (sbp_plan(&lg, &c, &o, &err)) ck_abort_msg("%s", err.msg);
        int64_t sum = 0;
        for (int cat = 0; cat < SBP_MEM_NCATS; cat++) {
            sum += lg.at_peak[cat];
            ck_assert_int_le(lg.at_peak[cat], lg.peak[cat]);
            ck_assert_int_le(lg.peak[cat], lg.peak_total);
            ck_assert_int_eq(lg.cur[cat], 0);
        }
        ck_assert_int_eq(sum, lg.peak_total);
        ck_assert_int_eq(lg.cur_total, 0);
        ck_assert_int_gt(lg.at_peak[SBP_MEM_WEIGHTS], 0);
        ck_assert_int_eq(lg.at_peak[SBP_MEM_WEIGHTS], lg.at_peak[SBP_MEM_GRADS]);
        ck_assert_int_eq(lg.at_peak[SBP_MEM_OPTIMIZER] > 0, o.optimizer);
    }
}
END_TEST

static int64_t json_int(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    ck_assert_msg(cJSON_IsNumber(v), "no number \"%s\" in plan --json", key);
    return (int64_t)v->valuedouble;
}

/* `plan --budget` bisects to the boundary: the T it names fits the budget and T + 1 does not,
 * for every schedule; the bytes it reports are the plan at that T, and add up. A budget no
 * schedule's first token fits (340M is below the 340 MiB of weights and gradients of the bench
 * model) exits 2 naming what it cannot hold, instead of a table of T = 0. */
START_TEST(budget_finds_the_boundary) {
    static const char *budgets[] = {"340M", "600M", "768M"};
    const char *cfg_path = "data/models/bench.json";
    int rc = tu_sh("%s plan --config %s --budget %s --json", tu_bin(), cfg_path, budgets[_i]);
    if (_i == 0) {
        ck_assert_msg(rc == 2 && strstr(tu_last_output(), "the shortest step (T = 1) needs") &&
                          strstr(tu_last_output(), "no sequence fits"),
                      "%s", tu_last_output());
        return;
    }
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    cJSON *root = cJSON_Parse(tu_last_output());
    ck_assert_msg(root, "plan --json did not print JSON: %s", tu_last_output());
    int64_t budget = json_int(root, "budget_bytes");
    sbp_config c;
    sbp_err err = {0};
    if (sbp_config_load(&c, cfg_path, &err)) ck_abort_msg("%s", err.msg);
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(root, "schedules"), *row;
    ck_assert_int_eq(cJSON_GetArraySize(rows), 4);
    cJSON_ArrayForEach(row, rows) {
        const char *name = cJSON_GetObjectItemCaseSensitive(row, "schedule")->valuestring;
        int T = (int)json_int(row, "T");
        const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(row, "bytes_at_peak");
        sbp_plan_opts o = {.grad = {.block = SBP_DEFAULT_BLOCK,
                                    .chunk = SBP_DEFAULT_CHUNK(SBP_DEFAULT_BLOCK),
                                    .logit_chunk = SBP_DEFAULT_BLOCK},
                           .B = 1,
                           .storage_bytes = 4};
        if (!strcmp(name, "full"))
            o.grad.schedule = SBP_FULL;
        else if (!strcmp(name, "ckpt"))
            o.grad.schedule = SBP_CKPT;
        else if (!strcmp(name, "ckpt-chunked"))
            o.grad.schedule = SBP_CKPT, o.grad.chunked_logits = 1;
        else if (!strcmp(name, "stream"))
            o.grad.schedule = SBP_STREAM;
        else
            ck_abort_msg("unknown schedule %s", name);
        sbp_ledger at = {0}, above;
        o.T = T;
        if (T > 0 && sbp_plan(&at, &c, &o, &err)) ck_abort_msg("%s", err.msg);
        o.T = T + 1;
        if (sbp_plan(&above, &c, &o, &err)) ck_abort_msg("%s", err.msg);
        ck_assert_msg(at.peak_total <= budget, "%s: T = %d plans %lld > budget %lld", name, T,
                      (long long)at.peak_total, (long long)budget);
        ck_assert_msg(above.peak_total > budget, "%s: T + 1 = %d still fits (%lld <= %lld)", name,
                      T + 1, (long long)above.peak_total, (long long)budget);
        int64_t sum = 0;
        for (int cat = 0; cat < SBP_MEM_NCATS; cat++) {
            int64_t b = json_int(bytes, sbp_mem_cat_name(cat));
            ck_assert_int_eq(b, at.at_peak[cat]);
            sum += b;
        }
        ck_assert_int_eq(sum, json_int(bytes, "total"));
        ck_assert_int_eq(sum, at.peak_total);
    }
    cJSON_Delete(root);
}
END_TEST

/* `plan --paper --json`: every cell of the paper's Table 3 (6 columns x SFT, DPO, GRPO x no
 * ckpt, ckpt, StreamBP) is there, beside the paper's number where it has one, each ours a
 * largest T that the planner confirms (T fits 80 GiB and T + 1 does not) for one cell per
 * column, and the schedules are ordered as they must be: full <= ckpt <= stream. */
START_TEST(paper_table3_complete) {
    static const char *cols[6] = {"4B Full", "4B LoRA",  "8B Full",
                                  "8B LoRA", "14B LoRA", "32B LoRA"};
    static const char *objs[3] = {"sft", "dpo", "grpo"},
                      *methods[3] = {"no ckpt", "ckpt", "StreamBP"};
    /* the paper's Table 3, arXiv 2506.03077 (0: no entry) */
    static const double paper[3][3][6] = {
        {{7.0, 7.1, 3.4, 5.1, 2.9, 0.4},
         {28.5, 36.5, 15.7, 30.6, 23.0, 5.9},
         {200.0, 247.0, 72.0, 142.4, 84.6, 16.3}},
        {{3.1, 3.5, 0, 2.5, 1.4, 0.2},
         {18.7, 32.2, 0, 25.5, 18.5, 4.4},
         {57.2, 100.2, 0, 60.9, 36.9, 7.8}},
        {{0.9, 1.0, 0, 0.7, 0.4, 0}, {8.5, 12.1, 0, 9.5, 6.9, 0}, {18.2, 27.5, 0, 16.5, 10.1, 0}}};
    static const char *configs[6] = {"qwen3-4b", "qwen3-4b",  "qwen3-8b",
                                     "qwen3-8b", "qwen3-14b", "qwen3-32b"};
    ck_assert_int_eq(tu_sh("%s plan --paper --json", tu_bin()), 0);
    cJSON *root = cJSON_Parse(tu_last_output());
    ck_assert_msg(root, "plan --paper --json did not print JSON: %s", tu_last_output());
    const cJSON *cells = cJSON_GetObjectItemCaseSensitive(root, "table3"), *c;
    ck_assert_int_eq(cJSON_GetArraySize(cells), 54);
    int T[3][3][6] = {{{0}}}, seen = 0;
    cJSON_ArrayForEach(c, cells) {
        const char *o = cJSON_GetObjectItemCaseSensitive(c, "objective")->valuestring;
        const char *mt = cJSON_GetObjectItemCaseSensitive(c, "method")->valuestring;
        const char *col = cJSON_GetObjectItemCaseSensitive(c, "column")->valuestring;
        int i = -1, j = -1, k = -1;
        for (int q = 0; q < 6; q++) {
            if (q < 3 && !strcmp(o, objs[q])) i = q;
            if (q < 3 && !strcmp(mt, methods[q])) j = q;
            if (!strcmp(col, cols[q])) k = q;
        }
        ck_assert_msg(i >= 0 && j >= 0 && k >= 0 && !T[i][j][k], "cell %s %s %s", o, mt, col);
        T[i][j][k] = (int)json_int(c, "T");
        ck_assert_msg(T[i][j][k] > 0, "%s %s %s: nothing fits", o, mt, col);
        const cJSON *pk = cJSON_GetObjectItemCaseSensitive(c, "paper_k");
        if (paper[i][j][k])
            ck_assert_msg(cJSON_IsNumber(pk) && pk->valuedouble == paper[i][j][k],
                          "%s %s %s: the paper's %g", o, mt, col, paper[i][j][k]);
        else
            ck_assert(cJSON_IsNull(pk));
        seen++;
    }
    ck_assert_int_eq(seen, 54);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 6; k++)
            ck_assert_msg(T[i][0][k] <= T[i][1][k] && T[i][1][k] <= T[i][2][k],
                          "%s %s: full %d, ckpt %d, stream %d", objs[i], cols[k], T[i][0][k],
                          T[i][1][k], T[i][2][k]);
    /* the boundary of one cell per column, the objective and the method turning round */
    for (int k = 0; k < 6; k++) {
        const int i = k % 3, j = (k / 3 + k) % 3;
        sbp_config cfg;
        sbp_err err = {0};
        char path[128];
        snprintf(path, sizeof path, "data/configs/%s.json", configs[k]);
        if (sbp_config_load(&cfg, path, &err)) ck_abort_msg("%s", err.msg);
        static const sbp_schedule sched[3] = {SBP_FULL, SBP_CKPT, SBP_STREAM};
        sbp_plan_opts o = {.grad = {.schedule = sched[j],
                                    .block = 256,
                                    .chunk = 1024,
                                    .logit_chunk = 256,
                                    .objective = {.kind = (sbp_objective_kind)i,
                                                  .beta = i == 1 ? 0.1 : 0,
                                                  .epsilon_low = 0.2,
                                                  .epsilon_high = 0.2}},
                           .B = i == 2 ? 8 : 1,
                           .storage_bytes = 2};
        if (strstr(cols[k], "LoRA"))
            o.lora = (sbp_lora_config){.r = 32, .alpha = 128, .targets = SBP_LORA_ALL};
        sbp_ledger at, above;
        o.T = T[i][j][k];
        if (sbp_plan(&at, &cfg, &o, &err)) ck_abort_msg("%s", err.msg);
        o.T++;
        if (sbp_plan(&above, &cfg, &o, &err)) ck_abort_msg("%s", err.msg);
        ck_assert_msg(at.peak_total <= (80LL << 30) && above.peak_total > (80LL << 30),
                      "%s %s %s: T = %d is not the boundary", objs[i], methods[j], cols[k],
                      T[i][j][k]);
    }
    cJSON_Delete(root);
}
END_TEST

/* The ledger's pool (bench and train): a freed block's pages are handed out again, zeroed when
 * asked; the figures are those of the blocks in use; in use plus cached never exceeds the
 * recorded peak by more than the regions' rounding (two small pages a region). */
START_TEST(ledger_pool) {
    sbp_ledger lg = {0};
    sbp_ledger_keep_blocks(&lg);
    const size_t big = (size_t)8 << 20;
    unsigned char *a = sbp_ledger_alloc(&lg, SBP_MEM_LAYER, big);
    ck_assert_ptr_nonnull(a);
    memset(a, 7, big);
    sbp_ledger_free(&lg, a);
    ck_assert(lg.cached > 0 && lg.cur_total == 0 && lg.peak_total == (int64_t)big);
    ck_assert_int_le(lg.slack, 2 * 4096);
    ck_assert(lg.cur_total + lg.cached <= lg.peak_total + lg.slack);
    unsigned char *b = sbp_ledger_alloc(&lg, SBP_MEM_LAYER, big - 4096);
    ck_assert_ptr_eq(b, a);                /* the same pages */
    ck_assert_int_le(lg.cached, lg.slack); /* at most the region's short last unit, unused */
    for (size_t i = 0; i < big - 4096; i += 4093) ck_assert_int_eq(b[i], 0); /* zeroed */
    sbp_ledger_free(&lg, b);
    sbp_ledger_drop_blocks(&lg);
    ck_assert_int_eq(lg.cached, 0);
    ck_assert_ptr_null(lg.pool);
}
END_TEST

/* Smaller blocks are carved from a freed larger one (full BP's layer backward from the freed
 * logits) and merge back into it: the larger block fits again, in the same place. */
START_TEST(ledger_pool_carves) {
    sbp_ledger lg = {0};
    sbp_ledger_keep_blocks(&lg);
    const size_t mib = (size_t)1 << 20;
    char *a = sbp_ledger_alloc_raw(&lg, SBP_MEM_LOGITS, 64 * mib);
    ck_assert_ptr_nonnull(a);
    memset(a, 1, 64 * mib);
    sbp_ledger_free(&lg, a);
    char *b = sbp_ledger_alloc_raw(&lg, SBP_MEM_LAYER, 4 * mib);
    char *c = sbp_ledger_alloc_raw(&lg, SBP_MEM_LAYER, 11 * mib);
    char *d = sbp_ledger_alloc_raw(&lg, SBP_MEM_LAYER, 300 << 10); /* above the pool's minimum */
    ck_assert(b >= a && b + 4 * mib <= a + 64 * mib);
    ck_assert(c >= a && c + 11 * mib <= a + 64 * mib);
    ck_assert(d >= a && d + (300 << 10) <= a + 64 * mib);
    ck_assert(c >= b + 4 * mib || c + 11 * mib <= b); /* disjoint */
    ck_assert(d >= c + 11 * mib || d + (300 << 10) <= c);
    ck_assert(d >= b + 4 * mib || d + (300 << 10) <= b);
    ck_assert_int_eq(lg.cur_total, (int64_t)(15 * mib + (300 << 10)));
    ck_assert(lg.cur_total + lg.cached <= lg.peak_total + lg.slack);
    sbp_ledger_free(&lg, c), sbp_ledger_free(&lg, b), sbp_ledger_free(&lg, d);
    char *e = sbp_ledger_alloc_raw(&lg, SBP_MEM_LOGITS, 64 * mib);
    ck_assert_ptr_eq(e, a);
    sbp_ledger_free(&lg, e);
    sbp_ledger_drop_blocks(&lg);
}
END_TEST

/* The point of the pool: a step that repeats the blocks of the one before (sizes, order,
 * lifetimes) maps nothing and faults (almost) no page in, while the bound holds after every
 * allocation and free. */
static long minor_faults(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

static void pool_step(sbp_ledger *lg) {
    const size_t mib = (size_t)1 << 20;
    const size_t sizes[] = {4 * mib, 11 * mib, 200 << 10, 4 * mib, 11 * mib, 2 * mib, 40 * mib};
    char *p[7];
    for (int i = 0; i < 7; i++) { /* a forward: blocks written and kept */
        p[i] = sbp_ledger_alloc_raw(lg, SBP_MEM_ACTIVATIONS, sizes[i]);
        ck_assert_ptr_nonnull(p[i]);
        memset(p[i], i + 1, sizes[i]);
        ck_assert(lg->cur_total + lg->cached <= lg->peak_total + lg->slack);
    }
    sbp_ledger_free(lg, p[6]); /* the largest freed, then working buffers in its place */
    char *w[3];
    for (int i = 0; i < 3; i++) {
        w[i] = sbp_ledger_alloc(lg, SBP_MEM_LAYER, sizes[i]);
        ck_assert_ptr_nonnull(w[i]);
        for (size_t k = 0; k < sizes[i]; k += 4096) ck_assert_int_eq(w[i][k], 0);
        memset(w[i], 9, sizes[i]);
        ck_assert(lg->cur_total + lg->cached <= lg->peak_total + lg->slack);
    }
    for (int i = 5; i >= 0; i--) {
        sbp_ledger_free(lg, p[i]);
        ck_assert(lg->cur_total + lg->cached <= lg->peak_total + lg->slack);
    }
    for (int i = 0; i < 3; i++) sbp_ledger_free(lg, w[i]);
    ck_assert_int_eq(lg->cur_total, 0);
}

START_TEST(ledger_pool_steps) {
    sbp_ledger lg = {0};
    sbp_ledger_keep_blocks(&lg);
    pool_step(&lg);
    const int64_t peak = lg.peak_total, returned = lg.returned;
    const long f0 = minor_faults();
    pool_step(&lg);
    pool_step(&lg);
    const long faults = minor_faults() - f0;
    ck_assert_int_eq(lg.peak_total, peak);
    /* nothing given back, so nothing to fault in again (this once failed by a 1 MiB short unit
     * a step: the regions' rounding put every step's end a few KB over the peak) */
    ck_assert_int_eq(lg.returned, returned);
    /* the first step faulted in 73 MiB: ~37 huge pages or ~19,000 small ones. Under ASan the
     * count is the sanitizer's own (its shadow memory and allocator fault pages in), so only
     * the bound and the peak are checked there. */
#if !defined(__SANITIZE_ADDRESS__) && !SBP_TEST_HAS_ASAN
    ck_assert_msg(faults < 200, "two repeated steps faulted %ld pages in", faults);
#else
    (void)faults;
#endif
    sbp_ledger_drop_blocks(&lg);
    ck_assert_ptr_null(lg.pool);
}
END_TEST

/* The pool under the engine: repeated full-BP steps of the bench model (T = 2048, 262 MB of
 * logits) give (almost) nothing back to the system once the first step has mapped its regions.
 * Counting a region's short last unit as "not resident" once sent small blocks into the freed
 * logits, the logits then no longer fit there, and the pool gave back and faulted in the whole
 * logits buffer every step (262 MB, 518 MB over steps 2 and 3; pool.c, pool_take). Three
 * steps take ~10 s; under the sanitizers several times that, so there only the synthetic steps
 * above run. */
START_TEST(ledger_pool_engine_steps) {
#if defined(__SANITIZE_ADDRESS__) || SBP_TEST_HAS_ASAN
    return;
#endif
    sbp_ledger lg = {0};
    sbp_ledger_keep_blocks(&lg);
    sbp_model m;
    sbp_err err = {0};
    if (sbp_model_load(&m, tu_model("bench", 7), SBP_FP32, &lg, &err)) ck_abort_msg("%s", err.msg);
    enum { T = 2048 };
    static int32_t ids[T], labels[T];
    static uint8_t mask[T];
    for (int t = 0; t < T; t++) ids[t] = labels[t] = (t * 7919 + 13) % m.cfg.vocab, mask[t] = 1;
    sbp_batch b = {.B = 1, .T = T, .kind = SBP_OBJ_SFT, .ids = ids, .labels = labels, .mask = mask};
    sbp_batch_count_targets(&b);
    sbp_grad_opts o = {.schedule = SBP_FULL, .block = 256, .chunk = 1024, .logit_chunk = 256};
    int64_t returned[3];
    for (int step = 0; step < 3; step++) {
        sbp_grad_result r;
        if (sbp_grad(&r, &m, &b, &o, &lg, &err)) ck_abort_msg("%s", err.msg);
        sbp_grad_result_free(&r, &lg);
        returned[step] = lg.returned;
    }
    const int64_t logits = (int64_t)T * m.cfg.vocab * 4;
    ck_assert_msg(returned[2] - returned[0] < logits / 8,
                  "steps 2 and 3 gave back %lld bytes (the logits are %lld)",
                  (long long)(returned[2] - returned[0]), (long long)logits);
    ck_assert(lg.cur_total + lg.cached <= lg.peak_total + lg.slack);
    sbp_model_free(&m, &lg);
    sbp_ledger_drop_blocks(&lg);
}
END_TEST

/* Dropping the pool while a block is in use: the block stays valid, later blocks are mapped
 * one by one, and the pool goes when its last block is freed. */
START_TEST(ledger_pool_drop_in_use) {
    sbp_ledger lg = {0};
    sbp_ledger_keep_blocks(&lg);
    char *a = sbp_ledger_alloc(&lg, SBP_MEM_LAYER, (size_t)6 << 20);
    ck_assert_ptr_nonnull(a);
    sbp_ledger_drop_blocks(&lg);
    ck_assert_ptr_nonnull(lg.pool);
    ck_assert_int_eq(lg.cached, 0);
    memset(a, 3, (size_t)6 << 20);
    char *b = sbp_ledger_alloc(&lg, SBP_MEM_LAYER, (size_t)6 << 20);
    ck_assert_ptr_nonnull(b);
    ck_assert(b >= a + ((size_t)6 << 20) || b + ((size_t)6 << 20) <= a);
    sbp_ledger_free(&lg, a);
    ck_assert_ptr_null(lg.pool);
    sbp_ledger_free(&lg, b);
    ck_assert_int_eq(lg.cur_total, 0);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("plan");
#if defined(__SANITIZE_ADDRESS__) || SBP_TEST_HAS_ASAN
    /* the emulated device's cases under the sanitizers: 26-98 s each on one idle core */
    tcase_set_timeout(tc, 300);
#else
    tcase_set_timeout(tc, 60);
#endif
    tcase_add_loop_test(tc, plan_equals_measured, 0, 27);
    tcase_add_loop_test(tc, plan_equals_measured_objectives_lora, 0, 27);
    tcase_add_test(tc, ledger_pool);
    tcase_add_test(tc, ledger_pool_carves);
    tcase_add_test(tc, ledger_pool_steps);
    tcase_add_test(tc, ledger_pool_drop_in_use);
    tcase_add_test(tc, ledger_pool_engine_steps);
    tcase_add_test(tc, plan_large_model);
    tcase_add_test(tc, plan_device_without_optimizer);
    tcase_add_loop_test(tc, full_keeps_no_formed_rows, 0, 2);
    tcase_add_loop_test(tc, categories_sum_to_total, 0, 6);
    tcase_add_loop_test(tc, budget_finds_the_boundary, 0, 3);
    suite_add_tcase(s, tc);
    TCase *paper = tcase_create("paper"); /* some 1,400 plans of 4B-32B models */
    tcase_set_timeout(paper, 900);
    tcase_add_test(paper, paper_table3_complete);
    suite_add_tcase(s, paper);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
