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

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const double PI = 3.14159265358979323846;

/* ---------------------------------------------------------------------------------------------
 * Dimensions, tensors and memory */

typedef struct {
    int T, C, NH, NKV, HD, Q, KV, F, V, L;
    double eps;
} dims;

/* One layer's weights (NULL for tensors the family does not have). */
typedef struct {
    const double *in_norm, *post_norm; /* (C) */
    const double *wq, *wk, *wv, *wo;   /* (Q, C), (KV, C), (KV, C), (C, Q) */
    const double *bq, *bk, *bv;        /* (Q), (KV), (KV): Qwen2 */
    const double *q_norm, *k_norm;     /* (HD): Qwen3 */
    const double *wg, *wu, *wd;        /* (F, C), (F, C), (C, F) */
} layer_w;

/* The same tensors in the gradient slab. */
typedef struct {
    double *in_norm, *post_norm;
    double *wq, *wk, *wv, *wo;
    double *bq, *bk, *bv;
    double *q_norm, *k_norm;
    double *wg, *wu, *wd;
} layer_g;

/* Tensor `kind` of layer l (-1 for the embedding, final norm and head) in a weight or gradient
 * slab; NULL when the family has no such tensor. */
static const double *wptr(const sbp_params *ps, const double *w /* (ps->total) */,
                          sbp_param_kind kind, int l) {
    int64_t o = sbp_params_offset(ps, kind, l);
    return o < 0 ? NULL : w + o;
}

static double *gptr(const sbp_params *ps, double *g /* (ps->total) */, sbp_param_kind kind, int l) {
    int64_t o = sbp_params_offset(ps, kind, l);
    return o < 0 ? NULL : g + o;
}

static layer_w layer_weights(const sbp_params *ps, const double *w /* (ps->total) */, int l) {
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
    };
    return lw;
}

static layer_g layer_grads(const sbp_params *ps, double *g /* (ps->total) */, int l) {
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
    };
    return lg;
}

/* A pool of zero-filled arrays, freed together. A failed allocation sets `failed` and
 * returns NULL; callers check the flag once after allocating everything. */
typedef struct pool_blk {
    struct pool_blk *next;
    double data[];
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

static double *pool_get(pool *pl, size_t n) {
    return pool_bytes(pl, sizeof(double) * n);
}

static void pool_free(pool *pl) {
    while (pl->head) {
        pool_blk *next = pl->head->next;
        free(pl->head);
        pl->head = next;
    }
}

static void zero(double *x /* (n) */, size_t n) {
    memset(x, 0, sizeof *x * n);
}

/* ---------------------------------------------------------------------------------------------
 * Ops: each forward, then its backward */

/* RMSNorm of one vector: y_i = x_i · r · w_i with r = 1/sqrt(mean(x²) + eps). Returns r. */
static double rmsnorm_fwd(double *y /* (n) */, const double *x /* (n) */,
                          const double *wn /* (n) */, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * wn[i];
    return r;
}

/* forward: y_i = w_i x_i r, r = (Σ_j x_j²/n + eps)^(−1/2), so ∂r/∂x_j = −r³ x_j / n and
 *   dw_i = dy_i x_i r,
 *   dx_j = r w_j dy_j + Σ_i w_i dy_i x_i · (−r³ x_j / n)
 *        = r w_j dy_j − (r³/n) x_j Σ_i w_i dy_i x_i. */
static void rmsnorm_bwd(double *dx /* (n) += */, double *dw /* (n) += */,
                        const double *dy /* (n) */, const double *x /* (n) */,
                        const double *wn /* (n) */, double r, int n) {
    double dot = 0; /* Σ_i w_i dy_i x_i */
    for (int i = 0; i < n; i++) dot += wn[i] * dy[i] * x[i];
    for (int i = 0; i < n; i++) {
        dw[i] += dy[i] * x[i] * r;
        dx[i] += r * wn[i] * dy[i] - r * r * r / n * x[i] * dot;
    }
}

/* y = x·Wᵀ + b: y[t,o] = Σ_i x[t,i] W[o,i] + b[o] (b may be NULL). */
static void linear_fwd(double *y /* (T, O) */, const double *x /* (T, I) */,
                       const double *W /* (O, I) */, const double *bias /* (O) or NULL */, int T,
                       int I, int O) {
    for (int t = 0; t < T; t++)
        for (int o = 0; o < O; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int i = 0; i < I; i++) s += x[(size_t)t * I + i] * W[(size_t)o * I + i];
            y[(size_t)t * O + o] = s;
        }
}

