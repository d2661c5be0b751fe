/* ref.c — the float64 oracle: a naive forward pass of the decoder and its hand-derived backward
 * (see ref.h and ref/SEMANTICS.md).
 *
 * Batch rows are independent, so everything runs one sequence at a time: the forward pass keeps
 * every intermediate of every layer for that row (including the NH×T×T attention probabilities),
 * then the backward pass walks the same ops in reverse. Each op's backward sits next to its
 * forward, with the derivation in the comment above it. Conventions:
 *   - arrays are row-major; shapes are given as (rows, cols) in the comments;
 *   - weights keep PyTorch's [out, in] layout, so a projection is y = x·Wᵀ;
 *   - every backward function ADDS into its gradient outputs (dx, dW, ...), so a tensor that
 *     receives gradient from several paths (x from the residual and the norm, the tied embedding
 *     from the lookup and the head) simply gets several calls; callers zero buffers first. */
#include "ref.h"
#include "../src/core/err.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <tgmath.h> /* sqrt, exp, log of a float are the float functions */
#undef I            /* <complex.h>'s imaginary unit, which tgmath.h brings in */

/* The working precision. ref.c is compiled twice: as the float64 oracle, and (ref32.c, with
 * REF_F32) as the same naive loops in float32, whose error against the float64 oracle is the
 * verifier's independent yardstick for float32 runs. The weights are rounded to it once, the
 * RoPE tables are computed in float64 and rounded once (ref/SEMANTICS.md), and every other
 * operation, sums included, runs in it. */
#ifdef REF_F32
typedef float real_t;
#else
typedef double real_t;
#endif
#define R(x) ((real_t)(x))

static const double PI = 3.14159265358979323846;

/* The offset of tensor `kind` of layer l (-1: not a layer tensor) in the slab of ps, or -1 when
 * the family has no such tensor. The oracle looks tensors up by kind in whatever table it is
 * given (its own, from ref/io.c, or the library's in the tests). */
static int64_t offset_of(const sbp_params *ps, sbp_param_kind kind, int l) {
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i].kind == kind && ps->p[i].layer == l) return ps->p[i].offset;
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * Dimensions, tensors and memory */

typedef struct {
    int T, C, NH, NKV, HD, Q, KV, F, V, L;
    real_t eps;
    sbp_unattended unattended; /* what a query that sees no key computes */
    /* Gemma-3 (docs/gemma3.md); for the other families gemma = 0, norm_one = 0, emb_scale = 1 */
    int gemma;        /* (1 + w) norms, sandwich norms, GeGLU, scaled embedding, windows */
    real_t norm_one;  /* RMSNorm multiplies by norm_one + w: 1 for Gemma-3, 0 otherwise */
    real_t scale;     /* attention scale: query_pre_attn_scalar^-0.5 (Gemma-3), HD^-0.5 */
    real_t emb_scale; /* sqrt(C) rounded to real_t (Gemma-3), 1 otherwise */
    int W, pattern;   /* Gemma-3: sliding_window, sliding_window_pattern */
    int pad_id;       /* padding_idx: the embedding row lookups give no gradient; -1 none */
} dims;

/* The window of layer l, computed here from the config (not with src's sbp_layer_window): W for
 * a Gemma-3 sliding layer, (l + 1) % pattern != 0 as HF 4.51.3's Gemma3Attention.is_sliding,
 * and 0 (plain causal) for a global layer and every other family. */
static int layer_window(const dims *d, int l) {
    return d->gemma && d->pattern > 0 && (l + 1) % d->pattern != 0 ? d->W : 0;
}

/* One layer's weights (NULL for tensors the family does not have). */
typedef struct {
    const real_t *in_norm, *post_norm; /* (C) */
    const real_t *wq, *wk, *wv, *wo;   /* (Q, C), (KV, C), (KV, C), (C, Q) */
    const real_t *bq, *bk, *bv;        /* (Q), (KV), (KV): Qwen2 */
    const real_t *q_norm, *k_norm;     /* (HD): Qwen3, Gemma-3 */
    const real_t *wg, *wu, *wd;        /* (F, C), (F, C), (C, F) */
    const real_t *pre_ff, *post_ff;    /* (C): Gemma-3 (post_norm is its post_attention norm) */
} layer_w;

/* The same tensors in the gradient slab. */
typedef struct {
    real_t *in_norm, *post_norm;
    real_t *wq, *wk, *wv, *wo;
    real_t *bq, *bk, *bv;
    real_t *q_norm, *k_norm;
    real_t *wg, *wu, *wd;
    real_t *pre_ff, *post_ff;
} layer_g;

/* Tensor `kind` of layer l (-1 for the embedding, final norm and head) in a weight or gradient
 * slab; NULL when the family has no such tensor. */
static const real_t *wptr(const sbp_params *ps, const real_t *w /* (ps->total) */,
                          sbp_param_kind kind, int l) {
    int64_t o = offset_of(ps, kind, l);
    return o < 0 ? NULL : w + o;
}

static real_t *gptr(const sbp_params *ps, real_t *g /* (ps->total) */, sbp_param_kind kind, int l) {
    int64_t o = offset_of(ps, kind, l);
    return o < 0 ? NULL : g + o;
}

static layer_w layer_weights(const sbp_params *ps, const real_t *w /* (ps->total) */, int l) {
    layer_w lw = {
        .in_norm = wptr(ps, w, SBP_P_IN_NORM, l),
        .post_norm = wptr(ps, w, SBP_P_POST_NORM, l),
        .wq = wptr(ps, w, SBP_P_Q, l),
        .wk = wptr(ps, w, SBP_P_K, l),
        .wv = wptr(ps, w, SBP_P_V, l),
        .wo = wptr(ps, w, SBP_P_O, l),
        .bq = wptr(ps, w, SBP_P_QB, l),
        .bk = wptr(ps, w, SBP_P_KB, l),
        .bv = wptr(ps, w, SBP_P_VB, l),
        .q_norm = wptr(ps, w, SBP_P_QNORM, l),
        .k_norm = wptr(ps, w, SBP_P_KNORM, l),
        .wg = wptr(ps, w, SBP_P_GATE, l),
        .wu = wptr(ps, w, SBP_P_UP, l),
        .wd = wptr(ps, w, SBP_P_DOWN, l),
        .pre_ff = wptr(ps, w, SBP_P_PRE_FF_NORM, l),
        .post_ff = wptr(ps, w, SBP_P_POST_FF_NORM, l),
    };
    return lw;
}

static layer_g layer_grads(const sbp_params *ps, real_t *g /* (ps->total) */, int l) {
    layer_g lg = {
        .in_norm = gptr(ps, g, SBP_P_IN_NORM, l),
        .post_norm = gptr(ps, g, SBP_P_POST_NORM, l),
        .wq = gptr(ps, g, SBP_P_Q, l),
        .wk = gptr(ps, g, SBP_P_K, l),
        .wv = gptr(ps, g, SBP_P_V, l),
        .wo = gptr(ps, g, SBP_P_O, l),
        .bq = gptr(ps, g, SBP_P_QB, l),
        .bk = gptr(ps, g, SBP_P_KB, l),
        .bv = gptr(ps, g, SBP_P_VB, l),
        .q_norm = gptr(ps, g, SBP_P_QNORM, l),
        .k_norm = gptr(ps, g, SBP_P_KNORM, l),
        .wg = gptr(ps, g, SBP_P_GATE, l),
        .wu = gptr(ps, g, SBP_P_UP, l),
        .wd = gptr(ps, g, SBP_P_DOWN, l),
        .pre_ff = gptr(ps, g, SBP_P_PRE_FF_NORM, l),
        .post_ff = gptr(ps, g, SBP_P_POST_FF_NORM, l),
    };
    return lg;
}

/* A pool of zero-filled arrays, freed together. A failed allocation sets `failed` and
 * returns NULL; callers check the flag once after allocating everything. */
typedef struct pool_blk {
    struct pool_blk *next;
    real_t data[];
} pool_blk;

typedef struct {
    pool_blk *head;
    int failed;
} pool;

static void *pool_bytes(pool *pl, size_t bytes) {
    pool_blk *b = calloc(1, sizeof *b + (bytes ? bytes : 1));
    if (!b) {
        pl->failed = 1;
        return NULL;
    }
    b->next = pl->head;
    pl->head = b;
    return b->data;
}

static real_t *pool_get(pool *pl, size_t n) {
    return pool_bytes(pl, sizeof(real_t) * n);
}

static void pool_free(pool *pl) {
    while (pl->head) {
        pool_blk *next = pl->head->next;
        free(pl->head);
        pl->head = next;
    }
}

static void zero(real_t *x /* (n) */, size_t n) {
    memset(x, 0, sizeof *x * n);
}

/* ---------------------------------------------------------------------------------------------
 * Ops: each forward, then its backward */

/* RMSNorm of one vector: y_i = (x_i · r) · g_i with r = 1/sqrt(mean(x²) + eps) and g_i = w_i,
 * or g_i = 1 + w_i for Gemma-3 (one = 1: Gemma3RMSNorm, whose weights start at zero; HF forms
 * 1 + w first, then multiplies x·r by it). Returns r. */
