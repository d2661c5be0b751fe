/* test_attnout.c — the portable attention's output summed per key tile (src/kernels/attention.c,
 * docs/numerics.md §6), in float32, the precision it is for.
 *
 * The kernel sums a query's output over each key tile of ATTN_TILE keys from +0 and folds the
 * tiles in ascending order, acc ← fma(acc, corr, part) (acc = part on the first tile), where it
 * was one chain over all the query's keys (acc ← acc·corr, then fma(P_c, v_c, acc) key by key).
 * Checked against that single chain, written out here with the kernel's own trees (lanes.h) and
 * exponentials:
 *   - a query whose keys lie in the first tile has the single chain's bits, the sign of a zero
 *     included (so every golden digest, at most 24 tokens a sequence, is unchanged), and a
 *     later query does not;
 *   - at T = 2048 the output is closer to the float64 kernel's than the single chain's is
 *     (relative L2 over every output; measured: 0.73 of the single chain's error).
 * gemm.c's way: attention.c is compiled here a second time in float32 with its names renamed;
 * the float64 kernel is the test build's own (tests link the float64 kernel objects). */
#undef SBP_REAL_F64
#define attention_forward   f32_attention_forward
#define attention_backward  f32_attention_backward
#define attention_workspace f32_attention_workspace
#include "../src/kernels/attention.c"
#undef attention_forward
#undef attention_backward
#undef attention_workspace

#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* the float64 kernel (real = double in the test build's kernel objects) */
size_t attention_workspace(int HD);
void attention_forward(double *o, double *lse, double *ws, const double *q, const double *k,
                       const double *v, const uint8_t *kmask, const sbp_attn_dims *d);

enum { T = 2048, NH = 2, NKV = 1, HD = 64 };

static float value(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 4.0 - 2.0); /* uniform [−2, 2) */
}

/* o (T, NH·HD): the causal output as one chain over each query's keys (the kernel before the
 * per-tile sums), with the kernel's scores, trees and exponentials */
static void single_chain(float *o, const float *q, const float *k, const float *v, float scale) {
    float S[W], acc[HD];
    for (int i = 0; i < T; i++)
        for (int h = 0; h < NH; h++) {
            const int g = h / (NH / NKV);
            const float *q_i = q + ((size_t)i * NH + h) * HD;
            float m = -INFINITY, l = 0;
            for (int d = 0; d < HD; d++) acc[d] = 0;
            for (int j0 = 0; j0 <= i; j0 += W) {
                const int n = i + 1 - j0 < W ? i + 1 - j0 : W;
                for (int c = 0; c < W; c++) {
                    float s = 0;
                    for (int d = 0; c < n && d < HD; d++)
                        s = fmaf(q_i[d], k[((size_t)(j0 + c) * NKV + g) * HD + d], s);
                    S[c] = c < n ? s * scale : -INFINITY;
                }
                const float mt = lanes_max(S, W), mnew = m > mt ? m : mt;
                const float corr = sbp_pexpf(m - mnew);
                for (int c = 0; c < W; c++) S[c] = sbp_pexpf(S[c] - mnew);
                l = l * corr + lanes_sum(S, W);
                for (int d = 0; d < HD; d++) acc[d] = acc[d] * corr;
                for (int c = 0; c < n; c++)
                    for (int d = 0; d < HD; d++)
                        acc[d] = fmaf(S[c], v[((size_t)(j0 + c) * NKV + g) * HD + d], acc[d]);
                m = mnew;
            }
            for (int d = 0; d < HD; d++) o[((size_t)i * NH + h) * HD + d] = acc[d] / l;
        }
}

START_TEST(per_tile_output) {
    const size_t nq = (size_t)T * NH * HD, nk = (size_t)T * NKV * HD;
    float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk);
    float *v = malloc(sizeof(float) * nk), *o = malloc(sizeof(float) * nq);
    float *ref = malloc(sizeof(float) * nq), *lse = malloc(sizeof(float) * T * NH);
    double *q64 = malloc(sizeof(double) * nq), *k64 = malloc(sizeof(double) * nk);
    double *v64 = malloc(sizeof(double) * nk), *o64 = malloc(sizeof(double) * nq);
    double *lse64 = malloc(sizeof(double) * T * NH);
    uint8_t *kmask = malloc(T);
    float *ws = malloc(sizeof(float) * f32_attention_workspace(HD));
    double *ws64 = malloc(sizeof(double) * attention_workspace(HD));
    ck_assert(q && k && v && o && ref && lse && q64 && k64 && v64 && o64 && lse64 && kmask && ws &&
              ws64);
    uint64_t seed = 5;
    for (size_t x = 0; x < nq; x++) q64[x] = q[x] = value(&seed);
    for (size_t x = 0; x < nk; x++) k64[x] = k[x] = value(&seed);
    for (size_t x = 0; x < nk; x++) v64[x] = v[x] = value(&seed);
    for (int t = 0; t < T; t++) kmask[t] = 1;
    const sbp_attn_dims d = {
        .s = 0, .M = T, .T = T, .NH = NH, .NKV = NKV, .HD = HD, .scale = 1.0 / sqrt(HD)};
    f32_attention_forward(o, lse, ws, q, k, v, kmask, &d);
    attention_forward(o64, lse64, ws64, q64, k64, v64, kmask, &d);
    single_chain(ref, q, k, v, (float)d.scale);

    const size_t first = (size_t)W * NH * HD; /* the outputs of queries 0 .. W − 1 */
    size_t differ = 0;
    for (size_t x = 0; x < nq; x++) {
        if (x < first) /* bit for bit, the sign of a zero included */
            ck_assert_msg(!memcmp(&o[x], &ref[x], sizeof o[x]),
                          "query %zu, element %zu: %a, the single chain %a", x / (NH * HD),
                          x % (NH * HD), (double)o[x], (double)ref[x]);
        differ += o[x] != ref[x];
    }
    ck_assert_msg(differ > 0, "no output differs from the single chain's at T = %d", T);
    double e_tile = 0, e_chain = 0, norm = 0;
    for (size_t x = 0; x < nq; x++) {
        e_tile += (o[x] - o64[x]) * (o[x] - o64[x]);
        e_chain += (ref[x] - o64[x]) * (ref[x] - o64[x]);
        norm += o64[x] * o64[x];
    }
    e_tile = sqrt(e_tile / norm), e_chain = sqrt(e_chain / norm);
    if (getenv("SBP_ACC_PRINT"))
        printf("attention output at T = %d: per tile %.3e, one chain %.3e (%.2f)\n", T, e_tile,
               e_chain, e_tile / e_chain);
    ck_assert_msg(e_tile <= 0.8 * e_chain, "per-tile error %.3e, single chain %.3e", e_tile,
                  e_chain);
    free(q), free(k), free(v), free(o), free(ref), free(lse), free(q64), free(k64), free(v64);
    free(o64), free(lse64), free(kmask), free(ws), free(ws64);
}
END_TEST

int main(void) {
    Suite *s = suite_create("attnout");
    TCase *tc = tcase_create("attnout");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, per_tile_output);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
