/* full.c — full backprop: the forward keeps every activation of every layer for all T tokens,
 * and the backward runs from what was kept. One chunk per layer; nothing is recomputed but the
 * input norm's output, which every schedule forms a block at a time (engine.h). */
#include "engine.h"

#include <stdlib.h>

int schedule_full(eng *e, double *loss, const sbp_batch *b, const sched_opts *o) {
    const int B = b->B, L = e->L;
    const size_t TC = (size_t)e->T * e->C, BTC = (size_t)B * TC;
    int ok = 0;
    kv_acts *kv = calloc((size_t)L * B, sizeof *kv);
    chunk_acts *ca = calloc((size_t)L * B, sizeof *ca);
    real *xs = ealloc(e, SBP_MEM_ACTIVATIONS, (size_t)L * BTC, "layer inputs"); /* x_0..x_{L-1} */
    real *xL = ealloc(e, SBP_MEM_ACTIVATIONS, BTC, "final hidden state");
    real *g = NULL; /* the gradient flowing down, updated in place layer by layer */
    layer_scratch sc = {0};
    kv_work kvw = {0};
    chunk_grads cg = {0};
    if (!kv || !ca || e->oom || !layer_scratch_alloc(e, &sc)) goto out;

    embed_forward(e, xs, b);
    for (int l = 0; l < L; l++)
        for (int bi = 0; bi < B; bi++) {
            kv_acts *k = &kv[(size_t)l * B + bi];
            chunk_acts *a = &ca[(size_t)l * B + bi];
            if (!kv_acts_alloc(e, k, SBP_MEM_ACTIVATIONS) ||
                !chunk_acts_alloc(e, a, e->T, SBP_MEM_ACTIVATIONS))
                goto out;
            real *y = (l + 1 < L ? xs + (size_t)(l + 1) * BTC : xL) + bi * TC;
            layer_forward_whole(e, a, k, &sc, y, xs + (size_t)l * BTC + bi * TC, &e->w[l],
                                b->mask + (size_t)bi * e->T);
        }

    g = ealloc(e, SBP_MEM_LAYER, BTC, "hidden-state gradient");
    if (e->oom || !run_head(e, loss, g, xL, b, o)) goto out;
    efree(e, xL);
    xL = NULL;
    if (!kv_work_alloc(e, &kvw) || !chunk_grads_alloc(e, &cg, e->T)) goto out;
    for (int l = L - 1; l >= 0; l--)
        for (int bi = 0; bi < B; bi++) {
            kv_acts *k = &kv[(size_t)l * B + bi];
            chunk_acts *a = &ca[(size_t)l * B + bi];
            layer_backward_whole(e, g + bi * TC, &kvw, &cg, &sc, &e->g[l], g + bi * TC, a, k,
                                 xs + (size_t)l * BTC + bi * TC, &e->w[l],
                                 b->mask + (size_t)bi * e->T);
            kv_acts_free(e, k); /* freed as autograd frees a layer's saved tensors */
            chunk_acts_free(e, a);
        }
    embed_backward(e, g, b);
    ok = 1;
out:
    for (size_t i = 0; kv && ca && i < (size_t)L * B; i++)
        kv_acts_free(e, &kv[i]), chunk_acts_free(e, &ca[i]);
    free(kv);
    free(ca);
    kv_work_free(e, &kvw);
    chunk_grads_free(e, &cg);
    layer_scratch_free(e, &sc);
    efree(e, g), efree(e, xL), efree(e, xs);
    return ok && !e->oom;
}