static real_t rmsnorm_fwd(real_t *y /* (n) */, const real_t *x /* (n) */,
                          const real_t *wn /* (n) */, int n, real_t eps, real_t one) {
    real_t ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    real_t r = R(1) / sqrt(ss / R(n) + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * (one + wn[i]);
    return r;
}

/* forward: y_i = g_i x_i r, g_i = one + w_i, r = (Σ_j x_j²/n + eps)^(−1/2), so ∂r/∂x_j =
 * −r³ x_j / n, ∂g_i/∂w_i = 1 and
 *   dw_i = dy_i x_i r,
 *   dx_j = r g_j dy_j + Σ_i g_i dy_i x_i · (−r³ x_j / n)
 *        = r g_j dy_j − (r³/n) x_j Σ_i g_i dy_i x_i. */
static void rmsnorm_bwd(real_t *dx /* (n) += */, real_t *dw /* (n) += */,
                        const real_t *dy /* (n) */, const real_t *x /* (n) */,
                        const real_t *wn /* (n) */, real_t r, int n, real_t one) {
    real_t dot = 0; /* Σ_i g_i dy_i x_i */
    for (int i = 0; i < n; i++) dot += (one + wn[i]) * dy[i] * x[i];
    for (int i = 0; i < n; i++) {
        dw[i] += dy[i] * x[i] * r;
        dx[i] += r * (one + wn[i]) * dy[i] - r * r * r / n * x[i] * dot;
    }
}

/* y = x·Wᵀ + b: y[t,o] = Σ_i x[t,i] W[o,i] + b[o] (b may be NULL). */
static void linear_fwd(real_t *y /* (T, O) */, const real_t *x /* (T, I) */,
                       const real_t *W /* (O, I) */, const real_t *bias /* (O) or NULL */, int T,
                       int I, int O) {
    for (int t = 0; t < T; t++)
        for (int o = 0; o < O; o++) {
            real_t s = bias ? bias[o] : R(0);
            for (int i = 0; i < I; i++) s += x[(size_t)t * I + i] * W[(size_t)o * I + i];
            y[(size_t)t * O + o] = s;
        }
}

/* forward: y[t,o] = Σ_i x[t,i] W[o,i] + b[o], so
 *   dx[t,i] = Σ_o dy[t,o] W[o,i],   dW[o,i] = Σ_t dy[t,o] x[t,i],   db[o] = Σ_t dy[t,o]. */
static void linear_bwd(real_t *dx /* (T, I) += */, real_t *dW /* (O, I) += */,
                       real_t *db /* (O) += or NULL */, const real_t *dy /* (T, O) */,
                       const real_t *x /* (T, I) */, const real_t *W /* (O, I) */, int T, int I,
                       int O) {
    for (int t = 0; t < T; t++)
        for (int o = 0; o < O; o++) {
            real_t g = dy[(size_t)t * O + o];
            for (int i = 0; i < I; i++) {
                dx[(size_t)t * I + i] += g * W[(size_t)o * I + i];
                dW[(size_t)o * I + i] += g * x[(size_t)t * I + i];
            }
            if (db) db[o] += g;
        }
}

/* A LoRA adapter as the loops see it: the adapter's table, its weights and gradient slab in
 * real_t, and the scale s. NULL table: no adapter. */
typedef struct {
    const sbp_params *ps;
    const real_t *w; /* (ps->total) */
    real_t *g;       /* (ps->total) += or NULL */
    real_t s;
    int r;
    real_t *h, *dh; /* (T, r) scratch */
} adapter;

/* lora_A (which = 1) or lora_B (2) of projection `kind` of layer l in slab x; NULL if absent. */
static const real_t *lora_ptr(const adapter *ad, const real_t *x, sbp_param_kind kind, int l,
                              int which) {
    if (!ad->ps || !x) return NULL;
    for (int i = 0; i < ad->ps->n; i++) {
        const sbp_param *p = &ad->ps->p[i];
        if (p->kind == kind && p->layer == l && p->lora == which) return x + p->offset;
    }
    return NULL;
}

/* The adapter on projection `kind` of layer l (if any), y = x·Wᵀ (+ b) + s·(x·Aᵀ)·Bᵀ:
 * adds s·h·Bᵀ with h = x·Aᵀ (T, r) to y. */
static void lora_fwd(real_t *y /* (T, O) += */, const real_t *x /* (T, I) */, const adapter *ad,
                     sbp_param_kind kind, int l, int T, int I, int O) {
    const real_t *A = lora_ptr(ad, ad->w, kind, l, 1), *B = lora_ptr(ad, ad->w, kind, l, 2);
    if (!A || !B) return;
    const int r = ad->r;
    linear_fwd(ad->h, x, A, NULL, T, I, r);
    for (int t = 0; t < T; t++)
        for (int o = 0; o < O; o++) {
            real_t sum = 0;
            for (int k = 0; k < r; k++) sum += ad->h[(size_t)t * r + k] * B[(size_t)o * r + k];
            y[(size_t)t * O + o] += ad->s * sum;
        }
}

/* forward: y += s·h·Bᵀ with h = x·Aᵀ, so
 *   dB[o,k] += s Σ_t dy[t,o] h[t,k],   dh[t,k] = s Σ_o dy[t,o] B[o,k],
 *   dA[k,i] += Σ_t dh[t,k] x[t,i],     dx[t,i] += Σ_k dh[t,k] A[k,i]   (linear_bwd with W = A).
 * h is recomputed from x. */
static void lora_bwd(real_t *dx /* (T, I) += */, const real_t *dy /* (T, O) */,
                     const real_t *x /* (T, I) */, const adapter *ad, sbp_param_kind kind, int l,
                     int T, int I, int O) {
    const real_t *A = lora_ptr(ad, ad->w, kind, l, 1), *B = lora_ptr(ad, ad->w, kind, l, 2);
    if (!A || !B || !ad->g) return;
    real_t *dA = (real_t *)lora_ptr(ad, ad->g, kind, l, 1);
    real_t *dB = (real_t *)lora_ptr(ad, ad->g, kind, l, 2);
    const int r = ad->r;
    linear_fwd(ad->h, x, A, NULL, T, I, r);
    zero(ad->dh, (size_t)T * r);
    for (int t = 0; t < T; t++)
        for (int o = 0; o < O; o++) {
            real_t gy = ad->s * dy[(size_t)t * O + o];
            for (int k = 0; k < r; k++) {
                ad->dh[(size_t)t * r + k] += gy * B[(size_t)o * r + k];
                dB[(size_t)o * r + k] += gy * ad->h[(size_t)t * r + k];
            }
        }
    linear_bwd(dx, dA, NULL, ad->dh, x, A, T, I, r);
}

/* inv_freq[i] = θ^(−2i/HD), with the llama3 rescaling when configured (SEMANTICS.md, RoPE):
 * wavelengths shorter than O/high keep their frequency, longer than O/low are slowed by
 * `factor`, and those in between interpolate with s = (O/wavelen − low)/(high − low); linear
 * scaling (Gemma-3 4B+) divides every frequency by `factor`. `local`: a Gemma-3 sliding
 * layer's table, θ = rope_local_base_freq and never scaled (HF builds it from a copy of the
 * config with rope_scaling {"rope_type": "default"}). */
static void rope_inv_freq(double *inv_freq /* (HD/2) */, const sbp_config *cfg, int local) {
    int HD = cfg->head_dim;
    for (int i = 0; i < HD / 2; i++) {
        double f = pow(local ? cfg->rope_local_theta : cfg->rope_theta, -(2.0 * i) / HD);
        if (local) {
            /* unscaled */
        } else if (cfg->rope_linear) {
            f = f / cfg->rope_factor;
        } else if (cfg->rope_llama3) {
            double O = cfg->rope_orig_max, lo = cfg->rope_low_freq, hi = cfg->rope_high_freq;
            double wavelen = 2 * PI / f;
            if (wavelen < O / hi) {
                /* high frequency: unchanged */
            } else if (wavelen > O / lo) {
                f = f / cfg->rope_factor;
            } else {
                double s = (O / wavelen - lo) / (hi - lo);
                f = (1 - s) * f / cfg->rope_factor + s * f;
            }
        }
        inv_freq[i] = f;
    }
}

/* cos and sin of the angle t·inv_freq[i] for positions t = 0..T−1 (padded or not), computed in
 * float64 and rounded once to the working precision. */
static void rope_tables(real_t *cs /* (T, HD/2) */, real_t *sn /* (T, HD/2) */,
                        const double *inv_freq /* (HD/2) */, int T, int HD) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < HD / 2; i++) {
            double angle = t * inv_freq[i];
            cs[(size_t)t * (HD / 2) + i] = (real_t)cos(angle);
            sn[(size_t)t * (HD / 2) + i] = (real_t)sin(angle);
        }
}

/* Rotate-half RoPE of H heads per row: for i < HD/2, the pair (a, b) = (x[i], x[i + HD/2])
 * becomes (a·c − b·s, b·c + a·s) with c, s = cos, sin of t·inv_freq[i]. */
