/* seqpar.c — a gradient step with the processes sharing every sequence (sequence parallel,
 * docs/distributed.md §8, stage 1).
 *
 * Every process runs every micro-batch on its rows, the engine handing each sum that crosses the
 * rows on in token order through the link below (src/engine/relay.c). A bucket's sum is complete
 * on the last rank of the group, which cuts it into its owners' pieces and sends them as it
 * completes them (the shares, below): copies only, so the bytes are one process's. */
#include "seqpar.h"
#include "../core/err.h"
#include "../dist/seqlink.h"
#include "../engine/entry.h"
#include "resolve.h"

#include <stdlib.h>
#include <string.h>

/* beside gather.c's: no other message is in flight then; the pieces of the result have a tag of
 * their own, since their receives are posted before the hand-overs from the same rank */
enum { SEQ_TAG = (1 << 20) + 1, PIECE_TAG };
enum { PART = 1 << 30 }; /* bytes a message at most (the transport's int counts) */

typedef struct {
    sbp_comm *c;
    sbp_err err; /* the transport's first error */
    int failed;
} link_ctx;

/* One copy to or from a peer, in parts of at most PART bytes, waited for unless posted. Each
 * wait is for its own request: the shares' receives stay posted beside it (below); every request
 * of a micro-batch is done, and the transport's list emptied, at its end. */
static int move_tag(void *ctx, int peer, void *buf, size_t bytes, int send, int post, int tag,
                    const char *what) {
    link_ctx *l = ctx;
    for (size_t at = 0; at < bytes && !l->failed; at += PART) {
        const size_t n = bytes - at < PART ? bytes - at : PART;
        char *p = (char *)buf + at;
        const int r = send ? sbp_comm_isend(l->c, p, n, peer, tag, &l->err)
                           : sbp_comm_irecv(l->c, p, n, peer, tag, &l->err);
        if (r < 0 || (!post && sbp_comm_wait(l->c, r, what, &l->err))) l->failed = 1;
    }
    return !l->failed;
}

static int move(void *ctx, int peer, void *buf, size_t bytes, int send, int post,
                const char *what) {
    return move_tag(ctx, peer, buf, bytes, send, post, SEQ_TAG, what);
}

static int link_send(void *ctx, int to, const void *buf, size_t bytes, const char *what) {
    return move(ctx, to, (void *)buf, bytes, 1, 0, what);
}

static int link_recv(void *ctx, int from, void *buf, size_t bytes, const char *what) {
    return move(ctx, from, buf, bytes, 0, 0, what);
}

static int link_post(void *ctx, int to, const void *buf, size_t bytes, const char *what) {
    return move(ctx, to, (void *)buf, bytes, 1, 1, what);
}

/* Called on the last rank only, which keeps nothing else open: waits for every request. */
static int link_flush(void *ctx) {
    link_ctx *l = ctx;
    if (!l->failed && sbp_comm_waitall(l->c, "a hand-over to rank 0", &l->err)) l->failed = 1;
    return !l->failed;
}

/* The result, folded where it is owned. The last rank completes each bucket of a micro-batch;
 * its hook cuts the bucket into the owners' pieces (ZeRO-2's 4096-element blocks, owners.c;
 * unsharded, every rank owns every piece), folds its own into its share and sends the others,
 * whose receives each rank posted before the micro-batch began: into its share for micro-batch
 * 0 (S = g_0), else into the column, added after the run, S ← S + g_k (one IEEE add per
 * element, bf16: rounded, sbp_dist_fold) — one process's fold, element by element. No rank holds
 * a whole gradient (unless the result is unsharded). A rank waiting on a peer keeps testing its
 * requests, so the last rank's send of a piece completes whatever that rank waits on. */
typedef struct {
    link_ctx *l;
    int me, last, N, sharded, esz, bf16, k;
    sbp_piece *pc; /* (np) every bucket's pieces, in completion order */
    int np;
    int64_t *pos; /* (np) where a piece this rank owns starts in out and col; −1 elsewhere */
    char *out;    /* the share (sharded: the owned blocks packed), or the whole gradient */
    char *col;    /* with more than one micro-batch: a micro-batch's pieces, laid out as out */
    int64_t n;    /* elements of out and col */
} shares;

static int owns(const shares *h, const sbp_piece *p, int q) {
    return !h->sharded || p->owner == q;
}

