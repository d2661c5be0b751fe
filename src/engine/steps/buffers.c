/* buffers.c — allocation of a layer's buffers through the op table, charged to the ledger. */
#include "../engine.h"

#include <stdio.h>
#include <string.h>

void *ealloc_bytes(eng *e, sbp_mem_cat cat, size_t bytes, const char *what) {
    return e->ops->alloc(e, cat, bytes, what);
}

real *ealloc(eng *e, sbp_mem_cat cat, size_t n, const char *what) {
    return ealloc_bytes(e, cat, (size_t)e->elem_bytes * n, what);
}

void efree(eng *e, void *p) {
    if (p) e->ops->free(e, p);
}

int kv_acts_alloc(eng *e, kv_acts *a, int rows, sbp_mem_cat cat) {
    const size_t T = (size_t)rows;
    memset(a, 0, sizeof *a);
    a->hi = a->rows = rows;
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

int chunk_acts_alloc(eng *e, chunk_acts *a, int rows, sbp_mem_cat cat) {
    const size_t n = (size_t)rows;
    memset(a, 0, sizeof *a);
    a->rows = rows;
    if (e->cfg->qk_norm) {
        a->qpre = ealloc(e, cat, n * e->Q, "q before q_norm");
        a->qrstd = ealloc(e, cat, n * e->NH, "q_norm rstd");
    }
    a->q = ealloc(e, cat, n * e->Q, "queries");
    a->o = ealloc(e, cat, n * e->Q, "attention output");
    a->lse = ealloc(e, cat, n * e->NH, "attention lse");
    a->x2 = ealloc(e, cat, n * e->C, "attention residual");
    a->g = ealloc(e, cat, n * e->F, "gate projection");
    a->u = ealloc(e, cat, n * e->F, "up projection");
    if (e->gemma) {
        a->ao = ealloc(e, cat, n * e->C, "attention output projection");
        a->aorstd = ealloc(e, cat, n, "post-attention norm rstd");
        a->mo = ealloc(e, cat, n * e->C, "MLP output");
        a->morstd = ealloc(e, cat, n, "post-feedforward norm rstd");
    }
    if (e->oom) chunk_acts_free(e, a);
    return !e->oom;
}

void chunk_acts_free(eng *e, chunk_acts *a) {
    efree(e, a->qpre), efree(e, a->qrstd), efree(e, a->q), efree(e, a->o), efree(e, a->lse);
    efree(e, a->x2), efree(e, a->g), efree(e, a->u);
    efree(e, a->ao), efree(e, a->aorstd), efree(e, a->mo), efree(e, a->morstd);
    memset(a, 0, sizeof *a);
}

int chunk_formed_alloc(eng *e, chunk_formed *f, int c) {
    const size_t n = (size_t)c, w = (size_t)(e->C > e->F ? e->C : e->F);
    memset(f, 0, sizeof *f);
    f->t = ealloc(e, SBP_MEM_LAYER, n * w, "norm or MLP activation rows");
    f->rstd = ealloc(e, SBP_MEM_LAYER, n, "norm rstd rows");
    if (e->oom) chunk_formed_free(e, f);
    return !e->oom;
}

void chunk_formed_free(eng *e, chunk_formed *f) {
    efree(e, f->t), efree(e, f->rstd);
    memset(f, 0, sizeof *f);
}

int chunk_grads_alloc(eng *e, chunk_grads *d, int c) {
    const size_t n = (size_t)c;
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
    if (e->gemma) {
        d->dao = ealloc(e, SBP_MEM_LAYER, n * e->C, "post-attention norm input gradient");
        d->dmo = ealloc(e, SBP_MEM_LAYER, n * e->C, "post-feedforward norm input gradient");
    }
    if (e->oom) chunk_grads_free(e, d);
    return !e->oom;
}

void chunk_grads_free(eng *e, chunk_grads *d) {
    efree(e, d->dh), efree(e, d->dg), efree(e, d->du), efree(e, d->dxn2), efree(e, d->dx2);
    efree(e, d->dxn), efree(e, d->dout), efree(e, d->dq), efree(e, d->dqpre), efree(e, d->dsum);
    efree(e, d->dao), efree(e, d->dmo);
    memset(d, 0, sizeof *d);
}

int kv_work_alloc(eng *e, kv_work *d, int rows) {
    const size_t T = (size_t)rows;
    memset(d, 0, sizeof *d);
    d->dk = ealloc(e, SBP_MEM_LAYER, T * e->KV, "key gradient");
    d->dv = ealloc(e, SBP_MEM_LAYER, T * e->KV, "value gradient");
    if (e->cfg->qk_norm) d->dkpre = ealloc(e, SBP_MEM_LAYER, T * e->KV, "k_norm input gradient");
    if (e->gemma && !e->lora_r) /* with an adapter the norm is frozen: no gradient */
        d->dgin = ealloc(e, SBP_MEM_LAYER, (size_t)e->C, "input-norm K/V-path gradient");
    if (e->oom) kv_work_free(e, d);
    return !e->oom;
}

void kv_work_free(eng *e, kv_work *d) {
    efree(e, d->dk), efree(e, d->dv), efree(e, d->dkpre), efree(e, d->dgin);
    memset(d, 0, sizeof *d);
}

int query_side_alloc(eng *e, query_side *qs, int rows, int piece) {
    const size_t R = (size_t)rows;
    memset(qs, 0, sizeof *qs);
    qs->rows = rows, qs->piece = piece;
    qs->q = ealloc(e, SBP_MEM_LAYER, R * e->Q, "query side: queries");
    qs->dout = ealloc(e, SBP_MEM_LAYER, R * e->Q, "query side: attention output gradient");
    qs->lse = ealloc(e, SBP_MEM_LAYER, R * e->NH, "query side: log-sum-exp");
    qs->dsum = ealloc(e, SBP_MEM_LAYER, R * e->NH, "query side: rowsum(dO * O)");
    if (e->oom) query_side_free(e, qs);
    return !e->oom;
}

void query_side_free(eng *e, query_side *qs) {
    efree(e, qs->q), efree(e, qs->dout), efree(e, qs->lse), efree(e, qs->dsum);
    memset(qs, 0, sizeof *qs);
}

int lora_work_alloc(eng *e, lora_work *lw, int rows) {
    memset(lw, 0, sizeof *lw);
    if (!e->lora_r) return 1;
    int n = e->Q > e->KV ? e->Q : e->KV;
    n = n > e->C ? n : e->C;
    n = n > e->F ? n : e->F;
    lw->rows = rows;
    lw->t = ealloc(e, SBP_MEM_LAYER, (size_t)rows * e->lora_r, "adapter activation x·Aᵀ");
    lw->dt = ealloc(e, SBP_MEM_LAYER, (size_t)rows * e->lora_r, "adapter activation gradient");
    lw->z = ealloc(e, SBP_MEM_LAYER, (size_t)rows * n, "adapter output");
    lw->dz = ealloc(e, SBP_MEM_LAYER, (size_t)rows * n, "adapter output gradient");
    if (e->oom) lora_work_free(e, lw);
    return !e->oom;
}

void lora_work_free(eng *e, lora_work *lw) {
    efree(e, lw->t), efree(e, lw->dt), efree(e, lw->z), efree(e, lw->dz);
    memset(lw, 0, sizeof *lw);
}

int norm_block_alloc(eng *e, norm_block *nb) {
    const size_t b = (size_t)(e->blk < e->T ? e->blk : e->T);
    memset(nb, 0, sizeof *nb);
    nb->xn = ealloc(e, SBP_MEM_LAYER, b * e->C, "input-norm block");
    nb->dxn = ealloc(e, SBP_MEM_LAYER, b * e->C, "input-norm block gradient");
    nb->rstd = ealloc(e, SBP_MEM_LAYER, b, "input-norm block rstd");
    if (e->oom) norm_block_free(e, nb);
    return !e->oom;
}

void norm_block_free(eng *e, norm_block *nb) {
    efree(e, nb->xn), efree(e, nb->dxn), efree(e, nb->rstd);
    memset(nb, 0, sizeof *nb);
}
