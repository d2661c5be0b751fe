/* forward.c — a forward pass without backward, streamed: the log-probs of every target, as a
 * reference model's must be computed for DPO and GRPO. Only the current layer's input and
 * output are kept (no checkpoints), plus one layer's K/V side and one chunk. */
#include "engine.h"

int schedule_forward(eng *e, double *logp, const sbp_batch *b, const sched_opts *o) {
    const int B = b->B, L = e->L, T = e->T, c = o->chunk;
    const size_t TC = (size_t)T * e->C, BTC = (size_t)B * TC;
    int ok = 0;
    real *x = ealloc(e, SBP_MEM_LAYER, BTC, "layer input");
    real *y = ealloc(e, SBP_MEM_LAYER, BTC, "layer output");
    layer_scratch sc = {0};
    kv_acts kv = {0};
    chunk_acts a = {0};
    if (e->oom || !layer_scratch_alloc(e, &sc) || !kv_acts_alloc(e, &kv, SBP_MEM_LAYER) ||
        !chunk_acts_alloc(e, &a, c, SBP_MEM_LAYER))
        goto out;
    embed_forward(e, x, b);
    for (int l = 0; l < L; l++) {
        for (int bi = 0; bi < B; bi++) {
            const uint8_t *m = b->mask + (size_t)bi * T;
            kv_forward(e, &kv, &sc, x + bi * TC, &e->w[l]);
            for (int s = 0, end; s < T; s = end) {
                end = s + c < T ? s + c : T;
                chunk_forward(e, &a, y + bi * TC + (size_t)s * e->C, &sc,
                              x + bi * TC + (size_t)s * e->C, &kv, &e->w[l], m, s, end);
            }
        }
        real *t = x;
        x = y;
        y = t;
    }
    kv_acts_free(e, &kv);
    chunk_acts_free(e, &a);
    layer_scratch_free(e, &sc);
    efree(e, y);
    y = NULL;
    ok = head_logprobs(e, logp, x, b, o->logit_rows, o->inv_tau);
out:
    kv_acts_free(e, &kv);
    chunk_acts_free(e, &a);
    layer_scratch_free(e, &sc);
    efree(e, x), efree(e, y);
    return ok && !e->oom;
}
