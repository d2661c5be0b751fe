/* test_kernels.c — every kernel backward against float64 central finite differences, every
 * forward against a naive evaluation written here, and the exactness properties the kernels
 * promise (kernels.h): backward accumulates; linear layers and attention give the same bits
 * whatever the block-aligned chunking and the thread count.
 *
 * Finite differences. For a kernel y = f(x) and a fixed random r, L = Σ r ⊙ y, so the analytic
 * gradient is the backward kernel applied to dy = r. The central difference is formed as
 *     fd_i = Σ_j r_j · (f(x + h e_i)_j − f(x − h e_i)_j) / ((x_i + h) − (x_i − h)),
 * differencing the outputs before the weighted sum: outputs that do not depend on x_i cancel
 * exactly, and the rounding error is about ε·|y|/h per affected output instead of ε·|L|/h.
 * The truncation error is h²·|f'''|/6. Inputs are of order 1; measured worst |fd − g| over
 * all kernels (logprob's row near 1000 aside, see there):
 *     h = 1e-4: 1.5e-8 (rmsnorm dx, truncation)     h = 1e-5: 3.1e-10 (attention dk)
 *     h = 1e-6: 3.0e-9 (attention dk, rounding)     h = 1e-7: fails the bounds below
 * so h = 1e-5. Linear kernels (linear, rope, embedding) have no truncation error. Each check
 * asserts |fd − g| ≤ atol + rtol·|g| with atol at 5–10× the measured worst case (2e-9 for the
 * nonlinear kernels, 1e-9 for the linear ones); the same bounds hold in the sanitizer build
 * (-O1). SBP_FD_REPORT=1 prints the measured errors.
 *
 * The test is compiled with -DSBP_REAL_F64, so `real` is double and the calls below go to the
 * float64 kernel objects. */
#include "testutil.h"
#include "../src/core/rng.h"
#include "../src/io/safetensors.h"
#include "../src/kernels/fast/fast.h"
#include "../src/kernels/kernels.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(real) == sizeof(double), "tests/test_kernels.c needs -DSBP_REAL_F64");

#define FD_H 1e-5

/* ck_assert_msg that costs nothing when it holds: Check's asserts record a mark point (a write
 * to the test runner) on every success, which takes seconds in loops over millions of values. */
#define require(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

/* ---------------------------------------------------------------------------------------------
 * Buffers and comparisons */

static double *zeros(size_t n) {
    double *p = calloc(n ? n : 1, sizeof *p);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* n values scale·N(0,1) + shift from the stream of `seed`. */
static double *randn(size_t n, uint64_t seed, double scale, double shift) {
    double *p = zeros(n);
    sbp_rng r;
    sbp_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) p[i] = shift + scale * sbp_rng_normal(&r);
    return p;
}

static double *dup(const double *x, size_t n) {
    double *p = zeros(n);
    memcpy(p, x, sizeof *p * n);
    return p;
}

static void assert_close(const char *what, const double *got, const double *want, size_t n,
                         double atol, double rtol) {
    for (size_t i = 0; i < n; i++)
        require(got[i] == want[i] || fabs(got[i] - want[i]) <= atol + rtol * fabs(want[i]),
                "%s[%zu]: got %.17g, want %.17g (|diff| %.3g > %.3g + %.3g·|want|)", what, i,
                got[i], want[i], fabs(got[i] - want[i]), atol, rtol);
}

/* got[i] a floating-point sum of `terms` terms whose exact value is want[i] and whose
 * magnitudes sum to mag[i]: |got − want| ≤ γ(terms)·mag, γ(n) = n·u / (1 − n·u), u = 2⁻⁵³ */
static void assert_dot_close(const char *what, const double *got, const double *want,
                             const double *mag, size_t n, int terms) {
    const double u = DBL_EPSILON / 2, gamma = terms * u / (1 - terms * u);
    for (size_t i = 0; i < n; i++)
        require(fabs(got[i] - want[i]) <= gamma * mag[i] * (1 + 4 * u),
                "%s[%zu]: got %.17g, want %.17g (|diff| %.3g > γ(%d)·Σ|terms| = %.3g)", what, i,
                got[i], want[i], fabs(got[i] - want[i]), terms, gamma * mag[i]);
}

static void assert_bitwise(const char *what, const double *got, const double *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        require(memcmp(&got[i], &want[i], sizeof got[i]) == 0,
                "%s[%zu]: %.17g differs from %.17g (bitwise comparison)", what, i, got[i], want[i]);
}

/* The accumulation contract: a backward run on prefilled outputs `pre` leaves `after` =
 * pre + fresh, up to the rounding of the additions (a BLAS call with beta = 1 adds its blocks
 * one by one onto the prefill, so the grouping differs from pre + (Σ blocks)). */
static void assert_accumulated(const char *what, const double *after, const double *pre,
                               const double *fresh, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double want = pre[i] + fresh[i];
        require(fabs(after[i] - want) <= 1e-13 * (fabs(pre[i]) + fabs(fresh[i]) + 1e-300),
                "%s[%zu]: backward on a prefilled output gave %.17g, want prefill %.17g + "
                "gradient %.17g: the kernel does not accumulate",
                what, i, after[i], pre[i], fresh[i]);
    }
}

static void assert_all_finite(const char *what, const double *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        require(isfinite(x[i]), "%s[%zu] is %g, not finite", what, i, x[i]);
}

/* ---------------------------------------------------------------------------------------------
 * Central differences */

/* Computes all outputs of a kernel from the inputs held in ctx. */
typedef void (*fwd_fn)(void *ctx, double *out);

/* Checks the analytic gradient g of L = Σ r ⊙ f(x) with respect to x[0..n): every element when
 * nsample is 0, else nsample elements drawn with the stream of `seed`. x is perturbed in place
 * and restored. */
static void fd_check(const char *what, fwd_fn f, void *ctx, double *x, size_t n, const double *g,
                     const double *r, size_t nout, double atol, double rtol, int nsample,
                     uint64_t seed) {
    double *yp = zeros(nout), *ym = zeros(nout);
    sbp_rng rng;
    sbp_rng_seed(&rng, seed);
    size_t count = nsample ? (size_t)nsample : n;
    double worst = 0, worst_abs = 0, gmax = 0, t0 = omp_get_wtime();
    for (size_t c = 0; c < count; c++) {
        size_t i = nsample ? (size_t)(sbp_rng_uniform(&rng) * (double)n) : c;
        double x0 = x[i], xp = x0 + FD_H, xm = x0 - FD_H;
        x[i] = xp;
        f(ctx, yp);
        x[i] = xm;
        f(ctx, ym);
        x[i] = x0;
        double d = 0;
        for (size_t j = 0; j < nout; j++) d += r[j] * (yp[j] - ym[j]);
        double fd = d / (xp - xm), e = fabs(fd - g[i]), tol = atol + rtol * fabs(g[i]);
        require(e <= tol,
                "%s: d/dx[%zu]: analytic %.12g vs central difference %.12g (|diff| %.3g > "
                "%.3g + %.3g·|g|; seed %llu)",
                what, i, g[i], fd, e, atol, rtol, (unsigned long long)seed);
        worst = fmax(worst, e / tol);
        worst_abs = fmax(worst_abs, e);
        gmax = fmax(gmax, fabs(g[i]));
    }
    if (getenv("SBP_FD_REPORT"))
        fprintf(stderr, "fd %-40s n=%-5zu max|fd-g| %.2e  max|g| %.2e  %.0f%% of the bound %.2fs\n",
                what, count, worst_abs, gmax, 100 * worst, omp_get_wtime() - t0);
    free(yp);
    free(ym);
}

/* ---------------------------------------------------------------------------------------------
 * linear: y = x·Wᵀ + b over rows [s, e) cut into blocks of blk */

/* Both implementations behind one signature: the portable product (portable = 1) or the fast
 * mode's per-block BLAS calls (blk). */
typedef struct {
    int portable, blk;
    double *ws; /* (pgemm_workspace(INT_MAX, INT_MAX)): any shape */
} lin_impl;

static void lin_forward(const lin_impl *im, double *y, const double *x, const double *w,
                        const double *b, int s, int e, int N, int K) {
    if (im->portable)
        linear_forward(y, im->ws, x, w, b, s, e, N, K);
    else
        blas_linear_forward(y, x, w, b, s, e, N, K, im->blk);
}

static void lin_backward(const lin_impl *im, double *dx, double *dw, double *db, const double *dy,
                         const double *x, const double *w, int s, int e, int N, int K) {
    if (im->portable)
        linear_backward(dx, dw, db, im->ws, dy, x, w, s, e, N, K);
    else
        blas_linear_backward(dx, dw, db, dy, x, w, s, e, N, K, im->blk);
}

