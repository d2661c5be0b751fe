/* entry.c — the engine's entry point for one precision: picks the op table, puts the model, the
 * gradients and the batch on the backend, builds the run context (weight and gradient views,
 * RoPE tables, workspace), runs the driver and brings the gradients back. Compiled twice;
 * SBP_ENTRY gives the float and double copies distinct names. */
#include "../core/err.h"
#include "engine.h"
#include "entry.h"
#include "fold.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The table a run computes with: a device's, or the CPU's of its numerics. */
static const sbp_ops *run_table(const sbp_engine_opts *o) {
    if (o->device_ops) return o->device_ops;
    return o->numerics == SBP_NUMERICS_PORTABLE ? &sbp_ops_cpu_portable : &sbp_ops_cpu_fast;
}

static const sbp_ops *table_of(const sbp_engine_opts *o) {
    return o->plan ? &sbp_ops_plan : run_table(o);
}

/* tgt[b·T + t] = labels[b][t+1] (HF shifts inside the loss), −1 where nothing is predicted. */
static int32_t *targets(const sbp_batch *b) {
    const int T = b->T;
    int32_t *tgt = malloc(sizeof *tgt * (size_t)b->B * T);
    for (int bi = 0; tgt && bi < b->B; bi++)
        for (int t = 0; t < T; t++) {
            const int32_t y = t + 1 < T ? b->labels[(size_t)bi * T + t + 1] : SBP_IGNORE;
            tgt[(size_t)bi * T + t] = y == SBP_IGNORE ? -1 : y;
        }
    return tgt;
}

/* The weights' and gradients' views of every layer, the embedding, the final norm and the
 * head (a tied head is the embedding); a NULL slab gives NULL views. */
static void point_views(eng *e, layer_p *lw, layer_p *lgv, /* (L) each */
                        real *w, real *aw, real *gbase, real *gad, const sbp_model *m,
                        const sbp_lora *lora) {
    for (int l = 0; l < m->cfg.layers; l++) {
        layer_views(&lw[l], w, 0, &m->params, l);
        layer_views(&lgv[l], gbase, 0, &m->params, l);
        if (lora) {
            adapter_views(&lw[l], aw, 0, &lora->params, l);
            adapter_views(&lgv[l], gad, 0, &lora->params, l);
        }
    }
    e->w = lw, e->g = lgv;
    e->emb = slab_view(w, 0, &m->params, SBP_P_EMBED, -1);
    e->gemb = slab_view(gbase, 0, &m->params, SBP_P_EMBED, -1);
    e->fnorm = slab_view(w, 0, &m->params, SBP_P_FINAL_NORM, -1);
    e->gfnorm = slab_view(gbase, 0, &m->params, SBP_P_FINAL_NORM, -1);
    e->head = m->cfg.tied ? e->emb : slab_view(w, 0, &m->params, SBP_P_LM_HEAD, -1);
    e->ghead = m->cfg.tied ? e->gemb : slab_view(gbase, 0, &m->params, SBP_P_LM_HEAD, -1);
}

/* SBP_ENTRY (src/kernels/real.h) names the two definitions, one per build of this file:
 *   sbp_status sbp_engine_grad_f32(double *loss, void *grads, ...)   real = float
 *   sbp_status sbp_engine_grad_f64(double *loss, void *grads, ...)   real = double */
