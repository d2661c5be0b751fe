/* unattended.c — attention rows that see no key, as Hugging Face computes them.
 *
 * In a left-padded batch the queries before the first real token see no key: every key j ≤ i is
 * padding. Our attention kernels give such a row O = 0 and no gradient (mode zero). HF computes
 * the row anyway, and the label of the first real token is predicted from it:
 *   hf-eager  the additive mask's finite minimum swamps every score, so the softmax is uniform
 *             over all T keys: O = Σ_j v_j / T. Autograd still differentiates through the scores
 *             (d(s + mask)/ds = 1): dS = P ∘ (dP − D) with P = 1/T, so q and k get gradients;
 *   hf-sdpa   the row is unmasked (AttentionMaskConverter._unmask_unattended): a plain softmax of
 *             the real scores over all T keys, padding and future keys included.
 * On a sliding-window layer (Gemma-3) a row also sees no key when its whole window is padding:
 * HF replaces the window's outside by the same finite minimum (torch.where, not an add), so such
 * a row is uniform over all T keys as in hf-eager (transformers 4.51.3; Gemma-3 never unmasks,
 * not even under sdpa: the engine runs its hf-sdpa as hf-eager; docs/gemma3.md). Such rows
 * after a row that has a key exist only there (right padding more than a window past the last
 * real token); their links of the dK, dV chains then come before those of the earlier rows of
 * the same chunk, so full BP and StreamBP agree bit for bit only when those rows carry no
 * gradient (dO = 0: nothing downstream reads them, as when padding is not a target).
 * The attention kernels leave such rows at O = 0 and lse = +inf, which makes their own backward
 * add nothing for them; these two functions then supply the row's output (after the forward
 * kernel) and its gradients (before the backward kernel), in both numerics.
 *
 * Arithmetic (docs/numerics.md §6, as the portable kernels): scores, D and dP are chains over d;
 * the max and the sum over the T keys use the lane tree of lanes.h (defined by T alone); O, dQ are
 * chains over the keys in ascending order; dK and dV of every key are chains over the rows in
 * ascending order, the heads of a group in ascending order within a row — the order of the backward
 * kernel's own pass, so a key's chain is the same whatever the chunking (the rows without a key
 * precede every row that has one). */
#include "kernels.h"
#include "lanes.h"

#include <omp.h>
#include <string.h>

size_t unattended_workspace(int T) {
    return 2 * (size_t)T;
}

/* The first real key (T if none): rows before it see no key. */
static int first_visible(const uint8_t *kmask, int T) {
    int j = 0;
    while (j < T && !kmask[j]) j++;
    return j;
}

/* Whether query i sees no key: every key of [0, i] is padding (i < fv, the first real key), or,
 * on a sliding-window layer, every key of its window (i − win, i]. */
static int sees_none(const uint8_t *kmask, int i, int win, int fv) {
    if (i < fv) return 1;
    for (int j = i; win && j >= 0 && j > i - win; j--)
        if (kmask[j]) return 0;
    return win != 0;
}

/* P (T) of query q_i: hf-eager 1/T each; hf-sdpa softmax over all T keys of the scaled scores
 * S (T, scratch), as P_j = exp(S_j − lse) with lse = max + log(Σ exp(S − max)). */
static void probs(real *P, real *S, const real *q_i, const real *k, int g, int T, int KV, int HD,
                  real scale, int mode) {
    if (mode == SBP_UNATTENDED_HF_EAGER) {
        const real p = (real)1 / (real)T;
        for (int j = 0; j < T; j++) P[j] = p;
        return;
    }
#pragma omp parallel for schedule(static) if (T > 4096)
    for (int j = 0; j < T; j++) {
        const real *k_j = k + (size_t)j * KV + (size_t)g * HD;
        real sc = 0;
        for (int d = 0; d < HD; d++) sc = rfma(q_i[d], k_j[d], sc);
        S[j] = sc * scale;
    }
    const real m = lanes_max(S, T);
    for (int j = 0; j < T; j++) P[j] = rexp(S[j] - m);
    const real lse = m + rlog(lanes_sum(P, T));
    for (int j = 0; j < T; j++) P[j] = rexp(S[j] - lse);
}