static int fold_hook(void *ctx, int64_t off, int64_t n, const void *g) {
    shares *h = ctx;
    link_ctx *l = h->l;
    for (int i = 0; i < h->np && !l->failed; i++) {
        const sbp_piece *p = &h->pc[i];
        if (p->off < off || p->off >= off + n) continue; /* another bucket's */
        const char *src = (const char *)g + (p->off - off) * h->esz;
        const size_t bytes = (size_t)p->n * (size_t)h->esz;
        for (int q = 0; q < h->N && !l->failed; q++) {
            if (!owns(h, p, q)) continue;
            if (q != h->me)
                move_tag(l, q, (void *)src, bytes, 1, 0, PIECE_TAG, "the gradient's pieces");
            else if (h->k == 0)
                memcpy(h->out + h->pos[i] * h->esz, src, bytes);
            else
                sbp_dist_fold(h->out + h->pos[i] * h->esz, src, p->n, h->esz, h->bf16);
        }
    }
    return !l->failed;
}

/* Before micro-batch k, on a rank other than the last: the receives of its pieces, posted. */
static int post_receives(shares *h) {
    char *to = h->k == 0 ? h->out : h->col;
    for (int i = 0; i < h->np && !h->l->failed; i++)
        if (owns(h, &h->pc[i], h->me))
            move_tag(h->l, h->last, to + h->pos[i] * h->esz, (size_t)h->pc[i].n * (size_t)h->esz, 0,
                     1, PIECE_TAG, "the gradient's pieces");
    return !h->l->failed;
}

/* The pieces, where this rank's start in its share, the share and the column (charged to
 * SBP_MEM_GRADS); 0 when out of memory. */
static int shares_begin(shares *h, const sbp_params *ps, int n_micro, sbp_ledger *lg) {
    const int cap = ps->n + 2;
    sbp_bucket *b = malloc(sizeof *b * (size_t)cap);
    h->pc = malloc(sizeof *h->pc * (size_t)cap * (size_t)(h->N + 1));
    const int nb = b && h->pc ? sbp_grad_buckets(b, cap, ps) : -1;
    h->np = nb >= 0 ? sbp_dist_pieces(h->pc, cap * (h->N + 1), b, nb, h->N) : -1;
    free(b);
    sbp_range *rg = NULL;
    int64_t owned = ps->total;
    const int nr = h->sharded ? sbp_dist_owned(&rg, &owned, ps, h->N, h->me) : 0;
    h->pos = h->np >= 0 ? malloc(sizeof *h->pos * (size_t)(h->np ? h->np : 1)) : NULL;
    if (h->np < 0 || nr < 0 || !h->pos) return free(rg), 0;
    for (int i = 0; i < h->np; i++) { /* the packed position of an owned piece */
        h->pos[i] = h->sharded ? -1 : h->pc[i].off;
        for (int64_t q = 0, at = 0; q < nr && h->pc[i].owner == h->me; q++) {
            if (h->pc[i].off >= rg[q].begin && h->pc[i].off < rg[q].end)
                h->pos[i] = at + h->pc[i].off - rg[q].begin;
            at += rg[q].end - rg[q].begin;
        }
    }
    free(rg);
    h->n = owned;
    h->out = sbp_ledger_alloc(lg, SBP_MEM_GRADS, (size_t)h->esz * (size_t)owned);
    h->col =
        n_micro > 1 ? sbp_ledger_alloc(lg, SBP_MEM_GRADS, (size_t)h->esz * (size_t)owned) : NULL;
    return h->out && (n_micro <= 1 || h->col);
}

static void shares_end(shares *h, sbp_ledger *lg) {
    sbp_ledger_free(lg, h->col);
    free(h->pc), free(h->pos);
    h->col = NULL, h->pc = NULL, h->pos = NULL;
}

