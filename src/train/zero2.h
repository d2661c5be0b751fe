/* zero2.h — the optimizer's side of a distributed run (ZeRO-2, docs/distributed.md §4), internal
 * to src/train.
 *
 * Under mpirun (N > 1) each rank keeps AdamW's moments only for the 4096-element blocks it owns
 * (src/dist/owners.c, the grid the clip norm and AdamW use), computes the clip norm's block sums
 * and the AdamW update only there, and sends its updated weights to the others. The clip norm's
 * global sum is the one-process sum: every block's sum, all-gathered as exact bytes, added in
 * ascending block order. So the weights, the moments and the norm are the one-process bits. */
#ifndef SBP_TRAIN_ZERO2_H
#define SBP_TRAIN_ZERO2_H

#include "../streambp.h"

/* The sum of squares of g[i0, i1) in float64, ascending: one block of sbp_grad_norm. */
double sbp_grad_block_sumsq(const void *g, int64_t i0, int64_t i1, sbp_precision prec);
/* Scales g's elements in the ranges r (nr) by min(1, max_norm · 1/(norm + 1e-6)) in prec, as
 * sbp_clip_grad_norm does with the norm of the whole slab; returns the norm rounded to prec. */
double sbp_clip_ranges(void *g, const sbp_range *r, int nr, sbp_precision prec, double norm,
                       double max_norm);
/* The clip norm of a gradient of which this rank holds its blocks (a->held) only, g its share
 * (the held ranges packed in order, as sbp_dist_grad leaves it), the same bits as
 * sbp_clip_grad_norm over the whole gradient; clips the share. *norm: the norm rounded to prec.
 * Collective over a->comm. */
sbp_status sbp_clip_grad_norm_held(double *norm, void *g /* (held) */, const sbp_adamw *a,
                                   const sbp_params *ps, double max_norm, sbp_err *err);

/* AdamW for ps's slab as sbp_adamw_init, and under a comm of N > 1 processes the moments of this
 * rank's blocks only (a->held). */
sbp_status sbp_adamw_init_held(sbp_adamw *a, const sbp_adamw_opts *o, sbp_precision prec,
                               const sbp_params *ps, struct sbp_comm *comm, sbp_ledger *lg,
                               sbp_err *err);

#endif
