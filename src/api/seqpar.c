/* seqpar.c — a gradient step with groups of processes sharing every sequence (sequence parallel,
 * docs/distributed.md §8).
 *
 * The N processes form D = N / S groups of S consecutive ranks; group g runs micro-batches
 * k ≡ g (mod D), in rounds of D (round ρ: k = ρD + g), every rank of the group the whole
 * micro-batch on its rows, the engine handing each sum that crosses the rows on in token order
 * through the link below (src/engine/relay.c). A bucket's sum is complete on the group's last
 * rank, which cuts it into its owners' pieces (over all N ranks) and sends them as it completes
 * them; each owner folds a round's micro-batches in k order (the shares, below): copies and one
 * process's adds only, so the bytes are one process's for every D and S. */
#include "seqpar.h"
#include "../core/err.h"
#include "../dist/seqlink.h"
#include "../engine/entry.h"
#include "resolve.h"

#include <stdlib.h>
#include <string.h>

/* beside gather.c's: no other message is in flight then; the pieces of the result have a tag of
 * their own, since their receives are posted before the hand-overs from the same rank, and so do
 * the query sides and the head's hand-over received ahead (seqlink.h); the head bucket's pieces
 * too, since under --seq-overlap with one sequence that bucket completes at a layer the timing
 * picks (head_late in src/engine/engine.h), so they cannot be matched by order among the
 * layers' */
enum { SEQ_TAG = (1 << 20) + 1, PIECE_TAG, SIDE_TAG, HEAD_TAG, HEAD_PIECE_TAG };
enum { PART = SBP_SEQ_PART };

typedef struct {
    sbp_comm *c;
    int base; /* the group's first rank: the link's rank q is the transport's base + q */
    int *posted[SBP_SEQ_KINDS]; /* (cap) the requests of the posted messages of each kind
                                 * (sbp_seq_kind), each waited for by its flush */
    int nposted[SBP_SEQ_KINDS], cap[SBP_SEQ_KINDS];
    sbp_err err; /* the transport's first error */
    int failed;
} link_ctx;

/* A posted message's request of one kind (sbp_seq_kind), for its flush; 0 when out of memory
 * (the error set). */
static int remember(link_ctx *l, int kind, int r) {
    if (l->nposted[kind] == l->cap[kind]) {
        const int cap = l->cap[kind] ? 2 * l->cap[kind] : 16;
        int *p = realloc(l->posted[kind], sizeof *p * (size_t)cap);
        if (!p) return sbp_fail(&l->err, SBP_ENOMEM, "out of memory"), 0;
        l->posted[kind] = p, l->cap[kind] = cap;
    }
    l->posted[kind][l->nposted[kind]++] = r;
    return 1;
}

/* move_tag's kinds besides sbp_seq_kind: waited for where it is sent or received; posted and
 * completed by the transport's end of the micro-batch (the pieces' receives) */
enum { WAIT = -1, UNTRACKED = -2 };

/* One copy to or from a peer, in parts of at most PART bytes, waited for (kind WAIT) or posted
 * as a message of that kind. Each wait is for its own request: the shares' receives stay posted
 * beside it (below); every request of a micro-batch is done, and the transport's list emptied,
 * at its end. */
static int move_tag(void *ctx, int peer, void *buf, size_t bytes, int send, int kind, int tag,
                    const char *what) {
    link_ctx *l = ctx;
    for (size_t at = 0; at < bytes && !l->failed; at += PART) {
        const size_t n = bytes - at < PART ? bytes - at : PART;
        char *p = (char *)buf + at;
        const int r = send ? sbp_comm_isend(l->c, p, n, peer, tag, &l->err)
                           : sbp_comm_irecv(l->c, p, n, peer, tag, &l->err);
        if (r < 0 || (kind == WAIT && sbp_comm_wait(l->c, r, what, &l->err))) l->failed = 1;
        if (r >= 0 && kind >= 0 && !remember(l, kind, r)) l->failed = 1;
    }
    return !l->failed;
}

