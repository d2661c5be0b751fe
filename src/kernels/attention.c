/* attention.c — causal grouped-query attention with an online softmax over key tiles at fixed
 * absolute positions (the portable kernel; docs/numerics.md §6).
 *
 * Keys are cut into tiles [j0, j0 + W) with j0 a multiple of W = ATTN_TILE. For query i of head
 * h (kv head g = h / (NH/NKV)) and each key tile at or below the query, with n = min(W, i+1−j0)
 * keys causally visible in the tile and, on a sliding-window layer (window Wn > 0), the first
 * lo = max(0, i−Wn+1−j0) of them out of the window (lo = 0 without one):
 *   S_c  = (Σ_d q_d·k_{j0+c,d}) · scale        one fma chain over d, lo <= c < n;  −inf otherwise
 *                                              and where kmask = 0
 *   m_t  = max_c S_c                           the lane tree over W (lanes.h)
 *   m'   = max(m, m_t),  corr = exp(m − m'),  P_c = exp(S_c − m')
 *   l    = l·corr + Σ_c P_c                    the lane tree over W
 *   part_d ← fma(P_c, v_{j0+c,d}, part_d)      a chain from +0 over c = lo .. n−1
 *   acc_d = part_d on the query's first tile with a visible key, then fma(acc_d, corr, part_d)
 * and at the end O = acc / l, lse = m + log l (a query with no visible key: O = 0, lse = +inf).
 * The output sums per tile, not in one chain over all the query's keys, so that its rounding
 * error grows with the number of tiles, not of keys (docs/numerics.md §6); the first tile is
 * the single chain this replaced, bit for bit, so a query whose keys lie in one tile (every
 * golden case) computes what it did before.
 * Backward, with P_c = exp(S_c − lse), D = Σ_d dO_d·O_d (one chain), dP_c = Σ_d dO_d·v_{c,d},
 * dS_c = P_c·(dP_c − D) and dS'_c = dS_c·scale:
 *   dV_{j,d} ← fma(P, dO_{i,h,d}, dV_{j,d}),  dK_{j,d} ← fma(dS', q_{i,h,d}, dK_{j,d})
 *       over the queries i ≥ j in ascending order and, within a query, its heads h of group g
 *       in ascending order — continuing from the stored dK, dV, so that chunks of queries
 *       processed one after another continue the same chains;
 *   dQ_{i,h,d} ← dQ_{i,h,d} + part_d per key tile, the tiles ascending, part_d a chain
 *       fma(dS', k_{j,d}, part_d) from +0 over the tile's keys j ≤ i in ascending order.
 * Everything a query computes depends on its position and the keys alone, never on the chunk it
 * belongs to, so the schedules agree bit for bit for any chunk size; each output has one owner
 * (no atomics, no split sums), so the thread count does not matter either. cuda/attention.cu
 * runs the same chains.
 *
 * The window: a query's chains take the keys c in [lo, n) of each tile, so its work grows with
 * Wn, not with its position. A tile holding no visible key of a query changes nothing of it
 * (the forward skips it; in the backward its P and dS' are 0 and dK, dV, dQ, which start at +0
 * and are never −0, are left as they are, dQ's tile part +0 added), so the loops start at the
 * first tile of the window (tile_first) and stop at the last query that can see a tile: which
 * tiles a loop visits depends on the chunk, the bits do not. Without a window (Wn = 0) every
 * bound is the causal one, the chains of the kernel before windows. For the same reason a tile
 * whose keys are all padding (kmask 0: left padding's first tiles) is skipped everywhere.
 *
 * Layout for the CPU: a tile's keys (and values) are packed transposed, (HD, W), so that the
 * scores of one query against the W keys form W independent chains over d that vectorize. */
#include "kernels.h"
#include "lanes.h"
#include "vexp.h"

#include <omp.h>
#include <string.h>

enum { W = ATTN_TILE };

/* One thread's workspace. */
typedef struct {
    real *kt, *vt;   /* (HD, W) a key tile's keys and values, transposed */
    real *adk, *adv; /* (W, HD) dK, dV accumulators of a key tile */
    real *acc;       /* (W, HD) O or dQ accumulators of a query tile */
    real *S, *P;     /* (W) scores or probabilities; dP, then dS' */
    real *m, *l;     /* (W) running max and sum of a query tile */
    real *part;      /* (HD) the forward's sum over one key tile (adk's space: backward only) */
} tile_ws;

static size_t per_thread(int HD) {
    return 5 * (size_t)W * HD + 4 * (size_t)W;
}

