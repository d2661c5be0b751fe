/* test_verifyoptim.c — `streambp verify optim` (issue 35 item 17): the library's optimizer steps
 * against the float64 oracle of ref/adamw.c, and the comparison's power to see a wrong formula
 * (a bias correction one step off, a perturbed moment). */
#include "testutil.h"
#include "../ref/ref.h"
#include "../verify/optim.h"

#include <string.h>

START_TEST(optim_passes) {
    sbp_optim_report rep;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_verify_optim(&rep, &err), 0);
    ck_assert_int_eq(rep.n, 4);
    ck_assert_int_eq(rep.failed, 0);
    for (int i = 0; i < rep.n; i++)
        for (int q = 0; q < SBP_OQ_N; q++) ck_assert(rep.c[i].worst[q] <= rep.c[i].budget);
    /* the full-weights cases clip, the adapter cases do not: both branches are exercised */
    ck_assert(rep.c[0].norm[0] > rep.c[0].max_norm);
    ck_assert(rep.c[2].norm[0] < rep.c[2].max_norm);
}
END_TEST

/* One tensor of n elements, two library steps against the oracle: exact step count passes,
 * a bias correction one step off or a perturbed moment fails the fp64 budget. */
START_TEST(wrong_formula_detected) {
    enum { N = 64 };
    sbp_param par = {.name = "w", .ndim = 1, .shape = {N}, .numel = N, .offset = 0};
    sbp_params ps = {.p = &par, .n = 1, .total = N};
    sbp_adamw_opts o = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
    sbp_adamw a;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_adamw_init(&a, &o, SBP_FP64, N, NULL, &err), 0);
    double w[N], g[N], p[N], p0[N], m[N] = {0}, v[N] = {0}, pb[N], mb[N] = {0}, vb[N] = {0};
    unsigned char decay[N];
    memset(decay, 1, N);
    for (int i = 0; i < N; i++) w[i] = p[i] = p0[i] = pb[i] = 0.01 * (i - 30);
    for (int k = 1; k <= 2; k++) {
        for (int i = 0; i < N; i++) g[i] = 0.001 * ((i * 7 + k) % 13 - 6);
        sbp_adamw_step(&a, w, g, 1e-2);
        ref_adamw_step(p, m, v, g, decay, N, k, &o, 1e-2);
        ref_adamw_step(pb, mb, vb, g, decay, N, k + 1, &o, 1e-2); /* wrong bias correction */
    }
    int t;
    ck_assert(sbp_optim_diff(&ps, w, SBP_FP64, p, p0, &t) <= SBP_OPTIM_BUDGET64);
    ck_assert(sbp_optim_diff(&ps, a.exp_avg, SBP_FP64, m, NULL, &t) <= SBP_OPTIM_BUDGET64);
    ck_assert(sbp_optim_diff(&ps, a.exp_avg_sq, SBP_FP64, v, NULL, &t) <= SBP_OPTIM_BUDGET64);
    ck_assert(sbp_optim_diff(&ps, w, SBP_FP64, pb, p0, &t) > SBP_OPTIM_BUDGET32);
    m[5] *= 1 + 1e-9; /* a perturbed moment */
    ck_assert(sbp_optim_diff(&ps, a.exp_avg, SBP_FP64, m, NULL, &t) > SBP_OPTIM_BUDGET64);
    sbp_adamw_free(&a, NULL);
}
END_TEST

START_TEST(cli_optim) {
    ck_assert_int_eq(tu_sh("timeout 60 %s verify optim", tu_bin()), 0);
    ck_assert_ptr_nonnull(strstr(tu_last_output(), "4/4 cases pass"));
    ck_assert_int_eq(tu_sh("timeout 60 %s verify optim --bogus", tu_bin()), 2);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("verifyoptim");
    TCase *tc = tcase_create("optim");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, optim_passes);
    tcase_add_test(tc, wrong_formula_detected);
    tcase_add_test(tc, cli_optim);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
