/* lanes.h — row reductions in a fixed tree that depends on the row length alone
 * (docs/numerics.md §5).
 *
 * Lane k (of LANES = 32) takes the elements whose index is ≡ k (mod 32), in ascending order,
 * starting from the operation's identity; then a halving tree combines the lanes: for
 * w = 16, 8, 4, 2, 1, lane k ← lane k ⊕ lane k + w (k < w). A CUDA warp computes exactly this
 * with one thread per lane and __shfl_down_sync(w) (cuda/), and the CPU loops below vectorize
 * without -ffast-math (the lanes are independent chains). The order of every operation depends
 * only on n: never on the thread count, the schedule, or where a row is reduced.
 *
 * Used for reductions that are not sums over tokens: the softmax over the vocabulary, RMSNorm
 * over C, attention over a key tile. Sums over tokens are single ascending chains instead. */
#ifndef SBP_LANES_H
#define SBP_LANES_H

#include "real.h"
#include "vexp.h"

enum { LANES = 32 }; /* vexp_lane_sums (vexp.h) fills 32 lanes */

static inline real lanes_tree_sum(real s[LANES]) {
    for (int w = LANES / 2; w; w /= 2)
        for (int k = 0; k < w; k++) s[k] = s[k] + s[k + w];
    return s[0];
}

static inline double lanes_tree_sum_d(double s[LANES]) {
    for (int w = LANES / 2; w; w /= 2)
        for (int k = 0; k < w; k++) s[k] = s[k] + s[k + w];
    return s[0];
}

/* Σ_c a[c]·b[c], each lane a chain of fma */
static inline real lanes_dot(const real *a, const real *b, int n) {
    real s[LANES] = {0};
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int k = 0; k < LANES; k++) s[k] = rfma(a[c + k], b[c + k], s[k]);
    for (int k = 0; c + k < n; k++) s[k] = rfma(a[c + k], b[c + k], s[k]);
    return lanes_tree_sum(s);
}

#if defined(SBP_VEXP) && defined(__AVX512F__)
/* The 32 lanes in two registers, lo (lanes 0–15) and hi (16–31), and the tree's levels as
 * register halves: w = 16 is lo ⊕ hi, w = 8 the two 256-bit halves of that, w = 4 the 128-bit
 * halves, then w = 2 and 1 within one. The same operations on the same lanes in the same order
 * as the loops below: the same bits. Written out because GCC kept the lanes on the stack and ran
 * the tree a lane at a time (a tenth of the fast attention forward's time outside its
 * products, perf). */
typedef __m512 lanes_v;
enum { LANE_VECS = 2, LANE_VL = 16 };
#define lv_load  _mm512_loadu_ps
#define lv_store _mm512_storeu_ps
#define lv_set1  _mm512_set1_ps
#define lv_add   _mm512_add_ps
#define lv_max   _mm512_max_ps /* max(a, b) = a > b ? a : b, b for a NaN a */
#define lv_sub   _mm512_sub_ps
#define lv_exp   vexp16_row /* rexp of each lane (vexp.h) */
static inline __m128 lanes_tree4(lanes_v v[LANE_VECS], int is_max) {
    const __m512 a = is_max ? _mm512_max_ps(v[1], v[0]) : _mm512_add_ps(v[0], v[1]); /* w = 16 */
    const __m256 a0 = _mm512_castps512_ps256(a),
                 a1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    const __m256 b = is_max ? _mm256_max_ps(a1, a0) : _mm256_add_ps(a0, a1); /* w = 8 */
    const __m128 b0 = _mm256_castps256_ps128(b), b1 = _mm256_extractf128_ps(b, 1);
    return is_max ? _mm_max_ps(b1, b0) : _mm_add_ps(b0, b1); /* w = 4 */
}
#elif defined(SBP_VEXP) /* AVX2: four registers of 8 lanes */
typedef __m256 lanes_v;
enum { LANE_VECS = 4, LANE_VL = 8 };
#define lv_load  _mm256_loadu_ps
#define lv_store _mm256_storeu_ps
#define lv_set1  _mm256_set1_ps
#define lv_add   _mm256_add_ps
#define lv_max   _mm256_max_ps
#define lv_sub   _mm256_sub_ps
#define lv_exp   vexp8_row
static inline __m128 lanes_tree4(lanes_v v[LANE_VECS], int is_max) {
    /* w = 16: lanes 0–7 with 16–23, 8–15 with 24–31; w = 8: then 0–7 with 8–15 */
    const __m256 a0 = is_max ? _mm256_max_ps(v[2], v[0]) : _mm256_add_ps(v[0], v[2]);
    const __m256 a1 = is_max ? _mm256_max_ps(v[3], v[1]) : _mm256_add_ps(v[1], v[3]);
    const __m256 b = is_max ? _mm256_max_ps(a1, a0) : _mm256_add_ps(a0, a1);
    const __m128 b0 = _mm256_castps256_ps128(b), b1 = _mm256_extractf128_ps(b, 1);
    return is_max ? _mm_max_ps(b1, b0) : _mm_add_ps(b0, b1); /* w = 4 */
}
#endif

#ifdef SBP_VEXP
_Static_assert(LANE_VECS *LANE_VL == LANES, "the lanes in registers");

