/* logprob.cu — log p(target) under softmax(logits) and its gradient on the GPU
 * (src/kernels/logprob.c is the CPU's): one warp per row, the max and the sum over V by the
 * 32-lane tree of src/kernels/lanes.h (the sum in double). */
#include "cuda.cuh"

namespace SBP_CUDA_NS {

__global__ void logprob_forward_kernel(double *logp, double *lse, const real *logits,
                                       const int32_t *target, int M, int V) {
    const int lane = threadIdx.x % WARP, r = blockIdx.x * WARPS + threadIdx.x / WARP;
    if (r >= M) return; /* the whole warp */
    if (target[r] < 0) {
        if (lane == 0) logp[r] = lse[r] = 0;
        return;
    }
    const real *z = logits + (size_t)r * V;
    real m = -INFINITY;
    for (int c = lane; c < V; c += WARP) m = z[c] > m ? z[c] : m;
    for (int w = WARP / 2; w; w /= 2) {
        const real o = __shfl_down_sync(FULL_MASK, m, w);
        m = o > m ? o : m;
    }
    const real mx = __shfl_sync(FULL_MASK, m, 0);
    double s = 0;
    for (int c = lane; c < V; c += WARP) s = s + (double)rexp(z[c] - mx);
    for (int w = WARP / 2; w; w /= 2) s = s + __shfl_down_sync(FULL_MASK, s, w);
    if (lane == 0) {
        lse[r] = (double)mx + sbp_plog(s);
        logp[r] = (double)z[target[r]] - lse[r];
    }
}

/* dL/dz_v = coef · (δ_vy − softmax_v); rows without a target or with coef 0 become zero */
__global__ void logprob_backward_kernel(real *logits, const double *coef, const double *lse,
                                        const int32_t *target, int M, int V) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)M * V) return;
    const int r = (int)(i / V), v = (int)(i % V), y = target[r];
    real *z = logits + i;
    if (y < 0 || coef[r] == 0) {
        *z = 0;
        return;
    }
    const real c = (real)coef[r], l = (real)lse[r];
    *z = v == y ? c * (1 - rexp(*z - l)) : -c * rexp(*z - l);
}

void logprob_forward(const eng *e, double *logp, double *lse, const real *logits,
                     const int32_t *target, int M) {
    SBP_LAUNCH(logprob_forward_kernel, blocks_for((size_t)M, WARPS), THREADS, 0, logp, lse, logits,
               target, M, e->V);
    check(e, "logprob_forward_kernel");
}

void logprob_backward(const eng *e, real *logits, const double *coef, const double *lse,
                      const int32_t *target, int M) {
    SBP_LAUNCH(logprob_backward_kernel, blocks_for((size_t)M * e->V, THREADS), THREADS, 0, logits,
               coef, lse, target, M, e->V);
    check(e, "logprob_backward_kernel");
}

} // namespace SBP_CUDA_NS
