/* seqpar.c — a gradient step with the processes sharing every sequence (sequence parallel,
 * docs/distributed.md §8, stage 1).
 *
 * Every process runs every micro-batch on its rows, the engine handing each sum that crosses the
 * rows on in token order through the link below (src/engine/relay.c). A bucket's sum is complete
 * on the last rank of the group, whose hook folds it as one process folds micro-batches: S = g_0,
 * then S ← S + g_k, one IEEE add per element (bf16 storage: each result rounded; sbp_dist_fold).
 * After the step the last rank sends each process its share (or the whole gradient) and the
 * loss: copies only, so the bytes are one process's. */
#include "seqpar.h"
#include "../core/err.h"
#include "../dist/seqlink.h"
#include "../engine/entry.h"
#include "resolve.h"

#include <stdlib.h>
#include <string.h>

enum { SEQ_TAG = (1 << 20) + 1 }; /* beside gather.c's: no other message is in flight then */
enum { PART = 1 << 30 };          /* bytes a message at most (the transport's int counts) */

typedef struct {
    sbp_comm *c;
    sbp_err err; /* the transport's first error */
    int failed;
    int posted; /* posted sends not flushed: the transport's requests are kept until then */
} link_ctx;

/* One copy to or from a peer, in parts of at most PART bytes, waited for unless posted. */
static int move(void *ctx, int peer, void *buf, size_t bytes, int send, int post,
                const char *what) {
    link_ctx *l = ctx;
    for (size_t at = 0; at < bytes && !l->failed; at += PART) {
        const size_t n = bytes - at < PART ? bytes - at : PART;
        char *p = (char *)buf + at;
        const int r = send ? sbp_comm_isend(l->c, p, n, peer, SEQ_TAG, &l->err)
                           : sbp_comm_irecv(l->c, p, n, peer, SEQ_TAG, &l->err);
        if (r < 0)
            l->failed = 1;
        else if (post)
            l->posted = 1;
        else if (l->posted ? sbp_comm_wait(l->c, r, what, &l->err)
                           : sbp_comm_waitall(l->c, what, &l->err))
            l->failed = 1;
    }
    return !l->failed;
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

static int link_flush(void *ctx) {
    link_ctx *l = ctx;
    if (!l->failed && sbp_comm_waitall(l->c, "a hand-over to rank 0", &l->err)) l->failed = 1;
    l->posted = 0;
    return !l->failed;
}

/* The last rank's fold of the completed buckets into the whole gradient W. */
typedef struct {
    char *W;
    int esz, bf16, first; /* first: micro-batch 0, copied */
} fold_ctx;

static int fold_hook(void *ctx, int64_t off, int64_t n, const void *g) {
    fold_ctx *f = ctx;
    char *s = f->W + off * f->esz;
    if (f->first)
        memcpy(s, g, (size_t)n * (size_t)f->esz);
    else
        sbp_dist_fold(s, g, n, f->esz, f->bf16);
    return 1;
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

/* The last rank's W to every other process: its share packed (sharded), or all of it. */
static sbp_status spread(void *out, const char *W, link_ctx *l, const sbp_params *ps, int esz,
                         int sharded, sbp_err *err) {
    const int N = sbp_comm_size(l->c), me = sbp_comm_rank(l->c), last = N - 1;
    for (int q = 0; q < N; q++) {
        if (me != last && me != q) continue;
        sbp_range *rg = NULL;
        int64_t owned = 0;
        const int nr = sharded ? sbp_dist_owned(&rg, &owned, ps, N, q) : 1;
        if (nr < 0) return sbp_fail(err, SBP_ENOMEM, "out of memory");
        if (!sharded) rg = NULL, owned = ps->total;
        char *to = out;
        for (int i = 0; i < nr && !l->failed; i++) {
            const int64_t lo = sharded ? rg[i].begin : 0, hi = sharded ? rg[i].end : ps->total;
            const size_t bytes = (size_t)(hi - lo) * (size_t)esz;
            if (me == last && q == last)
                memcpy(to, W + lo * esz, bytes);
            else if (me == last)
                link_send(l, q, W + lo * esz, bytes, "the gradient's shares");
            else
                link_recv(l, last, to, bytes, "the gradient's shares");
            to += bytes;
        }
        free(rg);
    }
    return l->failed ? sbp_fail(err, l->err.status, "%s", l->err.msg) : SBP_OK;
}

sbp_status sbp_seq_grad(void **out, int64_t numel, double *loss, const sbp_model *m,
                        const sbp_batch *batches, int n, const sbp_grad_opts *opts,
                        const sbp_objective *so, sbp_ledger *lg, sbp_err *err) {
    sbp_comm *c = opts->comm;
    const int N = sbp_comm_size(c), me = sbp_comm_rank(c), last = N - 1;
    const sbp_params *ps = opts->lora ? &opts->lora->params : &m->params;
    const int esz = m->prec == SBP_FP64 ? 8 : 4;
    link_ctx l = {.c = c};
    const sbp_seq_link link = {.rank = me,
                               .size = N,
                               .ctx = &l,
                               .send = link_send,
                               .recv = link_recv,
                               .post = link_post,
                               .flush = link_flush};
    fold_ctx f = {.esz = esz, .bf16 = opts->emulate_bf16};
    sbp_status st = SBP_OK;
    if (me == last && !(f.W = sbp_ledger_alloc(lg, SBP_MEM_GRADS, (size_t)esz * ps->total)))
        return sbp_fail(err, SBP_ENOMEM, "out of memory for the sequence group's gradient");
    double total = 0;
    for (int k = 0; k < n && !st; k++) {
        sbp_engine_opts eo;
        sbp_obj_eval ev;
        if ((st = sbp_engine_resolve(&eo, opts, batches[k].T, err)) ||
            (st = sbp_obj_begin(&ev, so, &batches[k], err)))
            break;
        eo.ev = &ev, eo.link = &link;
        eo.fold = 1, eo.bucket_hook = fold_hook, eo.hook_ctx = &f;
        f.first = k == 0;
        double loss_k = 0;
        st = run_engine(&loss_k, m, &batches[k], &eo, lg, err);
        sbp_obj_end(&ev);
        if (st && l.failed) st = sbp_fail(err, l.err.status, "%s", l.err.msg);
        if (st && n > 1) sbp_fail_prefix(err, "micro-batch %d: ", k);
        total = k > 0 ? total + loss_k : loss_k; /* the last rank's is the step's */
    }
    /* the loss and the gradient from the last rank: copies */
    if (!st && me == last)
        for (int q = 0; q < last && !l.failed; q++) link_send(&l, q, &total, sizeof total, "loss");
    if (!st && me != last) link_recv(&l, last, &total, sizeof total, "the loss");
    if (!st && l.failed) st = sbp_fail(err, l.err.status, "%s", l.err.msg);
    *out = NULL;
    if (!st && !(*out = sbp_ledger_alloc(lg, SBP_MEM_GRADS, (size_t)esz * (size_t)numel)))
        st = sbp_fail(err, SBP_ENOMEM, "out of memory for the gradients (%lld elements)",
                      (long long)numel);
    if (!st) st = spread(*out, f.W, &l, ps, esz, opts->sharded, err);
    sbp_ledger_free(lg, f.W);
    if (st) sbp_ledger_free(lg, *out), *out = NULL;
    *loss = total;
    return st;
}
