/* adamw.c — torch.optim.AdamW over a flat trainable slab.
 *
 * PyTorch's single-tensor AdamW (torch 2.x, torch/optim/adam.py, `_single_tensor_adam` with
 * decoupled weight decay; the CPU default: neither foreach nor fused) does, per parameter:
 *
 *     step_t += 1
 *     if weight_decay != 0: param.mul_(1 - lr * weight_decay)
 *     exp_avg.lerp_(grad, 1 - beta1)
 *     exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
 *     bias_correction1 = 1 - beta1 ** step
 *     bias_correction2 = 1 - beta2 ** step
 *     step_size = lr / bias_correction1
 *     bias_correction2_sqrt = bias_correction2 ** 0.5
 *     denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
 *     param.addcdiv_(exp_avg, denom, value=-step_size)
 *
 * The scalars are Python floats (float64); each tensor operation rounds them to the tensor's
 * dtype and computes in that dtype, so a float32 slab is updated in float32 arithmetic with
 * float32 constants, as here. The element-wise order is torch's: lerp is m + w·(g − m) for
 * w < 0.5 and g − (g − m)·(1 − w) otherwise (ATen's lerp), addcmul is v + (c·g)·g, addcdiv is
 * p + (c·m)/d. torch 1.x wrote the first moment as m·beta1 + (1 − beta1)·g and used
 * math.sqrt; both agree with this within rounding (verify/torch_adamw.py measures it).
 *
 * The slab is processed in fixed blocks of elements, threads taking whole blocks, so that which
 * code path (vector body or scalar tail) updates an element depends on the block layout only:
 * the result is the same for every thread count. */
#include "../core/err.h"
#include "../dist/dist.h"
#include "../io/file.h"
#include "../io/safetensors.h"
#include "../streambp.h"
#include "zero2.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCK = 4096 };

/* The step's scalars, computed once in float64 as Python computes them. */
typedef struct {
    double decay;     /* 1 - lr * weight_decay */
    double w1;        /* 1 - beta1: the lerp weight */
    double beta2, w2; /* beta2, 1 - beta2 */
    double neg_step;  /* -(lr / bias_correction1) */
    double bc2_sqrt;  /* bias_correction2 ** 0.5 */
    double eps;
} step_scalars;

/* Elements [i0, i1) of one block; decay says whether the block's range is decayed. */
#define DEFINE_UPDATE(NAME, real, SQRT)                                                            \
    static void NAME(real *restrict p, real *restrict m, real *restrict v, const real *restrict g, \
                     int64_t i0, int64_t i1, const step_scalars *s, int decay) {                   \
        const real dec = (real)s->decay, w1 = (real)s->w1, one_w1 = (real)1 - w1;                  \
        const real b2 = (real)s->beta2, w2 = (real)s->w2, ns = (real)s->neg_step;                  \
        const real bc2 = (real)s->bc2_sqrt, eps = (real)s->eps;                                    \
        const int small = fabs(s->w1) < 0.5; /* ATen's lerp: the more accurate of two forms */     \
        if (decay)                                                                                 \
            for (int64_t i = i0; i < i1; i++) p[i] = p[i] * dec;                                   \
        if (small)                                                                                 \
            for (int64_t i = i0; i < i1; i++) m[i] = m[i] + w1 * (g[i] - m[i]);                    \
        else                                                                                       \
            for (int64_t i = i0; i < i1; i++) m[i] = g[i] - (g[i] - m[i]) * one_w1;                \
        for (int64_t i = i0; i < i1; i++) {                                                        \
            v[i] = v[i] * b2;                                                                      \
            v[i] = v[i] + (w2 * g[i]) * g[i];                                                      \
            const real denom = SQRT(v[i]) / bc2 + eps;                                             \
            p[i] = p[i] + (ns * m[i]) / denom;                                                     \
        }                                                                                          \
    }

DEFINE_UPDATE(update_f32, float, sqrtf)
DEFINE_UPDATE(update_f64, double, sqrt)

