/* matrix.c — the verifier's matrix of runs and its comparison groups (see matrix.h). */
#include "matrix.h"
#include "../ref/ref.h"
#include "../src/core/err.h"
#include "load.h"
#include "metrics.h"
#include "micro.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SBP_PLANT_LOOSE_FP64_BUDGET /* planted (tests/test_selftest.c): float32-level fp64 budget   \
                                    */
#define TRUTH64_TOL 1e-6
#else
#define TRUTH64_TOL 1e-10
#endif
#define FP32_FULL_TOL   1e-4
#define RAGGED_TOL_FP32 1e-5
#define RAGGED_TOL_FP64 2e-14
#define BUDGET_FLOOR    1e-7

/* One configuration of the matrix. */
typedef struct {
    sbp_schedule schedule;
    int chunk, logit_chunk, chunked_logits;
    int aligned;  /* chunk and logit chunk are multiples of the block */
    int profiled; /* through the timing table (bench --profile): the same bits as without */
} run_cfg;

typedef struct {
    const sbp_verify_opts *o;
    sbp_numerics numerics; /* of the runs being made */
    sbp_device device;     /* where they run */
    sbp_verify_report *rep;
    const sbp_model *m32, *m64;
    const sbp_lora *l32, *l64; /* --lora: the adapter (the base frozen), or NULL */
    const sbp_params *ps;      /* the gradient's table: the model's, or the adapter's */
    const sbp_batch *b;
    const ref_model *rm;   /* the oracle's reading of the model and batch; NULL with --no-ref */
    const ref_lora *rlora; /* and of the adapter, with --lora */
    const sbp_batch *rb;
    double *truth;     /* (params.total) */
    double *budget32;  /* (params.n) relative-L2 budget per tensor */
    int have_budget32; /* --no-ref: set by the first float32 full BP */
    double *ta, *tb;   /* scratch: one tensor as doubles */
} ctx;

static void label(char *buf, size_t n, sbp_device dev, sbp_numerics num, sbp_precision p,
                  const run_cfg *c, int threads) {
    int len = snprintf(buf, n, "%s%s%s%s %s", dev ? sbp_device_name(dev) : "", dev ? " " : "",
                       num == SBP_NUMERICS_PORTABLE && !dev ? "portable " : "",
                       p == SBP_FP64 ? "fp64" : "fp32", sbp_schedule_name(c->schedule));
    if (c->schedule == SBP_STREAM) len += snprintf(buf + len, n - len, " chunk %d", c->chunk);
    if (c->chunked_logits) len += snprintf(buf + len, n - len, " logit chunk %d", c->logit_chunk);
    if (c->profiled) len += snprintf(buf + len, n - len, " (profiled)");
    snprintf(buf + len, n - len, ", %d thread%s", threads, threads > 1 ? "s" : "");
}

static sbp_status run(sbp_grad_result *r, ctx *x, sbp_precision p, const run_cfg *c, sbp_err *err) {
    sbp_profile prof = {0};
    sbp_grad_opts g = {.profile = c->profiled ? &prof : NULL,
                       .schedule = c->schedule,
                       .block = x->rep->block,
                       .chunk = c->chunk,
                       .logit_chunk = c->logit_chunk,
                       .chunked_logits = c->chunked_logits,
                       .objective = x->o->objective,
                       .numerics = x->numerics,
                       .device = x->device,
                       .unattended = x->o->unattended,
                       .lora = p == SBP_FP64 ? x->l64 : x->l32};
    x->rep->n_runs++;
    return sbp_grad(r, p == SBP_FP64 ? x->m64 : x->m32, x->b, &g, NULL, err);
}

/* The self-test's planted fault, if any (matrix.h), on a run's gradient. */
static void plant(const ctx *x, void *grads, sbp_precision p, int role) {
    const sbp_verify_fault *f = x->o->fault;
    const int portable = !(role & SBP_RUN_MICRO) && x->numerics == SBP_NUMERICS_PORTABLE;
    if (f) f->fn(f->ctx, grads, p, role | (portable ? SBP_RUN_PORTABLE : 0));
}

static void to_double(double *out, const void *g, sbp_precision p, int64_t off, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = p == SBP_FP64 ? ((const double *)g)[off + i] : ((const float *)g)[off + i];
}