/* forward: y[t,o] = Σ_i x[t,i] W[o,i] + b[o], so
 *   dx[t,i] = Σ_o dy[t,o] W[o,i],   dW[o,i] = Σ_t dy[t,o] x[t,i],   db[o] = Σ_t dy[t,o]. */
static void linear_bwd(double *dx /* (T, I) += */, double *dW /* (O, I) += */,
                       double *db /* (O) += or NULL */, const double *dy /* (T, O) */,
                       const double *x /* (T, I) */, const double *W /* (O, I) */, int T, int I,
                       int O) {
    for (int t = 0; t < T; t++)
        for (int o = 0; o < O; o++) {
            double g = dy[(size_t)t * O + o];
            for (int i = 0; i < I; i++) {
                dx[(size_t)t * I + i] += g * W[(size_t)o * I + i];
                dW[(size_t)o * I + i] += g * x[(size_t)t * I + i];
            }
            if (db) db[o] += g;
        }
}

/* inv_freq[i] = θ^(−2i/HD), with the llama3 rescaling when configured (SEMANTICS.md, RoPE):
 * wavelengths shorter than O/high keep their frequency, longer than O/low are slowed by
 * `factor`, and those in between interpolate with s = (O/wavelen − low)/(high − low). */
static void rope_inv_freq(double *inv_freq /* (HD/2) */, const sbp_config *cfg) {
    int HD = cfg->head_dim;
    for (int i = 0; i < HD / 2; i++) {
        double f = pow(cfg->rope_theta, -(2.0 * i) / HD);
        if (cfg->rope_llama3) {
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

/* cos and sin of the angle t·inv_freq[i] for positions t = 0..T−1 (padded or not). */
static void rope_tables(double *cs /* (T, HD/2) */, double *sn /* (T, HD/2) */,
                        const double *inv_freq /* (HD/2) */, int T, int HD) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < HD / 2; i++) {
            double angle = t * inv_freq[i];
            cs[(size_t)t * (HD / 2) + i] = cos(angle);
            sn[(size_t)t * (HD / 2) + i] = sin(angle);
        }
}

/* Rotate-half RoPE of H heads per row: for i < HD/2, the pair (a, b) = (x[i], x[i + HD/2])
 * becomes (a·c − b·s, b·c + a·s) with c, s = cos, sin of t·inv_freq[i]. */
static void rope_fwd(double *y /* (T, H*HD) */, const double *x /* (T, H*HD) */,
                     const double *cs /* (T, HD/2) */, const double *sn /* (T, HD/2) */, int T,
                     int H, int HD) {
    int half = HD / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const double *xi = x + ((size_t)t * H + h) * HD;
            double *yi = y + ((size_t)t * H + h) * HD;
            for (int i = 0; i < half; i++) {
                double c = cs[(size_t)t * half + i], s = sn[(size_t)t * half + i];
                double a = xi[i], b = xi[i + half];
                yi[i] = a * c - b * s;
                yi[i + half] = b * c + a * s;
            }
        }
}

/* forward: (ya, yb) = R·(a, b) with R = [[c, −s], [s, c]], a rotation, so (da, db) = Rᵀ·(dya, dyb):
 *   da = dya·c + dyb·s,   db = −dya·s + dyb·c. */
static void rope_bwd(double *dx /* (T, H*HD) += */, const double *dy /* (T, H*HD) */,
                     const double *cs /* (T, HD/2) */, const double *sn /* (T, HD/2) */, int T,
                     int H, int HD) {
    int half = HD / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const double *dyi = dy + ((size_t)t * H + h) * HD;
            double *dxi = dx + ((size_t)t * H + h) * HD;
            for (int i = 0; i < half; i++) {
                double c = cs[(size_t)t * half + i], s = sn[(size_t)t * half + i];
                dxi[i] += dyi[i] * c + dyi[i + half] * s;
                dxi[i + half] += -dyi[i] * s + dyi[i + half] * c;
            }
        }
}

/* Key j is visible from query t iff j ≤ t and the key is a real token. */
static int visible(const uint8_t *mask /* (T) */, int t, int j) {
    return j <= t && mask[j] == 1;
}

/* Causal GQA attention of one sequence. Query head h reads key/value head g = h / (NH/NKV).
 * For query t and visible keys j:
 *   s_tj = q[t,h]·k[j,g] / sqrt(HD),   p_tj = exp(s_tj) / Σ_{j' visible} exp(s_tj'),
 *   o[t,h] = Σ_j p_tj v[j,g];
 * p_tj = 0 for invisible keys, and a query with no visible key has p_t· = 0 and o[t,h] = 0.
 * The softmax subtracts the row maximum before exp (the same value, without overflow). */
