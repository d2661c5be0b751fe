/* plan.c — sbp_plan: the ledger of one step without its memory.
 *
 * The float engine runs in planning mode over a batch of the objective's shape: every buffer the
 * schedule allocates is reserved (never touched) and charged at storage_bytes per element, and
 * every operation of the planning table does nothing, so the ledger sees exactly the allocations
 * and frees of a real run, in the same order. The objective runs on the host over the zeros it
 * is handed, as it would over real log-probs, so what it makes the engine allocate (DPO's
 * first, forward-only pass over the head and its log-prob buffer) is planned too.
 *
 * Charged besides the engine's buffers, as sbp_grad and a training run hold them: the weights
 * (and a LoRA adapter's) and the gradients of what is trained at the storage size; AdamW's
 * moments, when asked for, at 4 bytes each per trainable parameter (with ranks > 1 the gradient
 * and the moments of one rank's blocks only, ZeRO-2, and the distributed step's own buffers, for
 * the rank holding the most: sbp_dist_plan_rank); the batch's host arrays
 * (sbp_batch_bytes), which sbp_grad charges for the duration of a step. A plan for a device
 * (grad.device) equals that device's ledger: its own workspace and copies of the batch, no host
 * arrays, and no optimizer (training runs on the CPU). */
#include "../core/objective.h"
#include "../engine/entry.h"
#include "resolve.h"
#include "seqpar.h"
#include "../streambp.h"
#include "../core/err.h"
#include "../dist/dist.h"
#include "../dist/seqlink.h"

#include <stdlib.h>
#include <string.h>

/* A batch of the objective's shape, holding the arrays a real batch of that objective holds:
 * SFT B rows; DPO B pairs as 2B rows (chosen, then rejected) with each row's reference
 * statistic; GRPO B rows (a group) with their advantages and per-token old and reference
 * log-probs. Every token is id 0, real, and a target. */
static sbp_status dummy_batch(sbp_batch *b, sbp_objective_kind kind, int B, int T, sbp_err *err) {
    memset(b, 0, sizeof *b);
    if (kind == SBP_OBJ_DPO && B > (1 << 30))
        return sbp_fail(err, SBP_EUSAGE, "too many DPO pairs (%d)", B);
    const int rows = kind == SBP_OBJ_DPO ? 2 * B : B;
    const size_t n = (size_t)rows * (size_t)T;
    b->B = rows, b->T = T, b->kind = kind;
    b->ids = calloc(n, sizeof *b->ids);
    b->labels = calloc(n, sizeof *b->labels);
    b->mask = malloc(n);
    int ok = b->ids && b->labels && b->mask;
    if (ok) memset(b->mask, 1, n);
    if (ok && kind == SBP_OBJ_DPO) {
        b->pairs = B;
        ok = (b->ref_seq_logps = calloc((size_t)rows, sizeof(double))) != NULL;
    }
    if (ok && kind == SBP_OBJ_GRPO)
        ok = (b->advantages = calloc((size_t)rows, sizeof(double))) &&
             (b->old_logps = calloc(n, sizeof(double))) &&
             (b->ref_logps = calloc(n, sizeof(double)));
    if (!ok) {
        sbp_batch_free(b);
        return sbp_fail(err, SBP_ENOMEM, "out of memory for a planning batch of %d x %d", rows, T);
    }
    sbp_batch_count_targets(b);
    return SBP_OK;
}

/* A distributed step's engine run, planned (sbp_dist_plan). */
typedef struct {
    sbp_model *m;
    sbp_batch *b;
    sbp_engine_opts *eo;
    sbp_ledger *lg;
    void *grads;
} plan_ctx;

static sbp_status plan_run(void *ctx, int k, sbp_bucket_hook hook, void *hook_ctx, double *loss_k,
                           sbp_err *err) {
    plan_ctx *p = ctx;
    *loss_k = 0;
    return sbp_engine_grad_f32(loss_k, p->grads, p->m, p->b, p->eo, p->lg, err);
}

/* The planning run's hook: a planning table folds nothing. */
static int no_fold(void *ctx, int64_t off, int64_t n, const void *g) {
    (void)ctx, (void)off, (void)n, (void)g;
    return 1;
}

/* A counting link: what a rank's engine sends in a micro-batch, in the messages the transport's
 * link cuts it into (seqpar.c); nothing moves, nothing is received. */
