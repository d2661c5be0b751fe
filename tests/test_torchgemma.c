/* test_torchgemma.c — verify/torch_grads.py (the independent plain-PyTorch implementation) has
 * Gemma-3 (issue 34): its float64 gradients of gemma3-tiny against `streambp grad --precision
 * fp64` (SFT, DPO, GRPO; a batch with the pad id at real positions, left padding, right padding
 * more than a window past the last real token and a hole, under every --unattended mode, and a
 * LoRA adapter on the seven projections under peft's names), and of
 * data/hf-gemma3 against Hugging Face 4.51.3's own patched float64 gradients stored there.
 *
 * Needs a Python with torch: $SBP_TORCH_PYTHON, else /usr/bin/python3; skipped (and says so)
 * when it has no torch, so CI does not depend on it. Measured with torch 2.6.0: 3.2e-15 to
 * 4.7e-15 relative L2 per tensor (worst) against the engine, 7.6e-16 against HF. */
#include "testutil.h"
#include "../src/io/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-13 /* float64, two implementations: a few ulps of every tensor's chains */

static const char *python(void) {
    const char *p = getenv("SBP_TORCH_PYTHON");
    return p && *p ? p : "/usr/bin/python3";
}

static int have_torch(void) {
    if (tu_python_has(python(), "torch")) return 1;
    printf("SKIPPED: %s has no torch (set SBP_TORCH_PYTHON); torch_grads.py's Gemma-3 "
           "not cross-checked\n",
           python());
    fflush(stdout);
    return 0;
}

/* The worst relative L2 over the tensors of `ref` (all of which `got` must have, and no more),
 * and the loss of each in *loss_got, *loss_ref. */
static double compare_files(const char *got, const char *ref, double *loss_got, double *loss_ref) {
    sbp_st_file a, b;
    sbp_err err = {0};
    if (sbp_st_open(&a, got, &err) || sbp_st_open(&b, ref, &err)) ck_abort_msg("%s", err.msg);
    ck_assert_msg(a.n == b.n, "%s has %d tensors, %s %d", got, a.n, ref, b.n);
    double worst = 0;
    for (int i = 0; i < b.n; i++) {
        const sbp_st_tensor *tb = &b.t[i], *ta = sbp_st_find(&a, tb->name);
        ck_assert_msg(ta && ta->numel == tb->numel, "%s: no tensor %s of %lld values", got,
                      tb->name, (long long)tb->numel);
        double *x = malloc(sizeof *x * (size_t)tb->numel),
               *y = malloc(sizeof *y * (size_t)tb->numel);
        ck_assert(x && y);
        if (sbp_st_read(&a, ta, x, SBP_DT_F64, &err) || sbp_st_read(&b, tb, y, SBP_DT_F64, &err))
            ck_abort_msg("%s", err.msg);
        double num = 0, den = 0;
        for (int64_t j = 0; j < tb->numel; j++)
            num += (x[j] - y[j]) * (x[j] - y[j]), den += y[j] * y[j];
        const double e = den > 0 ? sqrt(num / den) : sqrt(num);
        ck_assert_msg(e <= TOL, "%s: %s relative L2 %.3g against %s", got, tb->name, e, ref);
        worst = fmax(worst, e);
        free(x), free(y);
    }
    const char *la = sbp_st_meta(&a, "loss"), *lb = sbp_st_meta(&b, "loss");
    ck_assert_msg(la && lb, "no loss in the metadata of %s or %s", got, ref);
    *loss_got = strtod(la, NULL), *loss_ref = strtod(lb, NULL);
    sbp_st_close(&a), sbp_st_close(&b);
    return worst;
}

/* A batch of 3 rows of 30 over gemma3-tiny (W = 8, pad id 0): the pad id at real positions,
 * row 0 left-padded, row 1 right-padded from 20 (rows 28, 29 of a local layer see no real key),
 * row 2 with a hole; labels are the ids, -100 at padding. */
static const char *padding_batch(void) {
    enum { B = 3, T = 30 };
    static int32_t ids[B * T], labels[B * T], mask[B * T];
    uint64_t s = 3;
    for (int i = 0; i < B * T; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        ids[i] = (int32_t)(s >> 33) % 512, mask[i] = 1;
    }
    ids[5] = ids[T + 5] = ids[T + 12] = ids[2 * T + 5] = 0;
    for (int t = 0; t < 6; t++) mask[t] = 0;
    for (int t = 20; t < T; t++) mask[T + t] = 0;
    mask[2 * T + 10] = mask[2 * T + 11] = 0;
    for (int i = 0; i < B * T; i++) labels[i] = mask[i] ? ids[i] : -100;
    const sbp_st_entry e[3] = {{"input_ids", SBP_DT_I32, 2, {B, T}, ids},
                               {"labels", SBP_DT_I32, 2, {B, T}, labels},
                               {"attention_mask", SBP_DT_I32, 2, {B, T}, mask}};
    const char *path = tu_path("gemma3-padding.safetensors");
    sbp_err err = {0};
    if (sbp_st_write(path, e, 3, NULL, &err)) ck_abort_msg("%s", err.msg);
    return path;
}

