/* tiles.c — the attention tile width, shared by both precisions of the kernels and by the FLOP
 * count. Tiles must divide the token block, so that chunks that are multiples of the block
 * consist of whole tiles (src/kernels/attention.c says why). */
int attention_tile(int blk);

int attention_tile(int blk) {
    int w = blk < 128 ? blk : 128;
    while (blk % w) w--;
    return w;
}