static void attention_fwd(double *p /* (NH, T, T) */, double *o /* (T, Q) */,
                          const double *q /* (T, Q) */, const double *k /* (T, KV) */,
                          const double *v /* (T, KV) */, const uint8_t *mask /* (T) */,
                          const dims *d) {
    int T = d->T, HD = d->HD, Q = d->Q, KV = d->KV, rep = d->NH / d->NKV;
    double scale = 1.0 / sqrt((double)HD);
    zero(p, (size_t)d->NH * T * T);
    zero(o, (size_t)T * Q);
    for (int h = 0; h < d->NH; h++) {
        int g = h / rep;
        for (int t = 0; t < T; t++) {
            double *pt = p + ((size_t)h * T + t) * T;
            const double *qt = q + (size_t)t * Q + (size_t)h * HD;
            double mx = -INFINITY;
            int any = 0;
            for (int j = 0; j < T; j++) {
                if (!visible(mask, t, j)) continue;
                const double *kj = k + (size_t)j * KV + (size_t)g * HD;
                double s = 0;
                for (int i = 0; i < HD; i++) s += qt[i] * kj[i];
                pt[j] = s * scale; /* the score, replaced by the probability below */
                if (!any || pt[j] > mx) mx = pt[j];
                any = 1;
            }
            if (!any) continue; /* no visible key: p and o stay 0 */
            double sum = 0;
            for (int j = 0; j < T; j++)
                if (visible(mask, t, j)) sum += (pt[j] = exp(pt[j] - mx));
            for (int j = 0; j < T; j++)
                if (visible(mask, t, j)) pt[j] /= sum;
            double *ot = o + (size_t)t * Q + (size_t)h * HD;
            for (int j = 0; j < T; j++) {
                if (!visible(mask, t, j)) continue;
                const double *vj = v + (size_t)j * KV + (size_t)g * HD;
                for (int i = 0; i < HD; i++) ot[i] += pt[j] * vj[i];
            }
        }
    }
}

/* forward, per head h and query t (g = kv head of h, sums over all j since p_tj = 0 where j is
 * invisible):
 *   o_t = Σ_j p_tj v_j             so  dp_tj = do_t·v_j,          dv_j += p_tj do_t;
 *   p_t = softmax(s_t)             so  ds_tj = p_tj (dp_tj − Σ_j' p_tj' dp_tj')
 *                                      (from ∂p_tj/∂s_tk = p_tj (δ_jk − p_tk));
 *   s_tj = q_t·k_j / sqrt(HD)      so  dq_t += Σ_j ds_tj k_j / sqrt(HD),  dk_j += ds_tj q_t /
 * sqrt(HD). Invisible keys have p_tj = 0, hence ds_tj = 0 and no gradient; a query with no visible
 * key has p_t· = 0 and passes no gradient to q, k or v. dk and dv of kv head g collect the
 * gradients of all NH/NKV query heads that read it. */
static void attention_bwd(double *dq /* (T, Q) += */, double *dk /* (T, KV) += */,
                          double *dv /* (T, KV) += */, const double *dout /* (T, Q) */,
                          const double *p /* (NH, T, T) */, const double *q /* (T, Q) */,
                          const double *k /* (T, KV) */, const double *v /* (T, KV) */,
                          double *dp /* (T) scratch */, const dims *d) {
    int T = d->T, HD = d->HD, Q = d->Q, KV = d->KV, rep = d->NH / d->NKV;
    double scale = 1.0 / sqrt((double)HD);
    for (int h = 0; h < d->NH; h++) {
        int g = h / rep;
        for (int t = 0; t < T; t++) {
            const double *pt = p + ((size_t)h * T + t) * T;
            const double *dot_ = dout + (size_t)t * Q + (size_t)h * HD;
            const double *qt = q + (size_t)t * Q + (size_t)h * HD;
            double *dqt = dq + (size_t)t * Q + (size_t)h * HD;
            double pdp = 0; /* Σ_j p_tj dp_tj */
            for (int j = 0; j < T; j++) {
                const double *vj = v + (size_t)j * KV + (size_t)g * HD;
                double *dvj = dv + (size_t)j * KV + (size_t)g * HD;
                double s = 0;
                for (int i = 0; i < HD; i++) {
                    s += dot_[i] * vj[i];
                    dvj[i] += pt[j] * dot_[i];
                }
                dp[j] = s;
                pdp += pt[j] * s;
            }
            for (int j = 0; j < T; j++) {
                double ds = pt[j] * (dp[j] - pdp);
                const double *kj = k + (size_t)j * KV + (size_t)g * HD;
                double *dkj = dk + (size_t)j * KV + (size_t)g * HD;
                for (int i = 0; i < HD; i++) {
                    dqt[i] += ds * kj[i] * scale;
                    dkj[i] += ds * qt[i] * scale;
                }
            }
        }
    }
}

