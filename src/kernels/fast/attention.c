/* fast/attention.c — causal grouped-query attention, tiled with an online softmax (FlashAttention's
 * scheme), with the tile products in registers (tile_mm.c).
 *
 * Queries and keys are cut into tiles of W rows on fixed global boundaries (multiples of W).
 * Forward, per head h (kv head g = h / (NH/NKV)) and query tile I:
 *   for each key tile J up to the diagonal:  S = Q_I·K_Jᵀ / sqrt(HD)  (masked: key j visible
 *   from query i iff j <= i and kmask[j]);  a running row max m and sum l rescale the
 *   accumulator:  O_I += exp(S − m)·V_J.   At the end O = O_I / l and lse = m + log l.
 * Backward, with P = exp(S − lse), D_i = dO_i·O_i, dP = dO·Vᵀ, dS = P ∘ (dP − D):
 *   dV_J += P ᵀ·dO_I,   dK_J += dSᵀ·Q_I / sqrt(HD),   dQ_I += dS·K_J / sqrt(HD).
 * Every output has one owner. When the kv heads divide among the threads, one pass does it all:
 * a thread takes whole kv heads, their key tiles in ascending order, and forms dK, dV and the
 * dQ terms of its heads. Otherwise two passes: pass 1 over (kv head, key tile) forms dK and dV,
 * pass 2 over (query head, query tile) forms dQ, with P and dS computed again. Either way dQ of
 * a query tile receives its key tiles in ascending order, so both give the same bits.
 *
 * Why the result does not depend on the chunking: the caller picks W dividing the token block,
 * so chunks that are block multiples consist of whole query tiles. Each (query tile, key tile)
 * product is then the same tile_mm call, on the same operands, in every schedule (and an
 * element of a tile_mm product depends on its operands alone: one fma chain); dQ of a tile
 * sums its key tiles in ascending order; dK and dV of a key tile receive one beta = 1 product
 * per (query tile, head), in ascending query-tile order, straight into the caller's
 * whole-sequence accumulators, so processing queries chunk by chunk adds the same terms in the
 * same order as one pass over all queries. Each output has one owner, so the thread count does
 * not change any bit. A key tile of padding only (kmask 0) is skipped: its P is 0, its dS ±0,
 * and its products would add ±0 to sums that start at +0 and are never −0.
 *
 * The products with Kᵀ and Vᵀ read rows of a key tile's transpose, formed by the thread that
 * uses it: once per key tile in the backward (for every query tile and head it meets), once per
 * key tile and query tile in the forward, whose tasks take a whole kv group so that its heads
 * share it. Every other operand that tile_mm streams as rows (V, K, Q, dO of a tile) is first
 * copied into rows of HD contiguous reals: in place its rows are Q or KV reals apart, a power of
 * two, so a tile's rows fall into a few of L1's sets and are evicted before the next register
 * block reads them again (measured: 80-110 GFLOP/s in place, 96-155 copied, bench model's
 * shapes). A copy changes no value, so no bit. The workspace does not grow with T. */
#include "../lanes.h"
#include "fast.h"
#include "../transpose.h"
#include "../vexp.h"

#include <omp.h>
#include <string.h>

/* per thread: S, P, dP tiles; Kᵀ of a key tile and Vᵀ (backward) or V (forward); then either
 * (forward) per head of a kv group the O accumulator and m, l per row, or (backward) the K tile
 * and the Q and dO tiles of a head */
static size_t per_thread_ws(int W, int HD, int rep) {
    const size_t tile = (size_t)W * HD, fwd = (size_t)rep * (tile + 2 * (size_t)W);
    return 3 * (size_t)W * W + 2 * tile + (fwd > 3 * tile ? fwd : 3 * tile);
}

size_t tiled_attention_workspace(int blk, int NH, int NKV, int HD) {
    return (size_t)omp_get_max_threads() * per_thread_ws(attention_tile(blk), HD, NH / NKV);
}

