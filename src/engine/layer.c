/* layer.c — one decoder layer as the four steps every schedule is built from (see engine.h).
 *
 * Forward of rows [s, e) given the K/V side of all T rows:
 *   q   = rope(q_norm(xn[s:e]·Wqᵀ + bq))           (q_norm: Qwen3)
 *   o   = attention(q, K[0:e], V[0:e])
 *   x2  = x + o·Woᵀ
 *   xn2 = rmsnorm(x2, w_post)
 *   h   = silu(xn2·Wgᵀ) ⊙ (xn2·Wuᵀ)
 *   y   = x2 + h·Wdᵀ
 * The backward below walks the same lines in reverse; each step names the line it differentiates.
 */
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
    a->xn = ealloc(e, cat, T * e->C, "input-norm output");
    a->rstd = ealloc(e, cat, T, "input-norm rstd");
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
    efree(e, a->xn), efree(e, a->rstd), efree(e, a->kpre), efree(e, a->krstd);
    efree(e, a->k), efree(e, a->v);
    memset(a, 0, sizeof *a);
}

int chunk_acts_alloc(eng *e, chunk_acts *a, int c, sbp_mem_cat cat) {
    size_t n = (size_t)c;
    memset(a, 0, sizeof *a);
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
    efree(e, a->qpre), efree(e, a->qrstd), efree(e, a->q), efree(e, a->o), efree(e, a->lse);
    efree(e, a->x2), efree(e, a->xn2), efree(e, a->rstd2);
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
    d->dout = ealloc(e, SBP_MEM_LAYER, n * e->Q, "attention output gradient");
    d->dq = ealloc(e, SBP_MEM_LAYER, n * e->Q, "query gradient");
    if (e->cfg->qk_norm) d->dqpre = ealloc(e, SBP_MEM_LAYER, n * e->Q, "q_norm input gradient");
    d->dsum = ealloc(e, SBP_MEM_LAYER, n * e->NH, "attention dO·O");
    if (e->oom) chunk_grads_free(e, d);
    return !e->oom;
}

void chunk_grads_free(eng *e, chunk_grads *d) {
    efree(e, d->dh), efree(e, d->dg), efree(e, d->du), efree(e, d->dxn2), efree(e, d->dx2);
    efree(e, d->dout), efree(e, d->dq), efree(e, d->dqpre), efree(e, d->dsum);
    memset(d, 0, sizeof *d);
}

int kv_work_alloc(eng *e, kv_work *d) {
    size_t T = (size_t)e->T;
    memset(d, 0, sizeof *d);
    d->attn = ealloc(e, SBP_MEM_LAYER, attention_scratch(e->blk, e->HD), "attention scratch");
    d->dk = ealloc(e, SBP_MEM_LAYER, T * e->KV, "key gradient");
    d->dv = ealloc(e, SBP_MEM_LAYER, T * e->KV, "value gradient");
    if (e->cfg->qk_norm) d->dkpre = ealloc(e, SBP_MEM_LAYER, T * e->KV, "k_norm input gradient");
    d->dxn = ealloc(e, SBP_MEM_LAYER, T * e->C, "input-norm output gradient");
    if (e->oom) kv_work_free(e, d);
    return !e->oom;
}

void kv_work_free(eng *e, kv_work *d) {
    efree(e, d->attn), efree(e, d->dk), efree(e, d->dv), efree(e, d->dkpre);
    efree(e, d->dxn);
    memset(d, 0, sizeof *d);
}

static void zero(real *p, size_t n) {
    if (p) memset(p, 0, sizeof(real) * n);
}

/* ---- forward --------------------------------------------------------------------------------- */

void kv_forward(const eng *e, kv_acts *a, const real *x, const layer_p *w) {
    if (e->plan) return;
    const int T = e->T, C = e->C, KV = e->KV;
    const size_t TKV = (size_t)T * KV;
    rmsnorm_forward(a->xn, a->rstd, x, w->in_norm, T, C, e->cfg->eps);
    bf16(e, a->xn, (size_t)T * C);
    real *k = a->kpre ? a->kpre : a->k;
    linear_forward(k, a->xn, w->wk, w->bk, 0, T, KV, C, e->blk);
    linear_forward(a->v, a->xn, w->wv, w->bv, 0, T, KV, C, e->blk);
    bf16(e, k, TKV), bf16(e, a->v, TKV);
    if (a->kpre)
        rmsnorm_forward(a->k, a->krstd, a->kpre, w->k_norm, T * e->NKV, e->HD, e->cfg->eps);
    rope_forward(a->k, e->cos, e->sin, 0, T, e->NKV, e->HD);
    bf16(e, a->k, TKV);
}