static lin_impl lin_impl_make(int portable, int blk) {
    lin_impl im = {portable, blk, zeros(pgemm_workspace(INT_MAX, INT_MAX))};
    return im;
}

typedef struct {
    double *x, *w, *b;
    int s, e, N, K;
    lin_impl im;
} lin_ctx;

static void lin_fwd(void *c_, double *y) {
    const lin_ctx *c = c_;
    lin_forward(&c->im, y, c->x, c->w, c->b, c->s, c->e, c->N, c->K);
}

/* Sampled differences per input of the wide cases. Each one runs the whole product twice, and
 * under ASan at -O1 the portable product's forward takes ~0.1 s (a wide case ~100 s at 400
 * samples, past the 120 s timeout on a slower CI machine): there every call still runs the same
 * code instrumented, and 40 samples check the same bounds. */
#if defined(__SANITIZE_ADDRESS__)
#define LINEAR_FD_SAMPLES 40
#else
#define LINEAR_FD_SAMPLES 400
#endif

/* _i bit 0: without bias; bit 1: the portable product; bit 2: N = BLAS_LINEAR_N_PANEL + 5 and
 * K = BLAS_LINEAR_DX_K_PANEL + 3 (the fast mode's tiles: whole panels and ragged ones; for the
 * portable product, which has no panels, K = BLAS_LINEAR_K_PANEL + 3: past its k block;
 * LINEAR_FD_SAMPLES sampled differences per input). Rows [5, 18) with blk 4: a partial first
 * block [5, 8), two whole blocks and a partial last one [16, 18). */
START_TEST(linear_fd) {
    const int wide = _i >> 2, nsample = wide ? LINEAR_FD_SAMPLES : 0;
    const int s = 5, e = 18, M = e - s, N = wide ? BLAS_LINEAR_N_PANEL + 5 : 6;
    const int K = !wide ? 7 : (_i >> 1) & 1 ? BLAS_LINEAR_K_PANEL + 3 : BLAS_LINEAR_DX_K_PANEL + 3;
    const int blk = 4, bias = (_i & 1) == 0;
    const uint64_t seed = 101;
    lin_ctx c = {randn((size_t)M * K, seed, 1, 0),
                 randn((size_t)N * K, seed + 1, 1, 0),
                 bias ? randn(N, seed + 2, 1, 0) : NULL,
                 s,
                 e,
                 N,
                 K,
                 lin_impl_make((_i >> 1) & 1, blk)};
    const lin_impl *im = &c.im;
    double *r = randn((size_t)M * N, seed + 3, 1, 0), *y = zeros((size_t)M * N);
    lin_fwd(&c, y);
    double *want = zeros((size_t)M * N), *mag = zeros((size_t)M * N);
    for (int i = 0; i < M; i++)
        for (int n = 0; n < N; n++) {
            long double a = bias ? c.b[n] : 0, m = bias ? fabs(c.b[n]) : 0;
            for (int k = 0; k < K; k++) {
                a += (long double)c.x[i * K + k] * c.w[n * K + k];
                m += fabsl((long double)c.x[i * K + k] * c.w[n * K + k]);
            }
            want[i * N + n] = (double)a, mag[i * N + n] = (double)m;
        }
    /* a sum of K + 1 terms in any order, with or without fma, is within γ(K+1)·Σ|terms| of the
     * exact one (Higham, Thm 3.1): the bound holds for every BLAS kernel and machine, where a
     * fixed tolerance read off one machine did not (5.96e-14 > 5e-14 at K = 515 on a Xeon VM of
     * CPUID model 167). want is summed in long double, whose own error is ~2000× below the bound */
    assert_dot_close("linear_forward y", y, want, mag, (size_t)M * N, K + 1);

    double *dx = zeros((size_t)M * K), *dw = zeros((size_t)N * K), *db = bias ? zeros(N) : NULL;
    lin_backward(im, dx, dw, db, r, c.x, c.w, s, e, N, K);
    /* L is linear in each input: only rounding, measured max 1.2e-10; wide, L sums 13K outputs
     * of 515-term products (fast) or 259-term ones (portable): measured up to 1.05e-8 (61% of the
     * bound) and 6.96e-9 (39%), SBP_FD_REPORT=1 */
    const double tol = wide ? 1e-8 : 1e-9;
    fd_check("linear dx", lin_fwd, &c, c.x, (size_t)M * K, dx, r, (size_t)M * N, tol, tol, nsample,
             seed);
    fd_check("linear dw", lin_fwd, &c, c.w, (size_t)N * K, dw, r, (size_t)M * N, tol, tol, nsample,
             seed);
    if (bias)
        fd_check("linear db", lin_fwd, &c, c.b, N, db, r, (size_t)M * N, tol, tol, nsample, seed);

    /* dx may be NULL; dw and db are then the very same */
    double *dw2 = zeros((size_t)N * K), *db2 = bias ? zeros(N) : NULL;
    lin_backward(im, NULL, dw2, db2, r, c.x, c.w, s, e, N, K);
    assert_bitwise("linear dw with dx NULL", dw2, dw, (size_t)N * K);
    if (bias) assert_bitwise("linear db with dx NULL", db2, db, N);

    /* accumulation into dx, dw, db */
    double *px = randn((size_t)M * K, seed + 4, 1, 0), *pw = randn((size_t)N * K, seed + 5, 1, 0);
    double *pb = randn(N, seed + 6, 1, 0);
    double *ax = dup(px, (size_t)M * K), *aw = dup(pw, (size_t)N * K), *ab = dup(pb, N);
    lin_backward(im, ax, aw, bias ? ab : NULL, r, c.x, c.w, s, e, N, K);
    assert_accumulated("linear dx", ax, px, dx, (size_t)M * K);
    assert_accumulated("linear dw", aw, pw, dw, (size_t)N * K);
    if (bias) assert_accumulated("linear db", ab, pb, db, N);

    free(c.x), free(c.w), free(c.b), free(r), free(y), free(want), free(mag), free(dx), free(dw),
        free(db);
    free(dw2), free(db2), free(px), free(pw), free(pb), free(ax), free(aw), free(ab), free(c.im.ws);
}
END_TEST

/* The split contract: rows [5, 18) handed over as [5, mid) + [mid, 18) give bit-identical y, dx,
 * dw and db to one call — for the fast mode when mid is on a block boundary (12), for the
 * portable product at any row (9: inside a block). _i bit 0: fast, portable; bit 1: N and K
 * past a panel of the fast mode's tiles. */
START_TEST(linear_block_split) {
    const int portable = _i & 1, N = _i >> 1 ? BLAS_LINEAR_N_PANEL + 5 : 6;
    const int s = 5, e = 18, mid = portable ? 9 : 12, M = e - s, K = _i >> 1 ? 600 : 7, blk = 4;
    const uint64_t seed = 111;
    lin_impl im = lin_impl_make(portable, blk);
    double *x = randn((size_t)M * K, seed, 1, 0), *w = randn((size_t)N * K, seed + 1, 1, 0);
    double *b = randn(N, seed + 2, 1, 0), *dy = randn((size_t)M * N, seed + 3, 1, 0);
    double *y1 = zeros((size_t)M * N), *y2 = zeros((size_t)M * N);
    lin_forward(&im, y1, x, w, b, s, e, N, K);
    lin_forward(&im, y2, x, w, b, s, mid, N, K);
    lin_forward(&im, y2 + (mid - s) * N, x + (mid - s) * K, w, b, mid, e, N, K);
    assert_bitwise("linear y, split", y2, y1, (size_t)M * N);
    double *dx1 = zeros((size_t)M * K), *dw1 = zeros((size_t)N * K), *db1 = zeros(N);
    double *dx2 = zeros((size_t)M * K), *dw2 = zeros((size_t)N * K), *db2 = zeros(N);
    lin_backward(&im, dx1, dw1, db1, dy, x, w, s, e, N, K);
    lin_backward(&im, dx2, dw2, db2, dy, x, w, s, mid, N, K);
    lin_backward(&im, dx2 + (mid - s) * K, dw2, db2, dy + (mid - s) * N, x + (mid - s) * K, w, mid,
                 e, N, K);
    assert_bitwise("linear dx, split", dx2, dx1, (size_t)M * K);
    assert_bitwise("linear dw, split", dw2, dw1, (size_t)N * K);
    assert_bitwise("linear db, split", db2, db1, N);
    free(x), free(w), free(b), free(dy), free(y1), free(y2), free(im.ws);
    free(dx1), free(dw1), free(db1), free(dx2), free(dw2), free(db2);
}
END_TEST

