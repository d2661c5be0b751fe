/* test_attnsplit.c — the attention backward split between two ranks: sequence parallel's dK, dV
 * at the key's rank (docs/distributed.md §8), sbp_attn_dims's kv_lo, kv_hi, no_dq and dsum_in
 * (src/kernels/kernels.h).
 *
 * A rank of sequence parallel holds a range of queries; the keys before a split point x belong
 * to another rank. The query's rank runs call A: keys [x, kv_hi) (kv_hi the range's end, or T),
 * dQ formed, D = rowsum(dO ⊙ O) computed into dsum. The key's rank runs call B: keys [0, x),
 * no_dq (dq = NULL), dsum_in with A's dsum (o = NULL). The kernels promise that every key's dK,
 * dV and every query's dQ receive the very terms, in the very order, of the call without the
 * fields, so the two calls must give the bytes of one plain call over the same queries (memcmp):
 *   - A's dQ and D are the plain call's;
 *   - A's dK, dV (key j at row j − x) are the plain call's rows of keys >= x, B's rows 0 .. x − 1
 *     its rows of keys < x;
 *   - neither call writes a row outside its keys (canaries around dk and dv: −0 and a finite
 *     value, so even an added +0 shows) and B leaves dsum as it is;
 *   - B has work to do: the plain call changes some dK below x (else the case checks nothing).
 * Over: dq, dk, dv from zero and from random contents (the kernels accumulate); queries in one
 * call or cut at a tile boundary into two, each cut split at the same x (chunks); x below, at and
 * past the queries' start; causal and a window of 48 keys (Gemma-3's local layers); padded keys
 * (kmask 0). Both kernels: the portable one (key tile ATTN_TILE) and the fast one (tile
 * attention_tile(blk)) in its one-pass form (NKV a multiple of the threads) and its two-pass form
 * (NKV = 1 on 2 threads), and at blk = 64 over queries that cross its pass grid (PASS_TILES
 * tiles, 512 queries).
 * The test build's kernels are the float64 ones: the property is which terms in which order,
 * not the precision. */
#include "testutil.h"
#include "../src/kernels/kernels.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T = 640, NH = 4 };

typedef struct {
    const char *name;
    int fast;    /* 0: attention_backward (tile ATTN_TILE); 1: tiled_attention_backward */
    int blk;     /* fast: the token block, tile attention_tile(blk) */
    int threads; /* OpenMP threads: with fast, one pass iff NKV % threads == 0 */
    int NKV, HD;
    int s, M;    /* queries [s, s + M) */
    int x;       /* B: keys [0, x); A: keys [x, kv_hi) */
    int kv_to_T; /* A's kv_hi: T (1) or the end of its queries (0) */
    int cut;     /* 0: one call each; else the queries in two, [s, cut) and [cut, s + M) */
    int window;  /* 0: causal */
    int pad;     /* 1: keys with kmask 0 */
    int dirty;   /* 1: dq, dk, dv start from random contents, 0: from zero */
} split_case;

/* T = 640, NH = 4, scale 1/sqrt(HD) throughout; the fields in split_case's order: name, fast,
 * blk, threads, NKV, HD, s, M, x, kv_to_T, cut, window, pad, dirty */