typedef struct {
    int64_t bytes, messages;
} tally;

static int tally_send(void *ctx, int to, const void *buf, size_t bytes, const char *what) {
    tally *t = ctx;
    (void)to, (void)buf, (void)what;
    t->bytes += (int64_t)bytes;
    t->messages += (int64_t)((bytes + SBP_SEQ_PART - 1) / SBP_SEQ_PART);
    return 1;
}

static int tally_recv(void *ctx, int from, void *buf, size_t bytes, const char *what) {
    (void)ctx, (void)from, (void)buf, (void)bytes, (void)what;
    return 1;
}

static void tally_progress(void *ctx) {}

static int tally_flush(void *ctx, int side) {
    (void)ctx;
    return 1;
}

static int tally_done(void *ctx, int kind) {
    (void)ctx, (void)kind;
    return 1;
}

/* Rank q of a sequence group of S, owning own elements, planned (the step of seqpar.c): the
 * weights, with optimizer AdamW's moments of its share, the micro-batches, its share of the
 * result and the ncol columns its pieces arrive in, then the engine run of its rows (a planning
 * link: nothing moves, its buffers are charged). */
static sbp_status plan_seq_rank(sbp_ledger *lg, sbp_model *m, sbp_lora *a, sbp_batch *b,
                                sbp_engine_opts *eo, const sbp_seq_link *link, int sb, int n,
                                int ncol, int optimizer, int64_t own, sbp_err *err) {
    const sbp_params *tps = eo->lora ? &a->params : &m->params;
    const int64_t batch_bytes = sbp_batch_bytes(b) * n;
    void **col = calloc((size_t)(ncol > 0 ? ncol : 1), sizeof *col);
    if (!col) return sbp_fail(err, SBP_ENOMEM, "out of memory planning %d columns", ncol);
    m->w = sbp_ledger_alloc(lg, SBP_MEM_WEIGHTS, (size_t)sb * (size_t)m->params.total);
    if (eo->lora) a->w = sbp_ledger_alloc(lg, SBP_MEM_WEIGHTS, (size_t)sb * tps->total);
    void *adam[2] = {NULL, NULL}; /* as sbp_adamw_init allocates them: 4 bytes an element */
    for (int k = 0; k < 2 && optimizer; k++)
        adam[k] = sbp_ledger_alloc(lg, SBP_MEM_OPTIMIZER, 4 * (size_t)own);
    sbp_ledger_charge(lg, SBP_MEM_BATCH, batch_bytes);
    void *share = sbp_ledger_alloc(lg, SBP_MEM_GRADS, (size_t)sb * (size_t)own);
    for (int j = 0; j < ncol; j++)
        col[j] = sbp_ledger_alloc(lg, SBP_MEM_GRADS, (size_t)sb * (size_t)own);
    double loss = 0;
    eo->link = link, eo->fold = 1, eo->bucket_hook = no_fold;
    sbp_status st = sbp_engine_grad_f32(&loss, NULL, m, b, eo, lg, err);
    for (int j = ncol - 1; j >= 0; j--) sbp_ledger_free(lg, col[j]);
    free(col);
    sbp_ledger_free(lg, share);
    sbp_ledger_charge(lg, SBP_MEM_BATCH, -batch_bytes);
    sbp_ledger_free(lg, adam[1]), sbp_ledger_free(lg, adam[0]);
    sbp_ledger_free(lg, a->w), sbp_ledger_free(lg, m->w);
    a->w = NULL, m->w = NULL;
    return st;
}

/* Rank r's exposed communication in a step of m rounds (sbp_plan_seq_net): a round's sends (its
 * engine's, t, and a group's last rank's pieces) against its compute (its rows' FLOPs at
 * nw->flops), what they exceed it by a round, and the exchanges after the rounds; nt keeps the
 * rank exposing the most, and the most compute. */