void unattended_forward(real *o, real *ws, const real *q, const real *k, const real *v,
                        const uint8_t *kmask, const sbp_attn_dims *dm, int mode) {
    if (mode == SBP_UNATTENDED_ZERO) return;
    const int s = dm->s, M = dm->M, T = dm->T, NH = dm->NH, NKV = dm->NKV, HD = dm->HD;
    const int rep = NH / NKV, Q = NH * HD, KV = NKV * HD, fv = first_visible(kmask, T);
    const real scale = (real)dm->scale;
    real *P = ws, *S = ws + T;
    for (int i = s; i < s + M; i++) {
        if (!sees_none(kmask, i, dm->window, fv)) continue;
        for (int h = 0; h < NH; h++) {
            const int g = h / rep;
            const size_t qo = (size_t)(i - s) * Q + (size_t)h * HD;
            probs(P, S, q + qo, k, g, T, KV, HD, scale, mode);
            real *o_i = o + qo;
            for (int d = 0; d < HD; d++) o_i[d] = 0;
            for (int j = 0; j < T; j++) { /* O = Σ_j P_j v_j, the keys ascending */
                const real *v_j = v + (size_t)j * KV + (size_t)g * HD;
                for (int d = 0; d < HD; d++) o_i[d] = rfma(P[j], v_j[d], o_i[d]);
            }
        }
    }
}

void unattended_backward(real *dq, real *dk, real *dv, real *ws, const real *dout, const real *o,
                         const real *q, const real *k, const real *v, const uint8_t *kmask,
                         const sbp_attn_dims *dm, int mode) {
    if (mode == SBP_UNATTENDED_ZERO) return;
    const int s = dm->s, M = dm->M, T = dm->T, NH = dm->NH, NKV = dm->NKV, HD = dm->HD;
    const int rep = NH / NKV, Q = NH * HD, KV = NKV * HD, fv = first_visible(kmask, T);
    const real scale = (real)dm->scale;
    real *P = ws, *dS = ws + T;
    for (int i = s; i < s + M; i++) {
        if (!sees_none(kmask, i, dm->window, fv)) continue;
        for (int h = 0; h < NH; h++) {
            const int g = h / rep;
            const size_t qo = (size_t)(i - s) * Q + (size_t)h * HD;
            const real *q_i = q + qo, *do_i = dout + qo, *o_i = o + qo;
            real D = 0;
            for (int d = 0; d < HD; d++) D = rfma(do_i[d], o_i[d], D);
            probs(P, dS, q_i, k, g, T, KV, HD, scale, mode); /* dS: scratch until written */
#pragma omp parallel for schedule(static) if (T > 4096)
            for (int j = 0; j < T; j++) { /* dS'_j = P_j·(dP_j − D)·scale */
                const real *v_j = v + (size_t)j * KV + (size_t)g * HD;
                real dp = 0;
                for (int d = 0; d < HD; d++) dp = rfma(do_i[d], v_j[d], dp);
                dS[j] = (P[j] * (dp - D)) * scale;
            }
            real *dq_i = dq + qo;
            for (int j = 0; j < T; j++) { /* dQ: the keys ascending */
                const real *k_j = k + (size_t)j * KV + (size_t)g * HD;
                for (int d = 0; d < HD; d++) dq_i[d] = rfma(dS[j], k_j[d], dq_i[d]);
            }
#pragma omp parallel for schedule(static) if (T > 1024)
            for (int j = 0; j < T; j++) { /* every key: this (row, head)'s link of its chain */
                real *dk_j = dk + (size_t)j * KV + (size_t)g * HD;
                real *dv_j = dv + (size_t)j * KV + (size_t)g * HD;
                for (int d = 0; d < HD; d++) {
                    dv_j[d] = rfma(P[j], do_i[d], dv_j[d]);
                    dk_j[d] = rfma(dS[j], q_i[d], dk_j[d]);
                }
            }
        }
    }
}
