/* steps.c — pieces the three schedules share: the embedding at both ends of the network, the
 * head with its logits buffer, and a whole layer (one chunk of T rows) forward and backward. */
#include "engine.h"

#include <string.h>

void zero_reals(const eng *e, real *p, size_t n) {
    if (!e->plan) memset(p, 0, sizeof(real) * n);
}

void kv_begin_backward(const eng *e, kv_work *kvw) {
    if (e->plan) return;
    const size_t TKV = (size_t)e->T * e->KV;
    memset(kvw->dk, 0, sizeof(real) * TKV);
    memset(kvw->dv, 0, sizeof(real) * TKV);
}

void embed_forward(const eng *e, real *x0, const sbp_batch *b) {
    if (e->plan) return;
    for (int bi = 0; bi < b->B; bi++)
        embedding_forward(x0 + (size_t)bi * e->T * e->C, b->ids + (size_t)bi * e->T, e->emb, e->T,
                          e->C);
}

void embed_backward(eng *e, const real *dx0, const sbp_batch *b) {
    if (e->plan) return;
    for (int bi = 0; bi < b->B; bi++)
        embedding_backward(e->gemb, dx0 + (size_t)bi * e->T * e->C, b->ids + (size_t)bi * e->T,
                           e->T, e->C);
}

int run_head(eng *e, double *loss, real *dh, const real *hL, const sbp_batch *b,
             const sched_opts *o) {
    const size_t V = (size_t)e->V;
    size_t n = o->materialise ? (size_t)b->B * e->T * V : (size_t)o->logit_rows * V;
    real *logits = ealloc(e, SBP_MEM_LOGITS, n, o->materialise ? "logits (B·T·V)" : "logits chunk");
    if (!logits) return 0;
    int rows = o->materialise ? e->T : o->logit_rows;
    size_t stride = o->materialise ? (size_t)e->T * V : 0;
    int ok = head_step(e, loss, dh, hL, b, logits, stride, rows, o->ev, o->needs_logps);
    efree(e, logits);
    return ok;
}

void layer_forward_whole(const eng *e, chunk_acts *a, kv_acts *kv, layer_scratch *sc, real *y,
                         const real *x, const layer_p *w, const uint8_t *kmask) {
    kv_forward(e, kv, sc, x, w);
    chunk_forward(e, a, y, sc, x, kv, w, kmask, 0, e->T);
}

void layer_backward_whole(const eng *e, real *dx, kv_work *kvw, chunk_grads *cg, layer_scratch *sc,
                          layer_p *gw, const real *dy, const chunk_acts *a, const kv_acts *kv,
                          const real *x, const layer_p *w, const uint8_t *kmask) {
    kv_begin_backward(e, kvw);
    chunk_backward(e, dx, kvw, gw, cg, sc, dy, a, kv, x, w, kmask, 0, e->T);
    kv_backward(e, dx, gw, kvw, sc, kv, x, w);
}
