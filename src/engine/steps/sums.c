/* sums.c — the portable numerics' sums over a sequence's tokens, in blocks (docs/numerics.md §4).
 *
 * A weight gradient dW = Σ_t dy_tᵀ·x_t, a bias gradient db = Σ_t dy_t and a norm weight's
 * dw = Σ_rows dout·xhat are sums over the tokens of each sequence. One chain over T tokens
 * grows its rounding error with T; so the sum is cut at the fixed token positions k·B
 * (B = SUM_BLOCK, engine.h):
 *   - the tokens [0, B) continue the chain from the stored gradient, as every sum did before
 *     (a sequence of at most B tokens, every golden case, keeps its bits);
 *   - every later block [kB, (k+1)B) ∩ [0, T) is a chain of its own from +0 over its tokens
 *     ascending, added to the gradient (one addition per element) when it is complete: at
 *     (k+1)B, or at T.
 * Its error then grows with B + T/B, not T (docs/accuracy.md). A call whose rows end inside a
 * block leaves the block's partial sum in a pending buffer (pend_work) and the next call of the
 * same sequence continues that chain, so every chunking (1, 7, T − 1, T + 5 ...) adds the same
 * terms in the same order and the schedules stay bitwise equal. Everything goes through the op
 * table (the products' chains continue from what their output holds; zero; add), so the CUDA
 * tables compute the very same sums. */
#include "../engine.h"

#include <string.h>

/* The end of the token block that holds token t, or end. */
static int block_end(int t, int end) {
    const int next = (t / SUM_BLOCK + 1) * SUM_BLOCK;
    return next < end ? next : end;
}

/* Whether the block ending at t is complete there: at a block boundary or the sequence's end. */
static int complete(const eng *e, int t) {
    return t % SUM_BLOCK == 0 || t == e->T;
}

/* g ← g + p (n): one IEEE addition per element. Not rounded to bf16 here: a parameter gradient
 * is rounded where it is complete, as every other one. */
static void fold(const eng *e, real *g, const real *p, size_t n) {
    eng raw = *e;
    raw.bf16 = 0;
    e->ops->add(&raw, g, g, p, n);
}

void sum_linear_backward(const eng *e, real *dx, real *dw, real *pw, real *db, real *pb,
                         const real *dy, const real *x, const real *w, int s, int end, int N,
                         int K) {
    const sbp_ops *op = e->ops;
    if (!(dw && pw) && !(db && pb)) {
        op->linear_backward(e, dx, dw, db, dy, x, w, s, end, N, K);
        return;
    }
    const size_t NK = (size_t)N * K;
    for (int b0 = s, b1; b0 < end; b0 = b1) {
        b1 = block_end(b0, end);
        const size_t r = (size_t)(b0 - s); /* rows from s: dy (r, N), x and dx (r, K) */
        real *dx_b = dx ? dx + r * K : NULL;
        const real *dy_b = dy + r * N, *x_b = x + r * K;
        if (b0 < SUM_BLOCK) { /* the first block: the chain goes on in dW and db */
            op->linear_backward(e, dx_b, dw, db, dy_b, x_b, w, b0, b1, N, K);
            continue;
        }
        if (b0 % SUM_BLOCK == 0) { /* a block opens: its chain from +0 */
            if (dw) op->zero(e, pw, NK);
            if (db) op->zero(e, pb, (size_t)N);
        }
        op->linear_backward(e, dx_b, dw ? pw : NULL, db ? pb : NULL, dy_b, x_b, w, b0, b1, N, K);
        if (!complete(e, b1)) continue; /* carried to the next call */
        if (dw) fold(e, dw, pw, NK);
        if (db) fold(e, db, pb, (size_t)N);
    }
}

void sum_norm_backward(const eng *e, real *dx, real *dw, real *pw, const real *dout, const real *x,
                       const real *rstd, const real *w, int t0, int M, int rpt, int C) {
    const sbp_ops *op = e->ops;
    if (!dw || !pw) {
        op->rmsnorm_backward(e, dx, dw, dout, x, rstd, w, M, C);
        return;
    }
    const int t1 = t0 + M / rpt;
    for (int b0 = t0, b1; b0 < t1; b0 = b1) {
        b1 = block_end(b0, t1);
        /* rows of tokens [b0, b1): every token's rpt rows (token-major) */
        const size_t r = (size_t)(b0 - t0) * rpt, rc = r * C;
        const int m = (b1 - b0) * rpt;
        real *dx_b = dx ? dx + rc : NULL;
        if (b0 < SUM_BLOCK) {
            op->rmsnorm_backward(e, dx_b, dw, dout + rc, x + rc, rstd + r, w, m, C);
            continue;
        }
        if (b0 % SUM_BLOCK == 0) op->zero(e, pw, (size_t)C);
        op->rmsnorm_backward(e, dx_b, pw, dout + rc, x + rc, rstd + r, w, m, C);
        if (complete(e, b1)) fold(e, dw, pw, (size_t)C);
    }
}

