/* embedding.c — token embedding lookup and its scatter-add backward. */
#include "kernels.h"

#include <omp.h>
#include <string.h>

void embedding_forward(real *x, const int32_t *ids, const real *emb, int T, int C) {
    for (int t = 0; t < T; t++)
        memcpy(x + (size_t)t * C, emb + (size_t)ids[t] * C, sizeof(real) * (size_t)C);
}

/* A sum over tokens: repeated ids accumulate in ascending token order, continuing from the
 * stored row. Threads own column ranges, so each element's chain stays in one thread. */
void embedding_backward(real *demb, const real *dx, const int32_t *ids, int T, int C) {
#pragma omp parallel if ((size_t)T * C > 65536)
    {
        const int nth = omp_get_num_threads(), id = omp_get_thread_num();
        const int c0 = (int)((long)C * id / nth), c1 = (int)((long)C * (id + 1) / nth);
        for (int t = 0; t < T; t++) {
            real *row = demb + (size_t)ids[t] * C;
            const real *d = dx + (size_t)t * C;
            for (int c = c0; c < c1; c++) row[c] = row[c] + d[c];
        }
    }
}
