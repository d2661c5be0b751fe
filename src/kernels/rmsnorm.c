/* rmsnorm.c — RMSNorm as HF computes it: out = (x · rsqrt(mean(x²) + eps)) · w. */
#include "kernels.h"

void rmsnorm_forward(real *out, real *rstd, const real *x, const real *w, int M, int C,
                     double eps) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < M; r++) {
        const real *x_r = x + (size_t)r * C;
        real *out_r = out + (size_t)r * C;
        real ss = 0;
        for (int c = 0; c < C; c++) ss += x_r[c] * x_r[c];
        real rs = rsqrt_(ss / C + (real)eps);
        rstd[r] = rs;
        for (int c = 0; c < C; c++) out_r[c] = (x_r[c] * rs) * w[c];
    }
}

/* Forward: xhat = x·rstd, out = xhat·w. With g = dout·w:
 *   dx = rstd · (g − xhat · mean(g·xhat)),   dw = Σ_rows dout·xhat. */
void rmsnorm_backward(real *dx, real *dw, const real *dout, const real *x, const real *rstd,
                      const real *w, int M, int C) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < M; r++) {
        const real *x_r = x + (size_t)r * C, *d_r = dout + (size_t)r * C;
        real *dx_r = dx + (size_t)r * C, rs = rstd[r], dot = 0;
        for (int c = 0; c < C; c++) dot += (d_r[c] * w[c]) * (x_r[c] * rs);
        real m = dot / C;
        for (int c = 0; c < C; c++) dx_r[c] += rs * (d_r[c] * w[c] - (x_r[c] * rs) * m);
    }
    /* dw: a sum over rows, in ascending row order for every column. */
    for (int r = 0; r < M; r++) {
        const real *x_r = x + (size_t)r * C, *d_r = dout + (size_t)r * C;
        real rs = rstd[r];
        for (int c = 0; c < C; c++) dw[c] += d_r[c] * (x_r[c] * rs);
    }
}
