/* bf16.c — rounding to bfloat16 in place, for the engine's bf16-emulating mode. */
#include "kernels.h"

#include <string.h>

/* Round to nearest even on the upper 16 bits of the float; NaN stays NaN. */
static float to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return f;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* In the double build the value is rounded to float first, so it can round twice; the engine
 * emulates bf16 only in the float build (sbp_grad refuses a float64 model). */
void round_to_bf16(real *x, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) x[i] = (real)to_bf16((float)x[i]);
}
