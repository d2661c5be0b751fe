/* exchange.c — one data-parallel gradient step over N processes (docs/distributed.md).
 *
 * Micro-batch k runs on rank k mod N, in rounds of N (round ρ: k = ρN + r on rank r). As the
 * backward completes each bucket (after its last chunk: the StreamBP rule, nothing per chunk),
 * the hook copies it into the ring (two bucket-sized places used in turn) and sends each piece
 * others own to its owner at once; the next layer's backward goes on while the pieces travel.
 * Between buckets each owner folds what has arrived for its blocks (advance), each region in
 * ascending k: S = g_0, then S ← S + g_k, one IEEE add per element (bf16 storage: each result
 * rounded), exactly the 1-process fold; the rest after the round's backward. The losses are
 * all-gathered and folded in k order on every rank. S is the rank's share (sharded: ZeRO-2's
 * train step, whose optimizer steps each owner's blocks, and grad, whose file rank 0 gathers one
 * tensor at a time), or the whole slab, each owner's blocks then sent to every other rank. MPI
 * carries only copies: no float is summed by a collective.
 *
 * What a rank holds (docs/distributed.md §7): its share S (P/N), the ring (the two largest
 * consecutive buckets) and the column (its blocks of the largest bucket, one micro-batch's):
 * never a whole gradient. A piece that arrives out of turn (micro-batch k + 1 before k) is not
 * received: it waits in its sender's ring until its turn, and the sender, needing that place two
 * buckets later, waits too (folding meanwhile) — the fixed order costs time there, never memory. */
#include "../core/bf16.h"
#include "../core/err.h"
#include "dist.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    sbp_comm *c;
    int N, r, esz, bf16, nb, np;
    sbp_bucket *b; /* (nb) completion order */
    sbp_piece *pc; /* (np) by bucket, ascending within one */
    int64_t *own;  /* (N) elements each rank owns */
    char *S;       /* the folded gradient: this rank's share, packed (sharded), or the whole slab */
    int64_t *spos; /* (np) an own piece's first element in S */
    char *ring;    /* (ring_n) this rank's last two completed buckets, one at each end (bat) */
    int64_t ring_n, *bat; /* bat: (nb) where bucket i's copy starts in the ring */
    char *col; /* (col_n) the column: one micro-batch's pieces of this rank's blocks of the
                * bucket being folded (lo), each own piece at cpos */
    int64_t col_n, *cpos; /* cpos: (np) */
    int *req;             /* (np) an own piece's receive in flight, another's send; −1: none */
    int *next;  /* (np) an own piece: the round's next slot j (micro-batch ρN + j) to fold */
    int *left;  /* (nb) own pieces of bucket i not folded through the round */
    char *done; /* (nb) this rank's backward completed bucket i in the round (copied) */
    int lo;     /* the first bucket of the round not folded through: the column is its */
    int rho, k; /* the round, the micro-batch running */
    int sent;   /* a send completed since the wait last looked */
    sbp_err *err;
    sbp_err herr;   /* the hook's own error: the engine reports a failed hook in general terms */
    sbp_ledger *lg; /* the ring and the column are charged to SBP_MEM_GRADS */
} dstate;

void sbp_dist_fold(void *s, const void *g, int64_t n, int esz, int bf16) {
    if (esz == 8) {
        double *x = s;
        const double *y = g;
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) x[i] = x[i] + y[i];
    } else {
        float *x = s;
        const float *y = g;
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) x[i] = bf16 ? sbp_round_bf16(x[i] + y[i]) : x[i] + y[i];
    }
}

/* The fold, as far as the pieces have come: each own piece's region of S takes the round's slots
 * j = 0, 1, … N − 1 (micro-batches ρN + j) in that order, each as soon as it is here — this
 * rank's own once its bucket is done (its copy in the ring), another rank's once its receive
 * into the column completed. A receive is posted only for the slot next in line and only for
 * the bucket lo the column belongs to: a later slot waits in its sender's ring (an unmatched
 * send), so the owner keeps one micro-batch's pieces of one bucket and no more. The order per
 * element, hence every bit, is the one-process fold's: S = g_0, then S ← S + g_k. Returns 1
 * when something was folded, −1 when a receive could not be posted (herr). */
