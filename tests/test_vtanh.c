/* test_vtanh.c — GELU's vectorized tanh (src/kernels/vtanh.h) against gelu.h's scalar
 * gelu_tanh_t, bit for bit, and geglu.c's blocks against the scalar formula.
 *
 * gelu_t_row replaces a scalar sbp_ptanhf per element in GeGLU's forward and backward, in both
 * numerics modes; the portable golden digests and the CUDA kernel (which runs gelu.h) stay valid
 * only if every result is the float gelu_tanh_t gives. With AVX-512 the rows run 8 double lanes
 * (vscalefpd for 2^n), with AVX2 + FMA 4 (test-avx2 runs this suite too); elsewhere the scalar
 * loop, which this test then checks against itself. Checked: a sample of every exponent (each
 * 4099th bit pattern), every float where the argument β·(g + κ·g³) nears ±22 (past it the tanh
 * is ±1 without an exponential), every float small enough that exp(2|arg|) rounds to 1 and the
 * ones above, every float of 1 ≤ |g| < 4, infinities, NaNs with payloads, ±0 (its sign kept);
 * SBP_VTANH_EXHAUSTIVE=1 checks all 2^32 floats instead (about a minute and a half on one
 * core). Then the rows: lengths across the
 * vector tails, nothing written past n; and geglu_forward / geglu_backward over several blocks
 * against the scalar loops they replaced. */
#undef SBP_REAL_F64
#include "../src/kernels/vtanh.h"
/* geglu.c in float, compiled here a second time under its own names (the engine's copies are
 * hidden inside its object) */
#define geglu_forward  test_geglu_forward_f32
#define geglu_backward test_geglu_backward_f32
#include "../src/kernels/geglu.c"
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { BATCH = 4096 };

/* gelu_t_row on n inputs against gelu_tanh_t one by one; returns the mismatches, the first few
 * reported */
static long check_batch(const float *x, int n) {
    float y[BATCH];
    gelu_t_row(y, x, n);
    long bad = 0;
    for (int i = 0; i < n; i++) {
        const float want = gelu_tanh_t(x[i]);
        if (tu_bits(want) != tu_bits(y[i]) && bad++ < 5)
            fprintf(stderr, "gelu t(%a = 0x%08x): scalar %a (0x%08x), row %a (0x%08x)\n",
                    (double)x[i], tu_bits(x[i]), (double)want, tu_bits(want), (double)y[i],
                    tu_bits(y[i]));
    }
    return bad;
}

/* every bit pattern in [lo, hi] step `step`, in batches */
static long check_range(uint64_t lo, uint64_t hi, uint64_t step) {
    float x[BATCH];
    long bad = 0;
    int n = 0;
    for (uint64_t u = lo; u <= hi; u += step) {
        x[n++] = tu_float((uint32_t)u);
        if (n == BATCH) bad += check_batch(x, n), n = 0;
    }
    return bad + check_batch(x, n);
}

/* every float between a and b (same sign, |a| ≤ |b|), and their negatives */
static long check_floats(float a, float b) {
    return check_range(tu_bits(a), tu_bits(b), 1) + check_range(tu_bits(-a), tu_bits(-b), 1);
}