sbp_status SBP_ENTRY(sbp_engine_grad)(double *loss, void *grads, const sbp_model *m,
                                      const sbp_batch *b, const sbp_engine_opts *o, sbp_ledger *lg,
                                      sbp_err *err) {
    const sbp_config *c = &m->cfg;
    const int profiled = o->profile && !o->plan;
    eng e = {.ops = profiled ? &sbp_ops_profiled : table_of(o),
             .inner = table_of(o),
             .planned = o->plan ? run_table(o) : NULL,
             .prof = profiled ? o->profile : NULL,
             .cfg = c,
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
             .elem_bytes = o->plan ? o->elem_bytes : (int)sizeof(real),
             .bf16 = o->emulate_bf16,
             .portable = o->numerics == SBP_NUMERICS_PORTABLE,
             /* Gemma-3 never unmasks a row without a key, under sdpa either (4.51.3's
              * Gemma3TextModel has no _unmask_unattended): such a row is uniform as in eager */
             .unattended = c->family == SBP_GEMMA3 && o->unattended == SBP_UNATTENDED_HF_SDPA
                               ? SBP_UNATTENDED_HF_EAGER
                               : (int)o->unattended,
             /* hd^(-1/2) as HF forms it (`head_dim ** -0.5`, a Python double, used in the
              * compute dtype): 1/sqrt(hd) in double, the kernels round it to real once
              * ((real)sbp_attn_dims.scale, on the CPU and in cuda/ alike: `1 / sqrt((real)hd)`
              * gave different float32 bits in C and C++ for 151 head sizes up to 512) */
             .attn_scale = 1.0 / sqrt((double)c->head_dim),
             .lora_r = o->lora ? o->lora->cfg.r : 0,
             .lora_s = o->lora ? (real)sbp_lora_scaling(&o->lora->cfg) : 0,
             .lg = lg,
             .link = o->link,
             .seq_overlap = o->seq_overlap,
             .r0 = 0,
             .r1 = b->T};
    const sbp_ops *op = e.ops;
    const sbp_params *gps = o->lora ? &o->lora->params : &m->params; /* what the grads hold */
    const size_t BT = (size_t)b->B * b->T, n_params = (size_t)gps->total;
    const size_t slab = (size_t)e.elem_bytes * n_params;
    const size_t wslab = (size_t)e.elem_bytes * (size_t)m->params.total;
    char msg[640] = "";
    e.gemma = c->family == SBP_GEMMA3;
    if (e.gemma && !e.inner->geglu_forward) /* the timing table has every operation */
        return sbp_fail(err, SBP_EUSAGE, "%s: Gemma-3 does not run on this backend yet",
                        e.inner->name);
    int bounds[SBP_SEQ_MAX + 1];
    if (o->link) {
        const int S = o->link->size, grain = seq_grain(e.portable, e.blk);
        if (!o->fold || o->logp_out || S < 1 || S > SBP_SEQ_MAX || o->link->rank < 0 ||
            o->link->rank >= S)
            return sbp_fail(err, SBP_EUSAGE,
                            "sequence parallel: a gradient step with the fold, "
                            "at most %d ranks (internal)",
                            SBP_SEQ_MAX);
        /* --seq-overlap, the speed mode: the rows cut by work (the causal triangle) */
        if (!(o->seq_overlap ? sbp_seq_slices_by_work(bounds, c, b->T, S, grain)
                             : sbp_seq_slices(bounds, b->T, S, grain))) /* refused before */
            return sbp_fail(err, SBP_EUSAGE,
                            "T = %d is too short to share among %d ranks in blocks of %d tokens",
                            b->T, S, grain);
        e.bounds = bounds;
        e.r0 = bounds[o->link->rank], e.r1 = bounds[o->link->rank + 1];
    }
    if (!op->begin(&e, msg, sizeof msg))
        return sbp_fail(err, SBP_EUSAGE, "%s: %s", e.inner->name, msg);
    int32_t *h_tgt = targets(b);
    /* the model, the gradients and the batch on the backend */
    real *w = op->mirror(&e, SBP_MEM_WEIGHTS, m->w, wslab, "weights");
    real *aw = o->lora ? op->mirror(&e, SBP_MEM_WEIGHTS, o->lora->w, slab, "adapter") : NULL;
    real *g = grads ? op->mirror(&e, SBP_MEM_GRADS, grads, slab, "gradients") : NULL;
    e.ids = op->mirror(&e, SBP_MEM_LOGITS, b->ids, sizeof(int32_t) * BT, "input ids");
    e.mask = op->mirror(&e, SBP_MEM_LOGITS, b->mask, BT, "attention mask");
    e.tgt = h_tgt ? op->mirror(&e, SBP_MEM_LOGITS, h_tgt, sizeof(int32_t) * BT, "targets") : NULL;
    double *logp =
        o->logp_out ? op->mirror(&e, SBP_MEM_LOGITS, o->logp_out, sizeof(double) * BT, "log-probs")
                    : NULL;
    layer_p *lw = calloc((size_t)c->layers, sizeof *lw),
            *lgv = calloc((size_t)c->layers, sizeof *lgv);
    real *cos_t = NULL, *sin_t = NULL;
    struct grad_fold fold = {0};
    int ok = 0, hook_failed = 0;
    if (!h_tgt || !lw || !lgv) e.oom = 1;
    if (e.oom) goto out;
    /* with adapters the base model is frozen: its gradient views stay NULL; in a fold they are
     * pointed at the scratch bucket by bucket (fold.h) */
    real *gbase = o->lora || o->fold ? NULL : g, *gad = o->fold ? NULL : g;
    point_views(&e, lw, lgv, w, aw, gbase, gad, m, o->lora);
    /* with a bucket hook there may be no slab: every bucket goes to the hook */
    if (o->fold && (g || o->bucket_hook) &&
        !fold_begin(&e, &fold, m, o->lora, g, o->bucket_hook, o->hook_ctx))
        goto out;

    e.ws = ealloc(&e, SBP_MEM_LAYER, op->workspace(&e), "product workspace");
    const size_t half = (size_t)b->T * (c->head_dim / 2);
    cos_t = ealloc(&e, SBP_MEM_LAYER, half, "RoPE cos table");
    sin_t = ealloc(&e, SBP_MEM_LAYER, half, "RoPE sin table");
    if (e.oom) goto out;
    op->rope_table(&e, cos_t, sin_t);
    e.cos = cos_t, e.sin = sin_t;
    if (!gemma_begin(&e)) goto out; /* after the views: it points the norms at 1 + w */
    head_opts h = {.rows = o->logit_chunk,
                   .materialise = o->materialise,
                   .ev = o->ev,
                   .inv_tau = o->logp_out ? o->inv_tau : o->ev->inv_tau};
    if (logp) {
        ok = drive_logprobs(&e, logp, b, o->chunk, &h);
        if (ok) op->download(&e, o->logp_out, logp, sizeof(double) * BT);
    } else {
        ok = drive(&e, loss, b, sched_row_of(o->schedule), o->chunk, &h);
        if (fold.failed) hook_failed = 1, ok = 0; /* the hook's failure comes first */
        if (ok && g) {
            op->store(&e, g, n_params); /* bf16 .grad tensors */
            op->download(&e, grads, g, slab);
        }
    }
out:
    relay_flush(&e); /* before the buffers a posted message reads are freed */
    if (e.fold) fold_end(&e, &fold);
    gemma_end(&e);
    efree(&e, e.ws), efree(&e, cos_t), efree(&e, sin_t);
    free(lw), free(lgv);
    if (logp) op->unmirror(&e, logp, o->logp_out);
    if (e.tgt) op->unmirror(&e, (void *)e.tgt, h_tgt);
    if (e.mask) op->unmirror(&e, (void *)e.mask, b->mask);
    if (e.ids) op->unmirror(&e, (void *)e.ids, b->ids);
    if (g) op->unmirror(&e, g, grads);
    if (aw) op->unmirror(&e, aw, o->lora->w);
    if (w) op->unmirror(&e, w, m->w);
    free(h_tgt);
    if (!op->end(&e, msg, sizeof msg)) return sbp_fail(err, SBP_EIO, "%s: %s", e.inner->name, msg);
    if (hook_failed) return sbp_fail(err, SBP_EIO, "a gradient bucket could not be handed on");
    if (e.link_failed) /* the link's provider has the transport's own error */
        return sbp_fail(err, SBP_EPEER, "a rank of the sequence group could not be reached");
    if (!ok)
        return sbp_fail(err, SBP_ENOMEM, "out of memory allocating the %s (%s schedule, T = %d)",
                        e.oom_what[0] ? e.oom_what : "engine's tables",
                        sbp_schedule_name(o->schedule), b->T);
    return SBP_OK;
}

/* relay.c's grain, for the layers above (entry.h); SBP_ENTRY names the two copies:
 *   int sbp_engine_seq_grain_f32(int portable, int block)
 *   int sbp_engine_seq_grain_f64(int portable, int block) */
int SBP_ENTRY(sbp_engine_seq_grain)(int portable, int block) {
    return seq_grain(portable, block);
}
