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
#include "../streambp.h"

#include <math.h>
#include <stdlib.h>

enum { BLOCK = 4096 };

double sbp_grad_norm(const void *g, int64_t n, sbp_precision prec) {
    const int64_t nb = (n + BLOCK - 1) / BLOCK;
    double *part = malloc(sizeof *part * (size_t)(nb ? nb : 1));
    double sum = 0;
    if (!part) { /* no room for the partial sums: the same order, one thread */
        for (int64_t b = 0; b < nb; b++) {
            double s = 0;
            for (int64_t i = b * BLOCK; i < n && i < (b + 1) * BLOCK; i++) {
                double x = prec == SBP_FP64 ? ((const double *)g)[i] : ((const float *)g)[i];
                s += x * x;
            }
            sum += s;
        }
        return sqrt(sum);
    }
    /* Each block's sum runs in ascending order, and the block sums are added in ascending order:
     * the same additions whatever the thread count. */
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * BLOCK, i1 = i0 + BLOCK < n ? i0 + BLOCK : n;
        double s = 0;
        if (prec == SBP_FP64) {
            const double *x = g;
            for (int64_t i = i0; i < i1; i++) s += x[i] * x[i];
        } else {
            const float *x = g;
            for (int64_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        }
        part[b] = s;
    }
    for (int64_t b = 0; b < nb; b++) sum += part[b];
    free(part);
    return sqrt(sum);
}

double sbp_clip_grad_norm(void *g, int64_t n, sbp_precision prec, double max_norm) {
    double norm = sbp_grad_norm(g, n, prec);
    if (prec == SBP_FP64) {
        double tn = norm, coef = (1.0 / (tn + 1e-6)) * max_norm;
        if (max_norm > 0 && coef < 1) {
            double *x = g;
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < n; i++) x[i] = x[i] * coef;
        }
        return tn;
    }
    float tn = (float)norm, coef = (1.0f / (tn + 1e-6f)) * (float)max_norm;
    if (max_norm > 0 && coef < 1) {
        float *x = g;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) x[i] = x[i] * coef;
    }
    return tn;
}
