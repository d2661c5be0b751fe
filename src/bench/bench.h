/* bench.h — the measurements behind `streambp bench`: step time, FLOP rate and memory of each
 * schedule at each T, against the machine's sgemm rate measured in the same run. The command
 * (src/cli/cmd_bench.c) parses the options and formats what this module hands it; nothing here
 * prints: rows and progress go to the caller's sink.
 *
 * Every measurement (the sgemm rate too) runs in a child process of its own, so that the peak RSS
 * the kernel reports belongs to that run alone, and so that the calling process never starts an
 * OpenMP thread pool before it forks. The child sends its numbers back through a pipe. */
#ifndef SBP_BENCH_H
#define SBP_BENCH_H

#include "../streambp.h"

#include <stdint.h>

enum {
    SBP_BENCH_MAX_SCHEDULES = 4, /* full, ckpt, ckpt-chunked, stream */
    SBP_BENCH_MAX_SEQS = 32,     /* sequence lengths of one run */
    SBP_BENCH_MAX_ROUNDS = 15    /* timed (or warm-up) rounds per T */
};

/* A schedule the benchmark compares: ckpt keeps B·T·V logits as HF's baseline does,
 * ckpt-chunked streams them. */
typedef struct {
    const char *name;
    sbp_schedule schedule;
    int chunked_logits;
} sbp_bench_schedule;

/* The model benchmarked: a directory, or a seeded random model of a config (seed 1) written to a
 * temporary directory that sbp_bench_model_close removes. */
typedef struct {
    char cfgpath[1200]; /* its config.json, or the config given */
    char tmp[600];      /* the temporary model directory ("" when a directory was given) */
    char dir[1200];     /* the model directory */
    sbp_config cfg;
    int64_t n_params;
} sbp_bench_model;

/* model: a model directory; else config (a config.json) for a random model in $TMPDIR. */
sbp_status sbp_bench_model_open(sbp_bench_model *bm, const char *model, const char *config,
                                sbp_err *err);
void sbp_bench_model_close(sbp_bench_model *bm);

/* The machine's product rates at the step's three characteristic shapes (2048 rows: C → F,
 * F → C, C → V): per product the median of 7 calls after a warm-up call, in a process of its
 * own; then its vector FMA peak on the same threads (sbp_bench_fma_chains: what no product on
 * this CPU can beat, where the BLAS may lack kernels for it). NaN when that process failed. */
typedef struct {
    double sgemm;       /* GFLOP/s: the mean of OpenBLAS sgemm's three medians */
    double portable;    /* the same for the portable product (when asked) */
    double parts[2][3]; /* [sgemm, portable][product] medians */
    double fma_peak;    /* GFLOP/s of the vector FMA peak on the same threads (NaN: none) */
} sbp_bench_rates;
void sbp_bench_gemm_rates(sbp_bench_rates *r, const sbp_config *cfg, int threads, int portable);
/* Runs `steps` float32 fmas deep of as many independent vector fma chains as the product kernel
 * has accumulators, on the calling thread (fma_peak.c), and returns the floating-point
 * operations done (2 per lane per fma); 0 when the build has no vector fma. */
int64_t sbp_bench_fma_chains(int64_t steps);

typedef struct {
    const sbp_bench_model *model;
    const int *seqs; /* (n_seqs) the sequence lengths, in order; with largest only the first
                      * row is made, its T found per schedule */
    int n_seqs;
    const sbp_bench_schedule *schedules; /* (n_schedules) the schedules compared, in order */
    int n_schedules;
    int numerics; /* bit set of 1 << sbp_numerics; 0: both up to T = 4096, fast above */
    int threads;  /* >= 1 */
    int reps;     /* timed rounds per T, 1..15; 0: 3 up to T = 4096, then 1 */
    int warmup;   /* untimed rounds before them, 0..15; -1: 1 up to T = 4096, then 0 */
    int block, chunk, logit_chunk;
    int64_t largest; /* > 0: the largest T of each schedule under this many bytes */
    /* largest's search: the largest T whose planned peak fits the budget (0: none), its ledger
     * in *at (the planner's search lives with the plan command: src/cli/cmd_plan.c) */
    int (*largest_T)(const sbp_config *cfg, const sbp_plan_opts *o, int64_t budget, sbp_ledger *at);
    sbp_device device; /* on a CUDA device the portable numerics run */
    int train;         /* the training-step rows: train-stream and, up to T = 4096,
                        * train-stream-lora (r 32, alpha 128, all-linear) */
    int profile;       /* each row with its steps' operations timed (sbp_profile; CPU only) */
    int grads_out;     /* the schedules' gradients leave piece by piece (grad --out's step, a
                        * sink that drops them: sbp_grad_opts.grad_sink); CPU only */
} sbp_bench_opts;

/* One measured step: a schedule (or a training step) at T. */
typedef struct {
    int T;
    const char *name;      /* the schedule's, "train-stream" or "train-stream-lora" */
    sbp_numerics numerics; /* fast or portable */
    int runs;              /* timed runs the median is over */
    double seconds;        /* the median step time */
    double gflop;          /* the step's matrix products, recomputation included */
    double gflops;         /* gflop / seconds */
    double of_sgemm;       /* the median over the rounds of the step's rate over the sgemm rate
                            * timed in the same round; else over the run's sgemm rate */
    double of_peak;        /* the same over the vector FMA peak (NaN: the build has none) */
    double tokens_per_s;
    sbp_ledger lg;        /* the ledger of the measured step (device memory on a device) */
    int64_t planned_peak; /* the planner's peak for the same step */
    long long rss;        /* the measuring process's peak RSS */
    double loss;
    const sbp_profile *profile; /* with opts.profile: the operations of the timed steps
                                 * (profile->steps engine runs), else NULL */
} sbp_bench_row;

/* What a run reports as it goes: each row as soon as it is measured, and lines of text
 * (progress: "  T = 512: ..."; a failed measurement: "T = 512, stream: why"; with largest, a
 * schedule that fits at no T). */
typedef enum { SBP_BENCH_PROGRESS, SBP_BENCH_FAILURE, SBP_BENCH_NO_FIT } sbp_bench_note;
typedef struct {
    void *ctx;
    void (*row)(void *ctx, const sbp_bench_row *r);
    void (*note)(void *ctx, sbp_bench_note kind, const char *text);
} sbp_bench_sink;

/* Checks o: an error names the option that is out of range. */
sbp_status sbp_bench_check(const sbp_bench_opts *o, sbp_err *err);
/* Measures every row of o (sbp_bench_check first), against the run's rates (sbp_bench_gemm_rates);
 * *failures: the measurements that failed (each reported to the sink, the others still made). */
sbp_status sbp_bench_run(const sbp_bench_opts *o, const sbp_bench_rates *rates,
                         const sbp_bench_sink *sink, int *failures, sbp_err *err);

#endif