static int move(void *ctx, int peer, void *buf, size_t bytes, int send, int kind,
                const char *what) {
    const link_ctx *l = ctx;
    return move_tag(ctx, l->base + peer, buf, bytes, send, kind, SEQ_TAG, what);
}

static int link_send(void *ctx, int to, const void *buf, size_t bytes, const char *what) {
    return move(ctx, to, (void *)buf, bytes, 1, WAIT, what);
}

static int link_recv(void *ctx, int from, void *buf, size_t bytes, const char *what) {
    return move(ctx, from, buf, bytes, 0, WAIT, what);
}

static int link_post(void *ctx, int to, const void *buf, size_t bytes, const char *what) {
    return move(ctx, to, (void *)buf, bytes, 1, SBP_SEQ_HANDOVER, what);
}

static int link_post_ahead(void *ctx, int to, const void *buf, size_t bytes, const char *what) {
    return move(ctx, to, (void *)buf, bytes, 1, SBP_SEQ_AHEAD, what);
}

static int link_post_side(void *ctx, int to, const void *buf, size_t bytes, const char *what) {
    const link_ctx *l = ctx;
    return move_tag(ctx, l->base + to, (void *)buf, bytes, 1, SBP_SEQ_SIDE, SIDE_TAG, what);
}

static int link_recv_side(void *ctx, int from, void *buf, size_t bytes, const char *what) {
    const link_ctx *l = ctx;
    return move_tag(ctx, l->base + from, buf, bytes, 0, WAIT, SIDE_TAG, what);
}

static int link_send_head(void *ctx, int to, const void *buf, size_t bytes, const char *what) {
    const link_ctx *l = ctx;
    return move_tag(ctx, l->base + to, (void *)buf, bytes, 1, WAIT, HEAD_TAG, what);
}

static int link_post_recv_head(void *ctx, int from, void *buf, size_t bytes, const char *what) {
    const link_ctx *l = ctx;
    return move_tag(ctx, l->base + from, buf, bytes, 0, SBP_SEQ_HEAD, HEAD_TAG, what);
}

static int link_done(void *ctx, int kind) {
    link_ctx *l = ctx;
    for (int i = 0; i < l->nposted[kind]; i++)
        if (!sbp_comm_test(l->c, l->posted[kind][i])) return 0;
    return 1;
}

static void link_progress(void *ctx) {
    link_ctx *l = ctx;
    sbp_comm_progress(l->c);
}

/* The posted messages' requests of one kind, waited for: only those, as the pieces' receives
 * from the other groups stay posted beside them (waiting for those here would tie this group to
 * theirs), and the other kinds' buffers are not about to be written. */
static int link_flush(void *ctx, int kind) {
    link_ctx *l = ctx;
    for (int i = 0; i < l->nposted[kind] && !l->failed; i++)
        if (sbp_comm_wait(l->c, l->posted[kind][i], "a posted message", &l->err)) l->failed = 1;
    l->nposted[kind] = 0;
    return !l->failed;
}

/* The result, folded where it is owned. The last rank of a group completes each bucket of its
 * micro-batch; its hook cuts the bucket into the owners' pieces (ZeRO-2's 4096-element blocks
 * over the N ranks, owners.c; unsharded, every rank owns every piece), copies its own into the
 * slot's place and sends the others, whose receives each rank posted before the round began:
 * slot j of round ρ (micro-batch ρD + j, from the last rank of group j) lands in the share itself
 * for micro-batch 0 (S = g_0), else in the column of slot j. After the round the columns are
 * added in j order, S ← S + g_k (one IEEE add per element, bf16: rounded, sbp_dist_fold): one
 * process's fold, element by element. A rank holds its share and D columns of its size (D − 1
 * with one round), never a whole gradient (unless the result is unsharded). A rank waiting on a
 * peer keeps testing its requests, so a send of a piece completes whatever its owner waits on. */
