/* rmsnorm.c — RMSNorm as HF computes it: out = (x · rsqrt(mean(x²) + eps)) · w.
 * The sums over C use the fixed lane tree (lanes.h); the weight gradient is a sum over rows
 * (tokens), one fma chain per column in ascending row order; in the fast mode
 * (rmsnorm_backward_blocked) one sum in double per block of rows, folded in ascending order. */
#include "kernels.h"
#include "lanes.h"

#include <omp.h>

void rmsnorm_forward(real *out, real *rstd, const real *x, const real *w, int M, int C,
                     double eps) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < M; r++) {
        const real *x_r = x + (size_t)r * C;
        real *out_r = out + (size_t)r * C;
        const real ss = lanes_dot(x_r, x_r, C);
        const real rs = rsqrt_(ss / (real)C + (real)eps);
        rstd[r] = rs;
        for (int c = 0; c < C; c++) out_r[c] = (x_r[c] * rs) * w[c];
    }
}

/* Forward: xhat = x·rstd, out = xhat·w. With g = dout·w:
 *   dx = rstd · (g − xhat · mean(g·xhat)),   dw = Σ_rows dout·xhat. */
void rmsnorm_backward(real *dx, real *dw, const real *dout, const real *x, const real *rstd,
                      const real *w, int M, int C) {
#pragma omp parallel if (dx)
    {
        real g[C], xh[C]; /* one row; C is at most a few thousand */
#pragma omp for schedule(static)
        for (int r = 0; r < (dx ? M : 0); r++) { /* dx NULL: dw alone */
            const real *x_r = x + (size_t)r * C, *d_r = dout + (size_t)r * C;
            real *dx_r = dx + (size_t)r * C;
            const real rs = rstd[r];
            for (int c = 0; c < C; c++) g[c] = d_r[c] * w[c], xh[c] = x_r[c] * rs;
            const real m = lanes_dot(g, xh, C) / (real)C;
            for (int c = 0; c < C; c++) dx_r[c] = dx_r[c] + rs * (g[c] - xh[c] * m);
        }
    }
    if (!dw) return; /* a frozen weight */
#pragma omp parallel if ((size_t)M * C > 65536)
    {
        /* dw: threads own column ranges; rows ascending within each column */
        const int nth = omp_get_num_threads(), id = omp_get_thread_num();
        const int c0 = (int)((long)C * id / nth), c1 = (int)((long)C * (id + 1) / nth);
        for (int r = 0; r < M; r++) {
            const real *x_r = x + (size_t)r * C, *d_r = dout + (size_t)r * C, rs = rstd[r];
            for (int c = c0; c < c1; c++) dw[c] = rfma(d_r[c], x_r[c] * rs, dw[c]);
        }
    }
}

void rmsnorm_backward_blocked(real *dx, real *dw, const real *dout, const real *x, const real *rstd,
                              const real *w, int M, int C, int blk) {
    rmsnorm_backward(dx, NULL, dout, x, rstd, w, M, C);
    if (!dw) return;
#pragma omp parallel if ((size_t)M * C > 65536)
    {
        /* threads own column ranges; per block of rows a sum from +0 in double, rows ascending
         * (each term d·xhat exact in double in the float build), then one rounded fold */
        const int nth = omp_get_num_threads(), id = omp_get_thread_num();
        const int c0 = (int)((long)C * id / nth), c1 = (int)((long)C * (id + 1) / nth);
        double p[c1 - c0 > 0 ? c1 - c0 : 1];
        for (int r0 = 0; r0 < M; r0 += blk) {
            const int r1 = M - r0 < blk ? M : r0 + blk;
            for (int c = c0; c < c1; c++) p[c - c0] = 0;
            for (int r = r0; r < r1; r++) {
                const real *x_r = x + (size_t)r * C, *d_r = dout + (size_t)r * C, rs = rstd[r];
                for (int c = c0; c < c1; c++)
                    p[c - c0] = fma((double)d_r[c], (double)(x_r[c] * rs), p[c - c0]);
            }
            for (int c = c0; c < c1; c++) dw[c] = (real)((double)dw[c] + p[c - c0]);
        }
    }
}