sbp_status sbp_seq_check(int T, const sbp_grad_opts *g, sbp_err *err) {
    const int S = g->seq_ranks, N = g->comm ? sbp_comm_size(g->comm) : 1;
    if (S <= 1) return SBP_OK;
    if (S > SBP_SEQ_MAX)
        return sbp_fail(err, SBP_EUSAGE, "--seq-ranks must be 1 to %d, not %d", SBP_SEQ_MAX, S);
    if (S != N)
        return sbp_fail(err, SBP_EUSAGE,
                        "--seq-ranks %d needs as many processes (mpirun -np %d), got %d; data "
                        "parallel beside it (N = D x S) is not built yet",
                        S, S, N);
    if (g->device != SBP_DEVICE_CPU)
        return sbp_fail(err, SBP_EUSAGE, "sequence parallel runs on the CPU only");
    const int portable = g->numerics == SBP_NUMERICS_PORTABLE;
    const int block = g->block ? g->block : SBP_DEFAULT_BLOCK;
    const int grain = sbp_engine_seq_grain_f32(portable, block);
    int bounds[SBP_SEQ_MAX + 1];
    if (T < 1 || sbp_seq_slices(bounds, T, S, grain)) return SBP_OK;
    if (portable)
        return sbp_fail(err, SBP_EUSAGE,
                        "T = %d is too short to share among %d ranks: each takes whole blocks of "
                        "%d tokens (the portable sums' block)",
                        T, S, grain);
    return sbp_fail(err, SBP_EUSAGE,
                    "T = %d is too short to share among %d ranks: each takes whole blocks of %d "
                    "tokens (--block %d and the portable sums' block)",
                    T, S, grain, block);
}

static sbp_status run_engine(double *loss, const sbp_model *m, const sbp_batch *b,
                             sbp_engine_opts *eo, sbp_ledger *lg, sbp_err *err) {
    eo->device_ops = NULL; /* the CPU's table (sbp_grad_batches refuses a device) */
    return m->prec == SBP_FP64 ? sbp_engine_grad_f64(loss, NULL, m, b, eo, lg, err)
                               : sbp_engine_grad_f32(loss, NULL, m, b, eo, lg, err);
}

sbp_status sbp_seq_grad(void **out, int64_t numel, double *loss, const sbp_model *m,
                        const sbp_batch *batches, int n, const sbp_grad_opts *opts,
                        const sbp_objective *so, sbp_ledger *lg, sbp_err *err) {
    sbp_comm *c = opts->comm;
    const int N = sbp_comm_size(c), me = sbp_comm_rank(c), last = N - 1;
    const sbp_params *ps = opts->lora ? &opts->lora->params : &m->params;
    link_ctx l = {.c = c};
    const sbp_seq_link link = {.rank = me,
                               .size = N,
                               .ctx = &l,
                               .send = link_send,
                               .recv = link_recv,
                               .post = link_post,
                               .flush = link_flush};
    shares h = {.l = &l,
                .me = me,
                .last = last,
                .N = N,
                .sharded = opts->sharded,
                .esz = m->prec == SBP_FP64 ? 8 : 4,
                .bf16 = opts->emulate_bf16};
    sbp_status st = SBP_OK;
    *out = NULL;
    if (!shares_begin(&h, ps, n, lg) || h.n != numel) {
        sbp_ledger_free(lg, h.out), shares_end(&h, lg);
        return sbp_fail(err, SBP_ENOMEM, "out of memory for the gradient's shares");
    }
    double total = 0;
    for (int k = 0; k < n && !st; k++) {
        sbp_engine_opts eo;
        sbp_obj_eval ev;
        if ((st = sbp_engine_resolve(&eo, opts, batches[k].T, err)) ||
            (st = sbp_obj_begin(&ev, so, &batches[k], err)))
            break;
        eo.ev = &ev, eo.link = &link;
        eo.fold = 1, eo.bucket_hook = fold_hook, eo.hook_ctx = &h;
        h.k = k;
        double loss_k = 0;
        if (me != last) post_receives(&h);
        if (!l.failed) st = run_engine(&loss_k, m, &batches[k], &eo, lg, err);
        sbp_obj_end(&ev);
        /* every request of the micro-batch done (the pieces are in), the list emptied */
        if (!st && !l.failed && sbp_comm_waitall(c, "the gradient's pieces", &l.err)) l.failed = 1;
        if (l.failed) st = sbp_fail(err, l.err.status, "%s", l.err.msg);
        if (st && n > 1) sbp_fail_prefix(err, "micro-batch %d: ", k);
        if (!st && k > 0 && me != last) sbp_dist_fold(h.out, h.col, h.n, h.esz, h.bf16);
        total = k > 0 ? total + loss_k : loss_k; /* the last rank's is the step's */
    }
    /* the loss from the last rank: a copy */
    for (int q = 0; q < last && !st && me == last && !l.failed; q++)
        link_send(&l, q, &total, sizeof total, "loss");
    if (!st && me != last) link_recv(&l, last, &total, sizeof total, "the loss");
    if (!st && l.failed) st = sbp_fail(err, l.err.status, "%s", l.err.msg);
    shares_end(&h, lg);
    if (st)
        sbp_ledger_free(lg, h.out);
    else
        *out = h.out;
    *loss = total;
    return st;
}
