/* attention.cu — causal GQA attention with an online softmax over key tiles at fixed absolute
 * positions, on the GPU. The algorithm, the chains and the trees are those of
 * src/kernels/attention.c line for line (read that file's header first); only the mapping to
 * threads is the GPU's:
 *
 *   forward   one warp per (query, head). Lane k holds the scores of keys j0 + k and j0 + k + 32
 *             of the tile (each a chain over d), so the tile's max and sum are the 32-lane tree
 *             of lanes.h done by shuffles; lane k owns the output dims d ≡ k (mod 32): the
 *             tile's chain part_d ← fma(P_c, v_c,d, part_d) from +0 over c ascending with P_c
 *             broadcast, then acc_d = part_d (the first tile) or fma(acc_d, corr, part_d).
 *   dK, dV    one block per (kv head, key tile): each thread owns some (key, dim) elements of
 *             the tile's dK and dV; for every query of the chunk in ascending order and every
 *             head of the group, the block computes P and dS' of the 64 keys (one thread per key
 *             and chain) into shared memory, then every owner adds its fma link.
 *   dQ        one warp per (query, head), like the forward, the chain over keys ascending.
 * Each output element has one owner and one chain; no atomics.
 *
 * A sliding-window layer (dm.window = Wn > 0): query i sees only keys i − Wn < j, the first
 * lo = max(0, i − Wn + 1 − j0) keys of a tile are out of its window; every chain takes keys
 * lo .. n−1 of a tile and the loops start at the tile of key i − Wn + 1 and stop at the last
 * query that sees a tile, as src/kernels/attention.c (whose header says why skipping a tile
 * without a visible key changes no bit). */
#include "cuda.cuh"

