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
 * Gemma-3 (e->gemma) sandwiches both blocks between norms and gates with GeGLU:
 *   ao  = o·Woᵀ,  x2 = x + rmsnorm(ao, w_post)       (HF's post_attention_layernorm)
 *   xn2 = rmsnorm(x2, w_pre_ff)
 *   h   = gelu_tanh(xn2·Wgᵀ) ⊙ (xn2·Wuᵀ)
 *   mo  = h·Wdᵀ,  y = x2 + rmsnorm(mo, w_post_ff)
 * with every norm weight used as 1 + w (e->norm1p, gemma.c), its local layers' RoPE on their
 * own tables; ao and mo are kept (forming them again would be a product).
 * xn, xn2 and h are formed, not kept (engine.h, chunk_formed): the backward forms each again.
 * The backward walks the same lines in reverse; each step names the line it differentiates.
 * The input norm's backward is linear in its output gradient, so it is applied in two parts,
 * the query path per chunk and the K/V path at the end, in the same order in every schedule. On
 * a local layer the K/V path's part of its weight gradient is a chain of its own, added at the
 * end (kv_end_backward), so StreamBP may run the K/V path of a key as soon as the queries of its
 * window are done and hold keys of the window only (kv_window_*).
 * Every operation goes through the op table (ops.h). */
#include "../engine.h"

/* End of the token block that starts at row r: the next multiple of blk, or e. */
static int block_end(int r, int e, int blk) {
    int next = (r / blk + 1) * blk;
    return next < e ? next : e;
}

/* Row s of a buffer of this rank's rows (all T in one process): at s − r0 (engine.h). */
static const real *row_of(const eng *e, const real *a, int s, int width) {
    return a + (size_t)(s - e->r0) * width;
}
static real *row_mut(const eng *e, real *a, int s, int width) {
    return a + (size_t)(s - e->r0) * width;
}

/* The activations of rows [s, ...): a buffer of this rank's rows (all T in one process: full BP)
 * holds row s at s − r0, a chunk's buffer at offset 0 (a chunk as long as the rank's rows is the
 * only one, at r0). */
static chunk_acts rows_from(const eng *e, const chunk_acts *a, int s) {
    const size_t r = a->rows >= e->r1 - e->r0 ? (size_t)(s - e->r0) : 0;
    chunk_acts v = *a;
    v.q += r * e->Q, v.o += r * e->Q, v.lse += r * e->NH, v.x2 += r * e->C;
    v.g += r * e->F, v.u += r * e->F;
    if (v.qpre) v.qpre += r * e->Q, v.qrstd += r * e->NH;
    if (v.ao) v.ao += r * e->C, v.aorstd += r, v.mo += r * e->C, v.morstd += r;
    return v;
}

/* RoPE of this layer: Gemma-3's local (sliding) layers rotate by their own tables
 * (rope_local_base_freq, no scaling). The op reads e->cos and e->sin, so a local layer hands it
 * a copy of e with the local tables in their place. */
static const eng *rope_eng(const eng *e, const layer_run *lr, eng *tmp) {
    if (!e->gemma || sbp_layer_window(e->cfg, (int)(lr->w - e->w)) == 0) return e;
    *tmp = *e;
    tmp->cos = e->cos_l, tmp->sin = e->sin_l;
    return tmp;
}

static void rope_fwd(const eng *e, const layer_run *lr, real *x, int s, int M, int H) {
    eng tmp;
    e->ops->rope_forward(rope_eng(e, lr, &tmp), x, s, M, H);
}

static void rope_bwd(const eng *e, const layer_run *lr, real *dx, int s, int M, int H) {
    eng tmp;
    e->ops->rope_backward(rope_eng(e, lr, &tmp), dx, s, M, H);
}

/* The gated activation: silu (SwiGLU), or Gemma-3's gelu_tanh (GeGLU). */
static void act_forward(const eng *e, real *h, const real *g, const real *u, size_t n) {
    (e->gemma ? e->ops->geglu_forward : e->ops->swiglu_forward)(e, h, g, u, n);
}

static void act_backward(const eng *e, real *dg, real *du, const real *dh, const real *g,
                         const real *u, size_t n) {
    (e->gemma ? e->ops->geglu_backward : e->ops->swiglu_backward)(e, dg, du, dh, g, u, n);
}

/* The attention call of rows [s, s+M) of this layer, against the keys the K/V side holds: rows
 * [lo, hi), key j at row j − lo (lo = 0 and hi = T but on a windowed K/V side). The call sees
 * the sequence from lo on: query s at s − lo, the mask from kmask + lo. Nothing of a query's
 * chains depends on where the sequence starts but the key tiles' grid, and lo is a multiple of
 * every kernel's tile (kv_grain), so the bits are those of the call on all T keys: the keys
 * before lo are outside the window of every query of the chunk. */
static sbp_attn_dims attn_dims(const eng *e, const layer_run *lr, int s, int M) {
    return (sbp_attn_dims){.s = s - lr->kv->lo,
                           .M = M,
                           .T = lr->kv->hi - lr->kv->lo,
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

/* The pending partial sums of the layer's open token blocks (sums.c), or all NULL. */
static const layer_p *pend_of(const layer_run *lr) {
    static const layer_p none;
    return lr->pd ? &lr->pd->p : &none;
}

/* pdw, pdb, pgad: the pending partial sums of dw, db and the adapter's gradients (sums.c) */
static void proj_backward(const eng *e, const lora_work *lw, real *dx, real *dw, real *db,
                          lora_ab *gad, real *pdw, real *pdb, const lora_ab *pgad, const real *dy,
                          const real *x, const real *w, const lora_ab *ad, int s, int end, int N,
                          int K) {
    const sbp_ops *op = e->ops;
    const int M = end - s, r = e->lora_r;
    sum_linear_backward(e, dx, dw, pdw, db, pdb, dy, x, w, s, end, N, K);
    if (!ad->A) return;
    op->linear_forward(e, lw->t, x, ad->A, NULL, s, end, r, K);
    op->copy(e, lw->dz, dy, (size_t)M * N);
    op->scale(e, lw->dz, e->lora_s, (size_t)M * N);
    op->zero(e, lw->dt, (size_t)M * r);
    sum_linear_backward(e, lw->dt, gad->B, pgad->B, NULL, NULL, lw->dz, lw->t, ad->B, s, end, N, r);
    sum_linear_backward(e, dx, gad->A, pgad->A, NULL, NULL, lw->dt, x, ad->A, s, end, r, K);
}

/* ---- forward --------------------------------------------------------------------------------- */

/* K and V of rows [r0, r1) into the K/V side's rows r − lo: every row is its own chains (the
 * norm's, the products' and RoPE's), so any split of the rows gives the same bits. */
static void kv_forward_rows(const eng *e, layer_run *lr, int r0, int r1) {
    const sbp_ops *op = e->ops;
    const int C = e->C, KV = e->KV, n = r1 - r0;
    const layer_p *w = lr->w;
    kv_acts *a = lr->kv;
    norm_block *nb = lr->nb;
    const size_t off = (size_t)(r0 - a->lo);
    real *k = (a->kpre ? a->kpre : a->k) + off * KV, *v = a->v + off * KV;
    for (int b0 = r0, b1; b0 < r1; b0 = b1) { /* xn = rmsnorm(x, w_in), a block at a time */
        b1 = block_end(b0, r1, e->blk);
        const size_t o = (size_t)(b0 - r0) * KV;
        op->rmsnorm_forward(e, nb->xn, nb->rstd, row_of(e, lr->x, b0, C), w->in_norm, b1 - b0, C);
        proj_forward(e, lr->lw, k + o, nb->xn, w->wk, w->bk, &w->ak, b0, b1, KV, C);
        proj_forward(e, lr->lw, v + o, nb->xn, w->wv, w->bv, &w->av, b0, b1, KV, C);
    }
    if (a->kpre)
        op->rmsnorm_forward(e, a->k + off * KV, a->krstd + off * e->NKV, a->kpre + off * KV,
                            w->k_norm, n * e->NKV, e->HD);
    rope_fwd(e, lr, a->k + off * KV, r0, n, e->NKV);
}

void kv_forward(eng *e, layer_run *lr) {
    relay_flush_ahead(e); /* the rows posted last (relay_kv) taken before rewritten */
    lr->kv->lo = 0, lr->kv->hi = e->T;
    kv_forward_rows(e, lr, e->r0, e->r1);
    /* the earlier ranks' keys (sequence parallel), unless the later ranks kept this layer's */
    if (!lr->kv_kept) relay_kv(e, lr->kv->k, lr->kv->v, lr->relay_win);
}

void chunk_forward(const eng *e, layer_run *lr, int s, int end) {
    const sbp_ops *op = e->ops;
    const int M = end - s, C = e->C, Q = e->Q, F = e->F;
    const size_t MC = (size_t)M * C;
    const layer_p *w = lr->w;
    const real *x = row_of(e, lr->x, s, C);
    const chunk_acts a = rows_from(e, lr->acts, s);
    real *xn = lr->fm->t, *xn2 = lr->fm->t, *h = lr->fm->t, *rstd = lr->fm->rstd;
    op->rmsnorm_forward(e, xn, rstd, x, w->in_norm, M, C);
    real *q = a.qpre ? a.qpre : a.q;
    proj_forward(e, lr->lw, q, xn, w->wq, w->bq, &w->aq, s, end, Q, C);
    if (a.qpre) op->rmsnorm_forward(e, a.q, a.qrstd, a.qpre, w->q_norm, M * e->NH, e->HD);
    rope_fwd(e, lr, a.q, s, M, e->NH);
    const sbp_attn_dims ad = attn_dims(e, lr, s, M);
    op->attention_forward(e, a.o, a.lse, a.q, lr->kv->k, lr->kv->v, lr->kmask + lr->kv->lo, &ad);
    relay_progress(e); /* between the long calls: what other ranks wait on moves (relay.c) */
    /* x2 = x + o·Woᵀ (Gemma-3: x + rmsnorm(ao, w_post), ao = o·Woᵀ) */
    if (e->gemma) {
        proj_forward(e, lr->lw, a.ao, a.o, w->wo, NULL, &w->ao, s, end, C, Q);
        op->rmsnorm_forward(e, a.x2, a.aorstd, a.ao, w->post_norm, M, C);
    } else {
        proj_forward(e, lr->lw, a.x2, a.o, w->wo, NULL, &w->ao, s, end, C, Q);
    }
    op->add(e, a.x2, x, a.x2, MC);
    const real *w_mlp = e->gemma ? w->pre_ff_norm : w->post_norm;
    op->rmsnorm_forward(e, xn2, rstd, a.x2, w_mlp, M, C);
    proj_forward(e, lr->lw, a.g, xn2, w->wg, NULL, &w->ag, s, end, F, C);
    proj_forward(e, lr->lw, a.u, xn2, w->wu, NULL, &w->au, s, end, F, C);
    relay_progress(e);
    /* a recompute needs the activations, not the output (Gemma-3: mo too) */
    if (!lr->y && !e->gemma) return;
    /* y = x2 + h·Wdᵀ (Gemma-3: x2 + rmsnorm(mo, w_post_ff), mo = h·Wdᵀ) */
    act_forward(e, h, a.g, a.u, (size_t)M * F);
    real *y = lr->y ? row_mut(e, lr->y, s, C) : NULL;
    if (e->gemma) {
        proj_forward(e, lr->lw, a.mo, h, w->wd, NULL, &w->ad, s, end, C, F);
        /* a recompute needs the norm's rstd (its output goes to the formed rows, unused) */
        op->rmsnorm_forward(e, y ? y : h, a.morstd, a.mo, w->post_ff_norm, M, C);
        if (!y) return;
    } else {
        proj_forward(e, lr->lw, y, h, w->wd, NULL, &w->ad, s, end, C, F);
    }
    op->add(e, y, a.x2, y, MC);
}

/* ---- backward -------------------------------------------------------------------------------- */

void kv_begin_backward(const eng *e, layer_run *lr) {
    /* this rank's keys (all T in one process), the only ones it sums dK, dV of */
    const size_t n = (size_t)(e->r1 - e->r0) * e->KV;
    if (lr->kvw->dgin) e->ops->zero(e, lr->kvw->dgin, (size_t)e->C);
    if (lr->kvwin) return;
    e->ops->zero(e, lr->kvw->dk, n);
    e->ops->zero(e, lr->kvw->dv, n);
}

void chunk_backward(const eng *e, layer_run *lr, int s, int end) {
    const sbp_ops *op = e->ops;
    const int M = end - s, C = e->C, Q = e->Q, F = e->F;
    const size_t MC = (size_t)M * C, MF = (size_t)M * F, MQ = (size_t)M * Q;
    const layer_p *w = lr->w;
    layer_p *gw = lr->g;
    chunk_grads *d = lr->cg;
    const layer_p *pd = pend_of(lr);
    const chunk_acts a = rows_from(e, lr->acts, s);
    real *xn = lr->fm->t, *xn2 = lr->fm->t, *h = lr->fm->t, *rstd = lr->fm->rstd;
    const real *x = row_of(e, lr->x, s, C);
    real *dx = row_mut(e, lr->dx, s, C); /* dY on entry */
    op->zero(e, d->dh, MF), op->zero(e, d->dg, MF), op->zero(e, d->du, MF);
    op->zero(e, d->dxn2, MC), op->zero(e, d->dxn, MC), op->zero(e, d->dout, MQ);
    op->zero(e, d->dq, MQ);
    if (d->dqpre) op->zero(e, d->dqpre, MQ);
    /* y = x2 + h·Wdᵀ: dx2 = dy, dh = dy·Wd (the last reads of dy: dx is dy); Gemma-3:
     * y = x2 + rmsnorm(mo, w_post_ff), dmo through the norm, dh = dmo·Wd */
    op->copy(e, d->dx2, dx, MC);
    const real *dmo = dx;
    if (e->gemma) {
        op->zero(e, d->dmo, MC), op->zero(e, d->dao, MC);
        sum_norm_backward(e, d->dmo, gw->post_ff_norm, pd->post_ff_norm, dx, a.mo, a.morstd,
                          w->post_ff_norm, s, M, 1, C);
        dmo = d->dmo;
    }
    act_forward(e, h, a.g, a.u, MF); /* formed again */
    proj_backward(e, lr->lw, d->dh, gw->wd, NULL, &gw->ad, pd->wd, NULL, &pd->ad, dmo, h, w->wd,
                  &w->ad, s, end, C, F);
    relay_progress(e);
    /* h = silu(g) ⊙ u (Gemma-3: gelu_tanh) */
    act_backward(e, d->dg, d->du, d->dh, a.g, a.u, MF);
    /* g = xn2·Wgᵀ, u = xn2·Wuᵀ */
    const real *w_mlp = e->gemma ? w->pre_ff_norm : w->post_norm;
    real *g_mlp = e->gemma ? gw->pre_ff_norm : gw->post_norm;
    real *p_mlp = e->gemma ? pd->pre_ff_norm : pd->post_norm;
    op->rmsnorm_forward(e, xn2, rstd, a.x2, w_mlp, M, C); /* formed again */
    proj_backward(e, lr->lw, d->dxn2, gw->wg, NULL, &gw->ag, pd->wg, NULL, &pd->ag, d->dg, xn2,
                  w->wg, &w->ag, s, end, F, C);
    proj_backward(e, lr->lw, d->dxn2, gw->wu, NULL, &gw->au, pd->wu, NULL, &pd->au, d->du, xn2,
                  w->wu, &w->au, s, end, F, C);
    relay_progress(e);
    /* xn2 = rmsnorm(x2, w_post) (Gemma-3: w_pre_ff) */
    sum_norm_backward(e, d->dx2, g_mlp, p_mlp, d->dxn2, a.x2, rstd, w_mlp, s, M, 1, C);
    /* x2 = x + o·Woᵀ: the residual path is dx's first term, and dO (Gemma-3: through
     * rmsnorm(ao, w_post) first) */
    op->copy(e, dx, d->dx2, MC);
    const real *dao = d->dx2;
    if (e->gemma) {
        sum_norm_backward(e, d->dao, gw->post_norm, pd->post_norm, d->dx2, a.ao, a.aorstd,
                          w->post_norm, s, M, 1, C);
        dao = d->dao;
    }
    proj_backward(e, lr->lw, d->dout, gw->wo, NULL, &gw->ao, pd->wo, NULL, &pd->ao, dao, a.o, w->wo,
                  &w->ao, s, end, C, Q);
    /* o = attention(q, K, V); sequence parallel: dK, dV of this rank's keys only, the earlier
     * ranks' from the query side (key_rank_backward there) */
    sbp_attn_dims ad = attn_dims(e, lr, s, M);
    if (seq_shared(e)) ad.kv_lo = e->r0 - lr->kv->lo, ad.kv_hi = e->r1 - lr->kv->lo;
    sum_attention_backward(e, d->dq, lr->kvw->dk, lr->kvw->dv, lr->pd ? lr->pd->dk : NULL,
                           lr->pd ? lr->pd->dv : NULL, d->dsum, d->dout, a.o, a.lse, a.q, lr->kv->k,
                           lr->kv->v, lr->kmask + lr->kv->lo, &ad, lr->kv->lo, lr->kv->hi);
    relay_progress(e);
    if (lr->qs_mine) { /* before dq's RoPE backward: the queries' side as the kernel read it */
        const query_side *qs = lr->qs_mine;
        const size_t r = (size_t)(s - e->r0);
        op->copy(e, qs->q + r * Q, a.q, MQ), op->copy(e, qs->dout + r * Q, d->dout, MQ);
        op->copy(e, qs->lse + r * e->NH, a.lse, (size_t)M * e->NH);
        op->copy(e, qs->dsum + r * e->NH, d->dsum, (size_t)M * e->NH);
    }
    /* q = rope(q_norm(qpre)) */
    rope_bwd(e, lr, d->dq, s, M, e->NH);
    real *dqpre = d->dq;
    if (a.qpre) {
        sum_norm_backward(e, d->dqpre, gw->q_norm, pd->q_norm, d->dq, a.qpre, a.qrstd, w->q_norm, s,
                          M * e->NH, e->NH, e->HD);
        dqpre = d->dqpre;
    }
    /* qpre = xn·Wqᵀ + bq, xn = rmsnorm(x, w_in): the query path into dx */
    op->rmsnorm_forward(e, xn, rstd, x, w->in_norm, M, C); /* formed again */
    proj_backward(e, lr->lw, d->dxn, gw->wq, gw->bq, &gw->aq, pd->wq, pd->bq, &pd->aq, dqpre, xn,
                  w->wq, &w->aq, s, end, Q, C);
    sum_norm_backward(e, dx, gw->in_norm, pd->in_norm, d->dxn, x, rstd, w->in_norm, s, M, 1, C);
}

void key_rank_backward(const eng *e, layer_run *lr, int a, int b) {
    const query_side *qs = lr->qs_in;
    sbp_attn_dims ad = attn_dims(e, lr, a, b - a);
    ad.kv_lo = e->r0 - lr->kv->lo, ad.kv_hi = e->r1 - lr->kv->lo, ad.no_dq = 1, ad.dsum_in = 1;
    sum_attention_backward(e, NULL, lr->kvw->dk, lr->kvw->dv, lr->pd ? lr->pd->dk : NULL,
                           lr->pd ? lr->pd->dv : NULL, qs->dsum, qs->dout, NULL, qs->lse, qs->q,
                           lr->kv->k, lr->kv->v, lr->kmask + lr->kv->lo, &ad, lr->kv->lo,
                           lr->kv->hi);
}

/* The K/V path of keys [r0, r1) (rows r − lo of the K/V side, dK and dV complete): k =
 * rope(k_norm(kpre)), kpre = xn·Wkᵀ + bk, v = xn·Wvᵀ + bv, xn = rmsnorm(x, w_in), a token block
 * at a time with xn formed again, into dx. Calls over consecutive ranges that start on token
 * blocks give the bits of one call over their union (every chain runs over the rows in
 * ascending order; the fast mode's weight gradients per token block). On a local layer the
 * input norm's weight gradient of this path goes to kvw->dgin (kv_end_backward). */
static void kv_backward_rows(const eng *e, layer_run *lr, int r0, int r1) {
    const sbp_ops *op = e->ops;
    const int C = e->C, KV = e->KV, n = r1 - r0;
    const size_t nKV = (size_t)n * KV, off = (size_t)(r0 - lr->kv->lo) * KV;
    /* kv_work's rows: from the K/V side's first (lo), sequence parallel from this rank's */
    const size_t doff = (size_t)(r0 - (seq_shared(e) ? e->r0 : lr->kv->lo)) * KV;
    const layer_p *w = lr->w;
    layer_p *gw = lr->g;
    const layer_p *pd = pend_of(lr);
    kv_work *kvw = lr->kvw;
    const kv_acts *kv = lr->kv;
    norm_block *nb = lr->nb;
    real *dk = kvw->dk + doff, *dv = kvw->dv + doff;
    /* dK and dV were accumulated over every chunk that sees these keys: complete now */
    op->store(e, dk, nKV), op->store(e, dv, nKV);
    /* k = rope(k_norm(kpre)) */
    rope_bwd(e, lr, dk, r0, n, e->NKV);
    real *dkpre = dk;
    if (kv->kpre) {
        dkpre = kvw->dkpre + doff;
        op->zero(e, dkpre, nKV);
        sum_norm_backward(e, dkpre, gw->k_norm, pd->k_norm, dk, kv->kpre + off,
                          kv->krstd + (off / KV) * e->NKV, w->k_norm, r0, n * e->NKV, e->NKV,
                          e->HD);
    }
    real *g_in = lr->window && kvw->dgin ? (gw->in_norm ? kvw->dgin : NULL) : gw->in_norm;
    real *p_in = g_in && g_in == kvw->dgin ? (lr->pd ? lr->pd->dgin : NULL) : pd->in_norm;
    for (int b0 = r0, b1; b0 < r1; b0 = b1) {
        b1 = block_end(b0, r1, e->blk);
        const size_t nc = (size_t)(b1 - b0) * C, o = (size_t)(b0 - r0) * KV;
        const real *x_b = row_of(e, lr->x, b0, C);
        op->rmsnorm_forward(e, nb->xn, nb->rstd, x_b, w->in_norm, b1 - b0, C);
        op->zero(e, nb->dxn, nc);
        proj_backward(e, lr->lw, nb->dxn, gw->wk, gw->bk, &gw->ak, pd->wk, pd->bk, &pd->ak,
                      dkpre + o, nb->xn, w->wk, &w->ak, b0, b1, KV, C);
        proj_backward(e, lr->lw, nb->dxn, gw->wv, gw->bv, &gw->av, pd->wv, pd->bv, &pd->av, dv + o,
                      nb->xn, w->wv, &w->av, b0, b1, KV, C);
        sum_norm_backward(e, row_mut(e, lr->dx, b0, C), g_in, p_in, nb->dxn, x_b, nb->rstd,
                          w->in_norm, b0, b1 - b0, 1, C);
    }
}

void kv_backward(const eng *e, layer_run *lr) {
    kv_backward_rows(e, lr, e->r0, e->r1);
}

void kv_end_backward(const eng *e, layer_run *lr) {
    if (!lr->window || !lr->kvw->dgin || !lr->g->in_norm) return;
    /* dγ ← dγ + dγ_kv: one add per column; not rounded to bf16 here (a parameter gradient is
     * rounded where it is complete, as every other one) */
    eng raw = *e;
    raw.bf16 = 0;
    e->ops->add(&raw, lr->g->in_norm, lr->g->in_norm, lr->kvw->dgin, (size_t)e->C);
}

/* ---- the K/V side bounded by the window (engine.h, kv_window_*) ------------------------------ */

static int gcd(int a, int b) {
    while (b) {
        const int t = a % b;
        a = b, b = t;
    }
    return a;
}

int kv_grain(const eng *e) {
    /* the token block (the fast products' grid) and the attention tiles: the portable and CUDA
     * kernels' ATTN_TILE, the fast kernel's attention_tile(blk), a divisor of blk */
    const int blk = e->blk > 0 ? e->blk : 1;
    return blk / gcd(blk, ATTN_TILE) * ATTN_TILE;
}

int kv_rows(const eng *e, int window, int c) {
    if (window <= 0) return e->T;
    /* before chunk [s, s + c) the rows from the grain holding s − W + 1: at most
     * c + W − 1 + (grain − 1) */
    const long r = (long)c + window + kv_grain(e) - 2;
    return r < e->T ? (int)r : e->T;
}

int kv_window_next(const eng *e, int window, int end) {
    if (end >= e->T) return e->T;
    const int j = end - window + 1, g = kv_grain(e);
    return j <= 0 ? 0 : j / g * g;
}

void kv_window_begin(const eng *e, layer_run *lr) {
    (void)e;
    lr->kv->lo = lr->kv->hi = 0;
}

void kv_window_extend(const eng *e, layer_run *lr, int end, int backward) {
    kv_acts *a = lr->kv;
    if (end <= a->hi) return;
    const int r0 = a->hi;
    const size_t off = (size_t)(r0 - a->lo) * e->KV, n = (size_t)(end - r0) * e->KV;
    a->hi = end;
    kv_forward_rows(e, lr, r0, end);
    if (!backward) return;
    e->ops->zero(e, lr->kvw->dk + off, n);
    e->ops->zero(e, lr->kvw->dv + off, n);
    if (lr->pd) /* keys joining an open block of queries: nothing of it yet */
        e->ops->zero(e, lr->pd->dk + off, n), e->ops->zero(e, lr->pd->dv + off, n);
}

/* Rows [d, d + n) of buf (rows of `width`) down to row 0, as copies of at most d rows that do not
 * overlap (the op's copy is a memcpy). Not an operation on the values: no rounding. */
static void slide(const eng *e, real *buf, int d, int n, int width) {
    for (int r = 0; buf && r < n; r += d) {
        const int m = n - r < d ? n - r : d;
        e->ops->copy(e, buf + (size_t)r * width, buf + (size_t)(r + d) * width, (size_t)m * width);
    }
}

void kv_window_retire(const eng *e, layer_run *lr, int next, int backward) {
    kv_acts *a = lr->kv;
    if (next <= a->lo) return;
    const int d = next - a->lo, n = a->hi - next, KV = e->KV;
    /* the retiring keys' part of the open block of queries (the queries before hi are done, and
     * no later one sees them): complete, folded now, as the block's end would */
    if (backward && lr->pd && sum_block_open(e, a->hi)) {
        sum_fold_rows(e, lr->kvw->dk, lr->pd->dk, (size_t)d * KV);
        sum_fold_rows(e, lr->kvw->dv, lr->pd->dv, (size_t)d * KV);
    }
    if (backward) kv_backward_rows(e, lr, a->lo, next);
    slide(e, a->kpre, d, n, KV), slide(e, a->krstd, d, n, e->NKV);
    slide(e, a->k, d, n, KV), slide(e, a->v, d, n, KV);
    if (backward) slide(e, lr->kvw->dk, d, n, KV), slide(e, lr->kvw->dv, d, n, KV);
    if (backward && lr->pd) slide(e, lr->pd->dk, d, n, KV), slide(e, lr->pd->dv, d, n, KV);
    a->lo = next;
}