/* xt = x_Jᵀ for a key tile of nk keys: xt[d·W + c] = x_J[c·KV + d], c < nk */
static void transpose_tile(real *xt, const real *x_J, int nk, int KV, int HD, int W) {
    int d0 = 0;
#ifdef SBP_PLANT_FAST_TILE_TAIL /* planted (tests/test_reach.c): the last dimension past the */
    HD -= HD % 16 != 0; /* last whole 16 left out, whichever loop writes it (AVX2's 8s as well) */
#endif
#if defined(__AVX512F__) && !defined(SBP_REAL_F64)
    /* 16 × 16 blocks transposed in registers: the element loop wrote rows W reals apart one
     * real at a time (a quarter of the forward's time outside its products, perf) */
    for (; d0 + 16 <= HD; d0 += 16)
        for (int c0 = 0; c0 < nk; c0 += 16) {
            const int n = nk - c0 < 16 ? nk - c0 : 16;
            transpose_block(xt + (size_t)d0 * W + c0, (size_t)W, x_J + (size_t)c0 * KV + d0,
                            (size_t)KV, n, (__mmask16)((1u << n) - 1));
        }
#elif defined(__AVX2__) && defined(__FMA__) && !defined(SBP_REAL_F64)
    /* 8 × 8 blocks in ymm registers over whole groups of 8 keys (a store writes all 8 lanes,
     * so a partial group would write past the tile when W < 8); the keys left, by element */
    const int nk8 = nk / 8 * 8;
    for (; d0 + 8 <= HD; d0 += 8)
        for (int c0 = 0; c0 < nk8; c0 += 8)
            transpose_block(xt + (size_t)d0 * W + c0, (size_t)W, x_J + (size_t)c0 * KV + d0,
                            (size_t)KV, 8, 8);
    for (int c = nk8; c < nk; c++)
        for (int d = 0; d < d0; d++) xt[(size_t)d * W + c] = x_J[(size_t)c * KV + d];
#endif
    for (int c = 0; c < nk; c++)
        for (int d = d0; d < HD; d++) xt[(size_t)d * W + c] = x_J[(size_t)c * KV + d];
}

/* xc = x_J, n rows of HD reals from rows ld apart into contiguous ones */
static void copy_tile(real *xc, const real *x_J, int n, size_t ld, int HD) {
    for (int r = 0; r < n; r++)
        memcpy(xc + (size_t)r * HD, x_J + (size_t)r * ld, sizeof(real) * HD);
}

/* End of the tile that starts at i: the next multiple of W, or e. */
static int tile_end(int i, int e, int W) {
    int next = (i / W + 1) * W;
    return next < e ? next : e;
}

/* The first key tile (of W keys) that can hold a visible key of a query at or after i, on a
 * layer of window win (0: causal, the tile at 0). */
static int tile_first(int i, int win, int W) {
    const int j = win ? i - win + 1 : 0;
    return j > 0 ? j / W * W : 0;
}

/* S[r][c] = −inf where key j0 + c is not visible from query i0 + r: past the diagonal
 * (c > i0 + r − j0, a contiguous tail of the row), before the window (c < i0 + r − j0 − win + 1,
 * a contiguous head, win > 0) or a padded key. Most tiles have no padded key, and then only
 * the tails and heads are touched. */
static void mask_tile(real *S, int i0, int nq, int j0, int nk, int ldS, const uint8_t *kmask,
                      int win) {
    int padded = 0;
    for (int c = 0; c < nk; c++) padded |= !kmask[j0 + c];
    for (int r = 0; r < nq; r++) {
        real *S_r = S + (size_t)r * ldS;
        const int last = i0 + r - j0; /* the last visible column */
        for (int c = last < 0 ? 0 : last + 1; c < nk; c++) S_r[c] = -INFINITY;
#ifdef SBP_PLANT_FAST_WINDOW_MASK /* planted (tests/test_reach.c): one key too many in the window  \
                                   */
        for (int c = 0; win && c < nk && c < last - win; c++) S_r[c] = -INFINITY;
#else
        for (int c = 0; win && c < nk && c <= last - win; c++) S_r[c] = -INFINITY;
#endif
        if (padded)
            for (int c = 0; c < nk && c <= last; c++)
                if (!kmask[j0 + c]) S_r[c] = -INFINITY;
    }
}

