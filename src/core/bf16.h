/* bf16.h — rounding a float to the nearest bfloat16 (ties to even), kept as a float: the
 * engine's bf16-emulating mode (src/kernels/bf16.c) and the distributed fold of bf16 gradients
 * (src/dist/exchange.c) round the same way. NaN stays NaN (its payload untouched). */
#ifndef SBP_BF16_H
#define SBP_BF16_H

#include <stdint.h>
#include <string.h>

static inline float sbp_round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return f;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

#endif
