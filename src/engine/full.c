/* full.c — full backprop: the forward keeps every activation of every layer for all T tokens,
 * and the backward runs from what was kept. One chunk per layer, nothing recomputed. */
#include "engine.h"

#include <stdlib.h>

int schedule_full(eng *e, double *loss, const sbp_batch *b, const sched_opts *o) {
    const int B = b->B, L = e->L;
    const size_t TC = (size_t)e->T * e->C, BTC = (size_t)B * TC;
    int ok = 0;
    kv_acts *kv = calloc((size_t)L * B, sizeof *kv);
    chunk_acts *ca = calloc((size_t)L * B, sizeof *ca);
    real *xs = ealloc(e, SBP_MEM_ACTIVATIONS, (size_t)(L + 1) * BTC, "layer inputs"); /* x_0..x_L */
    real *attn = ealloc(e, SBP_MEM_LAYER, attention_scratch(e->blk, e->HD), "attention scratch");
    real *dy = NULL, *dx = NULL;
    kv_work kvw = {0};
    chunk_grads cg = {0};
    if (!kv || !ca || e->oom) goto out;

    embed_forward(e, xs, b);
    for (int l = 0; l < L; l++)
        for (int bi = 0; bi < B; bi++) {
            kv_acts *k = &kv[(size_t)l * B + bi];
            chunk_acts *a = &ca[(size_t)l * B + bi];
            if (!kv_acts_alloc(e, k, SBP_MEM_ACTIVATIONS) ||
                !chunk_acts_alloc(e, a, e->T, SBP_MEM_ACTIVATIONS))
                goto out;
            const real *x = xs + (size_t)l * BTC + bi * TC;
            layer_forward_whole(e, a, k, attn, xs + (size_t)(l + 1) * BTC + bi * TC, x, &e->w[l],
                                b->mask + (size_t)bi * e->T);
        }
    efree(e, attn);
    attn = NULL;

    dy = ealloc(e, SBP_MEM_LAYER, BTC, "layer output gradient");
    dx = ealloc(e, SBP_MEM_LAYER, BTC, "layer input gradient");
    if (e->oom || !run_head(e, loss, dy, xs + (size_t)L * BTC, b, o)) goto out;
    if (!kv_work_alloc(e, &kvw) || !chunk_grads_alloc(e, &cg, e->T)) goto out;
    for (int l = L - 1; l >= 0; l--) {
        zero_reals(e, dx, BTC);
        for (int bi = 0; bi < B; bi++) {
            kv_acts *k = &kv[(size_t)l * B + bi];
            chunk_acts *a = &ca[(size_t)l * B + bi];
            layer_backward_whole(e, dx + bi * TC, &kvw, &cg, &e->g[l], dy + bi * TC, a, k,
                                 xs + (size_t)l * BTC + bi * TC, &e->w[l],
                                 b->mask + (size_t)bi * e->T);
            kv_acts_free(e, k); /* freed as autograd frees a layer's saved tensors */
            chunk_acts_free(e, a);
        }
        real *t = dy;
        dy = dx;
        dx = t;
    }
    embed_backward(e, dy, b);
    ok = 1;
out:
    for (size_t i = 0; kv && ca && i < (size_t)L * B; i++)
        kv_acts_free(e, &kv[i]), chunk_acts_free(e, &ca[i]);
    free(kv);
    free(ca);
    kv_work_free(e, &kvw);
    chunk_grads_free(e, &cg);
    efree(e, attn), efree(e, dy), efree(e, dx), efree(e, xs);
    return ok && !e->oom;
}