void tiled_attention_forward(real *o, real *lse, real *scratch, const real *q, const real *k,
                             const real *v, const uint8_t *kmask, const sbp_attn_dims *dm) {
    const int s = dm->s, NH = dm->NH, NKV = dm->NKV, HD = dm->HD, win = dm->window;
    const int rep = NH / NKV, Q = NH * HD, KV = NKV * HD, W = attention_tile(dm->blk);
    const int e = s + dm->M;
    const real scale = (real)dm->scale;
    const size_t per_thread = per_thread_ws(W, HD, rep);
    /* query tiles of the chunk, each aligned to the global W grid; a task is a query tile of
     * a kv group: its heads share the transpose of each key tile. With a window the key tiles
     * start at the first one the tile's first row (on the grid, so that the tiles a query tile
     * meets do not depend on the chunk) can see. */
    const int first = s / W, ntiles = (e - 1) / W - first + 1;
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < NKV * ntiles; task++) {
        const int g = task % NKV, tile = first + ntiles - 1 - task / NKV;
        const int i0 = tile * W > s ? tile * W : s, i1 = tile_end(i0, e, W), nq = i1 - i0;
        real *S = scratch + per_thread * (size_t)omp_get_thread_num();
        real *kt = S + 3 * (size_t)W * W, *vc = kt + (size_t)W * HD, *acc = vc + (size_t)W * HD;
        real *m = acc + (size_t)rep * W * HD, *l = m + (size_t)rep * W;
        for (int r = 0; r < rep * W; r++) m[r] = -INFINITY, l[r] = 0;
        memset(acc, 0, sizeof(real) * (size_t)rep * W * HD);
        for (int j0 = tile_first(tile * W, win, W); j0 < i1; j0 += W) {
            const int nk = j0 + W < i1 ? W : i1 - j0;
            if (!attn_tile_has_key(kmask, j0, nk)) continue; /* padding: it adds nothing */
            const size_t kv_J = (size_t)j0 * KV + (size_t)g * HD;
            transpose_tile(kt, k + kv_J, nk, KV, HD, W);
            copy_tile(vc, v + kv_J, nk, KV, HD);
            for (int hh = 0; hh < rep; hh++) {
                const real *q_I = q + (size_t)(i0 - s) * Q + (size_t)(g * rep + hh) * HD;
                real *acc_h = acc + (size_t)hh * W * HD, *m_h = m + (size_t)hh * W;
                real *l_h = l + (size_t)hh * W;
                tile_mm(S, W, q_I, Q, 1, kt, W, nq, nk, HD, scale, 0);
                mask_tile(S, i0, nq, j0, nk, W, kmask, win);
                for (int r = 0; r < nq; r++) {
                    real *S_r = S + (size_t)r * W;
                    const real mt = lanes_max(S_r, nk);
                    if (mt == -INFINITY) { /* no visible key in this tile: the row adds nothing */
                        for (int c = 0; c < nk; c++) S_r[c] = 0;
                        continue;
                    }
                    const real mnew = m_h[r] > mt ? m_h[r] : mt;
                    const real sum = lanes_exp_sum(S_r, S_r, nk, mnew);
                    if (mnew == m_h[r]) { /* corr = exp(0) = 1: l·1 and acc·1 change no bit */
                        l_h[r] = l_h[r] + sum;
                        continue;
                    }
                    const real corr = rexp(m_h[r] - mnew);
                    l_h[r] = l_h[r] * corr + sum;
                    for (int d = 0; d < HD; d++) acc_h[(size_t)r * HD + d] *= corr;
                    m_h[r] = mnew;
                }
                tile_mm(acc_h, HD, S, W, 1, vc, HD, nq, HD, nk, 1, 1);
            }
        }
        for (int hh = 0; hh < rep; hh++) {
            const int h = g * rep + hh;
            const real *acc_h = acc + (size_t)hh * W * HD, *m_h = m + (size_t)hh * W;
            const real *l_h = l + (size_t)hh * W;
            for (int r = 0; r < nq; r++) {
                real *o_i = o + (size_t)(i0 - s + r) * Q + (size_t)h * HD;
                if (l_h[r] == 0) { /* no visible key at all (a left-padded query) */
                    for (int d = 0; d < HD; d++) o_i[d] = 0;
                    lse[(size_t)(i0 - s + r) * NH + h] = INFINITY;
                } else {
                    for (int d = 0; d < HD; d++) o_i[d] = acc_h[(size_t)r * HD + d] / l_h[r];
                    lse[(size_t)(i0 - s + r) * NH + h] = m_h[r] + rlog(l_h[r]);
                }
            }
        }
    }
}

