/* rope.cu — rotary position embedding on the GPU (src/kernels/rope.c is the CPU's). The tables
 * are built on the host with pmath.h's functions, the same values as the CPU's, and uploaded. */
#include "cuda.cuh"

#include <stdlib.h>

namespace SBP_CUDA_NS {

void rope_table(const eng *e, real *cos_d, real *sin_d) {
    const sbp_config *c = e->cfg;
    const int T = e->T, HD = e->HD, half = HD / 2;
    real *cs = (real *)malloc(sizeof(real) * (size_t)T * half);
    real *sn = (real *)malloc(sizeof(real) * (size_t)T * half);
    if (!cs || !sn) {
        free(cs), free(sn);
        device_state *d = (device_state *)e->backend;
        if (!d->failed) d->failed = 1, snprintf(d->msg, sizeof d->msg, "out of host memory");
        return;
    }
    for (int i = 0; i < half; i++) {
        /* the scaling's kind as sbp_rope_inv_freq takes it: 1 llama3, 2 linear */
        const int scaling = c->rope_llama3 ? 1 : c->rope_linear ? 2 : 0;
        const double f = sbp_rope_inv_freq(i, HD, c->rope_theta, scaling, c->rope_factor,
                                           c->rope_low_freq, c->rope_high_freq, c->rope_orig_max);
        for (int t = 0; t < T; t++) {
            double s, co;
            sbp_psincos(t * f, &s, &co);
            cs[(size_t)t * half + i] = (real)co;
            sn[(size_t)t * half + i] = (real)s;
        }
    }
    cudaMemcpy(cos_d, cs, sizeof(real) * (size_t)T * half, cudaMemcpyHostToDevice);
    cudaMemcpy(sin_d, sn, sizeof(real) * (size_t)T * half, cudaMemcpyHostToDevice);
    free(cs), free(sn);
    check(e, "RoPE tables");
}

/* (a, b) = (x[i], x[i + HD/2]) -> (a·cos − b·s, b·cos + a·s), s = sign·sin */
__global__ void rotate_kernel(real *x, const real *cos_t, const real *sin_t, int s, int M, int H,
                              int HD, real sign) {
    const int half = HD / 2;
    const size_t n = (size_t)M * H * half, id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= n) return;
    const int i = (int)(id % half), rh = (int)(id / half), r = rh / H;
    real *x1 = x + (size_t)rh * HD, *x2 = x1 + half;
    const real c = cos_t[(size_t)(s + r) * half + i], si = sign * sin_t[(size_t)(s + r) * half + i];
    const real a = x1[i], b = x2[i];
    x1[i] = a * c - b * si;
    x2[i] = b * c + a * si;
}

void rope_forward(const eng *e, real *x, int s, int M, int H) {
    SBP_LAUNCH(rotate_kernel, blocks_for((size_t)M * H * (e->HD / 2), THREADS), THREADS, 0, x,
               e->cos, e->sin, s, M, H, e->HD, (real)1);
    check(e, "rotate_kernel");
}

void rope_backward(const eng *e, real *dx, int s, int M, int H) {
    SBP_LAUNCH(rotate_kernel, blocks_for((size_t)M * H * (e->HD / 2), THREADS), THREADS, 0, dx,
               e->cos, e->sin, s, M, H, e->HD, (real)-1);
    check(e, "rotate_kernel");
}

} // namespace SBP_CUDA_NS
