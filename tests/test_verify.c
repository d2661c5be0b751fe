/* test_verify.c — the verifier: the default run passes, every edge-case fixture passes, and the
 * comparison and audit commands catch what they promise to catch (a one-ULP change under
 * --bitwise, a 1.001 scale, a layer computed with the StreamBP authors' chunk normalisation). */
#include "../src/io/safetensors.h"
#include "../verify/defaults.h"
#include "../verify/suite.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

START_TEST(default_run_passes) {
    int rc = tu_sh("%s verify", tu_bin());
    ck_assert_msg(rc == 0, "streambp verify exited %d:\n%s", rc, tu_last_output());
    ck_assert_ptr_nonnull(strstr(tu_last_output(), "\nPASS"));
    ck_assert_ptr_nonnull(strstr(tu_last_output(), "ref/ float64 oracle"));
}
END_TEST

START_TEST(suite_case) {
    const sbp_suite_case *k = sbp_suite_case_at(_i);
    char data[512];
    sbp_err err = {0};
    ck_assert_int_eq(sbp_data_dir(data, sizeof data, &err), SBP_OK);
    sbp_verify_report rep;
    if (sbp_suite_run(&rep, _i, "data", tu_tmpdir(), &err))
        ck_abort_msg("%s: %s", k->name, err.msg);
    char why[512] = "";
    for (int g = 0; g < SBP_VG_N; g++)
        for (int i = 0; i < rep.g[g].n_rows; i++)
            if (rep.g[g].rows[i].failed && strlen(why) < 300)
                snprintf(why + strlen(why), sizeof why - strlen(why), " [%s] %s (%s)",
                         rep.g[g].title, rep.g[g].rows[i].name, rep.g[g].rows[i].first_failure);
    ck_assert_msg(rep.failed == 0, "suite case %s (%s) failed:%s", k->name, k->what, why);
    /* the whole matrix, or the one run of a case that restricts it (long-positions) */
    ck_assert_int_gt(rep.n_runs, k->schedules || k->precisions ? 0 : 10);
    sbp_verify_report_free(&rep);
}
END_TEST

/* A float32 gradient file of Qwen3-tiny on sft-tiny; returns its path. */
static const char *grad_file(void) {
    static char path[600];
    snprintf(path, sizeof path, "%s/ours32.safetensors", tu_tmpdir());
    if (!tu_exists(path)) {
        int rc = tu_sh("%s grad --model %s --batch data/batches/sft-tiny.safetensors --block 4 "
                       "--chunk 8 --out %s",
                       tu_bin(), tu_model("qwen3-tiny", 1), path);
        ck_assert_msg(rc == 0, "grad failed: %s", tu_last_output());
    }
    return path;
}

/* Copies src to dst, applying edit(name, data, numel) to every F32 tensor. */
static void edit_copy(const char *src, const char *dst,
                      void (*edit)(const char *name, float *x, int64_t n)) {
    sbp_st_file sf;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_st_open(&sf, src, &err), SBP_OK);
    sbp_st_entry *e = calloc((size_t)sf.n, sizeof *e);
    float **data = calloc((size_t)sf.n, sizeof *data);
    for (int i = 0; i < sf.n; i++) {
        const sbp_st_tensor *t = &sf.t[i];
        ck_assert_int_eq(t->dtype, SBP_DT_F32);
        data[i] = malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1));
        ck_assert_int_eq(sbp_st_read(&sf, t, data[i], SBP_DT_F32, &err), SBP_OK);
        edit(t->name, data[i], t->numel);
        e[i] =
            (sbp_st_entry){.name = t->name, .dtype = SBP_DT_F32, .ndim = t->ndim, .data = data[i]};
        memcpy(e[i].shape, t->shape, sizeof t->shape);
    }
    ck_assert_int_eq(sbp_st_write(dst, e, sf.n, NULL, &err), SBP_OK);
    for (int i = 0; i < sf.n; i++) free(data[i]);
    free(data);
    free(e);
    sbp_st_close(&sf);
}

static const char *victim = "model.layers.1.mlp.up_proj.weight";

static void one_ulp(const char *name, float *x, int64_t n) {
    if (strcmp(name, victim) == 0) x[n / 2] = nextafterf(x[n / 2], INFINITY);
}

static void scale_1001(const char *name, float *x, int64_t n) {
    if (strcmp(name, victim) == 0)
        for (int64_t i = 0; i < n; i++) x[i] *= 1.001f;
}

static void one_nan(const char *name, float *x, int64_t n) {
    if (strcmp(name, victim) == 0) x[n - 1] = NAN;
}

