/* owners.c — who owns which part of the gradient slab, and the pieces a bucket is cut into.
 *
 * Ownership is per 4096-element block of the flat slab, the grid sbp_grad_norm and AdamW already
 * use: the blocks that start inside a bucket are dealt to the N ranks in N contiguous runs
 * (rank r gets blocks [c·r/N, c·(r+1)/N) of the bucket's c), so every bucket's traffic uses every
 * link; a block that straddles a bucket boundary keeps the owner of the bucket it starts in. A
 * bucket is then cut into pieces wherever the owner changes: at most N + 1 per bucket. */
#include "../core/err.h"
#include "dist.h"

#include <stdlib.h>

enum { BLOCK = SBP_DIST_BLOCK };

/* The owner of block blk: dealt within the bucket (in slab order) where the block starts. */
static int block_owner(const sbp_bucket *slab_order, int nb, int64_t blk, int N) {
    const int64_t start = blk * BLOCK;
    for (int i = 0; i < nb; i++) {
        const sbp_bucket *b = &slab_order[i];
        if (start < b->off || start >= b->off + b->n) continue;
        const int64_t first = (b->off + BLOCK - 1) / BLOCK, last = (b->off + b->n - 1) / BLOCK;
        const int64_t c = last - first + 1, t = blk - first;
        int r = 0;
        while (r + 1 < N && c * (r + 1) / N <= t) r++;
        return r;
    }
    return 0; /* not reached for a block inside the slab */
}

