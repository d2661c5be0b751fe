/* test_pgemm.c — the portable product's micro-kernels (src/kernels/gemm.c) bit for bit against
 * the plain scalar chain, in float32 and float64, on ragged shapes.
 *
 * gemm.c picks its micro-kernel by the build's instruction set (AVX-512, AVX2 + FMA, or plain
 * C); every one must give each element of C the chain c ← fma(a(i,p), b(p,j), c), p ascending,
 * from the stored c (pgemm) or from +0 (pgemm_set), docs/numerics.md §4. `make test-avx2` runs
 * this suite in an x86-64-v3 build (the AVX2 kernel), `make test` in the native one.
 *
 * The tests link the float64 kernel objects (Makefile); the float32 product, whose entry points
 * are hidden inside the engine's object, is compiled here a second time, from gemm.c itself with
 * real = float and its three names renamed, so that its float32 micro-kernel, packs and edge
 * paths are checked with every operand layout the linear layers use — not only the public
 * C = A·Bᵀ entry. The shapes are chosen against every tile size in gemm.c: M and N not multiples
 * of any MR or NR (6, 12; 8, 16, 32), K across one and two k blocks (KC ≤ 512; a product that
 * does not fold: one block of 1100 across narrowed column blocks, two of 1150) and the
 * transposing packs' 8- or 16-step blocks, M across row blocks (MC = 48) and, with enough of
 * them for whole-row tasks (M > 4·MC per thread), across the half blocks at the end, N across a
 * column block (NC = 2048); operands with row strides wider than their rows; special values (±0,
 * subnormals, ±Inf, NaN, overflow). Then the workspace, the same size in every build; last, the
 * attention tiles' product (fast/tile_mm.c) on every remainder of its row blocks. */
#undef SBP_REAL_F64
#define pgemm                 test_pgemm_f32
#define pgemm_set             test_pgemm_set_f32
#define pgemm_fold            test_pgemm_fold_f32
#define pgemm_fold_set        test_pgemm_fold_set_f32
#define pgemm_panels          test_pgemm_panels_f32
#define pgemm_workspace       test_pgemm_workspace_f32
#define sbp_portable_gemm_f32 test_portable_gemm_f32
#include "../src/kernels/gemm.c"
#undef pgemm
#undef pgemm_set
#undef pgemm_fold
#undef pgemm_fold_set
#undef pgemm_panels
#undef pgemm_workspace
#undef sbp_portable_gemm_f32

#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the float64 product of the linked kernel objects (kernels.h, real = double) */
size_t pgemm_workspace(int N, int K);
void pgemm(double *C, size_t ldc, double *ws, const double *A, size_t rsa, size_t csa,
           const double *B, size_t rsb, size_t csb, int M, int N, int K);
void pgemm_set(double *C, size_t ldc, double *ws, const double *A, size_t rsa, size_t csa,
               const double *B, size_t rsb, size_t csb, int M, int N, int K);

/* M, N, K: ragged against every tile and block size named above */
static const int shapes[][3] = {
    {1, 1, 1},     {5, 7, 3},     {6, 16, 8},    {7, 17, 9},    {11, 15, 33},    {13, 31, 255},
    {25, 47, 257}, {97, 33, 100}, {61, 45, 513}, {19, 9, 1100}, {3, 2100, 20},   {0, 5, 5},
    {5, 0, 5},     {4, 6, 0},     {301, 40, 70}, {800, 20, 30}, {40, 700, 1100}, {9, 2100, 2300}};
enum { NSHAPES = sizeof shapes / sizeof shapes[0] };

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

/* n values in [-1, 1), about one in 64 of them special (special != 0) */
static double value(uint64_t *s, int special) {
    const double u = (double)(lcg(s) & 0xfffff) / 524288.0 - 1.0;
    if (!special || lcg(s) % 64) return u;
    static const double sp[] = {0.0, -0.0, 0x1p-140, -0x1p-1070, 1e30, INFINITY, -INFINITY, NAN};
    return sp[lcg(s) % 8];
}