typedef struct {
    link_ctx *l;
    int me, S, D, N, sharded, esz, bf16, rho;
    sbp_piece *pc; /* (np) every bucket's pieces, in completion order */
    int np;
    int head; /* the head's bucket's index in that order, or −1 */
    int64_t
        *pos;  /* (np) where a piece this rank owns starts in out and the columns; −1 elsewhere */
    char *out; /* the share (sharded: the owned blocks packed), or the whole gradient */
    char **col;  /* (ncol) the slots' places besides out, laid out as out */
    int ncol, m; /* columns, rounds */
    int64_t n;   /* elements of out and of each column */
} shares;

static int owns(const shares *h, const sbp_piece *p, int q) {
    return !h->sharded || p->owner == q;
}

static int piece_tag(const shares *h, const sbp_piece *p) {
    return p->bucket == h->head ? HEAD_PIECE_TAG : PIECE_TAG;
}

/* Where slot j of the round lands: micro-batch 0 in the share, every other in a column. */
static char *slot_at(const shares *h, int j) {
    if (h->rho == 0 && j == 0) return h->out;
    return h->col[h->m > 1 ? j : j - 1];
}

/* The rank completing micro-batch ρD + j: the last of group j. */
static int producer(const shares *h, int j) {
    return j * h->S + h->S - 1;
}

static int fold_hook(void *ctx, int64_t off, int64_t n, const void *g) {
    shares *h = ctx;
    link_ctx *l = h->l;
    char *mine = slot_at(h, h->me / h->S);
    for (int i = 0; i < h->np && !l->failed; i++) {
        const sbp_piece *p = &h->pc[i];
        if (p->off < off || p->off >= off + n) continue; /* another bucket's */
        const char *src = (const char *)g + (p->off - off) * h->esz;
        const size_t bytes = (size_t)p->n * (size_t)h->esz;
        for (int q = 0; q < h->N && !l->failed; q++) {
            if (!owns(h, p, q)) continue;
            if (q != h->me)
                move_tag(l, q, (void *)src, bytes, 1, WAIT, piece_tag(h, p),
                         "the gradient's pieces");
            else
                memcpy(mine + h->pos[i] * h->esz, src, bytes);
        }
    }
    return !l->failed;
}

/* Before round ρ: the receives of this rank's pieces from every group's last rank but itself,
 * posted, in piece order (the order its producer sends them in). */
static int post_receives(shares *h) {
    for (int j = 0; j < h->D && !h->l->failed; j++) {
        if (producer(h, j) == h->me) continue;
        char *to = slot_at(h, j);
        for (int i = 0; i < h->np && !h->l->failed; i++)
            if (owns(h, &h->pc[i], h->me))
                move_tag(h->l, producer(h, j), to + h->pos[i] * h->esz,
                         (size_t)h->pc[i].n * (size_t)h->esz, 0, UNTRACKED, piece_tag(h, &h->pc[i]),
                         "the gradient's pieces");
    }
    return !h->l->failed;
}

/* After round ρ, every piece in: the columns added in slot order. */
static void fold_round(shares *h) {
    for (int j = h->rho == 0; j < h->D; j++)
        sbp_dist_fold(h->out, slot_at(h, j), h->n, h->esz, h->bf16);
}

/* The columns a rank of D groups holds for a step of m rounds: one a slot, but micro-batch 0's,
 * which lands in the share. */
static int columns(int D, int m) {
    return m > 1 ? D : D - 1;
}

/* The pieces, where this rank's start in its share, the share and the columns (charged to
 * SBP_MEM_GRADS); 0 when out of memory. */
