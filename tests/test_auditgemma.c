/* test_auditgemma.c — Gemma-3 against Hugging Face transformers without torch: the committed
 * float64 gradients HF 4.51.3 computed for data/hf-gemma3 (python/tests/make_gemma3_fixture.py;
 * docs/gemma3.md says what differs between the two files):
 *  1. the ref/ oracle against HF with its float32 islands patched to float64: every tensor
 *     within float64 rounding (measured 3.7e-15), and the loss;
 *  2. the oracle against stock HF float64: every tensor off by float32-island error (measured
 *     6.6e-8 to 4.9e-7), never float64-close, never wrong;
 *  3. `streambp verify audit` passes the patched file and fails the stock one with the Gemma-3
 *     float32-island diagnosis (the audit's budget is a multiple of the library's own fp64
 *     error, so this needs the engine's Gemma-3 exact too). */
#include "testutil.h"
#include "../ref/ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIR   "data/hf-gemma3"
#define BATCH DIR "/batch.safetensors"

/* The oracle's SFT loss and gradient for the fixture (its own readers). */
static double *truth(double *loss, ref_model *m) {
    sbp_objective o = {.kind = SBP_OBJ_SFT};
    ref_files f = {.model_dir = DIR, .batch_path = BATCH, .o = &o};
    ref_lora la;
    double *g = NULL;
    char mm[512];
    sbp_err err = {0};
    ck_assert_msg(ref_truth_files(loss, &g, m, &la, &f, mm, sizeof mm, &err) == SBP_OK, "%s %s",
                  err.msg, mm);
    return g;
}

/* Per tensor of the oracle's table: the relative L2 of HF's gradient file against g; the
 * smallest and largest into lo, hi; HF's loss (its "loss" metadata) into *hf_loss. */
static void compare(double *lo, double *hi, double *hf_loss, const ref_model *m, const double *g,
                    const char *path) {
    tu_tensors ts;
    tu_tensors_load(&ts, path);
    *lo = INFINITY, *hi = 0;
    for (int i = 0; i < m->ps.n; i++) {
        const sbp_param *p = &m->ps.p[i];
        int k = tu_tensors_index(&ts, p->name);
        ck_assert_int_eq(ts.e[k].dtype, SBP_DT_F64);
        const double *h = ts.data[k];
        double num = 0, den = 0;
        for (int64_t j = 0; j < p->numel; j++) {
            double d = h[j] - g[p->offset + j];
            num += d * d, den += g[p->offset + j] * g[p->offset + j];
        }
        double rel = sqrt(num / den);
        *lo = fmin(*lo, rel), *hi = fmax(*hi, rel);
    }
    ck_assert_int_eq(ts.n, m->ps.n); /* nothing extra: one tied embedding, no lm_head */
    tu_tensors_free(&ts);
    sbp_st_file sf;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_st_open(&sf, path, &err), SBP_OK);
    *hf_loss = NAN;
    for (int i = 0; i < sf.n_meta; i++)
        if (!strcmp(sf.meta_key[i], "loss")) *hf_loss = strtod(sf.meta_val[i], NULL);
    sbp_st_close(&sf);
}

START_TEST(oracle_vs_patched_hf) {
    ref_model m;
    double loss, lo, hi, hf_loss, *g = truth(&loss, &m);
    compare(&lo, &hi, &hf_loss, &m, g, DIR "/grads-patched.safetensors");
    printf("ref/ vs patched HF float64 (data/hf-gemma3): rel. L2 %.3g to %.3g, loss %.3g\n", lo, hi,
           fabs(hf_loss - loss) / loss);
    ck_assert_msg(hi <= 1e-13, "worst tensor %.3g", hi);
    ck_assert_msg(fabs(hf_loss - loss) <= 1e-14 * loss, "loss %.17g vs %.17g", hf_loss, loss);
    free(g);
    ref_model_free(&m);
}
END_TEST

START_TEST(oracle_vs_stock_hf) {
    ref_model m;
    double loss, lo, hi, hf_loss, *g = truth(&loss, &m);
    compare(&lo, &hi, &hf_loss, &m, g, DIR "/grads-stock.safetensors");
    printf("ref/ vs stock HF float64 (data/hf-gemma3): rel. L2 %.3g to %.3g\n", lo, hi);
    ck_assert_msg(lo >= 1e-8 && hi <= 2e-6, "stock HF: %.3g to %.3g", lo, hi);
    /* the loss went through logits.float(): float32 rounding of a float64 value */
    ck_assert_msg(fabs(hf_loss - loss) > 1e-12 * loss && fabs(hf_loss - loss) < 1e-6 * loss,
                  "stock loss %.17g vs %.17g", hf_loss, loss);
    free(g);
    ref_model_free(&m);
}
END_TEST

/* The last 1500 characters of the last command's output (Check limits its messages). */
static const char *tail_out(void) {
    const char *o = tu_last_output();
    size_t n = strlen(o);
    return n > 1500 ? o + n - 1500 : o;
}

/* `verify audit` of a fixture file; its exit status, the output in tu_last_output(). */
static int audit(const char *which) {
    return tu_sh(
        "timeout 300 %s verify audit --model %s --batch %s --grads %s/grads-%s.safetensors "
        "--precision-of-theirs fp64 --json",
        tu_bin(), DIR, BATCH, DIR, which);
}

START_TEST(audit_diagnoses_islands) {
    ck_assert_msg(audit("patched") == 0, "%s", tail_out());
    ck_assert_msg(audit("stock") == 1, "%s", tail_out());
    ck_assert_msg(strstr(tu_last_output(), "Gemma-3: HF") &&
                      strstr(tu_last_output(), "keeps float32 islands"),
                  "%s", tail_out());
    /* the same file claimed as fp32 is within budget: no Gemma-3 island line there */
    ck_assert_int_eq(tu_sh("timeout 300 %s verify audit --model %s --batch %s --grads "
                           "%s/grads-stock.safetensors --precision-of-theirs fp32",
                           tu_bin(), DIR, BATCH, DIR),
                     0);
    ck_assert(!strstr(tu_last_output(), "Gemma-3:"));
}
END_TEST

int main(void) {
    Suite *s = suite_create("auditgemma");
    TCase *tc = tcase_create("hf");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, oracle_vs_patched_hf);
    tcase_add_test(tc, oracle_vs_stock_hf);
    tcase_add_test(tc, audit_diagnoses_islands);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