static sbp_status seq_rank_net(sbp_net_time *nt, const sbp_net *nw, const tally *t, double flops,
                               const sbp_params *ps, int esz, int N, int r, int m, int last,
                               int optimizer, sbp_err *err) {
    int64_t b1 = 0, m1 = 0, b0 = 0, m0 = 0, ab = 0, am = 0; /* a round with and without pieces */
    sbp_status st;
    if ((st = sbp_dist_traffic_rank(&b1, &m1, ps, esz, N, r, 1, last, optimizer, err)) ||
        (st = sbp_dist_traffic_rank(&b0, &m0, ps, esz, N, r, 1, 0, optimizer, err)) ||
        (st = sbp_dist_traffic_rank(&ab, &am, ps, esz, N, r, m, 0, optimizer, err)))
        return st;
    const double d = (double)(t->bytes + b1 - b0) / nw->bandwidth +
                     (double)(t->messages + m1 - m0) * nw->latency;
    const double c = flops / nw->flops, per_round = d > c ? d - c : 0;
    const double after = (double)ab / nw->bandwidth + (double)am * nw->latency;
    if (m * c > nt->compute) nt->compute = m * c;
    if (m * per_round + after > nt->exposed)
        nt->exposed = m * per_round + after, nt->per_round = per_round, nt->after = after;
    return SBP_OK;
}

/* sbp_plan, and with net (sequence parallel only) the network model of sbp_plan_seq_traffic,
 * with nw its time (sbp_plan_seq_net) into nt */
