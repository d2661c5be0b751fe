/* rmsnorm.cu — RMSNorm on the GPU (src/kernels/rmsnorm.c is the CPU's): one warp per row, lane k
 * summing the elements ≡ k (mod 32) in ascending order, then the halving tree by shuffles — the
 * 32-lane tree of src/kernels/lanes.h. The weight gradient is one chain per column over the rows
 * in ascending order. */
#include "cuda.cuh"

namespace SBP_CUDA_NS {

/* The halving tree of lanes.h over the warp: the total, in every lane. */
__device__ inline real warp_sum(real s) {
    for (int w = WARP / 2; w; w /= 2) s = s + __shfl_down_sync(FULL_MASK, s, w);
    return __shfl_sync(FULL_MASK, s, 0);
}

__global__ void rmsnorm_forward_kernel(real *out, real *rstd, const real *x, const real *w, int M,
                                       int C, real eps) {
    const int lane = threadIdx.x % WARP, r = blockIdx.x * WARPS + threadIdx.x / WARP;
    if (r >= M) return; /* the whole warp: no warp operation names it */
    const real *x_r = x + (size_t)r * C;
    real s = 0;
    for (int c = lane; c < C; c += WARP) s = rfma(x_r[c], x_r[c], s);
    const real ss = warp_sum(s);
    const real rs = rsqrt_(ss / (real)C + eps);
    if (lane == 0) rstd[r] = rs;
    for (int c = lane; c < C; c += WARP) out[(size_t)r * C + c] = (x_r[c] * rs) * w[c];
}

/* dx = rstd · (g − xhat · mean(g·xhat)), g = dout·w, xhat = x·rstd */
__global__ void rmsnorm_dx_kernel(real *dx, const real *dout, const real *x, const real *rstd,
                                  const real *w, int M, int C) {
    const int lane = threadIdx.x % WARP, r = blockIdx.x * WARPS + threadIdx.x / WARP;
    if (r >= M) return;
    const real *x_r = x + (size_t)r * C, *d_r = dout + (size_t)r * C, rs = rstd[r];
    real s = 0;
    for (int c = lane; c < C; c += WARP) s = rfma(d_r[c] * w[c], x_r[c] * rs, s);
    const real m = warp_sum(s) / (real)C;
    real *dx_r = dx + (size_t)r * C;
    for (int c = lane; c < C; c += WARP)
        dx_r[c] = dx_r[c] + rs * (d_r[c] * w[c] - (x_r[c] * rs) * m);
}

/* dw(c) += Σ_r dout(r, c)·xhat(r, c), rows ascending */
__global__ void rmsnorm_dw_kernel(real *dw, const real *dout, const real *x, const real *rstd,
                                  int M, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    real acc = dw[c];
    for (int r = 0; r < M; r++)
        acc = rfma(dout[(size_t)r * C + c], x[(size_t)r * C + c] * rstd[r], acc);
    dw[c] = acc;
}

void rmsnorm_forward(const eng *e, real *out, real *rstd, const real *x, const real *w, int M,
                     int C) {
    SBP_LAUNCH(rmsnorm_forward_kernel, blocks_for((size_t)M, WARPS), THREADS, 0, out, rstd, x, w, M,
               C, (real)e->cfg->eps);
    check(e, "rmsnorm_forward_kernel");
}

void rmsnorm_backward(const eng *e, real *dx, real *dw, const real *dout, const real *x,
                      const real *rstd, const real *w, int M, int C) {
    SBP_LAUNCH(rmsnorm_dx_kernel, blocks_for((size_t)M, WARPS), THREADS, 0, dx, dout, x, rstd, w, M,
               C);
    check(e, "rmsnorm_dx_kernel");
    if (!dw) return; /* a frozen weight */
    SBP_LAUNCH(rmsnorm_dw_kernel, blocks_for((size_t)C, THREADS), THREADS, 0, dw, dout, x, rstd, M,
               C);
    check(e, "rmsnorm_dw_kernel");
}

} // namespace SBP_CUDA_NS
