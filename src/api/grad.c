/* grad.c — sbp_grad: options resolved (resolve.c: defaults, clamping, checks), then the float or
 * double engine run on each micro-batch. */
#include "../engine/entry.h"
#include "resolve.h"
#include "../streambp.h"
#include "../core/err.h"
#include "../dist/dist.h"
#include "seqpar.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

void openblas_set_num_threads(int n); /* from OpenBLAS; not in every cblas.h */

void sbp_set_threads(int n) {
    if (n < 1) n = 1;
    if (n > SBP_MAX_THREADS) n = SBP_MAX_THREADS;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

static sbp_status engine(double *loss, void *grads, const sbp_model *m, const sbp_batch *b,
                         sbp_engine_opts *eo, sbp_device device, sbp_ledger *lg, sbp_err *err) {
    eo->device_ops = device == SBP_DEVICE_CPU ? NULL : sbp_cuda_ops(device, m->prec);
    return m->prec == SBP_FP64 ? sbp_engine_grad_f64(loss, grads, m, b, eo, lg, err)
                               : sbp_engine_grad_f32(loss, grads, m, b, eo, lg, err);
}

/* The whole step's normalisers (ref/SEMANTICS.md, "Gradient accumulation"), unless the caller
 * set them: SFT and GRPO count targets, DPO pairs, GRPO rows. */
static sbp_objective step_objective(const sbp_objective *o, const sbp_batch *batches, int n) {
    sbp_objective s = *o;
    double items = 0;
    int seqs = 0;
    for (int i = 0; i < n; i++) {
        items += (double)batches[i].n_targets;
        seqs += o->kind == SBP_OBJ_DPO ? batches[i].pairs : batches[i].B;
    }
    if (s.num_items == 0 && o->kind != SBP_OBJ_DPO) s.num_items = items;
    if (s.num_sequences == 0 && o->kind != SBP_OBJ_SFT) s.num_sequences = seqs;
    for (int i = 0; i < n && s.kind == SBP_OBJ_GRPO && o->max_completion_length == 0; i++)
        if (batches[i].T > s.max_completion_length) s.max_completion_length = batches[i].T;
    return s;
}

/* 1 when x[0..n) holds no NaN or Inf: the exponent bits all ones, tested on the integer bits (an
 * OR reduction vectorizes and splits across threads without reassociating any float sum); the
 * scan of a whole gradient is a pass over memory, so it runs on every thread. */
static int all_finite(const void *x, int64_t n, sbp_precision prec) {
    int bad = 0;
    if (prec == SBP_FP64) {
        const uint64_t *u = x, e = 0x7ff0000000000000ull;
#pragma omp parallel for reduction(| : bad) schedule(static)
        for (int64_t j = 0; j < n; j++) bad |= (u[j] & e) == e;
    } else {
        const uint32_t *u = x, e = 0x7f800000u;
#pragma omp parallel for reduction(| : bad) schedule(static)
        for (int64_t j = 0; j < n; j++) bad |= (u[j] & e) == e;
    }
    return !bad;
}

/* NaN or Inf in the loss or a gradient, reported with the first parameter where it appears. */
static sbp_status check_finite(double loss, const void *grads, const sbp_params *ps,
                               sbp_precision prec, sbp_err *err) {
    if (!isfinite(loss)) return sbp_fail(err, SBP_ENUMERIC, "the loss is not finite (%g)", loss);
    if (all_finite(grads, ps->total, prec)) return SBP_OK;
    for (int i = 0; i < ps->n; i++) {
        const sbp_param *p = &ps->p[i];
        for (int64_t j = 0; j < p->numel; j++) {
            const double v = prec == SBP_FP64 ? ((const double *)grads)[p->offset + j]
                                              : ((const float *)grads)[p->offset + j];
            if (!isfinite(v))
                return sbp_fail(err, SBP_ENUMERIC,
                                "the gradient of \"%s\" is not finite at element %lld (%g)",
                                p->name, (long long)j, v);
        }
    }
    return SBP_OK;
}

/* The elements of this process's share of a sharded step (sbp_dist_owned). */
static sbp_status share_of(int64_t *numel, sbp_comm *c, const sbp_params *ps, sbp_err *err) {
    sbp_range *r = NULL;
    const int n = sbp_dist_owned(&r, numel, ps, sbp_comm_size(c), sbp_comm_rank(c));
    free(r);
    return n < 0 ? sbp_fail(err, SBP_ENOMEM, "out of memory") : SBP_OK;
}

/* The non-finite element x at slab index j, named by its tensor. */
static sbp_status non_finite_at(const sbp_params *ps, int64_t j, double x, sbp_err *err) {
    for (int i = 0; i < ps->n; i++)
        if (j >= ps->p[i].offset && j < ps->p[i].offset + ps->p[i].numel)
            return sbp_fail(err, SBP_ENUMERIC,
                            "the gradient of \"%s\" is not finite at element %lld (%g)",
                            ps->p[i].name, (long long)(j - ps->p[i].offset), x);
    return sbp_fail(err, SBP_ENUMERIC, "the gradient is not finite at element %lld", (long long)j);
}

/* check_finite over a sharded step: each process scans its share; the first non-finite element
 * of the whole gradient (a MAX over the complements of the slab indices: exact integers) and its
 * value's bits (from its owner) reach every process, which names it as one process would. */
static sbp_status check_finite_shares(double loss, const void *share, sbp_comm *c,
                                      const sbp_params *ps, sbp_precision prec, sbp_err *err) {
    if (!isfinite(loss)) return sbp_fail(err, SBP_ENUMERIC, "the loss is not finite (%g)", loss);
    sbp_range *rg = NULL;
    int64_t owned = 0;
    const int nr = sbp_dist_owned(&rg, &owned, ps, sbp_comm_size(c), sbp_comm_rank(c));
    if (nr < 0) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    uint64_t v[2] = {0, 0}; /* ~(the first bad slab index), its value as a double's bits */
    if (!all_finite(share, owned, prec))
        for (int64_t q = 0, at = 0; q < nr && !v[0]; at += rg[q].end - rg[q].begin, q++)
            for (int64_t j = rg[q].begin; j < rg[q].end && !v[0]; j++) {
                const int64_t i = at + j - rg[q].begin;
                const double x =
                    prec == SBP_FP64 ? ((const double *)share)[i] : ((const float *)share)[i];
                if (!isfinite(x)) v[0] = ~(uint64_t)j, memcpy(&v[1], &x, sizeof x);
            }
    free(rg);
    uint64_t first = v[0], bits;
    sbp_status st = sbp_comm_max_u64(c, &first, 1, "the gradient's finiteness", err);
    if (st || !first) return st;
    bits = first == v[0] ? v[1] : 0; /* the owner's value; the others give 0 */
    if ((st = sbp_comm_max_u64(c, &bits, 1, "the gradient's finiteness", err))) return st;
    const int64_t j = (int64_t)~first;
    double x;
    memcpy(&x, &bits, sizeof x);
    return non_finite_at(ps, j, x, err);
}

/* A sink's step (sbp_grad_opts.grad_sink): each completed piece is checked for NaN and Inf as a
 * held gradient is after the step, then handed on. The smallest slab index of a non-finite
 * element over every piece is kept, so that the step fails naming the tensor and element a held
 * gradient's check names; from the first such piece on nothing more is handed on. */
typedef struct {
    int (*sink)(void *ctx, int64_t off, int64_t n, const void *g);
    void *ctx;
    sbp_precision prec;
    int64_t bad; /* the smallest slab index of a non-finite element, or -1 */
    double bad_value;
} sink_ctx;

static int sink_piece(void *ctx, int64_t off, int64_t n, const void *g) {
    sink_ctx *s = ctx;
    const int finite = all_finite(g, n, s->prec); /* one pass; the element sought only if not */
    for (int64_t j = 0; !finite && j < n; j++) {
        const double v = s->prec == SBP_FP64 ? ((const double *)g)[j] : ((const float *)g)[j];
        if (isfinite(v)) continue;
        if (s->bad < 0 || off + j < s->bad) s->bad = off + j, s->bad_value = v;
        break;
    }
    return s->bad >= 0 || s->sink(s->ctx, off, n, g);
}

/* The step of sbp_grad_batches with a sink: one micro-batch, no slab. */
static sbp_status sink_step(sbp_grad_result *res, const sbp_model *m, const sbp_batch *b,
                            const sbp_grad_opts *opts, const sbp_objective *so,
                            const sbp_params *gps, sbp_ledger *lg, sbp_err *err) {
    sbp_engine_opts eo;
    sbp_obj_eval ev;
    sink_ctx sc = {opts->grad_sink, opts->grad_sink_ctx, m->prec, -1, 0};
    sbp_status st = sbp_engine_resolve(&eo, opts, b->T, err);
    if (!st) st = sbp_obj_begin(&ev, so, b, err);
    if (st) return st;
    eo.ev = &ev;
    eo.fold = 1, eo.bucket_hook = sink_piece, eo.hook_ctx = &sc;
    /* all but the loss before the first piece, and the loss too (the head's, the first piece's
     * step): a sink can write what the result says of the step with its first piece */
    res->n_targets = b->n_targets;
    res->block = eo.block, res->chunk = eo.chunk, res->logit_chunk = eo.logit_chunk;
    st = engine(&res->loss, NULL, m, b, &eo, opts->device, lg, err);
    sbp_obj_end(&ev);
    if (st == SBP_EIO && sc.bad < 0)
        return sbp_fail(err, SBP_EIO, "the gradient's sink refused a piece of it");
    if (st) return st;
    if (!isfinite(res->loss))
        return sbp_fail(err, SBP_ENUMERIC, "the loss is not finite (%g)", res->loss);
    return sc.bad >= 0 ? non_finite_at(gps, sc.bad, sc.bad_value, err) : SBP_OK;
}

/* One micro-batch of a distributed step (src/dist/exchange.c): its gradient goes bucket by bucket
 * to the hook, which sends each piece to its owner. */
typedef struct {
    const sbp_model *m;
    const sbp_batch *batches;
    const sbp_grad_opts *opts;
    const sbp_objective *so; /* the whole step's normalisers */
    sbp_ledger *lg;
} micro_ctx;

static sbp_status run_micro(void *ctx, int k, sbp_bucket_hook hook, void *hook_ctx, double *loss_k,
                            sbp_err *err) {
    micro_ctx *c = ctx;
    sbp_engine_opts eo;
    sbp_obj_eval ev;
    sbp_status st = sbp_engine_resolve(&eo, c->opts, c->batches[k].T, err);
    if (!st) st = sbp_obj_begin(&ev, c->so, &c->batches[k], err);
    if (st) return st;
    eo.ev = &ev;
    eo.fold = 1, eo.bucket_hook = hook, eo.hook_ctx = hook_ctx;
    *loss_k = 0;
    /* no slab: each bucket goes to the hook from the engine's scratch */
    st = engine(loss_k, NULL, c->m, &c->batches[k], &eo, c->opts->device, c->lg, err);
    sbp_obj_end(&ev);
    return st ? sbp_fail_prefix(err, "micro-batch %d: ", k) : SBP_OK;
}

sbp_status sbp_grad_batches(sbp_grad_result *res, const sbp_model *m, const sbp_batch *batches,
                            int n, const sbp_grad_opts *opts, sbp_ledger *lg, sbp_err *err) {
    memset(res, 0, sizeof *res);
    res->device = opts->device;
    if (n < 1) return sbp_fail(err, SBP_EUSAGE, "no batch given");
    if (lg && lg->plan) /* its buffers are reserved address space: the first store would fault */
        return sbp_fail(err, SBP_EUSAGE,
                        "a planning ledger (sbp_ledger.plan set) cannot run a step; plan with "
                        "sbp_plan");
    if (opts->emulate_bf16 && m->prec != SBP_FP32)
        return sbp_fail(err, SBP_EUSAGE, "bf16 emulation runs on the float32 engine");
    if (opts->lora && opts->lora->prec != m->prec)
        return sbp_fail(err, SBP_EUSAGE, "the adapter and the model must have the same precision");
    /* with an adapter, the gradient is the adapter's */
    const sbp_params *gps = opts->lora ? &opts->lora->params : &m->params;
    for (int i = 1; i < n; i++)
        if (batches[i].kind != batches[0].kind)
            return sbp_fail(err, SBP_EUSAGE, "micro-batch %d holds another objective's data", i);
    sbp_objective so = step_objective(&opts->objective, batches, n);
    sbp_engine_opts eo;
    sbp_status st = SBP_OK;
    for (int i = 0; i < n && !st; i++) { /* everything is checked before anything runs */
        sbp_obj_eval ev;
        if ((st = sbp_engine_resolve(&eo, opts, batches[i].T, err)) ||
            (st = sbp_obj_begin(&ev, &so, &batches[i], err)))
            return n > 1 ? sbp_fail_prefix(err, "micro-batch %d: ", i) : st;
        sbp_obj_end(&ev);
    }
    size_t esz = m->prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    /* on a device the ledger records the device's memory; the host's copy of the result is not
     * charged there */
    sbp_ledger *host_lg = opts->device == SBP_DEVICE_CPU ? lg : NULL;
    const int dist = opts->comm && sbp_comm_size(opts->comm) > 1;
    const int seq = dist && opts->seq_ranks > 1;
    /* the settings (T = 0: no length checked), then every micro-batch, before anything runs */
    st = sbp_seq_check(0, opts, err);
    for (int i = 0; i < n && !st; i++)
        if ((st = sbp_seq_check(batches[i].T, opts, err)) && n > 1)
            sbp_fail_prefix(err, "micro-batch %d: ", i);
    if (st) return st;
    res->numel = gps->total;
    if (opts->grad_sink) { /* the gradient leaves piece by piece: nothing to accumulate in */
        if (n != 1 || dist || opts->device != SBP_DEVICE_CPU)
            return sbp_fail(err, SBP_EUSAGE,
                            "a gradient sink takes a step of one micro-batch in one process on "
                            "the CPU (got %d micro-batches, %d processes, %s)",
                            n, dist ? sbp_comm_size(opts->comm) : 1, sbp_device_name(opts->device));
        const int64_t batch_bytes = sbp_batch_bytes(&batches[0]);
        sbp_ledger_charge(host_lg, SBP_MEM_BATCH, batch_bytes);
        st = sink_step(res, m, &batches[0], opts, &so, gps, lg, err);
        sbp_ledger_charge(host_lg, SBP_MEM_BATCH, -batch_bytes);
        return st;
    }
    if (dist && opts->sharded && (st = share_of(&res->numel, opts->comm, gps, err))) return st;
    /* sequence parallel allocates the result after the step, beside the last rank's whole
     * gradient only then (seqpar.c) */
    if (!seq) res->grads = sbp_ledger_alloc(host_lg, SBP_MEM_GRADS, esz * (size_t)res->numel);
    if (!seq && !res->grads)
        return sbp_fail(err, SBP_ENOMEM, "out of memory for the gradients (%lld parameters)",
                        (long long)res->numel);
    /* the micro-batches are the step's memory too: charged while it runs (the planner charges
     * its batch of the same shape) */
    int64_t batch_bytes = 0;
    for (int i = 0; i < n; i++) batch_bytes += sbp_batch_bytes(&batches[i]);
    sbp_ledger_charge(host_lg, SBP_MEM_BATCH, batch_bytes);
    if (dist) {
        micro_ctx mc = {m, batches, opts, &so, lg};
        st = opts->device != SBP_DEVICE_CPU
                 ? sbp_fail(err, SBP_EUSAGE, "a distributed step runs on the CPU only")
             : seq ? sbp_seq_grad(&res->grads, res->numel, &res->loss, m, batches, n, opts, &so, lg,
                                  err)
                   : sbp_dist_grad(res->grads, opts->sharded, &res->loss, opts->comm, gps, (int)esz,
                                   opts->emulate_bf16, n, run_micro, &mc, lg, err);
        for (int i = 0; i < n; i++) res->n_targets += batches[i].n_targets;
        sbp_engine_resolve(&eo, opts, batches[n - 1].T, err);
    }
    /* The fold (docs/distributed.md): micro-batch 0 forms S in place; each later one forms its
     * gradient g_k and loss l_k from zero and adds them, S ← S + g_k, L ← L + l_k, one IEEE add
     * per element in ascending k. A step's bits are then a function of the micro-batch sequence
     * alone, however the micro-batches are spread over processes. */
    for (int i = 0; i < n && !st && !dist; i++) {
        sbp_obj_eval ev;
        sbp_engine_resolve(&eo, opts, batches[i].T, err);
        if ((st = sbp_obj_begin(&ev, &so, &batches[i], err))) break;
        eo.ev = &ev;
        eo.fold = i > 0;
        double loss_k = 0;
        st = engine(&loss_k, res->grads, m, &batches[i], &eo, opts->device, lg, err);
        res->loss = i > 0 ? res->loss + loss_k : loss_k;
        sbp_obj_end(&ev);
        res->n_targets += batches[i].n_targets;
    }
    sbp_ledger_charge(host_lg, SBP_MEM_BATCH, -batch_bytes);
    if (!st && dist && opts->sharded)
        st = check_finite_shares(res->loss, res->grads, opts->comm, gps, m->prec, err);
    else if (!st)
        st = check_finite(res->loss, res->grads, gps, m->prec, err);
    if (st) {
        sbp_grad_result_free(res, lg);
        return st;
    }
    res->block = eo.block, res->chunk = eo.chunk, res->logit_chunk = eo.logit_chunk;
    return SBP_OK;
}

sbp_status sbp_grad(sbp_grad_result *res, const sbp_model *m, const sbp_batch *b,
                    const sbp_grad_opts *opts, sbp_ledger *lg, sbp_err *err) {
    return sbp_grad_batches(res, m, b, 1, opts, lg, err);
}

void sbp_grad_result_free(sbp_grad_result *res, sbp_ledger *lg) {
    sbp_ledger_free(res->device == SBP_DEVICE_CPU ? lg : NULL, res->grads);
    memset(res, 0, sizeof *res);
}

sbp_status sbp_logprobs(double *logp, const sbp_model *m, const sbp_batch *b,
                        const sbp_grad_opts *opts, double temperature, sbp_ledger *lg,
                        sbp_err *err) {
    if (lg && lg->plan)
        return sbp_fail(err, SBP_EUSAGE,
                        "a planning ledger (sbp_ledger.plan set) cannot run a forward pass");
    double tau = temperature ? temperature : 1;
    if (!(tau > 0) || !isfinite(tau))
        return sbp_fail(err, SBP_EUSAGE, "the temperature must be > 0 and finite (got %g)", tau);
    sbp_grad_opts g = *opts;
    g.schedule = SBP_STREAM;
    sbp_engine_opts eo;
    sbp_status st = sbp_engine_resolve(&eo, &g, b->T, err);
    if (st) return st;
    eo.logp_out = logp;
    eo.inv_tau = 1 / tau;
    memset(logp, 0, sizeof(double) * (size_t)b->B * b->T);
    double unused = 0;
    return engine(&unused, NULL, m, b, &eo, opts->device, lg, err);
}
