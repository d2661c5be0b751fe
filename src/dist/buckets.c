/* buckets.c — the gradient slab cut into buckets, the units the backward completes one at a time
 * and the distributed step sends (docs/distributed.md): the head (final norm and an untied
 * lm_head), each layer (or, with LoRA, each layer's adapters), the embedding. */
#include "buckets.h"

/* The bucket a tensor belongs to: its layer, or the embedding, or the head. */
static int bucket_of(const sbp_param *p) {
    if (p->layer >= 0) return p->layer;
    return p->kind == SBP_P_EMBED ? SBP_BUCKET_EMBED : SBP_BUCKET_HEAD;
}

/* Completion order: the head first, then layers from the last down, the embedding last. */
static int rank_of(int id) {
    return id == SBP_BUCKET_HEAD ? -1 : id == SBP_BUCKET_EMBED ? 1 << 30 : -id + (1 << 20);
}

int sbp_grad_buckets(sbp_bucket *out, int cap, const sbp_params *ps) {
    int n = 0;
    for (int i = 0; i < ps->n; i++) {
        const sbp_param *p = &ps->p[i];
        const int id = bucket_of(p);
        if (n > 0 && out[n - 1].id == id && out[n - 1].off + out[n - 1].n == p->offset) {
            out[n - 1].n += p->numel; /* the slab keeps a bucket's tensors together */
            continue;
        }
        if (n == cap) return -1;
        out[n++] = (sbp_bucket){.id = id, .off = p->offset, .n = p->numel};
    }
    /* insertion sort by completion order: at most L + 2 entries */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && rank_of(out[j - 1].id) > rank_of(out[j].id); j--) {
            sbp_bucket t = out[j];
            out[j] = out[j - 1], out[j - 1] = t;
        }
    for (int i = 1; i < n; i++) /* a bucket in two pieces would be a new slab layout */
        if (out[i].id == out[i - 1].id) return -1;
    return n;
}

const sbp_bucket *sbp_bucket_find(const sbp_bucket *b, int n, int id) {
    for (int i = 0; i < n; i++)
        if (b[i].id == id) return &b[i];
    return NULL;
}