static void rope_fwd(real_t *y /* (T, H*HD) */, const real_t *x /* (T, H*HD) */,
                     const real_t *cs /* (T, HD/2) */, const real_t *sn /* (T, HD/2) */, int T,
                     int H, int HD) {
    int half = HD / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const real_t *xi = x + ((size_t)t * H + h) * HD;
            real_t *yi = y + ((size_t)t * H + h) * HD;
            for (int i = 0; i < half; i++) {
                real_t c = cs[(size_t)t * half + i], s = sn[(size_t)t * half + i];
                real_t a = xi[i], b = xi[i + half];
                yi[i] = a * c - b * s;
                yi[i + half] = b * c + a * s;
            }
        }
}

/* forward: (ya, yb) = R·(a, b) with R = [[c, −s], [s, c]], a rotation, so (da, db) = Rᵀ·(dya, dyb):
 *   da = dya·c + dyb·s,   db = −dya·s + dyb·c. */
static void rope_bwd(real_t *dx /* (T, H*HD) += */, const real_t *dy /* (T, H*HD) */,
                     const real_t *cs /* (T, HD/2) */, const real_t *sn /* (T, HD/2) */, int T,
                     int H, int HD) {
    int half = HD / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const real_t *dyi = dy + ((size_t)t * H + h) * HD;
            real_t *dxi = dx + ((size_t)t * H + h) * HD;
            for (int i = 0; i < half; i++) {
                real_t c = cs[(size_t)t * half + i], s = sn[(size_t)t * half + i];
                dxi[i] += dyi[i] * c + dyi[i + half] * s;
                dxi[i + half] += -dyi[i] * s + dyi[i + half] * c;
            }
        }
}

/* Key j is visible from query t iff j ≤ t and the key is a real token. The keys a query can see
 * are listed once per sequence (vis, the positions with mask 1, ascending), so that a long row
 * of padding costs nothing but its length. */
static int visible_keys(int *vis /* (T) */, const uint8_t *mask /* (T) */, int T) {
    int n = 0;
    for (int j = 0; j < T; j++)
        if (mask[j] == 1) vis[n++] = j;
    return n;
}

/* The scores s_tj = q[t,h]·k[j,g] · scale of query t against its visible keys vis[lo..n), into
 * s[lo..n); returns n, the number of real keys j ≤ t, and sets *lo: 0 for a global layer, and
 * for a sliding layer of window W (win > 0) the first key with t − W < j (Gemma-3: a query sees
 * the W keys t − W + 1 .. t, docs/gemma3.md). The query sees no key when *lo == n. */
static int scores(real_t *s /* (T) */, int *lo, const real_t *qt /* (HD) */,
                  const real_t *k /* (T, KV) */, const int *vis, int n_vis, int t, int g, int win,
                  const dims *d) {
    int n = 0;
    *lo = 0;
    for (; n < n_vis && vis[n] <= t; n++) {
        if (win > 0 && vis[n] <= t - win) {
            *lo = n + 1; /* outside the window */
            continue;
        }
        const real_t *kj = k + (size_t)vis[n] * d->KV + (size_t)g * d->HD;
        real_t dot = 0;
        for (int i = 0; i < d->HD; i++) dot += qt[i] * kj[i];
        s[n] = dot * d->scale;
    }
    return n;
}

/* The probabilities p (T) over all T keys of a query that sees no key (SEMANTICS.md, "Rows that
 * see no key"): hf-eager 1/T each (HF adds the mask's finite minimum to every score, and that
 * swamps them all equally); hf-sdpa the softmax of the real scores s_j = q·k_j · scale over
 * all T keys, padding and future ones included (HF unmasks the row). Gemma-3: over all T keys
 * in a sliding layer too (the minimum swamps the window's mask as well), and hf-sdpa is
 * hf-eager: HF's Gemma-3 never unmasks, so its sdpa forward is the uniform row too
 * (docs/gemma3.md). */
static void unattended_probs(real_t *p /* (T) */, const real_t *qt /* (HD) */,
                             const real_t *k /* (T, KV) */, int g, const dims *d) {
    const int T = d->T;
    if (d->unattended == SBP_UNATTENDED_HF_EAGER || d->gemma) {
        for (int j = 0; j < T; j++) p[j] = R(1) / R(T);
        return;
    }
    real_t scale = d->scale, mx = -INFINITY, sum = 0;
    for (int j = 0; j < T; j++) {
        const real_t *kj = k + (size_t)j * d->KV + (size_t)g * d->HD;
        real_t dot = 0;
        for (int i = 0; i < d->HD; i++) dot += qt[i] * kj[i];
        p[j] = dot * scale;
        if (p[j] > mx) mx = p[j];
    }
    for (int j = 0; j < T; j++) sum += exp(p[j] - mx);
    real_t l = mx + log(sum);
    for (int j = 0; j < T; j++) p[j] = exp(p[j] - l);
}

/* Causal GQA attention of one sequence (win > 0: a sliding layer, keys t − win < j ≤ t only).
 * Query head h reads key/value head g = h / (NH/NKV). For query t and visible keys j:
 *   s_tj = q[t,h]·k[j,g] · scale (1/sqrt(HD), or query_pre_attn_scalar^-0.5 for Gemma-3),   p_tj =
 * exp(s_tj − lse_t),  lse_t = log Σ_{j' visible} exp(s_tj'), o[t,h] = Σ_j p_tj v[j,g]; p_tj = 0 for
 * invisible keys, and a query with no visible key has p_t· = 0 and o[t,h] = 0. The log-sum-exp
 * subtracts the row maximum before exp (the same value, without overflow). In modes hf-eager and
 * hf-sdpa a query with no visible key attends to all T keys instead (unattended_probs). Only lse is
 * kept (NH×T, +inf for a query without keys); the backward recomputes the scores, so no T×T array
 * exists and long sequences fit. */
static void attention_fwd(real_t *lse /* (NH, T) */, real_t *o /* (T, Q) */,
                          const real_t *q /* (T, Q) */, const real_t *k /* (T, KV) */,
                          const real_t *v /* (T, KV) */, const int *vis, int n_vis, int win,
                          real_t *srow /* (T) scratch */, const dims *d) {
    int T = d->T, HD = d->HD, Q = d->Q, KV = d->KV, rep = d->NH / d->NKV;
    zero(o, (size_t)T * Q);
    for (int h = 0; h < d->NH; h++) {
        int g = h / rep;
        for (int t = 0; t < T; t++) {
            const real_t *qt = q + (size_t)t * Q + (size_t)h * HD;
            int lo, n = scores(srow, &lo, qt, k, vis, n_vis, t, g, win, d);
            lse[(size_t)h * T + t] = INFINITY;
            if (n == lo && d->unattended != SBP_UNATTENDED_ZERO) { /* o = Σ_j p_j v_j, all T */
                unattended_probs(srow, qt, k, g, d);
                real_t *ot = o + (size_t)t * Q + (size_t)h * HD;
                for (int j = 0; j < T; j++) {
                    const real_t *vj = v + (size_t)j * KV + (size_t)g * HD;
                    for (int i = 0; i < HD; i++) ot[i] += srow[j] * vj[i];
                }
            }
            if (n == lo) continue; /* no visible key: p and o stay 0 (mode zero) */
            real_t mx = srow[lo];
            for (int j = lo + 1; j < n; j++)
                if (srow[j] > mx) mx = srow[j];
            real_t sum = 0;
            for (int j = lo; j < n; j++) sum += exp(srow[j] - mx);
            real_t l = mx + log(sum);
            lse[(size_t)h * T + t] = l;
            real_t *ot = o + (size_t)t * Q + (size_t)h * HD;
            for (int j = lo; j < n; j++) {
                real_t pj = exp(srow[j] - l);
                const real_t *vj = v + (size_t)vis[j] * KV + (size_t)g * HD;
                for (int i = 0; i < HD; i++) ot[i] += pj * vj[i];
            }
        }
    }
}

/* forward, per head h and query t (g = kv head of h, sums over the visible keys j; p_tj = 0
 * elsewhere):
 *   o_t = Σ_j p_tj v_j             so  dp_tj = do_t·v_j,          dv_j += p_tj do_t;
 *   p_t = softmax(s_t)             so  ds_tj = p_tj (dp_tj − Σ_j' p_tj' dp_tj')
 *                                      (from ∂p_tj/∂s_tk = p_tj (δ_jk − p_tk));
 *   s_tj = q_t·k_j / sqrt(HD)      so  dq_t += Σ_j ds_tj k_j / sqrt(HD),  dk_j += ds_tj q_t /
 * sqrt(HD). Invisible keys have p_tj = 0, hence ds_tj = 0 and no gradient; a query with no visible
 * key has p_t· = 0 and passes no gradient to q, k or v in mode zero (unattended_bwd otherwise). dk
 * and dv of kv head g collect the gradients of all NH/NKV query heads that read it. p_tj is
 * recomputed from the scores and lse. */
/* A query that sees no key, with p (T) over all T keys from unattended_probs: the same chain as
 * below, o = Σ_j p_j v_j and ds_j = p_j (dp_j − Σ_j' p_j' dp_j'), over every key. In hf-eager
 * p does not depend on the scores' values, but autograd still differentiates through them
 * (d(s + mask)/ds = 1), so q and k get ds as in any softmax. */
