/* golden.h — the manifest of the long golden cases (data/golden/long/cases): each case a model
 * config, a batch, an optional LoRA adapter and `grad` options, whose portable gradient's
 * fingerprint is committed as data/golden/long/<name>.txt. Read by `verify golden` (from the copy
 * built into the binary) and by tests/test_golden.c (from the checkout), so both run the same
 * cases. */
#ifndef SBP_GOLDEN_H
#define SBP_GOLDEN_H

#include "../src/streambp.h"

#define SBP_GOLDEN_MAX_CASES 32

typedef struct {
    char name[64];     /* the digest is data/golden/long/<name>.txt */
    char config[64];   /* data/models/<config>.json */
    char batch[64];    /* data/batches/<batch>.safetensors */
    int cpu_only;      /* "cpu": not run on the devices (bf16 storage is a CPU feature) */
    char adapter[160]; /* `streambp lora init` options, or "" for no adapter */
    char options[256]; /* `streambp grad` options */
} sbp_golden_case;

/* Parses the manifest text (`what` names it in errors): lines of six fields separated by '|',
 * '#' comments and blank lines skipped. Names, configs and batches are words of [A-Za-z0-9._-]
 * (they become file names); the options are such words separated by spaces (they become a
 * command's arguments). At most max cases. */
sbp_status sbp_golden_cases_parse(sbp_golden_case *out, int max, int *n, const char *text,
                                  const char *what, sbp_err *err);

#endif