static double sigmoid(double z) {
    return 1.0 / (1.0 + exp(-z));
}

/* SwiGLU's product: m = silu(g) ⊙ u with silu(z) = z·σ(z). */
static void swiglu_fwd(double *m /* (n) */, const double *g /* (n) */, const double *u /* (n) */,
                       size_t n) {
    for (size_t i = 0; i < n; i++) m[i] = g[i] * sigmoid(g[i]) * u[i];
}

/* forward: m = silu(g)·u, and silu'(z) = σ(z) + z σ(z)(1 − σ(z)) = σ(z)(1 + z(1 − σ(z))), so
 *   dg = dm · u · silu'(g),   du = dm · silu(g). */
static void swiglu_bwd(double *dg /* (n) += */, double *du /* (n) += */, const double *dm /* (n) */,
                       const double *g /* (n) */, const double *u /* (n) */, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double sg = sigmoid(g[i]);
        dg[i] += dm[i] * u[i] * sg * (1 + g[i] * (1 - sg));
        du[i] += dm[i] * g[i] * sg;
    }
}

/* log softmax(z)[y] with z = logits / τ: z_y − log Σ_j exp(z_j), the sum taken relative to the
 * maximum (the same value, without overflow). Also returns the softmax in prob when not NULL. */
static double logprob_fwd(double *prob /* (V) or NULL */, const double *logits /* (V) */, int y,
                          double tau, int V) {
    double mx = logits[0] / tau;
    for (int j = 1; j < V; j++)
        if (logits[j] / tau > mx) mx = logits[j] / tau;
    double sum = 0;
    for (int j = 0; j < V; j++) sum += exp(logits[j] / tau - mx);
    double lse = mx + log(sum);
    if (prob)
        for (int j = 0; j < V; j++) prob[j] = exp(logits[j] / tau - lse);
    return logits[y] / tau - lse;
}

/* forward: logp = z_y − logsumexp(z), z = logits/τ. ∂logp/∂z_j = δ_jy − softmax(z)_j and
 * ∂z_j/∂logits_j = 1/τ, so for the term c·logp:  dlogits_j += c (δ_jy − p_j) / τ. */
static void logprob_bwd(double *dlogits /* (V) += */, const double *prob /* (V) */, int y, double c,
                        double tau, int V) {
    for (int j = 0; j < V; j++) dlogits[j] += c * ((j == y) - prob[j]) / tau;
}

/* ---------------------------------------------------------------------------------------------
 * One sequence: activations, forward, backward */

/* Everything one layer computes for one sequence, kept for the backward pass. */
typedef struct {
    double *x;         /* (T, C) layer input */
    double *r_in;      /* (T) input RMSNorm's 1/rms per row */
    double *xn;        /* (T, C) rmsnorm(x)·w_in */
    double *q0, *k0;   /* (T, Q), (T, KV) projections (+ bias) */
    double *r_q, *r_k; /* (T, NH), (T, NKV) per-head 1/rms of q0, k0 (Qwen3) */
    double *q1, *k1;   /* (T, Q), (T, KV) after q_norm/k_norm (Qwen3; else copies of q0, k0) */
    double *q, *k, *v; /* (T, Q), (T, KV), (T, KV) q and k after RoPE, and v */
    double *p;         /* (NH, T, T) attention probabilities, 0 for invisible keys */
    double *o;         /* (T, Q) attention output */
    double *x2;        /* (T, C) x + o·Woᵀ */
    double *r_post;    /* (T) post-attention RMSNorm's 1/rms per row */
    double *xn2;       /* (T, C) rmsnorm(x2)·w_post */
    double *g, *u;     /* (T, F) xn2·Wgᵀ, xn2·Wuᵀ */
    double *m;         /* (T, F) silu(g) ⊙ u */
} layer_acts;

