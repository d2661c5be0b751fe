/* blas_rates.c — one BLAS measured at the products a StreamBP step issues, for choosing a BLAS.
 *
 * Built once per library (`make bench-blas` links it against OpenBLAS, BLIS and MKL where each
 * is found) and run at 1 and 2 threads. It issues the fast mode's calls as the engine does
 * (src/kernels/fast/linear.c): per block of B = 256 tokens, y = x·Wᵀ (beta 0), dW += dyᵀ·x and
 * dx += dy·W (beta 1), for the seven projections of every layer and for the lm_head, and reports
 * their GFLOP/s beside one whole-sequence call per projection shape (what `streambp bench` calls
 * the sgemm rate) and a square 2048³ product.
 *
 * It also checks the two properties the fast mode's bitwise promises rest on, for that library:
 *   repeat  — the same call on the same operands gives the same bits (determinism);
 *   threads — a block's products give the same bits at 1 and at N threads (the tests compare
 *             1 against 2 threads).
 * A library that fails either cannot be a drop-in for OpenBLAS without weakening
 * docs/numerics.md §10. And a third, which the fast mode does not rely on:
 *   rows    — one call over all T rows gives every row the bits that the per-block calls give
 *             it (forward and dx, on one thread, on the largest layer shape and the lm_head).
 * Where it holds, a whole-sequence call could replace the per-block ones (measured ~10% faster
 * on one thread, docs/performance-log.md); where it does not, full BP's single call and StreamBP's
 * per-chunk calls would disagree.
 *
 * Usage: blas_rates NAME THREADS [C Q KV F V LAYERS T]   (default: the bench model, T = 2048)
 *        blas_rates --core   (the OpenBLAS build: the kernels OpenBLAS chose) */
#if defined(BLAS_MKL)
#include <mkl.h>
#elif defined(BLAS_BLIS)
#include <cblas.h>
#include <stdint.h>
void bli_thread_set_num_threads(int64_t n); /* blis.h's (dim_t is int64_t); that header warns */
#else
#include <cblas.h>
char *openblas_get_corename(void); /* not in every cblas.h */
#endif
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK  256
#define ROUNDS 3

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* n floats in [-0.5, 0.5), from a fixed LCG: every library sees the same operands */
static float *operand(size_t n, unsigned seed) {
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "blas_rates: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((seed >> 9) & 0xffff) / 65536.0f - 0.5f;
    }
    return p;
}

typedef struct {
    int T, L, nshape;
    int N[8], K[8]; /* projection shapes (out, in); the last one is the lm_head */
} model;

/* dst (T, N) = x (T, K) · w (N, K)ᵀ, then dW (N, K) += dyᵀ·x and dx (T, K) += dy·w, a block at a
 * time, as the fast mode issues them. */
static void block_products(float *y, float *dw, float *dx, const float *x, const float *dy,
                           const float *w, int T, int N, int K) {
    for (int r = 0; r < T; r += BLOCK) {
        const int m = T - r < BLOCK ? T - r : BLOCK;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, N, K, 1, x + (size_t)r * K, K, w, K,
                    0, y + (size_t)r * N, N);
    }
    for (int r = 0; r < T; r += BLOCK) {
        const int m = T - r < BLOCK ? T - r : BLOCK;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, m, 1, dy + (size_t)r * N, N,
                    x + (size_t)r * K, K, 1, dw, K);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, K, N, 1, dy + (size_t)r * N, N, w,
                    K, 1, dx + (size_t)r * K, K);
    }
}

/* Every library has its own thread setting; OpenMP's alone does not reach all of them. */
static void set_threads(int n) {
    omp_set_num_threads(n);
#if defined(BLAS_MKL)
    mkl_set_num_threads(n);
#elif defined(BLAS_BLIS)
    bli_thread_set_num_threads(n);
#else
    openblas_set_num_threads(n);
#endif
}

static double best_of(double a, double b) {
    return a < b ? a : b;
}