/* The tree from w = 4 down: w = 2 (lanes 0, 1 with 2, 3), w = 1 */
static inline real lanes_tree_last(__m128 c, int is_max) {
    const __m128 hi2 = _mm_movehl_ps(c, c);
    const __m128 d = is_max ? _mm_max_ps(hi2, c) : _mm_add_ps(c, hi2);
    const __m128 d1 = _mm_movehdup_ps(d);
    return _mm_cvtss_f32(is_max ? _mm_max_ss(d1, d) : _mm_add_ss(d, d1));
}

/* A row's lanes: v[j] lane l is lane j·LANE_VL + l; a tail of fewer than LANES elements goes
 * through memory, each lane as the loop does it */
static inline real lanes_reduce(const real *x, int n, int is_max) {
    lanes_v v[LANE_VECS];
    for (int j = 0; j < LANE_VECS; j++) v[j] = lv_set1(is_max ? -INFINITY : 0);
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int j = 0; j < LANE_VECS; j++) {
            const lanes_v xj = lv_load(x + c + j * LANE_VL);
            v[j] = is_max ? lv_max(xj, v[j]) : lv_add(v[j], xj);
        }
    if (c < n) {
        real s[LANES];
        for (int j = 0; j < LANE_VECS; j++) lv_store(s + j * LANE_VL, v[j]);
        for (int k = 0; c + k < n; k++)
            s[k] = is_max ? (x[c + k] > s[k] ? x[c + k] : s[k]) : s[k] + x[c + k];
        for (int j = 0; j < LANE_VECS; j++) v[j] = lv_load(s + j * LANE_VL);
    }
    return lanes_tree_last(lanes_tree4(v, is_max), is_max);
}

/* max_c x[c] (−inf for n = 0); a NaN element is skipped, as by `x > m ? x : m` */
static inline real lanes_max(const real *x, int n) {
    return lanes_reduce(x, n, 1);
}

/* Σ_c x[c] */
static inline real lanes_sum(const real *x, int n) {
    return lanes_reduce(x, n, 0);
}

/* y[c] = rexp(x[c] − shift), and Σ_c y[c] as lanes_sum(y, n) adds it: exp_shift(y, x, n, shift,
 * 1) and lanes_sum in one pass over the row, the same operations on every lane, so the same bits
 * (y may be x). The softmaxes' rows are read once instead of twice. */
static inline real lanes_exp_sum(real *y, const real *x, int n, real shift) {
    const lanes_v sh = lv_set1(shift);
    lanes_v v[LANE_VECS];
    for (int j = 0; j < LANE_VECS; j++) v[j] = lv_set1(0);
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int j = 0; j < LANE_VECS; j++) {
            const lanes_v e = lv_exp(lv_sub(lv_load(x + c + j * LANE_VL), sh));
            lv_store(y + c + j * LANE_VL, e);
            v[j] = lv_add(v[j], e);
        }
    if (c < n) { /* the tail as lanes_reduce's, after exp_shift's */
        exp_shift(y + c, x + c, n - c, shift, 1);
        real s[LANES];
        for (int j = 0; j < LANE_VECS; j++) lv_store(s + j * LANE_VL, v[j]);
        for (int k = 0; c + k < n; k++) s[k] = s[k] + y[c + k];
        for (int j = 0; j < LANE_VECS; j++) v[j] = lv_load(s + j * LANE_VL);
    }
    return lanes_tree_last(lanes_tree4(v, 0), 0);
}
#else
/* max_c x[c] (−inf for n = 0); a NaN element is skipped, as by `x > m ? x : m` */
static inline real lanes_max(const real *x, int n) {
    real s[LANES];
    for (int k = 0; k < LANES; k++) s[k] = -INFINITY;
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int k = 0; k < LANES; k++) s[k] = x[c + k] > s[k] ? x[c + k] : s[k];
    for (int k = 0; c + k < n; k++) s[k] = x[c + k] > s[k] ? x[c + k] : s[k];
    for (int w = LANES / 2; w; w /= 2)
        for (int k = 0; k < w; k++) s[k] = s[k + w] > s[k] ? s[k + w] : s[k];
    return s[0];
}

/* Σ_c x[c] */
static inline real lanes_sum(const real *x, int n) {
    real s[LANES] = {0};
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int k = 0; k < LANES; k++) s[k] = s[k] + x[c + k];
    for (int k = 0; c + k < n; k++) s[k] = s[k] + x[c + k];
    return lanes_tree_sum(s);
}

static inline real lanes_exp_sum(real *y, const real *x, int n, real shift) {
    exp_shift(y, x, n, shift, 1);
    return lanes_sum(y, n);
}

#endif

/* Σ_c exp(x[c] − shift), the exps in the working precision, the sum in double */
static inline double lanes_exp_sum_d(const real *x, int n, real shift) {
    double s[LANES] = {0};
#ifdef SBP_VEXP /* the same lanes in SIMD registers (vexp.h) */
    vexp_lane_sums(s, x, n, shift);
#else
    int c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int k = 0; k < LANES; k++) s[k] = s[k] + (double)rexp(x[c + k] - shift);
    for (int k = 0; c + k < n; k++) s[k] = s[k] + (double)rexp(x[c + k] - shift);
#endif
    return lanes_tree_sum_d(s);
}

#endif