/* A and B in one of four layouts (each plain or transposed), with row strides wider than the
 * rows (pad), C with a gap after each row; every size in elements. */
typedef struct {
    size_t rsa, csa, rsb, csb, ldc, na, nb, nc;
} layout;

static layout make_layout(int M, int N, int K, int tr, int pad) {
    layout l;
    l.rsa = tr & 1 ? 1 : (size_t)K + pad, l.csa = tr & 1 ? (size_t)M + pad : 1;
    l.rsb = tr & 2 ? 1 : (size_t)N + pad, l.csb = tr & 2 ? (size_t)K + pad : 1;
    l.ldc = (size_t)N + 3;
    l.na = ((size_t)M + pad) * ((size_t)K + pad) + 1;
    l.nb = ((size_t)N + pad) * ((size_t)K + pad) + 1;
    l.nc = (size_t)M * l.ldc + 1;
    return l;
}

/* x and y the same bits, or both NaN: which NaN an fma passes on when two operands are NaN
 * depends on the instruction's operand order, which the contract does not fix */
#define SAME(x, y) (((x) != (x) && (y) != (y)) || !memcmp(&(x), &(y), sizeof(x)))

/* The same test for either precision: T the element type, FMA its fma, GEMM/GEMM_SET/WS the
 * product under test. Fails naming the first element that is not the chain's bits. */
#define CHECK_CHAINS(T, FMA, GEMM, GEMM_SET, WS, what_prec)                                        \
    do {                                                                                           \
        uint64_t seed = 12345;                                                                     \
        for (int si = 0; si < NSHAPES; si++)                                                       \
            for (int form = 0; form < 8; form++) {                                                 \
                const int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];                 \
                const int tr = form & 3, pad = form & 4 ? 5 : 0, special = si % 3 == 1;            \
                const layout l = make_layout(M, N, K, tr, pad);                                    \
                T *A = malloc(sizeof(T) * l.na), *B = malloc(sizeof(T) * l.nb);                    \
                T *C = malloc(sizeof(T) * l.nc), *R = malloc(sizeof(T) * l.nc);                    \
                T *S = malloc(sizeof(T) * l.nc), *RS = malloc(sizeof(T) * l.nc);                   \
                ck_assert(A &&B &&C &&R &&S &&RS);                                                 \
                for (size_t i = 0; i < l.na; i++) A[i] = (T)value(&seed, special);                 \
                for (size_t i = 0; i < l.nb; i++) B[i] = (T)value(&seed, special);                 \
                for (size_t i = 0; i < l.nc; i++) C[i] = R[i] = S[i] = RS[i] = (T)value(&seed, 0); \
                for (int i = 0; i < M; i++)                                                        \
                    for (int j = 0; j < N; j++) {                                                  \
                        T r = R[i * l.ldc + j], z = 0;                                             \
                        for (int p = 0; p < K; p++) {                                              \
                            const T a = A[i * l.rsa + p * l.csa], b = B[p * l.rsb + j * l.csb];    \
                            r = FMA(a, b, r), z = FMA(a, b, z);                                    \
                        }                                                                          \
                        R[i * l.ldc + j] = r, RS[i * l.ldc + j] = z;                               \
                        S[i * l.ldc + j] = NAN; /* pgemm_set ignores it; the gaps stay */          \
                    }                                                                              \
                for (int t = 1; t <= 2; t++) {                                                     \
                    /* the workspace is sized for the threads the call will use */                 \
                    omp_set_num_threads(t);                                                        \
                    T *c = malloc(sizeof(T) * l.nc), *s = malloc(sizeof(T) * l.nc);                \
                    T *ws = malloc(sizeof(T) * (WS(N, K) + 1));                                    \
                    ck_assert(c &&s &&ws);                                                         \
                    memcpy(c, C, sizeof(T) * l.nc), memcpy(s, S, sizeof(T) * l.nc);                \
                    GEMM(c, l.ldc, ws, A, l.rsa, l.csa, B, l.rsb, l.csb, M, N, K);                 \
                    GEMM_SET(s, l.ldc, ws, A, l.rsa, l.csa, B, l.rsb, l.csb, M, N, K);             \
                    /* one assertion per product: Check logs every passing one */                  \
                    size_t i = 0, j = 0;                                                           \
                    while (i < l.nc && SAME(c[i], R[i])) i++;                                      \
                    while (j < l.nc && SAME(s[j], RS[j])) j++;                                     \
                    ck_assert_msg(i == l.nc,                                                       \
                                  "%s pgemm %dx%dx%d form %d, %d threads: element %zu is %a, "     \
                                  "the chain gives %a",                                            \
                                  what_prec, M, N, K, form, t, i, (double)c[i], (double)R[i]);     \
                    ck_assert_msg(j == l.nc,                                                       \
                                  "%s pgemm_set %dx%dx%d form %d, %d threads: element %zu is %a, " \
                                  "the chain gives %a",                                            \
                                  what_prec, M, N, K, form, t, j, (double)s[j], (double)RS[j]);    \
                    free(c), free(s), free(ws);                                                    \
                }                                                                                  \
                free(A), free(B), free(C), free(R), free(S), free(RS);                             \
            }                                                                                      \
        omp_set_num_threads(1);                                                                    \
    } while (0)

