/* fd.h — finite-difference spot checks of the analytic gradient, in float64.
 *
 * For a random unit direction u (restricted to one tensor, or spread over all of them), the
 * directional derivative g·u of the analytic gradient is compared with
 *   central:  (L(w + hu) − L(w − hu)) / 2h                          error O(h²) + O(ε/h)
 *   4-point:  (8(L(w + hu) − L(w − hu)) − (L(w + 2hu) − L(w − 2hu))) / 12h   error O(h⁴) + O(ε/h)
 * The model must be float64. */
#ifndef SBP_FD_H
#define SBP_FD_H

#include "../src/streambp.h"

typedef struct {
    char name[80];   /* a tensor name, or "(all parameters)" */
    double analytic; /* g·u */
    double central, four_point;
    double err_central, err_four; /* |fd − g·u| / max(|g·u|, floor) */
} sbp_fd_row;

typedef struct {
    sbp_fd_row *rows; /* one per tensor, then one for a direction over all parameters */
    int n;
    double step;
    double loss;
    double worst_four, worst_central;
} sbp_fd_report;

/* Runs the checks with schedule s (block/chunk as in opts); m must be SBP_FP64 and is perturbed
 * in place and restored bit for bit. */
sbp_status sbp_fd_check(sbp_fd_report *rep, sbp_model *m, const sbp_batch *b,
                        const sbp_grad_opts *opts, double step, uint64_t seed, sbp_err *err);
void sbp_fd_free(sbp_fd_report *rep);

#endif
