/* test_profile.c — the operations' profile (sbp_grad_opts.profile, src/engine/ops/profile.c):
 *  - a profiled step gives the same bits (gradient and loss) as an unprofiled one, fast and
 *    portable, full and stream, on a Llama-style and a Gemma-3 model;
 *  - the floating-point operations it counts over the products and the attention equal the FLOP
 *    count of the step (src/core/flops.c), which is computed from the config alone: each
 *    counts what the other should;
 *  - its times add up: every row's seconds >= 0, their sum within the engine's run, one run a
 *    step, the products by shape;
 *  - a device step with a profile is refused, naming it; and the bench command prints it. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static const sbp_profile_row *find(const sbp_profile *p, const char *op, int n, int k) {
    for (int i = 0; i < p->n_rows; i++)
        if (!strcmp(p->rows[i].op, op) && p->rows[i].n == n && p->rows[i].k == k)
            return &p->rows[i];
    return NULL;
}

static void check(const char *family, sbp_numerics num, sbp_schedule s) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model(family, 3), "data/batches/sft-tiny.safetensors", SBP_FP32);
    const sbp_grad_opts o = {
        .schedule = s, .block = 4, .chunk = 8, .logit_chunk = 8, .numerics = num};
    sbp_grad_result plain, timed;
    tu_grad_opts(&plain, &m, &b, o);
    sbp_profile *p = calloc(1, sizeof *p);
    ck_assert_ptr_nonnull(p);
    sbp_grad_opts op = o;
    op.profile = p;
    tu_grad_opts(&timed, &m, &b, op);
    const int d = tu_first_diff(&m, plain.grads, timed.grads);
    ck_assert_msg(d < 0, "%s %s: the profiled gradient of %s differs", family, sbp_schedule_name(s),
                  d < 0 ? "" : m.params.p[d].name);
    ck_assert(memcmp(&plain.loss, &timed.loss, sizeof plain.loss) == 0);

    ck_assert_int_eq(p->steps, 1);
    ck_assert_int_eq(p->lost, 0);
    double sum = 0, flop = 0;
    for (int i = 0; i < p->n_rows; i++) {
        const sbp_profile_row *r = &p->rows[i];
        ck_assert_msg(r->calls > 0 && r->seconds >= 0, "%s: %lld calls, %g s", r->op,
                      (long long)r->calls, r->seconds);
        ck_assert_msg((r->flop > 0) ==
                          (!strncmp(r->op, "linear_", 7) || !strncmp(r->op, "attention_", 10)),
                      "%s counts %g flop", r->op, r->flop);
        sum += r->seconds, flop += r->flop;
    }
    ck_assert_msg(sum <= p->seconds, "operations %g s > the run's %g s", sum, p->seconds);
    const sbp_config *c = &m.cfg;
    /* the LM head: forward, and a backward with dX and dW */
    const sbp_profile_row *head = find(p, "linear_backward", c->vocab, c->hidden);
    ck_assert_ptr_nonnull(head);
    ck_assert(find(p, "attention_forward", 0, 0) && find(p, "attention_backward", 0, 0));
    ck_assert_double_eq_tol(head->flop, 4.0 * b.B * b.T * c->vocab * c->hidden, 0.5);
    const double want = sbp_step_flops(c, b.B, b.T, &o);
    ck_assert_msg(flop == want, "%s %s %s: the profile counts %.17g flop, the step %.17g", family,
                  sbp_numerics_name(num), sbp_schedule_name(s), flop, want);
    free(p);
    sbp_grad_result_free(&plain, NULL), sbp_grad_result_free(&timed, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}

START_TEST(same_bits_and_the_step_flops) {
    static const char *fam[] = {"llama3-tiny", "gemma3-tiny"};
    for (int f = 0; f < 2; f++)
        for (int num = 0; num < 2; num++) {
            check(fam[f], (sbp_numerics)num, SBP_FULL);
            check(fam[f], (sbp_numerics)num, SBP_STREAM);
        }
}
END_TEST

START_TEST(a_device_step_is_refused) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model("llama3-tiny", 3), "data/batches/sft-tiny.safetensors", SBP_FP32);
    sbp_profile p = {0};
    const sbp_grad_opts o = {.schedule = SBP_FULL,
                             .numerics = SBP_NUMERICS_PORTABLE,
                             .device = SBP_DEVICE_CUDA_EMU,
                             .profile = &p};
    sbp_grad_result r;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_grad(&r, &m, &b, &o, NULL, &err), SBP_EUSAGE);
    ck_assert_msg(strstr(err.msg, "profile"), "%s", err.msg);
    ck_assert_int_eq(p.steps, 0);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

START_TEST(bench_prints_it) {
    tu_expect_usage("--profile prints in the text and JSON forms",
                    "bench --config data/models/qwen3-tiny.json --seq 16 --profile --csv");
    tu_check_run(tu_cli("", 300,
                        "bench --config data/models/qwen3-tiny.json --seq 16 --block 8 "
                        "--schedules stream --numerics fast --reps 2 --no-train --threads 1 "
                        "--profile"),
                 0, "operation", "linear_backward", "attention_forward", "between the operations",
                 "the engine's run");
    ck_assert_msg(strstr(tu_last_output(), "(mean of 2)"), "%s", tu_last_output());
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("profile");
    TCase *tc = tcase_create("profile");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, same_bits_and_the_step_flops);
    tcase_add_test(tc, a_device_step_is_refused);
    tcase_add_test(tc, bench_prints_it);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