namespace SBP_CUDA_NS {

enum { W = ATTN_TILE, MAX_HD = 256, DPL = MAX_HD / WARP /* dims per lane */ };

/* The first key of the tile at j0 in query i's window (window 0: the tile's first). */
__device__ inline int win_lo(int i, int j0, int win) {
    const int lo = win ? i - win + 1 - j0 : 0;
    return lo > 0 ? lo : 0;
}

/* The first key tile that can hold a visible key of query i. */
__device__ inline int tile_first(int i, int win) {
    const int j = win ? i - win + 1 : 0;
    return j > 0 ? j / W * W : 0;
}

/* The scaled score of query q_i against key j (−inf when invisible): one chain over d. */
__device__ inline real score(const real *q_i, const real *k_j, int HD, real scale) {
    real s = 0;
    for (int d = 0; d < HD; d++) s = rfma(q_i[d], k_j[d], s);
    return s * scale;
}

__device__ inline real warp_max(real m) {
    for (int w = WARP / 2; w; w /= 2) {
        const real o = __shfl_down_sync(FULL_MASK, m, w);
        m = o > m ? o : m;
    }
    return __shfl_sync(FULL_MASK, m, 0);
}

__device__ inline real warp_sum(real s) {
    for (int w = WARP / 2; w; w /= 2) s = s + __shfl_down_sync(FULL_MASK, s, w);
    return __shfl_sync(FULL_MASK, s, 0);
}

__global__ void attention_forward_kernel(real *o, real *lse, const real *q, const real *k,
                                         const real *v, const uint8_t *kmask, sbp_attn_dims dm) {
    const int NH = dm.NH, NKV = dm.NKV, HD = dm.HD;
    const int lane = threadIdx.x % WARP, task = blockIdx.x * WARPS + threadIdx.x / WARP;
    if (task >= dm.M * NH) return; /* the whole warp */
    const int r = task / NH, h = task % NH, g = h / (NH / NKV), i = dm.s + r;
    const int Q = NH * HD, KV = NKV * HD;
    const real scale = (real)dm.scale;
    const real *q_i = q + (size_t)r * Q + (size_t)h * HD;
    real m = -INFINITY, l = 0, acc[DPL];
    for (int t = 0; t < DPL; t++) acc[t] = 0;
    for (int j0 = tile_first(i, dm.window); j0 <= i; j0 += W) {
        const int n = i + 1 - j0 < W ? i + 1 - j0 : W, lo = win_lo(i, j0, dm.window);
        real S[2];
        for (int u = 0; u < 2; u++) {
            const int c = lane + WARP * u;
            S[u] = c >= lo && c < n && kmask[j0 + c]
                       ? score(q_i, k + (size_t)(j0 + c) * KV + (size_t)g * HD, HD, scale)
                       : -INFINITY;
        }
        real lm = -INFINITY; /* lane k's elements k, k + 32, ascending */
        lm = S[0] > lm ? S[0] : lm;
        lm = S[1] > lm ? S[1] : lm;
        const real mt = warp_max(lm);
        if (mt == -INFINITY) continue; /* no visible key in this tile (the whole warp) */
        const real mnew = m > mt ? m : mt, corr = rexp(m - mnew);
        const real P0 = rexp(S[0] - mnew), P1 = rexp(S[1] - mnew);
        real ls = 0;
        ls = ls + P0;
        ls = ls + P1;
        l = l * corr + warp_sum(ls);
        real part[DPL];
        for (int t = 0; t < DPL; t++) part[t] = 0;
        for (int c = lo; c < n; c++) {
            const real p = __shfl_sync(FULL_MASK, c < WARP ? P0 : P1, c % WARP);
            const real *v_c = v + (size_t)(j0 + c) * KV + (size_t)g * HD;
            for (int t = 0; t < DPL; t++) {
                const int d = lane + WARP * t;
                if (d < HD) part[t] = rfma(p, v_c[d], part[t]);
            }
        }
        const bool opening = m == -INFINITY; /* no earlier tile: acc is part */
        for (int t = 0; t < DPL; t++) acc[t] = opening ? part[t] : rfma(acc[t], corr, part[t]);
        m = mnew;
    }
    real *o_i = o + (size_t)r * Q + (size_t)h * HD;
    for (int t = 0; t < DPL; t++) {
        const int d = lane + WARP * t;
        if (d < HD) o_i[d] = l == 0 ? 0 : acc[t] / l;
    }
    if (lane == 0) lse[(size_t)r * NH + h] = l == 0 ? INFINITY : m + rlog(l);
}

/* D = Σ_d dO·O, one chain per (row, head) */
__global__ void dsum_kernel(real *dsum, const real *dout, const real *o, int M, int NH, int HD) {
    const size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)M * NH) return;
    const real *a = dout + id * HD, *b = o + id * HD;
    real D = 0;
    for (int d = 0; d < HD; d++) D = rfma(a[d], b[d], D);
    dsum[id] = D;
}

/* dK, dV of the key tile at j0 = blockIdx.x·W for kv head g = blockIdx.y, from the queries
 * [max(s, j0), e) of the chunk. Thread t owns the elements el = t + THREADS·u, u < PER, of the
 * tile's (W, HD) block: key c = el / HD, dim d = el % HD. PER = W·HD_MAX / THREADS is a template
 * constant, instantiated for head_dim buckets up to 32, 64, 128 and 256, so that the two
 * accumulator arrays live in registers (sized for 256 always, they took 255 registers and
 * spilled); an element's chain does not depend on PER. */