void chunk_forward(const eng *e, chunk_acts *a, real *y, const real *x, const kv_acts *kv,
                   real *attn, const layer_p *w, const uint8_t *kmask, int s, int end) {
    if (e->plan) return;
    const int M = end - s, C = e->C, Q = e->Q, F = e->F;
    const size_t MC = (size_t)M * C, MQ = (size_t)M * Q, MF = (size_t)M * F;
    real *q = a->qpre ? a->qpre : a->q;
    linear_forward(q, kv->xn + (size_t)s * C, w->wq, w->bq, s, end, Q, C, e->blk);
    bf16(e, q, MQ);
    if (a->qpre) rmsnorm_forward(a->q, a->qrstd, a->qpre, w->q_norm, M * e->NH, e->HD, e->cfg->eps);
    rope_forward(a->q, e->cos, e->sin, s, M, e->NH, e->HD);
    bf16(e, a->q, MQ);
    attention_forward(a->o, a->lse, attn, a->q, kv->k, kv->v, kmask, s, M, e->T, e->NH, e->NKV,
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
                    const real *dy, const chunk_acts *a, const kv_acts *kv, const layer_p *w,
                    const uint8_t *kmask, int s, int end) {
    if (e->plan) return;
    const int M = end - s, C = e->C, Q = e->Q, F = e->F, blk = e->blk;
    const size_t MC = (size_t)M * C, MF = (size_t)M * F, MQ = (size_t)M * Q;
    zero(d->dh, MF), zero(d->dg, MF), zero(d->du, MF), zero(d->dxn2, MC);
    zero(d->dout, MQ), zero(d->dq, MQ), zero(d->dqpre, MQ);
    /* y = x2 + h·Wdᵀ: dx2 = dy, dh = dy·Wd */
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
    /* x2 = x + o·Woᵀ: the residual path to dx, and dO */
    for (size_t i = 0; i < MC; i++) dx[i] += d->dx2[i];
    bf16(e, dx, MC);
    linear_backward(d->dout, gw->wo, NULL, d->dx2, a->o, w->wo, s, end, C, Q, blk);
    bf16(e, d->dout, MQ);
    /* o = attention(q, K, V) */
    attention_backward(d->dq, kvw->dk, kvw->dv, d->dsum, kvw->attn, d->dout, a->o, a->lse, a->q,
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
    /* qpre = xn·Wqᵀ + bq: the query path of the input-norm gradient */
    linear_backward(kvw->dxn + (size_t)s * C, gw->wq, gw->bq, dqpre, kv->xn + (size_t)s * C, w->wq,
                    s, end, Q, C, blk);
    bf16(e, kvw->dxn + (size_t)s * C, MC);
}

void kv_backward(const eng *e, real *dx, layer_p *gw, kv_work *kvw, const kv_acts *kv,
                 const real *x, const layer_p *w) {
    if (e->plan) return;
    const int T = e->T, C = e->C, KV = e->KV, blk = e->blk;
    const size_t TKV = (size_t)T * KV, TC = (size_t)T * C;
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
    /* kpre = xn·Wkᵀ + bk, v = xn·Wvᵀ + bv */
    linear_backward(kvw->dxn, gw->wk, gw->bk, dkpre, kv->xn, w->wk, 0, T, KV, C, blk);
    linear_backward(kvw->dxn, gw->wv, gw->bv, kvw->dv, kv->xn, w->wv, 0, T, KV, C, blk);
    bf16(e, kvw->dxn, TC);
    /* xn = rmsnorm(x, w_in) */
    rmsnorm_backward(dx, gw->in_norm, kvw->dxn, x, kv->rstd, w->in_norm, T, C);
    bf16(e, dx, TC);
}