static int advance(dstate *d) {
    int moved = 0;
    for (int i = 0; i < d->np; i++) {
        const sbp_piece *p = &d->pc[i];
        /* the pieces come bucket by bucket: lo is past every bucket before p's that is through */
        while (d->lo < d->nb && d->left[d->lo] == 0) d->lo++;
        if (p->owner != d->r) continue;
        const size_t bytes = (size_t)p->n * d->esz;
        for (int j; (j = d->next[i]) < d->N;) {
            const char *g;
            if (j == d->r) {
                if (!d->done[p->bucket]) break;
                g = d->ring + (d->bat[p->bucket] + p->off - d->b[p->bucket].off) * d->esz;
            } else {
                if (p->bucket != d->lo) break;
                char *at = d->col + d->cpos[i] * d->esz;
                if (d->req[i] < 0 &&
                    (d->req[i] = sbp_comm_irecv(d->c, at, bytes, j, i, &d->herr)) < 0)
                    return -1;
                if (!sbp_comm_test(d->c, d->req[i])) break;
                d->req[i] = -1, g = at;
            }
            char *s = d->S + d->spos[i] * d->esz;
            if (d->rho == 0 && j == 0)
                memcpy(s, g, bytes);
            else
                sbp_dist_fold(s, g, p->n, d->esz, d->bf16);
            moved = 1;
            if (++d->next[i] == d->N) d->left[p->bucket]--;
        }
    }
    while (d->lo < d->nb && d->left[d->lo] == 0) d->lo++;
    return moved;
}

/* Whether bucket bi's copy in the ring may go: its pieces others own sent, its own folded past
 * this rank's slot. *peer: a rank it still waits on. */
static int released(dstate *d, int bi, int *peer) {
    for (int i = 0; i < d->np; i++) {
        const sbp_piece *p = &d->pc[i];
        if (p->bucket != bi) continue;
        if (p->owner == d->r && d->next[i] <= d->r) return *peer = d->next[i], 0;
        if (p->owner != d->r && d->req[i] >= 0) {
            if (!sbp_comm_test(d->c, d->req[i])) return *peer = p->owner, 0;
            d->req[i] = -1, d->sent = 1;
        }
    }
    return 1;
}

typedef struct {
    dstate *d;
    int bi; /* the bucket whose copy must go; −1: the whole round */
} waiting;

static int poll_fold(void *ctx, int *progress, int *peer) {
    waiting *w = ctx;
    dstate *d = w->d;
    const int moved = advance(d);
    if (moved < 0) return -1;
    d->sent = 0;
    int rc = w->bi >= 0 ? !released(d, w->bi, peer) : 0;
    for (int bi = 0; w->bi < 0 && bi < d->nb && !rc; bi++) rc = !released(d, bi, peer);
    *progress = moved || d->sent;
    if (w->bi >= 0 || rc) return rc;
    if (d->lo < d->nb) { /* every copy gone: what is left are the others' pieces */
        for (int i = 0; i < d->np; i++)
            if (d->pc[i].owner == d->r && d->next[i] < d->N) *peer = d->next[i];
        return 1;
    }
    return 0;
}

/* The engine's bucket hook: bucket [off, off + n) of this rank's micro-batch is complete. Its copy
 * goes to the ring's end that bucket bi − 2 used (waiting, folding meanwhile, until that one's
 * pieces are sent and its own folded), its pieces others own are sent from there at once, and
 * the fold goes as far as it can. */
static int on_bucket(void *ctx, int64_t off, int64_t n, const void *g) {
    dstate *d = ctx;
    if (d->herr.status) return 0; /* the first failure stands (the engine stops calling) */
    int bi = 0, before = 0;
    while (bi < d->nb && d->b[bi].off != off) before += d->done[bi++];
    /* the ring's two ends assume the completion order of sbp_grad_buckets */
    if (bi == d->nb || d->b[bi].n != n || d->done[bi] || before != bi) {
        sbp_fail(&d->herr, SBP_EUSAGE,
                 "internal: the gradient bucket at element %lld is not the next one",
                 (long long)off);
        return 0;
    }
    waiting w = {d, bi - 2};
    if (bi >= 2 && sbp_comm_wait_poll(d->c, poll_fold, &w, "the gradient pieces", &d->herr))
        return 0;
    char *copy = d->ring + d->bat[bi] * d->esz;
    memcpy(copy, g, (size_t)n * d->esz);
    d->done[bi] = 1;
    for (int i = 0; i < d->np; i++) {
        const sbp_piece *p = &d->pc[i];
        if (p->bucket != bi || p->owner == d->r) continue;
        if ((d->req[i] = sbp_comm_isend(d->c, copy + (p->off - off) * d->esz, (size_t)p->n * d->esz,
                                        p->owner, i, &d->herr)) < 0)
            return 0;
    }
    return advance(d) >= 0;
}

/* The buckets, their pieces, each rank's share (own), and this rank's places: its pieces in S
 * (packed ascending when sharded, else at their offsets) and in the column, the buckets' ends of
 * the ring. */
