/* suite.h — the edge-case suite: fixtures aimed at the bugs chunked backprop actually has (the
 * StreamBP authors' fixes and open bugs, notes in docs/verify.md), each
 * run through the full verification matrix (matrix.h). */
#ifndef SBP_SUITE_H
#define SBP_SUITE_H

#include "matrix.h"

typedef struct {
    const char *name;  /* short id, e.g. "chunk-starts-on-ignored" */
    const char *what;  /* what it exercises */
    const char *model; /* data/models/<model>.json, seed 1 */
    const char *batch; /* data/batches/<batch>.safetensors */
    int block;
    int chunks[4], n_chunks;
    sbp_objective obj; /* zero: SFT */
    int ref_seed;      /* DPO/GRPO: a reference model, the same config at this seed; 0: none */
    int precisions, schedules, threads; /* subsets (matrix.h's bit sets; threads 1: one thread
                                         * only); 0: all. For cases too long for the matrix */
    int numerics;                       /* matrix.h's bit set; 0: both */
    sbp_unattended unattended;          /* rows that see no key (the oracle follows it too) */
    int lora_r; /* > 0: the gradient of a LoRA adapter of this rank on every linear layer (seed 1,
                 * alpha 2r, B from N(0, 0.02²)), the base model frozen; 0: the model's */
} sbp_suite_case;

int sbp_suite_count(void);
const sbp_suite_case *sbp_suite_case_at(int i);
int sbp_suite_find(const char *name); /* index or -1 */

/* Runs case i; model directories are written under workdir (created by the caller): the
 * weights by sbp_model_init, config.json copied byte for byte from data/models/, so that the
 * oracle reads the config as written, defaults and all, not as the library re-wrote it. */
sbp_status sbp_suite_run(sbp_verify_report *rep, int i, const char *data_dir, const char *workdir,
                         sbp_err *err);

/* The reach cases: a step of the default `streambp verify` (issue 54), each a small matrix on a
 * model and batch that take the paths the bundled model and batch do not: the fast numerics'
 * attention at key tiles with ragged ends, one kv head (the two-pass backward) and a sliding
 * window across tiles and chunks, T = 300 over three token blocks and V = 1100 over three
 * vocabulary blocks against the truth, rows that see no key in HF's two modes (a Gemma-3 window
 * of padding among them), a reference model's log-probs, a LoRA adapter through every group. */
int sbp_reach_count(void);
const sbp_suite_case *sbp_reach_case_at(int i);

/* Runs case c (a suite or reach case) as sbp_suite_run does. */
sbp_status sbp_suite_run_case(sbp_verify_report *rep, const sbp_suite_case *c, const char *data_dir,
                              const char *workdir, sbp_err *err);

#endif
