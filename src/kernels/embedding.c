/* embedding.c — token embedding lookup and its scatter-add backward. */
#include "kernels.h"

#include <string.h>

void embedding_forward(real *x, const int32_t *ids, const real *emb, int T, int C) {
    for (int t = 0; t < T; t++)
        memcpy(x + (size_t)t * C, emb + (size_t)ids[t] * C, sizeof(real) * (size_t)C);
}

/* Sequential in t: repeated ids accumulate in ascending token order. */
void embedding_backward(real *demb, const real *dx, const int32_t *ids, int T, int C) {
    for (int t = 0; t < T; t++) {
        real *row = demb + (size_t)ids[t] * C;
        const real *d = dx + (size_t)t * C;
        for (int c = 0; c < C; c++) row[c] += d[c];
    }
}
