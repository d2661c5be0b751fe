/* layer.c — one decoder layer as the four steps every schedule is built from (engine.h).
 *
 * Forward of rows [s, e) given the K/V side of all T rows:
 *   xn  = rmsnorm(x, w_in)                          (also formed block by block for K and V)
 *   q   = rope(q_norm(xn·Wqᵀ + bq))                 (q_norm: Qwen3)
 *   o   = attention(q, K[0:e], V[0:e])
 *   x2  = x + o·Woᵀ
 *   xn2 = rmsnorm(x2, w_post)
 *   h   = silu(xn2·Wgᵀ) ⊙ (xn2·Wuᵀ)
 *   y   = x2 + h·Wdᵀ
 * xn, xn2 and h are formed, not kept (engine.h, chunk_formed): the backward forms each again.
 * The backward walks the same lines in reverse; each step names the line it differentiates.
 * The input norm's backward is linear in its output gradient, so it is applied in two parts,
 * the query path per chunk and the K/V path at the end, in the same order in every schedule.
 * Every operation goes through the op table (ops.h). */
#include "../engine.h"

/* End of the token block that starts at row r: the next multiple of blk, or e. */
static int block_end(int r, int e, int blk) {
    int next = (r / blk + 1) * blk;
    return next < e ? next : e;
}

/* The activations of rows [s, ...): a buffer of all T rows holds row s at offset s, a chunk's
 * buffer at offset 0. */
static chunk_acts rows_from(const eng *e, const chunk_acts *a, int s) {
    const size_t r = a->rows >= e->T ? (size_t)s : 0;
    chunk_acts v = *a;
    v.q += r * e->Q, v.o += r * e->Q, v.lse += r * e->NH, v.x2 += r * e->C;
    v.g += r * e->F, v.u += r * e->F;
    if (v.qpre) v.qpre += r * e->Q, v.qrstd += r * e->NH;
    return v;
}

/* The attention call of rows [s, s+M) of this layer. */
static sbp_attn_dims attn_dims(const eng *e, const layer_run *lr, int s, int M) {
    return (sbp_attn_dims){.s = s,
                           .M = M,
                           .T = e->T,
                           .NH = e->NH,
                           .NKV = e->NKV,
                           .HD = e->HD,
                           .blk = e->blk,
                           .window = lr->window,
                           .scale = e->attn_scale};
}

/* ---- a projection, with or without a LoRA adapter --------------------------------------------
 * y = x·Wᵀ (+ b), and with an adapter y ← y + (t·Bᵀ)·s, t = x·Aᵀ (peft: base + lora_B(lora_A(x))
 * · scaling). The backward: dx += dy·W (dW, db only when the weight is not frozen), then with an
 * adapter dz = dy·s, dt = dz·B (dB += dzᵀ·t), dx += dt·A (dA += dtᵀ·x), t recomputed. The same
 * calls in the same order in every schedule. */

static void proj_forward(const eng *e, const lora_work *lw, real *y, const real *x, const real *w,
                         const real *b, const lora_ab *ad, int s, int end, int N, int K) {
    const sbp_ops *op = e->ops;
    op->linear_forward(e, y, x, w, b, s, end, N, K);
    if (!ad->A) return;
    op->linear_forward(e, lw->t, x, ad->A, NULL, s, end, e->lora_r, K);
    op->linear_forward(e, lw->z, lw->t, ad->B, NULL, s, end, N, e->lora_r);
    op->axpy(e, y, e->lora_s, lw->z, (size_t)(end - s) * N);
}

static void proj_backward(const eng *e, const lora_work *lw, real *dx, real *dw, real *db,
                          lora_ab *gad, const real *dy, const real *x, const real *w,
                          const lora_ab *ad, int s, int end, int N, int K) {
    const sbp_ops *op = e->ops;
    const int M = end - s, r = e->lora_r;
    op->linear_backward(e, dx, dw, db, dy, x, w, s, end, N, K);
    if (!ad->A) return;
    op->linear_forward(e, lw->t, x, ad->A, NULL, s, end, r, K);
    op->copy(e, lw->dz, dy, (size_t)M * N);
    op->scale(e, lw->dz, e->lora_s, (size_t)M * N);
    op->zero(e, lw->dt, (size_t)M * r);
    op->linear_backward(e, lw->dt, gad->B, NULL, lw->dz, lw->t, ad->B, s, end, N, r);
    op->linear_backward(e, dx, gad->A, NULL, lw->dt, x, ad->A, s, end, r, K);
}

/* ---- forward --------------------------------------------------------------------------------- */

