/* test_vexp.c — the vectorized exponential of src/kernels/vexp.h against rexp (pmath.h's
 * sbp_pexpf), bit for bit.
 *
 * exp_shift and lanes_exp_sum_d replace scalar rexp loops in the softmax of both attentions and
 * of the vocabulary, in both numerics modes; the portable golden digests and the CUDA kernels
 * stay valid only if every result is the float rexp gives. With AVX-512 the loops run vexp16
 * (vscalefps for 2^n), with AVX2 + FMA vexp8 (test-avx2 runs this suite too); elsewhere they are
 * the scalar loop, and this test then checks the scalar loop against itself. Checked: a sample of
 * every exponent (each 4099th bit pattern), every float in the regions around the thresholds (−104
 * where results flush to 0, ≈ −87.3 where they turn subnormal, ≈ −69.3 where sbp_pexpf's tiny path
 * begins, 88.7 where they overflow, and near 0), infinities and NaNs of both signs and several
 * payloads; SBP_VEXP_EXHAUSTIVE=1 runs all 2^32 floats instead (about a minute). Then the row
 * forms: a shift and a scale, lengths across the 16-lane tails, in place, nothing written past n;
 * exp_neg (rexp(−x), SwiGLU's) the same way and on the same sample of bit patterns; and the 32-lane
 * double sum, and lanes_max and lanes_sum, whose lanes and tree run in registers there, and
 * lanes_exp_sum, exp_shift and lanes_sum in one pass. The rows
 * mix lanes inside the fast range of vexp16_row / vexp8_row with lanes outside it, so that both of
 * their paths run. Last, swiglu.c's float blocks of exp_neg. */
#undef SBP_REAL_F64
#include "../src/kernels/lanes.h"
#include "../src/kernels/vexp.h"
/* swiglu.c in float, compiled here a second time under its own names (the engine's copies are
 * hidden inside its object), for its blocks of exp_neg */
#define swiglu_forward  test_swiglu_forward_f32
#define swiglu_backward test_swiglu_backward_f32
#include "../src/kernels/swiglu.c"
#include "testutil.h"

#include <omp.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { BATCH = 4096 };

/* the tests' inputs: a 64-bit linear congruential generator (Knuth's MMIX constants), its new
 * state */
static uint64_t lcg_next(uint64_t *s) {
    return *s = *s * 6364136223846793005ull + 1442695040888963407ull;
}

/* exp_shift (shift 0, scale 1), or exp_neg (neg), on n inputs against rexp one by one; returns
 * the mismatches, the first few reported */
static long check_batch(const float *x, int n, int neg) {
    float y[BATCH];
    /* shift 0 read at run time on both sides, as the kernels' shifts are: x − 0 is then a real
     * subtraction, which quiets a signalling NaN (a constant 0 lets the compiler drop it) */
    volatile float zero = 0.0f;
    if (neg)
        exp_neg(y, x, n);
    else
        exp_shift(y, x, n, zero, 1.0f);
    long bad = 0;
    for (int i = 0; i < n; i++) {
        const float want = neg ? rexp(-x[i]) : rexp(x[i] - zero);
        if (tu_bits(want) != tu_bits(y[i]) && bad++ < 5)
            fprintf(stderr, "exp(%s%a = 0x%08x): rexp %a (0x%08x), %s %a (0x%08x)\n",
                    neg ? "-" : "", (double)x[i], tu_bits(x[i]), (double)want, tu_bits(want),
                    neg ? "exp_neg" : "exp_shift", (double)y[i], tu_bits(y[i]));
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
        if (n == BATCH) bad += check_batch(x, n, 0) + check_batch(x, n, 1), n = 0;
    }
    return bad + check_batch(x, n, 0) + check_batch(x, n, 1);
}

/* every float between a and b (same sign, |a| ≤ |b|) */
static long check_floats(float a, float b) {
    return check_range(tu_bits(a), tu_bits(b), 1);
}