typedef struct {
    layer_acts *layer; /* (L) */
    double *xf;        /* (T, C) output of the last layer */
    double *r_f;       /* (T) final RMSNorm's 1/rms per row */
    double *hn;        /* (T, C) rmsnorm(xf)·w_final */
    double *logits;    /* (T, V) */
    double *cs, *sn;   /* (T, HD/2) RoPE tables */
} seq_acts;

/* Backward scratch of one layer (zeroed before each use). */
typedef struct {
    double *dm, *dg, *du;          /* (T, F) */
    double *dxn2, *dx2, *dxn;      /* (T, C) */
    double *dout, *dq, *dq1, *dq0; /* (T, Q) */
    double *dk, *dk1, *dk0, *dv;   /* (T, KV) */
    double *dp;                    /* (T) */
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
        a->p = pool_get(pl, (size_t)d->NH * T * T);
        a->o = pool_get(pl, T * Q);
        a->x2 = pool_get(pl, T * C);
        a->r_post = pool_get(pl, T);
        a->xn2 = pool_get(pl, T * C);
        a->g = pool_get(pl, T * F);
        a->u = pool_get(pl, T * F);
        a->m = pool_get(pl, T * F);
    }
    s->xf = pool_get(pl, T * C);
    s->r_f = pool_get(pl, T);
    s->hn = pool_get(pl, T * C);
    s->logits = pool_get(pl, T * d->V);
    s->cs = pool_get(pl, T * (d->HD / 2));
    s->sn = pool_get(pl, T * (d->HD / 2));
    if (!sc) return;
    sc->dm = pool_get(pl, T * F);
    sc->dg = pool_get(pl, T * F);
    sc->du = pool_get(pl, T * F);
    sc->dxn2 = pool_get(pl, T * C);
    sc->dx2 = pool_get(pl, T * C);
    sc->dxn = pool_get(pl, T * C);
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

/* One decoder layer, from a->x (already filled) to y. */
static void layer_fwd(layer_acts *a, double *y /* (T, C) */, const layer_w *lw,
                      const double *cs /* (T, HD/2) */, const double *sn /* (T, HD/2) */,
                      const uint8_t *mask /* (T) */, const dims *d) {
    int T = d->T, C = d->C, Q = d->Q, KV = d->KV, F = d->F, HD = d->HD;
    for (int t = 0; t < T; t++)
        a->r_in[t] =
            rmsnorm_fwd(a->xn + (size_t)t * C, a->x + (size_t)t * C, lw->in_norm, C, d->eps);
    linear_fwd(a->q0, a->xn, lw->wq, lw->bq, T, C, Q);
    linear_fwd(a->k0, a->xn, lw->wk, lw->bk, T, C, KV);
    linear_fwd(a->v, a->xn, lw->wv, lw->bv, T, C, KV);
    if (lw->q_norm) { /* Qwen3: RMSNorm of each head's HD-vector, before RoPE */
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < d->NH; h++) {
                size_t i = (size_t)t * Q + (size_t)h * HD;
                a->r_q[t * d->NH + h] = rmsnorm_fwd(a->q1 + i, a->q0 + i, lw->q_norm, HD, d->eps);
            }
            for (int h = 0; h < d->NKV; h++) {
                size_t i = (size_t)t * KV + (size_t)h * HD;
                a->r_k[t * d->NKV + h] = rmsnorm_fwd(a->k1 + i, a->k0 + i, lw->k_norm, HD, d->eps);
            }
        }
    } else {
        memcpy(a->q1, a->q0, sizeof(double) * (size_t)T * Q);
        memcpy(a->k1, a->k0, sizeof(double) * (size_t)T * KV);
    }
    rope_fwd(a->q, a->q1, cs, sn, T, d->NH, HD);
    rope_fwd(a->k, a->k1, cs, sn, T, d->NKV, HD);
    attention_fwd(a->p, a->o, a->q, a->k, a->v, mask, d);
    /* x2 = x + o·Woᵀ */
    linear_fwd(a->x2, a->o, lw->wo, NULL, T, Q, C);
    for (size_t i = 0; i < (size_t)T * C; i++) a->x2[i] += a->x[i];
    for (int t = 0; t < T; t++)
        a->r_post[t] =
            rmsnorm_fwd(a->xn2 + (size_t)t * C, a->x2 + (size_t)t * C, lw->post_norm, C, d->eps);
    linear_fwd(a->g, a->xn2, lw->wg, NULL, T, C, F);
    linear_fwd(a->u, a->xn2, lw->wu, NULL, T, C, F);
    swiglu_fwd(a->m, a->g, a->u, (size_t)T * F);
    /* y = x2 + m·Wdᵀ */
    linear_fwd(y, a->m, lw->wd, NULL, T, F, C);
    for (size_t i = 0; i < (size_t)T * C; i++) y[i] += a->x2[i];
}