/* Adds one comparison (the run a against b, or against the truth when b is NULL) to group gi:
 * `budget` > 0 promises relative L2 <= budget per tensor (budgets[i] when given), 0 promises
 * bitwise equality. */
static void compare(ctx *x, int gi, const char *what, const void *a, const void *b, sbp_precision p,
                    double budget, const double *budgets) {
    sbp_verify_group *g = &x->rep->g[gi];
    const sbp_params *ps = x->ps;
    size_t esz = p == SBP_FP64 ? sizeof(double) : sizeof(float);
    g->runs++;
    for (int i = 0; i < ps->n; i++) {
        const sbp_param *pa = &ps->p[i];
        sbp_verify_row *row = &g->rows[i];
        to_double(x->ta, a, p, pa->offset, pa->numel);
        const double *ref = x->truth + pa->offset;
        if (b) {
            to_double(x->tb, b, p, pa->offset, pa->numel);
            ref = x->tb;
        }
        sbp_tensor_cmp c;
        sbp_compare(&c, x->ta, ref, pa->numel,
                    b ? (p == SBP_FP64 ? SBP_DT_F64 : SBP_DT_F32)
                      : (p == SBP_FP64 ? SBP_DT_F64 : SBP_DT_F32),
                    0, 0);
        int bitwise = b && memcmp((const char *)a + esz * pa->offset,
                                  (const char *)b + esz * pa->offset, esz * (size_t)pa->numel) == 0;
        double tol = budgets ? budgets[i] : budget;
#ifdef SBP_PLANT_BITWISE_AS_CLOSE /* planted (tests/test_selftest.c): "bitwise" as rel L2 <= 1e-15 \
                                   */
        if (tol == 0) tol = 1e-15;
#endif
        int ok = c.nonfinite_a == 0 && (tol > 0 ? c.rel_l2 <= tol : bitwise);
        row->runs++;
        row->bitwise_runs += bitwise;
        row->max_ulp = fmax(row->max_ulp, c.max_ulp);
        row->max_abs = fmax(row->max_abs, c.max_abs);
        row->rel_l2 = fmax(row->rel_l2, c.rel_l2);
        row->min_cosine = row->runs == 1 ? c.cosine : fmin(row->min_cosine, c.cosine);
        if (row->runs == 1 || fabs(c.norm_ratio - 1) > fabs(row->norm_ratio - 1))
            row->norm_ratio = c.norm_ratio;
        row->budget = fmax(row->budget, tol);
        row->nonfinite += c.nonfinite_a;
        if (!ok && row->failed++ == 0)
            snprintf(row->first_failure, sizeof row->first_failure, "%s", what);
    }
}

static void loss_dev(ctx *x, sbp_precision p, double loss) {
    double d = fabs(loss - x->rep->truth_loss) / fabs(x->rep->truth_loss);
    double *m = p == SBP_FP64 ? &x->rep->max_loss_dev64 : &x->rep->max_loss_dev32;
    *m = fmax(*m, d);
}

/* Every configuration of one precision in the current numerics: against the truth, against
 * full BP, and across thread counts. base is full BP at the first thread count. In portable
 * numerics every run is compared bitwise with base (group "portable"). */