START_TEST(diff_one_ulp) {
    char copy[600];
    snprintf(copy, sizeof copy, "%s/ulp.safetensors", tu_tmpdir());
    edit_copy(grad_file(), copy, one_ulp);
    int rc = tu_sh("%s verify diff --bitwise %s %s", tu_bin(), copy, grad_file());
    ck_assert_msg(rc == 1, "--bitwise on a one-ULP change exited %d:\n%s", rc, tu_last_output());
    ck_assert_ptr_nonnull(strstr(tu_last_output(), victim));
    ck_assert_ptr_nonnull(strstr(tu_last_output(), "first difference at index"));
    rc = tu_sh("%s verify diff --ulp 1 %s %s", tu_bin(), copy, grad_file());
    ck_assert_msg(rc == 0, "--ulp 1 on a one-ULP change exited %d:\n%s", rc, tu_last_output());
    rc = tu_sh("%s verify diff --ulp 0 %s %s", tu_bin(), copy, grad_file());
    ck_assert_int_eq(rc, 1);
}
END_TEST

START_TEST(diff_scaled_tensor) {
    char copy[600];
    snprintf(copy, sizeof copy, "%s/scaled.safetensors", tu_tmpdir());
    edit_copy(grad_file(), copy, scale_1001);
    int rc = tu_sh("%s verify diff %s %s", tu_bin(), copy, grad_file());
    ck_assert_msg(rc == 1, "a 1.001 scale passed the default tolerance:\n%s", tu_last_output());
    /* exactly one failing row, and it is the scaled tensor */
    const char *out = tu_last_output(), *fail = strstr(out, "MISMATCH");
    ck_assert_ptr_nonnull(fail);
    ck_assert_ptr_null(strstr(fail + 1, "MISMATCH"));
    const char *line = fail;
    while (line > out && line[-1] != '\n') line--;
    ck_assert_msg(strncmp(line, victim, strlen(victim)) == 0, "the failing row is not %s:\n%s",
                  victim, out);
    ck_assert_ptr_nonnull(strstr(out, "1 failed"));
}
END_TEST

START_TEST(diff_nan_missing_extra) {
    char copy[600];
    snprintf(copy, sizeof copy, "%s/nan.safetensors", tu_tmpdir());
    edit_copy(grad_file(), copy, one_nan);
    int rc = tu_sh("%s verify diff %s %s", tu_bin(), copy, grad_file());
    ck_assert_int_eq(rc, 1);
    ck_assert_ptr_nonnull(strstr(tu_last_output(), "NON-FINITE"));
    ck_assert_ptr_nonnull(strstr(tu_last_output(), "1 non-finite values in A, the first at index"));
    /* a file of another family has missing and extra tensors */
    char other[600];
    snprintf(other, sizeof other, "%s/qwen2.safetensors", tu_tmpdir());
    ck_assert_int_eq(tu_sh("%s grad --model %s --batch data/batches/sft-tiny.safetensors --out %s",
                           tu_bin(), tu_model("qwen2-tiny", 1), other),
                     0);
    rc = tu_sh("%s verify diff %s %s", tu_bin(), other, grad_file());
    ck_assert_int_eq(rc, 1);
    ck_assert_ptr_nonnull(strstr(tu_last_output(), "q_norm.weight: in B, missing from A"));
    ck_assert_ptr_nonnull(strstr(tu_last_output(), "lm_head.weight: in A, not in B"));
}
END_TEST

/* The StreamBP authors' per-chunk count (a bug of their released code): a logits chunk [s, e) with
 * one overlapping row e' = min(e + 1, T) scores the targets labels[s+1 .. e'), but is weighted
 * by n = #(labels[:, s:e'] != -100) − B instead of their true number. Every target in the chunk
 * therefore carries the factor n / n_true (the chunk is dropped when n <= 0). */
static double *authors_weights(const sbp_batch *b, int chunk) {
    double *w = calloc((size_t)b->B * b->T, sizeof *w);
    for (int s = 0; s < b->T - 1; s += chunk) {
        int e = s + chunk + 1 < b->T ? s + chunk + 1 : b->T;
        int n_true = 0, n_code = -b->B;
        for (int r = 0; r < b->B; r++)
            for (int j = s; j < e; j++) {
                int valid = b->labels[(size_t)r * b->T + j] != SBP_IGNORE;
                n_code += valid;
                n_true += valid && j > s;
            }
        double f = n_true > 0 && n_code > 0 ? (double)n_code / n_true : 0;
        for (int r = 0; r < b->B; r++)
            for (int t = s; t < e - 1; t++) w[(size_t)r * b->T + t] = f;
    }
    return w;
}

