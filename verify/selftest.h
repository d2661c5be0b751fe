/* selftest.h — the verifier's self-test (`streambp verify --self-test`, and a step of the default
 * `streambp verify`): faults planted into the verifier's own inputs, each of which one of its
 * comparisons must flag. A comparison that cannot fail (a loosened budget, an inverted or
 * skipped test, a line comparison that reads half a line) then fails `verify` itself, on any
 * machine, without the project's test suite.
 *
 * The faults, on a small model and batch (the CLI: Qwen3-tiny, seed 1, sft-tiny):
 *   none            the inputs as they are: every group of the matrix passes (the control:
 *                   each fault below must be flagged on the planted tensors and nowhere else);
 *   fp64 element    one element of one tensor off by 4 × the fp64 budget (1e-10) × ‖truth‖ in
 *                   every float64 run: "fp64 vs truth" and "micro-batches" flag that tensor;
 *   fp32 element    the same in every float32 run at 4 × the fp32 budget, the budget computed
 *                   here from the oracle by the documented rule (4 × the oracle's float32 loops'
 *                   own error, floor 1e-7), not read back from the verifier: "fp32 vs truth";
 *   one ULP         one element one unit in the last place off in every run but full BP at the
 *                   first thread count: "schedules", "threads" and "portable" (bitwise) flag it;
 *   ragged          one element off by 4 × the ragged-chunk tolerance (1e-5, 2e-14) in the
 *                   runs at ragged chunks: "ragged chunks" flags it;
 *   swapped         two tensors of one shape (k_proj and v_proj of layer 0) swapped in every
 *                   float64 run: "fp64 vs truth" flags both;
 *   fp32 as fp64    every float64 run given the float32 gradient of the same step: "fp64 vs
 *                   truth" flags every tensor (an fp32 run held to fp64's budget fails);
 *   missing         a gradient file without one tensor: `verify diff` and `verify audit` fail
 *                   it as missing;
 *   digest byte     a gradient file with one element one ULP off: its fingerprint differs from
 *                   the original's on that tensor's line (the hashing sees every byte);
 *   golden line     each committed golden digest given with one hex digit of one line changed,
 *                   a line dropped and a line added: `verify golden`'s comparison names the
 *                   line (and finds the unchanged text equal).
 * The budgets the faults are sized by are the documented ones (docs/verify.md), written here
 * again: a verifier whose budget is looser lets the fault through. */
#ifndef SBP_SELFTEST_H
#define SBP_SELFTEST_H

#include "../src/streambp.h"

#define SBP_SELFTEST_MAX 16

typedef struct {
    const char *model, *batch; /* a small model directory and batch (SFT) */
    const char *workdir;       /* an empty private directory for the files the faults write */
    /* golden digest texts (NUL-terminated) to plant line changes into, with their names */
    const char *const *golden_text;
    const char *const *golden_name;
    int n_golden;
} sbp_selftest_opts;

typedef struct {
    char fault[112]; /* what was planted */
    char check[64];  /* the comparison that must flag it */
    int ok;          /* flagged where it must be and nowhere else (none: nothing flagged) */
    char seen[256];  /* what the comparison reported */
} sbp_selftest_row;

typedef struct {
    sbp_selftest_row rows[SBP_SELFTEST_MAX];
    int n, failed;
} sbp_selftest_report;

/* Runs every fault. An input error (the model or batch unreadable) is returned; a fault that
 * is not flagged is a row with ok = 0, counted in rep->failed. */
sbp_status sbp_selftest_run(sbp_selftest_report *rep, const sbp_selftest_opts *o, sbp_err *err);

#endif