/* Backward of one layer: from dy to dx, adding the layer's weight gradients into lg. The
 * residual connections y = x2 + mlp(x2) and x2 = x + attn(x) pass their gradient through
 * unchanged, so dx2 = dy + (MLP path) and dx = dx2 + (attention path). */
static void layer_bwd(double *dx /* (T, C) += */, const double *dy /* (T, C) */, const layer_g *lg,
                      const layer_w *lw, const layer_acts *a, layer_scratch *sc,
                      const double *cs /* (T, HD/2) */, const double *sn /* (T, HD/2) */,
                      const dims *d) {
    int T = d->T, C = d->C, Q = d->Q, KV = d->KV, F = d->F, HD = d->HD;
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

    /* MLP: y = x2 + m·Wdᵀ, m = silu(g) ⊙ u, g = xn2·Wgᵀ, u = xn2·Wuᵀ, xn2 = rmsnorm(x2) */
    memcpy(sc->dx2, dy, sizeof(double) * (size_t)T * C); /* residual */
    linear_bwd(sc->dm, lg->wd, NULL, dy, a->m, lw->wd, T, F, C);
    swiglu_bwd(sc->dg, sc->du, sc->dm, a->g, a->u, (size_t)T * F);
    linear_bwd(sc->dxn2, lg->wg, NULL, sc->dg, a->xn2, lw->wg, T, C, F);
    linear_bwd(sc->dxn2, lg->wu, NULL, sc->du, a->xn2, lw->wu, T, C, F);
    for (int t = 0; t < T; t++)
        rmsnorm_bwd(sc->dx2 + (size_t)t * C, lg->post_norm, sc->dxn2 + (size_t)t * C,
                    a->x2 + (size_t)t * C, lw->post_norm, a->r_post[t], C);

    /* attention: x2 = x + o·Woᵀ */
    for (size_t i = 0; i < (size_t)T * C; i++) dx[i] += sc->dx2[i]; /* residual */
    linear_bwd(sc->dout, lg->wo, NULL, sc->dx2, a->o, lw->wo, T, Q, C);
    attention_bwd(sc->dq, sc->dk, sc->dv, sc->dout, a->p, a->q, a->k, a->v, sc->dp, d);
    rope_bwd(sc->dq1, sc->dq, cs, sn, T, d->NH, HD);
    rope_bwd(sc->dk1, sc->dk, cs, sn, T, d->NKV, HD);
    if (lw->q_norm) { /* per-head RMSNorm: the same backward on each HD-vector */
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < d->NH; h++) {
                size_t i = (size_t)t * Q + (size_t)h * HD;
                rmsnorm_bwd(sc->dq0 + i, lg->q_norm, sc->dq1 + i, a->q0 + i, lw->q_norm,
                            a->r_q[t * d->NH + h], HD);
            }
            for (int h = 0; h < d->NKV; h++) {
                size_t i = (size_t)t * KV + (size_t)h * HD;
                rmsnorm_bwd(sc->dk0 + i, lg->k_norm, sc->dk1 + i, a->k0 + i, lw->k_norm,
                            a->r_k[t * d->NKV + h], HD);
            }
        }
    } else {
        memcpy(sc->dq0, sc->dq1, sizeof(double) * (size_t)T * Q);
        memcpy(sc->dk0, sc->dk1, sizeof(double) * (size_t)T * KV);
    }
    /* q0 = xn·Wqᵀ (+ bq), k0 = xn·Wkᵀ (+ bk), v = xn·Wvᵀ (+ bv): xn collects all three */
    linear_bwd(sc->dxn, lg->wq, lg->bq, sc->dq0, a->xn, lw->wq, T, C, Q);
    linear_bwd(sc->dxn, lg->wk, lg->bk, sc->dk0, a->xn, lw->wk, T, C, KV);
    linear_bwd(sc->dxn, lg->wv, lg->bv, sc->dv, a->xn, lw->wv, T, C, KV);
    for (int t = 0; t < T; t++)
        rmsnorm_bwd(dx + (size_t)t * C, lg->in_norm, sc->dxn + (size_t)t * C, a->x + (size_t)t * C,
                    lw->in_norm, a->r_in[t], C);
}

