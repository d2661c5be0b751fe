/* layer.c — one decoder layer as the four steps every schedule is built from (see engine.h).
 *
 * Forward of rows [s, e) given the K/V side of all T rows:
 *   xn  = rmsnorm(x, w_in)                          (also formed block by block for K and V)
 *   q   = rope(q_norm(xn·Wqᵀ + bq))                 (q_norm: Qwen3)
 *   o   = attention(q, K[0:e], V[0:e])
 *   x2  = x + o·Woᵀ
 *   xn2 = rmsnorm(x2, w_post)
 *   h   = silu(xn2·Wgᵀ) ⊙ (xn2·Wuᵀ)
 *   y   = x2 + h·Wdᵀ
 * The backward below walks the same lines in reverse; each step names the line it differentiates.
 * The input norm's backward is linear in its output gradient, so it is applied in two parts,
 * the query path per chunk and the K/V path at the end, in the same order in every schedule. */
#include "engine.h"

#include <stdio.h>
#include <string.h>

void *ealloc_bytes(eng *e, sbp_mem_cat cat, size_t bytes, const char *what) {
    void *p = sbp_ledger_alloc(e->lg, cat, bytes ? bytes : 1);
    if (!p && !e->oom) {
        e->oom = 1;
        snprintf(e->oom_what, sizeof e->oom_what, "%s", what);
    }
    return p;
}

real *ealloc(eng *e, sbp_mem_cat cat, size_t n, const char *what) {
    return ealloc_bytes(e, cat, (size_t)e->elem_bytes * n, what);
}

void efree(eng *e, void *p) {
    sbp_ledger_free(e->lg, p);
}

int kv_acts_alloc(eng *e, kv_acts *a, sbp_mem_cat cat) {
    size_t T = (size_t)e->T;
    memset(a, 0, sizeof *a);
    if (e->cfg->qk_norm) {
        a->kpre = ealloc(e, cat, T * e->KV, "k before k_norm");
        a->krstd = ealloc(e, cat, T * e->NKV, "k_norm rstd");
    }
    a->k = ealloc(e, cat, T * e->KV, "keys");
    a->v = ealloc(e, cat, T * e->KV, "values");
    if (e->oom) kv_acts_free(e, a);
    return !e->oom;
}

void kv_acts_free(eng *e, kv_acts *a) {
    efree(e, a->kpre), efree(e, a->krstd), efree(e, a->k), efree(e, a->v);
    memset(a, 0, sizeof *a);
}

int chunk_acts_alloc(eng *e, chunk_acts *a, int c, sbp_mem_cat cat) {
    size_t n = (size_t)c;
    memset(a, 0, sizeof *a);
    a->xn = ealloc(e, cat, n * e->C, "input-norm output");
    a->rstd1 = ealloc(e, cat, n, "input-norm rstd");
    if (e->cfg->qk_norm) {
        a->qpre = ealloc(e, cat, n * e->Q, "q before q_norm");
        a->qrstd = ealloc(e, cat, n * e->NH, "q_norm rstd");
    }
    a->q = ealloc(e, cat, n * e->Q, "queries");
    a->o = ealloc(e, cat, n * e->Q, "attention output");
    a->lse = ealloc(e, cat, n * e->NH, "attention lse");
    a->x2 = ealloc(e, cat, n * e->C, "attention residual");
    a->xn2 = ealloc(e, cat, n * e->C, "post-norm output");
    a->rstd2 = ealloc(e, cat, n, "post-norm rstd");
    a->g = ealloc(e, cat, n * e->F, "gate projection");
    a->u = ealloc(e, cat, n * e->F, "up projection");
    a->h = ealloc(e, cat, n * e->F, "MLP activation");
    if (e->oom) chunk_acts_free(e, a);
    return !e->oom;
}

void chunk_acts_free(eng *e, chunk_acts *a) {
    efree(e, a->xn), efree(e, a->rstd1), efree(e, a->qpre), efree(e, a->qrstd), efree(e, a->q);
    efree(e, a->o), efree(e, a->lse), efree(e, a->x2), efree(e, a->xn2), efree(e, a->rstd2);
    efree(e, a->g), efree(e, a->u), efree(e, a->h);
    memset(a, 0, sizeof *a);
}