sbp_status sbp_adamw_check(const sbp_adamw_opts *o, sbp_err *err) {
    if (!(o->beta1 >= 0 && o->beta1 < 1))
        return sbp_fail(err, SBP_EUSAGE, "AdamW beta1 must be in [0, 1) (got %g)", o->beta1);
    if (!(o->beta2 >= 0 && o->beta2 < 1))
        return sbp_fail(err, SBP_EUSAGE, "AdamW beta2 must be in [0, 1) (got %g)", o->beta2);
    if (!(o->eps >= 0) || !isfinite(o->eps))
        return sbp_fail(err, SBP_EUSAGE, "AdamW eps must be >= 0 and finite (got %g)", o->eps);
    if (!(o->weight_decay >= 0) || !isfinite(o->weight_decay))
        return sbp_fail(err, SBP_EUSAGE, "the weight decay must be >= 0 and finite (got %g)",
                        o->weight_decay);
    return SBP_OK;
}

/* Zero moments for `held` elements of a slab of n. */
static sbp_status init_moments(sbp_adamw *a, const sbp_adamw_opts *o, sbp_precision prec, int64_t n,
                               int64_t held, sbp_ledger *lg, sbp_err *err) {
    sbp_status st = sbp_adamw_check(o, err);
    if (st) return st;
    if (n < 1) return sbp_fail(err, SBP_EUSAGE, "AdamW: the trainable slab is empty");
    size_t bytes = (prec == SBP_FP64 ? sizeof(double) : sizeof(float)) * (size_t)(held ? held : 1);
    a->o = *o;
    a->prec = prec;
    a->n = n;
    a->exp_avg = sbp_ledger_alloc(lg, SBP_MEM_OPTIMIZER, bytes);
    a->exp_avg_sq = a->exp_avg ? sbp_ledger_alloc(lg, SBP_MEM_OPTIMIZER, bytes) : NULL;
    if (!a->exp_avg_sq) {
        sbp_adamw_free(a, lg);
        return sbp_fail(err, SBP_ENOMEM, "out of memory for the AdamW moments (2 x %lld elements)",
                        (long long)held);
    }
    return SBP_OK;
}

sbp_status sbp_adamw_init(sbp_adamw *a, const sbp_adamw_opts *o, sbp_precision prec, int64_t n,
                          sbp_ledger *lg, sbp_err *err) {
    memset(a, 0, sizeof *a);
    return init_moments(a, o, prec, n, n, lg, err);
}

sbp_status sbp_adamw_init_held(sbp_adamw *a, const sbp_adamw_opts *o, sbp_precision prec,
                               const sbp_params *ps, struct sbp_comm *comm, sbp_ledger *lg,
                               sbp_err *err) {
    const int N = sbp_comm_size(comm);
    if (N <= 1) return sbp_adamw_init(a, o, prec, ps->total, lg, err);
    memset(a, 0, sizeof *a);
    int64_t held = 0;
    if ((a->n_held = sbp_dist_owned(&a->held, &held, ps, N, sbp_comm_rank(comm))) < 0) {
        a->n_held = 0;
        return sbp_fail(err, SBP_ENOMEM, "out of memory");
    }
    a->comm = comm, a->lg = lg;
    sbp_status st = init_moments(a, o, prec, ps->total, held, lg, err);
    if (st) sbp_adamw_free(a, lg);
    return st;
}

sbp_status sbp_adamw_exclude_decay(sbp_adamw *a, const sbp_range *r, int n, sbp_err *err) {
    for (int i = 0; i < n; i++)
        if (r[i].begin < (i ? r[i - 1].end : 0) || r[i].end <= r[i].begin || r[i].end > a->n)
            return sbp_fail(err, SBP_EUSAGE,
                            "AdamW: no-decay range %d [%lld, %lld) is empty, out of order or "
                            "outside the slab of %lld elements",
                            i, (long long)r[i].begin, (long long)r[i].end, (long long)a->n);
    sbp_range *copy = n ? malloc(sizeof *copy * (size_t)n) : NULL;
    if (n && !copy) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    if (n) memcpy(copy, r, sizeof *copy * (size_t)n);
    free(a->no_decay);
    a->no_decay = copy;
    a->n_no_decay = n;
    return SBP_OK;
}