typedef struct {
    real *dq, *dk, *dv;
    const real *dout, *lse, *dsum, *q, *k, *v;
    const uint8_t *kmask;
    real *scratch;
    size_t per_thread;
    int s, e, NH, NKV, HD, W, Q, KV, win;
    int kv_base; /* the key dk and dv hold in row 0 (sbp_attn_dims.kv_lo) */
    real scale;
} bwd_args;

/* For query tile [i0, i0+nq) of head h against key tile [j0, j0+nk): P and dS (scaled by
 * 1/sqrt(HD) later, in the products that use it). q_I, do_I: (nq, HD) contiguous; dP is
 * scratch. */
static void tile_grads(const bwd_args *a, real *P, real *dS, real *dP, const real *q_I,
                       const real *do_I, const real *kt_J, const real *vt_J, int i0, int nq, int j0,
                       int nk, int h) {
    const int W = a->W, HD = a->HD, NH = a->NH, s = a->s;
    tile_mm(P, W, q_I, HD, 1, kt_J, W, nq, nk, HD, a->scale, 0);
    tile_mm(dP, W, do_I, HD, 1, vt_J, W, nq, nk, HD, 1, 0);
    mask_tile(P, i0, nq, j0, nk, W, a->kmask, a->win);
    for (int r = 0; r < nq; r++) {
        const size_t ro = (size_t)(i0 - s + r) * NH + h;
        const real L = a->lse[ro], D = a->dsum[ro];
        real *P_r = P + (size_t)r * W, *dS_r = dS + (size_t)r * W;
        const real *dP_r = dP + (size_t)r * W;
        exp_shift(P_r, P_r, nk, L, 1); /* masked: exp(−inf) = 0; no visible key: L = +inf, P = 0 */
        for (int c = 0; c < nk; c++) dS_r[c] = P_r[c] * (dP_r[c] - D);
    }
}

/* Key tile [j0, j0+W) of kv head g against every query tile of the chunk at or past it, in
 * ascending order, and each head of the group: with_kv: dV_J += Pᵀ·dO_I, dK_J += dSᵀ·Q_I /
 * sqrt(HD); with_dq: dQ_I += dS·K_J / sqrt(HD). With a window the query tiles stop at the first
 * whose rows all see past the key tile (i0 − win + 1 > j0 + nk − 1): its P and dS are 0, and
 * dK, dV, dQ (from +0, never −0) would not change. */