int chunk_grads_alloc(eng *e, chunk_grads *d, int c) {
    size_t n = (size_t)c;
    memset(d, 0, sizeof *d);
    d->dh = ealloc(e, SBP_MEM_LAYER, n * e->F, "MLP activation gradient");
    d->dg = ealloc(e, SBP_MEM_LAYER, n * e->F, "gate gradient");
    d->du = ealloc(e, SBP_MEM_LAYER, n * e->F, "up gradient");
    d->dxn2 = ealloc(e, SBP_MEM_LAYER, n * e->C, "post-norm output gradient");
    d->dx2 = ealloc(e, SBP_MEM_LAYER, n * e->C, "attention residual gradient");
    d->dxn = ealloc(e, SBP_MEM_LAYER, n * e->C, "input-norm output gradient");
    d->dout = ealloc(e, SBP_MEM_LAYER, n * e->Q, "attention output gradient");
    d->dq = ealloc(e, SBP_MEM_LAYER, n * e->Q, "query gradient");
    if (e->cfg->qk_norm) d->dqpre = ealloc(e, SBP_MEM_LAYER, n * e->Q, "q_norm input gradient");
    d->dsum = ealloc(e, SBP_MEM_LAYER, n * e->NH, "attention dO·O");
    if (e->oom) chunk_grads_free(e, d);
    return !e->oom;
}

void chunk_grads_free(eng *e, chunk_grads *d) {
    efree(e, d->dh), efree(e, d->dg), efree(e, d->du), efree(e, d->dxn2), efree(e, d->dx2);
    efree(e, d->dxn), efree(e, d->dout), efree(e, d->dq), efree(e, d->dqpre), efree(e, d->dsum);
    memset(d, 0, sizeof *d);
}

int kv_work_alloc(eng *e, kv_work *d) {
    size_t T = (size_t)e->T;
    memset(d, 0, sizeof *d);
    d->dk = ealloc(e, SBP_MEM_LAYER, T * e->KV, "key gradient");
    d->dv = ealloc(e, SBP_MEM_LAYER, T * e->KV, "value gradient");
    if (e->cfg->qk_norm) d->dkpre = ealloc(e, SBP_MEM_LAYER, T * e->KV, "k_norm input gradient");
    if (e->oom) kv_work_free(e, d);
    return !e->oom;
}

void kv_work_free(eng *e, kv_work *d) {
    efree(e, d->dk), efree(e, d->dv), efree(e, d->dkpre);
    memset(d, 0, sizeof *d);
}

int layer_scratch_alloc(eng *e, layer_scratch *sc) {
    size_t b = (size_t)e->blk < (size_t)e->T ? (size_t)e->blk : (size_t)e->T;
    memset(sc, 0, sizeof *sc);
    sc->attn = ealloc(e, SBP_MEM_LAYER, attention_scratch(e->blk, e->HD), "attention scratch");
    sc->xn = ealloc(e, SBP_MEM_LAYER, b * e->C, "input-norm block");
    sc->dxn = ealloc(e, SBP_MEM_LAYER, b * e->C, "input-norm block gradient");
    sc->rstd = ealloc(e, SBP_MEM_LAYER, b, "input-norm block rstd");
    if (e->oom) layer_scratch_free(e, sc);
    return !e->oom;
}

void layer_scratch_free(eng *e, layer_scratch *sc) {
    efree(e, sc->attn), efree(e, sc->xn), efree(e, sc->dxn), efree(e, sc->rstd);
    memset(sc, 0, sizeof *sc);
}

static void zero(real *p, size_t n) {
    if (p) memset(p, 0, sizeof(real) * n);
}

/* End of the token block that starts at row r: the next multiple of blk, or e. */
static int block_end(int r, int e, int blk) {
    int next = (r / blk + 1) * blk;
    return next < e ? next : e;
}

/* ---- forward --------------------------------------------------------------------------------- */

void kv_forward(const eng *e, kv_acts *a, layer_scratch *sc, const real *x, const layer_p *w) {
    if (e->plan) return;
    const int T = e->T, C = e->C, KV = e->KV;
    const size_t TKV = (size_t)T * KV;
    real *k = a->kpre ? a->kpre : a->k;
    for (int b0 = 0, b1; b0 < T; b0 = b1) { /* xn = rmsnorm(x, w_in), a block at a time */
        b1 = block_end(b0, T, e->blk);
        rmsnorm_forward(sc->xn, sc->rstd, x + (size_t)b0 * C, w->in_norm, b1 - b0, C, e->cfg->eps);
        bf16(e, sc->xn, (size_t)(b1 - b0) * C);
        linear_forward(k + (size_t)b0 * KV, sc->xn, w->wk, w->bk, b0, b1, KV, C, e->blk);
        linear_forward(a->v + (size_t)b0 * KV, sc->xn, w->wv, w->bv, b0, b1, KV, C, e->blk);
    }
    bf16(e, k, TKV), bf16(e, a->v, TKV);
    if (a->kpre)
        rmsnorm_forward(a->k, a->krstd, a->kpre, w->k_norm, T * e->NKV, e->HD, e->cfg->eps);
    rope_forward(a->k, e->cos, e->sin, 0, T, e->NKV, e->HD);
    bf16(e, a->k, TKV);
}