/* The fast mode's products give the same bits at 1, 2 and 3 threads: rows [3, 150) in blocks of
 * 64, N = 1029 and K = 777 (ragged panels; a K that OpenBLAS's threaded driver splits otherwise
 * than its serial one: with OpenBLAS's threads this failed). */
START_TEST(linear_thread_invariance) {
    const int s = 3, e = 150, M = e - s, N = BLAS_LINEAR_N_PANEL + 5, K = 777, blk = 64;
    const uint64_t seed = 121;
    lin_impl im = lin_impl_make(0, blk);
    double *x = randn((size_t)M * K, seed, 1, 0), *w = randn((size_t)N * K, seed + 1, 1, 0);
    double *b = randn(N, seed + 2, 1, 0), *dy = randn((size_t)M * N, seed + 3, 1, 0);
    double *res[3][4];
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        double *y = zeros((size_t)M * N), *dx = zeros((size_t)M * K), *dw = zeros((size_t)N * K);
        double *db = zeros(N);
        lin_forward(&im, y, x, w, b, s, e, N, K);
        lin_backward(&im, dx, dw, db, dy, x, w, s, e, N, K);
        res[t][0] = y, res[t][1] = dx, res[t][2] = dw, res[t][3] = db;
    }
    omp_set_num_threads(2);
    static const char *names[] = {"y", "dx", "dw", "db"};
    const size_t len[] = {(size_t)M * N, (size_t)M * K, (size_t)N * K, (size_t)N};
    char what[64];
    for (int t = 1; t < 3; t++)
        for (int i = 0; i < 4; i++) {
            snprintf(what, sizeof what, "linear %s, %d threads vs 1", names[i], t + 1);
            assert_bitwise(what, res[t][i], res[0][i], len[i]);
        }
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 4; i++) free(res[t][i]);
    free(x), free(w), free(b), free(dy), free(im.ws);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * rmsnorm: out = x·rsqrt(mean(x²) + eps)·w */

typedef struct {
    double *x, *w, *rstd;
    int M, C;
    double eps;
} rms_ctx;

static void rms_fwd(void *c_, double *out) {
    rms_ctx *c = c_;
    rmsnorm_forward(out, c->rstd, c->x, c->w, c->M, c->C, c->eps);
}