static void key_tile(const bwd_args *a, int g, int j0, int with_kv, int with_dq) {
    const int W = a->W, e = a->e, s = a->s, rep = a->NH / a->NKV, nk = j0 + W < e ? W : e - j0;
    if (!attn_tile_has_key(a->kmask, j0, nk)) return; /* padding only: its products add ±0 */
    real *P = a->scratch + a->per_thread * (size_t)omp_get_thread_num();
    real *dS = P + (size_t)W * W, *dP = dS + (size_t)W * W, *kt = dP + (size_t)W * W;
    const int HD = a->HD;
    real *vt = kt + (size_t)W * HD, *kc = vt + (size_t)W * HD, *qc = kc + (size_t)W * HD;
    real *doc = qc + (size_t)W * HD;
    const size_t kv_J = (size_t)j0 * a->KV + (size_t)g * HD;
    const size_t dkv_J = (size_t)(j0 - a->kv_base) * a->KV + (size_t)g * HD; /* in dk, dv */
    transpose_tile(kt, a->k + kv_J, nk, a->KV, HD, W);
    transpose_tile(vt, a->v + kv_J, nk, a->KV, HD, W);
    if (with_dq) copy_tile(kc, a->k + kv_J, nk, a->KV, HD);
    for (int i0 = j0 > s ? j0 : s, i1; i0 < e && !(a->win && i0 > j0 + nk + a->win - 2); i0 = i1) {
        i1 = tile_end(i0, e, W);
        const int nq = i1 - i0;
        for (int h = g * rep; h < (g + 1) * rep; h++) {
            const size_t q_I = (size_t)(i0 - s) * a->Q + (size_t)h * HD;
            copy_tile(qc, a->q + q_I, nq, a->Q, HD);
            copy_tile(doc, a->dout + q_I, nq, a->Q, HD);
            tile_grads(a, P, dS, dP, qc, doc, kt, vt, i0, nq, j0, nk, h);
            if (with_kv) {
                tile_mm(a->dv + dkv_J, a->KV, P, 1, W, doc, HD, nk, HD, nq, 1, 1);
                tile_mm(a->dk + dkv_J, a->KV, dS, 1, W, qc, HD, nk, HD, nq, a->scale, 1);
            }
            if (with_dq) tile_mm(a->dq + q_I, a->Q, dS, W, 1, kc, HD, nq, HD, nk, a->scale, 1);
        }
    }
}

/* The backward of queries [s, s + M) in one pass (tiled_attention_backward below cuts longer
 * calls into passes of PASS_TILES query tiles). */
static void backward_pass(real *dq, real *dk, real *dv, real *dsum, real *scratch, const real *dout,
                          const real *o, const real *lse, const real *q, const real *k,
                          const real *v, const uint8_t *kmask, const sbp_attn_dims *dm) {
    const int s = dm->s, M = dm->M, NH = dm->NH, NKV = dm->NKV, HD = dm->HD, win = dm->window;
    const int rep = NH / NKV, Q = NH * HD, KV = NKV * HD, W = attention_tile(dm->blk);
    const int e = s + M;
    const real scale = (real)dm->scale;
    const size_t per_thread = per_thread_ws(W, HD, rep);
    const int first = s / W, nqtiles = (e - 1) / W - first + 1;
    /* key tiles from kfirst on: those before the window of query s meet no query of the chunk
     * (their products would add zeros) */
    const int kfirst = tile_first(s, win, W), nktiles = (e + W - 1) / W - kfirst / W;

#pragma omp parallel for schedule(static)
    for (int r = 0; r < (dm->dsum_in ? 0 : M); r++)
        for (int h = 0; h < NH; h++) {
            const real *a = dout + (size_t)r * Q + (size_t)h * HD;
            const real *b = o + (size_t)r * Q + (size_t)h * HD;
            double D = 0; /* in double, rounded once: the row term every dS of the row shares */
            for (int d = 0; d < HD; d++) D = fma((double)a[d], (double)b[d], D);
            dsum[(size_t)r * NH + h] = (real)D;
        }

    const bwd_args a = {.dq = dq,
                        .dk = dk,
                        .dv = dv,
                        .dout = dout,
                        .lse = lse,
                        .dsum = dsum,
                        .q = q,
                        .k = k,
                        .v = v,
                        .kmask = kmask,
                        .scratch = scratch,
                        .per_thread = per_thread,
                        .s = s,
                        .e = e,
                        .NH = NH,
                        .NKV = NKV,
                        .HD = HD,
                        .W = W,
                        .Q = Q,
                        .KV = KV,
                        .win = win,
                        .kv_base = dm->kv_hi ? dm->kv_lo : 0,
                        .scale = scale};
    if (attention_one_pass(NKV)) {
        /* One pass: each thread takes whole kv heads and their key tiles in ascending order, so
         * dQ of a query tile receives its key tiles in ascending order, the same products in
         * the same order as pass 2 below: the same bits, without pass 2's second computation
         * of P and dP (2 of the 7 tile products) and of the exponentials. */
#pragma omp parallel for schedule(static)
        for (int g = 0; g < NKV; g++)
            for (int j0 = kfirst; j0 < e; j0 += W)
                if (attn_kv_owned(dm, j0) || !dm->no_dq)
                    key_tile(&a, g, j0, attn_kv_owned(dm, j0), !dm->no_dq);
        return;
    }

    /* Pass 1: dK, dV of key tile J for kv head g; early tiles see the most queries: first. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < nktiles * NKV; task++) {
        const int j0 = kfirst + (task / NKV) * W;
        if (attn_kv_owned(dm, j0)) key_tile(&a, task % NKV, j0, 1, 0);
    }

    /* Pass 2: dQ of query tile I for head h, key tiles in ascending order. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < (dm->no_dq ? 0 : NH * nqtiles); task++) {
        const int h = task % NH, g = h / rep, tile = first + nqtiles - 1 - task / NH;
        const int i0 = tile * W > s ? tile * W : s, i1 = tile_end(i0, e, W), nq = i1 - i0;
        real *P = scratch + per_thread * (size_t)omp_get_thread_num();
        real *dS = P + (size_t)W * W, *dP = dS + (size_t)W * W, *kt = dP + (size_t)W * W;
        real *vt = kt + (size_t)W * HD, *kc = vt + (size_t)W * HD, *qc = kc + (size_t)W * HD;
        real *doc = qc + (size_t)W * HD;
        const size_t q_I = (size_t)(i0 - s) * Q + (size_t)h * HD;
        copy_tile(qc, q + q_I, nq, Q, HD);
        copy_tile(doc, dout + q_I, nq, Q, HD);
        for (int j0 = tile_first(i0, win, W); j0 < i1; j0 += W) {
            const int nk = j0 + W < i1 ? W : i1 - j0;
            if (!attn_tile_has_key(kmask, j0, nk)) continue; /* padding: dQ += ±0 */
            const size_t kv_J = (size_t)j0 * KV + (size_t)g * HD;
            /* per query tile: pass 2 is the rare form */
            transpose_tile(kt, k + kv_J, nk, KV, HD, W);
            transpose_tile(vt, v + kv_J, nk, KV, HD, W);
            copy_tile(kc, k + kv_J, nk, KV, HD);
            tile_grads(&a, P, dS, dP, qc, doc, kt, vt, i0, nq, j0, nk, h);
            tile_mm(dq + q_I, Q, dS, W, 1, kc, HD, nq, HD, nk, scale, 1);
        }
    }
}

