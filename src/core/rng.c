/* rng.c — xoshiro256** (Blackman & Vigna) seeded through splitmix64. */
#include "rng.h"
#include "pmath.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

void sbp_rng_seed(sbp_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

uint64_t sbp_rng_next(sbp_rng *r) {
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double sbp_rng_uniform(sbp_rng *r) {
    return (double)(sbp_rng_next(r) >> 11) * 0x1p-53;
}

double sbp_rng_normal(sbp_rng *r) {
    double u1 = 1.0 - sbp_rng_uniform(r), u2 = sbp_rng_uniform(r); /* u1 in (0, 1] */
    /* our own log and cos: a seeded model has the same weights on every machine */
    return sqrt(-2.0 * sbp_plog(u1)) * sbp_pcos(6.283185307179586 * u2);
}
