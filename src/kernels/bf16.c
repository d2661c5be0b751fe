/* bf16.c — rounding to bfloat16 in place, for the engine's bf16-emulating mode. */
#include "../core/bf16.h"
#include "kernels.h"

/* In the double build the value is rounded to float first, so it can round twice; the engine
 * emulates bf16 only in the float build (sbp_grad refuses a float64 model). */
void round_to_bf16(real *x, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) x[i] = (real)sbp_round_bf16((float)x[i]);
}