START_TEST(f32_chains) {
    CHECK_CHAINS(float, fmaf, test_pgemm_f32, test_pgemm_set_f32, test_pgemm_workspace_f32,
                 "float32");
}
END_TEST

START_TEST(f64_chains) {
    CHECK_CHAINS(double, fma, pgemm, pgemm_set, pgemm_workspace, "float64");
}
END_TEST

/* The fast mode's property: one call over rows [0, M) gives every row the bits that calls over
 * [0, m) and [m, M) give it (the forward's y = x·Wᵀ and dX, float32), for splits inside a tile,
 * on a tile boundary and on a row block's. */
START_TEST(f32_row_split) {
    const int M = 150, N = 70, K = 300;
    static const int splits[] = {1, 5, 6, 12, 48, 96, 97, 149};
    uint64_t seed = 99;
    float *x = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K);
    float *one = malloc(sizeof(float) * M * N), *two = malloc(sizeof(float) * M * N);
    float *ws = malloc(sizeof(float) * test_pgemm_workspace_f32(N, K));
    ck_assert(x && w && one && two && ws);
    for (int i = 0; i < M * K; i++) x[i] = (float)value(&seed, 0);
    for (int i = 0; i < N * K; i++) w[i] = (float)value(&seed, 0);
    for (int form = 0; form < 2; form++) { /* y = x·Wᵀ; then dX-like: x (M, K)·W viewed (K, N) */
        const size_t rsb = form ? (size_t)N : 1, csb = form ? 1 : (size_t)K;
        test_pgemm_set_f32(one, N, ws, x, K, 1, w, rsb, csb, M, N, K);
        for (size_t si = 0; si < sizeof splits / sizeof splits[0]; si++) {
            const int m = splits[si];
            test_pgemm_set_f32(two, N, ws, x, K, 1, w, rsb, csb, m, N, K);
            test_pgemm_set_f32(two + (size_t)m * N, N, ws, x + (size_t)m * K, K, 1, w, rsb, csb,
                               M - m, N, K);
            ck_assert_msg(!memcmp(one, two, sizeof(float) * M * N),
                          "rows split at %d (form %d): not the one call's bits", m, form);
        }
    }
    free(x), free(w), free(one), free(two), free(ws);
}
END_TEST

/* The workspace a plan counts is the same reals in every build, AVX-512, AVX2 or plain C, float32
 * or float64: the packed B block of KC × (NC + 32) and one A block of KC × 60 a thread, each k and
 * column block cut to the product's K and N. The ledger's peaks the docs quote hang on it, and an
 * AVX2 machine read other peaks than an AVX-512 one when it followed the build's tile. */