static sbp_status plan_step(sbp_ledger *lg, tally *net, const sbp_net *nw, sbp_net_time *nt,
                            const sbp_config *cfg, const sbp_plan_opts *o, sbp_err *err) {
    memset(lg, 0, sizeof *lg);
    lg->plan = 1;
    if (o->seq_ranks > 1 && ((o->ranks > 1 && o->ranks % o->seq_ranks) ||
                             o->seq_ranks > SBP_SEQ_MAX || o->grad.device != SBP_DEVICE_CPU))
        return sbp_fail(err, SBP_EUSAGE,
                        "sequence parallel is planned on the CPU for S <= %d ranks a sequence, S "
                        "dividing the process count N (got S = %d, N = %d)",
                        SBP_SEQ_MAX, o->seq_ranks, o->ranks);
    int sb = o->storage_bytes ? o->storage_bytes : 4;
    if (sb != 2 && sb != 4 && sb != 8)
        return sbp_fail(err, SBP_EUSAGE,
                        "storage must be 2 (bf16), 4 (fp32) or 8 (fp64) bytes, not %d", sb);
    if (o->micro_batches < 0 || o->ranks < 0)
        return sbp_fail(err, SBP_EUSAGE, "micro-batches and ranks must be >= 0 (got %d, %d)",
                        o->micro_batches, o->ranks);
    if (o->ranks > 1 && o->seq_ranks <= 1 && o->micro_batches > 1 &&
        o->micro_batches % o->ranks) /* sequence parallel's groups: below */
        return sbp_fail(err, SBP_EUSAGE, "%d micro-batches cannot be shared by %d processes",
                        o->micro_batches, o->ranks);
    if (o->B < 1 || o->T < 1)
        return sbp_fail(err, SBP_EUSAGE, "B and T must be >= 1 (got %d, %d)", o->B, o->T);
    const int64_t rows = o->grad.objective.kind == SBP_OBJ_DPO ? 2 * (int64_t)o->B : o->B;
    if (rows * o->T > SBP_PLAN_MAX_TOKENS)
        return sbp_fail(err, SBP_EUSAGE,
                        "planning covers steps of at most %d tokens (rows x T: 2^26), not %lld "
                        "(%lld rows of T = %d): the walk visits every token",
                        SBP_PLAN_MAX_TOKENS, (long long)(rows * o->T), (long long)rows, o->T);
    if ((unsigned)o->grad.objective.kind > SBP_OBJ_GRPO)
        return sbp_fail(err, SBP_EUSAGE, "unknown objective %d", (int)o->grad.objective.kind);
    /* A device plan equals the device's ledger, and no training step runs on a device (train
     * and AdamW are the CPU's): its moments would be charged to a ledger that never holds them */
    if (o->optimizer && o->grad.device != SBP_DEVICE_CPU)
        return sbp_fail(err, SBP_EUSAGE,
                        "a plan for %s covers a gradient step only: training (AdamW and its "
                        "moments) runs on the CPU, so leave out the optimizer or plan for the CPU",
                        sbp_device_name(o->grad.device));
    /* a gradient sink (sbp_grad_opts.grad_sink): the step holds no slab, its pieces form in the
     * fold's scratch and leave (sbp_grad_batches' terms) */
    const int sink = o->grad.grad_sink != NULL;
    if (sink && (o->micro_batches > 1 || o->ranks > 1 || o->seq_ranks > 1 || o->optimizer ||
                 o->grad.device != SBP_DEVICE_CPU))
        return sbp_fail(err, SBP_EUSAGE,
                        "a gradient written as it forms is a step of one micro-batch in one "
                        "process on the CPU, with no optimizer");
    sbp_grad_opts g = o->grad;
    g.lora = NULL;
    sbp_engine_opts eo;
    sbp_status st = sbp_engine_resolve(&eo, &g, o->T, err);
    if (st) return st;
    eo.plan = 1;
    eo.elem_bytes = sb;
    /* a device's own workspace (resolve has refused a device this build lacks) */
    eo.device_ops =
        g.device == SBP_DEVICE_CPU ? NULL : sbp_cuda_ops(g.device, sb == 8 ? SBP_FP64 : SBP_FP32);
    /* the later micro-batches' runs, the step's largest; every run of a distributed step */
    eo.fold = o->micro_batches > 1 || o->ranks > 1 || sink;
    if (sink) eo.bucket_hook = no_fold;
    sbp_model m = {.cfg = *cfg, .prec = SBP_FP32};
    sbp_lora a = {.prec = SBP_FP32};
    if (o->lora.r > 0) { /* the adapter's tensors; alpha only scales values, never memory */
        a.cfg = o->lora;
        if (!(a.cfg.alpha > 0)) a.cfg.alpha = 1;
        if ((st = sbp_lora_params_build(&a.params, cfg, &a.cfg, err))) return st;
        eo.lora = &a;
    }
    if ((st = sbp_params_build(&m.params, cfg, err))) {
        sbp_params_free(&a.params);
        return st;
    }
    const size_t trained = (size_t)(eo.lora ? a.params.total : m.params.total);
    sbp_batch b;
    if ((st = dummy_batch(&b, o->grad.objective.kind, o->B, o->T, err))) {
        sbp_params_free(&a.params), sbp_params_free(&m.params);
        return st;
    }
    if (o->seq_ranks > 1) {
        /* the ledger of the rank holding the most; a rank's buffers depend on its rows, its share
         * and whether it is its group's first or last (no query side of its own to keep, none
         * to receive) only, so a rank like one planned before adds nothing */
        sbp_objective obj = o->grad.objective;
        if (obj.kind == SBP_OBJ_SFT && b.n_targets == 0 && obj.num_items == 0) obj.num_items = 1;
        sbp_obj_eval ev = {0};
        const int S = o->seq_ranks, N = o->ranks > 1 ? o->ranks : S;
        const int n = o->micro_batches > 1 ? o->micro_batches : N / S;
        const int ncol = sbp_seq_columns(N, S, n);
        int bounds[SBP_SEQ_MAX + 1];
        int64_t seen[2 * SBP_SEQ_MAX][3];
        int ns = 0;
        const int grain = sbp_engine_seq_grain_f32(eo.numerics == SBP_NUMERICS_PORTABLE, eo.block);
        if (ncol < 0)
            st =
                sbp_fail(err, SBP_EUSAGE,
                         "%d micro-batches cannot be shared by %d groups of %d ranks", n, N / S, S);
        else if (!(eo.seq_overlap ? sbp_seq_slices_by_work(bounds, cfg, o->T, S, grain)
                                  : sbp_seq_slices(bounds, o->T, S, grain)))
            st = sbp_fail(err, SBP_EUSAGE,
                          "T = %d is too short to share among %d ranks in blocks of %d tokens",
                          o->T, S, grain);
        for (int r = 0; r < N && !st; r++) {
            sbp_range *rg = NULL;
            int64_t own = 0;
            if (sbp_dist_owned(&rg, &own, eo.lora ? &a.params : &m.params, N, r) < 0) {
                st = sbp_fail(err, SBP_ENOMEM, "out of memory planning rank %d", r);
                break;
            }
            free(rg);
            const int q = r % S, held = bounds[q + 1] - bounds[q],
                      end = (q == 0) + 2 * (q == S - 1);
            int dup = 0; /* the traffic differs by rank (its pieces, its place in the relays) */
            for (int i = 0; i < ns && !net; i++)
                dup |= seen[i][0] == held && seen[i][1] == own && seen[i][2] == end;
            if (dup) continue;
            if (ns < 2 * SBP_SEQ_MAX) seen[ns][0] = held, seen[ns][1] = own, seen[ns++][2] = end;
            sbp_ledger rl = {.plan = 1};
            tally t = {0, 0};
            const sbp_seq_link link = {.rank = q,
                                       .size = S,
                                       .ctx = &t,
                                       .send = net ? tally_send : NULL,
                                       .recv = net ? tally_recv : NULL,
                                       .post = net ? tally_send : NULL,
                                       .post_side = net ? tally_send : NULL,
                                       .recv_side = net ? tally_recv : NULL,
                                       .post_ahead = net ? tally_send : NULL,
                                       .send_head = net ? tally_send : NULL,
                                       .post_recv_head = net ? tally_recv : NULL,
                                       .done = net ? tally_done : NULL,
                                       .progress = net ? tally_progress : NULL,
                                       .flush = net ? tally_flush : NULL};
            if ((st = sbp_obj_begin(&ev, &obj, &b, err))) break;
            eo.ev = &ev;
            st = plan_seq_rank(&rl, &m, &a, &b, &eo, &link, sb, n, ncol, o->optimizer, own, err);
            sbp_obj_end(&ev);
            if (!st && (r == 0 || rl.peak_total > lg->peak_total)) *lg = rl;
            /* the step: n / D micro-batches of the group's, its pieces and what follows; the
             * gradient's elements at the run's size (bf16 storage is emulated in float32) */
            int64_t by = 0, ms = 0;
            if (!st && net &&
                !(st = sbp_dist_traffic_rank(&by, &ms, eo.lora ? &a.params : &m.params,
                                             sb == 8 ? 8 : 4, N, r, n / (N / S), q == S - 1,
                                             o->optimizer, err))) {
                by += (int64_t)(n / (N / S)) * t.bytes, ms += (int64_t)(n / (N / S)) * t.messages;
                if (by > net->bytes) net->bytes = by, net->messages = ms;
            }
            if (!st && net && nw) { /* the step's FLOPs as the engine runs it, adapter included */
                sbp_grad_opts fg = o->grad;
                fg.lora = eo.lora;
                const double f = sbp_step_flops(cfg, o->B, o->T, &fg) *
                                 sbp_seq_work_share(cfg, o->T, bounds[q], bounds[q + 1]);
                st = seq_rank_net(nt, nw, &t, f, eo.lora ? &a.params : &m.params, sb == 8 ? 8 : 4,
                                  N, r, n / (N / S), q == S - 1, o->optimizer, err);
            }
        }
        sbp_batch_free(&b);
        sbp_params_free(&a.params);
        sbp_params_free(&m.params);
        return st;
    }
    m.w = sbp_ledger_alloc(lg, SBP_MEM_WEIGHTS, (size_t)sb * (size_t)m.params.total);
    if (eo.lora) a.w = sbp_ledger_alloc(lg, SBP_MEM_WEIGHTS, (size_t)sb * trained);
    /* ZeRO-2 (docs/distributed.md §7): a rank holds its share of the gradient and of the
     * moments, and the step's ring and column; the rank holding the most is planned */
    const sbp_params *tps = eo.lora ? &a.params : &m.params;
    size_t held = trained;
    int prank = 0;
    if (o->ranks > 1) {
        int64_t own = 0;
        prank = sbp_dist_plan_rank(tps, sb, o->ranks, sb + (o->optimizer ? 8 : 0), &own);
        held = (size_t)own;
    }
    void *grads =
        prank >= 0 && !sink ? sbp_ledger_alloc(lg, SBP_MEM_GRADS, (size_t)sb * held) : NULL;
    void *adam[2] = {NULL, NULL}; /* exp_avg and exp_avg_sq, as sbp_adamw_init allocates them */
    for (int k = 0; k < 2 && o->optimizer; k++)
        adam[k] = sbp_ledger_alloc(lg, SBP_MEM_OPTIMIZER, 4 * held);
    sbp_obj_eval ev = {0};
    /* one token has nothing to predict; its memory is still a fair question for SFT */
    sbp_objective obj = o->grad.objective;
    if (obj.kind == SBP_OBJ_SFT && b.n_targets == 0 && obj.num_items == 0) obj.num_items = 1;
    if (!m.w || (eo.lora && !a.w) || (!grads && !sink) ||
        (o->optimizer && (!adam[0] || !adam[1]))) {
        st = sbp_fail(err, SBP_ENOMEM, "out of address space planning %lld parameters",
                      (long long)m.params.total);
    } else if (!(st = sbp_obj_begin(&ev, &obj, &b, err))) {
        /* every micro-batch is held while the step runs (sbp_grad_batches), all of this shape */
        const int ranks = o->ranks > 1 ? o->ranks : 1;
        const int n = o->micro_batches > 1 ? o->micro_batches : ranks;
        /* host memory, which a device's ledger does not record (its copies: ledger_ops.c) */
        const int64_t batch_bytes = g.device == SBP_DEVICE_CPU ? sbp_batch_bytes(&b) * n : 0;
        sbp_ledger_charge(lg, SBP_MEM_BATCH, batch_bytes);
        double loss = 0;
        eo.ev = &ev;
        plan_ctx pc = {&m, &b, &eo, lg, grads};
        st = ranks > 1 ? sbp_dist_plan(lg, tps, sb, ranks, prank, plan_run, &pc, err)
                       : sbp_engine_grad_f32(&loss, grads, &m, &b, &eo, lg, err);
        sbp_ledger_charge(lg, SBP_MEM_BATCH, -batch_bytes);
        sbp_obj_end(&ev);
    }
    sbp_ledger_free(lg, adam[1]);
    sbp_ledger_free(lg, adam[0]);
    sbp_ledger_free(lg, grads);
    sbp_ledger_free(lg, a.w);
    sbp_ledger_free(lg, m.w);
    sbp_batch_free(&b);
    sbp_params_free(&a.params);
    sbp_params_free(&m.params);
    return st;
}