/* The whole forward pass of one sequence, up to the logits. */
static void seq_fwd(seq_acts *s, const sbp_params *ps, const double *w,
                    const int32_t *ids /* (T) */, const uint8_t *mask /* (T) */, const dims *d) {
    int T = d->T, C = d->C;
    const double *E = wptr(ps, w, SBP_P_EMBED, -1);
    int tied = sbp_params_offset(ps, SBP_P_LM_HEAD, -1) < 0;
    const double *Wlm = tied ? E : wptr(ps, w, SBP_P_LM_HEAD, -1);
    /* x0[t] = E[ids[t]] */
    double *x0 = d->L > 0 ? s->layer[0].x : s->xf;
    for (int t = 0; t < T; t++)
        memcpy(x0 + (size_t)t * C, E + (size_t)ids[t] * C, sizeof(double) * (size_t)C);
    for (int l = 0; l < d->L; l++) {
        layer_w lw = layer_weights(ps, w, l);
        double *y = l + 1 < d->L ? s->layer[l + 1].x : s->xf;
        layer_fwd(&s->layer[l], y, &lw, s->cs, s->sn, mask, d);
    }
    const double *wf = wptr(ps, w, SBP_P_FINAL_NORM, -1);
    for (int t = 0; t < T; t++)
        s->r_f[t] = rmsnorm_fwd(s->hn + (size_t)t * C, s->xf + (size_t)t * C, wf, C, d->eps);
    linear_fwd(s->logits, s->hn, Wlm, NULL, T, C, d->V); /* logits = hn·W_lmᵀ */
}