START_TEST(rmsnorm_fd) {
    const int M = 5, C = 12;
    const uint64_t seed = 201;
    rms_ctx c = {
        randn((size_t)M * C, seed, 1, 0), randn(C, seed + 1, 0.1, 1), zeros(M), M, C, 1e-6};
    double *r = randn((size_t)M * C, seed + 2, 1, 0), *out = zeros((size_t)M * C);
    rms_fwd(&c, out);
    double *want = zeros((size_t)M * C), *rstd = dup(c.rstd, M);
    for (int i = 0; i < M; i++) {
        long double ss = 0;
        for (int j = 0; j < C; j++) ss += (long double)c.x[i * C + j] * c.x[i * C + j];
        long double rs = 1 / sqrtl(ss / C + (long double)c.eps);
        require(fabsl(rstd[i] - rs) <= 1e-15L * rs, "rmsnorm rstd[%d] %.17g vs %.17Lg", i, rstd[i],
                rs);
        for (int j = 0; j < C; j++) want[i * C + j] = (double)(c.x[i * C + j] * rs * c.w[j]);
    }
    assert_close("rmsnorm_forward out", out, want, (size_t)M * C, 1e-15, 1e-14);

    double *dx = zeros((size_t)M * C), *dw = zeros(C);
    rmsnorm_backward(dx, dw, r, c.x, rstd, c.w, M, C);
    /* measured max |fd − g|: 1.1e-10 (dx), 2.4e-11 (dw) */
    fd_check("rmsnorm dx", rms_fwd, &c, c.x, (size_t)M * C, dx, r, (size_t)M * C, 2e-9, 1e-8, 0,
             seed);
    fd_check("rmsnorm dw", rms_fwd, &c, c.w, C, dw, r, (size_t)M * C, 2e-9, 1e-8, 0, seed);

    double *px = randn((size_t)M * C, seed + 3, 1, 0), *pw = randn(C, seed + 4, 1, 0);
    double *ax = dup(px, (size_t)M * C), *aw = dup(pw, C);
    rmsnorm_backward(ax, aw, r, c.x, rstd, c.w, M, C);
    assert_accumulated("rmsnorm dx", ax, px, dx, (size_t)M * C);
    assert_accumulated("rmsnorm dw", aw, pw, dw, C);
    free(c.x), free(c.w), free(c.rstd), free(r), free(out), free(want), free(rstd), free(dx);
    free(dw), free(px), free(pw), free(ax), free(aw);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * RoPE */

/* inv_freq[i] of ref/SEMANTICS.md in long double, with llama3 scaling when asked; region[i] =
 * 0 (wavelength below O/high: unchanged), 1 (between: smoothed) or 2 (above O/low: /factor). */
static long double inv_freq_ref(int i, int HD, double theta, int llama3, double factor, double low,
                                double high, double O, int *region) {
    long double f = powl(theta, -2.0L * i / HD);
    *region = 0;
    if (!llama3) return f;
    long double wavelen = 2 * 3.14159265358979323846264338327950288L / f;
    if (wavelen < O / high) return f;
    if (wavelen > O / low) {
        *region = 2;
        return f / factor;
    }
    *region = 1;
    long double sm = (O / wavelen - low) / (high - low);
    return (1 - sm) * f / factor + sm * f;
}

/* rope_table against the formula. theta = 10000, HD = 16 gives wavelengths 2π·10000^(i/8) =
 * 6.3, 19.9, 62.8, 199, 628, 1987, 6283, 19869; with O = 1024, low 1, high 4 the thresholds
 * O/high = 256 and O/low = 1024 put i = 0..3 in the unchanged region, i = 4 in the smoothed one
 * and i = 5..7 in the divided one. _i: 0 = default, 1 = llama3. */
START_TEST(rope_table_formula) {
    const int T = 300, HD = 16, half = HD / 2, llama3 = _i;
    const double theta = 10000, factor = 8, low = 1, high = 4, O = 1024;
    double *cs = zeros((size_t)T * half), *sn = zeros((size_t)T * half);
    rope_table(cs, sn, T, HD, theta, llama3, factor, low, high, O);
    int count[3] = {0, 0, 0};
    for (int i = 0; i < half; i++) {
        int region;
        long double f = inv_freq_ref(i, HD, theta, llama3, factor, low, high, O, &region);
        count[region]++;
        for (int t = 0; t < T; t++) {
            /* the kernel forms f (pmath's exp and log: ~2 ulp) and t·f in double, then sin and
             * cos (2.4 ulp) */
            long double a = t * f, tol = 4e-16L + 6 * DBL_EPSILON * a;
            require(fabsl(cs[t * half + i] - cosl(a)) <= tol &&
                        fabsl(sn[t * half + i] - sinl(a)) <= tol,
                    "rope_table (%s) t=%d i=%d: cos %.17g sin %.17g, want %.17Lg %.17Lg",
                    llama3 ? "llama3" : "default", t, i, cs[t * half + i], sn[t * half + i],
                    cosl(a), sinl(a));
        }
    }
    if (llama3)
        require(count[0] == 4 && count[1] == 1 && count[2] == 3,
                "llama3 regions: %d unchanged, %d smoothed, %d divided; want 4, 1, 3", count[0],
                count[1], count[2]);
    free(cs), free(sn);
}
END_TEST

typedef struct {
    double *x, *cs, *sn;
    int s, M, H, HD;
} rope_ctx;

static void rope_fwd(void *c_, double *out) {
    rope_ctx *c = c_;
    memcpy(out, c->x, sizeof *out * (size_t)c->M * c->H * c->HD);
    rope_forward(out, c->cs, c->sn, c->s, c->M, c->H, c->HD);
}

/* Rows at positions s = 3 .. 7, the llama3 table (the rotation is the same code either way). */
START_TEST(rope_fd) {
    const int s = 3, M = 5, H = 3, HD = 8, half = HD / 2, T = s + M + 2;
    const size_t n = (size_t)M * H * HD;
    const uint64_t seed = 301;
    rope_ctx c = {
        randn(n, seed, 1, 0), zeros((size_t)T * half), zeros((size_t)T * half), s, M, H, HD};
    rope_table(c.cs, c.sn, T, HD, 500000, 1, 8, 1, 4, 64);
    double *y = zeros(n), *want = zeros(n), *r = randn(n, seed + 1, 1, 0);
    rope_fwd(&c, y);
    /* (a, b) → (a cos − b sin, b cos + a sin) at angle (s + row)·inv_freq[i] */
    for (int m = 0; m < M; m++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < half; i++) {
                int region;
                long double f = inv_freq_ref(i, HD, 500000, 1, 8, 1, 4, 64, &region);
                long double ang = (s + m) * f, a = c.x[(m * H + h) * HD + i],
                            b = c.x[(m * H + h) * HD + half + i];
                want[(m * H + h) * HD + i] = (double)(a * cosl(ang) - b * sinl(ang));
                want[(m * H + h) * HD + half + i] = (double)(b * cosl(ang) + a * sinl(ang));
            }
    assert_close("rope_forward at s = 3", y, want, n, 1e-15, 1e-14);

    double *g = dup(r, n);
    rope_backward(g, c.cs, c.sn, s, M, H, HD);
    /* linear: measured max |fd − g| 1.5e-11 */
    fd_check("rope dx", rope_fwd, &c, c.x, n, g, r, n, 1e-9, 1e-9, 0, seed);
    free(c.x), free(c.cs), free(c.sn), free(y), free(want), free(r), free(g);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * Attention */

typedef struct {
    int NH, NKV, HD, T, blk;
    int pad; /* 1: keys [0, 2) and one hole masked, plus right padding (see make_mask) */
} attn_cfg;

/* Left padding (keys [0, lp): the first lp queries see no key at all), a hole of masked keys in
 * the middle, and right padding at the end. */
static uint8_t *make_mask(int T, int pad) {
    uint8_t *m = malloc((size_t)T);
    ck_assert_ptr_nonnull(m);
    int lp = T > 40 ? 5 : 2, hole = T / 2, holen = T > 40 ? 6 : 1, rp = T > 40 ? 7 : 2;
    for (int j = 0; j < T; j++)
        m[j] = !pad || !(j < lp || (j >= hole && j < hole + holen) || j >= T - rp);
    return m;
}

static int first_visible(const uint8_t *kmask, int T) {
    int j = 0;
    while (j < T && !kmask[j]) j++;
    return j;
}

/* The dense softmax of ref/SEMANTICS.md, in long double: for query i and head h, o = Σ_j
 * softmax_j(q·k_j/√HD)·v_j over visible keys, lse = log Σ_j exp(q·k_j/√HD). */
static void attn_naive(double *o, double *lse, const double *q, const double *k, const double *v,
                       const uint8_t *kmask, int s, int M, int NH, int NKV, int HD) {
    const int Q = NH * HD, KV = NKV * HD;
    long double *sc = calloc((size_t)(s + M), sizeof *sc), *acc = calloc((size_t)HD, sizeof *acc);
    ck_assert_ptr_nonnull(sc);
    ck_assert_ptr_nonnull(acc);
    for (int r = 0; r < M; r++)
        for (int h = 0; h < NH; h++) {
            const int i = s + r, g = h / (NH / NKV);
            long double mx = -INFINITY, sum = 0;
            for (int j = 0; j <= i; j++) {
                if (!kmask[j]) continue;
                long double d = 0;
                for (int x = 0; x < HD; x++)
                    d +=
                        (long double)q[(size_t)r * Q + h * HD + x] * k[(size_t)j * KV + g * HD + x];
                sc[j] = d / sqrtl(HD);
                mx = fmaxl(mx, sc[j]);
            }
            for (int x = 0; x < HD; x++) acc[x] = 0;
            for (int j = 0; j <= i; j++) {
                if (!kmask[j]) continue;
                long double p = expl(sc[j] - mx);
                sum += p;
                for (int x = 0; x < HD; x++) acc[x] += p * v[(size_t)j * KV + g * HD + x];
            }
            for (int x = 0; x < HD; x++)
                o[(size_t)r * Q + h * HD + x] = sum > 0 ? (double)(acc[x] / sum) : 0;
            lse[(size_t)r * NH + h] = sum > 0 ? (double)(mx + logl(sum)) : INFINITY;
        }
    free(sc);
    free(acc);
}

/* Inputs, outputs and gradients of one attention problem over the whole sequence. */
typedef struct {
    attn_cfg c;
    int portable; /* the portable kernel (tiles of ATTN_TILE), else the fast one (tiles of
                     attention_tile(blk), products in tile_mm) */
    int Q, KV;
    double *q, *k, *v, *o, *lse, *r, *dq, *dk, *dv, *dsum, *scratch;
    uint8_t *kmask;
} attn_prob;

static void attn_init(attn_prob *p, attn_cfg c, uint64_t seed, int portable) {
    memset(p, 0, sizeof *p);
    p->c = c;
    p->Q = c.NH * c.HD;
    p->KV = c.NKV * c.HD;
    const size_t T = (size_t)c.T;
    p->q = randn(T * p->Q, seed, 1, 0);
    p->k = randn(T * p->KV, seed + 1, 1, 0);
    p->v = randn(T * p->KV, seed + 2, 1, 0);
    p->r = randn(T * p->Q, seed + 3, 1, 0);
    p->o = zeros(T * p->Q);
    p->lse = zeros(T * c.NH);
    p->dq = zeros(T * p->Q);
    p->dk = zeros(T * p->KV);
    p->dv = zeros(T * p->KV);
    p->dsum = zeros(T * c.NH);
    p->portable = portable;
    p->scratch = zeros(portable ? attention_workspace(c.HD)
                                : tiled_attention_workspace(c.blk, c.NH, c.NKV, c.HD));
    p->kmask = make_mask(c.T, c.pad);
}

static void attn_free(attn_prob *p) {
    free(p->q), free(p->k), free(p->v), free(p->r), free(p->o), free(p->lse), free(p->dq);
    free(p->dk), free(p->dv), free(p->dsum), free(p->scratch), free(p->kmask);
}

/* Forward over [s, e) into o and lse at rows s.. of the whole-sequence buffers. */
static sbp_attn_dims attn_dims(const attn_cfg *c, int s, int e) {
    return (sbp_attn_dims){.s = s,
                           .M = e - s,
                           .T = c->T,
                           .NH = c->NH,
                           .NKV = c->NKV,
                           .HD = c->HD,
                           .blk = c->blk,
                           .scale = 1.0 / sqrt((double)c->HD)};
}

static void attn_fwd_range(attn_prob *p, double *o, double *lse, int s, int e) {
    const attn_cfg c = p->c;
    const sbp_attn_dims d = attn_dims(&c, s, e);
    if (p->portable)
        attention_forward(o + (size_t)s * p->Q, lse + (size_t)s * c.NH, p->scratch,
                          p->q + (size_t)s * p->Q, p->k, p->v, p->kmask, &d);
    else
        tiled_attention_forward(o + (size_t)s * p->Q, lse + (size_t)s * c.NH, p->scratch,
                                p->q + (size_t)s * p->Q, p->k, p->v, p->kmask, &d);
}

/* Backward over queries [s, e), with dO = r and the saved o, lse of those rows. */
static void attn_bwd_range(attn_prob *p, double *dq, double *dk, double *dv, int s, int e) {
    const attn_cfg c = p->c;
    const size_t so = (size_t)s * p->Q, sl = (size_t)s * c.NH;
    const sbp_attn_dims d = attn_dims(&c, s, e);
    if (p->portable)
        attention_backward(dq + so, dk, dv, p->dsum + sl, p->scratch, p->r + so, p->o + so,
                           p->lse + sl, p->q + so, p->k, p->v, p->kmask, &d);
    else
        tiled_attention_backward(dq + so, dk, dv, p->dsum + sl, p->scratch, p->r + so, p->o + so,
                                 p->lse + sl, p->q + so, p->k, p->v, p->kmask, &d);
}

static void attn_fwd(void *p_, double *o) {
    attn_prob *p = p_;
    double *lse = zeros((size_t)p->c.T * p->c.NH);
    attn_fwd_range(p, o, lse, 0, p->c.T);
    free(lse);
}

static const char *cfg_name(const attn_prob *p) {
    static char buf[160];
    const attn_cfg *c = &p->c;
    snprintf(buf, sizeof buf, "%s NH %d NKV %d HD %d T %d, tile %d%s",
             p->portable ? "portable" : "blas", c->NH, c->NKV, c->HD, c->T,
             p->portable ? ATTN_TILE : attention_tile(c->blk), c->pad ? ", padded" : "");
    return buf;
}

/* Forward against attn_naive, the no-visible-key rows, FD of dq/dk/dv (every element when
 * nsample is 0), and the accumulation contract. */
static void attn_check(attn_cfg c, int nsample, uint64_t seed, int portable) {
    attn_prob p;
    attn_init(&p, c, seed, portable);
    const size_t T = (size_t)c.T, nq = T * p.Q, nkv = T * p.KV;
    char what[320];
    const char *name = cfg_name(&p);
    attn_fwd_range(&p, p.o, p.lse, 0, c.T);
    double *want_o = zeros(nq), *want_lse = zeros(T * c.NH);
    attn_naive(want_o, want_lse, p.q, p.k, p.v, p.kmask, 0, c.T, c.NH, c.NKV, c.HD);
    snprintf(what, sizeof what, "attention o, %s", name);
    assert_close(what, p.o, want_o, nq, 1e-14, 1e-13);
    snprintf(what, sizeof what, "attention lse, %s", name);
    assert_close(what, p.lse, want_lse, T * c.NH, 1e-14, 1e-14);

    snprintf(what, sizeof what, "attention o, %s", name);
    assert_all_finite(what, p.o, nq);
    attn_bwd_range(&p, p.dq, p.dk, p.dv, 0, c.T);
    snprintf(what, sizeof what, "attention dq, %s", name);
    assert_all_finite(what, p.dq, nq);
    snprintf(what, sizeof what, "attention dk, %s", name);
    assert_all_finite(what, p.dk, nkv);
    snprintf(what, sizeof what, "attention dv, %s", name);
    assert_all_finite(what, p.dv, nkv);
    /* queries before the first visible key see nothing: o = 0, lse = +inf, dq = 0; masked keys
     * get no gradient */
    const int fv = first_visible(p.kmask, c.T);
    for (int i = 0; i < fv; i++)
        for (int h = 0; h < c.NH; h++) {
            require(p.lse[(size_t)i * c.NH + h] == INFINITY,
                    "%s: query %d (no visible key) head %d: lse %g, want +inf", name, i, h,
                    p.lse[(size_t)i * c.NH + h]);
            for (int x = 0; x < c.HD; x++) {
                require(p.o[(size_t)i * p.Q + h * c.HD + x] == 0,
                        "%s: query %d (no visible key): o = %g, want 0", name, i,
                        p.o[(size_t)i * p.Q + h * c.HD + x]);
                require(p.dq[(size_t)i * p.Q + h * c.HD + x] == 0,
                        "%s: query %d (no visible key): dq = %g, want 0", name, i,
                        p.dq[(size_t)i * p.Q + h * c.HD + x]);
            }
        }
    for (int j = 0; j < c.T; j++)
        if (!p.kmask[j])
            for (int x = 0; x < p.KV; x++)
                require(p.dk[(size_t)j * p.KV + x] == 0 && p.dv[(size_t)j * p.KV + x] == 0,
                        "%s: masked key %d has dk %g dv %g, want 0", name, j,
                        p.dk[(size_t)j * p.KV + x], p.dv[(size_t)j * p.KV + x]);

    /* measured max |fd − g| over all configurations: 1.3e-10 (dq), 3.1e-10 (dk), 1.1e-10 (dv) */
    snprintf(what, sizeof what, "attention dq %s", name);
    fd_check(what, attn_fwd, &p, p.q, nq, p.dq, p.r, nq, 2e-9, 1e-8, nsample, seed);
    snprintf(what, sizeof what, "attention dk %s", name);
    fd_check(what, attn_fwd, &p, p.k, nkv, p.dk, p.r, nq, 2e-9, 1e-8, nsample, seed + 1);
    snprintf(what, sizeof what, "attention dv %s", name);
    fd_check(what, attn_fwd, &p, p.v, nkv, p.dv, p.r, nq, 2e-9, 1e-8, nsample, seed + 2);

    double *pq = randn(nq, seed + 7, 1, 0), *pk = randn(nkv, seed + 8, 1, 0);
    double *pv = randn(nkv, seed + 9, 1, 0);
    double *aq = dup(pq, nq), *ak = dup(pk, nkv), *av = dup(pv, nkv);
    attn_bwd_range(&p, aq, ak, av, 0, c.T);
    assert_accumulated("attention dq", aq, pq, p.dq, nq);
    assert_accumulated("attention dk", ak, pk, p.dk, nkv);
    assert_accumulated("attention dv", av, pv, p.dv, nkv);
    free(pq), free(pk), free(pv), free(aq), free(ak), free(av), free(want_o), free(want_lse);
    attn_free(&p);
}

/* Small problems, every element checked. blk 4 (tiles of 4) cuts T = 13 into 4 tiles. GQA
 * ratios 1, 2, 4; HD 8 and 16; with and without padding. */
static const attn_cfg small_cfgs[] = {
    {4, 4, 8, 13, 4, 0},  {4, 4, 8, 13, 4, 1}, {4, 2, 8, 13, 4, 0},
    {4, 2, 16, 13, 4, 1}, {4, 1, 8, 13, 4, 1}, {4, 1, 16, 11, 8, 0},
};

/* _i / 2: the configuration; _i % 2: 0 BLAS tiles, 1 the portable kernel */
START_TEST(attention_fd_small) {
    attn_check(small_cfgs[_i / 2], 0, 401 + 10 * (uint64_t)(_i / 2), _i % 2);
}
END_TEST

/* T = 150 with tiles of 64 (blk 64) or 16 (blk 16): several key tiles per query, a partial
 * last tile; a random sample of 100 elements per gradient. */
static const attn_cfg large_cfgs[] = {
    {4, 4, 16, 150, 64, 1},
    {4, 2, 8, 150, 64, 1},
    {8, 2, 16, 150, 16, 1},
    {4, 1, 8, 150, 64, 0},
};

START_TEST(attention_fd_large) {
    attn_check(large_cfgs[_i / 2], 100, 501 + 10 * (uint64_t)(_i / 2), _i % 2);
}
END_TEST

/* Chunks [bounds[c], bounds[c+1]): the forward chunk by chunk and the backward chunk by chunk
 * in ascending order (own dq rows, shared whole-sequence dk/dv), against one call over [0, T).
 * Returns the largest |difference| / (max |value|) over o, lse, dq, dk, dv. */
static double attn_chunked_vs_whole(attn_prob *p, const int *bounds, int nb, int bitwise) {
    const attn_cfg c = p->c;
    const size_t T = (size_t)c.T, nq = T * p->Q, nkv = T * p->KV;
    memset(p->dq, 0, sizeof *p->dq * nq);
    memset(p->dk, 0, sizeof *p->dk * nkv);
    memset(p->dv, 0, sizeof *p->dv * nkv);
    attn_fwd_range(p, p->o, p->lse, 0, c.T);
    attn_bwd_range(p, p->dq, p->dk, p->dv, 0, c.T);
    double *o = zeros(nq), *lse = zeros(T * c.NH), *dq = zeros(nq), *dk = zeros(nkv),
           *dv = zeros(nkv);
    for (int b = 0; b + 1 < nb; b++) attn_fwd_range(p, o, lse, bounds[b], bounds[b + 1]);
    for (int b = 0; b + 1 < nb; b++) attn_bwd_range(p, dq, dk, dv, bounds[b], bounds[b + 1]);
    char what[320];
    const struct {
        const char *n;
        const double *got, *want;
        size_t len;
    } outs[] = {{"o", o, p->o, nq},
                {"lse", lse, p->lse, T * c.NH},
                {"dq", dq, p->dq, nq},
                {"dk", dk, p->dk, nkv},
                {"dv", dv, p->dv, nkv}};
    double worst = 0;
    for (int i = 0; i < 5; i++) {
        snprintf(what, sizeof what, "chunked attention %s (%s, chunks from %d, %d, ...)", outs[i].n,
                 cfg_name(p), bounds[0], bounds[1]);
        if (bitwise) assert_bitwise(what, outs[i].got, outs[i].want, outs[i].len);
        double mx = 0, d = 0;
        for (size_t j = 0; j < outs[i].len; j++) {
            if (isinf(outs[i].want[j]) && outs[i].got[j] == outs[i].want[j]) continue;
            mx = fmax(mx, fabs(outs[i].want[j]));
            d = fmax(d, fabs(outs[i].got[j] - outs[i].want[j]));
        }
        worst = fmax(worst, mx > 0 ? d / mx : d);
    }
    free(o), free(lse), free(dq), free(dk), free(dv);
    return worst;
}

/* BLAS tiles: chunks on multiples of blk (the fast mode's contract for bitwise results) are
 * bit-identical to one call. Ragged chunks (0, 37, 64, 101, ...) cut tiles: with blk 16 the tile
 * [32, 48) becomes [32, 37) + [37, 48), so the tile products have other shapes (other bits from
 * BLAS, even in the forward) and the dK/dV sums over a tile's queries are grouped differently.
 * They agree within rounding: measured max difference 5.7e-16 relative to the largest value.
 * The portable kernel: every split, ragged ones included, is bit-identical (_i >= 3). */
static const struct {
    attn_cfg c;
    int aligned[8], naligned;
} chunk_cfgs[] = {
    {{4, 2, 16, 150, 16, 1}, {0, 32, 48, 96, 112, 150}, 6},
    {{8, 2, 8, 150, 16, 0}, {0, 16, 32, 64, 144, 150}, 6},
    {{4, 1, 16, 150, 64, 1}, {0, 64, 128, 150}, 4},
};

START_TEST(attention_chunk_invariance) {
    const int n = (int)(sizeof chunk_cfgs / sizeof chunk_cfgs[0]), i = _i % n, portable = _i >= n;
    attn_prob p;
    attn_init(&p, chunk_cfgs[i].c, 601 + (uint64_t)i, portable);
    static const int ragged[] = {0, 37, 64, 101, 149, 150}, single[] = {0, 1, 2, 3, 150};
    attn_chunked_vs_whole(&p, chunk_cfgs[i].aligned, chunk_cfgs[i].naligned, 1);
    double e = attn_chunked_vs_whole(&p, ragged, 6, portable);
    if (portable) attn_chunked_vs_whole(&p, single, 5, 1);
    if (getenv("SBP_FD_REPORT"))
        fprintf(stderr, "attention ragged chunks %s: relative max difference %.2e\n", cfg_name(&p),
                e);
    require(e <= 1e-14, "%s: ragged chunks differ from one call by %.3g (relative)", cfg_name(&p),
            e);
    attn_free(&p);
}
END_TEST

/* 1 and 2 OpenMP threads give the same bits (every output has one owner). _i: 0 BLAS tiles,
 * 1 the portable kernel. */
START_TEST(attention_thread_invariance) {
    const attn_cfg c = {8, 2, 16, 150, 64, 1};
    double *res[2][5];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        attn_prob p;
        attn_init(&p, c, 701, _i); /* scratch sized for the thread count just set */
        attn_fwd_range(&p, p.o, p.lse, 0, c.T);
        attn_bwd_range(&p, p.dq, p.dk, p.dv, 0, 64);
        attn_bwd_range(&p, p.dq, p.dk, p.dv, 64, c.T);
        res[t][0] = dup(p.o, (size_t)c.T * p.Q);
        res[t][1] = dup(p.lse, (size_t)c.T * c.NH);
        res[t][2] = dup(p.dq, (size_t)c.T * p.Q);
        res[t][3] = dup(p.dk, (size_t)c.T * p.KV);
        res[t][4] = dup(p.dv, (size_t)c.T * p.KV);
        attn_free(&p);
    }
    static const char *names[] = {"o", "lse", "dq", "dk", "dv"};
    const size_t len[] = {(size_t)c.T * c.NH * c.HD, (size_t)c.T * c.NH, (size_t)c.T * c.NH * c.HD,
                          (size_t)c.T * c.NKV * c.HD, (size_t)c.T * c.NKV * c.HD};
    char what[64];
    for (int i = 0; i < 5; i++) {
        snprintf(what, sizeof what, "attention %s, 2 threads vs 1", names[i]);
        assert_bitwise(what, res[1][i], res[0][i], len[i]);
        free(res[0][i]), free(res[1][i]);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * SwiGLU: h = silu(g)·u */

typedef struct {
    double *g, *u;
    size_t n;
} swi_ctx;

static void swi_fwd(void *c_, double *h) {
    swi_ctx *c = c_;
    swiglu_forward(h, c->g, c->u, c->n);
}

START_TEST(swiglu_fd) {
    const size_t n = 64;
    const uint64_t seed = 801;
    swi_ctx c = {randn(n, seed, 3, 0), randn(n, seed + 1, 1, 0), n};
    c.g[0] = 30, c.g[1] = -30, c.g[2] = 0; /* saturated sigmoid both ways, and silu'(0) = 1/2 */
    double *r = randn(n, seed + 2, 1, 0), *h = zeros(n), *want = zeros(n);
    swi_fwd(&c, h);
    for (size_t i = 0; i < n; i++)
        want[i] = (double)((long double)c.g[i] / (1 + expl(-(long double)c.g[i])) * c.u[i]);
    assert_close("swiglu_forward h", h, want, n, 1e-15, 4e-15);
    double *dg = zeros(n), *du = zeros(n);
    swiglu_backward(dg, du, r, c.g, c.u, n);
    /* measured max |fd − g|: 1.1e-10 (dg), 8.8e-12 (du) */
    fd_check("swiglu dg", swi_fwd, &c, c.g, n, dg, r, n, 1e-9, 1e-8, 0, seed);
    fd_check("swiglu du", swi_fwd, &c, c.u, n, du, r, n, 1e-9, 1e-8, 0, seed);
    double *pg = randn(n, seed + 3, 1, 0), *pu = randn(n, seed + 4, 1, 0);
    double *ag = dup(pg, n), *au = dup(pu, n);
    swiglu_backward(ag, au, r, c.g, c.u, n);
    assert_accumulated("swiglu dg", ag, pg, dg, n);
    assert_accumulated("swiglu du", au, pu, du, n);
    free(c.g), free(c.u), free(r), free(h), free(want), free(dg), free(du), free(pg), free(pu);
    free(ag), free(au);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * embedding */

typedef struct {
    double *emb;
    const int32_t *ids;
    int T, C;
} emb_ctx;

static void emb_fwd(void *c_, double *x) {
    emb_ctx *c = c_;
    embedding_forward(x, c->ids, c->emb, c->T, c->C);
}

START_TEST(embedding_fd) {
    enum { V = 7, C = 5, T = 12 };
    /* ids 1 and 4 repeat (three and four times), 6 never occurs */
    static const int32_t ids[T] = {1, 4, 0, 4, 1, 2, 4, 3, 5, 1, 4, 0};
    const uint64_t seed = 901;
    emb_ctx c = {randn(V * C, seed, 1, 0), ids, T, C};
    double *r = randn(T * C, seed + 1, 1, 0), *x = zeros(T * C);
    emb_fwd(&c, x);
    for (int t = 0; t < T; t++) assert_bitwise("embedding row", x + t * C, c.emb + ids[t] * C, C);
    double *demb = zeros(V * C), *want = zeros(V * C);
    embedding_backward(demb, r, ids, T, C);
    for (int t = 0; t < T; t++) /* the scatter-add in ascending t, as the contract says */
        for (int j = 0; j < C; j++) want[ids[t] * C + j] += r[t * C + j];
    assert_bitwise("embedding demb (ascending-t scatter-add)", demb, want, V * C);
    for (int j = 0; j < C; j++) require(demb[6 * C + j] == 0, "unused id 6 got a gradient");
    fd_check("embedding demb", emb_fwd, &c, c.emb, V * C, demb, r, T * C, 1e-9, 1e-9, 0, seed);
    double *pre = randn(V * C, seed + 2, 1, 0), *acc = dup(pre, V * C);
    embedding_backward(acc, r, ids, T, C);
    assert_accumulated("embedding demb", acc, pre, demb, V * C);
    free(c.emb), free(r), free(x), free(demb), free(want), free(pre), free(acc);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * log-probabilities */

typedef struct {
    double *logits;
    const int32_t *target;
    int M, V;
} lp_ctx;

static void lp_fwd(void *c_, double *logp) {
    lp_ctx *c = c_;
    double *lse = zeros((size_t)c->M);
    logprob_forward(logp, lse, c->logits, c->target, c->M, c->V);
    free(lse);
}

START_TEST(logprob_fd) {
    enum { M = 6, V = 11 };
    static const int32_t target[M] = {3, -1, 0, 10, 7, 5};
    const double coef[M] = {0.7, 1.3, -2.1, 0.4, 0, 1.1}; /* row 1: target −1; row 4: coef 0 */
    const uint64_t seed = 1001;
    lp_ctx c = {randn(M * V, seed, 2, 0), target, M, V};
    for (int v = 0; v < V; v++) c.logits[5 * V + v] += 1000; /* a row far from 0 */
    double logp[M], lse[M];
    logprob_forward(logp, lse, c.logits, target, M, V);
    for (int m = 0; m < M; m++) {
        if (target[m] < 0) {
            require(logp[m] == 0 && lse[m] == 0, "row %d (target -1): logp %g lse %g", m, logp[m],
                    lse[m]);
            continue;
        }
        long double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) mx = fmaxl(mx, c.logits[m * V + v]);
        for (int v = 0; v < V; v++) sum += expl(c.logits[m * V + v] - mx);
        long double l = mx + logl(sum), lp = c.logits[m * V + target[m]] - l;
        require(fabsl(lse[m] - l) <= 1e-15L * fabsl(l) && fabsl(logp[m] - lp) <= 1e-13L,
                "row %d: lse %.17g logp %.17g, want %.17Lg %.17Lg", m, lse[m], logp[m], l, lp);
    }
    double *g = dup(c.logits, M * V);
    logprob_backward(g, coef, lse, target, M, V);
    for (int v = 0; v < V; v++)
        require(g[1 * V + v] == 0 && g[4 * V + v] == 0,
                "logits gradient of a skipped row is not 0 (rows 1, 4: %g, %g)", g[V + v],
                g[4 * V + v]);
    /* Row 5 (logits near 1000) carries rounding ε·1000 in logp, ε·1000/h ≈ 2e-8 in the FD:
     * measured max |fd − g| 3.3e-9 there. */
    fd_check("logprob dlogits", lp_fwd, &c, c.logits, M * V, g, coef, M, 2e-8, 1e-8, 0, seed);
    free(c.logits), free(g);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * round_to_bf16: the float → bfloat16 rounding of safetensors.c (tested exhaustively in
 * test_io.c), applied in place. Inputs are floats widened to double: the engine rounds only in
 * the float32 build (sbp_grad refuses emulate_bf16 for fp64 models); in the float64 build the
 * kernel goes through (float)x first, which rounds twice for doubles that are not floats.
 * n > 65536 takes the kernel's OpenMP path. */
START_TEST(round_to_bf16_matches_conversion) {
    const size_t n = 100000;
    double *x = zeros(n), *want = zeros(n);
    sbp_rng r;
    sbp_rng_seed(&r, 1301);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)sbp_rng_next(&r);
        float f;
        memcpy(&f, &u, 4);
        if (i < 4) f = (float[]){INFINITY, -INFINITY, 0x1.fep127f, 1 + 0x1p-8f}[i];
        x[i] = f;
        want[i] = isnan(f) ? f : sbp_bf16_to_f32(sbp_f32_to_bf16(f));
    }
    round_to_bf16(x, n);
    for (size_t i = 0; i < n; i++)
        require(isnan(want[i]) ? isnan(x[i]) : x[i] == want[i], "round_to_bf16[%zu]: %a, want %a",
                i, x[i], want[i]);
    free(x), free(want);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * pmath.h: our own exp, log, log1p, sin and cos (explicit fma, no libm), against libm in long
 * double (80-bit, 11 more bits than double). Errors in ULP of the exact result. */

static double ulp_of(double x, int is_float) {
    int e;
    frexp(x, &e); /* |x| in [2^(e−1), 2^e) */
    const double u = ldexp(1.0, e - 1 - (is_float ? 23 : 52)),
                 sub = is_float ? 0x1p-149 : 0x1p-1074;
    return u > sub ? u : sub; /* subnormal results: the spacing of the subnormals */
}

enum { F_EXPF, F_EXP, F_LOGF, F_LOG, F_LOG1P, F_SIN, F_COS };

static double ulp_err(int f, double x) {
    long double want;
    double got;
    switch (f) {
    case F_EXPF: want = expl((float)x), got = sbp_pexpf((float)x); break;
    case F_EXP: want = expl(x), got = sbp_pexp(x); break;
    case F_LOGF: want = logl((float)x), got = sbp_plogf((float)x); break;
    case F_LOG: want = logl(x), got = sbp_plog(x); break;
    case F_LOG1P: want = log1pl(x), got = sbp_plog1p(x); break;
    case F_SIN: want = sinl(x), got = sbp_psin(x); break;
    default: want = cosl(x), got = sbp_pcos(x); break;
    }
    const int is_float = f == F_EXPF || f == F_LOGF;
    return (double)(fabsl((long double)got - want) / (long double)ulp_of((double)want, is_float));
}

/* The largest error over n points (seeded), uniform in [lo, hi) or, with log_scale, in
 * [exp(lo), exp(hi)); *at gets its argument. Results smaller than `floor` in magnitude are
 * skipped (an absolute error near a zero of sin or log is not a relative one). */
static double worst_ulp(int f, double lo, double hi, int log_scale, double floor, int n,
                        uint64_t seed, double *at) {
    sbp_rng r;
    sbp_rng_seed(&r, seed);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double u = lo + (hi - lo) * sbp_rng_uniform(&r), x = log_scale ? exp(u) : u;
        if (f == F_EXPF || f == F_LOGF) x = (float)x;
        long double want = f == F_LOG || f == F_LOGF ? logl(x) : f == F_SIN ? sinl(x) : cosl(x);
        if ((f == F_LOG || f == F_LOGF || f == F_SIN || f == F_COS) && fabsl(want) < floor)
            continue;
        double e = ulp_err(f, x);
        if (e > worst) worst = e, *at = x;
    }
    return worst;
}

/* Measured on 3·10^5 points each (the same at -O3 and -O1: nothing is contracted):
 *   expf over [−87, 88.7] 0.91 ulp and over [−103, −87] (subnormal results) 0.83; exp over
 *   [−700, 709.7] 0.85, [−708, −700] 0.84 and [−744, −708] (subnormal) 0.91; logf over
 *   [e^−87, e^88] 0.75; log over [e^−700, e^700] 0.71; log1p over [0, 1e-3] 1.0; sin and cos
 *   over [0, 10^6] 2.2.
 * Bounds: 1.5 ulp (2.5 at the bottom of exp's normal range, 3 for sin and cos). */
START_TEST(pmath_ulp) {
    static const struct {
        int f;
        double lo, hi;
        int log_scale;
        double floor, bound;
        const char *name;
    } cases[] = {
        {F_EXPF, -87, 88.7, 0, 0, 1.5, "expf"},      {F_EXP, -700, 709.7, 0, 0, 1.5, "exp"},
        {F_EXP, -708, -700, 0, 0, 2.5, "exp (low)"}, {F_EXPF, -103, -87, 0, 0, 1.5, "expf (sub)"},
        {F_EXP, -744, -708, 0, 0, 1.5, "exp (sub)"}, {F_LOGF, -87, 88, 1, 1e-3, 1.5, "logf"},
        {F_LOG, -700, 700, 1, 1e-3, 1.5, "log"},     {F_LOG1P, 0, 1e-3, 0, 0, 1.5, "log1p"},
        {F_SIN, 0, 1e6, 0, 1e-3, 3, "sin"},          {F_COS, 0, 1e6, 0, 1e-3, 3, "cos"},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        double at = 0;
        double w = worst_ulp(cases[i].f, cases[i].lo, cases[i].hi, cases[i].log_scale,
                             cases[i].floor, 300000, 1101 + (uint64_t)i, &at);
        if (getenv("SBP_FD_REPORT"))
            fprintf(stderr, "pmath %-10s max error %.3f ulp\n", cases[i].name, w);
        require(w <= cases[i].bound, "%s(%a): %.3f ulp > %.1f", cases[i].name, at, w,
                cases[i].bound);
    }
    ck_assert(sbp_pexp(0) == 1 && sbp_pexpf(0) == 1 && sbp_plog(1) == 0 && sbp_plogf(1) == 0);
    ck_assert(sbp_pexp(-INFINITY) == 0 && sbp_pexpf(-INFINITY) == 0);
    ck_assert(sbp_pexp(-1000) == 0 && sbp_pexpf(-110) == 0);
    ck_assert(sbp_pexp(-744.4) == 0x1p-1074 && sbp_pexpf(-103.2f) == 0x1p-149f); /* smallest */
    ck_assert(sbp_pexp(INFINITY) == INFINITY && sbp_pexpf(INFINITY) == INFINITY);
    ck_assert(sbp_pexp(710) == INFINITY && sbp_pexpf(89) == INFINITY);
    ck_assert(isnan(sbp_pexp(NAN)) && isnan(sbp_pexpf(NAN)) && isnan(sbp_plog(-1)));
    ck_assert(sbp_plog(0) == -INFINITY && sbp_plog(INFINITY) == INFINITY);
    ck_assert(fabs(sbp_plog(0x1p-1074) - log(0x1p-1074)) < 1e-12); /* subnormal input */
    ck_assert(sbp_psin(0) == 0 && sbp_pcos(0) == 1 && isnan(sbp_psin(INFINITY)));
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * The portable product: bit for bit the chain c ← fma(a(i,p), b(p,j), c), p ascending from the
 * stored c, for shapes with partial register tiles, several row blocks (M > 48) and k blocks
 * (K > 512 with AVX-512, 256 otherwise), transposed and
 * strided operands, and 1 or 2 threads. */

static void chain_ref(double *C, size_t ldc, const double *A, size_t rsa, size_t csa,
                      const double *B, size_t rsb, size_t csb, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double c = C[(size_t)i * ldc + j];
            for (int p = 0; p < K; p++) c = fma(A[i * rsa + p * csa], B[p * rsb + j * csb], c);
            C[(size_t)i * ldc + j] = c;
        }
}

START_TEST(pgemm_chains) {
    static const int shapes[][3] = {{1, 1, 1},      {7, 5, 3},    {13, 37, 300},
                                    {100, 70, 600}, {9, 33, 257}, {61, 45, 1100}};
    for (int t = 1; t <= 2; t++) {
        omp_set_num_threads(t);
        for (int si = 0; si < 6; si++)
            for (int tr = 0; tr < 4; tr++) { /* A and B each plain or transposed */
                const int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
                double *ws = zeros(pgemm_workspace(N, K)); /* exact: ASan checks the bound */
                const size_t ldc = (size_t)N + 3;          /* C rows with a gap */
                double *A = randn((size_t)M * K, 1201 + (uint64_t)si, 1, 0);
                double *B = randn((size_t)K * N, 1211 + (uint64_t)si, 1, 0);
                double *C = randn((size_t)M * ldc, 1221 + (uint64_t)si, 1, 0);
                double *R = dup(C, (size_t)M * ldc);
                /* pgemm_set: C's elements NaN beforehand (ignored), the gaps kept */
                double *S = dup(C, (size_t)M * ldc), *RS = dup(C, (size_t)M * ldc);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) S[i * ldc + j] = NAN, RS[i * ldc + j] = 0;
                const size_t rsa = tr & 1 ? 1 : (size_t)K, csa = tr & 1 ? (size_t)M : 1;
                const size_t rsb = tr & 2 ? 1 : (size_t)N, csb = tr & 2 ? (size_t)K : 1;
                pgemm(C, ldc, ws, A, rsa, csa, B, rsb, csb, M, N, K);
                chain_ref(R, ldc, A, rsa, csa, B, rsb, csb, M, N, K);
                pgemm_set(S, ldc, ws, A, rsa, csa, B, rsb, csb, M, N, K);
                chain_ref(RS, ldc, A, rsa, csa, B, rsb, csb, M, N, K);
                char what[96];
                snprintf(what, sizeof what, "pgemm %dx%dx%d transposes %d, %d threads", M, N, K, tr,
                         t);
                assert_bitwise(what, C, R, (size_t)M * ldc);
                snprintf(what, sizeof what, "pgemm_set %dx%dx%d transposes %d, %d threads", M, N, K,
                         tr, t);
                assert_bitwise(what, S, RS, (size_t)M * ldc);
                free(A), free(B), free(C), free(R), free(S), free(RS), free(ws);
            }
    }
    omp_set_num_threads(1);
}
END_TEST

/* The float32 product through its public entry, C = A·Bᵀ: A's k steps and B's are contiguous,
 * so on AVX-512 both packs take their in-register transposes (16 k steps a block, then a scalar
 * tail) — code the float64 objects above do not have. Shapes cover a partial row panel (mr <
 * 12), column panels of < 16 and 16–31 columns, k tails below and above 16 and two k blocks;
 * each element must be the fmaf chain from 0. */
START_TEST(pgemm_f32_chains) {
    static const int shapes[][3] = {{1, 1, 1},      {12, 32, 16},    {13, 37, 300}, {61, 45, 17},
                                    {100, 33, 512}, {50, 100, 1030}, {7, 70, 31}};
    for (int t = 1; t <= 2; t++) {
        omp_set_num_threads(t);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
            double *a = randn((size_t)M * K, 1301 + si, 1, 0),
                   *b = randn((size_t)N * K, 1311 + si, 1, 0);
            float *A = malloc(sizeof *A * (size_t)M * K), *B = malloc(sizeof *B * (size_t)N * K);
            float *C = malloc(sizeof *C * (size_t)M * N), *R = malloc(sizeof *R * (size_t)M * N);
            for (size_t i = 0; i < (size_t)M * N; i++) C[i] = NAN; /* must be ignored */
            for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)a[i];
            for (size_t i = 0; i < (size_t)N * K; i++) B[i] = (float)b[i];
            ck_assert_int_eq(sbp_portable_gemm_f32(C, A, B, M, N, K), 0);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    float c = 0;
                    for (int p = 0; p < K; p++)
                        c = fmaf(A[(size_t)i * K + p], B[(size_t)j * K + p], c);
                    R[(size_t)i * N + j] = c;
                }
            ck_assert_msg(memcmp(C, R, sizeof *C * (size_t)M * N) == 0,
                          "sbp_portable_gemm_f32 %dx%dx%d, %d threads: not the fmaf chains", M, N,
                          K, t);
            free(a), free(b), free(A), free(B), free(C), free(R);
        }
    }
    omp_set_num_threads(1);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * The attention tiles' product (fast/tile_mm.c): bit for bit alpha·(one fma chain from 0, p
 * ascending), added to C when beta, for every element — whether it falls in a full register
 * block, a single-row block, a one-vector column block or the scalar tail — with A plain or
 * read transposed in place, C and B rows with gaps. The shapes are those of the tiles (128 ×
 * 128 × 64, 128 × 64 × 128) and ragged ones that reach every edge path. */