sbp_status sbp_plan(sbp_ledger *lg, const sbp_config *cfg, const sbp_plan_opts *o, sbp_err *err) {
    return plan_step(lg, NULL, NULL, NULL, cfg, o, err);
}

sbp_status sbp_plan_seq_traffic(int64_t *bytes, int64_t *messages, const sbp_config *cfg,
                                const sbp_plan_opts *o, sbp_err *err) {
    sbp_ledger lg;
    tally t = {0, 0};
    *bytes = *messages = 0;
    if (o->seq_ranks <= 1)
        return sbp_fail(err, SBP_EUSAGE, "sbp_plan_seq_traffic plans sequence parallel (S > 1)");
    const sbp_status st = plan_step(&lg, &t, NULL, NULL, cfg, o, err);
    if (!st) *bytes = t.bytes, *messages = t.messages;
    return st;
}

sbp_status sbp_plan_seq_net(sbp_net_time *out, const sbp_config *cfg, const sbp_plan_opts *o,
                            const sbp_net *nw, sbp_err *err) {
    sbp_ledger lg;
    tally t = {0, 0};
    memset(out, 0, sizeof *out);
    if (o->seq_ranks <= 1)
        return sbp_fail(err, SBP_EUSAGE, "sbp_plan_seq_net plans sequence parallel (S > 1)");
    if (!(nw->bandwidth > 0) || !(nw->latency >= 0) || !(nw->flops > 0))
        return sbp_fail(err, SBP_EUSAGE,
                        "the network model needs bandwidth > 0, latency >= 0 "
                        "and a FLOP rate > 0");
    return plan_step(&lg, &t, nw, out, cfg, o, err);
}

