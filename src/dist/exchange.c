/* exchange.c — one data-parallel gradient step over N processes (docs/distributed.md).
 *
 * Micro-batch k runs on rank k mod N, in rounds of N (round ρ: k = ρN + r on rank r). As the
 * backward completes each bucket (after its last chunk: the StreamBP rule, nothing per chunk),
 * the hook cuts it into pieces by owner and sends each piece to its owner at once, keeping its own;
 * the next layer's backward goes on while the pieces travel. Between buckets each owner folds
 * the pieces of micro-batches ρN … ρN + N − 1 that have arrived for its blocks, each region in
 * ascending k (fold_ready), and the rest after the round's backward: S = g_0, then S ← S + g_k,
 * one IEEE add per element (bf16 storage: each result rounded), exactly the 1-process fold. The
 * losses are all-gathered and folded in k order on every rank. Then each owner sends its blocks of
 * S to the others (grad: every rank ends with the whole gradient, the 1-process bits), or keeps
 * them (train's ZeRO-2 step: the optimizer steps each owner's blocks, src/train/zero2.h). MPI
 * carries only copies: no float is summed by a collective. */
#include "../core/bf16.h"
#include "../core/err.h"
#include "dist.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    sbp_comm *c;
    int N, r, esz, bf16, nb, np;
    sbp_bucket *b;
    sbp_piece *pc;
    int64_t *pos; /* (np) where piece i lives in its owner's packed share */
    int64_t *own; /* (N) elements each rank owns */
    char *gk;     /* (total − own[r]) this rank's pieces of its micro-batch's gradient that others
                   * own, kept while they are sent; piece i at kpos[i] */
    int64_t *kpos; /* (np) */
    char **R;      /* (N) packed shares: micro-batch ρN + j's pieces of this rank's blocks */
    char *S;       /* (own[r]) the folded share */
    sbp_err *err;
    sbp_ledger *lg; /* the buffers below are charged to SBP_MEM_GRADS (the planner counts them) */
    sbp_err herr;   /* the hook's own error: the engine reports a failed hook in general terms */
    int k, nan_k;   /* the micro-batch running; the one the failure test poisons, or −1 */
    int rho;        /* the round */
    int *req;       /* (N·np) the receive of piece i from rank j (j·np + i), or −1 */
    int *next;      /* (np) of an own piece: the next slot j of the round to fold into S */
    char *done;     /* (nb) the buckets this rank's backward has completed in the round */
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

static void fold_ready(dstate *d, int all);

/* The engine's bucket hook: bucket [off, off + n) of this rank's micro-batch is complete. */
static int on_bucket(void *ctx, int64_t off, int64_t n, const void *g) {
    dstate *d = ctx;
    int bi = 0;
    while (bi < d->nb && d->b[bi].off != off) bi++;
    if (bi == d->nb || d->b[bi].n != n) {
        sbp_fail(&d->herr, SBP_EUSAGE, "internal: no gradient bucket at element %lld",
                 (long long)off);
        return 0;
    }
    for (int i = 0; i < d->np; i++) {
        const sbp_piece *p = &d->pc[i];
        if (p->bucket != bi) continue;
        const char *src = (const char *)g + (p->off - off) * d->esz;
        if (d->k == d->nan_k && bi == 0 && p->off == off) { /* a planted non-finite gradient */
            if (d->esz == 8)
                ((double *)g)[0] = NAN;
            else
                ((float *)g)[0] = NAN;
        }
        const size_t bytes = (size_t)p->n * d->esz;
        if (p->owner == d->r) {
            memcpy(d->R[d->r] + d->pos[i] * d->esz, src, bytes);
            continue;
        }
        char *keep = d->gk + d->kpos[i] * d->esz; /* the scratch is reused by the next bucket */
        memcpy(keep, src, bytes);
        if (sbp_comm_isend(d->c, keep, bytes, p->owner, bi, &d->herr) < 0) return 0;
    }
    d->done[bi] = 1;
    fold_ready(d, 0);
    return 1;
}

/* Receives for one round: every other rank's pieces of this rank's blocks. */
static sbp_status post_receives(dstate *d) {
    memset(d->done, 0, (size_t)d->nb);
    for (int i = 0; i < d->np; i++) d->next[i] = 0;
    for (int j = 0; j < d->N; j++)
        for (int i = 0; i < d->np; i++) {
            const sbp_piece *p = &d->pc[i];
            d->req[j * d->np + i] = -1;
            if (p->owner != d->r || j == d->r) continue;
            if ((d->req[j * d->np + i] =
                     sbp_comm_irecv(d->c, d->R[j] + d->pos[i] * d->esz, (size_t)p->n * d->esz, j,
                                    p->bucket, d->err)) < 0)
                return d->err->status;
        }
    return SBP_OK;
}