START_TEST(audit_ours_theirs_and_a_bug) {
    const char *model = tu_model("qwen3-tiny", 1);
    const char *batch = "data/batches/suite-chunk-starts-on-ignored.safetensors";
    char ours[600], bad[600];
    snprintf(ours, sizeof ours, "%s/audit-ours.safetensors", tu_tmpdir());
    snprintf(bad, sizeof bad, "%s/audit-bad.safetensors", tu_tmpdir());
    ck_assert_int_eq(tu_sh("%s grad --model %s --batch %s --block 4 --chunk 8 --out %s", tu_bin(),
                           model, batch, ours),
                     0);
    int rc =
        tu_sh("%s verify audit --model %s --batch %s --grads %s", tu_bin(), model, batch, ours);
    ck_assert_msg(rc == 0, "audit of our own fp32 gradient exited %d:\n%s", rc, tu_last_output());

    /* layer 1 from the authors' chunk normalisation (logits chunks of 8), the rest correct */
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, model, batch, SBP_FP32);
    double *w = authors_weights(&b, 8);
    sbp_grad_result good, wrong;
    sbp_grad_opts o = {.schedule = SBP_STREAM, .block = 4, .chunk = 8, .logit_chunk = 8};
    sbp_err err = {0};
    ck_assert_int_eq(sbp_grad(&good, &m, &b, &o, NULL, &err), SBP_OK);
    o.objective.target_weight = w;
    ck_assert_int_eq(sbp_grad(&wrong, &m, &b, &o, NULL, &err), SBP_OK);
    for (int i = 0; i < m.params.n; i++)
        if (m.params.p[i].layer == 1)
            memcpy((float *)good.grads + m.params.p[i].offset,
                   (float *)wrong.grads + m.params.p[i].offset,
                   sizeof(float) * (size_t)m.params.p[i].numel);
    ck_assert_int_eq(sbp_grads_save(bad, &m.params, SBP_FP32, good.grads, NULL, &err), SBP_OK);
    rc = tu_sh("%s verify audit --model %s --batch %s --grads %s", tu_bin(), model, batch, bad);
    ck_assert_msg(rc == 1, "audit passed a layer with the authors' normalisation:\n%s",
                  tu_last_output());
    const char *out = tu_last_output();
    ck_assert_ptr_nonnull(strstr(out, "model.layers.1.mlp.down_proj.weight"));
    /* every layer-1 tensor fails, every other passes */
    for (int i = 0; i < m.params.n; i++) {
        const char *row = strstr(out, m.params.p[i].name);
        ck_assert_ptr_nonnull(row);
        const char *nl = strchr(row, '\n');
        int over = strstr(row, "OVER BUDGET") && strstr(row, "OVER BUDGET") < nl;
        ck_assert_msg(over == (m.params.p[i].layer == 1), "%s: %s", m.params.p[i].name,
                      over ? "failed" : "passed");
    }
    sbp_grad_result_free(&good, NULL);
    sbp_grad_result_free(&wrong, NULL);
    free(w);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* The PyTorch cross-check's gradient files pass the audit (float64 and float32, and bf16 against
 * our emulated-bf16 budget). Skipped, saying so, when torch is not installed. */
START_TEST(audit_torch_files) {
    if (!tu_python_has("/usr/bin/python3", "torch")) {
        printf("SKIPPED: PyTorch not installed (python3-torch); audit of torch_grads.py files "
               "not run\n");
        return;
    }
    const char *model = tu_model("llama3-tiny", 1), *batch = "data/batches/sft-demo.safetensors";
    static const char *dtypes[] = {"float64", "float32", "bfloat16"};
    static const char *theirs[] = {"fp64", "fp32", "bf16"};
    /* the three torch runs in one process (--jobs): torch is imported once */
    const char *jobs = tu_path("torch-audit-jobs.txt");
    FILE *jf = fopen(jobs, "w");
    ck_assert_ptr_nonnull(jf);
    for (int i = 0; i < 3; i++)
        fprintf(jf, "--model '%s' --batch '%s' --dtype %s --out '%s/torch-%s.safetensors'\n", model,
                batch, dtypes[i], tu_tmpdir(), dtypes[i]);
    ck_assert_int_eq(fclose(jf), 0);
    int rc = tu_sh("/usr/bin/python3 verify/torch_grads.py --jobs '%s'", jobs);
    ck_assert_msg(rc == 0, "torch_grads.py --jobs: %s", tu_last_output());
    for (int i = 0; i < 3; i++) {
        char out[600];
        snprintf(out, sizeof out, "%s/torch-%s.safetensors", tu_tmpdir(), dtypes[i]);
        rc = tu_sh("%s verify audit --model %s --batch %s --grads %s --precision-of-theirs %s",
                   tu_bin(), model, batch, out, theirs[i]);
        ck_assert_msg(rc == 0, "audit of torch %s exited %d:\n%s", dtypes[i], rc, tu_last_output());
    }
}
END_TEST

START_TEST(fd_default_passes) {
    int rc = tu_sh("%s verify fd", tu_bin());
    ck_assert_msg(rc == 0, "verify fd exited %d:\n%s", rc, tu_last_output());
    ck_assert_ptr_nonnull(strstr(tu_last_output(), "(all parameters)"));
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("verify");
    TCase *tc = tcase_create("commands");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, default_run_passes);
    tcase_add_test(tc, diff_one_ulp);
    tcase_add_test(tc, diff_scaled_tensor);
    tcase_add_test(tc, diff_nan_missing_extra);
    tcase_add_test(tc, audit_ours_theirs_and_a_bug);
    tcase_add_test(tc, audit_torch_files);
    tcase_add_test(tc, fd_default_passes);
    suite_add_tcase(s, tc);
    TCase *sc = tcase_create("suite");
    tcase_set_timeout(sc, 120);
    tcase_add_loop_test(sc, suite_case, 0, sbp_suite_count());
    suite_add_tcase(s, sc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