/* ---------------------------------------------------------------------------------------------
 * The largest T that fits a budget (streambp plan --budget, streambp bench's sweep) */

static sbp_status plan_at(sbp_ledger *lg, const sbp_config *cfg, const sbp_plan_opts *o, int T,
                          sbp_err *err) {
    sbp_plan_opts p = *o;
    p.T = T;
    return sbp_plan(lg, cfg, &p, err);
}

/* Whether the step fits at T; its peak in *peak (INT64_MAX when it cannot be planned). */
static int fits(const sbp_config *cfg, const sbp_plan_opts *o, int T, int64_t budget,
                int64_t *peak) {
    sbp_ledger lg;
    sbp_err err;
    *peak = plan_at(&lg, cfg, o, T, &err) == SBP_OK ? lg.peak_total : INT64_MAX;
    return *peak <= budget;
}

int sbp_plan_min_T(const sbp_plan_opts *o) {
    if (o->seq_ranks > 1) { /* every rank whole blocks: the last rank at least one token */
        const int block = o->grad.block ? o->grad.block : SBP_DEFAULT_BLOCK;
        const int grain =
            sbp_engine_seq_grain_f32(o->grad.numerics == SBP_NUMERICS_PORTABLE, block);
        return (o->seq_ranks - 1) * grain + 1;
    }
    return o->grad.objective.kind == SBP_OBJ_DPO ? 2 : 1;
}

