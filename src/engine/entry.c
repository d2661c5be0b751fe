/* entry.c — the engine's entry point for one precision: builds the run context (weight and
 * gradient views, RoPE tables), runs the chosen schedule, and checks the result is finite.
 * Compiled twice; SBP_ENTRY gives the float and double copies distinct names. */
#include "engine.h"
#include "entry.h"
#include "../core/err.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* A tensor of the slab; NULL when the family has none, or when there is no slab (a forward-only
 * run has no gradients). */
static real *view(real *slab, const sbp_params *ps, sbp_param_kind kind, int layer) {
    int64_t off = sbp_params_offset(ps, kind, layer);
    return off < 0 || !slab ? NULL : slab + off;
}

static void layer_views(layer_p *lp, real *slab, const sbp_params *ps, int l) {
    lp->wq = view(slab, ps, SBP_P_Q, l), lp->bq = view(slab, ps, SBP_P_QB, l);
    lp->wk = view(slab, ps, SBP_P_K, l), lp->bk = view(slab, ps, SBP_P_KB, l);
    lp->wv = view(slab, ps, SBP_P_V, l), lp->bv = view(slab, ps, SBP_P_VB, l);
    lp->wo = view(slab, ps, SBP_P_O, l);
    lp->q_norm = view(slab, ps, SBP_P_QNORM, l), lp->k_norm = view(slab, ps, SBP_P_KNORM, l);
    lp->wg = view(slab, ps, SBP_P_GATE, l), lp->wu = view(slab, ps, SBP_P_UP, l);
    lp->wd = view(slab, ps, SBP_P_DOWN, l);
    lp->in_norm = view(slab, ps, SBP_P_IN_NORM, l);
    lp->post_norm = view(slab, ps, SBP_P_POST_NORM, l);
}

sbp_status SBP_ENTRY(sbp_engine_grad)(double *loss, void *grads, const sbp_model *m,
                                      const sbp_batch *b, const sbp_engine_opts *o, sbp_ledger *lg,
                                      sbp_err *err) {
    const sbp_config *c = &m->cfg;
    eng e = {.cfg = c,
             .C = c->hidden,
             .Q = c->heads * c->head_dim,
             .KV = c->kv_heads * c->head_dim,
             .F = c->ffn,
             .V = c->vocab,
             .NH = c->heads,
             .NKV = c->kv_heads,
             .HD = c->head_dim,
             .L = c->layers,
             .blk = o->block,
             .T = b->T,
             .lg = lg,
             .plan = o->plan,
             .elem_bytes = o->plan ? o->elem_bytes : (int)sizeof(real),
             .bf16 = o->emulate_bf16};
    real *w = m->w, *g = grads;
    layer_p lw[c->layers], lgv[c->layers]; /* (L) weight and gradient views */
    for (int l = 0; l < c->layers; l++) {
        layer_views(&lw[l], w, &m->params, l);
        layer_views(&lgv[l], g, &m->params, l);
    }
    e.w = lw, e.g = lgv;
    e.emb = view(w, &m->params, SBP_P_EMBED, -1), e.gemb = view(g, &m->params, SBP_P_EMBED, -1);
    e.fnorm = view(w, &m->params, SBP_P_FINAL_NORM, -1);
    e.gfnorm = view(g, &m->params, SBP_P_FINAL_NORM, -1);
    e.head = c->tied ? e.emb : view(w, &m->params, SBP_P_LM_HEAD, -1);
    e.ghead = c->tied ? e.gemb : view(g, &m->params, SBP_P_LM_HEAD, -1);

    size_t half = (size_t)b->T * (c->head_dim / 2);
    real *cos_t = ealloc(&e, SBP_MEM_LAYER, half, "RoPE cos table");
    real *sin_t = ealloc(&e, SBP_MEM_LAYER, half, "RoPE sin table");
    int ok = 0;
    if (!e.oom) {
        if (!e.plan)
            rope_table(cos_t, sin_t, b->T, c->head_dim, c->rope_theta, c->rope_llama3,
                       c->rope_factor, c->rope_low_freq, c->rope_high_freq, c->rope_orig_max);
        e.cos = cos_t, e.sin = sin_t;
        sched_opts so = {.chunk = o->chunk,
                         .logit_rows = o->logit_chunk,
                         .materialise = o->materialise,
                         .ev = o->ev,
                         .needs_logps = o->needs_logps,
                         .inv_tau = o->inv_tau};
        if (o->logp_out)
            ok = schedule_forward(&e, o->logp_out, b, &so);
        else if (o->schedule == SBP_FULL)
            ok = schedule_full(&e, loss, b, &so);
        else if (o->schedule == SBP_CKPT)
            ok = schedule_ckpt(&e, loss, b, &so);
        else
            ok = schedule_stream(&e, loss, b, &so);
    }
    efree(&e, cos_t), efree(&e, sin_t);
    if (!ok)
        return sbp_fail(err, SBP_ENOMEM, "out of memory allocating the %s (%s schedule, T = %d)",
                        e.oom_what, sbp_schedule_name(o->schedule), b->T);
    if (e.plan || o->logp_out) return SBP_OK;
    if (e.bf16) round_to_bf16(g, (size_t)m->params.total); /* bf16 .grad tensors */
    if (!isfinite(*loss)) return sbp_fail(err, SBP_ENUMERIC, "the loss is not finite (%g)", *loss);
    for (int i = 0; i < m->params.n; i++) {
        const sbp_param *p = &m->params.p[i];
        for (int64_t j = 0; j < p->numel; j++)
            if (!isfinite(g[p->offset + j]))
                return sbp_fail(err, SBP_ENUMERIC,
                                "the gradient of \"%s\" is not finite at element %lld (%g)",
                                p->name, (long long)j, (double)g[p->offset + j]);
    }
    return SBP_OK;
}
