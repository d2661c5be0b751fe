/* stream.c — StreamBP (Luo et al., arXiv 2506.03077): the forward keeps only each layer's input;
 * the backward of a layer recomputes its K/V side once for all T tokens, then walks the sequence
 * in chunks [s, e) in ascending order, recomputing and backpropagating each chunk's queries,
 * attention and MLP, and accumulating dK/dV of keys [0, e); the K/V side is backpropagated once
 * at the end. The forward runs chunk by chunk too, so no buffer of T·F or T·Q elements ever
 * exists: besides the layer inputs and the hidden-state gradient, a layer lives in
 * O(T·KV) + O(chunk·(C + F + Q)). The logits never exist for more than one pass of rows. */
#include "engine.h"

int schedule_stream(eng *e, double *loss, const sbp_batch *b, const sched_opts *o) {
    const int B = b->B, L = e->L, T = e->T, c = o->chunk;
    const size_t TC = (size_t)T * e->C, BTC = (size_t)B * TC;
    int ok = 0;
    real *xs = ealloc(e, SBP_MEM_CHECKPOINTS, (size_t)L * BTC, "layer inputs");
    real *xL = ealloc(e, SBP_MEM_CHECKPOINTS, BTC, "final hidden state");
    real *g = NULL; /* the gradient flowing down, updated in place chunk by chunk */
    layer_scratch sc = {0};
    kv_acts kv = {0};
    chunk_acts a = {0};
    kv_work kvw = {0};
    chunk_grads cg = {0};
    if (e->oom || !layer_scratch_alloc(e, &sc) || !kv_acts_alloc(e, &kv, SBP_MEM_LAYER) ||
        !chunk_acts_alloc(e, &a, c, SBP_MEM_LAYER))
        goto out;

    embed_forward(e, xs, b);
    for (int l = 0; l < L; l++)
        for (int bi = 0; bi < B; bi++) {
            const real *x = xs + (size_t)l * BTC + bi * TC;
            real *y = (l + 1 < L ? xs + (size_t)(l + 1) * BTC : xL) + bi * TC;
            const uint8_t *m = b->mask + (size_t)bi * T;
            kv_forward(e, &kv, &sc, x, &e->w[l]);
            for (int s = 0, end; s < T; s = end) {
                end = s + c < T ? s + c : T;
                chunk_forward(e, &a, y + (size_t)s * e->C, &sc, x + (size_t)s * e->C, &kv, &e->w[l],
                              m, s, end);
            }
        }

    g = ealloc(e, SBP_MEM_LAYER, BTC, "hidden-state gradient");
    if (e->oom || !run_head(e, loss, g, xL, b, o)) goto out;
    efree(e, xL);
    xL = NULL;
    if (!kv_work_alloc(e, &kvw) || !chunk_grads_alloc(e, &cg, c)) goto out;
    for (int l = L - 1; l >= 0; l--)
        for (int bi = 0; bi < B; bi++) {
            const real *x = xs + (size_t)l * BTC + bi * TC;
            const uint8_t *m = b->mask + (size_t)bi * T;
            real *gb = g + bi * TC;
            /* 1. K and V of all T tokens, once */
            kv_forward(e, &kv, &sc, x, &e->w[l]);
            kv_begin_backward(e, &kvw);
            /* 2. chunks in ascending order: recompute, then backpropagate; the chunk's rows of
             * the gradient are read as dY and overwritten with dX */
            for (int s = 0, end; s < T; s = end) {
                end = s + c < T ? s + c : T;
                const size_t r = (size_t)s * e->C;
                chunk_forward(e, &a, NULL, &sc, x + r, &kv, &e->w[l], m, s, end);
                chunk_backward(e, gb + r, &kvw, &e->g[l], &cg, &sc, gb + r, &a, &kv, x + r,
                               &e->w[l], m, s, end);
            }
            /* 3. the K/V side, for all T */
            kv_backward(e, gb, &e->g[l], &kvw, &sc, &kv, x, &e->w[l]);
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
