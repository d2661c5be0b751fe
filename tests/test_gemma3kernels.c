/* test_gemma3kernels.c — the kernels Gemma-3 adds (issue 34), in float64 (the test is compiled
 * with -DSBP_REAL_F64, so `real` is double and the calls go to the float64 kernel objects):
 *  - the portable tanh of pmath.h against libm's, in double and in float;
 *  - GeGLU (gelu_pytorch_tanh(g) ⊙ u): the forward against a naive formula with libm's tanh, the
 *    backward against central finite differences;
 *  - the (1 + w) RMSNorm as the engine forms it (the rmsnorm kernel with weights 1 + w): the
 *    gradient of w against finite differences.
 * Finite differences as tests/test_kernels.c forms them (outputs differenced before the weighted
 * sum), h = 1e-5; bounds |fd − g| ≤ atol + rtol·|g| at about 10× the measured worst case. */
#include "testutil.h"
#include "../src/core/rng.h"
#include "../src/kernels/kernels.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(real) == sizeof(double), "tests/test_gemma3kernels.c needs -DSBP_REAL_F64");

#define FD_H 1e-5

static double *rnd(size_t n, double scale, uint64_t seed) {
    double *x = malloc(sizeof *x * n);
    ck_assert_ptr_nonnull(x);
    sbp_rng r;
    sbp_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = scale * sbp_rng_normal(&r);
    return x;
}

/* ulps between a and b at b's magnitude */
static double ulps(double a, double b) {
    if (a == b) return 0;
    return fabs(a - b) / (nextafter(fabs(b), INFINITY) - fabs(b));
}

static double ulpsf(float a, float b) {
    if (a == b) return 0;
    return fabs((double)a - b) / (nextafterf(fabsf(b), INFINITY) - fabsf(b));
}

START_TEST(tanh_accuracy) {
    double worst = 0, worstf = 0, at = 0, atf = 0;
    for (int i = -300000; i <= 300000; i++) {
        /* dense near 0 (where the naive 1 − 2/(e^{2x}+1) loses everything), then out to ±30 */
        const double x = i * 1e-4 * (1 + fabs(i * 1e-4)), y = sbp_ptanh(x);
        const double e = ulps(y, tanh(x));
        if (e > worst) worst = e, at = x;
        const float xf = (float)x, ef = (float)ulpsf(sbp_ptanhf(xf), (float)tanh((double)xf));
        if (ef > worstf) worstf = ef, atf = x;
    }
    static const double special[] = {0.0, -0.0, 1e-300, -1e-300, 5e-324, 1e-10, 0.5, 22, 23, 1e300};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) {
        const double x = special[i];
        ck_assert_msg(ulps(sbp_ptanh(x), tanh(x)) <= 2, "tanh(%g): %.17g, libm %.17g", x,
                      sbp_ptanh(x), tanh(x));
        ck_assert(sbp_ptanh(-x) == -sbp_ptanh(x));
    }
    ck_assert(isnan(sbp_ptanh(NAN)) && sbp_ptanh(INFINITY) == 1 && sbp_ptanh(-INFINITY) == -1);
    printf("tanh: worst %.2f ulp (x = %g); float worst %.2f ulp (x = %g)\n", worst, at, worstf,
           atf);
    ck_assert_msg(worst <= 4, "sbp_ptanh: %.2f ulp at %g", worst, at);
    ck_assert_msg(worstf <= 1, "sbp_ptanhf: %.2f ulp at %g", worstf, atf);
}
END_TEST

/* torch's gelu(x, approximate="tanh"), written from its documentation with libm */
static double gelu_naive(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

START_TEST(geglu_forward_naive) {
    const size_t n = 4096;
    double *g = rnd(n, 3, 1), *u = rnd(n, 1, 2), *h = calloc(n, sizeof *h);
    g[0] = 0, g[1] = -0.0, g[2] = 30, g[3] = -30, g[4] = 1e-20;
    geglu_forward(h, g, u, n);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        /* a few ulps of tanh near −1 are large against 1 + tanh: bound the error by the
         * ulps of the factors, 0.5·|g·u|·(4 ulp of tanh), plus a few of the result */
        const double want = gelu_naive(g[i]) * u[i], err = fabs(h[i] - want);
        const double bound =
            0.5 * fabs(g[i] * u[i]) * 4 * DBL_EPSILON + 4 * DBL_EPSILON * fabs(want);
        worst = fmax(worst, err / fmax(bound, 1e-300));
        ck_assert_msg(err <= bound, "geglu(%g)·%g = %.17g, naive %.17g", g[i], u[i], h[i], want);
    }
    printf("geglu forward: worst error %.2f of its bound against the naive formula\n", worst);
    free(g), free(u), free(h);
}
END_TEST

