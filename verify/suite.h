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
} sbp_suite_case;

int sbp_suite_count(void);
const sbp_suite_case *sbp_suite_case_at(int i);
int sbp_suite_find(const char *name); /* index or -1 */

/* Runs case i; model directories are written under workdir (created by the caller): the
 * weights by sbp_model_init, config.json copied byte for byte from data/models/, so that the
 * oracle reads the config as written, defaults and all, not as the library re-wrote it. */
sbp_status sbp_suite_run(sbp_verify_report *rep, int i, const char *data_dir, const char *workdir,
                         sbp_err *err);

#endif