static sbp_status pieces(dstate *d, const sbp_params *ps, int sharded) {
    const int cap = ps->n + 2;
    d->b = malloc(sizeof *d->b * (size_t)cap);
    d->pc = malloc(sizeof *d->pc * (size_t)cap * (d->N + 1));
    d->own = calloc((size_t)d->N, sizeof *d->own);
    d->done = calloc((size_t)cap, 1);
    d->left = calloc((size_t)cap, sizeof *d->left);
    d->bat = calloc((size_t)cap, sizeof *d->bat);
    if (!d->b || !d->pc || !d->own || !d->done || !d->left || !d->bat)
        return sbp_fail(d->err, SBP_ENOMEM, "out of memory");
    if ((d->nb = sbp_grad_buckets(d->b, cap, ps)) < 0 ||
        (d->np = sbp_dist_pieces(d->pc, cap * (d->N + 1), d->b, d->nb, d->N)) < 0)
        return sbp_fail(d->err, SBP_ENOMEM, "out of memory for the gradient pieces");
    const size_t np = (size_t)(d->np ? d->np : 1);
    d->spos = malloc(sizeof *d->spos * np), d->cpos = calloc(np, sizeof *d->cpos);
    d->next = malloc(sizeof *d->next * np), d->req = malloc(sizeof *d->req * np);
    if (!d->spos || !d->cpos || !d->next || !d->req)
        return sbp_fail(d->err, SBP_ENOMEM, "out of memory");
    for (int i = 0; i < d->np; i++) d->own[d->pc[i].owner] += d->pc[i].n;
    for (int i = 0; i < d->np; i++) { /* the share packs the own pieces in slab order */
        d->spos[i] = d->pc[i].off;
        if (!sharded || d->pc[i].owner != d->r) continue;
        d->spos[i] = 0;
        for (int q = 0; q < d->np; q++)
            if (d->pc[q].owner == d->r && d->pc[q].off < d->pc[i].off) d->spos[i] += d->pc[q].n;
    }
    d->ring_n = d->col_n = 1;
    for (int bi = 0; bi < d->nb; bi++) {
        const int64_t pair = d->b[bi].n + (bi + 1 < d->nb ? d->b[bi + 1].n : 0);
        d->ring_n = pair > d->ring_n ? pair : d->ring_n;
        int64_t mine = 0;
        for (int i = 0; i < d->np; i++)
            if (d->pc[i].bucket == bi && d->pc[i].owner == d->r)
                d->cpos[i] = mine, mine += d->pc[i].n;
        d->col_n = mine > d->col_n ? mine : d->col_n;
    }
    for (int bi = 0; bi < d->nb; bi++) d->bat[bi] = bi % 2 ? d->ring_n - d->b[bi].n : 0;
    return SBP_OK;
}

static sbp_status buffers(dstate *d) {
    d->ring = sbp_ledger_alloc_raw(d->lg, SBP_MEM_GRADS, (size_t)d->ring_n * d->esz);
    d->col = d->ring ? sbp_ledger_alloc_raw(d->lg, SBP_MEM_GRADS, (size_t)d->col_n * d->esz) : NULL;
    return d->col
               ? SBP_OK
               : sbp_fail(d->err, SBP_ENOMEM, "out of memory for the distributed step's buffers");
}

static void teardown(dstate *d) {
    sbp_ledger_free(d->lg, d->col), sbp_ledger_free(d->lg, d->ring);
    free(d->b), free(d->pc), free(d->own), free(d->done), free(d->left), free(d->bat);
    free(d->spos), free(d->cpos), free(d->next), free(d->req);
}

/* A round begins: nothing done, every own piece at slot 0, no request. */
static void round_begins(dstate *d, int rho) {
    d->rho = rho, d->lo = 0, d->k = rho * d->N + d->r;
    memset(d->done, 0, (size_t)d->nb);
    memset(d->left, 0, sizeof *d->left * (size_t)d->nb);
    for (int i = 0; i < d->np; i++) {
        d->next[i] = 0, d->req[i] = -1;
        if (d->pc[i].owner == d->r) d->left[d->pc[i].bucket]++;
    }
}