static int by_offset(const void *a, const void *b) {
    const sbp_bucket *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

int sbp_dist_pieces(sbp_piece *out, int cap, const sbp_bucket *b, int nb, int N) {
    sbp_bucket *so = malloc(sizeof *so * (size_t)(nb ? nb : 1));
    if (!so) return -1;
    for (int i = 0; i < nb; i++) so[i] = b[i];
    qsort(so, (size_t)nb, sizeof *so, by_offset);
    int n = 0;
    for (int i = 0; i < nb; i++) /* completion order, as the pieces are sent */
        for (int64_t at = b[i].off, end = b[i].off + b[i].n; at < end;) {
            const int64_t blk = at / BLOCK,
                          stop = (blk + 1) * BLOCK < end ? (blk + 1) * BLOCK : end;
            const int owner = block_owner(so, nb, blk, N);
            if (n > 0 && out[n - 1].bucket == i && out[n - 1].owner == owner &&
                out[n - 1].off + out[n - 1].n == at)
                out[n - 1].n += stop - at;
            else if (n == cap) {
                free(so);
                return -1;
            } else
                out[n++] = (sbp_piece){.off = at, .n = stop - at, .owner = owner, .bucket = i};
            at = stop;
        }
    free(so);
    return n;
}

/* The pieces of ps's buckets for N ranks (malloc'd into *pc); their count, −1 out of memory. */
static int slab_pieces(sbp_piece **pc, const sbp_params *ps, int N) {
    const int cap = ps->n + 2;
    sbp_bucket *b = malloc(sizeof *b * (size_t)cap);
    *pc = malloc(sizeof **pc * (size_t)cap * (N + 1));
    int nb = -1, np = -1;
    if (b && *pc && (nb = sbp_grad_buckets(b, cap, ps)) >= 0)
        np = sbp_dist_pieces(*pc, cap * (N + 1), b, nb, N);
    free(b);
    return np;
}

static int by_begin(const void *a, const void *b) {
    const sbp_range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

int sbp_dist_owned(sbp_range **out, int64_t *owned, const sbp_params *ps, int N, int r) {
    sbp_piece *pc = NULL;
    const int np = slab_pieces(&pc, ps, N);
    sbp_range *o = np >= 0 ? malloc(sizeof *o * (size_t)(np ? np : 1)) : NULL;
    int n = 0;
    *out = NULL, *owned = 0;
    for (int i = 0; o && i < np; i++)
        if (pc[i].owner == r) o[n++] = (sbp_range){pc[i].off, pc[i].off + pc[i].n};
    free(pc);
    if (!o) return -1;
    qsort(o, (size_t)n, sizeof *o, by_begin);
    int m = 0; /* a block straddling two buckets is two pieces of one owner: one range */
    for (int i = 0; i < n; i++) {
        *owned += o[i].end - o[i].begin;
        if (m && o[m - 1].end == o[i].begin)
            o[m - 1].end = o[i].end;
        else
            o[m++] = o[i];
    }
    *out = o;
    return m;
}

sbp_status sbp_dist_gather_cost(int64_t *elements, int64_t *messages, const sbp_params *ps, int N,
                                int r, sbp_err *err) {
    sbp_range *rg = NULL;
    const int nr = sbp_dist_owned(&rg, elements, ps, N, r);
    if (nr < 0) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    *messages = 0; /* sbp_dist_gather: a message per tensor and range of it held */
    for (int i = 0; r > 0 && i < ps->n; i++)
        for (int q = 0; q < nr; q++) {
            const int64_t lo = ps->p[i].offset, hi = lo + ps->p[i].numel;
            *messages += rg[q].begin < hi && rg[q].end > lo;
        }
    if (r == 0) *elements = 0; /* rank 0 copies its own */
    free(rg);
    return SBP_OK;
}

sbp_status sbp_dist_traffic(int64_t *bytes, int64_t *messages, const sbp_params *ps, int esz, int N,
                            int n, int optimizer, sbp_err *err) {
    *bytes = *messages = 0;
    for (int r = 0; r < N; r++) {
        int64_t by = 0, ms = 0;
        const sbp_status st =
            sbp_dist_traffic_rank(&by, &ms, ps, esz, N, r, n / N, 1, optimizer, err);
        if (st) return st;
        if (by > *bytes) *bytes = by, *messages = ms;
    }
    return SBP_OK;
}

sbp_status sbp_dist_traffic_rank(int64_t *bytes, int64_t *messages, const sbp_params *ps, int esz,
                                 int N, int r, int rounds, int produces, int optimizer,
                                 sbp_err *err) {
    sbp_piece *pc = NULL;
    const int np = slab_pieces(&pc, ps, N);
    int64_t *own = calloc((size_t)N, sizeof *own), *owned_pieces = calloc((size_t)N, sizeof *own);
    sbp_status st =
        np >= 0 && own && owned_pieces ? SBP_OK : sbp_fail(err, SBP_ENOMEM, "out of memory");
    *bytes = *messages = 0;
    for (int i = 0; !st && i < np; i++) own[pc[i].owner] += pc[i].n, owned_pieces[pc[i].owner]++;
    if (!st) {
        int64_t sent = 0, msgs = 0; /* one round: the pieces others own, each a message */
        for (int i = 0; i < np && produces; i++)
            if (pc[i].owner != r) sent += pc[i].n, msgs++;
        const int64_t m = rounds, peers = N - 1;
        /* m rounds; its m losses to each of the others (an all-gather) */
        int64_t by = m * sent * esz + peers * m * (int64_t)sizeof(double);
        int64_t ms = m * msgs + peers;
        if (optimizer) /* its updated weights to each of the others, a message a piece */
            by += peers * own[r] * esz, ms += peers * owned_pieces[r];
        else if (r > 0) { /* grad: its share to rank 0's file (sbp_dist_save_grads) */
            int64_t owned = 0, gm = 0;
            if (!(st = sbp_dist_gather_cost(&owned, &gm, ps, N, r, err)))
                by += owned * esz, ms += gm;
        }
        if (optimizer) { /* the clip norm's block sums: an all-gather of a double per block */
            const int64_t blocks =
                (own[r] + SBP_DIST_BLOCK - 1) / SBP_DIST_BLOCK; /* whole blocks */
            by += peers * blocks * (int64_t)sizeof(double);
            ms += peers;
        }
        *bytes = by, *messages = ms;
    }
    free(pc), free(own), free(owned_pieces);
    return st;
}
