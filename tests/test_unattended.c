/* test_unattended.c — attention rows that see no key (--unattended zero|hf-eager|hf-sdpa).
 *
 * On left-padded batches whose first real token is predicted from a pad position:
 *  - every mode is exact across the schedules: bitwise in fast numerics at block-multiple
 *    chunks, bitwise in portable numerics at every chunk (chunks that split the pad rows
 *    included), and the CUDA kernels in the emulator give the portable CPU run's bits;
 *  - the modes differ from each other exactly where they should (the loss and the gradients
 *    change; a batch without such rows does not change at all);
 *  - float64 gradients agree with verify/torch_grads.py, an independent PyTorch implementation
 *    of HF's two mechanisms (the eager path's additive finite-minimum mask, the sdpa path's
 *    unmasked rows), to 1e-10 relative L2 per tensor (skipped when torch is not installed). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *families[] = {"qwen3-tiny", "qwen2-tiny", "llama3-tiny"};
static const char *batches[] = {"data/batches/suite-target-from-padding.safetensors",
                                "data/batches/suite-unattended-left-pad.safetensors"};

static void grad(sbp_grad_result *r, const sbp_model *m, const sbp_batch *b, sbp_unattended u,
                 sbp_numerics n, sbp_schedule s, int chunk, int logit_chunk, sbp_device dev) {
    sbp_grad_opts o = {.schedule = s,
                       .block = 4,
                       .chunk = chunk,
                       .logit_chunk = logit_chunk,
                       .numerics = n,
                       .device = dev,
                       .unattended = u};
    sbp_err err = {0};
    if (sbp_grad(r, m, b, &o, NULL, &err))
        ck_abort_msg("sbp_grad (%s, %s chunk %d): %s", sbp_unattended_name(u), sbp_schedule_name(s),
                     chunk, err.msg);
}

static void assert_same(const sbp_model *m, const sbp_grad_result *a, const sbp_grad_result *b,
                        const char *what) {
    int i = tu_first_diff(m, a->grads, b->grads);
    ck_assert_msg(i < 0, "%s: %s differs", what, i < 0 ? "" : m->params.p[i].name);
    ck_assert_msg(memcmp(&a->loss, &b->loss, sizeof a->loss) == 0, "%s: loss %.17g vs %.17g", what,
                  a->loss, b->loss);
}

/* _i: family (_i / 4), batch (_i / 2 % 2), precision (_i % 2) */
START_TEST(exact_across_schedules_and_devices) {
    const char *family = families[_i / 4], *batch = batches[_i / 2 % 2];
    const sbp_precision prec = _i % 2 ? SBP_FP64 : SBP_FP32;
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model(family, 5), batch, prec);
    int64_t rows, targets;
    sbp_batch_count_unattended(&b, &rows, &targets);
    ck_assert_msg(rows > 0 && targets > 0, "%s: no target predicted from a row without a key",
                  batch);
    sbp_grad_result zero;
    grad(&zero, &m, &b, SBP_UNATTENDED_ZERO, SBP_NUMERICS_FAST, SBP_FULL, 0, 0, SBP_DEVICE_CPU);
    for (sbp_unattended u = SBP_UNATTENDED_HF_EAGER; u <= SBP_UNATTENDED_HF_SDPA; u++) {
        char what[200];
        sbp_grad_result ref, r;
        grad(&ref, &m, &b, u, SBP_NUMERICS_FAST, SBP_FULL, 0, 0, SBP_DEVICE_CPU);
        ck_assert_msg(ref.loss != zero.loss, "%s %s: the loss does not change with %s", family,
                      batch, sbp_unattended_name(u));
        static const int fast_chunks[] = {4, 8, 12};
        for (int c = 0; c < 3; c++) {
            snprintf(what, sizeof what, "%s %s %s fast stream chunk %d", family, batch,
                     sbp_unattended_name(u), fast_chunks[c]);
            grad(&r, &m, &b, u, SBP_NUMERICS_FAST, SBP_STREAM, fast_chunks[c], 4, SBP_DEVICE_CPU);
            assert_same(&m, &ref, &r, what);
            sbp_grad_result_free(&r, NULL);
        }
        sbp_grad_result pref;
        grad(&pref, &m, &b, u, SBP_NUMERICS_PORTABLE, SBP_FULL, 0, 0, SBP_DEVICE_CPU);
        static const int chunks[] = {1, 2, 3, 7, 8};
        for (int c = 0; c < 5; c++) {
            snprintf(what, sizeof what, "%s %s %s portable stream chunk %d", family, batch,
                     sbp_unattended_name(u), chunks[c]);
            grad(&r, &m, &b, u, SBP_NUMERICS_PORTABLE, SBP_STREAM, chunks[c], 3, SBP_DEVICE_CPU);
            assert_same(&m, &pref, &r, what);
            sbp_grad_result_free(&r, NULL);
        }
        snprintf(what, sizeof what, "%s %s %s cuda-emu stream chunk 3", family, batch,
                 sbp_unattended_name(u));
        grad(&r, &m, &b, u, SBP_NUMERICS_PORTABLE, SBP_STREAM, 3, 5, SBP_DEVICE_CUDA_EMU);
        assert_same(&m, &pref, &r, what);
        sbp_grad_result_free(&r, NULL);
        sbp_grad_result_free(&pref, NULL);
        sbp_grad_result_free(&ref, NULL);
    }
    sbp_grad_result_free(&zero, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* A batch without left padding: every mode gives the very same bits. */
START_TEST(no_such_rows_no_change) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model("llama3-tiny", 5), "data/batches/suite-right-padding.safetensors",
            SBP_FP32);
    int64_t rows, targets;
    sbp_batch_count_unattended(&b, &rows, &targets);
    ck_assert_int_eq(rows, 0);
    sbp_grad_result a, r;
    grad(&a, &m, &b, SBP_UNATTENDED_ZERO, SBP_NUMERICS_FAST, SBP_STREAM, 8, 4, SBP_DEVICE_CPU);
    for (sbp_unattended u = SBP_UNATTENDED_HF_EAGER; u <= SBP_UNATTENDED_HF_SDPA; u++) {
        grad(&r, &m, &b, u, SBP_NUMERICS_FAST, SBP_STREAM, 8, 4, SBP_DEVICE_CPU);
        assert_same(&m, &a, &r, sbp_unattended_name(u));
        sbp_grad_result_free(&r, NULL);
    }
    sbp_grad_result_free(&a, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* float64 against torch_grads.py --unattended, every mode, both batches, every family. */
START_TEST(against_pytorch) {
    if (!tu_python_has("/usr/bin/python3", "torch")) {
        printf(
            "SKIPPED: PyTorch not installed (python3-torch); --unattended cross-check not run\n");
        return;
    }
    static const char *modes[] = {"zero", "hf-eager", "hf-sdpa"};
    /* every torch run in one process (--jobs): torch is imported once, not 18 times */
    const char *jobs = tu_path("torch-unattended-jobs.txt");
    FILE *jf = fopen(jobs, "w");
    ck_assert_ptr_nonnull(jf);
    for (int f = 0; f < 3; f++)
        for (int k = 0; k < 2; k++)
            for (int u = 0; u < 3; u++)
                fprintf(jf, "--model '%s' --batch %s --unattended %s --threads 1 --out '%s'\n",
                        tu_model(families[f], 5), batches[k], modes[u],
                        tu_path("torch-%d-%d-%d.safetensors", f, k, u));
    ck_assert_int_eq(fclose(jf), 0);
    if (tu_sh("/usr/bin/python3 verify/torch_grads.py --jobs '%s'", jobs))
        ck_abort_msg("torch_grads.py --jobs: %s", tu_last_output());
    double worst = 0;
    for (int f = 0; f < 3; f++)
        for (int k = 0; k < 2; k++)
            for (int u = 0; u < 3; u++) {
                const char *ours = tu_path("ours-%d-%d-%d.safetensors", f, k, u);
                const char *theirs = tu_path("torch-%d-%d-%d.safetensors", f, k, u);
                const char *model = tu_model(families[f], 5);
                if (tu_sh("'%s' grad --model '%s' --batch %s --unattended %s --precision fp64 "
                          "--schedule stream --chunk 4 --logit-chunk 4 --block 4 --out '%s'",
                          tu_bin(), model, batches[k], modes[u], ours))
                    ck_abort_msg("grad: %s", tu_last_output());
                int rc = tu_sh("'%s' verify diff --rel-l2 1e-10 '%s' '%s'", tu_bin(), ours, theirs);
                ck_assert_msg(rc == 0, "%s %s %s: not within 1e-10 of PyTorch:\n%s", families[f],
                              batches[k], modes[u], tu_last_output());
                tu_tensors ta, tb;
                tu_tensors_load(&ta, ours);
                tu_tensors_load(&tb, theirs);
                for (int i = 0; i < ta.n; i++) {
                    const double *a = ta.data[i], *b2 = tb.data[tu_tensors_index(&tb, ta.names[i])];
                    double num = 0, den = 0;
                    for (int64_t j = 0; j < (int64_t)(ta.e[i].shape[0] *
                                                      (ta.e[i].ndim > 1 ? ta.e[i].shape[1] : 1));
                         j++)
                        num += (a[j] - b2[j]) * (a[j] - b2[j]), den += b2[j] * b2[j];
                    if (den > 0) worst = fmax(worst, sqrt(num / den));
                }
                tu_tensors_free(&ta);
                tu_tensors_free(&tb);
            }
    printf("--unattended vs torch_grads.py (fp64, 3 families x 2 batches x 3 modes): worst "
           "per-tensor rel. L2 %.2e\n",
           worst);
    /* HF-sdpa gradients audited under the default mode fail, and the audit says why */
    const char *sdpa = tu_path("torch-0-0-2.safetensors");
    int rc =
        tu_sh("'%s' verify audit --model '%s' --batch %s --grads '%s' --precision-of-theirs fp64 "
              "--no-ref",
              tu_bin(), tu_model(families[0], 5), batches[0], sdpa);
    ck_assert_msg(rc == 1 && strstr(tu_last_output(), "see no key") &&
                      strstr(tu_last_output(), "--unattended hf-eager or hf-sdpa"),
                  "audit of an hf-sdpa file under --unattended zero (exit %d):\n%s", rc,
                  tu_last_output());
    rc = tu_sh("'%s' verify audit --model '%s' --batch %s --grads '%s' --precision-of-theirs fp64 "
               "--no-ref --unattended hf-sdpa",
               tu_bin(), tu_model(families[0], 5), batches[0], sdpa);
    ck_assert_msg(rc == 0, "audit with --unattended hf-sdpa (exit %d):\n%s", rc, tu_last_output());
}
END_TEST

/* grad says when a batch has such rows, and which mode their values follow. */
START_TEST(grad_reports_the_rows) {
    ck_assert_int_eq(tu_sh("'%s' grad --model '%s' --batch %s --unattended hf-sdpa", tu_bin(),
                           tu_model("qwen3-tiny", 5), batches[0]),
                     0);
    ck_assert_msg(strstr(tu_last_output(), "see no key") &&
                      strstr(tu_last_output(), "--unattended hf-sdpa"),
                  "%s", tu_last_output());
    ck_assert_int_eq(tu_sh("'%s' grad --model '%s' --batch %s --unattended sdpa", tu_bin(),
                           tu_model("qwen3-tiny", 5), batches[0]),
                     2);
    ck_assert_msg(strstr(tu_last_output(), "zero, hf-eager or hf-sdpa"), "%s", tu_last_output());
}
END_TEST

/* Under the sanitizers (slow emulator, slow everything) one family: both batches and precisions. */
#if defined(__SANITIZE_ADDRESS__)
enum { N_EXACT = 4 };
#else
enum { N_EXACT = 12 };
#endif

static Suite *suite(void) {
    Suite *s = suite_create("unattended");
    TCase *tc = tcase_create("modes");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, exact_across_schedules_and_devices, 0, N_EXACT);
    tcase_add_test(tc, no_such_rows_no_change);
    tcase_add_test(tc, against_pytorch);
    tcase_add_test(tc, grad_reports_the_rows);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