sbp_status sbp_dist_spread(sbp_comm *c, void *slab, const sbp_params *ps, int esz, const char *what,
                           sbp_err *err) {
    const int N = sbp_comm_size(c), r = sbp_comm_rank(c), cap = ps->n + 2;
    if (N <= 1) return SBP_OK;
    sbp_bucket *b = malloc(sizeof *b * (size_t)cap);
    sbp_piece *pc = malloc(sizeof *pc * (size_t)cap * (N + 1));
    int nb = -1, np = -1;
    if (b && pc && (nb = sbp_grad_buckets(b, cap, ps)) >= 0)
        np = sbp_dist_pieces(pc, cap * (N + 1), b, nb, N);
    sbp_status st = np >= 0 ? SBP_OK : sbp_fail(err, SBP_ENOMEM, "out of memory");
    /* the tag: the piece's index, the same on every rank (the pieces are a function of ps, N) */
    for (int i = 0; !st && i < np; i++) {
        char *at = (char *)slab + pc[i].off * esz;
        const size_t bytes = (size_t)pc[i].n * esz;
        if (pc[i].owner != r) {
            if (sbp_comm_irecv(c, at, bytes, pc[i].owner, i, err) < 0) st = err->status;
            continue;
        }
        for (int j = 0; j < N && !st; j++)
            if (j != r && sbp_comm_isend(c, at, bytes, j, i, err) < 0) st = err->status;
    }
    if (!st) st = sbp_comm_waitall(c, what, err);
    free(b), free(pc);
    return st;
}

sbp_status sbp_dist_grad(void *out, int sharded, double *loss, sbp_comm *c, const sbp_params *ps,
                         int esz, int bf16, int n, sbp_dist_run_fn run, void *ctx, sbp_ledger *lg,
                         sbp_err *err) {
    dstate d = {.c = c,
                .N = sbp_comm_size(c),
                .r = sbp_comm_rank(c),
                .esz = esz,
                .bf16 = bf16,
                .S = out,
                .err = err,
                .lg = lg};
    if (n % d.N)
        return sbp_fail(err, SBP_EUSAGE,
                        "%d micro-batches cannot be shared by %d processes: the process count must "
                        "divide them",
                        n, d.N);
    const int m = n / d.N;
    double *mine = calloc((size_t)m, sizeof *mine), *all = calloc((size_t)n, sizeof *all);
    sbp_status st =
        mine && all ? pieces(&d, ps, sharded) : sbp_fail(err, SBP_ENOMEM, "out of memory");
    if (!st) st = buffers(&d);
    for (int rho = 0; rho < m && !st; rho++) {
        round_begins(&d, rho);
        if ((st = run(ctx, d.k, on_bucket, &d, &mine[rho], err))) {
            if (d.herr.status) *err = d.herr, st = d.herr.status;
            break;
        }
        for (int bi = 0; bi < d.nb && !st; bi++)
            if (!d.done[bi])
                st = sbp_fail(err, SBP_EUSAGE, "internal: micro-batch %d left bucket %d undone",
                              d.k, bi);
        waiting w = {&d, -1}; /* the rest of the round's fold, the sends' completion */
        if (!st && (st = sbp_comm_wait_poll(c, poll_fold, &w, "the gradient pieces", &d.herr)))
            *err = d.herr;
        if (!st) st = sbp_comm_waitall(c, "the gradient pieces", err); /* all done: forgets them */
    }
    if (!st && !sharded) st = sbp_dist_spread(c, out, ps, esz, "the gradient shares", err);
    if (!st) st = sbp_comm_allgather(c, all, mine, sizeof *mine * (size_t)m, "the losses", err);
    if (!st) { /* rank j's ρ-th loss is micro-batch ρN + j's */
        double l = 0;
        for (int k = 0; k < n; k++) {
            const double lk = all[(k % d.N) * m + k / d.N];
            l = k ? l + lk : lk;
        }
        *loss = l;
    }
    free(mine), free(all);
    teardown(&d);
    return st;
}

int sbp_dist_plan_rank(const sbp_params *ps, int esz, int N, int64_t per_owned, int64_t *owned) {
    int best = -1;
    int64_t most = -1;
    sbp_err err = {0};
    for (int r = 0; r < N; r++) {
        dstate d = {.N = N, .r = r, .esz = esz, .err = &err};
        if (pieces(&d, ps, 1)) {
            teardown(&d);
            return -1;
        }
        const int64_t bytes = per_owned * d.own[r] + (int64_t)esz * (d.ring_n + d.col_n);
        if (bytes > most) most = bytes, best = r, *owned = d.own[r];
        teardown(&d);
    }
    return best;
}

sbp_status sbp_dist_plan(sbp_ledger *lg, const sbp_params *ps, int esz, int N, int r,
                         sbp_dist_run_fn run, void *ctx, sbp_err *err) {
    dstate d = {.N = N, .r = r, .esz = esz, .err = err, .lg = lg};
    sbp_status st = pieces(&d, ps, 1);
    if (!st) st = buffers(&d);
    double loss = 0;
    if (!st) st = run(ctx, 0, NULL, NULL, &loss, err);
    teardown(&d);
    return st;
}