START_TEST(tile_mm_chains) {
    /* m > 6 with k ≤ 256 takes the AVX2 path that copies B's strips; {7, 17, 257} the one that
     * reads B in place past it */
    static const int shapes[][3] = {{1, 1, 1},      {7, 5, 3},    {13, 37, 64}, {128, 128, 64},
                                    {128, 64, 128}, {9, 70, 129}, {6, 33, 1},   {7, 17, 257}};
    for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++)
        for (int form = 0; form < 8; form++) { /* A transposed, beta, alpha = 1 or 1/8 */
            const int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
            const int tr = form & 1, beta = form >> 1 & 1;
            const double alpha = form & 4 ? 0.125 : 1;
            const size_t ldc = (size_t)N + 3, ldb = (size_t)N + 5;
            double *A = randn((size_t)M * K, 1301 + (uint64_t)si, 1, 0);
            double *B = randn((size_t)K * ldb, 1311 + (uint64_t)si, 1, 0);
            double *C = randn((size_t)M * ldc, 1321 + (uint64_t)si, 1, 0);
            double *R = dup(C, (size_t)M * ldc);
            const size_t ars = tr ? 1 : (size_t)K, acs = tr ? (size_t)M : 1;
            tile_mm(C, ldc, A, ars, acs, B, ldb, M, N, K, alpha, beta);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double acc = 0;
                    for (int p = 0; p < K; p++)
                        acc = fma(A[i * ars + p * acs], B[p * ldb + j], acc);
                    const double t = alpha * acc;
                    R[i * ldc + j] = beta ? R[i * ldc + j] + t : t;
                }
            char what[96];
            snprintf(what, sizeof what, "tile_mm %dx%dx%d, A %s, beta %d, alpha %g", M, N, K,
                     tr ? "transposed" : "plain", beta, alpha);
            assert_bitwise(what, C, R, (size_t)M * ldc);
            free(A), free(B), free(C), free(R);
        }
}
END_TEST