START_TEST(vexp_bits) {
    long bad = 0;
    if (getenv("SBP_VEXP_EXHAUSTIVE") && atoi(getenv("SBP_VEXP_EXHAUSTIVE"))) {
        bad = check_range(0, 0xffffffffu, 1);
        ck_assert_msg(bad == 0, "%ld of 2^32 floats (exp_shift and exp_neg) differ from rexp", bad);
        return;
    }
    bad += check_range(0, 0xffffffffu, 4099);  /* every exponent, both signs */
    bad += check_floats(-103.0f, -105.0f);     /* flush to 0 below −104 */
    bad += check_floats(-86.5f, -88.5f);       /* normal → subnormal results */
    bad += check_floats(-68.5f, -70.5f);       /* sbp_pexpf's tiny path: n < −100 */
    bad += check_floats(88.0f, 89.5f);         /* overflow past 88.7 */
    bad += check_range(0, tu_bits(1.0f), 997); /* towards 0, both signs */
    bad += check_range(0x80000000u, tu_bits(-1.0f), 997);
    const float special[] = {INFINITY,
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
    const int nspecial = (int)(sizeof special / sizeof special[0]);
    bad += check_batch(special, nspecial, 0) + check_batch(special, nspecial, 1);
    ck_assert_msg(bad == 0, "%ld inputs differ from rexp", bad);
}
END_TEST

/* y = scale · rexp(x − shift) for lengths across the tails, out of place and in place; the
 * guards past n untouched */
START_TEST(vexp_rows) {
    enum { N = 70, G = 20 };
    float x[N + G], y[N + G], want[N];
    uint64_t s = 7;
    const float shifts[] = {0.0f, 3.25f, -2.5f, INFINITY, -INFINITY};
    const float scales[] = {1.0f, -0.375f, 2.0f};
    for (int n = 0; n <= N; n++)
        for (size_t a = 0; a < sizeof shifts / sizeof shifts[0]; a++)
            for (size_t c = 0; c < sizeof scales / sizeof scales[0]; c++) {
                for (int i = 0; i < N + G; i++) {
                    lcg_next(&s);
                    x[i] = ((float)(s >> 40) / (float)(1u << 24) - 0.75f) * 40.0f;
                    y[i] = -9.0f;
                }
                if (n > 3) x[1] = -INFINITY, x[2] = NAN;
                for (int i = 0; i < n; i++) want[i] = scales[c] * rexp(x[i] - shifts[a]);
                exp_shift(y, x, n, shifts[a], scales[c]);
                ck_assert_msg(!memcmp(y, want, sizeof(float) * (size_t)n),
                              "n %d shift %g scale %g: differs", n, (double)shifts[a],
                              (double)scales[c]);
                for (int i = n; i < N + G; i++)
                    ck_assert_msg(y[i] == -9.0f, "wrote past n = %d", n);
                exp_shift(x, x, n, shifts[a], scales[c]); /* in place */
                ck_assert_msg(!memcmp(x, want, sizeof(float) * (size_t)n),
                              "n %d, in place: differs", n);
            }
}
END_TEST

/* y = rexp(−x) for lengths across the tails, out of place and in place; vectors with a lane
 * outside the fast range (−inf, NaN, the tiny path) among ordinary ones; nothing past n */
START_TEST(vexp_neg_rows) {
    enum { N = 70, G = 20 };
    float x[N + G], y[N + G], want[N];
    uint64_t s = 5;
    for (int n = 0; n <= N; n++)
        for (int odd = 0; odd < 4; odd++) {
            for (int i = 0; i < N + G; i++) {
                lcg_next(&s);
                x[i] = ((float)(s >> 40) / (float)(1u << 24) - 0.25f) * 40.0f;
                y[i] = -9.0f;
            }
            const float outside[] = {INFINITY, NAN, 69.2f, 104.5f};
            if (n > 0) x[(n * 7 + odd) % n] = outside[odd];
            for (int i = 0; i < n; i++) want[i] = rexp(-x[i]);
            exp_neg(y, x, n);
            for (int i = 0; i < n; i++)
                ck_assert_msg(tu_bits(y[i]) == tu_bits(want[i]), "n %d, x[%d] = %a: %a, want %a", n,
                              i, (double)x[i], (double)y[i], (double)want[i]);
            for (int i = n; i < N + G; i++) ck_assert_msg(y[i] == -9.0f, "wrote past n = %d", n);
            exp_neg(x, x, n); /* in place */
            ck_assert_msg(!memcmp(x, want, sizeof(float) * (size_t)n), "n %d, in place", n);
        }
}
END_TEST

/* the same bits, or both NaN: which of two NaN operands an x86 operation passes on depends on
 * the operand order the compiler picked, not on the values */
static int same(float a, float b) {
    return tu_bits(a) == tu_bits(b) || (isnan(a) && isnan(b));
}

/* swiglu_forward / _backward in float against the element-by-element formulas with rexp, bit
 * for bit (a NaN as any NaN): lengths across its 512-element blocks and exp_neg's tails, 1 and 2
 * threads, special inputs (±inf, NaN, saturating ±100, ±0) among ordinary ones */
START_TEST(vexp_swiglu_blocks) {
    const size_t lens[] = {0, 1, 7, 9, 511, 512, 513, 1024 + 37, 3 * 512 + 15};
    enum { NMAX = 3 * 512 + 15 };
    float *g = malloc(sizeof(float) * NMAX * 7), *u = g + NMAX, *dh = u + NMAX, *h = dh + NMAX;
    float *dg = h + NMAX, *du = dg + NMAX, *want = du + NMAX;
    ck_assert_ptr_nonnull(g);
    uint64_t s = 17;
    for (int i = 0; i < NMAX; i++) {
        lcg_next(&s);
        g[i] = ((float)(s >> 40) / (float)(1u << 24) - 0.5f) * 24.0f;
        u[i] = (float)(s >> 20 & 0xffff) / 65536.0f - 0.5f, dh[i] = 0.25f - u[i] * u[i];
    }
    const float special[] = {INFINITY, -INFINITY, NAN, 100.0f, -100.0f, 0.0f, -0.0f};
    for (int k = 0; k < 7; k++) g[(k * 211 + 3) % NMAX] = special[k];
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++)
        for (int th = 1; th <= 2; th++) {
            const size_t n = lens[t];
            omp_set_num_threads(th);
            test_swiglu_forward_f32(h, g, u, n);
            for (size_t i = 0; i < n; i++) {
                const float sg = 1 / (1 + rexp(-g[i]));
                want[i] = (g[i] * sg) * u[i];
            }
            for (size_t i = 0; i < n; i++)
                ck_assert_msg(same(h[i], want[i]), "forward, n %zu, %d threads, element %zu", n, th,
                              i);
            for (size_t i = 0; i < n; i++) dg[i] = 0.5f, du[i] = -0.5f;
            test_swiglu_backward_f32(dg, du, dh, g, u, n);
            for (size_t i = 0; i < n; i++) {
                const float sg = 1 / (1 + rexp(-g[i]));
                const float wg = 0.5f + (dh[i] * u[i]) * (sg * (1 + g[i] * (1 - sg)));
                const float wu = -0.5f + dh[i] * (g[i] * sg);
                ck_assert_msg(same(dg[i], wg) && same(du[i], wu),
                              "backward, n %zu, %d threads, element %zu (g = %a)", n, th, i,
                              (double)g[i]);
            }
        }
    omp_set_num_threads(1);
    free(g);
}
END_TEST

