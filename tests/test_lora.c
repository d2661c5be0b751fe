/* test_lora.c — LoRA adapters end to end: training, bad input, and the cross-checks.
 *
 * Training (`streambp train --lora`): 50 steps of an adapter on the tiny Qwen3 with full, ckpt
 * and stream give byte-identical adapter files and loss logs, and the loss falls; DPO and GRPO
 * in float64 agree across schedules too; a run stopped and resumed with another schedule, and a
 * run killed with SIGKILL, end on the bytes of a run that never stopped; the checkpoints are
 * peft adapter directories with the moments under the adapter's names.
 * Bad input: rank 0, alpha <= 0, an unknown target module, shapes that do not match the base,
 * and resume directories of another adapter, of a full-weight run, or a LoRA checkpoint resumed
 * without --lora: exit 2, the problem named, nothing written or overwritten — for `lora init`,
 * `grad --lora` and `train --lora`.
 * Cross-checks: `grad --lora` in float64 against verify/torch_grads.py --lora (plain PyTorch,
 * peft's LoraLayer formula) for SFT, DPO and GRPO, every family and schedule, at <= 1e-10
 * relative L2 per adapter tensor, and bitwise across schedules (skipped without torch); and
 * verify/peft_check.py against transformers + peft (skipped when they cannot be imported by
 * $SBP_PEFT_PYTHON, default /usr/bin/python3). */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The training demo of test_train.c, with an adapter. */
#define DEMO_DATA                                                                                  \
    "--jsonl data/train/counting.jsonl --seq 64 --batch-size 4 --lr 1e-2 --warmup-steps 5 "        \
    "--shuffle --weight-decay 0.01 --block 16 --chunk 32 --logit-chunk 16"

static const char *model(void) {
    return tu_model("qwen3-tiny", 1);
}

/* A new adapter directory for model dir m (lora init's options in opts); fails the test on
 * error. The path is the test's to keep (never freed: the process ends with the test). */
static const char *adapter(const char *name, const char *m, const char *opts) {
    const char *dir = tu_path("adapter-%s", name);
    int rc = tu_sh("%s lora init --model %s --out %s %s", tu_bin(), m, dir, opts);
    ck_assert_msg(rc == 0, "lora init %s: %s", opts, tu_last_output());
    return tu_keep(dir); /* tu_path's buffers are a ring; the tests hold adapters a while */
}

/* The peft-initialised adapter of the training tests: B = 0, every linear layer. */
static const char *demo_adapter(void) {
    return adapter("demo", model(), "--r 4 --alpha 8 --targets all-linear --seed 3");
}

static int train(const char *lora, const char *out, const char *schedule, int steps, int threads,
                 const char *extra) {
    return tu_sh("%s train --model %s --lora %s " DEMO_DATA " --steps %d --schedule %s "
                 "--threads %d --out %s %s",
                 tu_bin(), model(), lora, steps, schedule, threads, out, extra);
}

static void assert_same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = tu_slurp(a, &na), *y = tu_slurp(b, &nb);
    ck_assert_msg(na == nb && memcmp(x, y, na) == 0, "%s and %s differ", a, b);
    free(x), free(y);
}

/* Loss of row `step` of a loss log (1-based). */
static double loss_at(const char *csv, int step) {
    for (const char *l = strchr(csv, '\n'); l && l[1]; l = strchr(l + 1, '\n')) {
        long long s;
        double epoch, loss;
        if (sscanf(l + 1, "%lld,%lf,%lf", &s, &epoch, &loss) != 3) break;
        if (s == step) return loss;
    }
    return NAN;
}

/* ---- training -------------------------------------------------------------------------------- */

