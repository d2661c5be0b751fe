/* audit.h — judging another implementation's gradient file against the float64 truth.
 *
 * The truth is the float64 gradient of the objective (SFT, DPO or GRPO with TRL's options; the
 * ref/ oracle, or float64 full BP for models too large for it). The budget of each tensor is
 * what our own run at the other implementation's precision achieves against that truth —
 * float32 BP, float64 BP, or the float32 engine emulating pure-bf16 training — times a slack
 * factor (default 4), with a floor. Their tensor passes when its relative L2 error against the
 * truth is within the budget and it holds no NaN/Inf; a missing tensor or a shape mismatch
 * fails. When a tensor fails, the report carries a diagnosis (diagnose.h); to tell an error at
 * a lower precision's level apart, our run at the next lower precision is measured too (fp64:
 * float32; fp32: emulated bf16).
 *
 * Reference log-probs (DPO, GRPO) come from the batch, or from ref_model: in float64 for the
 * truth, and at their precision for our yardstick (as their trainer computes them). */
#ifndef SBP_AUDIT_H
#define SBP_AUDIT_H

#include "../src/streambp.h"
#include "diagnose.h"
#include "metrics.h"

typedef enum { SBP_THEIRS_FP32, SBP_THEIRS_BF16, SBP_THEIRS_FP64 } sbp_theirs_precision;

typedef struct {
    const char *model, *batch, *grads;
    sbp_theirs_precision precision;
    double slack; /* 0: 4 */
    int no_ref;
    int block;                 /* 0: 256 */
    sbp_objective objective;   /* zero: SFT */
    int no_scale_rewards;      /* GRPO rewards: advantages r − mean, without the std (TRL's
                                * scale_rewards=False) */
    const char *ref_model;     /* DPO/GRPO reference log-probs from this model, or NULL */
    sbp_numerics numerics;     /* of our runs (the yardstick, and the truth with no_ref) */
    sbp_unattended unattended; /* rows with no visible key, in every run and in the oracle */
    const char *lora;          /* an adapter directory: its gradients (peft's names) are audited,
                                * the base model frozen; NULL: the model's */
} sbp_audit_opts;

typedef struct {
    char name[80];
    int status;            /* 0 ok, 1 budget exceeded, 2 non-finite, 3 shape, 4 missing */
    sbp_tensor_cmp theirs; /* their tensor against the truth */
    double ours_rel_l2;    /* our run at their precision against the truth */
    double budget;
    double lower_rel_l2, lower_budget; /* our run at the next lower precision; 0: not run */
    char shape[64];
} sbp_audit_row;

typedef struct {
    sbp_audit_row *rows; /* one per parameter, in the model's order */
    int n, failed;
    char extra[512]; /* names of tensors in their file the model does not have */
    double truth_loss, our_loss;
    char their_loss[64]; /* "loss" metadata of their file, if any */
    const char *truth;
    const char *lower;  /* the lower precision measured for the diagnosis, or NULL */
    sbp_diagnosis diag; /* empty when every tensor passes */
} sbp_audit_report;

sbp_status sbp_audit(sbp_audit_report *rep, const sbp_audit_opts *o, sbp_err *err);
void sbp_audit_free(sbp_audit_report *rep);
const char *sbp_audit_status_name(int status);

#endif