/* lanes_exp_sum_d against its lanes written out: lane k the elements ≡ k (mod 32) in ascending
 * order, each exp in float widened to double, then the halving tree */
START_TEST(vexp_sum_lanes) {
    const int lens[] = {0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 64, 100, 1300, 32000, 32003};
    float *x = malloc(sizeof(float) * 32003);
    ck_assert_ptr_nonnull(x);
    uint64_t s = 11;
    for (int i = 0; i < 32003; i++) {
        lcg_next(&s);
        x[i] = ((float)(s >> 40) / (float)(1u << 24)) * 30.0f - 20.0f;
    }
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++)
        for (int shift_i = 0; shift_i < 2; shift_i++) {
            const int n = lens[t];
            const float shift = shift_i ? lanes_max(x, n) : 1.5f;
            double lane[LANES] = {0};
            for (int i = 0; i < n; i++)
                lane[i % LANES] = lane[i % LANES] + (double)rexp(x[i] - shift);
            const double want = lanes_tree_sum_d(lane), got = lanes_exp_sum_d(x, n, shift);
            ck_assert_msg(!memcmp(&want, &got, sizeof want), "n %d: %a, want %a", n, got, want);
        }
    free(x);
}
END_TEST

/* lanes_max and lanes_sum (in registers with AVX-512 and AVX2: lanes.h) against their lanes
 * written out: lane k the elements ≡ k (mod 32) in ascending order from −inf or +0, then the
 * halving tree; bit for bit (a NaN sum as a NaN), over lengths across the 32-lane tails, with
 * ±0, ±inf and NaNs among the values (max skips a NaN element; a sum keeps it) */