template <int PER>
__global__ void attention_dkdv_kernel(real *dk, real *dv, const real *dout, const real *lse,
                                      const real *dsum, const real *q, const real *k, const real *v,
                                      const uint8_t *kmask, sbp_attn_dims dm) {
    SBP_SHARED(real, P, W);
    SBP_SHARED(real, dSs, W);
    const int s = dm.s, e = dm.s + dm.M, T = dm.T, NH = dm.NH, NKV = dm.NKV, HD = dm.HD;
    const int g = blockIdx.y, j0 = blockIdx.x * W, tid = threadIdx.x, rep = NH / NKV;
    const int Q = NH * HD, KV = NKV * HD, nk = j0 + W < T ? W : T - j0, win = dm.window;
    /* queries from last on see no key of the tile (i − win + 1 > j0 + nk − 1) */
    const int last = win && j0 + nk + win - 1 < e ? j0 + nk + win - 1 : e;
    const real scale = (real)dm.scale;
    const int per = PER;
    real adk[PER], adv[PER];
    for (int u = 0; u < per; u++) {
        const int el = tid + THREADS * u, c = el / HD, d = el % HD;
        const size_t at = (size_t)(j0 + c) * KV + (size_t)g * HD + d;
        const int mine = c < nk && el < W * HD;
        adk[u] = mine ? dk[at] : 0;
        adv[u] = mine ? dv[at] : 0;
    }
    for (int i = j0 > s ? j0 : s; i < last; i++) {
        const int n = i + 1 - j0 < W ? i + 1 - j0 : W, lo = win_lo(i, j0, win);
        for (int h = g * rep; h < (g + 1) * rep; h++) {
            const size_t qo = (size_t)(i - s) * Q + (size_t)h * HD, ro = (size_t)(i - s) * NH + h;
            const real *q_i = q + qo, *do_i = dout + qo;
            if (tid < W) { /* P of key tid */
                const int c = tid;
                const real S =
                    c >= lo && c < n && kmask[j0 + c]
                        ? score(q_i, k + (size_t)(j0 + c) * KV + (size_t)g * HD, HD, scale)
                        : -INFINITY;
                P[c] = rexp(S - lse[ro]);
            } else if (tid < 2 * W) { /* dP of key tid − W, kept in dSs for now */
                const int c = tid - W;
                real dp = 0;
                if (c < nk)
                    for (int d = 0; d < HD; d++)
                        dp = rfma(do_i[d], v[(size_t)(j0 + c) * KV + (size_t)g * HD + d], dp);
                dSs[c] = dp;
            }
            __syncthreads();
            if (tid < W) dSs[tid] = (P[tid] * (dSs[tid] - dsum[ro])) * scale;
            __syncthreads();
            for (int u = 0; u < per; u++) {
                const int el = tid + THREADS * u, c = el / HD, d = el % HD;
                if (el < W * HD && c >= lo && c < n) {
                    adv[u] = rfma(P[c], do_i[d], adv[u]);
                    adk[u] = rfma(dSs[c], q_i[d], adk[u]);
                }
            }
            __syncthreads(); /* before the next (query, head) overwrites P and dS' */
        }
    }
    for (int u = 0; u < per; u++) {
        const int el = tid + THREADS * u, c = el / HD, d = el % HD;
        if (c < nk && el < W * HD) {
            const size_t at = (size_t)(j0 + c) * KV + (size_t)g * HD + d;
            dk[at] = adk[u];
            dv[at] = adv[u];
        }
    }
}

