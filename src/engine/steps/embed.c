/* embed.c — the token embedding of one sequence and its backward, for every family.
 *
 *   x = E[ids]                     (Gemma-3: x = E[ids] · emb_scale, gemma.c)
 *   dE[ids[t]] += dx[t]            for every t whose token is not the pad token
 *
 * HF builds nn.Embedding(V, C, padding_idx=config.pad_token_id): the embedding backward leaves
 * the pad row out (torch's embedding_dense_backward skips padding_idx), so that row gets no
 * gradient from lookups, wherever the pad token sits (left or right padding, or pad = eos at
 * real positions); a tied LM head still adds its own gradient to it. Here the rows of dx at
 * pad tokens are zeroed (one call per run of them) before the scatter-add, which then adds
 * zeros to the pad row: the same result on every backend through the op table. */
#include "../engine.h"

void embed_forward(const eng *e, real *x, const int32_t *ids, int T) {
    e->ops->embedding_forward(e, x, ids, T);
    if (!e->gemma) return;
    e->ops->scale(e, x, e->emb_scale, (size_t)T * e->C);
    e->ops->store(e, x, (size_t)T * e->C); /* HF multiplies in the weights' dtype */
}

void embed_backward(const eng *e, real *dx, const int32_t *ids, const int32_t *host_ids, int T) {
    const size_t C = (size_t)e->C;
    const int pad = e->cfg->pad_token_id;
    for (int t = 0; pad >= 0 && t < T;) {
        if (host_ids[t] != pad) {
            t++;
            continue;
        }
        int t1 = t + 1;
        while (t1 < T && host_ids[t1] == pad) t1++;
        e->ops->zero(e, dx + (size_t)t * C, (size_t)(t1 - t) * C);
        t = t1;
    }
    if (e->gemma) { /* d(E[ids]·s)/dE[ids] = s, in the weights' dtype */
        e->ops->scale(e, dx, e->emb_scale, (size_t)T * C);
        e->ops->store(e, dx, (size_t)T * C);
    }
    e->ops->embedding_backward(e, e->gemb, dx, ids, T);
}