/* The engine's cases: batch (NULL: padding_batch()) and arguments of both programs. */
static const struct {
    const char *batch, *args;
} cases[] = {{"data/batches/sft-demo.safetensors", ""},
             {"data/batches/dpo-tiny.safetensors", "--objective dpo"},
             {"data/batches/grpo-tiny.safetensors", "--objective grpo"},
             {NULL, "--unattended zero"},
             {NULL, "--unattended hf-eager"},
             {NULL, "--unattended hf-sdpa"},
             {NULL, "--lora"}}; /* then an adapter on every linear layer, lora_B nonzero */
enum { NCASES = sizeof cases / sizeof cases[0] };

/* torch_grads.py on each case over gemma3-tiny against `streambp grad --precision fp64`, and on
 * data/hf-gemma3 against HF 4.51.3's own float64 gradients (islands patched to float64) of a
 * micro Gemma-3 with linear RoPE x8 on its global layer and a window of 4. Every torch run in
 * one process (--jobs): torch is imported once, not eight times. */
START_TEST(torch_grads_gemma3) {
    if (!have_torch()) return;
    const char *model = tu_model("gemma3-tiny", 7);
    char batch[NCASES][700], args[NCASES][1200], torch_out[700];
    const char *jobs = tu_path("torch-jobs.txt");
    FILE *f = fopen(jobs, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < NCASES; i++) {
        snprintf(batch[i], sizeof batch[i], "%s",
                 cases[i].batch ? cases[i].batch : padding_batch());
        snprintf(args[i], sizeof args[i], "%s", cases[i].args);
        if (!strcmp(cases[i].args, "--lora")) {
            const char *ad = tu_path("adapter");
            int rc = tu_cli("", 60,
                            "lora init --model '%s' --out '%s' --r 4 --targets all-linear "
                            "--b-std 0.1",
                            model, ad);
            ck_assert_msg(rc == 0, "%s: %s", tu_last_cmd(), tu_last_output());
            snprintf(args[i], sizeof args[i], "--lora '%s'", ad);
        }
        fprintf(f, "--model '%s' --batch '%s' %s --out '%s'\n", model, batch[i], args[i],
                tu_path("torch-%d.safetensors", i));
    }
    snprintf(torch_out, sizeof torch_out, "%s", tu_path("torch-hf.safetensors"));
    fprintf(f, "--model data/hf-gemma3 --batch data/hf-gemma3/batch.safetensors --out '%s'\n",
            torch_out);
    ck_assert_int_eq(fclose(f), 0);
    int rc = tu_sh("'%s' verify/torch_grads.py --jobs '%s'", python(), jobs);
    ck_assert_msg(rc == 0, "torch_grads.py --jobs failed (%d): %s", rc, tu_last_output());

    for (int i = 0; i < NCASES; i++) {
        char theirs[700], ours[700];
        snprintf(theirs, sizeof theirs, "%s", tu_path("torch-%d.safetensors", i));
        snprintf(ours, sizeof ours, "%s", tu_path("engine-%d.safetensors", i));
        rc = tu_cli("", 300, "grad --model '%s' --batch '%s' %s --precision fp64 --out '%s'", model,
                    batch[i], args[i], ours);
        ck_assert_msg(rc == 0, "%s: %s", tu_last_cmd(), tu_last_output());
        double lt, le;
        const double worst = compare_files(theirs, ours, &lt, &le);
        ck_assert_msg(fabs(lt - le) <= TOL * fabs(le),
                      "gemma3-tiny %s: loss: torch_grads.py %.17g, engine %.17g", cases[i].args, lt,
                      le);
        printf("torch_grads.py vs grad fp64, gemma3-tiny %s: worst rel. L2 %.2e\n", cases[i].args,
               worst);
    }

    double lt, lh;
    const double worst =
        compare_files(torch_out, "data/hf-gemma3/grads-patched.safetensors", &lt, &lh);
    ck_assert_msg(fabs(lt - lh) <= TOL * fabs(lh), "loss: torch_grads.py %.17g, HF %.17g", lt, lh);
    printf("torch_grads.py vs HF patched float64 (data/hf-gemma3): worst rel. L2 %.2e\n", worst);
    fflush(stdout);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("torchgemma");
    TCase *tc = tcase_create("torchgemma");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, torch_grads_gemma3);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