static sbp_status run_precision(ctx *x, sbp_precision p, const run_cfg *cfgs, int n, sbp_err *err) {
    const sbp_verify_opts *o = x->o;
    const sbp_params *ps = x->ps;
    const int portable = x->numerics == SBP_NUMERICS_PORTABLE;
    int gtruth = p == SBP_FP64 ? SBP_VG_TRUTH64 : SBP_VG_TRUTH32;
    sbp_grad_result base, r0, rt;
    char what[128];
    sbp_set_threads(o->threads[0]);
    run_cfg full = {.schedule = SBP_FULL, .aligned = 1};
    sbp_status st = run(&base, x, p, &full, err);
    if (st) return st;
    plant(x, base.grads, p, SBP_RUN_BASE);
    loss_dev(x, p, base.loss);
    if (p == SBP_FP32 && !x->rm && !x->have_budget32) {
        /* --no-ref: what float32 full BP achieves, with slack */
        x->have_budget32 = 1;
        for (int i = 0; i < ps->n; i++) {
            const sbp_param *pa = &ps->p[i];
            to_double(x->ta, base.grads, p, pa->offset, pa->numel);
            sbp_tensor_cmp c;
            sbp_compare(&c, x->ta, x->truth + pa->offset, pa->numel, SBP_DT_F32, 0, 0);
            x->budget32[i] = o->slack * fmax(c.rel_l2, BUDGET_FLOOR);
            if (x->budget32[i] > FP32_FULL_TOL) x->budget32[i] = FP32_FULL_TOL;
        }
    }
    for (int k = -1; k < n && !st; k++) {
        const run_cfg *c = k < 0 ? &full : &cfgs[k];
        sbp_set_threads(o->threads[0]);
        if (k >= 0 && (st = run(&r0, x, p, c, err))) break;
        const int role = k < 0 ? SBP_RUN_BASE : c->aligned ? SBP_RUN_ALIGNED : SBP_RUN_RAGGED;
        if (k >= 0) plant(x, r0.grads, p, role);
        const sbp_grad_result *a = k < 0 ? &base : &r0;
        label(what, sizeof what, SBP_DEVICE_CPU, x->numerics, p, c, o->threads[0]);
        if (k >= 0) loss_dev(x, p, a->loss);
        compare(x, gtruth, what, a->grads, NULL, p, TRUTH64_TOL,
                p == SBP_FP32 ? x->budget32 : NULL);
        if (k >= 0 && portable)
            compare(x, SBP_VG_PORTABLE, what, a->grads, base.grads, p, 0, NULL);
        else if (k >= 0 && c->aligned)
            compare(x, SBP_VG_SCHEDULES, what, a->grads, base.grads, p, 0, NULL);
        else if (k >= 0)
            compare(x, SBP_VG_RAGGED, what, a->grads, base.grads, p,
                    p == SBP_FP64 ? RAGGED_TOL_FP64 : RAGGED_TOL_FP32, NULL);
        for (int t = 1; t < o->n_threads && !st && !c->profiled; t++) {
            sbp_set_threads(o->threads[t]);
            if ((st = run(&rt, x, p, c, err))) break;
            plant(x, rt.grads, p, role | SBP_RUN_THREADS);
            label(what, sizeof what, SBP_DEVICE_CPU, x->numerics, p, c, o->threads[t]);
            compare(x, portable ? SBP_VG_PORTABLE : SBP_VG_THREADS, what, rt.grads, a->grads, p, 0,
                    NULL);
            sbp_grad_result_free(&rt, NULL);
        }
        if (k >= 0) sbp_grad_result_free(&r0, NULL);
    }
    sbp_grad_result_free(&base, NULL);
    sbp_set_threads(o->threads[0]);
    return st;
}

/* Every configuration of one precision on device x->device (portable numerics), against portable
 * full BP on the CPU: bitwise (group "devices"). */
static sbp_status run_device(ctx *x, sbp_precision p, const run_cfg *cfgs, int n, sbp_err *err) {
    const sbp_device dev = x->device;
    sbp_grad_result base, r;
    char what[128];
    run_cfg full = {.schedule = SBP_FULL, .aligned = 1};
    x->numerics = SBP_NUMERICS_PORTABLE;
    x->device = SBP_DEVICE_CPU;
    sbp_set_threads(x->o->threads[0]);
    sbp_status st = run(&base, x, p, &full, err);
    x->device = dev;
    for (int k = -1; k < n && !st; k++) {
        const run_cfg *c = k < 0 ? &full : &cfgs[k];
        if (c->profiled) continue; /* the timing table is the CPU's */
        if ((st = run(&r, x, p, c, err))) break;
        plant(x, r.grads, p, SBP_RUN_DEVICE);
        label(what, sizeof what, dev, SBP_NUMERICS_PORTABLE, p, c, x->o->threads[0]);
        compare(x, SBP_VG_DEVICES, what, r.grads, base.grads, p, 0, NULL);
        sbp_grad_result_free(&r, NULL);
    }
    sbp_grad_result_free(&base, NULL);
    return st;
}