static void unattended_bwd(real_t *dqt /* (HD) += */, real_t *dk /* (T, KV) += */,
                           real_t *dv /* (T, KV) += */, const real_t *dot_ /* (HD) */,
                           const real_t *qt /* (HD) */, const real_t *k /* (T, KV) */,
                           const real_t *v /* (T, KV) */, real_t *p /* (T) scratch */,
                           real_t *dp /* (T) scratch */, int g, const dims *d) {
    const int T = d->T, HD = d->HD, KV = d->KV;
    const real_t scale = d->scale;
    unattended_probs(p, qt, k, g, d);
    real_t pdp = 0;
    for (int j = 0; j < T; j++) {
        const real_t *vj = v + (size_t)j * KV + (size_t)g * HD;
        real_t *dvj = dv + (size_t)j * KV + (size_t)g * HD;
        real_t s = 0;
        for (int i = 0; i < HD; i++) {
            s += dot_[i] * vj[i];
            dvj[i] += p[j] * dot_[i];
        }
        dp[j] = s;
        pdp += p[j] * s;
    }
    for (int j = 0; j < T; j++) {
        real_t ds = p[j] * (dp[j] - pdp);
        const real_t *kj = k + (size_t)j * KV + (size_t)g * HD;
        real_t *dkj = dk + (size_t)j * KV + (size_t)g * HD;
        for (int i = 0; i < HD; i++) {
            dqt[i] += ds * kj[i] * scale;
            dkj[i] += ds * qt[i] * scale;
        }
    }
}

static void attention_bwd(real_t *dq /* (T, Q) += */, real_t *dk /* (T, KV) += */,
                          real_t *dv /* (T, KV) += */, const real_t *dout /* (T, Q) */,
                          const real_t *lse /* (NH, T) */, const real_t *q /* (T, Q) */,
                          const real_t *k /* (T, KV) */, const real_t *v /* (T, KV) */,
                          const int *vis, int n_vis, int win, real_t *srow /* (T) scratch */,
                          real_t *dp /* (T) scratch */, const dims *d) {
    int T = d->T, HD = d->HD, Q = d->Q, KV = d->KV, rep = d->NH / d->NKV;
    real_t scale = d->scale;
    for (int h = 0; h < d->NH; h++) {
        int g = h / rep;
        for (int t = 0; t < T; t++) {
            const real_t *dot_ = dout + (size_t)t * Q + (size_t)h * HD;
            const real_t *qt = q + (size_t)t * Q + (size_t)h * HD;
            real_t *dqt = dq + (size_t)t * Q + (size_t)h * HD;
            int lo, n = scores(srow, &lo, qt, k, vis, n_vis, t, g, win, d);
            real_t l = lse[(size_t)h * T + t];
            if (n == lo) {
                if (d->unattended != SBP_UNATTENDED_ZERO)
                    unattended_bwd(dqt, dk, dv, dot_, qt, k, v, srow, dp, g, d);
                continue;
            }
            real_t pdp = 0; /* Σ_j p_tj dp_tj */
            for (int j = lo; j < n; j++) {
                const real_t *vj = v + (size_t)vis[j] * KV + (size_t)g * HD;
                real_t *dvj = dv + (size_t)vis[j] * KV + (size_t)g * HD;
                srow[j] = exp(srow[j] - l); /* the probability, from here on */
                real_t s = 0;
                for (int i = 0; i < HD; i++) {
                    s += dot_[i] * vj[i];
                    dvj[i] += srow[j] * dot_[i];
                }
                dp[j] = s;
                pdp += srow[j] * s;
            }
            for (int j = lo; j < n; j++) {
                real_t ds = srow[j] * (dp[j] - pdp);
                const real_t *kj = k + (size_t)vis[j] * KV + (size_t)g * HD;
                real_t *dkj = dk + (size_t)vis[j] * KV + (size_t)g * HD;
                for (int i = 0; i < HD; i++) {
                    dqt[i] += ds * kj[i] * scale;
                    dkj[i] += ds * qt[i] * scale;
                }
            }
        }
    }
}

static real_t sigmoid(real_t z) {
    return R(1) / (R(1) + exp(-z));
}

/* SwiGLU's product: m = silu(g) ⊙ u with silu(z) = z·σ(z). */
static void swiglu_fwd(real_t *m /* (n) */, const real_t *g /* (n) */, const real_t *u /* (n) */,
                       size_t n) {
    for (size_t i = 0; i < n; i++) m[i] = g[i] * sigmoid(g[i]) * u[i];
}

/* forward: m = silu(g)·u, and silu'(z) = σ(z) + z σ(z)(1 − σ(z)) = σ(z)(1 + z(1 − σ(z))), so
 *   dg = dm · u · silu'(g),   du = dm · silu(g). */
static void swiglu_bwd(real_t *dg /* (n) += */, real_t *du /* (n) += */, const real_t *dm /* (n) */,
                       const real_t *g /* (n) */, const real_t *u /* (n) */, size_t n) {
    for (size_t i = 0; i < n; i++) {
        real_t sg = sigmoid(g[i]);
        dg[i] += dm[i] * u[i] * sg * (1 + g[i] * (1 - sg));
        du[i] += dm[i] * g[i] * sg;
    }
}

/* GeGLU's product (Gemma-3, gelu_pytorch_tanh on the gate): m = gelu(g) ⊙ u with
 *   gelu(z) = 0.5·z·(1 + tanh(c·(z + 0.044715·z³))),  c = sqrt(2/π),
 * PyTorch's gelu(approximate="tanh"), written out with the libm tanh: the oracle is naive on
 * purpose (src/ uses its own portable tanh, docs/gemma3.md). */
static const double GELU_C = 0.7978845608028654; /* sqrt(2/π) */
static const double GELU_A = 0.044715;

static void geglu_fwd(real_t *m /* (n) */, const real_t *g /* (n) */, const real_t *u /* (n) */,
                      size_t n) {
    for (size_t i = 0; i < n; i++) {
        real_t z = g[i], th = tanh(R(GELU_C) * (z + R(GELU_A) * z * z * z));
        m[i] = R(0.5) * z * (1 + th) * u[i];
    }
}

/* forward: m = gelu(g)·u with gelu(z) = ½z(1 + th), th = tanh(c(z + a z³)), so
 *   gelu'(z) = ½(1 + th) + ½z(1 − th²)·c(1 + 3a z²),
 *   dg = dm · u · gelu'(g),   du = dm · gelu(g). */
static void geglu_bwd(real_t *dg /* (n) += */, real_t *du /* (n) += */, const real_t *dm /* (n) */,
                      const real_t *g /* (n) */, const real_t *u /* (n) */, size_t n) {
    for (size_t i = 0; i < n; i++) {
        real_t z = g[i], th = tanh(R(GELU_C) * (z + R(GELU_A) * z * z * z));
        real_t dgelu = R(0.5) * (1 + th) +
                       R(0.5) * z * (1 - th * th) * R(GELU_C) * (1 + 3 * R(GELU_A) * z * z);
        dg[i] += dm[i] * u[i] * dgelu;
        du[i] += dm[i] * R(0.5) * z * (1 + th);
    }
}

/* log softmax(z)[y] with z = logits / τ: z_y − log Σ_j exp(z_j), the sum taken relative to the
 * maximum (the same value, without overflow). Also returns the softmax in prob when not NULL. */
static real_t logprob_fwd(real_t *prob /* (V) or NULL */, const real_t *logits /* (V) */, int y,
                          real_t tau, int V) {
    real_t mx = logits[0] / tau;
    for (int j = 1; j < V; j++)
        if (logits[j] / tau > mx) mx = logits[j] / tau;
    real_t sum = 0;
    for (int j = 0; j < V; j++) sum += exp(logits[j] / tau - mx);
    real_t lse = mx + log(sum);
    if (prob)
        for (int j = 0; j < V; j++) prob[j] = exp(logits[j] / tau - lse);
    return logits[y] / tau - lse;
}

/* forward: logp = z_y − logsumexp(z), z = logits/τ. ∂logp/∂z_j = δ_jy − softmax(z)_j and
 * ∂z_j/∂logits_j = 1/τ, so for the term c·logp:  dlogits_j += c (δ_jy − p_j) / τ. */
static void logprob_bwd(real_t *dlogits /* (V) += */, const real_t *prob /* (V) */, int y, real_t c,
                        real_t tau, int V) {
    for (int j = 0; j < V; j++) dlogits[j] += c * ((j == y) - prob[j]) / tau;
}

/* ---------------------------------------------------------------------------------------------
 * One sequence: activations, forward, backward */