static int shares_begin(shares *h, const sbp_params *ps, sbp_ledger *lg) {
    const int cap = ps->n + 2;
    sbp_bucket *b = malloc(sizeof *b * (size_t)cap);
    h->pc = malloc(sizeof *h->pc * (size_t)cap * (size_t)(h->N + 1));
    const int nb = b && h->pc ? sbp_grad_buckets(b, cap, ps) : -1;
    h->np = nb >= 0 ? sbp_dist_pieces(h->pc, cap * (h->N + 1), b, nb, h->N) : -1;
    h->head = -1;
    for (int i = 0; i < nb; i++)
        if (b[i].id == SBP_BUCKET_HEAD) h->head = i;
    free(b);
    sbp_range *rg = NULL;
    int64_t owned = ps->total;
    const int nr = h->sharded ? sbp_dist_owned(&rg, &owned, ps, h->N, h->me) : 0;
    h->pos = h->np >= 0 ? malloc(sizeof *h->pos * (size_t)(h->np ? h->np : 1)) : NULL;
    h->ncol = columns(h->D, h->m);
    h->col = calloc((size_t)(h->ncol ? h->ncol : 1), sizeof *h->col);
    if (h->np < 0 || nr < 0 || !h->pos || !h->col) return free(rg), 0;
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
    int ok = h->out != NULL;
    for (int j = 0; j < h->ncol && ok; j++)
        ok = (h->col[j] = sbp_ledger_alloc(lg, SBP_MEM_GRADS, (size_t)h->esz * (size_t)owned)) !=
             NULL;
    return ok;
}

static void shares_end(shares *h, sbp_ledger *lg) {
    for (int j = h->ncol - 1; j >= 0 && h->col; j--) sbp_ledger_free(lg, h->col[j]);
    free(h->pc), free(h->pos), free(h->col);
    h->col = NULL, h->pc = NULL, h->pos = NULL;
}

int sbp_seq_columns(int N, int S, int n) {
    const int D = S > 1 ? N / S : N;
    return D < 1 || n % D ? -1 : columns(D, n / D);
}