void sbp_adamw_free(sbp_adamw *a, sbp_ledger *lg) {
    sbp_ledger_free(lg, a->exp_avg);
    sbp_ledger_free(lg, a->exp_avg_sq);
    free(a->no_decay);
    free(a->held);
    memset(a, 0, sizeof *a);
}

/* Whether element i is decayed, and where its decay status next changes (the ranges are sorted:
 * a binary search for the first range that ends after i). */
static int decayed_until(const sbp_adamw *a, int64_t i, int64_t *until) {
    int lo = 0, hi = a->n_no_decay;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (a->no_decay[mid].end <= i)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == a->n_no_decay) {
        *until = a->n;
        return 1;
    }
    if (i < a->no_decay[lo].begin) {
        *until = a->no_decay[lo].begin;
        return 1;
    }
    *until = a->no_decay[lo].end;
    return 0;
}

/* The slab's elements [i0, i1) (whole blocks, the slab's last possibly short), their moments and
 * gradient at packed position at on when packed_g (a ZeRO-2 share), else at i0 on (the slab):
 * threads take whole blocks, each split where a no-decay range starts or
 * ends. Every element's operations are the same whatever the split (element-wise, no
 * contraction), so a held share updates its elements as the whole slab's step does. */
static void step_blocks(sbp_adamw *a, void *p, const void *g, int64_t i0, int64_t i1, int64_t at,
                        int packed_g, const step_scalars *s, int any_decay) {
    const int64_t nblocks = (i1 - i0 + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t i = i0 + b * BLOCK, end = i + BLOCK < i1 ? i + BLOCK : i1;
        while (i < end) { /* split the block where a no-decay range starts or ends */
            int64_t until;
            int decay = decayed_until(a, i, &until) && any_decay;
            int64_t j = until < end ? until : end, m = at + (i - i0), gi = packed_g ? m : i;
            if (a->prec == SBP_FP64)
                update_f64((double *)p + i, (double *)a->exp_avg + m, (double *)a->exp_avg_sq + m,
                           (const double *)g + gi, 0, j - i, s, decay);
            else
                update_f32((float *)p + i, (float *)a->exp_avg + m, (float *)a->exp_avg_sq + m,
                           (const float *)g + gi, 0, j - i, s, decay);
            i = j;
        }
    }
}

void sbp_adamw_step(sbp_adamw *a, void *p, const void *g, double lr) {
    const sbp_adamw_opts *o = &a->o;
    a->step++;
    const double step = (double)a->step;
    const double bc1 = 1 - pow(o->beta1, step), bc2 = 1 - pow(o->beta2, step);
    const step_scalars s = {.decay = 1 - lr * o->weight_decay,
                            .w1 = 1 - o->beta1,
                            .beta2 = o->beta2,
                            .w2 = 1 - o->beta2,
                            .neg_step = -(lr / bc1),
                            .bc2_sqrt = pow(bc2, 0.5),
                            .eps = o->eps};
    const int any_decay = o->weight_decay != 0; /* torch skips the multiply by 1 */
    if (!a->held) {
        step_blocks(a, p, g, 0, a->n, 0, 0, &s, any_decay);
        return;
    }
    int64_t at = 0;
    for (int k = 0; k < a->n_held; k++) { /* ZeRO-2: this rank's blocks; g its share, packed */
        step_blocks(a, p, g, a->held[k].begin, a->held[k].end, at, 1, &s, any_decay);
        at += a->held[k].end - a->held[k].begin;
    }
}