/* Everything one layer computes for one sequence, kept for the backward pass. */
typedef struct {
    real_t *x;         /* (T, C) layer input */
    real_t *r_in;      /* (T) input RMSNorm's 1/rms per row */
    real_t *xn;        /* (T, C) rmsnorm(x)·w_in */
    real_t *q0, *k0;   /* (T, Q), (T, KV) projections (+ bias) */
    real_t *r_q, *r_k; /* (T, NH), (T, NKV) per-head 1/rms of q0, k0 (Qwen3) */
    real_t *q1, *k1;   /* (T, Q), (T, KV) after q_norm/k_norm (Qwen3; else copies of q0, k0) */
    real_t *q, *k, *v; /* (T, Q), (T, KV), (T, KV) q and k after RoPE, and v */
    real_t *lse;       /* (NH, T) attention's log-sum-exp per query (+inf: no visible key) */
    real_t *o;         /* (T, Q) attention output */
    real_t *x2;        /* (T, C) x + o·Woᵀ */
    real_t *r_post;    /* (T) post-attention RMSNorm's 1/rms per row */
    real_t *xn2;       /* (T, C) rmsnorm(x2)·w_post */
    real_t *g, *u;     /* (T, F) xn2·Wgᵀ, xn2·Wuᵀ */
    real_t *m;         /* (T, F) silu(g) ⊙ u (Gemma-3: gelu_tanh(g) ⊙ u) */
    /* Gemma-3's sandwich norms: x2 = x + rmsnorm(ao), y = x2 + rmsnorm(mo); r_post and xn2
     * above are then pre_feedforward_layernorm's */
    real_t *ao, *r_ao; /* (T, C), (T) o·Woᵀ and post_attention_layernorm's 1/rms */
    real_t *mo, *r_mo; /* (T, C), (T) m·Wdᵀ and post_feedforward_layernorm's 1/rms */
} layer_acts;

typedef struct {
    layer_acts *layer;       /* (L) */
    real_t *xf;              /* (T, C) output of the last layer */
    real_t *r_f;             /* (T) final RMSNorm's 1/rms per row */
    real_t *hn;              /* (T, C) rmsnorm(xf)·w_final */
    real_t *logits;          /* (T, V) */
    real_t *cs, *sn;         /* (T, HD/2) RoPE tables (Gemma-3: the global layers') */
    real_t *cs_loc, *sn_loc; /* (T, HD/2) Gemma-3's sliding layers' RoPE tables */
    int *vis, n_vis; /* (T) the positions with attention_mask 1, ascending, and their count */
    real_t *srow;    /* (T) attention scratch: one query's scores */
} seq_acts;

/* Backward scratch of one layer (zeroed before each use). */
typedef struct {
    real_t *dm, *dg, *du;          /* (T, F) */
    real_t *dxn2, *dx2, *dxn;      /* (T, C) */
    real_t *dao, *dmo;             /* (T, C) Gemma-3: d(o·Woᵀ), d(m·Wdᵀ) */
    real_t *dout, *dq, *dq1, *dq0; /* (T, Q) */
    real_t *dk, *dk1, *dk0, *dv;   /* (T, KV) */
    real_t *dp;                    /* (T) */
} layer_scratch;

/* The activations of one sequence (and, when sc is not NULL, the backward scratch) from pl;
 * pl->failed tells whether all of it was allocated. */
static void seq_alloc(seq_acts *s, layer_scratch *sc, pool *pl, const dims *d) {
    size_t T = d->T, C = d->C, Q = d->Q, KV = d->KV, F = d->F;
    s->layer = pool_bytes(pl, sizeof(layer_acts) * (size_t)d->L);
    if (!s->layer) return;
    for (int l = 0; l < d->L; l++) {
        layer_acts *a = &s->layer[l];
        a->x = pool_get(pl, T * C);
        a->r_in = pool_get(pl, T);
        a->xn = pool_get(pl, T * C);
        a->q0 = pool_get(pl, T * Q);
        a->k0 = pool_get(pl, T * KV);
        a->r_q = pool_get(pl, T * d->NH);
        a->r_k = pool_get(pl, T * d->NKV);
        a->q1 = pool_get(pl, T * Q);
        a->k1 = pool_get(pl, T * KV);
        a->q = pool_get(pl, T * Q);
        a->k = pool_get(pl, T * KV);
        a->v = pool_get(pl, T * KV);
        a->lse = pool_get(pl, (size_t)d->NH * T);
        a->o = pool_get(pl, T * Q);
        a->x2 = pool_get(pl, T * C);
        a->r_post = pool_get(pl, T);
        a->xn2 = pool_get(pl, T * C);
        a->g = pool_get(pl, T * F);
        a->u = pool_get(pl, T * F);
        a->m = pool_get(pl, T * F);
        if (d->gemma) {
            a->ao = pool_get(pl, T * C);
            a->r_ao = pool_get(pl, T);
            a->mo = pool_get(pl, T * C);
            a->r_mo = pool_get(pl, T);
        }
    }
    s->xf = pool_get(pl, T * C);
    s->r_f = pool_get(pl, T);
    s->hn = pool_get(pl, T * C);
    s->logits = pool_get(pl, T * d->V);
    s->cs = pool_get(pl, T * (d->HD / 2));
    s->sn = pool_get(pl, T * (d->HD / 2));
    s->cs_loc = pool_get(pl, T * (d->HD / 2));
    s->sn_loc = pool_get(pl, T * (d->HD / 2));
    s->vis = pool_bytes(pl, sizeof(int) * T);
    s->srow = pool_get(pl, T);
    if (!sc) return;
    sc->dm = pool_get(pl, T * F);
    sc->dg = pool_get(pl, T * F);
    sc->du = pool_get(pl, T * F);
    sc->dxn2 = pool_get(pl, T * C);
    sc->dx2 = pool_get(pl, T * C);
    sc->dxn = pool_get(pl, T * C);
    sc->dao = pool_get(pl, T * C);
    sc->dmo = pool_get(pl, T * C);
    sc->dout = pool_get(pl, T * Q);
    sc->dq = pool_get(pl, T * Q);
    sc->dq1 = pool_get(pl, T * Q);
    sc->dq0 = pool_get(pl, T * Q);
    sc->dk = pool_get(pl, T * KV);
    sc->dk1 = pool_get(pl, T * KV);
    sc->dk0 = pool_get(pl, T * KV);
    sc->dv = pool_get(pl, T * KV);
    sc->dp = pool_get(pl, T);
}

/* One layer's RoPE tables: a Gemma-3 sliding layer's own (local base, unscaled), else the
 * global ones. */
static void layer_rope(const real_t **cs, const real_t **sn, const seq_acts *s, const dims *d,
                       int l) {
    int local = layer_window(d, l) > 0;
    *cs = local ? s->cs_loc : s->cs;
    *sn = local ? s->sn_loc : s->sn;
}

/* RMSNorm of each of the T rows of x (T, n) into y, keeping 1/rms per row in r (T). */
static void rmsnorm_rows(real_t *y /* (T, n) */, real_t *r /* (T) */, const real_t *x /* (T, n) */,
                         const real_t *wn /* (n) */, int T, int n, const dims *d) {
    for (int t = 0; t < T; t++)
        r[t] = rmsnorm_fwd(y + (size_t)t * n, x + (size_t)t * n, wn, n, d->eps, d->norm_one);
}

/* forward: rmsnorm_rows; the backward of each row (rmsnorm_bwd), dx and dw accumulated. */
static void rmsnorm_rows_bwd(real_t *dx /* (T, n) += */, real_t *dw /* (n) += */,
                             const real_t *dy /* (T, n) */, const real_t *x /* (T, n) */,
                             const real_t *wn /* (n) */, const real_t *r /* (T) */, int T, int n,
                             const dims *d) {
    for (int t = 0; t < T; t++)
        rmsnorm_bwd(dx + (size_t)t * n, dw, dy + (size_t)t * n, x + (size_t)t * n, wn, r[t], n,
                    d->norm_one);
}

/* The attention half of one layer: from a->x (filled) to a->x2 = x + o·Woᵀ, or for Gemma-3
 * x2 = x + rmsnorm(o·Woᵀ; post_attention_layernorm). */
static void attn_fwd(layer_acts *a, const layer_w *lw, const adapter *ad, int l, const seq_acts *s,
                     const dims *d) {
    int T = d->T, C = d->C, Q = d->Q, KV = d->KV, HD = d->HD;
    const real_t *cs, *sn;
    layer_rope(&cs, &sn, s, d, l);
    rmsnorm_rows(a->xn, a->r_in, a->x, lw->in_norm, T, C, d);
    linear_fwd(a->q0, a->xn, lw->wq, lw->bq, T, C, Q);
    linear_fwd(a->k0, a->xn, lw->wk, lw->bk, T, C, KV);
    linear_fwd(a->v, a->xn, lw->wv, lw->bv, T, C, KV);
    lora_fwd(a->q0, a->xn, ad, SBP_P_Q, l, T, C, Q);
    lora_fwd(a->k0, a->xn, ad, SBP_P_K, l, T, C, KV);
    lora_fwd(a->v, a->xn, ad, SBP_P_V, l, T, C, KV);
    if (lw->q_norm) { /* Qwen3, Gemma-3: RMSNorm of each head's HD-vector, before RoPE */
        rmsnorm_rows(a->q1, a->r_q, a->q0, lw->q_norm, T * d->NH, HD, d);
        rmsnorm_rows(a->k1, a->r_k, a->k0, lw->k_norm, T * d->NKV, HD, d);
    } else {
        memcpy(a->q1, a->q0, sizeof(real_t) * (size_t)T * Q);
        memcpy(a->k1, a->k0, sizeof(real_t) * (size_t)T * KV);
    }
    rope_fwd(a->q, a->q1, cs, sn, T, d->NH, HD);
    rope_fwd(a->k, a->k1, cs, sn, T, d->NKV, HD);
    attention_fwd(a->lse, a->o, a->q, a->k, a->v, s->vis, s->n_vis, layer_window(d, l), s->srow, d);
    real_t *ao = d->gemma ? a->ao : a->x2; /* o·Woᵀ */
    linear_fwd(ao, a->o, lw->wo, NULL, T, Q, C);
    lora_fwd(ao, a->o, ad, SBP_P_O, l, T, Q, C);
    if (d->gemma) rmsnorm_rows(a->x2, a->r_ao, a->ao, lw->post_norm, T, C, d);
    for (size_t i = 0; i < (size_t)T * C; i++) a->x2[i] += a->x[i];
}

