/* unattended.cu — attention rows that see no key, as HF computes them (src/kernels/unattended.c
 * is the CPU's: the modes, the formulas and the chains are explained there). The rows are few
 * (the left padding of a sequence), so the host walks them one (row, head) at a time, in the
 * CPU's order, and each step is one warp (the tree over the T keys, the chains of dQ and O) or
 * one thread per (key, dim) element (the links of dK and dV). */
#include "cuda.cuh"

#include <stdlib.h>

namespace SBP_CUDA_NS {

size_t unattended_workspace(const eng *e) {
    return e->unattended ? 2 * (size_t)e->T : 0;
}

/* none[r] = 1 when query s + r sees no key: every key of [0, s + r] is padding or, on a
 * sliding-window layer, every key of its window (src/kernels/unattended.c, sees_none) */
__global__ void sees_none_kernel(uint8_t *none, const uint8_t *kmask, int s, int M, int win) {
    int fv = 0;
    while (fv < s + M && !kmask[fv]) fv++;
    for (int i = s; i < s + M; i++) {
        int found = i >= fv && !win;
        for (int j = i; i >= fv && win && !found && j >= 0 && j > i - win; j--) found = kmask[j];
        none[i - s] = !found;
    }
}

/* The rows of the chunk without a key, on the host (M flags; NULL when out of memory). */
static uint8_t *rows_without_key(const eng *e, const uint8_t *kmask, const sbp_attn_dims *d) {
    uint8_t *dev = (uint8_t *)e->ops->alloc((eng *)e, SBP_MEM_LAYER, (size_t)d->M, "keyless rows");
    uint8_t *none = (uint8_t *)calloc((size_t)d->M, 1);
    if (!dev || !none) { /* out of memory: the run fails */
        if (dev) e->ops->free((eng *)e, dev);
        free(none);
        ((eng *)e)->oom = 1;
        return NULL;
    }
    SBP_LAUNCH(sees_none_kernel, 1, 1, 0, dev, kmask, d->s, d->M, d->window);
    check(e, "sees_none_kernel");
    cudaMemcpy(none, dev, (size_t)d->M, cudaMemcpyDeviceToHost);
    check(e, "keyless rows");
    e->ops->free((eng *)e, dev);
    return none;
}

/* P (T) of query q_i into P, S (T) scratch: hf-eager 1/T; hf-sdpa exp(S − lse) over all keys.
 * Lane k takes the keys ≡ k (mod 32): the tree of lanes.h. */
__device__ void probs(real *P, real *S, const real *q_i, const real *k, int g, int T, int KV,
                      int HD, real scale, int mode) {
    const int lane = threadIdx.x;
    if (mode == SBP_UNATTENDED_HF_EAGER) {
        for (int j = lane; j < T; j += WARP) P[j] = (real)1 / (real)T;
        __syncwarp();
        return;
    }
    real m = -INFINITY;
    for (int j = lane; j < T; j += WARP) {
        const real *k_j = k + (size_t)j * KV + (size_t)g * HD;
        real sc = 0;
        for (int d = 0; d < HD; d++) sc = rfma(q_i[d], k_j[d], sc);
        S[j] = sc * scale;
        m = S[j] > m ? S[j] : m;
    }
    for (int w = WARP / 2; w; w /= 2) {
        const real o = __shfl_down_sync(FULL_MASK, m, w);
        m = o > m ? o : m;
    }
    m = __shfl_sync(FULL_MASK, m, 0);
    real l = 0;
    for (int j = lane; j < T; j += WARP) l = l + rexp(S[j] - m);
    for (int w = WARP / 2; w; w /= 2) l = l + __shfl_down_sync(FULL_MASK, l, w);
    const real lse = m + rlog(__shfl_sync(FULL_MASK, l, 0));
    for (int j = lane; j < T; j += WARP) P[j] = rexp(S[j] - lse);
    __syncwarp(); /* every lane reads every P next */
}

__global__ void unattended_forward_kernel(real *o_i, real *ws, const real *q_i, const real *k,
                                          const real *v, int g, int T, int KV, int HD, real scale,
                                          int mode) {
    real *P = ws, *S = ws + T;
    probs(P, S, q_i, k, g, T, KV, HD, scale, mode);
    for (int d = threadIdx.x; d < HD; d += WARP) {
        real acc = 0;
        for (int j = 0; j < T; j++) acc = rfma(P[j], v[(size_t)j * KV + (size_t)g * HD + d], acc);
        o_i[d] = acc;
    }
}

/* P, dS' = P·(dP − D)·scale of one (row, head) into ws, then its dQ chain over the keys */
__global__ void unattended_dq_kernel(real *dq_i, real *ws, const real *do_i, const real *o_i,
                                     const real *q_i, const real *k, const real *v, int g, int T,
                                     int KV, int HD, real scale, int mode) {
    real *P = ws, *dS = ws + T;
    real D = 0;
    for (int d = 0; d < HD; d++) D = rfma(do_i[d], o_i[d], D);
    probs(P, dS, q_i, k, g, T, KV, HD, scale, mode); /* dS: scratch until written */
    for (int j = threadIdx.x; j < T; j += WARP) {
        const real *v_j = v + (size_t)j * KV + (size_t)g * HD;
        real dp = 0;
        for (int d = 0; d < HD; d++) dp = rfma(do_i[d], v_j[d], dp);
        dS[j] = (P[j] * (dp - D)) * scale;
    }
    __syncwarp();
    for (int d = threadIdx.x; d < HD; d += WARP) {
        real acc = dq_i[d];
        for (int j = 0; j < T; j++) acc = rfma(dS[j], k[(size_t)j * KV + (size_t)g * HD + d], acc);
        dq_i[d] = acc;
    }
}

/* this (row, head)'s link of every key's dK and dV chains */
__global__ void unattended_dkdv_kernel(real *dk, real *dv, const real *ws, const real *do_i,
                                       const real *q_i, int g, int T, int KV, int HD) {
    const size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)T * HD) return;
    const int j = (int)(id / HD), d = (int)(id % HD);
    const real *P = ws, *dS = ws + T;
    const size_t at = (size_t)j * KV + (size_t)g * HD + d;
    dv[at] = rfma(P[j], do_i[d], dv[at]);
    dk[at] = rfma(dS[j], q_i[d], dk[at]);
}

