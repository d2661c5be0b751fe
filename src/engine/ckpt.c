/* ckpt.c — gradient checkpointing: the forward keeps only each layer's input; the backward
 * recomputes one whole layer (all T rows, as one chunk), keeps its activations and backpropagates
 * through them. */
#include "engine.h"

int schedule_ckpt(eng *e, double *loss, const sbp_batch *b, const sched_opts *o) {
    const int B = b->B, L = e->L;
    const size_t TC = (size_t)e->T * e->C, BTC = (size_t)B * TC;
    int ok = 0;
    real *xs = ealloc(e, SBP_MEM_CHECKPOINTS, (size_t)(L + 1) * BTC, "layer inputs");
    real *attn = ealloc(e, SBP_MEM_LAYER, attention_scratch(e->blk, e->HD), "attention scratch");
    real *dy = NULL, *dx = NULL;
    kv_acts kv = {0};
    chunk_acts a = {0};
    kv_work kvw = {0};
    chunk_grads cg = {0};
    if (e->oom || !kv_acts_alloc(e, &kv, SBP_MEM_LAYER) ||
        !chunk_acts_alloc(e, &a, e->T, SBP_MEM_LAYER))
        goto out;

    embed_forward(e, xs, b);
    for (int l = 0; l < L; l++)
        for (int bi = 0; bi < B; bi++)
            layer_forward_whole(e, &a, &kv, attn, xs + (size_t)(l + 1) * BTC + bi * TC,
                                xs + (size_t)l * BTC + bi * TC, &e->w[l],
                                b->mask + (size_t)bi * e->T);

    dy = ealloc(e, SBP_MEM_LAYER, BTC, "layer output gradient");
    dx = ealloc(e, SBP_MEM_LAYER, BTC, "layer input gradient");
    /* The layer's activations are dropped while the head runs, as a no-grad forward leaves
     * nothing behind; they are allocated again for the recompute. */
    kv_acts_free(e, &kv);
    chunk_acts_free(e, &a);
    if (e->oom || !run_head(e, loss, dy, xs + (size_t)L * BTC, b, o)) goto out;
    if (!kv_acts_alloc(e, &kv, SBP_MEM_LAYER) || !chunk_acts_alloc(e, &a, e->T, SBP_MEM_LAYER) ||
        !kv_work_alloc(e, &kvw) || !chunk_grads_alloc(e, &cg, e->T))
        goto out;
    for (int l = L - 1; l >= 0; l--) {
        zero_reals(e, dx, BTC);
        for (int bi = 0; bi < B; bi++) {
            const real *x = xs + (size_t)l * BTC + bi * TC;
            const uint8_t *m = b->mask + (size_t)bi * e->T;
            layer_forward_whole(e, &a, &kv, attn, NULL, x, &e->w[l], m);
            layer_backward_whole(e, dx + bi * TC, &kvw, &cg, &e->g[l], dy + bi * TC, &a, &kv, x,
                                 &e->w[l], m);
        }
        real *t = dy;
        dy = dx;
        dx = t;
    }
    embed_backward(e, dy, b);
    ok = 1;
out:
    kv_acts_free(e, &kv);
    chunk_acts_free(e, &a);
    kv_work_free(e, &kvw);
    chunk_grads_free(e, &cg);
    efree(e, attn), efree(e, dy), efree(e, dx), efree(e, xs);
    return ok && !e->oom;
}