/* dQ of (query s + r, head h), one warp, the key tiles in ascending order */
__global__ void attention_dq_kernel(real *dq, const real *dout, const real *lse, const real *dsum,
                                    const real *q, const real *k, const real *v,
                                    const uint8_t *kmask, sbp_attn_dims dm) {
    const int NH = dm.NH, NKV = dm.NKV, HD = dm.HD;
    const int lane = threadIdx.x % WARP, task = blockIdx.x * WARPS + threadIdx.x / WARP;
    if (task >= dm.M * NH) return; /* the whole warp */
    const int r = task / NH, h = task % NH, g = h / (NH / NKV), i = dm.s + r;
    const int Q = NH * HD, KV = NKV * HD;
    const real scale = (real)dm.scale;
    const size_t qo = (size_t)r * Q + (size_t)h * HD, ro = (size_t)r * NH + h;
    const real *q_i = q + qo, *do_i = dout + qo, L = lse[ro], D = dsum[ro];
    real acc[DPL];
    for (int t = 0; t < DPL; t++) {
        const int d = lane + WARP * t;
        acc[t] = d < HD ? dq[qo + d] : 0;
    }
    for (int j0 = tile_first(i, dm.window); j0 <= i; j0 += W) {
        const int n = i + 1 - j0 < W ? i + 1 - j0 : W, lo = win_lo(i, j0, dm.window);
        real dS[2];
        for (int u = 0; u < 2; u++) {
            const int c = lane + WARP * u;
            const real *k_c = k + (size_t)(j0 + c) * KV + (size_t)g * HD;
            const real *v_c = v + (size_t)(j0 + c) * KV + (size_t)g * HD;
            const real S =
                c >= lo && c < n && kmask[j0 + c] ? score(q_i, k_c, HD, scale) : -INFINITY;
            const real P = rexp(S - L);
            real dp = 0;
            if (c < n)
                for (int d = 0; d < HD; d++) dp = rfma(do_i[d], v_c[d], dp);
            dS[u] = (P * (dp - D)) * scale;
        }
        real part[DPL]; /* the tile's part from +0, added once (attention.c's) */
        for (int t = 0; t < DPL; t++) part[t] = 0;
        for (int c = lo; c < n; c++) {
            const real p = __shfl_sync(FULL_MASK, c < WARP ? dS[0] : dS[1], c % WARP);
            const real *k_c = k + (size_t)(j0 + c) * KV + (size_t)g * HD;
            for (int t = 0; t < DPL; t++) {
                const int d = lane + WARP * t;
                if (d < HD) part[t] = rfma(p, k_c[d], part[t]);
            }
        }
        for (int t = 0; t < DPL; t++) acc[t] = acc[t] + part[t];
    }
    for (int t = 0; t < DPL; t++) {
        const int d = lane + WARP * t;
        if (d < HD) dq[qo + d] = acc[t];
    }
}

void attention_forward(const eng *e, real *o, real *lse, const real *q, const real *k,
                       const real *v, const uint8_t *kmask, const sbp_attn_dims *d) {
    SBP_LAUNCH(attention_forward_kernel, blocks_for((size_t)d->M * d->NH, WARPS), THREADS, 0, o,
               lse, q, k, v, kmask, *d);
    check(e, "attention_forward_kernel");
    unattended_forward(e, o, q, k, v, kmask, d);
}

void attention_backward(const eng *e, real *dq, real *dk, real *dv, real *dsum, const real *dout,
                        const real *o, const real *lse, const real *q, const real *k, const real *v,
                        const uint8_t *kmask, const sbp_attn_dims *d) {
    const int NH = d->NH, NKV = d->NKV, HD = d->HD, M = d->M, end = d->s + M;
    /* rows without a key first: they precede every row with one (src/kernels/unattended.c) */
    unattended_backward(e, dq, dk, dv, dout, o, q, k, v, kmask, d);
    SBP_LAUNCH(dsum_kernel, blocks_for((size_t)M * NH, THREADS), THREADS, 0, dsum, dout, o, M, NH,
               HD);
    check(e, "dsum_kernel");
    const dim3 tiles(blocks_for((size_t)end, W), NKV);
    /* the smallest bucket whose PER·THREADS covers the tile's W·HD elements */
#define DKDV(hd_max)                                                                               \
    SBP_LAUNCH((attention_dkdv_kernel<W *(hd_max) / THREADS>), tiles, THREADS, 0, dk, dv, dout,    \
               lse, dsum, q, k, v, kmask, *d)
    static_assert(W * 32 % THREADS == 0 && MAX_HD == 256, "dK/dV buckets");
    if (HD <= 32)
        DKDV(32);
    else if (HD <= 64)
        DKDV(64);
    else if (HD <= 128)
        DKDV(128);
    else
        DKDV(256);
#undef DKDV
    check(e, "attention_dkdv_kernel");
    SBP_LAUNCH(attention_dq_kernel, blocks_for((size_t)M * NH, WARPS), THREADS, 0, dq, dout, lse,
               dsum, q, k, v, kmask, *d);
    check(e, "attention_dq_kernel");
}

} // namespace SBP_CUDA_NS