void kv_forward(const eng *e, layer_run *lr) {
    const sbp_ops *op = e->ops;
    const int T = e->T, C = e->C, KV = e->KV;
    const layer_p *w = lr->w;
    kv_acts *a = lr->kv;
    norm_block *nb = lr->nb;
    real *k = a->kpre ? a->kpre : a->k;
    for (int b0 = 0, b1; b0 < T; b0 = b1) { /* xn = rmsnorm(x, w_in), a block at a time */
        b1 = block_end(b0, T, e->blk);
        op->rmsnorm_forward(e, nb->xn, nb->rstd, lr->x + (size_t)b0 * C, w->in_norm, b1 - b0, C);
        proj_forward(e, lr->lw, k + (size_t)b0 * KV, nb->xn, w->wk, w->bk, &w->ak, b0, b1, KV, C);
        proj_forward(e, lr->lw, a->v + (size_t)b0 * KV, nb->xn, w->wv, w->bv, &w->av, b0, b1, KV,
                     C);
    }
    if (a->kpre) op->rmsnorm_forward(e, a->k, a->krstd, a->kpre, w->k_norm, T * e->NKV, e->HD);
    op->rope_forward(e, a->k, 0, T, e->NKV);
}

void chunk_forward(const eng *e, layer_run *lr, int s, int end) {
    const sbp_ops *op = e->ops;
    const int M = end - s, C = e->C, Q = e->Q, F = e->F;
    const size_t MC = (size_t)M * C;
    const layer_p *w = lr->w;
    const real *x = lr->x + (size_t)s * C;
    const chunk_acts a = rows_from(e, lr->acts, s);
    real *xn = lr->fm->t, *xn2 = lr->fm->t, *h = lr->fm->t, *rstd = lr->fm->rstd;
    op->rmsnorm_forward(e, xn, rstd, x, w->in_norm, M, C);
    real *q = a.qpre ? a.qpre : a.q;
    proj_forward(e, lr->lw, q, xn, w->wq, w->bq, &w->aq, s, end, Q, C);
    if (a.qpre) op->rmsnorm_forward(e, a.q, a.qrstd, a.qpre, w->q_norm, M * e->NH, e->HD);
    op->rope_forward(e, a.q, s, M, e->NH);
    const sbp_attn_dims ad = attn_dims(e, lr, s, M);
    op->attention_forward(e, a.o, a.lse, a.q, lr->kv->k, lr->kv->v, lr->kmask, &ad);
    /* x2 = x + o·Woᵀ */
    proj_forward(e, lr->lw, a.x2, a.o, w->wo, NULL, &w->ao, s, end, C, Q);
    op->add(e, a.x2, x, a.x2, MC);
    op->rmsnorm_forward(e, xn2, rstd, a.x2, w->post_norm, M, C);
    proj_forward(e, lr->lw, a.g, xn2, w->wg, NULL, &w->ag, s, end, F, C);
    proj_forward(e, lr->lw, a.u, xn2, w->wu, NULL, &w->au, s, end, F, C);
    if (!lr->y) return; /* a recompute needs the activations, not the output */
    /* y = x2 + h·Wdᵀ */
    op->swiglu_forward(e, h, a.g, a.u, (size_t)M * F);
    real *y = lr->y + (size_t)s * C;
    proj_forward(e, lr->lw, y, h, w->wd, NULL, &w->ad, s, end, C, F);
    op->add(e, y, a.x2, y, MC);
}

/* ---- backward -------------------------------------------------------------------------------- */

void kv_begin_backward(const eng *e, layer_run *lr) {
    const size_t TKV = (size_t)e->T * e->KV;
    e->ops->zero(e, lr->kvw->dk, TKV);
    e->ops->zero(e, lr->kvw->dv, TKV);
}