/* Keys [lo, hi) cut to those the call sums dK, dV of (d->kv_lo, d->kv_hi: a rank's own keys,
 * sequence parallel), as elements of dK's layout (kernels.h): n from *off. */
static void key_rows(size_t *off, size_t *n, const sbp_attn_dims *d, int lo, int hi) {
    const size_t KV = (size_t)d->NKV * d->HD;
    if (d->kv_hi) {
        lo = lo > d->kv_lo ? lo : d->kv_lo;
        hi = hi < d->kv_hi ? hi : d->kv_hi;
    }
    *off = hi > lo ? attn_kv_row(d, lo) * KV : 0;
    *n = hi > lo ? (size_t)(hi - lo) * KV : 0;
}

/* dK_j, dV_j sum over the queries i ≥ j (a window's): in the same token blocks, of the queries.
 * A block's partial sums cover the keys before its end; the fold adds the rows of those keys. */
void sum_attention_backward(const eng *e, real *dq, real *dk, real *dv, real *pdk, real *pdv,
                            real *dsum, const real *dout, const real *o, const real *lse,
                            const real *q, const real *k, const real *v, const uint8_t *kmask,
                            const sbp_attn_dims *d, int lo, int hi) {
    const sbp_ops *op = e->ops;
    if (!pdk) {
        op->attention_backward(e, dq, dk, dv, dsum, dout, o, lse, q, k, v, kmask, d);
        return;
    }
    const int s = d->s + lo, end = s + d->M, Q = d->NH * d->HD;
    for (int b0 = s, b1; b0 < end; b0 = b1) {
        b1 = block_end(b0, end);
        const size_t r = (size_t)(b0 - s), rq = r * Q, rh = r * d->NH;
        sbp_attn_dims db = *d;
        db.s = b0 - lo, db.M = b1 - b0;
        const int first = b0 < SUM_BLOCK;
        size_t at, n;
        if (!first && b0 % SUM_BLOCK == 0) { /* keys before the block's end: from +0 */
            key_rows(&at, &n, d, 0, (b0 + SUM_BLOCK < hi ? b0 + SUM_BLOCK : hi) - lo);
            op->zero(e, pdk + at, n), op->zero(e, pdv + at, n);
        }
        op->attention_backward(e, dq ? dq + rq : NULL, first ? dk : pdk, first ? dv : pdv,
                               dsum + rh, dout + rq, o ? o + rq : NULL, lse + rh, q + rq, k, v,
                               kmask, &db);
        if (first || !complete(e, b1)) continue;
        key_rows(&at, &n, d, 0, (b1 < hi ? b1 : hi) - lo); /* keys before b1 */
        fold(e, dk + at, pdk + at, n), fold(e, dv + at, pdv + at, n);
    }
}

int sum_block_open(const eng *e, int t) {
    return t > SUM_BLOCK && !complete(e, t);
}

void sum_fold_rows(const eng *e, real *g, const real *p, size_t n) {
    fold(e, g, p, n);
}

/* ---- the LM head's dx over the vocabulary ---------------------------------------------------- */

/* dx(t, :) += Σ_v dy(t, v)·W(v, :) over V = N terms (docs/numerics.md §4): [0, VOCAB_BLOCK)
 * continues the chain in dx (a vocabulary of at most one block, every golden case, keeps its
 * bits); every later block [v0, v1) is a chain from +0 in px over dy's columns v0..v1 − 1, which
 * the op reads as contiguous rows, so they are first copied into py (M, v1 − v0): M·N reals per
 * pass in all, against the product's 2·M·N·K flops. The blocks' sums stay in float until dx is
 * complete, then dx is rounded once to the storage precision, as the op rounds its output. */
