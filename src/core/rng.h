/* rng.h — a small, portable, seeded generator (xoshiro256** seeded by splitmix64), so that
 * `streambp init --seed N` writes the same model on every machine. */
#ifndef SBP_RNG_H
#define SBP_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
} sbp_rng;

void sbp_rng_seed(sbp_rng *r, uint64_t seed);
uint64_t sbp_rng_next(sbp_rng *r);
double sbp_rng_uniform(sbp_rng *r); /* [0, 1) with 53 random bits */
double sbp_rng_normal(sbp_rng *r);  /* N(0, 1), Box-Muller */

#endif
