/* test_elementwise.c — the CPU op tables' elementwise passes (zero, copy, add, axpy, scale;
 * src/engine/ops/cpu.c) run on every thread above a size threshold: each element must come out
 * as the one-thread loop gives it, none missed, none written twice in a wrong place, nothing
 * outside [0, n) touched, at every thread count and at sizes around the threshold and the
 * threads' 16-element cut points. The engine's own tests (schedules, golden) run models too
 * small to cross the threshold, so this is the only test of the parallel path.
 *
 * Compiled with -DSBP_REAL_F64 (real = double): the calls go to the float64 engine's tables. */
#include "testutil.h"
#include "../src/engine/engine.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

enum { GUARD = 40 }; /* reals on each side of the range that must stay untouched */

/* sizes: below, at and past the threshold (2^16), ragged against 16-element units and threads */
static const size_t sizes[] = {1, 17, 65535, 65536, 65537, 65536 + 15, 3 * 65536 + 7, 400009};

static double val(size_t i, int salt) {
    return sin((double)(i * 7 + (size_t)salt * 13) * 0.001) * 3 - 0.25;
}

/* buf: GUARD, then n reals, then GUARD; guards hold a pattern, the range its salt's values */
static double *fresh(size_t n, int salt) {
    double *b = malloc(sizeof(double) * (n + 2 * GUARD));
    ck_assert_ptr_nonnull(b);
    for (size_t i = 0; i < n + 2 * GUARD; i++) b[i] = val(i, salt);
    for (int g = 0; g < GUARD; g++) b[g] = b[n + GUARD + g] = -777.0 - g;
    return b;
}

static void check_guards(const double *b, size_t n, const char *what, int th) {
    for (int g = 0; g < GUARD; g++) {
        ck_assert_msg(b[g] == -777.0 - g, "%s, %d threads, n %zu: wrote before the range", what, th,
                      n);
        ck_assert_msg(b[n + GUARD + g] == -777.0 - g, "%s, %d threads, n %zu: wrote past the range",
                      what, th, n);
    }
}

/* the same bytes as the one-thread loop */
static void check_equal(const double *got, const double *want, size_t n, const char *what, int th) {
    ck_assert_msg(!memcmp(got, want, sizeof(double) * n), "%s, %d threads, n %zu: differs", what,
                  th, n);
}

START_TEST(elementwise_parallel_bits) {
    const sbp_ops *ops[] = {&sbp_ops_cpu_fast, &sbp_ops_cpu_portable};
    const sbp_ops *op = ops[_i];
    eng e;
    memset(&e, 0, sizeof e); /* the elementwise ops read e->bf16 only */
    const double a = -0.3125;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const size_t n = sizes[k];
        double *x = fresh(n, 1), *b = fresh(n, 3);
        double *want = malloc(sizeof(double) * (n + 1));
        ck_assert_ptr_nonnull(want);
        double *xr = x + GUARD, *br = b + GUARD;
        for (int th = 1; th <= 3; th++) {
            omp_set_num_threads(th);
            double *out = fresh(n, 4), *o = out + GUARD;
            op->zero(&e, o, n);
            for (size_t i = 0; i < n; i++) want[i] = 0;
            check_equal(o, want, n, "zero", th), check_guards(out, n, "zero", th);
            op->copy(&e, o, xr, n);
            check_equal(o, xr, n, "copy", th), check_guards(out, n, "copy", th);
            op->add(&e, o, xr, br, n);
            for (size_t i = 0; i < n; i++) want[i] = xr[i] + br[i];
            check_equal(o, want, n, "add", th), check_guards(out, n, "add", th);
            op->axpy(&e, o, a, br, n);
            for (size_t i = 0; i < n; i++) want[i] = want[i] + br[i] * a;
            check_equal(o, want, n, "axpy", th), check_guards(out, n, "axpy", th);
            op->scale(&e, o, a, n);
            for (size_t i = 0; i < n; i++) want[i] = want[i] * a;
            check_equal(o, want, n, "scale", th), check_guards(out, n, "scale", th);
            free(out);
        }
        omp_set_num_threads(2);
        free(x), free(b), free(want);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("elementwise");
    TCase *tc = tcase_create("parallel");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, elementwise_parallel_bits, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
