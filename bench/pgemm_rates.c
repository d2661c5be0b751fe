/* pgemm_rates.c — the portable product (src/kernels/gemm.c) against OpenBLAS at the products a
 * fast-mode step issues, for deciding PGEMM_TUNED (src/kernels/kernels.h) on an instruction set.
 *
 * Linked with the float32 objects of one build (`make bench-pgemm`, which takes that build's
 * -march: ARCH=x86-64-v3 gives the AVX2 kernel on any x86 with AVX2), it times, for every
 * projection shape of the bench model (C 512, Q 512, KV 256, F 1408, V 32000) at T tokens:
 *   pgemm  — linear_forward, linear_backward_blocked's dX and linear_backward_blocked's dW
 *            (src/kernels/linear.c): pgemm over all T rows, dW a part per token panel of 128
 *            folded in, what the fast mode runs where PGEMM_TUNED is 1;
 *   tiles  — blas_linear_forward / _backward (src/kernels/fast/linear.c): OpenBLAS on the fixed
 *            token-block grid (blocks of 512, the engine's default), what the fast mode runs
 *            where PGEMM_TUNED is 0;
 *   sgemm  — one cblas_sgemm over all T rows (the rate `streambp bench` calls the sgemm rate).
 * The three run one after another inside each round, ROUNDS rounds, so that a loaded machine's
 * swings hit all three alike; each cell is the median GFLOP/s and the ratio columns the median
 * over rounds of the per-round ratio. "step" sums the times of a step's products: per layer the
 * seven projections' forward, dX and dW (times LAYERS = 4), plus the LM head's three.
 * At 1 thread the times are the process's CPU time (a loaded machine's other processes add
 * nothing to it). A fourth argument (pgemm, tiles or sgemm) runs that way alone and prints
 * nothing: for a profiler (perf record) or a counter (perf stat) where the machine has them.
 *
 * Usage: pgemm_rates [THREADS [ROUNDS [T [WAY]]]]   (default 1 thread, 7 rounds, T = 2048) */
#include "../src/kernels/fast/fast.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

char *openblas_get_corename(void); /* not in every cblas.h */
void openblas_set_num_threads(int n);

enum {
    BLK = 512 /* the engine's default block */,
    LAYERS = 4,
    NSHAPE = 5,
    NPROD = 3,
    NWAY = 3,
    MAXROUNDS = 64
};

/* At 1 thread the process's CPU time, which a loaded machine's other processes do not add to
 * (they still share its caches); at more, the wall clock. */
static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void) {
    struct timespec t;
    clock_gettime(clock_id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* n floats in [-0.5, 0.5) from a fixed LCG */
static float *operand(size_t n, unsigned seed) {
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "pgemm_rates: out of memory (%zu floats)\n", n);
        exit(2);
    }
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((seed >> 9) & 0xffff) / 65536.0f - 0.5f;
    }
    return p;
}

/* One product (prod 0 forward y = x·Wᵀ, 1 dX += dy·W, 2 dW += dyᵀ·x) the way `way` computes it
 * (0 pgemm, 1 OpenBLAS tiles, 2 one cblas_sgemm); returns its seconds. y (T, N), dy (T, N),
 * x (T, K), dx (T, K), w (N, K), dw (N, K). */
