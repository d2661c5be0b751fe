/* attention.c — causal grouped-query attention with an online softmax (FlashAttention's scheme),
 * written as plain loops so that every output has one fixed summation order.
 *
 * Forward, per query i and head h (kv head g = h / (NH/NKV)):
 *   s_j = (q_i · k_j) / sqrt(HD) over visible keys j (j <= i, kmask[j] = 1), visited in tiles of
 *   KT keys starting at key 0; a running max m and sum l rescale the accumulator, so
 *   o_i = Σ_j softmax_j(s) v_j and lse_i = m + log l are formed without any T×T matrix.
 * Backward, with p_ij = exp(s_ij − lse_i), D_i = dO_i · O_i and ds_ij = p_ij (dO_i·v_j − D_i):
 *   dv_j += Σ_i p_ij dO_i,   dk_j += Σ_i ds_ij q_i / sqrt(HD),   dq_i += Σ_j ds_ij k_j / sqrt(HD).
 * It runs as two passes so that each output has one owner: pass 1 over (kv head, key tile) forms
 * dK and dV, pass 2 over (query, head) forms dQ; the scores are recomputed in each.
 *
 * Why the result does not depend on the chunking: a query's forward visits keys 0..i in the same
 * global tiles whatever chunk it belongs to; dq_i sums over keys in ascending order; and dk_j, dv_j
 * receive one addition per (query, head) in ascending query order, straight into the caller's
 * whole-sequence accumulators, so processing queries chunk by chunk in ascending order produces
 * the same sequence of additions as one pass over all queries. Neither pass depends on the thread
 * count: threads own disjoint outputs. */
#include "kernels.h"

#include <string.h>

#define KT     64  /* keys per tile */
#define MAX_HD 512 /* the config loader rejects larger head_dim */

void attention_transpose(real *xt, const real *x, int T, int NKV, int HD) {
    int KV = NKV * HD;
#pragma omp parallel for schedule(static)
    for (int gd = 0; gd < KV; gd++) {
        real *row = xt + (size_t)gd * T;
        for (int t = 0; t < T; t++) row[t] = x[(size_t)t * KV + gd];
    }
}

/* sc[jj] = (q · k_{j0+jj}) · scale for jj < n, from the transposed keys of one kv head. */
static void scores(real *sc, const real *q, const real *ktg, int j0, int n, int T, int HD,
                   real scale) {
    for (int jj = 0; jj < n; jj++) sc[jj] = 0;
    for (int d = 0; d < HD; d++) {
        const real qd = q[d], *kr = ktg + (size_t)d * T + j0;
        for (int jj = 0; jj < n; jj++) sc[jj] += qd * kr[jj];
    }
    for (int jj = 0; jj < n; jj++) sc[jj] *= scale;
}

void attention_forward(real *o, real *lse, const real *q, const real *kt, const real *v,
                       const uint8_t *kmask, int s, int M, int T, int NH, int NKV, int HD) {
    const int rep = NH / NKV, Q = NH * HD, KV = NKV * HD;
    const real scale = 1 / sqrt((real)HD);
#pragma omp parallel for collapse(2) schedule(dynamic, 8)
    for (int r = 0; r < M; r++) {
        for (int h = 0; h < NH; h++) {
            const int i = s + r, g = h / rep;
            const real *q_i = q + (size_t)r * Q + (size_t)h * HD, *ktg = kt + (size_t)g * HD * T;
            real acc[MAX_HD], sc[KT], m = -INFINITY, l = 0;
            for (int d = 0; d < HD; d++) acc[d] = 0;
            for (int j0 = 0; j0 <= i; j0 += KT) {
                const int n = (j0 + KT <= i + 1 ? KT : i + 1 - j0);
                scores(sc, q_i, ktg, j0, n, T, HD, scale);
                real mt = -INFINITY;
                for (int jj = 0; jj < n; jj++) {
                    if (!kmask[j0 + jj]) sc[jj] = -INFINITY;
                    mt = sc[jj] > mt ? sc[jj] : mt;
                }
                if (mt == -INFINITY) continue; /* no visible key in this tile */
                const real mnew = m > mt ? m : mt, corr = rexp(m - mnew);
                l *= corr;
                for (int d = 0; d < HD; d++) acc[d] *= corr;
                for (int jj = 0; jj < n; jj++) {
                    const real p = rexp(sc[jj] - mnew),
                               *v_j = v + (size_t)(j0 + jj) * KV + (size_t)g * HD;
                    l += p;
                    for (int d = 0; d < HD; d++) acc[d] += p * v_j[d];
                }
                m = mnew;
            }
            real *o_i = o + (size_t)r * Q + (size_t)h * HD;
            if (l == 0) { /* no visible key at all (a left-padded query) */
                for (int d = 0; d < HD; d++) o_i[d] = 0;
                lse[(size_t)r * NH + h] = INFINITY;
            } else {
                for (int d = 0; d < HD; d++) o_i[d] = acc[d] / l;
                lse[(size_t)r * NH + h] = m + rlog(l);
            }
        }
    }
}

