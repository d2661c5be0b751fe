/* rope.c — rotary position embedding, HF's rotate-half convention (pairs i and i + HD/2). */
#include "kernels.h"

void rope_table(real *cos_t, real *sin_t, int T, int HD, double theta, int llama3, double factor,
                double low_freq, double high_freq, double orig_max) {
    const int half = HD / 2;
    for (int i = 0; i < half; i++) {
        const double f =
            sbp_rope_inv_freq(i, HD, theta, llama3, factor, low_freq, high_freq, orig_max);
#pragma omp parallel for schedule(static) if (T > 4096)
        for (int t = 0; t < T; t++) {
            double sn, cs;
#ifdef SBP_PLANT_F32_ROPE_ANGLE /* planted (tests/test_plant.c): the angle rounded to float */
            sbp_psincos((float)(t * f), &sn, &cs);
#else
            sbp_psincos(t * f, &sn, &cs);
#endif
            cos_t[(size_t)t * half + i] = (real)cs;
            sin_t[(size_t)t * half + i] = (real)sn;
        }
    }
}

/* The forward rotates by +angle; the backward is the transpose, a rotation by −angle. */
static void rotate(real *x, const real *cos_t, const real *sin_t, int s, int M, int H, int HD,
                   real sign) {
    const int half = HD / 2;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < M; r++) {
        const real *c = cos_t + (size_t)(s + r) * half, *sn = sin_t + (size_t)(s + r) * half;
        for (int h = 0; h < H; h++) {
            real *x1 = x + ((size_t)r * H + h) * HD, *x2 = x1 + half;
            for (int i = 0; i < half; i++) {
                const real a = x1[i], b = x2[i], si = sign * sn[i];
                x1[i] = a * c[i] - b * si;
                x2[i] = b * c[i] + a * si;
            }
        }
    }
}

void rope_forward(real *x, const real *cos_t, const real *sin_t, int s, int M, int H, int HD) {
    rotate(x, cos_t, sin_t, s, M, H, HD, 1);
}

void rope_backward(real *dx, const real *cos_t, const real *sin_t, int s, int M, int H, int HD) {
    rotate(dx, cos_t, sin_t, s, M, H, HD, -1);
}