/* One decoder layer, from a->x (already filled) to y:
 *   y = x2 + mlp(rmsnorm(x2; post_attention_layernorm)), or for Gemma-3
 *   y = x2 + rmsnorm(mlp(rmsnorm(x2; pre_feedforward_layernorm)); post_feedforward_layernorm)
 * with mlp(m) = (act(m·Wgᵀ) ⊙ m·Wuᵀ)·Wdᵀ, act = silu (gelu_tanh for Gemma-3). */
static void layer_fwd(layer_acts *a, real_t *y /* (T, C) */, const layer_w *lw, const adapter *ad,
                      int l, const seq_acts *s, const dims *d) {
    int T = d->T, C = d->C, F = d->F;
    attn_fwd(a, lw, ad, l, s, d);
    rmsnorm_rows(a->xn2, a->r_post, a->x2, d->gemma ? lw->pre_ff : lw->post_norm, T, C, d);
    linear_fwd(a->g, a->xn2, lw->wg, NULL, T, C, F);
    linear_fwd(a->u, a->xn2, lw->wu, NULL, T, C, F);
    lora_fwd(a->g, a->xn2, ad, SBP_P_GATE, l, T, C, F);
    lora_fwd(a->u, a->xn2, ad, SBP_P_UP, l, T, C, F);
    if (d->gemma)
        geglu_fwd(a->m, a->g, a->u, (size_t)T * F);
    else
        swiglu_fwd(a->m, a->g, a->u, (size_t)T * F);
    real_t *mo = d->gemma ? a->mo : y; /* m·Wdᵀ */
    linear_fwd(mo, a->m, lw->wd, NULL, T, F, C);
    lora_fwd(mo, a->m, ad, SBP_P_DOWN, l, T, F, C);
    if (d->gemma) rmsnorm_rows(y, a->r_mo, a->mo, lw->post_ff, T, C, d);
    for (size_t i = 0; i < (size_t)T * C; i++) y[i] += a->x2[i];
}

/* Backward of the attention half (attn_fwd): from dx2 (sc->dx2) to dx, adding the weight
 * gradients. The residual passes dx2 to dx unchanged; the rest goes through the (Gemma-3)
 * post-attention norm, o_proj, attention, RoPE, the q/k norms and the projections. */
static void attn_bwd(real_t *dx /* (T, C) += */, const layer_g *lg, const layer_w *lw,
                     const adapter *ad, int l, const layer_acts *a, layer_scratch *sc,
                     const seq_acts *s, const dims *d) {
    int T = d->T, C = d->C, Q = d->Q, KV = d->KV, HD = d->HD;
    const real_t *cs, *sn;
    layer_rope(&cs, &sn, s, d, l);
    for (size_t i = 0; i < (size_t)T * C; i++) dx[i] += sc->dx2[i]; /* residual */
    const real_t *dao = sc->dx2;                                    /* d(o·Woᵀ) */
    if (d->gemma) {
        zero(sc->dao, (size_t)T * C);
        rmsnorm_rows_bwd(sc->dao, lg->post_norm, sc->dx2, a->ao, lw->post_norm, a->r_ao, T, C, d);
        dao = sc->dao;
    }
    linear_bwd(sc->dout, lg->wo, NULL, dao, a->o, lw->wo, T, Q, C);
    lora_bwd(sc->dout, dao, a->o, ad, SBP_P_O, l, T, Q, C);
    attention_bwd(sc->dq, sc->dk, sc->dv, sc->dout, a->lse, a->q, a->k, a->v, s->vis, s->n_vis,
                  layer_window(d, l), s->srow, sc->dp, d);
    rope_bwd(sc->dq1, sc->dq, cs, sn, T, d->NH, HD);
    rope_bwd(sc->dk1, sc->dk, cs, sn, T, d->NKV, HD);
    if (lw->q_norm) { /* per-head RMSNorm: the same backward on each HD-vector */
        rmsnorm_rows_bwd(sc->dq0, lg->q_norm, sc->dq1, a->q0, lw->q_norm, a->r_q, T * d->NH, HD, d);
        rmsnorm_rows_bwd(sc->dk0, lg->k_norm, sc->dk1, a->k0, lw->k_norm, a->r_k, T * d->NKV, HD,
                         d);
    } else {
        memcpy(sc->dq0, sc->dq1, sizeof(real_t) * (size_t)T * Q);
        memcpy(sc->dk0, sc->dk1, sizeof(real_t) * (size_t)T * KV);
    }
    /* q0 = xn·Wqᵀ (+ bq), k0 = xn·Wkᵀ (+ bk), v = xn·Wvᵀ (+ bv): xn collects all three */
    linear_bwd(sc->dxn, lg->wq, lg->bq, sc->dq0, a->xn, lw->wq, T, C, Q);
    linear_bwd(sc->dxn, lg->wk, lg->bk, sc->dk0, a->xn, lw->wk, T, C, KV);
    linear_bwd(sc->dxn, lg->wv, lg->bv, sc->dv, a->xn, lw->wv, T, C, KV);
    lora_bwd(sc->dxn, sc->dq0, a->xn, ad, SBP_P_Q, l, T, C, Q);
    lora_bwd(sc->dxn, sc->dk0, a->xn, ad, SBP_P_K, l, T, C, KV);
    lora_bwd(sc->dxn, sc->dv, a->xn, ad, SBP_P_V, l, T, C, KV);
    rmsnorm_rows_bwd(dx, lg->in_norm, sc->dxn, a->x, lw->in_norm, a->r_in, T, C, d);
}

/* Backward of one layer: from dy to dx, adding the layer's weight gradients into lg. The
 * residual connections y = x2 + mlp(x2) and x2 = x + attn(x) pass their gradient through
 * unchanged, so dx2 = dy + (MLP path) and dx = dx2 + (attention path). */
static void layer_bwd(real_t *dx /* (T, C) += */, const real_t *dy /* (T, C) */, const layer_g *lg,
                      const layer_w *lw, const adapter *ad, int l, const layer_acts *a,
                      layer_scratch *sc, const seq_acts *s, const dims *d) {
    int T = d->T, C = d->C, Q = d->Q, KV = d->KV, F = d->F;
    zero(sc->dm, (size_t)T * F);
    zero(sc->dg, (size_t)T * F);
    zero(sc->du, (size_t)T * F);
    zero(sc->dxn2, (size_t)T * C);
    zero(sc->dxn, (size_t)T * C);
    zero(sc->dout, (size_t)T * Q);
    zero(sc->dq, (size_t)T * Q);
    zero(sc->dq1, (size_t)T * Q);
    zero(sc->dq0, (size_t)T * Q);
    zero(sc->dk, (size_t)T * KV);
    zero(sc->dk1, (size_t)T * KV);
    zero(sc->dk0, (size_t)T * KV);
    zero(sc->dv, (size_t)T * KV);

    /* MLP: y = x2 + m·Wdᵀ (Gemma-3: + rmsnorm(m·Wdᵀ)), m = act(g) ⊙ u, g = xn2·Wgᵀ,
     * u = xn2·Wuᵀ, xn2 = rmsnorm(x2) */
    memcpy(sc->dx2, dy, sizeof(real_t) * (size_t)T * C); /* residual */
    const real_t *dmo = dy;                              /* d(m·Wdᵀ) */
    if (d->gemma) {
        zero(sc->dmo, (size_t)T * C);
        rmsnorm_rows_bwd(sc->dmo, lg->post_ff, dy, a->mo, lw->post_ff, a->r_mo, T, C, d);
        dmo = sc->dmo;
    }
    linear_bwd(sc->dm, lg->wd, NULL, dmo, a->m, lw->wd, T, F, C);
    lora_bwd(sc->dm, dmo, a->m, ad, SBP_P_DOWN, l, T, F, C);
    if (d->gemma)
        geglu_bwd(sc->dg, sc->du, sc->dm, a->g, a->u, (size_t)T * F);
    else
        swiglu_bwd(sc->dg, sc->du, sc->dm, a->g, a->u, (size_t)T * F);
    linear_bwd(sc->dxn2, lg->wg, NULL, sc->dg, a->xn2, lw->wg, T, C, F);
    linear_bwd(sc->dxn2, lg->wu, NULL, sc->du, a->xn2, lw->wu, T, C, F);
    lora_bwd(sc->dxn2, sc->dg, a->xn2, ad, SBP_P_GATE, l, T, C, F);
    lora_bwd(sc->dxn2, sc->du, a->xn2, ad, SBP_P_UP, l, T, C, F);
    rmsnorm_rows_bwd(sc->dx2, d->gemma ? lg->pre_ff : lg->post_norm, sc->dxn2, a->x2,
                     d->gemma ? lw->pre_ff : lw->post_norm, a->r_post, T, C, d);
    attn_bwd(dx, lg, lw, ad, l, a, sc, s, d);
}