/* For one (query, head) against the keys [j0, j0+n) of a tile: p and ds of each key.
 * Keys beyond the query or masked out get p = ds = 0. */
static void tile_probs(real *p, real *ds, const real *q_i, const real *do_i, real lse_i, real D_i,
                       const real *ktg, const real *vtg, const uint8_t *kmask, int i, int j0, int n,
                       int T, int HD, real scale) {
    scores(p, q_i, ktg, j0, n, T, HD, scale);
    scores(ds, do_i, vtg, j0, n, T, HD, 1); /* ds temporarily holds dp_j = dO_i · v_j */
    for (int jj = 0; jj < n; jj++) {
        const int visible = j0 + jj <= i && kmask[j0 + jj];
        p[jj] = visible ? rexp(p[jj] - lse_i) : 0;
        ds[jj] = p[jj] * (ds[jj] - D_i);
    }
}

void attention_backward(real *dq, real *dk, real *dv, real *dsum, const real *dout, const real *o,
                        const real *lse, const real *q, const real *k, const real *kt,
                        const real *vt, const uint8_t *kmask, int s, int M, int T, int NH, int NKV,
                        int HD) {
    const int rep = NH / NKV, Q = NH * HD, KV = NKV * HD, e = s + M;
    const real scale = 1 / sqrt((real)HD);
    const int ntiles = (e + KT - 1) / KT;

#pragma omp parallel for schedule(static)
    for (int r = 0; r < M; r++)
        for (int h = 0; h < NH; h++) {
            const real *a = dout + (size_t)r * Q + (size_t)h * HD,
                       *b = o + (size_t)r * Q + (size_t)h * HD;
            real D = 0;
            for (int d = 0; d < HD; d++) D += a[d] * b[d];
            dsum[(size_t)r * NH + h] = D;
        }

        /* Pass 1: dK, dV. Task (tile, g); early tiles see the most queries, so they go first. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < ntiles * NKV; task++) {
        const int tile = task / NKV, g = task % NKV, j0 = tile * KT;
        const int n = j0 + KT <= e ? KT : e - j0;
        const real *ktg = kt + (size_t)g * HD * T, *vtg = vt + (size_t)g * HD * T;
        real p[KT], ds[KT];
        for (int i = j0 > s ? j0 : s; i < e; i++) {
            const int r = i - s, nv = i + 1 - j0 < n ? i + 1 - j0 : n; /* keys j <= i */
            for (int h = g * rep; h < (g + 1) * rep; h++) {
                const real L = lse[(size_t)r * NH + h];
                if (L == INFINITY) continue;
                const real *q_i = q + (size_t)r * Q + (size_t)h * HD;
                const real *do_i = dout + (size_t)r * Q + (size_t)h * HD;
                tile_probs(p, ds, q_i, do_i, L, dsum[(size_t)r * NH + h], ktg, vtg, kmask, i, j0,
                           nv, T, HD, scale);
                for (int jj = 0; jj < nv; jj++) {
                    if (p[jj] == 0 && ds[jj] == 0) continue;
                    real *dv_j = dv + (size_t)(j0 + jj) * KV + (size_t)g * HD;
                    real *dk_j = dk + (size_t)(j0 + jj) * KV + (size_t)g * HD;
                    const real pj = p[jj], dsj = ds[jj] * scale;
                    for (int d = 0; d < HD; d++) dv_j[d] += pj * do_i[d];
                    for (int d = 0; d < HD; d++) dk_j[d] += dsj * q_i[d];
                }
            }
        }
    }

    /* Pass 2: dQ, one (query, head) per task, keys in ascending order. */
#pragma omp parallel for collapse(2) schedule(dynamic, 8)
    for (int r = 0; r < M; r++) {
        for (int h = 0; h < NH; h++) {
            const int i = s + r, g = h / rep;
            const real L = lse[(size_t)r * NH + h];
            if (L == INFINITY) continue;
            const real *q_i = q + (size_t)r * Q + (size_t)h * HD;
            const real *do_i = dout + (size_t)r * Q + (size_t)h * HD;
            const real *ktg = kt + (size_t)g * HD * T, *vtg = vt + (size_t)g * HD * T;
            real acc[MAX_HD], p[KT], ds[KT];
            for (int d = 0; d < HD; d++) acc[d] = 0;
            for (int j0 = 0; j0 <= i; j0 += KT) {
                const int n = j0 + KT <= i + 1 ? KT : i + 1 - j0;
                tile_probs(p, ds, q_i, do_i, L, dsum[(size_t)r * NH + h], ktg, vtg, kmask, i, j0, n,
                           T, HD, scale);
                for (int jj = 0; jj < n; jj++) {
                    const real dsj = ds[jj] * scale,
                               *k_j = k + (size_t)(j0 + jj) * KV + (size_t)g * HD;
                    for (int d = 0; d < HD; d++) acc[d] += dsj * k_j[d];
                }
            }
            real *dq_i = dq + (size_t)r * Q + (size_t)h * HD;
            for (int d = 0; d < HD; d++) dq_i[d] += acc[d];
        }
    }
}