START_TEST(fifty_steps_bitwise_across_schedules) {
    static const char *sched[3] = {"full", "ckpt", "stream"};
    static const int threads[3] = {1, 2, 2};
    const char *lora = demo_adapter();
    for (int s = 0; s < 3; s++) {
        int rc =
            train(lora, tu_path("run-%s", sched[s]), sched[s], 50, threads[s], "--log-every 10");
        ck_assert_msg(rc == 0, "%s: %s", sched[s], tu_last_output());
        tu_assert_clean_output();
    }
    for (int s = 0; s < 2; s++) {
        assert_same_file(tu_path("run-%s/adapter_model.safetensors", sched[s]),
                         tu_path("run-stream/adapter_model.safetensors"));
        assert_same_file(tu_path("run-%s/loss.csv", sched[s]), tu_path("run-stream/loss.csv"));
    }
    /* the result is an adapter directory (peft's layout), and the model was not written */
    const char *run = tu_path("run-stream");
    ck_assert(tu_exists(tu_join(run, "adapter_config.json")));
    ck_assert(!tu_exists(tu_join(run, "model.safetensors")));
    sbp_config cfg;
    sbp_lora a, a0;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_config_load(&cfg, tu_join(model(), "config.json"), &err), SBP_OK);
    ck_assert_msg(sbp_lora_load(&a, run, &cfg, SBP_FP32, NULL, &err) == SBP_OK, "%s", err.msg);
    ck_assert_msg(sbp_lora_load(&a0, lora, &cfg, SBP_FP32, NULL, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(a.cfg.r, 4);
    ck_assert(a.cfg.alpha == 8 && a.cfg.targets == SBP_LORA_ALL);
    /* every tensor moved (B from 0 first, then A through B), and nothing else is in the file */
    for (int i = 0; i < a.params.n; i++) {
        const sbp_param *p = &a.params.p[i];
        ck_assert_msg(memcmp((float *)a.w + p->offset, (float *)a0.w + p->offset,
                             sizeof(float) * (size_t)p->numel) != 0,
                      "%s did not change in 50 steps", p->name);
    }
    sbp_lora_free(&a, NULL), sbp_lora_free(&a0, NULL);
    char *csv = tu_slurp(tu_path("run-stream/loss.csv"), NULL);
    double head = 0, tail = 0, first = loss_at(csv, 1), last = loss_at(csv, 50);
    for (int k = 1; k <= 10; k++) head += loss_at(csv, k) / 10;
    for (int k = 41; k <= 50; k++) tail += loss_at(csv, k) / 10;
    ck_assert_msg(last < first - 0.5 && tail < head - 0.5,
                  "the loss does not fall: %.4f -> %.4f (means of 10 steps %.4f -> %.4f)", first,
                  last, head, tail);
    printf("LoRA r 4 all-linear, 50 steps, qwen3-tiny: full/ckpt/stream byte-identical adapters "
           "and loss.csv; loss %.4f -> %.4f (mean of the first 10 steps %.4f, of the last 10 "
           "%.4f)\n",
           first, last, head, tail);
    free(csv);
}
END_TEST

/* DPO and GRPO adapters in float64, rslora and a subset of targets: full and stream agree. */
START_TEST(objectives_across_schedules) {
    static const char *cases[][3] = {
        {"llama3-tiny",
         "--data data/batches/grpo-tiny.safetensors --objective grpo --loss-type bnpo --beta 0.04 "
         "--grad-accum 2 --precision fp64",
         "--r 3 --alpha 6 --targets q_proj,k_proj,down_proj --rslora --b-std 0.05"},
        {"qwen2-tiny",
         "--data data/batches/dpo-tiny.safetensors --objective dpo --weight-decay 0.1 "
         "--precision fp64",
         "--r 2 --alpha 4 --targets v_proj,o_proj,gate_proj,up_proj"}};
    for (int c = 0; c < 2; c++) {
        const char *m = tu_model(cases[c][0], 3);
        const char *lora = adapter(cases[c][0], m, cases[c][2]);
        for (int s = 0; s < 2; s++) {
            const char *sched = s ? "stream" : "full";
            int rc = tu_sh("%s train --model %s --lora %s %s --steps 6 --lr 1e-2 --block 8 "
                           "--chunk 8 --logit-chunk 8 --schedule %s --threads 1 --out %s",
                           tu_bin(), m, lora, cases[c][1], sched, tu_path("obj-%d-%s", c, sched));
            ck_assert_msg(rc == 0, "%s %s: %s", cases[c][0], sched, tu_last_output());
        }
        assert_same_file(tu_path("obj-%d-full/adapter_model.safetensors", c),
                         tu_path("obj-%d-stream/adapter_model.safetensors", c));
        assert_same_file(tu_path("obj-%d-full/loss.csv", c), tu_path("obj-%d-stream/loss.csv", c));
    }
}
END_TEST

START_TEST(stop_and_resume_is_bitwise) {
    const char *lora = demo_adapter();
    const char *whole = tu_path("whole"), *parts = tu_path("parts");
    ck_assert_msg(train(lora, whole, "stream", 50, 1, "") == 0, "%s", tu_last_output());
    ck_assert_msg(train(lora, parts, "stream", 50, 1, "--stop-at 25 --save-every 10") == 0, "%s",
                  tu_last_output());
    /* a checkpoint: the adapter in peft's layout, the moments under its names, no model */
    const char *ck = tu_join(parts, "checkpoint-25");
    ck_assert(tu_exists(tu_join(ck, "adapter_config.json")));
    ck_assert(tu_exists(tu_join(ck, "adapter_model.safetensors")));
    ck_assert(!tu_exists(tu_join(ck, "model.safetensors")));
    tu_tensors ts;
    tu_tensors_load(&ts, tu_join(ck, "optimizer.safetensors"));
    tu_tensors_index(&ts, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight.exp_avg_sq");
    ck_assert_int_eq(ts.n, 2 * 2 * 2 * 7); /* 2 moments of A and B of 7 modules in 2 layers */
    tu_tensors_free(&ts);
    int rc = tu_sh("%s train --model %s --lora %s " DEMO_DATA " --steps 50 --schedule ckpt "
                   "--threads 2 --out %s --save-every 10 --resume %s",
                   tu_bin(), model(), lora, parts, parts);
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    ck_assert_ptr_nonnull(strstr(tu_last_output(), "checkpoint-25"));
    assert_same_file(tu_join(whole, "adapter_model.safetensors"),
                     tu_join(parts, "adapter_model.safetensors"));
    assert_same_file(tu_join(whole, "loss.csv"), tu_join(parts, "loss.csv"));
    tu_assert_no_tmp(parts);
}
END_TEST

START_TEST(kill_and_resume_is_bitwise) {
    const char *lora = demo_adapter();
    const char *whole = tu_path("k-whole"), *killed = tu_path("k-killed");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s train --model %s --lora %s " DEMO_DATA " --seq 32 --batch-size 2 --steps 60 "
             "--threads 1",
             tu_bin(), model(), lora);
    ck_assert_msg(tu_sh("%s --out %s", cmd, whole) == 0, "%s", tu_last_output());
    char run[2300];
    snprintf(run, sizeof run, "%s --out %s --save-every 5", cmd, killed);
    const int was_killed = tu_kill_after(run, tu_join(killed, "checkpoint-20/trainer_state.json"));
    printf("LoRA kill: the run was %s\n",
           was_killed ? "killed by SIGKILL after checkpoint-20" : "already finished");
    int rc = tu_sh("%s --out %s --save-every 5 --resume %s", cmd, killed, killed);
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    assert_same_file(tu_join(whole, "adapter_model.safetensors"),
                     tu_join(killed, "adapter_model.safetensors"));
    assert_same_file(tu_join(whole, "loss.csv"), tu_join(killed, "loss.csv"));
    tu_assert_no_tmp(killed);
}
END_TEST

/* ---- bad input ------------------------------------------------------------------------------- */

/* A copy of adapter src whose adapter_config.json has key set to the JSON value v. */
static const char *edited_config(const char *name, const char *src, const char *key,
                                 const char *v) {
    const char *dst = tu_path("edited-%s", name);
    ck_assert_int_eq(tu_sh("rm -rf '%s' && cp -r '%s' '%s'", dst, src, dst), 0);
    const char *path = tu_join(dst, "adapter_config.json");
    char *text = tu_slurp(path, NULL);
    cJSON *c = cJSON_Parse(text), *val = cJSON_Parse(v);
    ck_assert_msg(c && val, "cannot parse %s or %s", path, v);
    cJSON_DeleteItemFromObjectCaseSensitive(c, key);
    cJSON_AddItemToObject(c, key, val);
    char *out = cJSON_Print(c);
    tu_spit(path, out, strlen(out));
    free(out), free(text);
    cJSON_Delete(c);
    return tu_keep(dst);
}

START_TEST(bad_adapters_overwrite_nothing) {
    const char *m = model(), *never = tu_keep(tu_path("never"));
    /* lora init: rank 0, alpha <= 0, unknown target; nothing is created */
    tu_expect_usage("--r must be a positive integer", "lora init --model %s --out %s --r 0", m,
                    never);
    tu_expect_usage("--alpha must be > 0", "lora init --model %s --out %s --alpha 0", m, never);
    tu_expect_usage("--alpha must be a finite number >= 0",
                    "lora init --model %s --out %s --alpha -2", m, never);
    tu_expect_usage("--targets \"q_proj,lm_head\"",
                    "lora init --model %s --out %s --targets q_proj,lm_head", m, never);
    tu_expect_usage("config.json", "lora init --model %s --out %s", tu_path("no-model"), never);
    ck_assert_msg(!tu_exists(never), "%s was created by a failed lora init", never);

    /* adapters that do not fit: edited configs, another model's adapter, a missing tensor */
    const char *good = adapter("good", m, "--r 4 --alpha 8 --targets q_proj,v_proj --b-std 0.1");
    const char *other =
        adapter("llama", tu_model("llama3-tiny", 1), "--r 4 --targets q_proj,v_proj");
    static const char *edits[][3] = {
        {"r", "0", "the LoRA rank r must be in [1, 65536] (got 0)"},
        {"r", "5", "has shape [4, 64], the model needs [5, 64]"},
        {"lora_alpha", "0", "lora_alpha must be > 0 and finite (got 0)"},
        {"lora_alpha", "-1", "lora_alpha must be > 0 and finite (got -1)"},
        {"target_modules", "[\"q_proj\", \"qkv_proj\"]", "unknown target module \"qkv_proj\""},
        {"target_modules", "[\"q_proj\", \"v_proj\", \"k_proj\"]",
         "no tensor \"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight\""},
        {"target_modules", "[\"q_proj\"]", "is not a tensor of this adapter"},
        {"use_dora", "true", "DoRA adapters are not supported"},
        {"peft_type", "\"IA3\"", "peft_type is not \"LORA\""},
    };
    const int n_edits = sizeof edits / sizeof edits[0];
    const char *bad[16];
    const char *why[16];
    int nb = 0;
    for (int i = 0; i < n_edits; i++) {
        char name[16];
        snprintf(name, sizeof name, "e%d", i);
        bad[nb] = edited_config(name, good, edits[i][0], edits[i][1]);
        why[nb++] = edits[i][2];
    }
    bad[nb] = other; /* llama3-tiny's adapter on qwen3-tiny: q_proj is [Q, C] of another C */
    why[nb++] = "the model needs";
    const char *missing = tu_keep(tu_path("missing-tensor"));
    ck_assert_int_eq(tu_sh("rm -rf '%s' && mkdir '%s' && cp '%s/adapter_config.json' '%s/'",
                           missing, missing, good, missing),
                     0);
    bad[nb] = missing;
    why[nb++] = "adapter_model.safetensors";

    /* grad --lora leaves an existing --out as it was; train --lora creates nothing */
    const char *out = tu_keep(tu_path("grad-out.safetensors"));
    tu_spit(out, "precious", 8);
    for (int i = 0; i < nb; i++) {
        tu_expect_usage(
            why[i], "grad --model %s --batch data/batches/sft-tiny.safetensors --lora %s --out %s",
            m, bad[i], out);
        tu_expect_usage(why[i], "train --model %s --lora %s " DEMO_DATA " --steps 2 --out %s", m,
                        bad[i], never);
    }
    size_t n;
    char *kept = tu_slurp(out, &n);
    ck_assert_msg(n == 8 && memcmp(kept, "precious", 8) == 0, "grad --lora overwrote --out");
    free(kept);
    ck_assert_msg(!tu_exists(never), "%s was created by a failed train --lora", never);
    /* the adapter they were edited from loads */
    ck_assert_msg(tu_sh("%s grad --model %s --batch data/batches/sft-tiny.safetensors --lora %s "
                        "--out %s",
                        tu_bin(), m, good, tu_path("ok.safetensors")) == 0,
                  "%s", tu_last_output());
}
END_TEST

START_TEST(bad_resume_overwrites_nothing) {
    const char *m = model(), *lora = demo_adapter();
    /* strdup: tu_path's buffers are a ring that the many calls below go round */
    const char *run = tu_keep(tu_path("r-run")), *full = tu_keep(tu_path("r-full"));
    ck_assert_msg(train(lora, run, "stream", 10, 1, "--stop-at 6 --save-every 3") == 0, "%s",
                  tu_last_output());
    ck_assert_msg(tu_sh("%s train --model %s " DEMO_DATA " --steps 10 --threads 1 --out %s "
                        "--stop-at 3",
                        tu_bin(), m, full) == 0,
                  "%s", tu_last_output());
    char *before = tu_snapshot(run), *full_before = tu_snapshot(full);
    const char *ck = tu_keep(tu_join(run, "checkpoint-6")), *fresh = tu_keep(tu_path("r-new"));
    /* another adapter: other initial tensors, another alpha, another rank */
    const char *seed = adapter("seed4", m, "--r 4 --alpha 8 --targets all-linear --seed 4");
    const char *alpha = adapter("alpha", m, "--r 4 --alpha 16 --targets all-linear --seed 3");
    const char *rank = adapter("rank", m, "--r 2 --alpha 8 --targets all-linear --seed 3");
    tu_expect_usage("initial adapter (hash of --lora's tensors)",
                    "train --model %s --lora %s " DEMO_DATA " --steps 10 --out %s --resume %s", m,
                    seed, fresh, ck);
    tu_expect_usage("alpha 8, use_rslora 0, targets q_proj",
                    "train --model %s --lora %s " DEMO_DATA " --steps 10 --out %s --resume %s", m,
                    alpha, fresh, ck);
    tu_expect_usage("the LoRA adapter (--lora: its adapter_config.json) = r 4",
                    "train --model %s --lora %s " DEMO_DATA " --steps 10 --out %s --resume %s", m,
                    rank, fresh, ck);
    /* another base model under the same adapter shapes */
    tu_expect_usage("initial weights (hash of --model's weights)",
                    "train --model %s --lora %s " DEMO_DATA " --steps 10 --out %s --resume %s",
                    tu_model("qwen3-tiny", 2), lora, fresh, ck);
    /* a LoRA checkpoint without --lora, a full-weight checkpoint with it */
    tu_expect_usage("trains a LoRA adapter (r 4",
                    "train --model %s " DEMO_DATA " --steps 10 --out %s --resume %s", m, fresh, ck);
    tu_expect_usage("the checkpoint's run trains the full weights; this run a LoRA adapter",
                    "train --model %s --lora %s " DEMO_DATA " --steps 10 --out %s --resume %s", m,
                    lora, fresh, tu_join(full, "checkpoint-3"));
    /* a checkpoint whose adapter was replaced by another configuration */
    const char *swapped = tu_keep(tu_path("r-swapped"));
    ck_assert_int_eq(tu_sh("rm -rf '%s' && cp -r '%s' '%s' && cp '%s'/adapter_* '%s/'", swapped, ck,
                           swapped, rank, swapped),
                     0);
    /* the recorded file hashes catch it first; without them (a checkpoint written before they
     * were recorded) the adapter's configuration check still does */
    tu_expect_usage("adapter_config.json does not match the SHA-256",
                    "train --model %s --lora %s " DEMO_DATA " --steps 10 --out %s "
                    "--resume %s",
                    m, lora, fresh, swapped);
    {
        const char *sp = tu_join(swapped, "trainer_state.json");
        char *text = tu_slurp(sp, NULL);
        cJSON *o = cJSON_Parse(text);
        free(text);
        cJSON_DeleteItemFromObjectCaseSensitive(o, "files");
        char *out = cJSON_Print(o);
        tu_spit(sp, out, strlen(out));
        free(out), cJSON_Delete(o);
    }
    tu_expect_usage("is not the one the run trains",
                    "train --model %s --lora %s " DEMO_DATA " --steps 10 --out %s "
                    "--resume %s",
                    m, lora, fresh, swapped);
    /* a fresh LoRA run into a run directory */
    tu_expect_usage("already holds a training run",
                    "train --model %s --lora %s " DEMO_DATA " --steps 10 --out %s", m, lora, run);
    ck_assert(!tu_exists(fresh));
    char *after = tu_snapshot(run), *full_after = tu_snapshot(full);
    ck_assert_str_eq(before, after);
    ck_assert_str_eq(full_before, full_after);
    free(before), free(after), free(full_before), free(full_after);
    /* and the untouched run still resumes */
    ck_assert_msg(tu_sh("%s train --model %s --lora %s " DEMO_DATA " --steps 10 --threads 1 "
                        "--out %s --resume %s",
                        tu_bin(), m, lora, run, run) == 0,
                  "%s", tu_last_output());
}
END_TEST

/* ---- cross-checks ---------------------------------------------------------------------------- */

/* Worst relative L2 over the tensors of file a against file b (same names, F64); the loss of
 * both from __metadata__ into *la, *lb. */
static double worst_rel_l2(const char *a, const char *b, double *la, double *lb) {
    sbp_st_file fa, fb;
    sbp_err err = {0};
    if (sbp_st_open(&fa, a, &err) || sbp_st_open(&fb, b, &err)) ck_abort_msg("%s", err.msg);
    ck_assert_int_eq(fa.n, fb.n);
    const char *sa = sbp_st_meta(&fa, "loss"), *sb = sbp_st_meta(&fb, "loss");
    ck_assert_msg(sa && sb, "no loss in %s or %s", a, b);
    *la = strtod(sa, NULL), *lb = strtod(sb, NULL);
    double worst = 0;
    for (int i = 0; i < fa.n; i++) {
        const sbp_st_tensor *ta = &fa.t[i], *tb = sbp_st_find(&fb, ta->name);
        ck_assert_msg(tb && tb->numel == ta->numel, "%s: no tensor %s of that size", b, ta->name);
        double *x = malloc(sizeof(double) * (size_t)ta->numel),
               *y = malloc(sizeof(double) * (size_t)ta->numel);
        if (sbp_st_read(&fa, ta, x, SBP_DT_F64, &err) || sbp_st_read(&fb, tb, y, SBP_DT_F64, &err))
            ck_abort_msg("%s", err.msg);
        double d = 0, n = 0;
        for (int64_t j = 0; j < ta->numel; j++)
            d += (x[j] - y[j]) * (x[j] - y[j]), n += y[j] * y[j];
        ck_assert_msg(n > 0, "%s: %s is all zero (a gradient that checks nothing)", b, ta->name);
        worst = fmax(worst, sqrt(d / n));
        free(x), free(y);
    }
    sbp_st_close(&fa), sbp_st_close(&fb);
    return worst;
}

/* grad --lora in float64 against torch_grads.py --lora: every family, SFT, DPO and GRPO, every
 * schedule (a ragged chunk too), at <= 1e-10 per adapter tensor; the schedules bitwise. */
START_TEST(torch_every_objective_and_schedule) {
    if (!tu_python_has("/usr/bin/python3", "torch numpy")) {
        printf("SKIPPED: PyTorch not found by /usr/bin/python3 (python3-torch); the LoRA "
               "cross-check against verify/torch_grads.py was not run\n");
        fflush(stdout);
        return;
    }
    static const char *families[] = {"qwen3-tiny", "qwen2-tiny", "llama3-tiny"};
    static const char *objectives[][3] = {
        {"sft", "data/batches/sft-tiny.safetensors", ""},
        {"dpo", "data/batches/dpo-tiny.safetensors", "--objective dpo --beta 0.1"},
        {"grpo", "data/batches/grpo-tiny.safetensors",
         "--objective grpo --loss-type grpo --beta 0.04"}};
    static const char *lora_opts[] = {
        "--r 4 --alpha 8 --targets all-linear",
        "--r 3 --alpha 5 --rslora --targets q_proj,k_proj,up_proj",
        "--r 2 --alpha 16 --targets v_proj,o_proj,gate_proj,down_proj"};
    const char *jobs = tu_path("torch-lora-jobs.txt");
    FILE *f = fopen(jobs, "w");
    ck_assert_ptr_nonnull(f);
    for (int fam = 0; fam < 3; fam++) {
        char opts[200];
        snprintf(opts, sizeof opts, "%s --b-std 0.05 --seed %d --precision fp64", lora_opts[fam],
                 11 + fam);
        const char *a = adapter(families[fam], tu_model(families[fam], 1), opts);
        for (int o = 0; o < 3; o++)
            fprintf(f, "--model '%s' --batch %s --lora '%s' %s --threads 1 --out '%s'\n",
                    tu_model(families[fam], 1), objectives[o][1], a, objectives[o][2],
                    tu_path("torch-%d-%d.safetensors", fam, o));
    }
    fclose(f);
    int rc = tu_sh("/usr/bin/python3 verify/torch_grads.py --jobs '%s'", jobs);
    ck_assert_msg(rc == 0, "torch_grads.py --jobs failed (%d): %s", rc, tu_last_output());
    static const char *sched[][2] = {
        {"full", "8"}, {"ckpt", "8"}, {"stream", "8"}, {"stream", "5"}};
    double worst = 0, worst_loss = 0;
    for (int fam = 0; fam < 3; fam++)
        for (int o = 0; o < 3; o++)
            for (int s = 0; s < 4; s++) {
                const char *g = tu_path("ours-%d-%d-%d.safetensors", fam, o, s);
                rc = tu_sh("%s grad --model %s --batch %s --lora %s %s --precision fp64 "
                           "--schedule %s --block 4 --chunk %s --logit-chunk 4 --threads 1 "
                           "--out %s",
                           tu_bin(), tu_model(families[fam], 1), objectives[o][1],
                           tu_path("adapter-%s", families[fam]), objectives[o][2], sched[s][0],
                           sched[s][1], g);
                ck_assert_msg(rc == 0, "%s", tu_last_output());
                double lo, lt;
                double e = worst_rel_l2(g, tu_path("torch-%d-%d.safetensors", fam, o), &lo, &lt);
                ck_assert_msg(e <= 1e-10, "%s %s %s chunk %s: rel. L2 against torch %.3g",
                              families[fam], objectives[o][0], sched[s][0], sched[s][1], e);
                ck_assert_msg(fabs(lo - lt) <= 1e-12 * fabs(lt), "%s %s: loss %.17g vs %.17g",
                              families[fam], objectives[o][0], lo, lt);
                worst = fmax(worst, e), worst_loss = fmax(worst_loss, fabs(lo - lt) / fabs(lt));
                if (s > 0 && s < 3) /* block-multiple chunks: bitwise with full */
                    ck_assert_msg(tu_sh("%s verify diff --bitwise %s %s", tu_bin(), g,
                                        tu_path("ours-%d-%d-0.safetensors", fam, o)) == 0,
                                  "%s %s %s not bitwise: %s", families[fam], objectives[o][0],
                                  sched[s][0], tu_last_output());
            }
    printf("LoRA float64 vs torch_grads.py --lora (SFT, DPO, GRPO x 3 families x 4 schedules): "
           "worst rel. L2 %.2e, loss %.2e; full = ckpt = stream bitwise\n",
           worst, worst_loss);
}
END_TEST

/* verify/peft_check.py with $SBP_PEFT_PYTHON (default /usr/bin/python3), when it can import
 * torch, transformers, peft and safetensors. */
START_TEST(peft_cross_check) {
    const char *py = getenv("SBP_PEFT_PYTHON") ? getenv("SBP_PEFT_PYTHON") : "/usr/bin/python3";
    if (!tu_python_has(py, "torch transformers peft safetensors")) {
        printf("SKIPPED: %s does not have torch, transformers, peft and safetensors; the peft "
               "cross-check (verify/peft_check.py) was not run (set SBP_PEFT_PYTHON)\n",
               py);
        fflush(stdout);
        return;
    }
    int rc = tu_sh("'%s' verify/peft_check.py --streambp %s --workdir %s", py, tu_bin(),
                   tu_path("peft"));
    printf("%s", tu_last_output());
    fflush(stdout);
    ck_assert_msg(rc == 0, "verify/peft_check.py failed (%d):\n%s", rc, tu_last_output());
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("lora");
    TCase *tc = tcase_create("lora");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, fifty_steps_bitwise_across_schedules);
    tcase_add_test(tc, objectives_across_schedules);
    tcase_add_test(tc, stop_and_resume_is_bitwise);
    tcase_add_test(tc, kill_and_resume_is_bitwise);
    tcase_add_test(tc, bad_adapters_overwrite_nothing);
    tcase_add_test(tc, bad_resume_overwrites_nothing);
    tcase_add_test(tc, torch_every_objective_and_schedule);
    tcase_add_test(tc, peft_cross_check);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