static const split_case cases[] = {
    {"portable, causal, from zero", 0, 0, 1, 1, 16, 256, 384, 128, 0, 0, 0, 0, 0},
    {"portable, 2 kv heads", 0, 0, 2, 2, 32, 256, 384, 256, 0, 0, 0, 0, 1},
    {"portable, queries to 512, x = 192, kv_hi = T", 0, 0, 2, 2, 16, 256, 256, 192, 1, 0, 0, 1, 1},
    {"portable, x past the queries' start", 0, 0, 2, 1, 32, 256, 384, 384, 0, 0, 0, 0, 1},
    {"portable, queries from 300", 0, 0, 1, 2, 16, 300, 340, 256, 0, 0, 0, 1, 1},
    {"portable, window 48, padded", 0, 0, 2, 1, 16, 256, 384, 256, 0, 0, 48, 1, 1},
    {"portable, cut at 384, padded", 0, 0, 2, 2, 32, 256, 384, 128, 0, 384, 0, 1, 1},
    {"portable, cut at 384, window 48", 0, 0, 1, 2, 16, 256, 384, 256, 1, 384, 48, 0, 1},
    {"fast one pass, NKV 1, 1 thread, from zero", 1, 128, 1, 1, 16, 256, 384, 128, 0, 0, 0, 0, 0},
    {"fast two pass, NKV 1, 2 threads", 1, 128, 2, 1, 32, 256, 384, 256, 0, 0, 0, 0, 1},
    {"fast one pass, NKV 2, 2 threads, padded", 1, 128, 2, 2, 16, 256, 384, 128, 1, 0, 0, 1, 1},
    {"fast one pass, NKV 2, 1 thread, window 48", 1, 128, 1, 2, 32, 256, 384, 256, 0, 0, 48, 0, 1},
    {"fast two pass, window 48, padded", 1, 128, 2, 1, 16, 256, 384, 256, 0, 0, 48, 1, 1},
    {"fast two pass, x past the queries' start", 1, 128, 2, 1, 16, 256, 384, 384, 0, 0, 0, 1, 1},
    {"fast one pass, x past the queries' start", 1, 128, 2, 2, 16, 256, 384, 384, 0, 0, 0, 0, 1},
    {"fast two pass, cut at 384", 1, 128, 2, 1, 32, 256, 384, 128, 0, 384, 0, 1, 1},
    {"fast one pass, cut at 384, window 48", 1, 128, 2, 2, 16, 256, 384, 256, 1, 384, 48, 0, 1},
    {"fast blk 64, two pass, across the pass grid", 1, 64, 2, 1, 16, 256, 384, 192, 0, 0, 0, 1, 1},
    {"fast blk 64, one pass, all queries, x = 320", 1, 64, 1, 2, 32, 0, 640, 320, 0, 0, 0, 0, 1},
    {"fast blk 64, cut at 512, window 48", 1, 64, 2, 2, 16, 256, 384, 256, 0, 512, 48, 1, 1},
};

/* uniform in [−1, 1), a 64-bit LCG */
static void fill(double *a, size_t n, uint64_t *seed) {
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        a[i] = (double)(*seed >> 11) / 9007199254740992.0 * 2 - 1;
    }
}

static double *alloc(size_t n) {
    double *a = malloc(sizeof(double) * (n ? n : 1));
    ck_assert_ptr_nonnull(a);
    return a;
}

static double canary(size_t i) {
    return i & 1 ? 1234.5 : -0.0;
}

static void fill_canary(double *a, size_t n) {
    for (size_t i = 0; i < n; i++) a[i] = canary(i);
}

/* a[from, to) still holds fill_canary's values */
static void check_canary(const split_case *c, const double *a, size_t from, size_t to,
                         const char *what) {
    for (size_t i = from; i < to; i++)
        ck_assert_msg(!memcmp(&a[i], &(double){canary(i)}, sizeof(double)),
                      "%s: %s written at element %zu: %a", c->name, what, i, a[i]);
}

/* a (n) has b's bytes; the first difference named by row (of width reals) from row0 */
static void check_same(const split_case *c, const double *a, const double *b, size_t n,
                       size_t width, int row0, const char *what) {
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(!memcmp(&a[i], &b[i], sizeof(double)),
                      "%s: %s differs first at row %zu, element %zu: %a, the plain call's %a",
                      c->name, what, row0 + i / width, i % width, a[i], b[i]);
}

static void backward(const split_case *c, double *dq, double *dk, double *dv, double *dsum,
                     double *ws, const double *dout, const double *o, const double *lse,
                     const double *q, const double *k, const double *v, const uint8_t *kmask,
                     const sbp_attn_dims *d) {
    if (c->fast)
        tiled_attention_backward(dq, dk, dv, dsum, ws, dout, o, lse, q, k, v, kmask, d);
    else
        attention_backward(dq, dk, dv, dsum, ws, dout, o, lse, q, k, v, kmask, d);
}