int sbp_plan_max_T(const sbp_plan_opts *o) {
    const int64_t rows = o->grad.objective.kind == SBP_OBJ_DPO ? 2 * (int64_t)o->B : o->B;
    return rows < 1 ? 0 : (int)(SBP_PLAN_MAX_TOKENS / rows);
}

int sbp_plan_largest_T(const sbp_config *cfg, const sbp_plan_opts *o, int64_t budget,
                       sbp_ledger *at) {
    sbp_err err;
    const int shortest = sbp_plan_min_T(o);
    const int T_MAX = sbp_plan_max_T(o);
    int64_t m0, m1;
    int lo = shortest, hi;
    if (!fits(cfg, o, lo, budget, &m0)) {
        memset(at, 0, sizeof *at);
        return 0;
    }
    /* The peak grows about linearly in T (the checkpoints, a T-long working set, the logits):
     * a guess from its slope between two lengths, then a bracket around the guess that widens
     * until it holds the boundary, then a search inside it that keeps "lo fits, hi does not",
     * which alone decides; a plain doubling search from T = 1 plans about twice as often. */
    const int probe = shortest + 1024;
    int64_t m_lo = m0, m_hi = INT64_MAX;
    if (!fits(cfg, o, probe, budget, &m1)) {
        hi = probe, m_hi = m1;
    } else {
        lo = probe, m_lo = m1;
        const double slope = m1 > m0 ? (double)(m1 - m0) / (probe - shortest) : 0;
        double guess = slope > 0 ? probe + (double)(budget - m1) / slope : T_MAX;
        int g = guess < T_MAX ? (int)guess : T_MAX, step = g / 256 > 16 ? g / 256 : 16;
        int64_t m;
        hi = 0;
        if (g <= lo) g = lo + 1;
        if (fits(cfg, o, g, budget, &m)) { /* then look above */
            lo = g, m_lo = m;
            for (int t = g + step; !hi; t = lo + step) {
                if (t > T_MAX) {
                    hi = T_MAX + 1;
                } else if (fits(cfg, o, t, budget, &m)) {
                    lo = t, m_lo = m, step *= 2;
                } else {
                    hi = t, m_hi = m;
                }
            }
        } else { /* below */
            hi = g, m_hi = m;
            for (int t = g - step; t > lo; t = hi - step) {
                if (fits(cfg, o, t, budget, &m)) {
                    lo = t, m_lo = m;
                    break;
                }
                hi = t, m_hi = m, step *= 2;
            }
        }
    }
    /* Inside the bracket, the next length is read off the line through its ends' peaks (the
     * peak being near-linear, it lands within a few tokens of the boundary), kept one token
     * inside either end; a probe that does not halve the bracket is followed by a halving one,
     * so that a peak far from linear costs at most twice the walks of bisection. */
    int halve = 0;
    while (hi - lo > 1) { /* lo fits, hi does not */
        int mid = lo + (hi - lo) / 2;
        if (!halve && m_hi != INT64_MAX && m_hi > m_lo) { /* m_lo <= budget: lo fits */
            const double x = lo + (double)(budget - m_lo) / (double)(m_hi - m_lo) * (hi - lo);
            mid = x < lo + 1 ? lo + 1 : x > hi - 1 ? hi - 1 : (int)x;
        }
        const int width = hi - lo;
        int64_t m;
        if (fits(cfg, o, mid, budget, &m))
            lo = mid, m_lo = m;
        else
            hi = mid, m_hi = m;
        halve = !halve && 2 * (hi - lo) > width;
    }
    plan_at(at, cfg, o, lo, &err);
    return lo;
}