sbp_status sbp_params_no_decay(sbp_range **out, int *n, const sbp_params *ps, sbp_err *err) {
    *out = NULL;
    *n = 0;
    sbp_range *r = malloc(sizeof *r * (size_t)(ps->n ? ps->n : 1));
    if (!r) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    for (int i = 0; i < ps->n; i++) {
        const sbp_param *p = &ps->p[i];
        switch (p->kind) {
        case SBP_P_QB:
        case SBP_P_KB:
        case SBP_P_VB:
        case SBP_P_QNORM:
        case SBP_P_KNORM:
        case SBP_P_IN_NORM:
        case SBP_P_POST_NORM:
        case SBP_P_PRE_FF_NORM:
        case SBP_P_POST_FF_NORM:
        case SBP_P_FINAL_NORM:
            if (*n && r[*n - 1].end == p->offset) /* adjacent: one range */
                r[*n - 1].end += p->numel;
            else
                r[(*n)++] = (sbp_range){p->offset, p->offset + p->numel};
            break;
        default: break;
        }
    }
    *out = r;
    return SBP_OK;
}

/* ---- the moments as a safetensors file ------------------------------------------------------ */

static const char *const moment_suffix[2] = {"exp_avg", "exp_avg_sq"};

/* ZeRO-2's checkpoint: the moments gathered to rank 0 one tensor at a time (a buffer of the
 * largest), written by rank 0 as sbp_st_write writes the whole state; the other ranks send their
 * parts and write nothing. Collective. */
static sbp_status save_held(const char *path, const sbp_adamw *a, const sbp_params *ps,
                            const sbp_st_entry *e, const char *const *meta, sbp_err *err) {
    const int root = sbp_comm_rank(a->comm) == 0;
    const int esz = a->prec == SBP_FP64 ? 8 : 4;
    int64_t most = 1;
    for (int i = 0; i < ps->n; i++) most = ps->p[i].numel > most ? ps->p[i].numel : most;
    sbp_dist_shares sh = {0};
    sbp_status st = sbp_dist_shares_of(&sh, ps, sbp_comm_size(a->comm), err), wst = SBP_OK;
    char *buf =
        root && !st ? sbp_ledger_alloc_raw(a->lg, SBP_MEM_OPTIMIZER, (size_t)most * esz) : NULL;
    if (root && !st && !buf) st = sbp_fail(err, SBP_ENOMEM, "out of memory");
    sbp_outfile o;
    int open = 0;
    sbp_err werr = *err; /* rank 0's write failure; the others' parts are still taken */
    if (root && !st) wst = sbp_outfile_open(&o, path, &werr), open = !wst;
    if (root && !st && !wst) wst = sbp_st_write_header(&o, e, 2 * ps->n, meta, path, &werr);
    for (int i = 0; i < ps->n && !st; i++)
        for (int k = 0; k < 2 && !st; k++) {
            const sbp_param *p = &ps->p[i];
            st = sbp_dist_gather(a->comm, buf, k ? a->exp_avg_sq : a->exp_avg, &sh, p->offset,
                                 p->offset + p->numel, esz, "the optimizer state", err);
            if (root && !st && !wst)
                wst = sbp_outfile_write(&o, buf, (size_t)p->numel * esz, &werr);
        }
    if (root && !st && !wst) wst = sbp_outfile_commit(&o, &werr), open = 0;
    if (open) sbp_outfile_abort(&o);
    if (!st && wst) *err = werr, st = wst;
    sbp_ledger_free(a->lg, buf);
    sbp_dist_shares_free(&sh);
    return st;
}