/* The oracle's gradient (its table `theirs`) into the library's layout, by tensor name. */
static void to_library_layout(double *out, const double *g, const sbp_params *theirs,
                              const sbp_params *ps) {
    for (int i = 0; i < ps->n; i++) {
        int j = sbp_params_find(theirs, ps->p[i].name); /* same names: checked by loading */
        if (j >= 0 && theirs->p[j].numel == ps->p[i].numel)
            memcpy(out + ps->p[i].offset, g + theirs->p[j].offset,
                   sizeof(double) * (size_t)ps->p[i].numel);
        else
            memset(out + ps->p[i].offset, 0, sizeof(double) * (size_t)ps->p[i].numel);
    }
}

/* The truth (and, from the oracle, the float32 budget: slack × the error of its float32 loops
 * against its float64 ones, per tensor). */
static sbp_status truth_of(ctx *x, sbp_err *err) {
    const sbp_params *ps = x->ps;
    if (x->rm) {
        const sbp_objective *o = &x->o->objective;
        x->rep->truth = "ref/ float64 oracle";
        x->rep->budget32 = "the oracle's own loops in float32";
        const ref_net net = {.cfg = &x->rm->cfg,
                             .ps = &x->rm->ps,
                             .w = x->rm->w,
                             .unattended = x->o->unattended,
                             .lora = x->rlora};
        const sbp_params *theirs = x->rlora ? &x->rlora->ps : &x->rm->ps;
        double *g = malloc(sizeof(double) * (size_t)ref_grad_total(&net)), loss32;
        double *g32 = malloc(sizeof(double) * (size_t)ref_grad_total(&net));
        double *t32 = malloc(sizeof(double) * (size_t)ps->total);
        sbp_status st = !g || !g32 || !t32 ? sbp_fail(err, SBP_ENOMEM, "out of memory") : SBP_OK;
        if (!st) st = ref_truth(&x->rep->truth_loss, g, &net, x->rb, o, 0, err);
        if (!st) st = ref_truth(&loss32, g32, &net, x->rb, o, 1, err);
        if (!st) {
            to_library_layout(x->truth, g, theirs, ps);
            to_library_layout(t32, g32, theirs, ps);
            for (int i = 0; i < ps->n; i++) {
                const sbp_param *pa = &ps->p[i];
                sbp_tensor_cmp c;
                sbp_compare(&c, t32 + pa->offset, x->truth + pa->offset, pa->numel, SBP_DT_F32, 0,
                            0);
                x->budget32[i] = x->o->slack * fmax(c.rel_l2, BUDGET_FLOOR);
            }
        }
        free(g), free(g32), free(t32);
        return st;
    }
    x->rep->truth = "float64 full BP";
    x->rep->budget32 = "float32 full BP (--no-ref)";
    sbp_grad_result r;
    run_cfg full = {.schedule = SBP_FULL};
    x->numerics = SBP_NUMERICS_FAST;
    x->device = SBP_DEVICE_CPU;
    sbp_status st = run(&r, x, SBP_FP64, &full, err);
    if (st) return st;
    memcpy(x->truth, r.grads, sizeof(double) * (size_t)ps->total);
    x->rep->truth_loss = r.loss;
    sbp_grad_result_free(&r, NULL);
    return SBP_OK;
}

/* The batch split into micro-batches of different T and run as one step (stream, chunk = one
 * block, unless the schedules asked for leave it out), against the truth of the whole batch. */