void unattended_forward(const eng *e, real *o, const real *q, const real *k, const real *v,
                        const uint8_t *kmask, const sbp_attn_dims *d) {
    if (!e->unattended) return;
    const int s = d->s, M = d->M, NH = d->NH, HD = d->HD, Q = NH * HD, KV = d->NKV * HD;
    const int rep = NH / d->NKV;
    const real scale = (real)d->scale;
    uint8_t *none = rows_without_key(e, kmask, d);
    for (int i = s; none && i < s + M; i++)
        for (int h = 0; h < NH && none[i - s]; h++) {
            const size_t qo = (size_t)(i - s) * Q + (size_t)h * HD;
            SBP_LAUNCH(unattended_forward_kernel, 1, WARP, 0, o + qo, e->ws, q + qo, k, v, h / rep,
                       e->T, KV, HD, scale, e->unattended);
            check(e, "unattended_forward_kernel");
        }
    free(none);
}

void unattended_backward(const eng *e, real *dq, real *dk, real *dv, const real *dout,
                         const real *o, const real *q, const real *k, const real *v,
                         const uint8_t *kmask, const sbp_attn_dims *d) {
    if (!e->unattended) return;
    const int s = d->s, M = d->M, NH = d->NH, HD = d->HD, Q = NH * HD, KV = d->NKV * HD;
    const int rep = NH / d->NKV;
    const real scale = (real)d->scale;
    uint8_t *none = rows_without_key(e, kmask, d);
    for (int i = s; none && i < s + M; i++)
        for (int h = 0; h < NH && none[i - s]; h++) {
            const size_t qo = (size_t)(i - s) * Q + (size_t)h * HD;
            SBP_LAUNCH(unattended_dq_kernel, 1, WARP, 0, dq + qo, e->ws, dout + qo, o + qo, q + qo,
                       k, v, h / rep, e->T, KV, HD, scale, e->unattended);
            check(e, "unattended_dq_kernel");
            SBP_LAUNCH(unattended_dkdv_kernel, blocks_for((size_t)e->T * HD, THREADS), THREADS, 0,
                       dk, dv, e->ws, dout + qo, q + qo, h / rep, e->T, KV, HD);
            check(e, "unattended_dkdv_kernel");
        }
    free(none);
}

} // namespace SBP_CUDA_NS