sbp_status sbp_adamw_save(const char *path, const sbp_adamw *a, const sbp_params *ps,
                          sbp_err *err) {
    if (ps->total != a->n)
        return sbp_fail(err, SBP_EUSAGE,
                        "AdamW: the parameter table has %lld elements, the slab "
                        "%lld",
                        (long long)ps->total, (long long)a->n);
    size_t esz = a->prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    sbp_st_entry *e = calloc(2 * (size_t)ps->n, sizeof *e);
    char(*names)[96] = calloc(2 * (size_t)ps->n, sizeof *names);
    if (!e || !names) {
        free(e), free(names);
        return sbp_fail(err, SBP_ENOMEM, "out of memory");
    }
    for (int i = 0; i < ps->n; i++)
        for (int k = 0; k < 2; k++) {
            const sbp_param *p = &ps->p[i];
            int j = 2 * i + k;
            snprintf(names[j], sizeof names[j], "%s.%s", p->name, moment_suffix[k]);
            e[j] = (sbp_st_entry){.name = names[j],
                                  .dtype = a->prec == SBP_FP64 ? SBP_DT_F64 : SBP_DT_F32,
                                  .ndim = p->ndim,
                                  .shape = {p->shape[0], p->shape[1]},
                                  .data = a->held ? NULL
                                                  : (const char *)(k ? a->exp_avg_sq : a->exp_avg) +
                                                        esz * (size_t)p->offset};
        }
    char num[5][40];
    snprintf(num[0], sizeof num[0], "%lld", (long long)a->step);
    snprintf(num[1], sizeof num[1], "%.17g", a->o.beta1);
    snprintf(num[2], sizeof num[2], "%.17g", a->o.beta2);
    snprintf(num[3], sizeof num[3], "%.17g", a->o.eps);
    snprintf(num[4], sizeof num[4], "%.17g", a->o.weight_decay);
    const char *meta[] = {"optimizer",    "AdamW", "step",   num[0],     "beta1",
                          num[1],         "beta2", num[2],   "eps",      num[3],
                          "weight_decay", num[4],  "format", "streambp", NULL};
    sbp_status st = a->held ? save_held(path, a, ps, e, meta, err)
                            : sbp_st_write(path, e, 2 * ps->n, meta, err);
    free(e), free(names);
    return st;
}

/* ZeRO-2's resume: moment k of parameter p (tensor t of sf) read whole into *tmp, its values
 * checked, this rank's held parts kept in the packed moments. */
static sbp_status load_held(sbp_adamw *a, const sbp_st_file *sf, const sbp_st_tensor *t,
                            const sbp_param *p, int k, const sbp_dist_shares *sh, char *buf,
                            const char *path, sbp_err *err) {
    const size_t esz = a->prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    sbp_status st = sbp_st_read_raw(sf, t, buf, err);
    for (int64_t j = 0; j < p->numel && !st; j++) {
        const double v = a->prec == SBP_FP64 ? ((const double *)buf)[j] : ((const float *)buf)[j];
        if (!isfinite(v) || (k && v < 0))
            st = sbp_fail(err, SBP_EINPUT, "%s: \"%s.%s\" element %lld is %g%s", path, p->name,
                          moment_suffix[k], (long long)j, v,
                          isfinite(v) ? " (a second moment is never negative)" : "");
    }
    const int r = sbp_comm_rank(a->comm);
    for (int q = 0; q < sh->nj[r] && !st; q++) {
        const sbp_range *g = &sh->rj[r][q];
        const int64_t lo = p->offset, hi = lo + p->numel;
        const int64_t b = g->begin > lo ? g->begin : lo, e = g->end < hi ? g->end : hi;
        if (b < e)
            memcpy((char *)(k ? a->exp_avg_sq : a->exp_avg) +
                       (size_t)(sh->pk[r][q] + b - g->begin) * esz,
                   buf + (size_t)(b - lo) * esz, (size_t)(e - b) * esz);
    }
    return st;
}