static double run(int way, int prod, float *ws, float *part, float *y, float *dx, float *dw,
                  const float *x, const float *dy, const float *w, int T, int N, int K) {
    const double t0 = now();
    if (way == 0 && prod == 0) linear_forward(y, ws, x, w, NULL, 0, T, N, K);
    if (way == 0 && prod == 1)
        linear_backward_blocked(dx, NULL, NULL, ws, part, dy, x, w, 0, T, N, K, BLK);
    if (way == 0 && prod == 2)
        linear_backward_blocked(NULL, dw, NULL, ws, part, dy, x, w, 0, T, N, K, BLK);
    if (way == 1 && prod == 0) blas_linear_forward(y, x, w, NULL, 0, T, N, K, BLK);
    if (way == 1 && prod == 1) blas_linear_backward(dx, NULL, NULL, dy, x, w, 0, T, N, K, BLK);
    if (way == 1 && prod == 2) blas_linear_backward(NULL, dw, NULL, dy, x, w, 0, T, N, K, BLK);
    if (way == 2 && prod == 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, N, K, 1, x, K, w, K, 0, y, N);
    if (way == 2 && prod == 1)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, K, N, 1, dy, N, w, K, 1, dx, K);
    if (way == 2 && prod == 2)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, T, 1, dy, N, x, K, 1, dw, K);
    return now() - t0;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1, rounds = argc > 2 ? atoi(argv[2]) : 7;
    const int T = argc > 3 ? atoi(argv[3]) : 2048;
    static const char *way[NWAY] = {"pgemm", "tiles", "sgemm"};
    int only = -1;
    for (int v = 0; argc > 4 && v < NWAY; v++)
        if (!strcmp(argv[4], way[v])) only = v;
    if (argc > 5 || (argc > 4 && only < 0) || threads < 1 || rounds < 1 || rounds > MAXROUNDS ||
        T < 1) {
        fprintf(stderr, "usage: pgemm_rates [THREADS [ROUNDS (1-64) [T [pgemm|tiles|sgemm]]]]\n");
        return 2;
    }
    /* The tiles are serial calls inside OpenMP loops. OpenBLAS's OpenMP build sets OpenMP's
     * thread count too in openblas_set_num_threads, so it comes first: the other way round ran
     * every "2-thread" product on one thread. */
    openblas_set_num_threads(1);
    omp_set_num_threads(threads);
    if (threads == 1) clock_id = CLOCK_PROCESS_CPUTIME_ID;
    /* (N, K) and how many a step issues: q and o, k and v, gate and up, down, the head */
    static const int shape[NSHAPE][3] = {{512, 512, 2 * LAYERS},
                                         {256, 512, 2 * LAYERS},
                                         {1408, 512, 2 * LAYERS},
                                         {512, 1408, LAYERS},
                                         {32000, 512, 1}};
    static const char *pname[NPROD] = {"fwd", "dX", "dW"};
    const size_t maxn = 32000, maxk = 1408;
    float *x = operand((size_t)T * maxk, 1), *dy = operand((size_t)T * maxn, 2);
    float *w = operand(maxn * maxk, 3), *y = operand((size_t)T * maxn, 4);
    float *dw = operand(maxn * maxk, 5), *dx = operand((size_t)T * maxk, 6);
    size_t wsn = 0;
    for (int s = 0; s < NSHAPE; s++) {
        const size_t a = pgemm_workspace(shape[s][0], shape[s][1]),
                     b = pgemm_workspace(shape[s][1], shape[s][0]),
                     c = pgemm_workspace(shape[s][1], T), d = pgemm_workspace(shape[s][1], BLK);
        wsn = d > wsn ? d : wsn;
        wsn = a > wsn ? a : wsn, wsn = b > wsn ? b : wsn, wsn = c > wsn ? c : wsn;
    }
    float *ws = operand(wsn, 7), *part = operand(linear_blocked_workspace((int)maxk, BLK), 8);

    static double sec[NSHAPE][NPROD][NWAY][MAXROUNDS];
    for (int r = -1; r < rounds; r++) /* round -1 warms up */
        for (int s = 0; s < NSHAPE; s++)
            for (int p = 0; p < NPROD; p++)
                for (int v = 0; v < NWAY; v++) {
                    if (only >= 0 && v != only) continue;
                    const double t =
                        run(v, p, ws, part, y, dx, dw, x, dy, w, T, shape[s][0], shape[s][1]);
                    if (r >= 0) sec[s][p][v][r] = t;
                }

    if (only >= 0) return 0;
    printf("OpenBLAS %s, %d thread(s), T = %d, %d rounds, %s time; GFLOP/s medians, ratios the "
           "median of per-round ratios\n",
           openblas_get_corename(), threads, T, rounds, threads == 1 ? "CPU" : "wall");
    printf("%-12s %-4s %8s %8s %8s %12s %12s\n", "N x K", "prod", "pgemm", "tiles", "sgemm",
           "pgemm/tiles", "pgemm/sgemm");
    double step[NWAY][MAXROUNDS] = {{0}};
    for (int s = 0; s < NSHAPE; s++)
        for (int p = 0; p < NPROD; p++) {
            const double flop = 2.0 * T * shape[s][0] * shape[s][1];
            double g[NWAY], q[2][MAXROUNDS], tmp[MAXROUNDS];
            for (int r = 0; r < rounds; r++) {
                q[0][r] = sec[s][p][1][r] / sec[s][p][0][r];
                q[1][r] = sec[s][p][2][r] / sec[s][p][0][r];
                for (int v = 0; v < NWAY; v++) step[v][r] += shape[s][2] * sec[s][p][v][r];
            }
            for (int v = 0; v < NWAY; v++) {
                for (int r = 0; r < rounds; r++) tmp[r] = flop / sec[s][p][v][r] * 1e-9;
                g[v] = median(tmp, rounds);
            }
            char nk[32];
            snprintf(nk, sizeof nk, "%d x %d", shape[s][0], shape[s][1]);
            printf("%-12s %-4s %8.1f %8.1f %8.1f %12.3f %12.3f\n", nk, pname[p], g[0], g[1], g[2],
                   median(q[0], rounds), median(q[1], rounds));
        }
    double q[2][MAXROUNDS];
    for (int r = 0; r < rounds; r++)
        q[0][r] = step[1][r] / step[0][r], q[1][r] = step[2][r] / step[0][r];
    printf("%-12s %-4s %8s %8s %8s %12.3f %12.3f\n", "step", "all", "", "", "",
           median(q[0], rounds), median(q[1], rounds));
    free(x), free(dy), free(w), free(y), free(dw), free(dx), free(ws), free(part);
    return 0;
}