START_TEST(lanes_reductions) {
    const int lens[] = {0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 1000};
    enum { N = 1000 };
    float x[N];
    uint64_t s = 5;
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < N; i++) {
            lcg_next(&s);
            const uint32_t r = (uint32_t)(s >> 32);
            x[i] = ((float)(r >> 8) / (float)(1u << 24)) * 20.0f - 10.0f;
            /* pass 1: zeros of both signs and infinities; pass 2: NaNs too */
            if (pass >= 1 && r % 7 == 0) x[i] = r % 2 ? 0.0f : -0.0f;
            if (pass >= 1 && r % 11 == 0) x[i] = r % 2 ? INFINITY : -INFINITY;
            if (pass == 2 && r % 13 == 0) x[i] = tu_float(0x7fc00000u | (r & 0xff));
        }
        for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++) {
            const int n = lens[t];
            float mx[LANES], sm[LANES];
            for (int k = 0; k < LANES; k++) mx[k] = -INFINITY, sm[k] = 0;
            for (int i = 0; i < n; i++) {
                const int k = i % LANES;
                mx[k] = x[i] > mx[k] ? x[i] : mx[k];
                sm[k] = sm[k] + x[i];
            }
            for (int w = LANES / 2; w; w /= 2)
                for (int k = 0; k < w; k++) mx[k] = mx[k + w] > mx[k] ? mx[k + w] : mx[k];
            const float want_max = mx[0], want_sum = lanes_tree_sum(sm);
            const float got_max = lanes_max(x, n), got_sum = lanes_sum(x, n);
            ck_assert_msg(!memcmp(&want_max, &got_max, 4), "pass %d n %d: max %a, want %a", pass, n,
                          got_max, want_max);
            /* a NaN as a NaN: which of two NaNs' payloads a sum keeps is the order of its
             * operands, and C lets the compiler swap them */
            ck_assert_msg(!memcmp(&want_sum, &got_sum, 4) || (isnan(want_sum) && isnan(got_sum)),
                          "pass %d n %d: sum %a, want %a", pass, n, got_sum, want_sum);
        }
    }
}
END_TEST

/* lanes_exp_sum (the attention softmaxes' row, both numerics) against exp_shift then lanes_sum,
 * bit for bit: the row written and the sum, over lengths across the 32-lane and vector tails, in
 * place and not, with masked (−inf) and underflowing entries, so that both paths of
 * vexp16_row / vexp8_row run; nothing written past n */
START_TEST(lanes_exp_sum_rows) {
    const int lens[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 300};
    enum { N = 300, GUARD = 8 };
    float x[N], want[N], got[N + GUARD];
    uint64_t s = 17;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < N; i++) {
            lcg_next(&s);
            const uint32_t r = (uint32_t)(s >> 32);
            x[i] = ((float)(r >> 8) / (float)(1u << 24)) * 40.0f - 30.0f;
            if (pass == 1 && r % 5 == 0) x[i] = -INFINITY; /* a masked score */
            if (pass == 1 && r % 7 == 0) x[i] = -120.0f;   /* its exp underflows to 0 */
        }
        for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++)
            for (int inplace = 0; inplace < 2; inplace++) {
                const int n = lens[t];
                const float shift = n ? lanes_max(x, n) : 0.0f;
                exp_shift(want, x, n, shift, 1);
                const float want_sum = lanes_sum(want, n);
                for (int i = 0; i < N + GUARD; i++) got[i] = 7.0f;
                memcpy(got, x, sizeof(float) * (size_t)n);
                const float got_sum = lanes_exp_sum(got, inplace ? got : x, n, shift);
                ck_assert_msg(!memcmp(&got_sum, &want_sum, 4), "pass %d n %d: sum %a, want %a",
                              pass, n, got_sum, want_sum);
                ck_assert_msg(!memcmp(got, want, sizeof(float) * (size_t)n), "pass %d n %d: row",
                              pass, n);
                for (int i = n; i < N + GUARD; i++)
                    ck_assert_msg(got[i] == 7.0f, "pass %d n %d: wrote past n at %d", pass, n, i);
            }
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("vexp");
    TCase *tc = tcase_create("bits");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, vexp_bits);
    tcase_add_test(tc, vexp_rows);
    tcase_add_test(tc, vexp_neg_rows);
    tcase_add_test(tc, vexp_swiglu_blocks);
    tcase_add_test(tc, vexp_sum_lanes);
    tcase_add_test(tc, lanes_reductions);
    tcase_add_test(tc, lanes_exp_sum_rows);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