START_TEST(workspace_any_isa) {
    static const int nk[][2] = {{1, 1}, {64, 64}, {1000, 300}, {5000, 512}, {151936, 1024}};
    const int saved = omp_get_max_threads();
    for (int nth = 1; nth <= 3; nth++) {
        omp_set_num_threads(nth);
        for (size_t i = 0; i < sizeof nk / sizeof nk[0]; i++) {
            const size_t n = (size_t)(nk[i][0] < 2048 ? nk[i][0] : 2048);
            const size_t k = (size_t)(nk[i][1] < 512 ? nk[i][1] : 512);
            const size_t want = k * (n + 32) + (size_t)nth * k * 60;
            ck_assert_uint_eq(test_pgemm_workspace_f32(nk[i][0], nk[i][1]), want);
            ck_assert_uint_eq(pgemm_workspace(nk[i][0], nk[i][1]), want);
        }
    }
    omp_set_num_threads(saved);
    ck_assert_uint_eq(pgemm_workspace(0, 5), 0);
}
END_TEST

/* The attention tiles' product (src/kernels/fast/tile_mm.c, float64 objects): every row count
 * 1..13 (full blocks of MR = 6 rows, then each remainder block of 1 to 5 rows), column counts
 * across its vector blocks and scalar tail, A plain or read transposed, beta 0 or 1: each element
 * alpha·(its fma chain from 0), added to C when beta. */
void tile_mm(double *C, size_t ldc, const double *A, size_t ars, size_t acs, const double *B,
             size_t ldb, int m, int n, int k, double alpha, int beta);

START_TEST(tile_mm_rows) {
    static const int ns[] = {3, 8, 16, 37}, ks[] = {1, 64, 129};
    uint64_t seed = 7;
    for (int m = 1; m <= 13; m++)
        for (int ni = 0; ni < 4; ni++)
            for (int ki = 0; ki < 3; ki++)
                for (int form = 0; form < 4; form++) {
                    const int n = ns[ni], k = ks[ki], tr = form & 1, beta = form >> 1;
                    const size_t ldc = (size_t)n + 2, ldb = (size_t)n + 3;
                    const size_t ars = tr ? 1 : (size_t)k, acs = tr ? (size_t)m : 1;
                    double *A = malloc(sizeof(double) * m * k),
                           *B = malloc(sizeof(double) * k * ldb);
                    double *C = malloc(sizeof(double) * m * ldc),
                           *R = malloc(sizeof(double) * m * ldc);
                    ck_assert(A && B && C && R);
                    for (int i = 0; i < m * k; i++) A[i] = value(&seed, 0);
                    for (size_t i = 0; i < (size_t)k * ldb; i++) B[i] = value(&seed, 0);
                    for (size_t i = 0; i < (size_t)m * ldc; i++) C[i] = R[i] = value(&seed, 0);
                    for (int i = 0; i < m; i++)
                        for (int j = 0; j < n; j++) {
                            double acc = 0;
                            for (int p = 0; p < k; p++)
                                acc = fma(A[i * ars + p * acs], B[p * ldb + j], acc);
                            const double t = 0.125 * acc;
                            R[i * ldc + j] = beta ? R[i * ldc + j] + t : t;
                        }
                    tile_mm(C, ldc, A, ars, acs, B, ldb, m, n, k, 0.125, beta);
                    ck_assert_msg(!memcmp(C, R, sizeof(double) * m * ldc),
                                  "tile_mm %dx%dx%d form %d: not the chains", m, n, k, form);
                    free(A), free(B), free(C), free(R);
                }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("pgemm");
    TCase *tc = tcase_create("chains");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, f32_chains);
    tcase_add_test(tc, f64_chains);
    tcase_add_test(tc, f32_row_split);
    tcase_add_test(tc, workspace_any_isa);
    tcase_add_test(tc, tile_mm_rows);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