/* The fold, as far as the pieces have come: each own piece's region of S takes the round's slots
 * j = 0, 1, … N − 1 (micro-batches ρN + j) in that order, each as soon as it is here (this
 * rank's own once its bucket is done, another's once its receive completed), so the owner folds
 * while its backward goes on (called between buckets) and the order, hence every bit, is the
 * one-process fold's: S = g_0, then S ← S + g_k. all: every receive has completed. */
static void fold_ready(dstate *d, int all) {
    for (int i = 0; i < d->np; i++) {
        const sbp_piece *p = &d->pc[i];
        if (p->owner != d->r) continue;
        char *s = d->S + d->pos[i] * d->esz;
        for (int j; (j = d->next[i]) < d->N; d->next[i]++) {
            const int here = all || (j == d->r ? d->done[p->bucket]
                                               : sbp_comm_test(d->c, d->req[j * d->np + i]));
            if (!here) break;
            const char *g = d->R[j] + d->pos[i] * d->esz;
            if (d->rho == 0 && j == 0)
                memcpy(s, g, (size_t)p->n * d->esz);
            else
                sbp_dist_fold(s, g, p->n, d->esz, d->bf16);
        }
    }
}

/* The buckets, their pieces and each rank's share (own). */
static sbp_status pieces(dstate *d, const sbp_params *ps) {
    const int cap = ps->n + 2;
    d->b = malloc(sizeof *d->b * (size_t)cap);
    d->pc = malloc(sizeof *d->pc * (size_t)cap * (d->N + 1));
    d->own = calloc((size_t)d->N, sizeof *d->own);
    d->R = calloc((size_t)d->N, sizeof *d->R);
    d->done = malloc((size_t)cap);
    if (!d->b || !d->pc || !d->own || !d->R || !d->done)
        return sbp_fail(d->err, SBP_ENOMEM, "out of memory");
    if ((d->nb = sbp_grad_buckets(d->b, cap, ps)) < 0 ||
        (d->np = sbp_dist_pieces(d->pc, cap * (d->N + 1), d->b, d->nb, d->N)) < 0)
        return sbp_fail(d->err, SBP_ENOMEM, "out of memory for the gradient pieces");
    d->pos = malloc(sizeof *d->pos * (size_t)(d->np ? d->np : 1));
    d->next = malloc(sizeof *d->next * (size_t)(d->np ? d->np : 1));
    d->req = malloc(sizeof *d->req * (size_t)(d->np ? d->np : 1) * d->N);
    if (!d->pos || !d->next || !d->req) return sbp_fail(d->err, SBP_ENOMEM, "out of memory");
    for (int i = 0; i < d->np; i++)
        d->pos[i] = d->own[d->pc[i].owner], d->own[d->pc[i].owner] += d->pc[i].n;
    return SBP_OK;
}

/* The step's buffers: the micro-batch's pieces others own, kept while they travel, the folded
 * share and the N shares of a round. */
static sbp_status buffers(dstate *d) {
    const size_t share = (size_t)(d->own[d->r] ? d->own[d->r] : 1) * d->esz;
    d->kpos = malloc(sizeof *d->kpos * (size_t)(d->np ? d->np : 1));
    if (!d->kpos) return sbp_fail(d->err, SBP_ENOMEM, "out of memory");
    int64_t kept = 0; /* the pieces others own, packed */
    for (int i = 0; i < d->np; i++)
        if (d->pc[i].owner != d->r) d->kpos[i] = kept, kept += d->pc[i].n;
    d->gk = sbp_ledger_alloc_raw(d->lg, SBP_MEM_GRADS, (size_t)(kept ? kept : 1) * d->esz);
    d->S = sbp_ledger_alloc_raw(d->lg, SBP_MEM_GRADS, share);
    int ok = d->gk && d->S;
    for (int j = 0; j < d->N; j++) {
        d->R[j] = sbp_ledger_alloc_raw(d->lg, SBP_MEM_GRADS, share);
        ok = ok && d->R[j];
    }
    if (!ok)
        return sbp_fail(d->err, SBP_ENOMEM, "out of memory for the distributed step's buffers");
    return SBP_OK;
}