void chunk_backward(const eng *e, layer_run *lr, int s, int end) {
    const sbp_ops *op = e->ops;
    const int M = end - s, C = e->C, Q = e->Q, F = e->F;
    const size_t MC = (size_t)M * C, MF = (size_t)M * F, MQ = (size_t)M * Q;
    const layer_p *w = lr->w;
    layer_p *gw = lr->g;
    chunk_grads *d = lr->cg;
    const chunk_acts a = rows_from(e, lr->acts, s);
    real *xn = lr->fm->t, *xn2 = lr->fm->t, *h = lr->fm->t, *rstd = lr->fm->rstd;
    const real *x = lr->x + (size_t)s * C;
    real *dx = lr->dx + (size_t)s * C; /* dY on entry */
    op->zero(e, d->dh, MF), op->zero(e, d->dg, MF), op->zero(e, d->du, MF);
    op->zero(e, d->dxn2, MC), op->zero(e, d->dxn, MC), op->zero(e, d->dout, MQ);
    op->zero(e, d->dq, MQ);
    if (d->dqpre) op->zero(e, d->dqpre, MQ);
    /* y = x2 + h·Wdᵀ: dx2 = dy, dh = dy·Wd (the last reads of dy: dx is dy) */
    op->copy(e, d->dx2, dx, MC);
    op->swiglu_forward(e, h, a.g, a.u, MF); /* formed again */
    proj_backward(e, lr->lw, d->dh, gw->wd, NULL, &gw->ad, dx, h, w->wd, &w->ad, s, end, C, F);
    /* h = silu(g) ⊙ u */
    op->swiglu_backward(e, d->dg, d->du, d->dh, a.g, a.u, MF);
    /* g = xn2·Wgᵀ, u = xn2·Wuᵀ */
    op->rmsnorm_forward(e, xn2, rstd, a.x2, w->post_norm, M, C); /* formed again */
    proj_backward(e, lr->lw, d->dxn2, gw->wg, NULL, &gw->ag, d->dg, xn2, w->wg, &w->ag, s, end, F,
                  C);
    proj_backward(e, lr->lw, d->dxn2, gw->wu, NULL, &gw->au, d->du, xn2, w->wu, &w->au, s, end, F,
                  C);
    /* xn2 = rmsnorm(x2, w_post) */
    op->rmsnorm_backward(e, d->dx2, gw->post_norm, d->dxn2, a.x2, rstd, w->post_norm, M, C);
    /* x2 = x + o·Woᵀ: the residual path is dx's first term, and dO */
    op->copy(e, dx, d->dx2, MC);
    proj_backward(e, lr->lw, d->dout, gw->wo, NULL, &gw->ao, d->dx2, a.o, w->wo, &w->ao, s, end, C,
                  Q);
    /* o = attention(q, K, V) */
    const sbp_attn_dims ad = attn_dims(e, lr, s, M);
    op->attention_backward(e, d->dq, lr->kvw->dk, lr->kvw->dv, d->dsum, d->dout, a.o, a.lse, a.q,
                           lr->kv->k, lr->kv->v, lr->kmask, &ad);
    /* q = rope(q_norm(qpre)) */
    op->rope_backward(e, d->dq, s, M, e->NH);
    real *dqpre = d->dq;
    if (a.qpre) {
        op->rmsnorm_backward(e, d->dqpre, gw->q_norm, d->dq, a.qpre, a.qrstd, w->q_norm, M * e->NH,
                             e->HD);
        dqpre = d->dqpre;
    }
    /* qpre = xn·Wqᵀ + bq, xn = rmsnorm(x, w_in): the query path into dx */
    op->rmsnorm_forward(e, xn, rstd, x, w->in_norm, M, C); /* formed again */
    proj_backward(e, lr->lw, d->dxn, gw->wq, gw->bq, &gw->aq, dqpre, xn, w->wq, &w->aq, s, end, Q,
                  C);
    op->rmsnorm_backward(e, dx, gw->in_norm, d->dxn, x, rstd, w->in_norm, M, C);
}

void kv_backward(const eng *e, layer_run *lr) {
    const sbp_ops *op = e->ops;
    const int T = e->T, C = e->C, KV = e->KV, blk = e->blk;
    const size_t TKV = (size_t)T * KV;
    const layer_p *w = lr->w;
    layer_p *gw = lr->g;
    kv_work *kvw = lr->kvw;
    const kv_acts *kv = lr->kv;
    norm_block *nb = lr->nb;
    /* dK and dV were accumulated over every chunk: complete now */
    op->store(e, kvw->dk, TKV), op->store(e, kvw->dv, TKV);
    /* k = rope(k_norm(kpre)) */
    op->rope_backward(e, kvw->dk, 0, T, e->NKV);
    real *dkpre = kvw->dk;
    if (kv->kpre) {
        op->zero(e, kvw->dkpre, TKV);
        op->rmsnorm_backward(e, kvw->dkpre, gw->k_norm, kvw->dk, kv->kpre, kv->krstd, w->k_norm,
                             T * e->NKV, e->HD);
        dkpre = kvw->dkpre;
    }
    /* kpre = xn·Wkᵀ + bk, v = xn·Wvᵀ + bv, xn = rmsnorm(x, w_in): a block at a time, xn formed
     * again, the K/V path into dx */
    for (int b0 = 0, b1; b0 < T; b0 = b1) {
        b1 = block_end(b0, T, blk);
        const size_t n = (size_t)(b1 - b0) * C;
        const real *x_b = lr->x + (size_t)b0 * C;
        op->rmsnorm_forward(e, nb->xn, nb->rstd, x_b, w->in_norm, b1 - b0, C);
        op->zero(e, nb->dxn, n);
        proj_backward(e, lr->lw, nb->dxn, gw->wk, gw->bk, &gw->ak, dkpre + (size_t)b0 * KV, nb->xn,
                      w->wk, &w->ak, b0, b1, KV, C);
        proj_backward(e, lr->lw, nb->dxn, gw->wv, gw->bv, &gw->av, kvw->dv + (size_t)b0 * KV,
                      nb->xn, w->wv, &w->av, b0, b1, KV, C);
        op->rmsnorm_backward(e, lr->dx + (size_t)b0 * C, gw->in_norm, nb->dxn, x_b, nb->rstd,
                             w->in_norm, b1 - b0, C);
    }
}