size_t attention_workspace(int HD) {
    return (size_t)omp_get_max_threads() * per_thread(HD);
}

static tile_ws carve(real *ws, int HD) {
    const size_t WH = (size_t)W * HD;
    tile_ws t;
    t.kt = ws + per_thread(HD) * (size_t)omp_get_thread_num();
    t.vt = t.kt + WH, t.adk = t.vt + WH, t.adv = t.adk + WH, t.acc = t.adv + WH;
    t.S = t.acc + WH, t.P = t.S + W, t.m = t.P + W, t.l = t.m + W;
    t.part = t.adk;
    return t;
}

/* kt (HD, W) = the keys [j0, j0 + nk) of kv head g, transposed; zero past nk */
static void pack_t(real *kt, const real *k, int j0, int nk, int g, int KV, int HD) {
    for (int d = 0; d < HD; d++) {
        real *row = kt + (size_t)d * W;
        for (int c = 0; c < nk; c++) row[c] = k[(size_t)(j0 + c) * KV + (size_t)g * HD + d];
        for (int c = nk; c < W; c++) row[c] = 0;
    }
}

/* s[c] = Σ_d a_d·bt[d][c], one chain per c from 0 */
static void dot_row(real *restrict s, const real *restrict a, const real *restrict bt, int HD) {
    for (int c = 0; c < W; c++) s[c] = 0;
    for (int d = 0; d < HD; d++) {
        const real a_d = a[d];
        const real *b = bt + (size_t)d * W;
        for (int c = 0; c < W; c++) s[c] = rfma(a_d, b[c], s[c]);
    }
}

/* The first key of the tile at j0 in query i's window: keys c < lo of the tile are out of it. */
static int win_lo(int i, int j0, int win) {
    const int lo = win ? i - win + 1 - j0 : 0;
    return lo > 0 ? lo : 0;
}

/* The first key tile that can hold a visible key of a query at or after i. */
static int tile_first(int i, int win) {
    const int j = win ? i - win + 1 : 0;
    return j > 0 ? j / W * W : 0;
}

/* S (scaled, −inf where invisible) of query i against the tile at j0 */
static void scores(real *S, const real *q_i, const real *kt, const uint8_t *kmask, int i, int j0,
                   int win, int HD, real scale) {
    const int n = i + 1 - j0 < W ? i + 1 - j0 : W, lo = win_lo(i, j0, win);
    dot_row(S, q_i, kt, HD);
    for (int c = 0; c < W; c++) S[c] = c >= lo && c < n && kmask[j0 + c] ? S[c] * scale : -INFINITY;
}

/* The query tile of a chunk that holds row i0: [i0, i1) on the global W grid within [s, e). */
static int tile_end(int i0, int e) {
    const int next = (i0 / W + 1) * W;
    return next < e ? next : e;
}

void attention_forward(real *o, real *lse, real *ws, const real *q, const real *k, const real *v,
                       const uint8_t *kmask, const sbp_attn_dims *dm) {
    const int s = dm->s, NH = dm->NH, NKV = dm->NKV, HD = dm->HD, win = dm->window;
    const int rep = NH / NKV, Q = NH * HD, KV = NKV * HD, e = s + dm->M;
    const real scale = (real)dm->scale;
    const int first = s / W, ntiles = (e - 1) / W - first + 1;
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < NH * ntiles; task++) {
        /* late query tiles see the most keys: they go first */
        const int h = task % NH, g = h / rep, tile = first + ntiles - 1 - task / NH;
        const int i0 = tile * W > s ? tile * W : s, i1 = tile_end(i0, e), nq = i1 - i0;
        const tile_ws t = carve(ws, HD);
        real *kt = t.kt, *acc = t.acc, *S = t.S, *m = t.m, *l = t.l, *part = t.part;
        for (int r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0;
        memset(acc, 0, sizeof(real) * (size_t)nq * HD);
        for (int j0 = tile_first(i0, win); j0 < i1; j0 += W) {
            const int nk = i1 - j0 < W ? i1 - j0 : W;
            if (!attn_tile_has_key(kmask, j0, nk)) continue; /* padding: it adds nothing */
            pack_t(kt, k, j0, nk, g, KV, HD);
            for (int r = j0 > i0 ? j0 - i0 : 0; r < nq; r++) {
                const int i = i0 + r, n = i + 1 - j0 < W ? i + 1 - j0 : W, lo = win_lo(i, j0, win);
                if (lo >= W) break; /* the tile is behind this query's window, and the next's */
                scores(S, q + (size_t)(i - s) * Q + (size_t)h * HD, kt, kmask, i, j0, win, HD,
                       scale);
                const real mt = lanes_max(S, W);
                if (mt == -INFINITY) continue; /* no visible key in this tile */
                const real mnew = m[r] > mt ? m[r] : mt, corr = rexp(m[r] - mnew);
                l[r] = l[r] * corr + lanes_exp_sum(S, S, W, mnew);
                for (int d = 0; d < HD; d++) part[d] = 0;
                for (int c = lo; c < n; c++) {
                    const real *v_c = v + (size_t)(j0 + c) * KV + (size_t)g * HD;
                    for (int d = 0; d < HD; d++) part[d] = rfma(S[c], v_c[d], part[d]);
                }
                real *acc_r = acc + (size_t)r * HD;
                const int opening = m[r] == -INFINITY; /* no earlier tile: acc is part */
                for (int d = 0; d < HD; d++)
                    acc_r[d] = opening ? part[d] : rfma(acc_r[d], corr, part[d]);
                m[r] = mnew;
            }
        }
        for (int r = 0; r < nq; r++) {
            real *o_i = o + (size_t)(i0 - s + r) * Q + (size_t)h * HD;
            const real *acc_r = acc + (size_t)r * HD;
            if (l[r] == 0) { /* no visible key at all (a left-padded query) */
                for (int d = 0; d < HD; d++) o_i[d] = 0;
                lse[(size_t)(i0 - s + r) * NH + h] = INFINITY;
            } else {
                for (int d = 0; d < HD; d++) o_i[d] = acc_r[d] / l[r];
                lse[(size_t)(i0 - s + r) * NH + h] = m[r] + rlog(l[r]);
            }
        }
    }
}

