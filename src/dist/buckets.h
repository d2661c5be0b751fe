/* buckets.h — the gradient slab cut into buckets, in the order the backward completes them: the
 * one definition the engine (which forms a bucket at a time, src/engine/fold.c) and the
 * distributed step (which sends and folds them, exchange.c) share. */
#ifndef SBP_BUCKETS_H
#define SBP_BUCKETS_H

#include "../streambp.h"

#include <stdint.h>

enum { SBP_BUCKET_HEAD = -1, SBP_BUCKET_EMBED = -2 }; /* else a layer index */

typedef struct {
    int id;         /* a layer, SBP_BUCKET_HEAD or SBP_BUCKET_EMBED */
    int64_t off, n; /* elements [off, off + n) of the gradient slab */
} sbp_bucket;

/* The buckets of a gradient slab (model or adapter table) in completion order: the head (final
 * norm and an untied lm_head), layers L−1 … 0, the embedding (those that have tensors). Returns
 * their count, or −1 when there are more than cap or a bucket's tensors are not contiguous. */
int sbp_grad_buckets(sbp_bucket *out /* (cap) */, int cap, const sbp_params *ps);
/* The bucket with this id, or NULL (nothing trained there: LoRA has no head bucket). */
const sbp_bucket *sbp_bucket_find(const sbp_bucket *b, int n, int id);

/* Receives each completed bucket [off, off + n) of a micro-batch's gradient (g: n elements of
 * the run's precision, rounded to its storage); returns 0 when it failed, and the run then stops
 * at once with the hook's error as its first (src/engine/fold.c, exchange.c). */
typedef int (*sbp_bucket_hook)(void *ctx, int64_t off, int64_t n, const void *g);

#endif