/* L = Σ r ⊙ h(g, u); the backward with dh = r against central differences of h. */
START_TEST(geglu_backward_fd) {
    const size_t n = 512;
    double *g = rnd(n, 2.5, 3), *u = rnd(n, 1, 4), *r = rnd(n, 1, 5);
    double *dg = calloc(n, sizeof *dg), *du = calloc(n, sizeof *du);
    double hp, hm, worst = 0;
    for (size_t i = 0; i < n; i++) dg[i] = 0.25, du[i] = -0.5; /* the backward accumulates */
    geglu_backward(dg, du, r, g, u, n);
    for (size_t i = 0; i < n; i++) {
        for (int which = 0; which < 2; which++) {
            double *x = which ? &u[i] : &g[i], x0 = *x;
            *x = x0 + FD_H;
            geglu_forward(&hp, &g[i], &u[i], 1);
            const double xp = *x;
            *x = x0 - FD_H;
            geglu_forward(&hm, &g[i], &u[i], 1);
            const double xm = *x;
            *x = x0;
            const double fd = r[i] * (hp - hm) / (xp - xm);
            const double an = which ? du[i] + 0.5 : dg[i] - 0.25;
            worst = fmax(worst, fabs(fd - an));
            ck_assert_msg(fabs(fd - an) <= 2e-9 + 1e-7 * fabs(an),
                          "d/d%s at g = %g: analytic %.12g, central difference %.12g",
                          which ? "u" : "g", g[i], an, fd);
        }
    }
    printf("geglu backward: worst |fd - g| %.2e\n", worst);
    free(g), free(u), free(r), free(dg), free(du);
}
END_TEST

/* y = x̂·(1 + w), the engine's Gemma3RMSNorm: the rmsnorm kernel with weights 1 + w. Its dw is the
 * gradient of w (d(1 + w)/dw = 1), its dx uses 1 + w: both against finite differences in w and x.
 */
static void norm1p_forward(double *y, double *rstd, const double *x, const double *w, int M,
                           int C) {
    double w1[C];
    for (int c = 0; c < C; c++) w1[c] = 1 + w[c];
    rmsnorm_forward(y, rstd, x, w1, M, C, 1e-6);
}

START_TEST(norm1p_fd) {
    enum { M = 5, C = 24 };
    double *x = rnd(M * C, 1, 6), *w = rnd(C, 0.1, 7), *r = rnd(M * C, 1, 8);
    double y[M * C], yp[M * C], ym[M * C], rstd[M], dx[M * C] = {0}, dw[C] = {0}, w1[C];
    norm1p_forward(y, rstd, x, w, M, C);
    for (int c = 0; c < C; c++) w1[c] = 1 + w[c];
    rmsnorm_backward(dx, dw, r, x, rstd, w1, M, C);
    double worst = 0;
    for (int i = 0; i < C + M * C; i++) {
        double *p = i < C ? &w[i] : &x[i - C], p0 = *p;
        *p = p0 + FD_H;
        norm1p_forward(yp, rstd, x, w, M, C);
        const double pp = *p;
        *p = p0 - FD_H;
        norm1p_forward(ym, rstd, x, w, M, C);
        const double pm = *p;
        *p = p0;
        double fd = 0;
        for (int j = 0; j < M * C; j++) fd += r[j] * (yp[j] - ym[j]);
        fd /= pp - pm;
        const double an = i < C ? dw[i] : dx[i - C];
        worst = fmax(worst, fabs(fd - an));
        ck_assert_msg(fabs(fd - an) <= 2e-9 + 1e-7 * fabs(an),
                      "%s[%d]: analytic %.12g, central difference %.12g", i < C ? "dw" : "dx",
                      i < C ? i : i - C, an, fd);
    }
    /* and the forward is x̂·(1 + w), not x̂·w */
    double ss = 0;
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    ck_assert(fabs(y[0] - x[0] / sqrt(ss / C + 1e-6) * (1 + w[0])) <= 1e-14);
    printf("(1 + w) rmsnorm: worst |fd - g| %.2e\n", worst);
    free(x), free(w), free(r);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("gemma3kernels");
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, tanh_accuracy);
    tcase_add_test(tc, geglu_forward_naive);
    tcase_add_test(tc, geglu_backward_fd);
    tcase_add_test(tc, norm1p_fd);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
