/* entry.h — the two copies of the engine entry point (float and double), as the rest of the
 * library sees them. Internal. */
#ifndef SBP_ENTRY_H
#define SBP_ENTRY_H

#include "../core/objective.h"
#include "../dist/buckets.h"
#include "../dist/seqlink.h"
#include "../streambp.h"

/* One engine run's options, filled from the user's sbp_grad_opts by sbp_engine_resolve
 * (src/api/resolve.h, the layer that knows the user's options). */
typedef struct {
    sbp_schedule schedule;
    sbp_numerics numerics;
    const void *device_ops; /* the sbp_ops of a device backend (cuda/), else NULL: the CPU's */
    sbp_unattended unattended;
    const sbp_lora *lora;          /* adapters: the base is frozen, grads are the adapter's */
    int block, chunk, logit_chunk; /* resolved: >= 1, chunk and logit_chunk <= T */
    int materialise;               /* full/ckpt: one B·T·V logits buffer */
    int plan;                      /* planning run: allocate only (the ledger must be planning) */
    int elem_bytes;                /* planning: bytes charged per stored element */
    sbp_obj_eval *ev;              /* the objective */
    int emulate_bf16;
    double *logp_out; /* non-NULL: forward only, every target's log-prob (B·T) */
    double inv_tau;   /* forward only: 1 / temperature */
    /* 1: grads holds S, the step's sum over the micro-batches before this one; this one's
     * gradient g is formed from zero a bucket at a time in a scratch of the largest bucket
     * (charged to SBP_MEM_GRADS) and folded, S ← S + g, one add per element (the fold,
     * docs/distributed.md). 0: the gradients are added into grads as they form. */
    int fold;
    /* with fold, on the CPU: each completed bucket's gradient (rounded to the storage) goes to
     * the hook instead of the fold; 0 from the hook stops the run (SBP_EIO, unless the hook's
     * caller reports its own error) */
    sbp_bucket_hook bucket_hook;
    void *hook_ctx;
    sbp_profile *profile; /* NULL, or the operations' times are added there (ops/profile.c) */
    /* sequence parallel (docs/distributed.md §8): this process is one of link->size sharing every
     * sequence, holding rows [bounds[rank], bounds[rank + 1]); needs fold (the buckets' sums
     * travel from rank to rank, the last rank's go to the hook or the fold). NULL: one process
     * holds every row. */
    const sbp_seq_link *link;
    /* with a link: a rank after the first runs a layer's dX path before the previous rank's
     * gradient arrives, its gradient calls deferred (sbp_grad_opts.seq_overlap) */
    int seq_overlap;
} sbp_engine_opts;

/* The op table of a CUDA device in precision p (cuda/registry.cc), or NULL where this build has
 * none: a run's table, and the one a plan for that device charges the workspace of. */
const void *sbp_cuda_ops(sbp_device d, sbp_precision p);

/* loss: added to (the objective's loss); grads: (params.total) reals of the model's precision,
 * added to (zeroed by the caller for a fresh step). */
sbp_status sbp_engine_grad_f32(double *loss, void *grads, const sbp_model *m, const sbp_batch *b,
                               const sbp_engine_opts *o, sbp_ledger *lg, sbp_err *err);
sbp_status sbp_engine_grad_f64(double *loss, void *grads, const sbp_model *m, const sbp_batch *b,
                               const sbp_engine_opts *o, sbp_ledger *lg, sbp_err *err);

/* Sequence parallel: the rows a rank holds come in whole grains of this many tokens (the
 * engine's rule, src/engine/relay.c: the portable sums' block, and in the fast numerics also the
 * token block). The two copies agree. */
int sbp_engine_seq_grain_f32(int portable, int block);
int sbp_engine_seq_grain_f64(int portable, int block);

#endif