int main(int argc, char **argv) {
#if !defined(BLAS_MKL) && !defined(BLAS_BLIS)
    if (argc == 2 && !strcmp(argv[1], "--core")) {
        printf("%s\n", openblas_get_corename());
        return 0;
    }
#endif
    if (argc != 3 && argc != 10) {
        fprintf(stderr, "usage: blas_rates NAME THREADS [C Q KV F V LAYERS T]\n");
        return 2;
    }
    const char *name = argv[1];
    const int threads = atoi(argv[2]);
    int C = 512, Q = 512, KV = 256, F = 1408, V = 32000;
    model md = {.T = 2048, .L = 4};
    if (argc == 10) {
        C = atoi(argv[3]), Q = atoi(argv[4]), KV = atoi(argv[5]), F = atoi(argv[6]);
        V = atoi(argv[7]), md.L = atoi(argv[8]), md.T = atoi(argv[9]);
    }
    if (threads < 1 || C < 1 || Q < 1 || KV < 1 || F < 1 || V < 1 || md.L < 1 || md.T < 1) {
        fprintf(stderr, "blas_rates: every size and the thread count must be positive\n");
        return 2;
    }
    const int shapes[8][2] = {{Q, C}, {KV, C}, {KV, C}, {C, Q}, {F, C}, {F, C}, {C, F}, {V, C}};
    md.nshape = 8;
    for (int i = 0; i < 8; i++) md.N[i] = shapes[i][0], md.K[i] = shapes[i][1];
    set_threads(threads);

    size_t maxn = 0, maxk = 0;
    for (int i = 0; i < md.nshape; i++) {
        if ((size_t)md.N[i] > maxn) maxn = (size_t)md.N[i];
        if ((size_t)md.K[i] > maxk) maxk = (size_t)md.K[i];
    }
    const size_t T = (size_t)md.T;
    float *x = operand(T * maxk, 1), *dy = operand(T * maxn, 2), *w = operand(maxn * maxk, 3);
    float *y = operand(T * maxn, 4), *dw = operand(maxn * maxk, 5), *dx = operand(T * maxk, 6);
    float *sq[3] = {operand(2048 * 2048, 7), operand(2048 * 2048, 8), operand(2048 * 2048, 9)};

    double flop_layers = 0, flop_head = 0, flop_whole = 0;
    for (int i = 0; i < md.nshape; i++) {
        const double f = 2.0 * (double)T * md.N[i] * md.K[i];
        if (i < 7)
            flop_layers += 3 * f * md.L, flop_whole += f;
        else
            flop_head = 3 * f;
    }
    double t_layers = 1e30, t_head = 1e30, t_whole = 1e30, t_square = 1e30;
    for (int round = 0; round < ROUNDS; round++) { /* the best of ROUNDS; round 0 warms up */
        double t0 = now();
        for (int l = 0; l < md.L; l++)
            for (int i = 0; i < 7; i++) block_products(y, dw, dx, x, dy, w, md.T, md.N[i], md.K[i]);
        const double t1 = now();
        block_products(y, dw, dx, x, dy, w, md.T, md.N[7], md.K[7]);
        const double t2 = now();
        for (int i = 0; i < 7; i++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, md.T, md.N[i], md.K[i], 1, x,
                        md.K[i], w, md.K[i], 0, y, md.N[i]);
        const double t3 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2048, 2048, 2048, 1, sq[0], 2048,
                    sq[1], 2048, 0, sq[2], 2048);
        const double t4 = now();
        if (round == 0) continue;
        t_layers = best_of(t_layers, t1 - t0), t_head = best_of(t_head, t2 - t1);
        t_whole = best_of(t_whole, t3 - t2), t_square = best_of(t_square, t4 - t3);
    }

    /* The bitwise properties, on the largest layer shape (F, C): repeat, then 1 thread. */
    const int N = F, K = C;
    const size_t ny = T * (size_t)N, nw = (size_t)N * K, nx = T * (size_t)K;
    float *ref[3], *got[3];
    for (int j = 0; j < 3; j++) {
        ref[j] = operand(j == 0 ? ny : j == 1 ? nw : nx, 10);
        got[j] = operand(j == 0 ? ny : j == 1 ? nw : nx, 10);
    }
    block_products(ref[0], ref[1], ref[2], x, dy, w, md.T, N, K);
    block_products(got[0], got[1], got[2], x, dy, w, md.T, N, K);
    const int repeat = !memcmp(ref[0], got[0], ny * 4) && !memcmp(ref[1], got[1], nw * 4) &&
                       !memcmp(ref[2], got[2], nx * 4);
    for (int j = 0; j < 3; j++) free(got[j]);
    for (int j = 0; j < 3; j++) got[j] = operand(j == 0 ? ny : j == 1 ? nw : nx, 10);
    set_threads(1);
    block_products(got[0], got[1], got[2], x, dy, w, md.T, N, K);
    const int thread_inv = !memcmp(ref[0], got[0], ny * 4) && !memcmp(ref[1], got[1], nw * 4) &&
                           !memcmp(ref[2], got[2], nx * 4);

    /* rows: y and dx from one T-row call against per-block calls on the same operands (one
     * thread, set above); the lm_head case holds two more T × V products (~0.5 GB at the bench
     * model) */
    int rows_inv = 1;
    for (int sh = 0; sh < 2; sh++) {
        const int n = sh ? V : F;
        const size_t nyy = T * (size_t)n;
        float *yb = operand(nyy, 11), *yw = operand(nyy, 11), *xb = operand(nx, 12),
              *xw = operand(nx, 12), *db = operand((size_t)n * K, 13);
        block_products(yb, db, xb, x, dy, w, md.T, n, K);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, md.T, n, K, 1, x, K, w, K, 0, yw, n);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, md.T, K, n, 1, dy, n, w, K, 1, xw,
                    K);
        rows_inv = rows_inv && !memcmp(yb, yw, nyy * 4) && !memcmp(xb, xw, nx * 4);
        free(yb), free(yw), free(xb), free(xw), free(db);
    }

    printf("%-9s %d  %7.1f %7.1f %7.1f %7.1f   %-6s %-6s %s\n", name, threads,
           flop_layers / t_layers * 1e-9, flop_head / t_head * 1e-9, flop_whole / t_whole * 1e-9,
           2.0 * 2048 * 2048 * 2048 / t_square * 1e-9, repeat ? "same" : "DIFFER",
           rows_inv ? "same" : "DIFFER",
           threads == 1 ? "-"
           : thread_inv ? "same"
                        : "DIFFER");
    for (int j = 0; j < 3; j++) free(ref[j]), free(got[j]);
    free(x), free(dy), free(w), free(y), free(dw), free(dx);
    for (int j = 0; j < 3; j++) free(sq[j]);
    return 0;
}