static void teardown(dstate *d) {
    for (int j = d->N - 1; d->R && j >= 0; j--) sbp_ledger_free(d->lg, d->R[j]);
    sbp_ledger_free(d->lg, d->S), sbp_ledger_free(d->lg, d->gk);
    free(d->R), free(d->pos), free(d->own), free(d->pc), free(d->b);
    free(d->done), free(d->next), free(d->req), free(d->kpos);
}

/* This rank's share S into grads at its pieces' places; then every other rank's (sbp_dist_spread),
 * or with a sharded comm (train's ZeRO-2 step) zeros there: the optimizer steps the owners'
 * blocks. A non-finite element in any share spreads the whole gradient anyway, so that every rank
 * names the same first non-finite parameter, as one process does. */
static sbp_status place_shares(dstate *d, void *grads, const sbp_params *ps) {
    int bad = 0;
    for (int i = 0; i < d->np; i++) {
        const sbp_piece *p = &d->pc[i];
        char *dst = (char *)grads + p->off * d->esz;
        if (p->owner != d->r) {
            memset(dst, 0, (size_t)p->n * d->esz);
            continue;
        }
        memcpy(dst, d->S + d->pos[i] * d->esz, (size_t)p->n * d->esz);
        for (int64_t j = 0; j < p->n && !bad; j++)
            bad = !isfinite(d->esz == 8 ? ((const double *)dst)[j] : ((const float *)dst)[j]);
    }
    uint64_t any = (uint64_t)bad;
    sbp_status st = SBP_OK;
    if (sbp_comm_sharded(d->c) &&
        (st = sbp_comm_max_u64(d->c, &any, 1, "the gradient's finiteness", d->err)))
        return st;
    if (sbp_comm_sharded(d->c) && !any) return SBP_OK;
    return sbp_dist_spread(d->c, grads, ps, d->esz, "the gradient shares", d->err);
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

sbp_status sbp_dist_grad(void *grads, double *loss, sbp_comm *c, const sbp_params *ps, int esz,
                         int bf16, int n, sbp_dist_run_fn run, void *ctx, sbp_ledger *lg,
                         sbp_err *err) {
    dstate d = {.c = c,
                .N = sbp_comm_size(c),
                .r = sbp_comm_rank(c),
                .esz = esz,
                .bf16 = bf16,
                .err = err,
                .lg = lg};
    if (n % d.N)
        return sbp_fail(err, SBP_EUSAGE,
                        "%d micro-batches cannot be shared by %d processes: the process count must "
                        "divide them",
                        n, d.N);
    const int m = n / d.N;
    sbp_comm_step_begins(c);
    /* the failure tests' planted NaN: SBP_DIST_TEST_NAN=k poisons micro-batch k's first piece */
    const char *nan_k = getenv("SBP_DIST_TEST_NAN");
    d.nan_k = nan_k ? atoi(nan_k) : -1;
    double *mine = calloc((size_t)m, sizeof *mine), *all = calloc((size_t)n, sizeof *all);
    sbp_status st = mine && all ? pieces(&d, ps) : sbp_fail(err, SBP_ENOMEM, "out of memory");
    if (!st) st = buffers(&d);
    for (int rho = 0; rho < m && !st; rho++) {
        d.rho = rho;
        if ((st = post_receives(&d))) break;
        d.k = rho * d.N + d.r;
        if ((st = run(ctx, d.k, on_bucket, &d, &mine[rho], err))) {
            if (d.herr.status) *err = d.herr, st = d.herr.status;
            break;
        }
        if ((st = sbp_comm_waitall(c, "the gradient pieces", err))) break;
        fold_ready(&d, 1); /* what was not folded during the backward */
    }
    if (!st) st = place_shares(&d, grads, ps);
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

sbp_status sbp_dist_plan(sbp_ledger *lg, const sbp_params *ps, int esz, int N, sbp_dist_run_fn run,
                         void *ctx, sbp_err *err) {
    dstate d = {.N = N, .esz = esz, .err = err, .lg = lg};
    sbp_status st = pieces(&d, ps);
    for (int j = 1; !st && j < N; j++) /* the rank with the largest share peaks highest */
        if (d.own[j] > d.own[d.r]) d.r = j;
    if (!st) st = buffers(&d);
    double loss = 0;
    if (!st) st = run(ctx, 0, NULL, NULL, &loss, err);
    teardown(&d);
    return st;
}