void chunk_forward(const eng *e, chunk_acts *a, real *y, layer_scratch *sc, const real *x,
                   const kv_acts *kv, const layer_p *w, const uint8_t *kmask, int s, int end) {
    if (e->plan) return;
    const int M = end - s, C = e->C, Q = e->Q, F = e->F;
    const size_t MC = (size_t)M * C, MQ = (size_t)M * Q, MF = (size_t)M * F;
    rmsnorm_forward(a->xn, a->rstd1, x, w->in_norm, M, C, e->cfg->eps);
    bf16(e, a->xn, MC);
    real *q = a->qpre ? a->qpre : a->q;
    linear_forward(q, a->xn, w->wq, w->bq, s, end, Q, C, e->blk);
    bf16(e, q, MQ);
    if (a->qpre) rmsnorm_forward(a->q, a->qrstd, a->qpre, w->q_norm, M * e->NH, e->HD, e->cfg->eps);
    rope_forward(a->q, e->cos, e->sin, s, M, e->NH, e->HD);
    bf16(e, a->q, MQ);
    attention_forward(a->o, a->lse, sc->attn, a->q, kv->k, kv->v, kmask, s, M, e->T, e->NH, e->NKV,
                      e->HD, e->blk);
    bf16(e, a->o, MQ);
    /* x2 = x + o·Woᵀ */
    linear_forward(a->x2, a->o, w->wo, NULL, s, end, C, Q, e->blk);
    bf16(e, a->x2, MC);
    for (size_t i = 0; i < MC; i++) a->x2[i] = x[i] + a->x2[i];
    bf16(e, a->x2, MC);
    rmsnorm_forward(a->xn2, a->rstd2, a->x2, w->post_norm, M, C, e->cfg->eps);
    bf16(e, a->xn2, MC);
    linear_forward(a->g, a->xn2, w->wg, NULL, s, end, F, C, e->blk);
    linear_forward(a->u, a->xn2, w->wu, NULL, s, end, F, C, e->blk);
    bf16(e, a->g, MF), bf16(e, a->u, MF);
    swiglu_forward(a->h, a->g, a->u, MF);
    bf16(e, a->h, MF);
    if (!y) return;
    /* y = x2 + h·Wdᵀ */
    linear_forward(y, a->h, w->wd, NULL, s, end, C, F, e->blk);
    bf16(e, y, MC);
    for (size_t i = 0; i < MC; i++) y[i] = a->x2[i] + y[i];
    bf16(e, y, MC);
}

/* ---- backward -------------------------------------------------------------------------------- */