sbp_status sbp_adamw_load(sbp_adamw *a, const char *path, const sbp_params *ps, sbp_err *err) {
    if (ps->total != a->n)
        return sbp_fail(err, SBP_EUSAGE,
                        "AdamW: the parameter table has %lld elements, the slab "
                        "%lld",
                        (long long)ps->total, (long long)a->n);
    sbp_st_file sf;
    sbp_status st = sbp_st_open(&sf, path, err);
    if (st) return st;
    const sbp_dtype want = a->prec == SBP_FP64 ? SBP_DT_F64 : SBP_DT_F32;
    const char *step_text = sbp_st_meta(&sf, "step");
    char *end = NULL;
    errno = 0;
    long long step = step_text ? strtoll(step_text, &end, 10) : -1;
    if (!step_text || *end || end == step_text || errno || step < 0)
        st = sbp_fail(err, SBP_EFORMAT, "%s: no valid \"step\" in __metadata__", path);
    if (!st && sf.n != 2 * ps->n)
        st = sbp_fail(err, SBP_EINPUT, "%s: %d tensors, expected %d (two moments per parameter)",
                      path, sf.n, 2 * ps->n);
    size_t esz = a->prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    sbp_dist_shares sh = {0};
    char *tmp = NULL; /* ZeRO-2: one tensor at a time (the largest's room), its held parts kept */
    int64_t most = 1;
    for (int i = 0; i < ps->n; i++) most = ps->p[i].numel > most ? ps->p[i].numel : most;
    if (!st && a->held) st = sbp_dist_shares_of(&sh, ps, sbp_comm_size(a->comm), err);
    if (!st && a->held &&
        !(tmp = sbp_ledger_alloc_raw(a->lg, SBP_MEM_OPTIMIZER, (size_t)most * esz)))
        st = sbp_fail(err, SBP_ENOMEM, "out of memory");
    for (int i = 0; i < ps->n && !st; i++)
        for (int k = 0; k < 2 && !st; k++) {
            const sbp_param *p = &ps->p[i];
            char name[128];
            snprintf(name, sizeof name, "%s.%s", p->name, moment_suffix[k]);
            const sbp_st_tensor *t = sbp_st_find(&sf, name);
            if (!t)
                st = sbp_fail(err, SBP_EINPUT, "%s: no tensor \"%s\"", path, name);
            else if (t->dtype != want || t->numel != p->numel || t->ndim != p->ndim ||
                     t->shape[0] != p->shape[0] || (p->ndim == 2 && t->shape[1] != p->shape[1]))
                st = sbp_fail(err, SBP_EINPUT,
                              "%s: tensor \"%s\" is %s of shape [%lld%s%lld]; expected %s of "
                              "shape [%lld%s%lld] (a checkpoint of another model or precision?)",
                              path, name, sbp_dtype_name(t->dtype), (long long)t->shape[0],
                              t->ndim > 1 ? ", " : "", t->ndim > 1 ? (long long)t->shape[1] : 0,
                              sbp_dtype_name(want), (long long)p->shape[0], p->ndim > 1 ? ", " : "",
                              p->ndim > 1 ? (long long)p->shape[1] : 0);
            else if (!a->held)
                st = sbp_st_read_raw(
                    &sf, t, (char *)(k ? a->exp_avg_sq : a->exp_avg) + esz * (size_t)p->offset,
                    err);
            else
                st = load_held(a, &sf, t, p, k, &sh, tmp, path, err);
        }
    sbp_st_close(&sf);
    sbp_ledger_free(a->lg, tmp);
    sbp_dist_shares_free(&sh);
    /* moments a step could not have produced: non-finite values, negative second moments */
    for (int i = 0; i < ps->n && !st && !a->held; i++)
        for (int k = 0; k < 2 && !st; k++) {
            const sbp_param *p = &ps->p[i];
            const void *m = k ? a->exp_avg_sq : a->exp_avg;
            for (int64_t j = 0; j < p->numel && !st; j++) {
                const double v = a->prec == SBP_FP64 ? ((const double *)m)[p->offset + j]
                                                     : ((const float *)m)[p->offset + j];
                if (!isfinite(v) || (k && v < 0))
                    st = sbp_fail(err, SBP_EINPUT, "%s: \"%s.%s\" element %lld is %g%s", path,
                                  p->name, moment_suffix[k], (long long)j, v,
                                  isfinite(v) ? " (a second moment is never negative)" : "");
            }
        }
    if (!st) a->step = step;
    return st;
}
