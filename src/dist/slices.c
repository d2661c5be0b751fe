/* slices.c — the rows each rank of a sequence group holds (seqlink.h). */
#include "seqlink.h"

int sbp_seq_slices(int *bounds, int T, int S, int grain) {
    if (S < 1 || T < 1 || grain < 1) return 0;
    const int n = T / grain + (T % grain != 0); /* grains, the last possibly short */
    if (n < S) return 0;
    bounds[0] = 0;
    for (int q = 0; q < S; q++) {
        const int g = n / S + (q < n % S); /* grains of rank q */
        const long end = (long)bounds[q] + (long)g * grain;
        bounds[q + 1] = end < T ? (int)end : T;
    }
    return 1;
}