/* Checks with one thread: the finite differences call the kernels thousands of times on tiny
 * problems, where a second thread only adds fork/join waits (and stalls on a loaded machine).
 * The thread-count tests below show the results are the same bits with two. */
static void one_thread(void) {
    omp_set_num_threads(1);
}

static Suite *suite(void) {
    Suite *s = suite_create("kernels");
    TCase *tc = tcase_create("fd");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, one_thread, NULL);
    tcase_add_loop_test(tc, linear_fd, 0, 8);
    tcase_add_loop_test(tc, linear_block_split, 0, 4);
    tcase_add_test(tc, rmsnorm_fd);
    tcase_add_loop_test(tc, rope_table_formula, 0, 2);
    tcase_add_test(tc, rope_fd);
    tcase_add_loop_test(tc, attention_fd_small, 0,
                        2 * (int)(sizeof small_cfgs / sizeof small_cfgs[0]));
    tcase_add_loop_test(tc, attention_fd_large, 0,
                        2 * (int)(sizeof large_cfgs / sizeof large_cfgs[0]));
    tcase_add_test(tc, swiglu_fd);
    tcase_add_test(tc, embedding_fd);
    tcase_add_test(tc, logprob_fd);
    tcase_add_test(tc, round_to_bf16_matches_conversion);
    tcase_add_test(tc, pmath_ulp);
    tcase_add_test(tc, pgemm_chains);
    tcase_add_test(tc, pgemm_f32_chains);
    tcase_add_test(tc, tile_mm_chains);
    suite_add_tcase(s, tc);
    TCase *inv = tcase_create("invariance");
    tcase_set_timeout(inv, 120);
    tcase_add_loop_test(inv, attention_chunk_invariance, 0,
                        2 * (int)(sizeof chunk_cfgs / sizeof chunk_cfgs[0]));
    tcase_add_loop_test(inv, attention_thread_invariance, 0, 2);
    tcase_add_test(inv, linear_thread_invariance);
    suite_add_tcase(s, inv);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