/* The backward pass of one sequence, given dlogits; adds into the gradient slab. */
static void seq_bwd(double *grads, const double *dlogits /* (T, V) */, const seq_acts *s,
                    layer_scratch *sc, double *dx /* (T, C) scratch */,
                    double *dx_prev /* (T, C) scratch */, double *dhn /* (T, C) scratch */,
                    const sbp_params *ps, const double *w, const int32_t *ids /* (T) */,
                    const dims *d) {
    int T = d->T, C = d->C;
    int tied = sbp_params_offset(ps, SBP_P_LM_HEAD, -1) < 0;
    const double *Wlm = wptr(ps, w, tied ? SBP_P_EMBED : SBP_P_LM_HEAD, -1);
    double *dWlm = gptr(ps, grads, tied ? SBP_P_EMBED : SBP_P_LM_HEAD, -1);
    double *dE = gptr(ps, grads, SBP_P_EMBED, -1);
    /* logits = hn·W_lmᵀ; with tied embeddings dW_lm is dE, which also gets the lookup's
     * scatter-add below: one tensor, two contributions */
    zero(dhn, (size_t)T * C);
    linear_bwd(dhn, dWlm, NULL, dlogits, s->hn, Wlm, T, C, d->V);
    zero(dx, (size_t)T * C);
    for (int t = 0; t < T; t++)
        rmsnorm_bwd(dx + (size_t)t * C, gptr(ps, grads, SBP_P_FINAL_NORM, -1), dhn + (size_t)t * C,
                    s->xf + (size_t)t * C, wptr(ps, w, SBP_P_FINAL_NORM, -1), s->r_f[t], C);
    for (int l = d->L - 1; l >= 0; l--) {
        layer_w lw = layer_weights(ps, w, l);
        layer_g lg = layer_grads(ps, grads, l);
        zero(dx_prev, (size_t)T * C);
        layer_bwd(dx_prev, dx, &lg, &lw, &s->layer[l], sc, s->cs, s->sn, d);
        double *tmp = dx;
        dx = dx_prev;
        dx_prev = tmp;
    }
    /* x0[t] = E[ids[t]], so dE[ids[t]] += dx0[t] (scatter-add: repeated ids accumulate) */
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) dE[(size_t)ids[t] * C + c] += dx[(size_t)t * C + c];
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
                .eps = cfg->eps};
    for (int k = 0; k < SBP_P_NKINDS; k++) {
        int needed;
        int64_t numel = expected_numel((sbp_param_kind)k, cfg, d, &needed);
        int lo = is_layer_kind((sbp_param_kind)k) ? 0 : -1;
        int hi = is_layer_kind((sbp_param_kind)k) ? d->L : 0;
        for (int l = lo; l < hi; l++) {
            int64_t o = sbp_params_offset(ps, (sbp_param_kind)k, l);
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

/* Forward for every row, writing logp (may be NULL); with grads, also the backward of
 * Σ coef·logp added into grads. */
static int run(double *logp /* (B*T) or NULL */, double *grads /* (ps->total) += or NULL */,
               const double *coef /* (B*T) or NULL */, const sbp_config *cfg, const sbp_params *ps,
               const double *w, const sbp_batch *b, double tau, sbp_err *err) {
    dims d;
    int st = setup(&d, cfg, ps, b, tau, err);
    if (st) return st;
    int T = d.T, V = d.V;
    pool pl = {0};
    seq_acts s = {0};
    layer_scratch sc = {0};
    seq_alloc(&s, grads ? &sc : NULL, &pl, &d);
    double *inv_freq = pool_get(&pl, (size_t)d.HD / 2);
    double *dlogits = grads ? pool_get(&pl, (size_t)T * V) : NULL;
    double *prob = pool_get(&pl, (size_t)V);
    double *dx = grads ? pool_get(&pl, (size_t)T * d.C) : NULL;
    double *dx_prev = grads ? pool_get(&pl, (size_t)T * d.C) : NULL;
    double *dhn = grads ? pool_get(&pl, (size_t)T * d.C) : NULL;
    if (pl.failed) {
        pool_free(&pl);
        return sbp_fail(err, SBP_ENOMEM, "ref: out of memory (T = %d)", T);
    }
    rope_inv_freq(inv_freq, cfg);
    rope_tables(s.cs, s.sn, inv_freq, T, d.HD);
    for (int r = 0; r < b->B; r++) {
        const int32_t *ids = b->ids + (size_t)r * T;
        seq_fwd(&s, ps, w, ids, b->mask + (size_t)r * T, &d);
        if (dlogits) zero(dlogits, (size_t)T * V);
        for (int t = 0; t < T; t++) {
            int y = target_at(b, r, t);
            double lp = 0;
            if (y >= 0) {
                lp = logprob_fwd(prob, s.logits + (size_t)t * V, y, tau, V);
                if (dlogits) logprob_bwd(dlogits + (size_t)t * V, prob, y, coef[r * T + t], tau, V);
            }
            if (logp) logp[(size_t)r * T + t] = lp;
        }
        if (grads) seq_bwd(grads, dlogits, &s, &sc, dx, dx_prev, dhn, ps, w, ids, &d);
    }
    pool_free(&pl);
    return SBP_OK;
}

int ref_logprobs(double *logp, const sbp_config *cfg, const sbp_params *ps, const double *w,
                 const sbp_batch *b, double temperature, sbp_err *err) {
    return run(logp, NULL, NULL, cfg, ps, w, b, temperature, err);
}

int ref_backward(double *grads, const double *coef, const sbp_config *cfg, const sbp_params *ps,
                 const double *w, const sbp_batch *b, double temperature, sbp_err *err) {
    return run(NULL, grads, coef, cfg, ps, w, b, temperature, err);
}

/* loss = −(1/N) Σ logp, so d loss / d logp = −1/N for every valid target: the backward of
 * Σ coef·logp with coef = −1/N there. */
int ref_sft(double *loss, double *grads, const sbp_config *cfg, const sbp_params *ps,
            const double *w, const sbp_batch *b, sbp_err *err) {
    dims d;
    int st = setup(&d, cfg, ps, b, 1.0, err); /* before grads is touched */
    if (st) return st;
    size_t n = (size_t)b->B * b->T;
    int64_t N = 0;
    for (int r = 0; r < b->B; r++)
        for (int t = 0; t < b->T; t++) N += target_at(b, r, t) >= 0;
    if (N == 0)
        return sbp_fail(err, SBP_EINPUT,
                        "ref: the batch has no target (every shifted label is -100)");
    double *coef = calloc(n ? n : 1, sizeof *coef), *logp = calloc(n ? n : 1, sizeof *logp);
    if (!coef || !logp) {
        free(coef);
        free(logp);
        return sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    }
    for (int r = 0; r < b->B; r++)
        for (int t = 0; t < b->T; t++)
            if (target_at(b, r, t) >= 0) coef[(size_t)r * b->T + t] = -1.0 / (double)N;
    zero(grads, (size_t)ps->total);
    st = run(logp, grads, coef, cfg, ps, w, b, 1.0, err);
    if (!st) {
        double sum = 0;
        for (size_t i = 0; i < n; i++) sum += logp[i];
        *loss = -sum / (double)N;
    }
    free(coef);
    free(logp);
    return st;
}
