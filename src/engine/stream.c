/* stream.c — StreamBP (Luo et al., arXiv 2506.03077): the forward keeps only each layer's input;
 * the backward of a layer recomputes its K/V side once for all T tokens, then walks the sequence
 * in chunks [s, e) in ascending order, recomputing and backpropagating each chunk's queries,
 * attention and MLP, and accumulating dK/dV of keys [0, e); the K/V side is backpropagated once
 * at the end. The forward runs chunk by chunk too, so no buffer of T·F or T·Q elements ever
 * exists: live memory per layer is O(T·(C + KV)) + O(chunk·(F + Q)). The logits never exist for
 * more than one pass of rows. */
#include "engine.h"

int schedule_stream(eng *e, double *loss, const sbp_batch *b, const sched_opts *o) {
    const int B = b->B, L = e->L, T = e->T, c = o->chunk;
    const size_t TC = (size_t)T * e->C, BTC = (size_t)B * TC;
    int ok = 0;
    real *xs = ealloc(e, SBP_MEM_CHECKPOINTS, (size_t)(L + 1) * BTC, "layer inputs");
    real *dy = NULL, *dx = NULL;
    kv_acts kv = {0};
    chunk_acts a = {0};
    kv_work kvw = {0};
    chunk_grads cg = {0};
    if (e->oom || !kv_acts_alloc(e, &kv, SBP_MEM_LAYER) || !kv_work_alloc(e, &kvw) ||
        !chunk_acts_alloc(e, &a, c, SBP_MEM_LAYER))
        goto out;

    embed_forward(e, xs, b);
    for (int l = 0; l < L; l++)
        for (int bi = 0; bi < B; bi++) {
            const real *x = xs + (size_t)l * BTC + bi * TC;
            real *y = xs + (size_t)(l + 1) * BTC + bi * TC;
            const uint8_t *m = b->mask + (size_t)bi * T;
            kv_forward(e, &kv, x, &e->w[l]);
            for (int s = 0, end; s < T; s = end) {
                end = s + c < T ? s + c : T;
                chunk_forward(e, &a, y + (size_t)s * e->C, x + (size_t)s * e->C, &kv, kvw.attn,
                              &e->w[l], m, s, end);
            }
        }

    dy = ealloc(e, SBP_MEM_LAYER, BTC, "layer output gradient");
    dx = ealloc(e, SBP_MEM_LAYER, BTC, "layer input gradient");
    if (e->oom || !chunk_grads_alloc(e, &cg, c) ||
        !run_head(e, loss, dy, xs + (size_t)L * BTC, b, o))
        goto out;
    for (int l = L - 1; l >= 0; l--) {
        zero_reals(e, dx, BTC);
        for (int bi = 0; bi < B; bi++) {
            const real *x = xs + (size_t)l * BTC + bi * TC;
            const uint8_t *m = b->mask + (size_t)bi * T;
            real *dxb = dx + bi * TC;
            const real *dyb = dy + bi * TC;
            /* 1. K and V of all T tokens, once */
            kv_forward(e, &kv, x, &e->w[l]);
            kv_begin_backward(e, &kvw, &kv);
            /* 2. chunks in ascending order: recompute, then backpropagate */
            for (int s = 0, end; s < T; s = end) {
                end = s + c < T ? s + c : T;
                chunk_forward(e, &a, NULL, x + (size_t)s * e->C, &kv, kvw.attn, &e->w[l], m, s,
                              end);
                chunk_backward(e, dxb + (size_t)s * e->C, &kvw, &e->g[l], &cg,
                               dyb + (size_t)s * e->C, &a, &kv, &e->w[l], m, s, end);
            }
            /* 3. the K/V side and the input norm, for all T */
            kv_backward(e, dxb, &e->g[l], &kvw, &kv, x, &e->w[l]);
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
    efree(e, dy), efree(e, dx), efree(e, xs);
    return ok && !e->oom;
}
