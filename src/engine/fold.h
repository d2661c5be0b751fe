/* fold.h — a micro-batch's gradient formed a bucket at a time (sbp_engine_opts.fold,
 * docs/distributed.md): each bucket from zero in a scratch, then folded into the step's sum,
 * S ← S + g (one add per element), or handed to the caller's hook. Internal to src/engine;
 * compiled once per precision.
 *
 * One way: entry.c opens and closes the fold around a run (fold_begin, fold_end), the driver
 * marks where each bucket's gradient begins and ends (bucket_begin, bucket_end), and nothing here
 * calls back into either. */
#ifndef SBP_ENGINE_FOLD_H
#define SBP_ENGINE_FOLD_H

#include "../dist/buckets.h"
#include "engine.h"

/* Where a micro-batch's gradient forms when it is folded: one bucket at a time in scratch, the
 * whole step's sum S in the slab. A tied embedding is written by the head and by the lookup, so
 * its bucket lives from the head to the end in a scratch of its own; so does the head's bucket
 * whose round goes late (head_late, engine.h), from the head to the end of the backward. */
struct grad_fold {
    real *S;                  /* (P) the slab on the backend; NULL with a hook */
    real *scratch, *escratch; /* (largest other bucket), (V·C) with a tied head */
    real *hscratch;           /* (the head's bucket) while it forms apart, else NULL */
    sbp_bucket *b;            /* (nb) completion order */
    int nb, tied;
    int failed; /* the hook refused a bucket: no later bucket is formed or handed on */
    const sbp_params *mps, *lps; /* the model's table; the adapter's or NULL */
    sbp_bucket_hook hook;        /* NULL: fold into S */
    void *hook_ctx;
};

/* Opens the fold of a run on m (lora: its adapter, or NULL) into S or through hook, and sets
 * e->fold; 0 when out of memory (e->oom set). fold_end frees what it allocated, whatever
 * failed. */
int fold_begin(eng *e, struct grad_fold *f, const sbp_model *m, const sbp_lora *lora, real *S,
               sbp_bucket_hook hook, void *hook_ctx);
void fold_end(eng *e, struct grad_fold *f);

/* The gradient buckets, in the order the backward completes them (buckets.h): bucket_begin
 * points the bucket's gradient views at zeroed scratch; bucket_end rounds it (store) and folds
 * it into the slab or hands it to the hook. Both do nothing when e->fold is NULL. With a tied
 * head the embedding bucket begins with the head's. bucket_end returns 0 when the hook failed
 * (now or for an earlier bucket): the driver stops there. */
void bucket_begin(eng *e, int id);
int bucket_end(eng *e, int id);
/* bucket_begin in a scratch of the bucket's own (the head's only), so that other buckets form
 * while it does; freed by bucket_free_apart (or fold_end), at a fixed point after its
 * bucket_end, which may come at any layer (head_late). */
void bucket_begin_apart(eng *e, int id);
void bucket_free_apart(eng *e);
/* Sequence parallel (relay.c): the buffers bucket id's sum forms in, as relay items (at most 2:
 * with a tied head, the head's bucket and the embedding's); 0 without a fold. Only the rank
 * holding the sequence's last rows ends a bucket: the others handed their part of the sum on. */
int bucket_items(const eng *e, int id, relay_item *it);

#endif