static sbp_status run_micro(ctx *x, int precs, sbp_err *err) {
    sbp_batch mb[SBP_VERIFY_MAX_MICRO];
    int n;
    sbp_status st = sbp_verify_split(mb, &n, x->b, err);
    if (st || n == 0) return st;
    x->rep->n_micro = n;
    for (int k = 0; k < n; k++) x->rep->micro_T[k] = mb[k].T;
    const int sched = x->o->schedules ? x->o->schedules : 7; /* stream, unless not asked for */
    sbp_grad_opts g = {.schedule = sched & (1 << SBP_STREAM) ? SBP_STREAM
                                   : sched & (1 << SBP_CKPT) ? SBP_CKPT
                                                             : SBP_FULL,
                       .block = x->rep->block,
                       .chunk = x->rep->block,
                       .logit_chunk = x->rep->block,
                       .objective = x->o->objective,
                       .unattended = x->o->unattended};
    char what[96];
    int len = snprintf(what, sizeof what, "%d micro-batches, T", n);
    for (int k = 0; k < n; k++)
        len += snprintf(what + len, sizeof what - len, "%s%d", k ? "/" : " ", mb[k].T);
    for (int pi = 0; pi < 2 && !st; pi++) {
        sbp_precision p = pi ? SBP_FP32 : SBP_FP64;
        if (!(precs & (1 << p))) continue;
        sbp_grad_result r;
        sbp_set_threads(x->o->threads[0]);
        x->rep->n_runs++;
        g.lora = p == SBP_FP64 ? x->l64 : x->l32;
        if ((st = sbp_grad_batches(&r, p == SBP_FP64 ? x->m64 : x->m32, mb, n, &g, NULL, err)))
            break;
        plant(x, r.grads, p, SBP_RUN_MICRO);
        char lbl[128];
        snprintf(lbl, sizeof lbl, "%s %s, %s", p == SBP_FP64 ? "fp64" : "fp32",
                 sbp_schedule_name(g.schedule), what);
        loss_dev(x, p, r.loss);
        compare(x, SBP_VG_MICRO, lbl, r.grads, NULL, p, TRUTH64_TOL,
                p == SBP_FP32 ? x->budget32 : NULL);
        sbp_grad_result_free(&r, NULL);
    }
    for (int k = 0; k < n; k++) sbp_batch_free(&mb[k]);
    return st;
}

/* The configurations: ckpt (materialised and chunked logits), stream at each chunk. */
static int configs(run_cfg *cfgs, const sbp_verify_opts *o, const sbp_verify_report *rep) {
    int n = 0, sched = o->schedules ? o->schedules : 7;
    for (int i = 0; i < rep->n_chunks; i++) {
        int c = rep->chunks[i], T = rep->T, cc = c < T ? c : T;
        int aligned = cc % rep->block == 0 || cc == T;
        if (sched & (1 << SBP_CKPT))
            cfgs[n++] = (run_cfg){
                .schedule = SBP_CKPT, .logit_chunk = c, .chunked_logits = 1, .aligned = aligned};
        if (sched & (1 << SBP_STREAM))
            cfgs[n++] =
                (run_cfg){.schedule = SBP_STREAM, .chunk = c, .logit_chunk = c, .aligned = aligned};
    }
    if (sched & (1 << SBP_CKPT)) cfgs[n++] = (run_cfg){.schedule = SBP_CKPT, .aligned = 1};
    /* full BP through the timing table of `bench --profile` (src/engine/ops/profile.c): it only
     * times the operations it passes on, so the bits are full BP's */
    if (sched & (1 << SBP_FULL))
        cfgs[n++] = (run_cfg){.schedule = SBP_FULL, .aligned = 1, .profiled = 1};
    return n;
}

static void default_chunks(sbp_verify_report *rep) {
    const int B = rep->block, T = rep->T;
    int cand[] = {B, 2 * B, 4 * B, T, 1, 7, T - 1, T + 5};
    rep->n_chunks = 0;
    for (int i = 0; i < 8; i++) {
        int dup = cand[i] < 1;
        for (int j = 0; j < rep->n_chunks; j++) dup |= rep->chunks[j] == cand[i];
        if (!dup && (i >= 4 || cand[i] <= T)) rep->chunks[rep->n_chunks++] = cand[i];
    }
}

static const char *group_titles[SBP_VG_N] = {"loading",   "fp64 vs truth", "fp32 vs truth",
                                             "schedules", "threads",       "ragged chunks",
                                             "portable",  "devices",       "micro-batches"};

/* The loading group with an adapter: each of the library's adapter tensors (float64) against the
 * oracle's reading of the same file, bit for bit; returns the tensors that differ. */
static int compare_adapter(sbp_verify_group *g, const sbp_lora *l, const ref_lora *rl) {
    int bad = 0;
    g->runs = 1;
    for (int i = 0; i < l->params.n; i++) {
        const sbp_param *p = &l->params.p[i];
        const int j = sbp_params_find(&rl->ps, p->name);
        const int same = j >= 0 && rl->ps.p[j].numel == p->numel &&
                         memcmp((const double *)l->w + p->offset, rl->w + rl->ps.p[j].offset,
                                sizeof(double) * (size_t)p->numel) == 0;
        g->rows[i].runs = 1;
        g->rows[i].bitwise_runs = same;
        g->rows[i].failed = !same;
        if (!same)
            snprintf(g->rows[i].first_failure, sizeof g->rows[i].first_failure, "%s",
                     j < 0 ? "the oracle's reader has no such tensor" : "the two readings differ");
        bad += !same;
    }
    return bad;
}