/* The whole forward pass of one sequence, up to the logits. */
static void seq_fwd(seq_acts *s, const sbp_params *ps, const real_t *w, const adapter *ad,
                    const int32_t *ids /* (T) */, const dims *d) {
    int T = d->T, C = d->C;
    const real_t *E = wptr(ps, w, SBP_P_EMBED, -1);
    int tied = offset_of(ps, SBP_P_LM_HEAD, -1) < 0;
    const real_t *Wlm = tied ? E : wptr(ps, w, SBP_P_LM_HEAD, -1);
    /* x0[t] = E[ids[t]] · emb_scale (Gemma-3: sqrt(C) in the working precision; 1 otherwise) */
    real_t *x0 = d->L > 0 ? s->layer[0].x : s->xf;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++)
            x0[(size_t)t * C + c] = E[(size_t)ids[t] * C + c] * d->emb_scale;
    for (int l = 0; l < d->L; l++) {
        layer_w lw = layer_weights(ps, w, l);
        real_t *y = l + 1 < d->L ? s->layer[l + 1].x : s->xf;
        layer_fwd(&s->layer[l], y, &lw, ad, l, s, d);
    }
    const real_t *wf = wptr(ps, w, SBP_P_FINAL_NORM, -1);
    rmsnorm_rows(s->hn, s->r_f, s->xf, wf, T, C, d);
    linear_fwd(s->logits, s->hn, Wlm, NULL, T, C, d->V); /* logits = hn·W_lmᵀ */
}

/* The backward pass of one sequence, given dlogits; adds into the gradient slab. */
static void seq_bwd(real_t *grads, const real_t *dlogits /* (T, V) */, const seq_acts *s,
                    layer_scratch *sc, real_t *dx /* (T, C) scratch */,
                    real_t *dx_prev /* (T, C) scratch */, real_t *dhn /* (T, C) scratch */,
                    const sbp_params *ps, const real_t *w, const adapter *ad,
                    const int32_t *ids /* (T) */, const dims *d) {
    int T = d->T, C = d->C;
    int tied = offset_of(ps, SBP_P_LM_HEAD, -1) < 0;
    const real_t *Wlm = wptr(ps, w, tied ? SBP_P_EMBED : SBP_P_LM_HEAD, -1);
    real_t *dWlm = gptr(ps, grads, tied ? SBP_P_EMBED : SBP_P_LM_HEAD, -1);
    real_t *dE = gptr(ps, grads, SBP_P_EMBED, -1);
    /* logits = hn·W_lmᵀ; with tied embeddings dW_lm is dE, which also gets the lookup's
     * scatter-add below: one tensor, two contributions */
    zero(dhn, (size_t)T * C);
    linear_bwd(dhn, dWlm, NULL, dlogits, s->hn, Wlm, T, C, d->V);
    zero(dx, (size_t)T * C);
    rmsnorm_rows_bwd(dx, gptr(ps, grads, SBP_P_FINAL_NORM, -1), dhn, s->xf,
                     wptr(ps, w, SBP_P_FINAL_NORM, -1), s->r_f, T, C, d);
    for (int l = d->L - 1; l >= 0; l--) {
        layer_w lw = layer_weights(ps, w, l);
        layer_g lg = layer_grads(ps, grads, l);
        zero(dx_prev, (size_t)T * C);
        layer_bwd(dx_prev, dx, &lg, &lw, ad, l, &s->layer[l], sc, s, d);
        real_t *tmp = dx;
        dx = dx_prev;
        dx_prev = tmp;
    }
    /* x0[t] = E[ids[t]]·emb_scale, so dE[ids[t]] += dx0[t]·emb_scale (scatter-add: repeated ids
     * accumulate), except for the padding_idx row: nn.Embedding(padding_idx=pad_token_id) gives
     * it no gradient from lookups (the tied head's part above stays) */
    for (int t = 0; t < T; t++)
        if (ids[t] != d->pad_id)
            for (int c = 0; c < C; c++)
                dE[(size_t)ids[t] * C + c] += dx[(size_t)t * C + c] * d->emb_scale;
}

/* ---------------------------------------------------------------------------------------------
 * Checks and the three entry points */

/* Expected element count of a tensor kind, and whether the family has it. */
static int64_t expected_numel(sbp_param_kind kind, const sbp_config *cfg, const dims *d,
                              int *needed) {
    int64_t C = d->C, Q = d->Q, KV = d->KV, F = d->F, V = d->V, HD = d->HD;
    *needed = 1;
    switch (kind) {
    case SBP_P_EMBED: return V * C;
    case SBP_P_Q: return Q * C;
    case SBP_P_K:
    case SBP_P_V: return KV * C;
    case SBP_P_QB: *needed = cfg->qkv_bias; return Q;
    case SBP_P_KB:
    case SBP_P_VB: *needed = cfg->qkv_bias; return KV;
    case SBP_P_O: return C * Q;
    case SBP_P_QNORM:
    case SBP_P_KNORM: *needed = cfg->qk_norm; return HD;
    case SBP_P_GATE:
    case SBP_P_UP: return F * C;
    case SBP_P_DOWN: return C * F;
    case SBP_P_IN_NORM:
    case SBP_P_POST_NORM:
    case SBP_P_FINAL_NORM: return C;
    case SBP_P_LM_HEAD: *needed = !cfg->tied; return V * C;
    case SBP_P_PRE_FF_NORM:
    case SBP_P_POST_FF_NORM: *needed = cfg->family == SBP_GEMMA3; return C;
    default: *needed = 0; return 0;
    }
}

static int is_layer_kind(sbp_param_kind k) {
    return k != SBP_P_EMBED && k != SBP_P_FINAL_NORM && k != SBP_P_LM_HEAD;
}

/* Fills d from cfg and b and checks that ps, b and temperature fit; SBP_OK or an error. */
static int setup(dims *d, const sbp_config *cfg, const sbp_params *ps, const sbp_batch *b,
                 double temperature, sbp_err *err) {
    if (!(temperature > 0) || !isfinite(temperature))
        return sbp_fail(err, SBP_EUSAGE, "ref: temperature %g must be finite and > 0", temperature);
    if (cfg->heads < 1 || cfg->kv_heads < 1 || cfg->heads % cfg->kv_heads != 0 ||
        cfg->head_dim < 2 || cfg->head_dim % 2 != 0 || cfg->hidden < 1 || cfg->ffn < 1 ||
        cfg->vocab < 1 || cfg->layers < 0)
        return sbp_fail(err, SBP_EINPUT, "ref: config dimensions are inconsistent");
    if (b->B < 1 || b->T < 1) return sbp_fail(err, SBP_EINPUT, "ref: empty batch");
    *d = (dims){.T = b->T,
                .C = cfg->hidden,
                .NH = cfg->heads,
                .NKV = cfg->kv_heads,
                .HD = cfg->head_dim,
                .Q = cfg->heads * cfg->head_dim,
                .KV = cfg->kv_heads * cfg->head_dim,
                .F = cfg->ffn,
                .V = cfg->vocab,
                .L = cfg->layers,
                .eps = cfg->eps,
                .gemma = cfg->family == SBP_GEMMA3,
                .norm_one = R(cfg->family == SBP_GEMMA3),
                .scale = R(1.0 / sqrt((double)cfg->head_dim)),
                .emb_scale = R(1),
                .pad_id = cfg->pad_token_id >= 0 ? cfg->pad_token_id : -1};
    if (d->gemma) {
        /* HF: query_pre_attn_scalar ** -0.5 and hidden_size ** 0.5, Python floats (pow),
         * rounded to the model dtype (docs/gemma3.md) */
        if (!(cfg->query_pre_attn_scalar > 0) || cfg->sliding_window < 1 ||
            cfg->sliding_window_pattern < 1 || !(cfg->rope_local_theta > 0))
            return sbp_fail(err, SBP_EINPUT,
                            "ref: Gemma-3 needs query_pre_attn_scalar > 0, sliding_window >= 1, "
                            "sliding_window_pattern >= 1 and rope_local_base_freq > 0");
        d->scale = R(pow(cfg->query_pre_attn_scalar, -0.5));
        d->emb_scale = R(pow((double)cfg->hidden, 0.5));
        d->W = cfg->sliding_window;
        d->pattern = cfg->sliding_window_pattern;
    }
    for (int k = 0; k < SBP_P_NKINDS; k++) {
        int needed;
        int64_t numel = expected_numel((sbp_param_kind)k, cfg, d, &needed);
        int lo = is_layer_kind((sbp_param_kind)k) ? 0 : -1;
        int hi = is_layer_kind((sbp_param_kind)k) ? d->L : 0;
        for (int l = lo; l < hi; l++) {
            int64_t o = offset_of(ps, (sbp_param_kind)k, l);
            int i = -1;
            for (int j = 0; j < ps->n; j++)
                if (ps->p[j].offset == o && ps->p[j].kind == (sbp_param_kind)k) i = j;
            if (needed != (o >= 0) || (i >= 0 && ps->p[i].numel != numel) ||
                (o >= 0 && o + numel > ps->total))
                return sbp_fail(err, SBP_EINPUT,
                                "ref: the parameter table does not match the config (tensor "
                                "kind %d, layer %d)",
                                k, l);
        }
    }
    for (int r = 0; r < b->B; r++)
        for (int t = 0; t < b->T; t++) {
            size_t i = (size_t)r * b->T + t;
            if (b->ids[i] < 0 || b->ids[i] >= d->V)
                return sbp_fail(err, SBP_EINPUT, "ref: input_ids[%d][%d] = %d outside [0, %d)", r,
                                t, b->ids[i], d->V);
            if (b->labels[i] != SBP_IGNORE && (b->labels[i] < 0 || b->labels[i] >= d->V))
                return sbp_fail(err, SBP_EINPUT,
                                "ref: labels[%d][%d] = %d is neither -100 nor in [0, %d)", r, t,
                                b->labels[i], d->V);
            if (b->mask[i] > 1)
                return sbp_fail(err, SBP_EINPUT, "ref: attention_mask[%d][%d] = %d is not 0 or 1",
                                r, t, b->mask[i]);
        }
    return SBP_OK;
}