void sum_vocab_dx(const eng *e, real *dx, real *px, real *py, const real *dy, const real *w, int s,
                  int end, int N, int K) {
    const sbp_ops *op = e->ops;
    if (!px || !py || N <= VOCAB_BLOCK) {
        op->linear_backward(e, dx, NULL, NULL, dy, NULL, w, s, end, N, K);
        return;
    }
    eng raw = *e; /* the parts unrounded (fold's rule) */
    raw.bf16 = 0;
    const int M = end - s;
    for (int v0 = 0; v0 < N; v0 += VOCAB_BLOCK) {
        const int nb = N - v0 < VOCAB_BLOCK ? N - v0 : VOCAB_BLOCK;
        op->copy_cols(e, py, dy + v0, M, nb, N); /* py(r, j) = dy(r, v0 + j) */
        real *to = v0 ? px : dx;
        if (v0) op->zero(e, px, (size_t)M * K);
        op->linear_backward(&raw, to, NULL, NULL, py, NULL, w + (size_t)v0 * K, s, end, nb, K);
        if (v0) fold(e, dx, px, (size_t)M * K);
    }
    op->store(e, dx, (size_t)M * K);
}

/* ---- the pending partial sums ---------------------------------------------------------------- */

/* n reals at *off of base when on (a NULL base only counts), else NULL */
static real *take(real *base, size_t *off, int on, size_t n) {
    if (!on) return NULL;
    real *p = base ? base + *off : NULL;
    *off += n;
    return p;
}

static void take_ab(lora_ab *p, real *base, size_t *off, int on, size_t nA, size_t nB) {
    p->A = take(base, off, on, nA);
    p->B = take(base, off, on, nB);
}

/* The views of p in base (NULL: counting only); the reals they take. The layer's gradients are
 * those of its weights (every layer has the same) unless the base model is frozen (adapters). */
static size_t layout(const eng *e, pend_work *p, real *base, int rows) {
    const layer_p *w = &e->w[0];
    const int g = !e->lora_r;
    const size_t C = (size_t)e->C, Q = (size_t)e->Q, KV = (size_t)e->KV, F = (size_t)e->F;
    const size_t HD = (size_t)e->HD, r = (size_t)e->lora_r;
    layer_p *q = &p->p;
    size_t o = 0;
    memset(q, 0, sizeof *q);
    q->wq = take(base, &o, g, Q * C), q->bq = take(base, &o, g && w->bq, Q);
    q->wk = take(base, &o, g, KV * C), q->bk = take(base, &o, g && w->bk, KV);
    q->wv = take(base, &o, g, KV * C), q->bv = take(base, &o, g && w->bv, KV);
    q->wo = take(base, &o, g, C * Q);
    q->q_norm = take(base, &o, g && w->q_norm, HD), q->k_norm = take(base, &o, g && w->k_norm, HD);
    q->wg = take(base, &o, g, F * C), q->wu = take(base, &o, g, F * C);
    q->wd = take(base, &o, g, C * F);
    q->in_norm = take(base, &o, g, C), q->post_norm = take(base, &o, g, C);
    q->pre_ff_norm = take(base, &o, g && w->pre_ff_norm, C);
    q->post_ff_norm = take(base, &o, g && w->post_ff_norm, C);
    take_ab(&q->aq, base, &o, w->aq.A != NULL, r * C, Q * r);
    take_ab(&q->ak, base, &o, w->ak.A != NULL, r * C, KV * r);
    take_ab(&q->av, base, &o, w->av.A != NULL, r * C, KV * r);
    take_ab(&q->ao, base, &o, w->ao.A != NULL, r * Q, C * r);
    take_ab(&q->ag, base, &o, w->ag.A != NULL, r * C, F * r);
    take_ab(&q->au, base, &o, w->au.A != NULL, r * C, F * r);
    take_ab(&q->ad, base, &o, w->ad.A != NULL, r * F, C * r);
    p->dgin = take(base, &o, e->gemma && g, C); /* kv_work_alloc's dgin */
    p->dk = take(base, &o, 1, (size_t)rows * KV), p->dv = take(base, &o, 1, (size_t)rows * KV);
    return o;
}

int pend_work_alloc(eng *e, pend_work *p, int rows) {
    memset(p, 0, sizeof *p);
    if (!e->portable || e->T <= SUM_BLOCK || e->L < 1) return 1;
    const size_t n = layout(e, p, NULL, rows);
    p->slab = ealloc(e, SBP_MEM_LAYER, n, "partial sums of open token blocks");
    if (!p->slab) return memset(p, 0, sizeof *p), 0;
    layout(e, p, p->slab, rows);
    return 1;
}

void pend_work_free(eng *e, pend_work *p) {
    efree(e, p->slab);
    memset(p, 0, sizeof *p);
}