/* One row per tensor of table ps in every group. */
static sbp_status make_groups(sbp_verify_report *rep, const sbp_params *ps, sbp_err *err) {
    for (int gi = 0; gi < SBP_VG_N; gi++) {
        snprintf(rep->g[gi].title, sizeof rep->g[gi].title, "%s", group_titles[gi]);
        rep->g[gi].rows = calloc((size_t)ps->n + 1, sizeof *rep->g[gi].rows);
        if (!rep->g[gi].rows) return sbp_fail(err, SBP_ENOMEM, "out of memory");
        for (int i = 0; i < ps->n; i++)
            snprintf(rep->g[gi].rows[i].name, sizeof rep->g[gi].rows[i].name, "%s", ps->p[i].name);
        rep->g[gi].n_rows = ps->n;
    }
    return SBP_OK;
}

/* The loading group when one reader refused what the other read: the rows of the tensors the
 * refusal names (all of them when it names none) fail, and the message becomes the note. */
static void refused(sbp_verify_report *rep, const sbp_params *ps, const char *who, const char *msg,
                    const char *names) {
    sbp_verify_group *g = &rep->g[SBP_VG_LOAD];
    snprintf(rep->load_notes, sizeof rep->load_notes, "%s: %s", who, msg);
    g->runs = 1;
    int named = 0;
    for (int i = 0; i < ps->n; i++) {
        char q[96];
        snprintf(q, sizeof q, "%s [", ps->p[i].name); /* in a mismatch list */
        int hit = strstr(names, q) != NULL;
        snprintf(q, sizeof q, "\"%s\"", ps->p[i].name); /* in a library message */
        hit |= strstr(names, q) != NULL;
        snprintf(q, sizeof q, "%s missing", ps->p[i].name);
        hit |= strstr(names, q) != NULL;
        g->rows[i].runs = 1;
        g->rows[i].failed = hit;
        named += hit;
        if (hit) snprintf(g->rows[i].first_failure, sizeof g->rows[i].first_failure, "%s", who);
    }
    for (int i = 0; i < ps->n && !named; i++) g->rows[i].failed = 1;
    g->failed = named ? named : ps->n;
    rep->failed = 1;
}

/* What each group of the report promises, in the words the report prints. */
static void write_promises(sbp_verify_report *rep, const sbp_verify_opts *o, int have_ref) {
    snprintf(rep->g[SBP_VG_LOAD].promise, sizeof rep->g[0].promise, "%s",
             have_ref ? "the library's reading of config, weights and batch against the "
                        "oracle's: the same tensors, shapes and bits, the same targets and "
                        "derived values"
                      : "not checked (--no-ref)");
    snprintf(rep->g[SBP_VG_TRUTH64].promise, sizeof rep->g[0].promise,
             "every fp64 run against the %s: relative L2 <= %g per tensor", rep->truth,
             TRUTH64_TOL);
    if (have_ref)
        snprintf(rep->g[SBP_VG_TRUTH32].promise, sizeof rep->g[0].promise,
                 "every fp32 run against the %s: relative L2 <= %g x (the oracle's float32 "
                 "loops' own error, floor %g)",
                 rep->truth, o->slack, BUDGET_FLOOR);
    else
        snprintf(rep->g[SBP_VG_TRUTH32].promise, sizeof rep->g[0].promise,
                 "every fp32 run against the %s: relative L2 <= %g x (fp32 full BP's own error, "
                 "floor %g), at most %g",
                 rep->truth, o->slack, BUDGET_FLOOR, FP32_FULL_TOL);
    snprintf(rep->g[SBP_VG_SCHEDULES].promise, sizeof rep->g[0].promise,
             "ckpt and stream at block-multiple chunks, and full BP through the profiling table, "
             "against full BP: bitwise");
    snprintf(rep->g[SBP_VG_THREADS].promise, sizeof rep->g[0].promise,
             "each run at other thread counts against the same run at %d: bitwise", o->threads[0]);
    snprintf(rep->g[SBP_VG_RAGGED].promise, sizeof rep->g[0].promise,
             "chunks that are not block multiples against full BP: relative L2 <= %g (fp32), "
             "%g (fp64)",
             RAGGED_TOL_FP32, RAGGED_TOL_FP64);
    snprintf(rep->g[SBP_VG_PORTABLE].promise, sizeof rep->g[0].promise,
             "portable numerics: every run (every schedule and chunk, ragged ones included, every "
             "thread count) against portable full BP: bitwise");
    snprintf(rep->g[SBP_VG_DEVICES].promise, sizeof rep->g[0].promise,
             "every schedule and chunk on each device (portable numerics) against portable full "
             "BP on the CPU: bitwise");
}

