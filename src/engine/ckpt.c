/* ckpt.c — gradient checkpointing: the forward keeps only each layer's input; the backward
 * recomputes one whole layer (all T rows, as one chunk), keeps its activations and backpropagates
 * through them. */
#include "engine.h"

int schedule_ckpt(eng *e, double *loss, const sbp_batch *b, const sched_opts *o) {
    const int B = b->B, L = e->L;
    const size_t TC = (size_t)e->T * e->C, BTC = (size_t)B * TC;
    int ok = 0;
    real *xs = ealloc(e, SBP_MEM_CHECKPOINTS, (size_t)L * BTC, "layer inputs");
    real *xL = ealloc(e, SBP_MEM_CHECKPOINTS, BTC, "final hidden state");
    real *g = NULL; /* the gradient flowing down, updated in place layer by layer */
    layer_scratch sc = {0};
    kv_acts kv = {0};
    chunk_acts a = {0};
    kv_work kvw = {0};
    chunk_grads cg = {0};
    if (e->oom || !layer_scratch_alloc(e, &sc) || !kv_acts_alloc(e, &kv, SBP_MEM_LAYER) ||
        !chunk_acts_alloc(e, &a, e->T, SBP_MEM_LAYER))
        goto out;

    embed_forward(e, xs, b);
    for (int l = 0; l < L; l++)
        for (int bi = 0; bi < B; bi++) {
            real *y = (l + 1 < L ? xs + (size_t)(l + 1) * BTC : xL) + bi * TC;
            layer_forward_whole(e, &a, &kv, &sc, y, xs + (size_t)l * BTC + bi * TC, &e->w[l],
                                b->mask + (size_t)bi * e->T);
        }

    /* The layer's activations are dropped while the head runs, as a no-grad forward leaves
     * nothing behind; they are allocated again for the recompute. */
    kv_acts_free(e, &kv);
    chunk_acts_free(e, &a);
    g = ealloc(e, SBP_MEM_LAYER, BTC, "hidden-state gradient");
    if (e->oom || !run_head(e, loss, g, xL, b, o)) goto out;
    efree(e, xL);
    xL = NULL;
    if (!kv_acts_alloc(e, &kv, SBP_MEM_LAYER) || !chunk_acts_alloc(e, &a, e->T, SBP_MEM_LAYER) ||
        !kv_work_alloc(e, &kvw) || !chunk_grads_alloc(e, &cg, e->T))
        goto out;
    for (int l = L - 1; l >= 0; l--)
        for (int bi = 0; bi < B; bi++) {
            const real *x = xs + (size_t)l * BTC + bi * TC;
            const uint8_t *m = b->mask + (size_t)bi * e->T;
            layer_forward_whole(e, &a, &kv, &sc, NULL, x, &e->w[l], m);
            layer_backward_whole(e, g + bi * TC, &kvw, &cg, &sc, &e->g[l], g + bi * TC, &a, &kv, x,
                                 &e->w[l], m);
        }
    embed_backward(e, g, b);
    ok = 1;
out:
    kv_acts_free(e, &kv);
    chunk_acts_free(e, &a);
    kv_work_free(e, &kvw);
    chunk_grads_free(e, &cg);
    layer_scratch_free(e, &sc);
    efree(e, g), efree(e, xL), efree(e, xs);
    return ok && !e->oom;
}
