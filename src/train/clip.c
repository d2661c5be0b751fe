/* clip.c — gradient clipping by global norm, as torch.nn.utils.clip_grad_norm_:
 *
 *     total_norm = vector_norm(stack([vector_norm(g) for g in grads]))   # in the grads' dtype
 *     clip_coef = max_norm / (total_norm + 1e-6)       # Tensor.__rtruediv__: reciprocal() * x
 *     clip_coef_clamped = clamp(clip_coef, max=1.0)
 *     for g in grads: g.mul_(clip_coef_clamped)
 *
 * The norm here is one sum of squares over the whole slab in float64, rounded once to the slab's
 * precision. torch sums each tensor's squares in the tensor's dtype (float32 for float32
 * gradients) in an order set by its vectorised kernels, then takes the norm of the norms, so
 * its float32 total can differ from ours in the last bits; ours is the more accurate one, and it
 * does not depend on how the slab is split into tensors (which LoRA adapters change). From the
 * rounded norm on, the coefficient and the scaling are torch's operations in the slab's
 * precision. */
#include "../core/err.h"
#include "../dist/dist.h"
#include "../streambp.h"
#include "zero2.h"

#include <math.h>
#include <stdlib.h>

enum { BLOCK = 4096 };

double sbp_grad_block_sumsq(const void *g, int64_t i0, int64_t i1, sbp_precision prec) {
    double s = 0;
    if (prec == SBP_FP64) {
        const double *x = g;
        for (int64_t i = i0; i < i1; i++) s += x[i] * x[i];
    } else {
        const float *x = g;
        for (int64_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
    }
    return s;
}

double sbp_grad_norm(const void *g, int64_t n, sbp_precision prec) {
    const int64_t nb = (n + BLOCK - 1) / BLOCK;
    double *part = malloc(sizeof *part * (size_t)(nb ? nb : 1));
    double sum = 0;
    if (!part) { /* no room for the partial sums: the same order, one thread */
        for (int64_t b = 0; b < nb; b++)
            sum +=
                sbp_grad_block_sumsq(g, b * BLOCK, (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n, prec);
        return sqrt(sum);
    }
    /* Each block's sum runs in ascending order, and the block sums are added in ascending order:
     * the same additions whatever the thread count. */
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; b++)
        part[b] =
            sbp_grad_block_sumsq(g, b * BLOCK, (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n, prec);
    for (int64_t b = 0; b < nb; b++) sum += part[b];
    free(part);
    return sqrt(sum);
}

double sbp_clip_ranges(void *g, const sbp_range *r, int nr, sbp_precision prec, double norm,
                       double max_norm) {
    if (prec == SBP_FP64) {
        double tn = norm, coef = (1.0 / (tn + 1e-6)) * max_norm;
        for (int k = 0; k < nr && max_norm > 0 && coef < 1; k++) {
            double *x = g;
#pragma omp parallel for schedule(static)
            for (int64_t i = r[k].begin; i < r[k].end; i++) x[i] = x[i] * coef;
        }
        return tn;
    }
    float tn = (float)norm, coef = (1.0f / (tn + 1e-6f)) * (float)max_norm;
    for (int k = 0; k < nr && max_norm > 0 && coef < 1; k++) {
        float *x = g;
#pragma omp parallel for schedule(static)
        for (int64_t i = r[k].begin; i < r[k].end; i++) x[i] = x[i] * coef;
    }
    return tn;
}

double sbp_clip_grad_norm(void *g, int64_t n, sbp_precision prec, double max_norm) {
    const sbp_range all = {0, n};
    return sbp_clip_ranges(g, &all, 1, prec, sbp_grad_norm(g, n, prec), max_norm);
}

sbp_status sbp_clip_grad_norm_held(double *norm, void *g, const sbp_adamw *a, const sbp_params *ps,
                                   double max_norm, sbp_err *err) {
    const int N = sbp_comm_size(a->comm);
    const int64_t nb = (ps->total + BLOCK - 1) / BLOCK;
    size_t *counts = calloc((size_t)N, sizeof *counts), *displs = calloc((size_t)N, sizeof *displs);
    sbp_range **rj = calloc((size_t)N, sizeof *rj);
    int *nj = calloc((size_t)N, sizeof *nj);
    int64_t mine = 0, *blk = NULL, *at = NULL; /* this rank's blocks, ascending; in its share */
    double *part = malloc(sizeof *part * (size_t)(nb ? nb : 1)), *all = NULL, *sums = NULL;
    sbp_status st = counts && displs && rj && nj && part ? SBP_OK : SBP_ENOMEM;
    for (int j = 0; !st && j < N; j++) { /* every rank's blocks: where its sums go */
        int64_t owned;
        if ((nj[j] = sbp_dist_owned(&rj[j], &owned, ps, N, j)) < 0) st = SBP_ENOMEM;
        counts[j] = (size_t)((owned + BLOCK - 1) / BLOCK) * sizeof(double);
        displs[j] = j ? displs[j - 1] + counts[j - 1] : 0;
    }
    const int r = sbp_comm_rank(a->comm);
    if (!st) {
        mine = (int64_t)(counts[r] / sizeof(double));
        blk = malloc(sizeof *blk * (size_t)(mine ? mine : 1));
        at = malloc(sizeof *at * (size_t)(mine ? mine : 1));
        sums = malloc(sizeof *sums * (size_t)(mine ? mine : 1));
        all = malloc(displs[N - 1] + counts[N - 1] + sizeof(double));
        if (!blk || !at || !sums || !all) st = SBP_ENOMEM;
    }
    int64_t held = 0; /* the share packs the held ranges, each of whole blocks, in order */
    for (int k = 0, t = 0; !st && k < a->n_held; k++) {
        for (int64_t b = a->held[k].begin / BLOCK; b * BLOCK < a->held[k].end && t < mine; b++)
            blk[t] = b, at[t++] = held + b * BLOCK - a->held[k].begin;
        held += a->held[k].end - a->held[k].begin;
    }
    if (st) sbp_fail(err, SBP_ENOMEM, "out of memory for the clip norm's block sums");
#pragma omp parallel for schedule(static) if (!st)
    for (int64_t t = 0; t < mine; t++)
        sums[t] = sbp_grad_block_sumsq(
            g, at[t],
            at[t] + ((blk[t] + 1) * BLOCK < ps->total ? BLOCK : ps->total - blk[t] * BLOCK),
            a->prec);
    if (!st)
        st = sbp_comm_allgatherv(a->comm, all, sums, counts, displs, "the clip norm's block sums",
                                 err);
    for (int j = 0; !st && j < N; j++) /* rank j's sums are its blocks' in ascending order */
        for (int k = 0, t = 0; k < nj[j]; k++)
            for (int64_t b = rj[j][k].begin / BLOCK; b * BLOCK < rj[j][k].end; b++)
                part[b] = all[displs[j] / sizeof(double) + t++];
    double sum = 0; /* ascending block order, as sbp_grad_norm */
    for (int64_t b = 0; !st && b < nb; b++) sum += part[b];
    const sbp_range share = {0, held};
    if (!st) *norm = sbp_clip_ranges(g, &share, 1, a->prec, sqrt(sum), max_norm);
    for (int j = 0; rj && j < N; j++) free(rj[j]);
    free(counts), free(displs), free(rj), free(nj), free(blk), free(at), free(sums), free(all),
        free(part);
    return st;
}