/* Queries per pass, in tiles: a key tile meets the Q and dO rows of every query tile of its pass
 * at or past it (copied for each, key_tile), and over a whole sequence those are 16 MB at the
 * bench model's T = 8192 for each key tile, read from memory again and again; over 8 tiles (1024
 * queries at W = 128) they stay in cache. The backward of T = 8192 took 6-7% (1 thread) and 8-11%
 * (2 threads) less time, T = 2048 the same (bench model's shapes, alternated). */
enum { PASS_TILES = 8 };

/* The passes start on the global grid of PASS_TILES·W queries, so a call whose queries start on a
 * tile boundary runs the very passes that calls for its parts would run: the same bits (the chunk
 * argument at the top of this file) and the same for every schedule. */
void tiled_attention_backward(real *dq, real *dk, real *dv, real *dsum, real *scratch,
                              const real *dout, const real *o, const real *lse, const real *q,
                              const real *k, const real *v, const uint8_t *kmask,
                              const sbp_attn_dims *dm) {
    const int Q = dm->NH * dm->HD, NH = dm->NH, rows = PASS_TILES * attention_tile(dm->blk);
    for (int s = dm->s, e = dm->s + dm->M, next; s < e; s = next) {
        next = (s / rows + 1) * rows < e ? (s / rows + 1) * rows : e;
        sbp_attn_dims p = *dm;
        p.s = s, p.M = next - s;
        const size_t r = (size_t)(s - dm->s); /* the pass's first row in the call's arrays */
        backward_pass(dq ? dq + r * Q : NULL, dk, dv, dsum + r * NH, scratch, dout + r * Q,
                      o ? o + r * Q : NULL, lse + r * NH, q + r * Q, k, v, kmask, &p);
    }
}
