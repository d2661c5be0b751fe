/* tiles.c — the fast attention's tile width and the form of its backward, shared by both
 * precisions of the kernels and by the FLOP count. Tiles must divide the token block, so that
 * chunks that are multiples of the block consist of whole tiles (src/kernels/fast/attention.c
 * says why). */
#ifdef _OPENMP
#include <omp.h>
#endif

#include "tiles.h"

int attention_tile(int blk) {
    int w = blk < 128 ? blk : 128;
    while (blk % w) w--;
    return w;
}

/* The backward runs in one pass (5 tile products per pair) when the kv heads divide among the
 * threads, else in two (7); both give the same bits. */
int attention_one_pass(int kv_heads) {
#ifdef _OPENMP
    return kv_heads % omp_get_max_threads() == 0;
#else
    (void)kv_heads; /* a build without OpenMP (the fuzz targets) runs on one thread */
    return 1;
#endif
}
