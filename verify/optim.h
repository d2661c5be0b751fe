/* optim.h — the training arithmetic checked on this machine (`streambp verify optim`): a few
 * optimizer steps through the library's train-step API (sbp_train_step: clipping, AdamW with
 * weight decay and bias correction, at the learning rates of a warm-up schedule), of the full
 * weights and of a LoRA adapter, in both precisions, against the float64 oracle of
 * ref/adamw.c. The oracle is given the library's own gradient of each step (sbp_grad_batches on
 * the same state, before the step), so the check isolates the optimizer from the gradient, which
 * the other groups of verify judge. Its weight-decay groups come from the tensor names (HF
 * Trainer: every bias and norm weight), not from the library's sbp_params_no_decay.
 *
 * Compared after every step, each the worst over the steps and the tensors:
 *   weights     the change of each tensor since the start, max |Δlib − Δref| / max |Δref|;
 *   exp_avg,    the moments, max |lib − ref| / max |ref| per tensor;
 *   exp_avg_sq
 *   lr          the schedule's learning rate, relative;
 *   grad norm   the norm before clipping that the step returns, relative.
 * Budgets: float64 SBP_OPTIM_BUDGET64 (rounding only: the library's operation order is
 * torch's kernels', the oracle's the documented formula); float32 SBP_OPTIM_BUDGET32, measured
 * (worst seen on these cases 1.2e-5: a norm weight near 1 moved by lr/2 ≈ 5e-3, so one float32
 * rounding of the weight is 6e-8 / 5e-3; times a margin) — a wrong formula (a bias
 * correction off by one step, a decay on the wrong group, a missing clip) is off by far more. */
#ifndef SBP_VERIFY_OPTIM_H
#define SBP_VERIFY_OPTIM_H

#include "../src/streambp.h"

#define SBP_OPTIM_BUDGET64 1e-12
#define SBP_OPTIM_BUDGET32 1e-4
#define SBP_OPTIM_STEPS    6

enum { SBP_OQ_WEIGHTS, SBP_OQ_EXP_AVG, SBP_OQ_EXP_AVG_SQ, SBP_OQ_LR, SBP_OQ_NORM, SBP_OQ_N };

typedef struct {
    char name[48]; /* "full weights fp64, cosine, clip 0.05" */
    sbp_precision prec;
    double budget;
    double worst[SBP_OQ_N];       /* relative difference, worst over the steps and tensors */
    char where[SBP_OQ_N][112];    /* the tensor and step of the worst */
    double norm[SBP_OPTIM_STEPS]; /* the library's gradient norm of each step (before clipping) */
    double max_norm;              /* the clipping norm */
    int failed;                   /* quantities over budget */
} sbp_optim_case;

typedef struct {
    sbp_optim_case c[4]; /* full fp64, full fp32, lora fp64, lora fp32 */
    int n, steps, failed;
} sbp_optim_report;

extern const char *const sbp_optim_quantity[SBP_OQ_N];

/* Runs the cases; a library error (out of memory) is returned, a difference is a failed case. */
sbp_status sbp_verify_optim(sbp_optim_report *rep, sbp_err *err);

/* The comparison of one slab laid out as ps: the largest over its tensors of
 * max |got − want| / max |want − base| (base NULL: zeros; got in prec, the rest float64). A
 * tensor whose reference is all base must match it exactly (else +inf). *worst: the tensor. */
double sbp_optim_diff(const sbp_params *ps, const void *got, sbp_precision prec, const double *want,
                      const double *base, int *worst);

#endif
