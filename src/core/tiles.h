/* tiles.h — the fast attention's tile width and the form of its backward (tiles.c): compiled
 * once, for both precisions of the kernels (src/kernels/fast/attention.c) and the FLOP count
 * (flops.c), so it lives in core, below both. */
#ifndef SBP_TILES_H
#define SBP_TILES_H

int attention_tile(int blk);          /* the largest divisor of blk up to 128 */
int attention_one_pass(int kv_heads); /* 1: the backward in one pass at this thread count */
/* Σ wq·wk over the (query tile, key tile) pairs the fast attention computes for queries [s, e)
 * on the W grid, a window of win keys (0: causal) (flops.c) */
double attention_tile_pairs(int s, int e, int W, int win);

#endif