void chunk_backward(const eng *e, real *dx, kv_work *kvw, layer_p *gw, chunk_grads *d,
                    layer_scratch *sc, const real *dy, const chunk_acts *a, const kv_acts *kv,
                    const real *x, const layer_p *w, const uint8_t *kmask, int s, int end) {
    if (e->plan) return;
    const int M = end - s, C = e->C, Q = e->Q, F = e->F, blk = e->blk;
    const size_t MC = (size_t)M * C, MF = (size_t)M * F, MQ = (size_t)M * Q;
    zero(d->dh, MF), zero(d->dg, MF), zero(d->du, MF), zero(d->dxn2, MC), zero(d->dxn, MC);
    zero(d->dout, MQ), zero(d->dq, MQ), zero(d->dqpre, MQ);
    /* y = x2 + h·Wdᵀ: dx2 = dy, dh = dy·Wd (the last reads of dy: dx may be dy) */
    memcpy(d->dx2, dy, sizeof(real) * MC);
    linear_backward(d->dh, gw->wd, NULL, dy, a->h, w->wd, s, end, C, F, blk);
    bf16(e, d->dh, MF);
    /* h = silu(g) ⊙ u */
    swiglu_backward(d->dg, d->du, d->dh, a->g, a->u, MF);
    bf16(e, d->dg, MF), bf16(e, d->du, MF);
    /* g = xn2·Wgᵀ, u = xn2·Wuᵀ */
    linear_backward(d->dxn2, gw->wg, NULL, d->dg, a->xn2, w->wg, s, end, F, C, blk);
    linear_backward(d->dxn2, gw->wu, NULL, d->du, a->xn2, w->wu, s, end, F, C, blk);
    bf16(e, d->dxn2, MC);
    /* xn2 = rmsnorm(x2, w_post) */
    rmsnorm_backward(d->dx2, gw->post_norm, d->dxn2, a->x2, a->rstd2, w->post_norm, M, C);
    bf16(e, d->dx2, MC);
    /* x2 = x + o·Woᵀ: the residual path is dx's first term, and dO */
    memcpy(dx, d->dx2, sizeof(real) * MC);
    linear_backward(d->dout, gw->wo, NULL, d->dx2, a->o, w->wo, s, end, C, Q, blk);
    bf16(e, d->dout, MQ);
    /* o = attention(q, K, V) */
    attention_backward(d->dq, kvw->dk, kvw->dv, d->dsum, sc->attn, d->dout, a->o, a->lse, a->q,
                       kv->k, kv->v, kmask, s, M, e->T, e->NH, e->NKV, e->HD, e->blk);
    bf16(e, d->dq, MQ);
    /* q = rope(q_norm(qpre)) */
    rope_backward(d->dq, e->cos, e->sin, s, M, e->NH, e->HD);
    real *dqpre = d->dq;
    if (a->qpre) {
        rmsnorm_backward(d->dqpre, gw->q_norm, d->dq, a->qpre, a->qrstd, w->q_norm, M * e->NH,
                         e->HD);
        dqpre = d->dqpre;
    }
    bf16(e, dqpre, MQ);
    /* qpre = xn·Wqᵀ + bq, xn = rmsnorm(x, w_in): the query path into dx */
    linear_backward(d->dxn, gw->wq, gw->bq, dqpre, a->xn, w->wq, s, end, Q, C, blk);
    bf16(e, d->dxn, MC);
    rmsnorm_backward(dx, gw->in_norm, d->dxn, x, a->rstd1, w->in_norm, M, C);
    bf16(e, dx, MC);
}

void kv_backward(const eng *e, real *dx, layer_p *gw, kv_work *kvw, layer_scratch *sc,
                 const kv_acts *kv, const real *x, const layer_p *w) {
    if (e->plan) return;
    const int T = e->T, C = e->C, KV = e->KV, blk = e->blk;
    const size_t TKV = (size_t)T * KV;
    /* dK and dV were accumulated over every chunk; a bf16 run stores them once, here */
    bf16(e, kvw->dk, TKV), bf16(e, kvw->dv, TKV);
    /* k = rope(k_norm(kpre)) */
    rope_backward(kvw->dk, e->cos, e->sin, 0, T, e->NKV, e->HD);
    real *dkpre = kvw->dk;
    if (kv->kpre) {
        zero(kvw->dkpre, TKV);
        rmsnorm_backward(kvw->dkpre, gw->k_norm, kvw->dk, kv->kpre, kv->krstd, w->k_norm,
                         T * e->NKV, e->HD);
        dkpre = kvw->dkpre;
    }
    bf16(e, dkpre, TKV);
    /* kpre = xn·Wkᵀ + bk, v = xn·Wvᵀ + bv, xn = rmsnorm(x, w_in): a block at a time, xn formed
     * again, the K/V path into dx */
    for (int b0 = 0, b1; b0 < T; b0 = b1) {
        b1 = block_end(b0, T, blk);
        const size_t n = (size_t)(b1 - b0) * C;
        const real *x_b = x + (size_t)b0 * C;
        rmsnorm_forward(sc->xn, sc->rstd, x_b, w->in_norm, b1 - b0, C, e->cfg->eps);
        bf16(e, sc->xn, n);
        zero(sc->dxn, n);
        linear_backward(sc->dxn, gw->wk, gw->bk, dkpre + (size_t)b0 * KV, sc->xn, w->wk, b0, b1, KV,
                        C, blk);
        linear_backward(sc->dxn, gw->wv, gw->bv, kvw->dv + (size_t)b0 * KV, sc->xn, w->wv, b0, b1,
                        KV, C, blk);
        bf16(e, sc->dxn, n);
        rmsnorm_backward(dx + (size_t)b0 * C, gw->in_norm, sc->dxn, x_b, sc->rstd, w->in_norm,
                         b1 - b0, C);
        bf16(e, dx + (size_t)b0 * C, n);
    }
}