START_TEST(split_backward) {
    const split_case *c = &cases[_i];
    omp_set_num_threads(c->threads);
    const int HD = c->HD, NKV = c->NKV, Q = NH * HD, KV = NKV * HD, s = c->s, e = s + c->M;
    const int x = c->x, kv_end = c->kv_to_T ? T : e;
    const size_t nq = (size_t)T * Q, nkv = (size_t)T * KV, nl = (size_t)T * NH;
    ck_assert(x > 0 && x < e && x % (c->fast ? attention_tile(c->blk) : ATTN_TILE) == 0);

    /* inputs, every array over the whole sequence (T rows); calls get pointers at their row s */
    double *q = alloc(nq), *dout = alloc(nq), *k = alloc(nkv), *v = alloc(nkv);
    double *o = alloc(nq), *lse = alloc(nl);
    double *dq0 = alloc(nq), *dk0 = alloc(nkv), *dv0 = alloc(nkv);
    uint8_t *kmask = malloc(T);
    ck_assert_ptr_nonnull(kmask);
    uint64_t seed = 0x5eed + (uint64_t)_i;
    fill(q, nq, &seed), fill(dout, nq, &seed), fill(k, nkv, &seed), fill(v, nkv, &seed);
    if (c->dirty)
        fill(dq0, nq, &seed), fill(dk0, nkv, &seed), fill(dv0, nkv, &seed);
    else
        memset(dq0, 0, sizeof(double) * nq), memset(dk0, 0, sizeof(double) * nkv),
            memset(dv0, 0, sizeof(double) * nkv);
    /* padded: keys 0 .. 3 (left padding) and every 37th from 5 (holes in most tiles) */
    for (int j = 0; j < T; j++) kmask[j] = !c->pad || !(j < 4 || j % 37 == 5);
    const size_t nws =
        c->fast ? tiled_attention_workspace(c->blk, NH, NKV, HD) : attention_workspace(HD);
    double *ws = alloc(nws);

    const sbp_attn_dims d0 = {.s = s,
                              .M = e - s,
                              .T = T,
                              .NH = NH,
                              .NKV = NKV,
                              .HD = HD,
                              .blk = c->blk,
                              .window = c->window,
                              .scale = 1.0 / sqrt(HD)};
    /* the forward, for lse (P a real softmax) and O */
    if (c->fast)
        tiled_attention_forward(o + (size_t)s * Q, lse + (size_t)s * NH, ws, q + (size_t)s * Q, k,
                                v, kmask, &d0);
    else
        attention_forward(o + (size_t)s * Q, lse + (size_t)s * NH, ws, q + (size_t)s * Q, k, v,
                          kmask, &d0);

    /* the plain call: queries [s, e) at once, every field 0 */
    double *dq_p = alloc(nq), *dk_p = alloc(nkv), *dv_p = alloc(nkv), *dsum_p = alloc(nl);
    memcpy(dq_p, dq0, sizeof(double) * nq), memcpy(dk_p, dk0, sizeof(double) * nkv);
    memcpy(dv_p, dv0, sizeof(double) * nkv), fill(dsum_p, nl, &seed);
    backward(c, dq_p + (size_t)s * Q, dk_p, dv_p, dsum_p + (size_t)s * NH, ws, dout + (size_t)s * Q,
             o + (size_t)s * Q, lse + (size_t)s * NH, q + (size_t)s * Q, k, v, kmask, &d0);

    /* A's dk, dv: x guard rows, then T rows from key x (rows past kv_end − x are guards too);
     * B's: T rows, rows from x on guards */
    const size_t nA = (size_t)(x + T) * KV;
    double *dkA = alloc(nA), *dvA = alloc(nA), *dkB = alloc(nkv), *dvB = alloc(nkv);
    fill_canary(dkA, nA), fill_canary(dvA, nA);
    fill_canary(dkB, nkv), fill_canary(dvB, nkv);
    double *dkA_x = dkA + (size_t)x * KV, *dvA_x = dvA + (size_t)x * KV;
    const size_t owned_A = (size_t)(kv_end - x) * KV, owned_B = (size_t)x * KV;
    memcpy(dkA_x, dk0 + (size_t)x * KV, sizeof(double) * owned_A);
    memcpy(dvA_x, dv0 + (size_t)x * KV, sizeof(double) * owned_A);
    memcpy(dkB, dk0, sizeof(double) * owned_B), memcpy(dvB, dv0, sizeof(double) * owned_B);
    double *dqA = alloc(nq), *dsumA = alloc(nl), *dsumB = alloc(nl);
    memcpy(dqA, dq0, sizeof(double) * nq), fill(dsumA, nl, &seed), fill(dsumB, nl, &seed);

    const int bounds[3] = {s, c->cut ? c->cut : e, e};
    for (int part = 0; part < (c->cut ? 2 : 1); part++) {
        const int s0 = bounds[part], e0 = c->cut ? bounds[part + 1] : e;
        const size_t ro = (size_t)s0 * Q, rl = (size_t)s0 * NH;
        sbp_attn_dims dA = d0, dB = d0;
        dA.s = dB.s = s0, dA.M = dB.M = e0 - s0;
        dA.kv_lo = x, dA.kv_hi = c->kv_to_T ? T : e0;
        dB.kv_lo = 0, dB.kv_hi = x, dB.no_dq = 1, dB.dsum_in = 1;
        backward(c, dqA + ro, dkA_x, dvA_x, dsumA + rl, ws, dout + ro, o + ro, lse + rl, q + ro, k,
                 v, kmask, &dA);
        /* B receives A's D of these queries */
        memcpy(dsumB + rl, dsumA + rl, sizeof(double) * (size_t)(e0 - s0) * NH);
        backward(c, NULL, dkB, dvB, dsumB + rl, ws, dout + ro, NULL, lse + rl, q + ro, k, v, kmask,
                 &dB);
    }

    /* B had work: some dK below x changed in the plain call */
    int moved = 0;
    for (size_t i = 0; i < owned_B && !moved; i++) moved = dk_p[i] != dk0[i];
    ck_assert_msg(moved, "%s: no key below x = %d receives anything", c->name, x);

    const size_t ls = (size_t)s * NH, M = (size_t)(e - s);
    check_same(c, dqA, dq_p, nq, Q, 0, "A's dq");
    check_same(c, dsumA + ls, dsum_p + ls, M * NH, NH, s, "A's dsum");
    check_same(c, dsumB + ls, dsumA + ls, M * NH, NH, s, "B's dsum (dsum_in: left as it is)");
    check_same(c, dkA_x, dk_p + (size_t)x * KV, owned_A, KV, x, "A's dk");
    check_same(c, dvA_x, dv_p + (size_t)x * KV, owned_A, KV, x, "A's dv");
    check_same(c, dkB, dk_p, owned_B, KV, 0, "B's dk");
    check_same(c, dvB, dv_p, owned_B, KV, 0, "B's dv");
    const size_t guard = (size_t)x * KV;
    check_canary(c, dkA, 0, guard, "A's dk before its first row (a key below x)");
    check_canary(c, dvA, 0, guard, "A's dv before its first row (a key below x)");
    check_canary(c, dkA, guard + owned_A, nA, "A's dk past kv_hi");
    check_canary(c, dvA, guard + owned_A, nA, "A's dv past kv_hi");
    check_canary(c, dkB, owned_B, nkv, "B's dk past x");
    check_canary(c, dvB, owned_B, nkv, "B's dv past x");

    free(q), free(dout), free(k), free(v), free(o), free(lse), free(dq0), free(dk0), free(dv0);
    free(kmask), free(ws), free(dq_p), free(dk_p), free(dv_p), free(dsum_p), free(dkA), free(dvA);
    free(dkB), free(dvB), free(dqA), free(dsumA), free(dsumB);
}
END_TEST

int main(void) {
    Suite *s = suite_create("attnsplit");
    TCase *tc = tcase_create("attnsplit");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, split_backward, 0, (int)(sizeof cases / sizeof cases[0]));
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