/* P and dS' of query i (head h) against the tile at j0, from its lse and D. */
static void tile_grads(real *P, real *dSs, const real *q_i, const real *do_i, const real *kt,
                       const real *vt, const uint8_t *kmask, int i, int j0, int win, int HD,
                       real scale, real L, real D) {
    real *dP = dSs; /* dP is consumed where dS' is written */
    scores(P, q_i, kt, kmask, i, j0, win, HD, scale);
    dot_row(dP, do_i, vt, HD);
    exp_shift(P, P, W, L, 1); /* invisible: exp(−inf) = 0; no visible key: L = +inf, P = 0 */
    for (int c = 0; c < W; c++) dSs[c] = (P[c] * (dP[c] - D)) * scale;
}

void attention_backward(real *dq, real *dk, real *dv, real *dsum, real *ws, const real *dout,
                        const real *o, const real *lse, const real *q, const real *k, const real *v,
                        const uint8_t *kmask, const sbp_attn_dims *dm) {
    const int s = dm->s, M = dm->M, NH = dm->NH, NKV = dm->NKV, HD = dm->HD, win = dm->window;
    const int rep = NH / NKV, Q = NH * HD, KV = NKV * HD, e = s + M;
    const real scale = (real)dm->scale;
    const int first = s / W, nqtiles = (e - 1) / W - first + 1;
    /* key tiles from kfirst: those before the window of query s see no query of the chunk */
    const int kfirst = tile_first(s, win) / W, nktiles = (e + W - 1) / W - kfirst;

#pragma omp parallel for schedule(static)
    for (int r = 0; r < (dm->dsum_in ? 0 : M); r++)
        for (int h = 0; h < NH; h++) {
            const real *a = dout + (size_t)r * Q + (size_t)h * HD;
            const real *b = o + (size_t)r * Q + (size_t)h * HD;
            real D = 0;
            for (int d = 0; d < HD; d++) D = rfma(a[d], b[d], D);
            dsum[(size_t)r * NH + h] = D;
        }

        /* Pass 1: dK, dV of the key tile at j0 for kv head g; early tiles see the most queries. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < nktiles * NKV; task++) {
        const int g = task % NKV, j0 = (kfirst + task / NKV) * W, nk = j0 + W < e ? W : e - j0;
        /* another rank's keys, or padding only (its dK, dV stay as they are) */
        if (!attn_kv_owned(dm, j0) || !attn_tile_has_key(kmask, j0, nk)) continue;
        /* queries from last on see no key of the tile: i − win + 1 > j0 + nk − 1 */
        const int last = win && j0 + nk + win - 1 < e ? j0 + nk + win - 1 : e;
        const tile_ws t = carve(ws, HD);
        real *kt = t.kt, *vt = t.vt, *adk = t.adk, *adv = t.adv, *P = t.S, *dSs = t.P;
        pack_t(kt, k, j0, nk, g, KV, HD);
        pack_t(vt, v, j0, nk, g, KV, HD);
        for (int c = 0; c < nk; c++) {
            memcpy(adk + (size_t)c * HD, dk + attn_kv_row(dm, j0 + c) * KV + (size_t)g * HD,
                   sizeof(real) * HD);
            memcpy(adv + (size_t)c * HD, dv + attn_kv_row(dm, j0 + c) * KV + (size_t)g * HD,
                   sizeof(real) * HD);
        }
        for (int i = j0 > s ? j0 : s; i < last; i++) {
            const int n = i + 1 - j0 < W ? i + 1 - j0 : W, lo = win_lo(i, j0, win);
            for (int h = g * rep; h < (g + 1) * rep; h++) {
                const size_t qo = (size_t)(i - s) * Q + (size_t)h * HD,
                             ro = (size_t)(i - s) * NH + h;
                const real *q_i = q + qo, *do_i = dout + qo;
                tile_grads(P, dSs, q_i, do_i, kt, vt, kmask, i, j0, win, HD, scale, lse[ro],
                           dsum[ro]);
                for (int c = lo; c < n; c++) {
                    real *adk_c = adk + (size_t)c * HD, *adv_c = adv + (size_t)c * HD;
                    for (int d = 0; d < HD; d++) {
                        adv_c[d] = rfma(P[c], do_i[d], adv_c[d]);
                        adk_c[d] = rfma(dSs[c], q_i[d], adk_c[d]);
                    }
                }
            }
        }
        for (int c = 0; c < nk; c++) {
            memcpy(dk + attn_kv_row(dm, j0 + c) * KV + (size_t)g * HD, adk + (size_t)c * HD,
                   sizeof(real) * HD);
            memcpy(dv + attn_kv_row(dm, j0 + c) * KV + (size_t)g * HD, adv + (size_t)c * HD,
                   sizeof(real) * HD);
        }
    }

    /* Pass 2: dQ of the query tile for head h, key tiles in ascending order. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < (dm->no_dq ? 0 : NH * nqtiles); task++) {
        const int h = task % NH, g = h / rep, tile = first + nqtiles - 1 - task / NH;
        const int i0 = tile * W > s ? tile * W : s, i1 = tile_end(i0, e), nq = i1 - i0;
        const tile_ws t = carve(ws, HD);
        real *kt = t.kt, *vt = t.vt, *adq = t.acc, *P = t.S, *dSs = t.P;
        for (int r = 0; r < nq; r++)
            memcpy(adq + (size_t)r * HD, dq + (size_t)(i0 - s + r) * Q + (size_t)h * HD,
                   sizeof(real) * HD);
        for (int j0 = tile_first(i0, win); j0 < i1; j0 += W) {
            const int nk = i1 - j0 < W ? i1 - j0 : W;
            if (!attn_tile_has_key(kmask, j0, nk)) continue; /* padding: dQ += +0 */
            pack_t(kt, k, j0, nk, g, KV, HD);
            pack_t(vt, v, j0, nk, g, KV, HD);
            for (int r = j0 > i0 ? j0 - i0 : 0; r < nq; r++) {
                const int i = i0 + r, n = i + 1 - j0 < W ? i + 1 - j0 : W, lo = win_lo(i, j0, win);
                if (lo >= W) break; /* behind the window of this query and the next */
                const size_t qo = (size_t)(i - s) * Q + (size_t)h * HD,
                             ro = (size_t)(i - s) * NH + h;
                tile_grads(P, dSs, q + qo, dout + qo, kt, vt, kmask, i, j0, win, HD, scale, lse[ro],
                           dsum[ro]);
                /* the tile's part from +0, added once: dQ's chain over the keys grows its error
                 * with W + i/W, not i (docs/numerics.md §6) */
                real *adq_r = adq + (size_t)r * HD, part[HD];
                for (int d = 0; d < HD; d++) part[d] = 0;
                for (int c = lo; c < n; c++) {
                    const real *k_c = k + (size_t)(j0 + c) * KV + (size_t)g * HD;
                    for (int d = 0; d < HD; d++) part[d] = rfma(dSs[c], k_c[d], part[d]);
                }
                for (int d = 0; d < HD; d++) adq_r[d] = adq_r[d] + part[d];
            }
        }
        for (int r = 0; r < nq; r++)
            memcpy(dq + (size_t)(i0 - s + r) * Q + (size_t)h * HD, adq + (size_t)r * HD,
                   sizeof(real) * HD);
    }
}