sbp_status sbp_seq_check(int T, const sbp_grad_opts *g, sbp_err *err) {
    const int S = g->seq_ranks, N = g->comm ? sbp_comm_size(g->comm) : 1;
    if (S <= 1) return SBP_OK;
    if (S > SBP_SEQ_MAX)
        return sbp_fail(err, SBP_EUSAGE, "--seq-ranks must be 1 to %d, not %d", SBP_SEQ_MAX, S);
    if (N == 1)
        return sbp_fail(err, SBP_EUSAGE,
                        "--seq-ranks %d shares each sequence among %d processes, but this is one "
                        "process: run it under mpirun -np N, N a multiple of %d",
                        S, S, S);
    if (N % S)
        return sbp_fail(err, SBP_EUSAGE,
                        "--seq-ranks %d must divide the process count (mpirun -np N: N / S groups "
                        "of S ranks, data parallel between the groups), got N = %d",
                        S, N);
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

/* Whether a row of b has a query that sees no key on a layer of window W (0: causal): a row
 * starting with padding, or W padding keys in a row. */
static int sees_no_key(const sbp_batch *b, int W) {
    for (int r = 0; r < b->B; r++) {
        const uint8_t *mask = b->mask + (size_t)r * b->T;
        for (int t = 0, run = 0; t < b->T; t++) {
            run = mask[t] ? 0 : run + 1;
            if (run && (run == t + 1 || (W > 0 && run >= W))) return 1;
        }
    }
    return 0;
}

sbp_status sbp_seq_grad(void **out, int64_t numel, double *loss, const sbp_model *m,
                        const sbp_batch *batches, int n, const sbp_grad_opts *opts,
                        const sbp_objective *so, sbp_ledger *lg, sbp_err *err) {
    sbp_comm *c = opts->comm;
    const int N = sbp_comm_size(c), me = sbp_comm_rank(c), S = opts->seq_ranks, D = N / S;
    const int g = me / S;
    *out = NULL;
    if (n % D)
        return sbp_fail(err, SBP_EUSAGE,
                        "%d micro-batches cannot be shared by %d groups of %d ranks: the group "
                        "count (N / --seq-ranks) must divide them",
                        n, D, S);
    /* HF makes a query that sees no key attend to every key of the sequence, the later ranks'
     * too, which no rank holds (docs/distributed.md §8) */
    int W = 0; /* a local layer's window, if the model has one (every local layer's is the same) */
    for (int l = 0; l < m->cfg.layers && !W; l++) W = sbp_layer_window(&m->cfg, l);
    for (int k = 0; k < n && opts->unattended != SBP_UNATTENDED_ZERO; k++)
        if (batches[k].mask && sees_no_key(&batches[k], W))
            return sbp_fail(err, SBP_EUSAGE,
                            "--unattended %s with --seq-ranks: micro-batch %d has queries that "
                            "see no key, which attend to every key of the sequence there; "
                            "sequence parallel runs them only with --unattended zero",
                            sbp_unattended_name(opts->unattended), k);
    const sbp_params *ps = opts->lora ? &opts->lora->params : &m->params;
    link_ctx l = {.c = c, .base = g * S};
    const sbp_seq_link link = {.rank = me - g * S,
                               .size = S,
                               .ctx = &l,
                               .send = link_send,
                               .recv = link_recv,
                               .post = link_post,
                               .post_side = link_post_side,
                               .post_ahead = link_post_ahead,
                               .progress = link_progress,
                               .recv_side = link_recv_side,
                               .send_head = link_send_head,
                               .post_recv_head = link_post_recv_head,
                               .done = link_done,
                               .flush = link_flush};
    shares h = {.l = &l,
                .me = me,
                .S = S,
                .D = D,
                .N = N,
                .m = n / D,
                .sharded = opts->sharded,
                .esz = m->prec == SBP_FP64 ? 8 : 4,
                .bf16 = opts->emulate_bf16};
    double *mine = calloc((size_t)h.m, sizeof *mine), *all = calloc((size_t)N * h.m, sizeof *all);
    sbp_status st = SBP_OK;
    if (!mine || !all || !shares_begin(&h, ps, lg) || h.n != numel) {
        sbp_ledger_free(lg, h.out), shares_end(&h, lg), free(mine), free(all);
        return sbp_fail(err, SBP_ENOMEM, "out of memory for the gradient's shares");
    }
    for (h.rho = 0; h.rho < h.m && !st; h.rho++) {
        const int k = h.rho * D + g;
        sbp_engine_opts eo;
        sbp_obj_eval ev;
        if ((st = sbp_engine_resolve(&eo, opts, batches[k].T, err)) ||
            (st = sbp_obj_begin(&ev, so, &batches[k], err)))
            break;
        eo.ev = &ev, eo.link = &link;
        eo.fold = 1, eo.bucket_hook = fold_hook, eo.hook_ctx = &h;
        post_receives(&h);
        if (!l.failed) st = run_engine(&mine[h.rho], m, &batches[k], &eo, lg, err);
        sbp_obj_end(&ev);
        /* every request of the round done (the pieces are in), the list emptied */
        if (!st && !l.failed && sbp_comm_waitall(c, "the gradient's pieces", &l.err)) l.failed = 1;
        if (l.failed) st = sbp_fail(err, l.err.status, "%s", l.err.msg);
        if (st && n > 1) sbp_fail_prefix(err, "micro-batch %d: ", k);
        if (!st) fold_round(&h);
    }
    /* the losses of every group's last rank, folded in k order on every rank */
    if (!st) st = sbp_comm_allgather(c, all, mine, sizeof *mine * (size_t)h.m, "the losses", err);
    double total = 0;
    for (int k = 0; k < n && !st; k++) {
        const double lk = all[producer(&h, k % D) * h.m + k / D];
        total = k ? total + lk : lk;
    }
    free(mine), free(all);
    for (int k = 0; k < SBP_SEQ_KINDS; k++) free(l.posted[k]);
    shares_end(&h, lg);
    if (st)
        sbp_ledger_free(lg, h.out);
    else
        *out = h.out;
    *loss = total;
    return st;
}