START_TEST(vtanh_bits) {
    const char *ex = getenv("SBP_VTANH_EXHAUSTIVE");
    if (ex && atoi(ex)) {
        const long bad = check_range(0, 0xffffffffu, 1);
        ck_assert_msg(bad == 0, "%ld of 2^32 floats differ from gelu_tanh_t", bad);
        return;
    }
    long bad = check_range(0, 0xffffffffu, 4099); /* every exponent, both signs */
    /* the argument β·(g + κ·g³) reaches 22 at g ≈ 7.97: every float around it */
    bad += check_floats(7.5f, 8.5f);
    /* where tanh is neither ±1 nor linear, a slip far below a float's ulp in the double steps
     * shows only in rare roundings (a 1/5040 → 1/5041 slip in exp's polynomial changes 1296 of
     * the 2^32 results): every float of 1 ≤ |g| < 4, where most of those lie */
    bad += check_floats(1.0f, 4.0f);
    /* exp(2|arg|) rounds to 1 below |arg| = 2^-54 ≈ 5.6e-17 (g ≈ 7.0e-17), so tanh =
     * arg·2 / (arg·2 + 2) there: every float across the switch, a stride past it */
    bad += check_floats(6.0e-17f, 8.0e-17f);
    bad += check_range(tu_bits(8.0e-17f), tu_bits(1.0f), 997);
    bad += check_range(tu_bits(-8.0e-17f), tu_bits(-1.0f), 997);
    const float special[] = {0.0f,
                             -0.0f,
                             INFINITY,
                             -INFINITY,
                             NAN,
                             -NAN,
                             tu_float(0x7f800001u),
                             tu_float(0xff800001u),
                             tu_float(0x7fc12345u),
                             tu_float(0xffc54321u),
                             0x1p-149f,
                             -0x1p-149f,
                             3.4028235e38f,
                             -3.4028235e38f};
    const int ns = (int)(sizeof special / sizeof special[0]);
    float x[BATCH];
    for (int i = 0; i < BATCH; i++) x[i] = special[i % ns];
    bad += check_batch(x, BATCH);
    ck_assert_msg(bad == 0, "%ld floats: gelu_t_row differs from gelu_tanh_t", bad);
    /* NaN in, NaN out; the sign of zero kept */
    float y[4];
    const float in[4] = {NAN, -0.0f, 0.0f, -INFINITY};
    gelu_t_row(y, in, 4);
    ck_assert(isnan(y[0]) && tu_bits(y[1]) == 0x80000000u && tu_bits(y[2]) == 0 && y[3] == -1.0f);
}
END_TEST

/* rows of every length across the vector tails: the values of gelu_tanh_t, nothing past n */
START_TEST(vtanh_rows) {
    enum { N = 70, GUARD = 17 };
    float x[N], y[N + GUARD];
    for (int i = 0; i < N; i++) x[i] = (float)(i - 35) * 0.37f;
    for (int n = 0; n <= N; n++) {
        for (int i = 0; i < N + GUARD; i++) y[i] = 7.0f;
        gelu_t_row(y, x, n);
        for (int i = 0; i < n; i++) {
            const float want = gelu_tanh_t(x[i]);
            ck_assert_msg(tu_bits(y[i]) == tu_bits(want), "n %d: t[%d] = %a, want %a", n, i,
                          (double)y[i], (double)want);
        }
        for (int i = n; i < N + GUARD; i++)
            ck_assert_msg(y[i] == 7.0f, "n %d: wrote past n at %d", n, i);
    }
}
END_TEST

/* geglu_forward / geglu_backward over 3 blocks and a tail, against the scalar loops they
 * replaced, bit for bit (accumulating into dg and du) */
START_TEST(vtanh_geglu_blocks) {
    enum { N = 3 * 512 + 77 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N);
    float *dh = malloc(sizeof(float) * N), *h = malloc(sizeof(float) * N);
    float *dg = malloc(sizeof(float) * N), *du = malloc(sizeof(float) * N);
    ck_assert(g && u && dh && h && dg && du);
    uint64_t s = 5;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const float r = (float)(s >> 40) / (float)(1u << 24);
        g[i] = (r - 0.5f) * 24.0f;
        u[i] = r * 3.0f - 1.0f;
        dh[i] = 0.25f - r;
        dg[i] = r, du[i] = -r;
    }
    test_geglu_forward_f32(h, g, u, N);
    test_geglu_backward_f32(dg, du, dh, g, u, N);
    uint64_t t = 5;
    for (int i = 0; i < N; i++) {
        t = t * 6364136223846793005ull + 1442695040888963407ull;
        const float r = (float)(t >> 40) / (float)(1u << 24);
        const float x = g[i], th = gelu_tanh_t(x);
        const float want_h = gelu_tanh_value(x, th) * u[i];
        const float want_dg = r + (dh[i] * u[i]) * gelu_tanh_grad(x, th);
        const float want_du = -r + dh[i] * gelu_tanh_value(x, th);
        ck_assert_msg(tu_bits(h[i]) == tu_bits(want_h), "h[%d]", i);
        ck_assert_msg(tu_bits(dg[i]) == tu_bits(want_dg), "dg[%d]", i);
        ck_assert_msg(tu_bits(du[i]) == tu_bits(want_du), "du[%d]", i);
    }
    free(g), free(u), free(dh), free(h), free(dg), free(du);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("vtanh");
    TCase *tc = tcase_create("bits");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, vtanh_bits);
    tcase_add_test(tc, vtanh_rows);
    tcase_add_test(tc, vtanh_geglu_blocks);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
