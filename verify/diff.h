/* diff.h — comparing two gradient files tensor by tensor, by HF name. */
#ifndef SBP_DIFF_H
#define SBP_DIFF_H

#include "../src/streambp.h"
#include "diagnose.h"
#include "metrics.h"

/* What must hold for a tensor to pass. Several may be set; all must hold. */
typedef struct {
    int bitwise; /* identical dtype and bytes */
    int use_ulp; /* max ULP distance <= ulp */
    double ulp;
    int use_allclose; /* every |a−b| <= atol + rtol·|b| */
    double rtol, atol;
    int use_rel_l2; /* ‖a−b‖/‖b‖ <= rel_l2 */
    double rel_l2;
} sbp_promise;

typedef enum {
    SBP_ROW_OK,
    SBP_ROW_MISMATCH,  /* the promise does not hold */
    SBP_ROW_NONFINITE, /* NaN/Inf in A (the file judged) */
    SBP_ROW_SHAPE,     /* shapes differ */
    SBP_ROW_MISSING,   /* in B (the reference) but not in A */
    SBP_ROW_EXTRA,     /* in A but not in B */
} sbp_row_status;

typedef struct {
    char name[160];
    sbp_row_status status;
    sbp_dtype dtype_a, dtype_b;
    char shape_a[64], shape_b[64];
    sbp_tensor_cmp cmp;
    double a_at_first, b_at_first; /* values at cmp.first_diff */
} sbp_diff_row;

typedef struct {
    sbp_diff_row *rows; /* in B's order, then A's extra tensors */
    int n;
    int n_failed, n_bitwise;
    char loss_a[64], loss_b[64]; /* "loss" metadata if present */
    sbp_diagnosis diag;          /* what the failures have in common (diagnose.h); B is taken
                                  * as the reference, A's precision as its dtype's */
} sbp_diff;

/* Compares every tensor of file a against file b (the reference). Tensors with non-float dtypes
 * are an input error. */
sbp_status sbp_diff_files(sbp_diff *d, const char *a, const char *b, const sbp_promise *p,
                          sbp_err *err);
void sbp_diff_free(sbp_diff *d);
/* Whether a row's comparison satisfies p (status must be OK or MISMATCH). */
int sbp_promise_holds(const sbp_promise *p, const sbp_diff_row *r);
const char *sbp_row_status_name(sbp_row_status s);

#endif