/* The target of position t is labels[t+1] (the shift inside the causal-LM loss); -1 if none. */
static int target_at(const sbp_batch *b, int r, int t) {
    if (t + 1 >= b->T) return -1;
    int y = b->labels[(size_t)r * b->T + t + 1];
    return y == SBP_IGNORE ? -1 : y;
}

/* The adapter's table against the model: r >= 1, and every entry a lora_A (r, in) or lora_B
 * (out, r) of a projection of a layer that exists, with the projection's in and out. */
static int lora_check(const ref_lora *la, const dims *d, sbp_err *err) {
    if (la->r < 1 || !isfinite(la->scale))
        return sbp_fail(err, SBP_EINPUT, "ref: the adapter's rank %d or scale %g is unusable",
                        la->r, la->scale);
    for (int i = 0; i < la->ps.n; i++) {
        const sbp_param *p = &la->ps.p[i];
        int64_t in = p->kind == SBP_P_O ? d->Q : p->kind == SBP_P_DOWN ? d->F : d->C;
        int64_t out = p->kind == SBP_P_Q                             ? d->Q
                      : p->kind == SBP_P_K || p->kind == SBP_P_V     ? d->KV
                      : p->kind == SBP_P_GATE || p->kind == SBP_P_UP ? d->F
                                                                     : d->C;
        int proj = p->kind == SBP_P_Q || p->kind == SBP_P_K || p->kind == SBP_P_V ||
                   p->kind == SBP_P_O || p->kind == SBP_P_GATE || p->kind == SBP_P_UP ||
                   p->kind == SBP_P_DOWN;
        int64_t d0 = p->lora == 1 ? la->r : out, d1 = p->lora == 1 ? in : la->r;
        if (!proj || p->layer < 0 || p->layer >= d->L || (p->lora != 1 && p->lora != 2) ||
            p->ndim != 2 || p->shape[0] != d0 || p->shape[1] != d1 ||
            p->offset + p->numel > la->ps.total)
            return sbp_fail(err, SBP_EINPUT,
                            "ref: adapter tensor \"%s\" does not fit the model (expected [%lld, "
                            "%lld])",
                            p->name, (long long)d0, (long long)d1);
    }
    return SBP_OK;
}

/* Forward for every row, writing logp (may be NULL); with grads, also the backward of
 * Σ coef·logp added into grads (the adapter's slab with one: the base's gradient is then
 * computed into scratch and dropped). Weights, log-probs and gradients cross the interface in
 * float64; everything in between runs in real_t. */
static int run(double *logp /* (B*T) or NULL */, double *grads /* (ref_grad_total) += or NULL */,
               const double *coef /* (B*T) or NULL */, const ref_net *net, const sbp_batch *b,
               double tau, sbp_err *err) {
    const sbp_config *cfg = net->cfg;
    const sbp_params *ps = net->ps;
    const ref_lora *la = net->lora;
    dims d;
    int st = setup(&d, cfg, ps, b, tau, err);
    if (st) return st;
    if (net->unattended < SBP_UNATTENDED_ZERO || net->unattended > SBP_UNATTENDED_HF_SDPA)
        return sbp_fail(err, SBP_EUSAGE, "ref: unknown mode %d for rows that see no key",
                        (int)net->unattended);
    d.unattended = net->unattended;
    if (la && (st = lora_check(la, &d, err))) return st;
    int T = d.T, V = d.V;
    pool pl = {0};
    seq_acts s = {0};
    layer_scratch sc = {0};
    seq_alloc(&s, grads ? &sc : NULL, &pl, &d);
    double *inv_freq = pool_bytes(&pl, sizeof(double) * (size_t)(d.HD / 2));
    real_t *dlogits = grads ? pool_get(&pl, (size_t)T * V) : NULL;
    real_t *prob = pool_get(&pl, (size_t)V);
    real_t *dx = grads ? pool_get(&pl, (size_t)T * d.C) : NULL;
    real_t *dx_prev = grads ? pool_get(&pl, (size_t)T * d.C) : NULL;
    real_t *dhn = grads ? pool_get(&pl, (size_t)T * d.C) : NULL;
    adapter ad = {0};
    if (la) {
        ad.ps = &la->ps, ad.s = R(la->scale), ad.r = la->r;
        ad.h = pool_get(&pl, (size_t)T * la->r);
        ad.dh = pool_get(&pl, (size_t)T * la->r);
    }
#ifdef REF_F32 /* the weights rounded once; the gradient summed in float, added at the end */
    const int64_t NA = la ? la->ps.total : 0;
    real_t *w = pool_get(&pl, (size_t)ps->total),
           *g = grads ? pool_get(&pl, (size_t)ps->total) : NULL;
    real_t *aw = la ? pool_get(&pl, (size_t)NA) : NULL;
    ad.w = aw;
    ad.g = la && grads ? pool_get(&pl, (size_t)NA) : NULL;
    if (w)
        for (int64_t i = 0; i < ps->total; i++) w[i] = (real_t)net->w[i];
    if (aw)
        for (int64_t i = 0; i < NA; i++) aw[i] = (real_t)la->w[i];
#else
    const real_t *w = net->w;
    real_t *g =
        grads && la ? pool_get(&pl, (size_t)ps->total) : grads; /* scratch with an adapter */
    ad.w = la ? la->w : NULL;
    ad.g = la ? grads : NULL;
#endif
    if (pl.failed) {
        pool_free(&pl);
        return sbp_fail(err, SBP_ENOMEM, "ref: out of memory (T = %d)", T);
    }
    rope_inv_freq(inv_freq, cfg, 0);
    rope_tables(s.cs, s.sn, inv_freq, T, d.HD);
    if (d.gemma) { /* the sliding layers' own table */
        rope_inv_freq(inv_freq, cfg, 1);
        rope_tables(s.cs_loc, s.sn_loc, inv_freq, T, d.HD);
    }
    for (int r = 0; r < b->B; r++) {
        const int32_t *ids = b->ids + (size_t)r * T;
        s.n_vis = visible_keys(s.vis, b->mask + (size_t)r * T, T);
        seq_fwd(&s, ps, w, &ad, ids, &d);
        if (dlogits) zero(dlogits, (size_t)T * V);
        for (int t = 0; t < T; t++) {
            int y = target_at(b, r, t);
            real_t lp = 0;
            if (y >= 0) {
                lp = logprob_fwd(prob, s.logits + (size_t)t * V, y, R(tau), V);
                if (dlogits)
                    logprob_bwd(dlogits + (size_t)t * V, prob, y, R(coef[(size_t)r * T + t]),
                                R(tau), V);
            }
            if (logp) logp[(size_t)r * T + t] = lp;
        }
        if (g) seq_bwd(g, dlogits, &s, &sc, dx, dx_prev, dhn, ps, w, &ad, ids, &d);
    }
#ifdef REF_F32
    if (grads && la)
        for (int64_t i = 0; i < NA; i++) grads[i] += ad.g[i];
    else if (grads)
        for (int64_t i = 0; i < ps->total; i++) grads[i] += g[i];
#endif
    pool_free(&pl);
    return SBP_OK;
}

int REF_NAME(ref_logprobs)(double *logp, const ref_net *net, const sbp_batch *b, double temperature,
                           sbp_err *err) {
    return run(logp, NULL, NULL, net, b, temperature, err);
}

int REF_NAME(ref_backward)(double *grads, const double *coef, const ref_net *net,
                           const sbp_batch *b, double temperature, sbp_err *err) {
    return run(NULL, grads, coef, net, b, temperature, err);
}
