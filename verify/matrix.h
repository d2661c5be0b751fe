/* matrix.h — the verifier's main check: one model and batch through every schedule, chunk size,
 * precision and thread count, every gradient compared per parameter tensor.
 *
 * The truth is the ref/ oracle's (ref/ref.h), computed from the files alone: the oracle reads
 * config.json, the weights, the batch and a reference model with its own readers and derives
 * targets, shifts, masks, padding, advantages and defaults itself, so that a reading mistake of
 * the library does not reach the truth (with --no-ref: float64 full BP, for models too large
 * for the oracle; then the loading and the float32 rule below fall back as stated).
 *
 * The comparisons fall into nine groups, each with its promise:
 *   loading            the library's reading of every input against the oracle's: each
 *                      parameter tensor present in both with the same shape and bit-identical
 *                      weights; config fields and batch contents (targets, masks, advantages,
 *                      reference and old log-probs) equal (notes say where they part). Input
 *                      the library read and the oracle refuses fails here (input the library
 *                      refuses is an input error, exit 2);
 *   fp64 vs truth      every float64 run against the float64 truth: relative L2 <= 1e-10 per
 *                      tensor;
 *   fp32 vs truth      every float32 run against the same truth, within a budget that does not
 *                      come from the library: slack × the error of the oracle's own loops run
 *                      in float32 (ref32) for that tensor, floor 1e-7. (--no-ref: slack × the
 *                      error of float32 full BP, at most 1e-4, which cannot see a float32 slip
 *                      that full BP shares);
 *   schedules          ckpt and stream at chunks that are multiples of the block, and full BP
 *                      through the timing table of `bench --profile`, against full BP of the
 *                      same precision: bitwise;
 *   threads            every run at each thread count against the same run at the first
 *                      thread count: bitwise;
 *   ragged chunks      chunks that are not block multiples against full BP of the same
 *                      precision: relative L2 <= 1e-5 (fp32) or 2e-14 (fp64), the bounds measured
 *                      on the bundled models (docs/numerics.md §1);
 *   micro-batches      the batch split into up to three micro-batches of different T (verify/
 *                      micro.h) and run as one accumulated step (sbp_grad_batches, stream),
 *                      against the truth of the whole batch: the fp64 and fp32 promises above;
 *   portable           the portable numerics (docs/numerics.md §1): every run — every schedule
 *                      and chunk, ragged ones included, every thread count — against portable
 *                      full BP of the same precision at the first thread count: bitwise. Portable
 *                      runs are also judged against the truth in the first two groups.
 *   devices            every schedule (block-multiple and ragged chunks) in both precisions on each
 *                      device of --devices other than the CPU (cuda, cuda-emu), against portable
 *                      full BP on the CPU: bitwise.
 * schedules, threads and ragged chunks hold the fast numerics' runs; --numerics picks which run.
 * Each group reports one row per tensor: the worst case over its runs. */
#ifndef SBP_VERIFY_MATRIX_H
#define SBP_VERIFY_MATRIX_H

#include "../src/streambp.h"

#define SBP_VERIFY_MAX_CHUNKS 16

/* A fault planted into a run's gradient after the run and before any comparison sees it: the
 * verifier's self-test (selftest.h) uses it to prove that each comparison can fail. Never set in
 * a real check. role says which run the gradient is, so that a fault can aim at one group: */
enum {
    SBP_RUN_BASE = 1,      /* full BP at the first thread count: the bitwise groups' reference */
    SBP_RUN_ALIGNED = 2,   /* a ckpt or stream run at block-multiple chunks */
    SBP_RUN_RAGGED = 4,    /* a ckpt or stream run at chunks that are not */
    SBP_RUN_THREADS = 8,   /* the run at a thread count after the first (with its config's bit) */
    SBP_RUN_MICRO = 16,    /* the micro-batch step */
    SBP_RUN_PORTABLE = 32, /* set with the others on a portable run */
    SBP_RUN_DEVICE = 64,   /* a run on a device of --devices */
};
typedef struct {
    void (*fn)(void *ctx, void *grads /* (params.total), float or double by p */, sbp_precision p,
               int role);
    void *ctx;
} sbp_verify_fault;

typedef struct {
    const char *model, *batch;
    int block;                         /* 0: 16 when T < 1024, else 256 */
    int chunks[SBP_VERIFY_MAX_CHUNKS]; /* stream chunks (and logit chunks) */
    int n_chunks;              /* 0: block multiples B, 2B, 4B, T and ragged 1, 7, T−1, T+5 */
    int schedules;             /* bit set of 1 << sbp_schedule; 0: all three */
    int precisions;            /* bit set of 1 << sbp_precision; 0: both */
    int numerics;              /* bit set of 1 << sbp_numerics; 0: both */
    int devices;               /* bit set of 1 << sbp_device beyond the CPU's; 0: the CPU only */
    sbp_unattended unattended; /* rows with no visible key (the oracle follows it too) */
    int threads[4];
    int n_threads;           /* 0: 1 and 2 */
    int no_ref;              /* truth from float64 full BP instead of ref/ */
    sbp_objective objective; /* zero: SFT */
    int scale_rewards;       /* GRPO rewards: divide by the group std */
    const char *ref_model;   /* DPO/GRPO reference log-probs from this model */
    const char *lora;        /* an adapter directory (peft's layout): its gradients are checked,
                              * the base model frozen; NULL: the model's own */
    double slack;            /* fp32 budget factor; 0: 4 */
    const sbp_verify_fault *fault; /* the self-test's planted fault; NULL: none */
} sbp_verify_opts;

typedef struct {
    char name[80]; /* the tensor */
    int runs, bitwise_runs;
    double max_ulp, max_abs, rel_l2; /* worst over the group's runs */
    double min_cosine, norm_ratio;   /* the norm ratio farthest from 1 */
    double budget;                   /* the relative-L2 promise for this row (0: bitwise) */
    int failed;                      /* runs that broke the promise */
    char first_failure[128];         /* the run, when one failed */
    int64_t nonfinite;
} sbp_verify_row;

typedef struct {
    char title[64];
    char promise[160];
    sbp_verify_row *rows; /* one per parameter tensor */
    int n_rows;
    int runs, failed; /* comparisons made, and failed (tensor level) */
} sbp_verify_group;

enum {
    SBP_VG_LOAD,
    SBP_VG_TRUTH64,
    SBP_VG_TRUTH32,
    SBP_VG_SCHEDULES,
    SBP_VG_THREADS,
    SBP_VG_RAGGED,
    SBP_VG_PORTABLE,
    SBP_VG_DEVICES,
    SBP_VG_MICRO,
    SBP_VG_N
};

typedef struct {
    sbp_verify_group g[SBP_VG_N];
    char model_type[16];
    int B, T, block, n_runs;
    int chunks[SBP_VERIFY_MAX_CHUNKS], n_chunks;
    double truth_loss;
    double max_loss_dev32, max_loss_dev64; /* |loss − truth| / |truth| over the runs */
    const char *truth;                     /* "ref/ float64 oracle" or "float64 full BP" */
    const char *budget32;                  /* where the fp32 budget comes from */
    int micro_T[3], n_micro;               /* T of each micro-batch (0 micro-batches: B = 1) */
    char load_notes[2048];                 /* how the library's and the oracle's readings differ */
    int failed;                            /* total failed rows, and loading notes */
} sbp_verify_report;

sbp_status sbp_verify_run(sbp_verify_report *rep, const sbp_verify_opts *o, sbp_err *err);
void sbp_verify_report_free(sbp_verify_report *rep);

#endif
