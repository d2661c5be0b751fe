/* defaults.h — the bundled default model and batch that `streambp verify` uses when it is not
 * given --model and --batch: Qwen3-tiny (data/models/qwen3-tiny.json, seed 1, written to a
 * temporary directory on demand) and data/batches/sft-demo.safetensors. */
#ifndef SBP_DEFAULTS_H
#define SBP_DEFAULTS_H

#include "../src/streambp.h"

#include <stddef.h>

/* The data/ directory: $STREAMBP_DATA, else <dir of the executable>/../data, else ./data. */
sbp_status sbp_data_dir(char *out, size_t n, sbp_err *err);

typedef struct {
    char dir[512];   /* a temporary model directory, removed by sbp_default_free */
    char model[600]; /* == dir */
    char batch[600];
} sbp_default_inputs;

sbp_status sbp_default_inputs_make(sbp_default_inputs *d, sbp_err *err);
void sbp_default_inputs_free(sbp_default_inputs *d);

#endif
