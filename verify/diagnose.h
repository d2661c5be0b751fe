/* diagnose.h — what a failed gradient comparison means, in a few lines a person can act on.
 *
 * Input: one row per tensor as `verify audit` or `verify diff` measured it (relative L2 against
 * the reference, the best single scale factor and what is left after it, cosine, whether the
 * values fit a narrower float type) with the threshold it was judged by. Output: at most
 * SBP_DIAG_MAX lines, each a measured fact plus a hint, from these rules (thresholds in
 * diagnose.c):
 *   names      missing tensors that an extra tensor matches once a wrapper prefix is stripped
 *              (module., _orig_mod., base_model.model.), or a separate lm_head of a tied model;
 *   nonfinite  NaN/Inf: the first tensor in backward order (head first, embedding last);
 *   scale      failures that one factor explains ("the truth times 0.904762 = 19/21"), the same
 *              factor everywhere or several; or mostly a factor with parts scaled differently;
 *   precision  errors at the level of a lower precision than claimed (fp64 with float32-level
 *              error: float32 islands; fp32 with bf16-level error), and values that all fit
 *              float32 or bfloat16;
 *   layers     failures confined to some layers, the embedding, the final norm or the head;
 *              the bottom layers up to some k (an error entering the backward at layer k);
 *   kinds      failures confined to one kind of tensor (k_proj and v_proj: the K/V path; norm
 *              weights; biases; the MLP);
 *   top        every part fails with no common factor: an error at the top of the backward.
 * Library code: nothing here prints. */
#ifndef SBP_DIAGNOSE_H
#define SBP_DIAGNOSE_H

#include "../src/streambp.h"
#include "metrics.h"

typedef enum { SBP_DIAG_UNKNOWN, SBP_DIAG_FP64, SBP_DIAG_FP32, SBP_DIAG_BF16 } sbp_diag_prec;

typedef struct {
    const char *name;
    int kind;            /* sbp_param_kind, or -1 for a name that is not a decoder parameter */
    int layer;           /* -1 outside the layers */
    int missing;         /* in the reference, not in the file judged */
    int judged;          /* compared element by element (not missing, same shape) */
    int failed;          /* judged and failed: over the threshold, or NaN/Inf */
    int shape;           /* a shape mismatch (not judged) */
    sbp_tensor_cmp cmp;  /* when judged: the file judged against the reference */
    double budget;       /* relative-L2 threshold it was judged by; 0: none (bitwise, ULP...) */
    double lower_budget; /* the threshold at the next lower precision; 0: unknown */
} sbp_diag_row;

typedef struct {
    sbp_diag_prec claimed; /* the precision the file judged claims */
    sbp_diag_prec lower;   /* what lower_budget was measured at (SBP_DIAG_UNKNOWN: none) */
    int tied;              /* the model ties lm_head to the embedding (1), not (0), unknown (-1) */
    const char *const *extra; /* names in the file judged that the reference does not have */
    int n_extra;
    const char *reference;  /* what the rows were compared with; NULL: "the truth" */
    const char *their_loss; /* "loss" metadata of the file judged, or NULL */
    double truth_loss;      /* the reference's loss; used when their_loss is set */
} sbp_diag_input;

#define SBP_DIAG_MAX 8

typedef struct {
    int n;
    char rule[SBP_DIAG_MAX][16]; /* "names", "nonfinite", "scale", "precision", "layers", ... */
    char text[SBP_DIAG_MAX][480];
} sbp_diagnosis;

/* Fills d (zeroed first) from n rows in the reference's order (the model's, HF state_dict). */
void sbp_diagnose(sbp_diagnosis *d, const sbp_diag_row *rows, int n, const sbp_diag_input *in);
/* Adds one line (when there is room); for facts only the caller knows (file metadata). */
void sbp_diag_add(sbp_diagnosis *d, const char *rule, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The kind and layer of a HF parameter name (-1, -1 when it is none of ours). */
void sbp_diag_classify(const char *name, int *kind, int *layer);
/* The fraction p/q (1 <= q <= max_den, from the continued fraction of x) closest to x, when it is
 * within tol·|x|; returns 0 when there is none. */
int sbp_diag_fraction(double x, int max_den, double tol, long *p, long *q);

#endif