sbp_status sbp_verify_run(sbp_verify_report *rep, const sbp_verify_opts *o_in, sbp_err *err) {
    memset(rep, 0, sizeof *rep);
    sbp_verify_opts o = *o_in;
    if (!o.slack) o.slack = 4;
#ifdef SBP_PLANT_LOOSE_FP32_BUDGET /* planted (tests/test_selftest.c): ten times the fp32 slack */
    o.slack *= 10;
#endif
    if (!o.n_threads) o.threads[0] = 1, o.threads[1] = 2, o.n_threads = 2;
    int precs = o.precisions ? o.precisions : 3;
    sbp_model m32 = {0}, m64 = {0};
    sbp_lora l32 = {0}, l64 = {0};
    sbp_batch b = {0}, rb = {0};
    ref_model rm = {0};
    ref_lora rl = {0};
    sbp_status st = sbp_model_load(&m64, o.model, SBP_FP64, NULL, err);
    if (!st && (precs & (1 << SBP_FP32))) st = sbp_model_load(&m32, o.model, SBP_FP32, NULL, err);
    if (!st && o.lora) st = sbp_lora_load(&l64, o.lora, &m64.cfg, SBP_FP64, NULL, err);
    if (!st && o.lora && (precs & (1 << SBP_FP32)))
        st = sbp_lora_load(&l32, o.lora, &m64.cfg, SBP_FP32, NULL, err);
    /* the gradient's table: with an adapter its tensors (peft's names), the base frozen */
    const sbp_params *ps = o.lora ? &l64.params : &m64.params;
    if (!st) st = sbp_batch_load_as(&b, o.batch, &m64.cfg, o.objective.kind, o.scale_rewards, err);
    if (!st && o.ref_model) { /* the reference statistic, in float64 */
        sbp_model ref;
        sbp_grad_opts g = {.block = o.block};
        if (!(st = sbp_model_load(&ref, o.ref_model, SBP_FP64, NULL, err))) {
            st = sbp_batch_set_reference(&b, &ref, &o.objective, &g, NULL, err);
            sbp_model_free(&ref, NULL);
        }
    }
    /* The oracle reads the same files with its own code. Input the library refuses is an input
     * error (its message names the problem); input the library read and the oracle refuses
     * means the two disagree about what the files say: a failure of the check. */
    if (st) goto out;
    char mismatch[2048] = "";
    sbp_err rerr = {0};
    int rst = SBP_OK;
    if (!o.no_ref) {
        rst = ref_model_read(&rm, o.model, mismatch, sizeof mismatch, &rerr);
        if (!rst && o.lora) rst = ref_lora_read(&rl, o.lora, &rm.cfg, &rerr);
        if (!rst)
            rst = ref_batch_read(&rb, o.batch, &rm.cfg, o.objective.kind, o.scale_rewards, &rerr);
        if (!rst && o.ref_model) {
            ref_model rr;
            if (!(rst = ref_model_read(&rr, o.ref_model, NULL, 0, &rerr))) {
                rst = ref_set_reference(&rb, &rr, &o.objective, o.unattended, &rerr);
                ref_model_free(&rr);
            }
        }
    }
    if (rst) {
        if ((st = make_groups(rep, ps, err))) goto out;
        snprintf(rep->model_type, sizeof rep->model_type, "%s", m64.cfg.model_type);
        refused(rep, ps, "the oracle's reader refuses what the library read", rerr.msg,
                mismatch[0] ? mismatch : rerr.msg);
        rep->truth = "ref/ float64 oracle";
        goto out;
    }
    rep->B = b.B, rep->T = b.T;
    snprintf(rep->model_type, sizeof rep->model_type, "%s", m64.cfg.model_type);
    rep->block = o.block ? o.block : b.T < 1024 ? 16 : 256;
    memcpy(rep->chunks, o.chunks, sizeof o.chunks);
    rep->n_chunks = o.n_chunks;
    if (!rep->n_chunks) default_chunks(rep);
    if ((st = make_groups(rep, ps, err))) goto out;
    int64_t maxn = 1;
    for (int i = 0; i < ps->n; i++) maxn = ps->p[i].numel > maxn ? ps->p[i].numel : maxn;
    ctx x = {.o = &o, .rep = rep, .m32 = &m32, .m64 = &m64, .b = &b, .ps = ps};
    if (o.lora) x.l32 = &l32, x.l64 = &l64;
    if (!o.no_ref) x.rm = &rm, x.rb = &rb, x.rlora = o.lora ? &rl : NULL;
    x.truth = malloc(sizeof(double) * (size_t)ps->total);
    x.budget32 = calloc((size_t)ps->n, sizeof(double));
    x.ta = malloc(sizeof(double) * (size_t)maxn);
    x.tb = malloc(sizeof(double) * (size_t)maxn);
    run_cfg cfgs[3 * SBP_VERIFY_MAX_CHUNKS + 2];
    int ncfg = configs(cfgs, &o, rep);
    if (!st && (!x.truth || !x.budget32 || !x.ta || !x.tb))
        st = sbp_fail(err, SBP_ENOMEM, "out of memory");
    if (!st && x.rm && !o.lora)
        rep->failed += sbp_verify_compare_inputs(&rep->g[SBP_VG_LOAD], rep->load_notes,
                                                 sizeof rep->load_notes, &m64, &b, &rm, &rb) > 0;
    if (!st && x.rm && o.lora) /* the adapter's tensors as both read them: the same bits */
        rep->failed += compare_adapter(&rep->g[SBP_VG_LOAD], &l64, &rl) > 0;
    if (!st) st = truth_of(&x, err);
    write_promises(rep, &o, x.rm != NULL);
    for (int d = SBP_DEVICE_CUDA; d <= SBP_DEVICE_CUDA_EMU && !st; d++) {
        if (!(o.devices & (1 << d))) continue;
        x.device = (sbp_device)d;
        if (precs & (1 << SBP_FP64)) st = run_device(&x, SBP_FP64, cfgs, ncfg, err);
        if (!st && (precs & (1 << SBP_FP32))) st = run_device(&x, SBP_FP32, cfgs, ncfg, err);
        x.device = SBP_DEVICE_CPU;
    }
    const int nums = o.numerics ? o.numerics : 3;
    for (int num = 0; num < 2 && !st; num++) {
        if (!(nums & (1 << num))) continue;
        x.numerics = (sbp_numerics)num;
        if (!st && (precs & (1 << SBP_FP64))) st = run_precision(&x, SBP_FP64, cfgs, ncfg, err);
        if (!st && (precs & (1 << SBP_FP32))) st = run_precision(&x, SBP_FP32, cfgs, ncfg, err);
    }
    snprintf(rep->g[SBP_VG_MICRO].promise, sizeof rep->g[0].promise,
             "the batch as micro-batches of different T in one step against the truth of the "
             "whole batch: fp64 <= %g, fp32 within its budget",
             TRUTH64_TOL);
    if (!st) st = run_micro(&x, precs, err);
    for (int gi = 0; gi < SBP_VG_N && !st; gi++)
        for (int i = 0; i < ps->n; i++) {
            rep->g[gi].failed += rep->g[gi].rows[i].failed > 0;
            rep->failed += rep->g[gi].rows[i].failed > 0;
        }
    free(x.truth), free(x.budget32), free(x.ta), free(x.tb);
out:
    ref_batch_free(&rb);
    ref_model_free(&rm);
    ref_lora_free(&rl);
    sbp_lora_free(&l32, NULL);
    sbp_lora_free(&l64, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m32, NULL);
    sbp_model_free(&m64, NULL);
    if (st) sbp_verify_report_free(rep);
    return st;
}

void sbp_verify_report_free(sbp_verify_report *rep) {
    for (int gi = 0; gi < SBP_VG_N; gi++) free(rep->g[gi].rows);
    memset(rep, 0, sizeof *rep);
}
