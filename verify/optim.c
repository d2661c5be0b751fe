/* optim.c — `streambp verify optim`: the library's optimizer steps against ref/adamw.c (optim.h
 * says what is compared and why). The model and batch are built in memory from fixed numbers, so
 * the check reads no file and writes none. */
#include "optim.h"

#include "../ref/ref.h"
#include "../src/core/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const sbp_optim_quantity[SBP_OQ_N] = {"weights", "exp_avg", "exp_avg_sq", "lr",
                                                  "grad norm"};

/* A Qwen2 shape: q/k/v biases and norms give the weight decay its second group. */
static sbp_config tiny_config(void) {
    sbp_config c = {.family = SBP_QWEN2,
                    .model_type = "qwen2",
                    .vocab = 48,
                    .hidden = 16,
                    .ffn = 24,
                    .layers = 2,
                    .heads = 2,
                    .kv_heads = 1,
                    .head_dim = 8,
                    .eps = 1e-6,
                    .rope_theta = 10000,
                    .qkv_bias = 1,
                    .init_range = 0.02};
    return c;
}

static double unit(uint64_t *s) { /* splitmix64, [-0.5, 0.5) */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1p-53 - 0.5;
}

static int is_norm(sbp_param_kind k) {
    return k == SBP_P_QNORM || k == SBP_P_KNORM || k == SBP_P_IN_NORM || k == SBP_P_POST_NORM ||
           k == SBP_P_FINAL_NORM;
}

static sbp_status make_model(sbp_model *m, sbp_precision prec, sbp_err *err) {
    memset(m, 0, sizeof *m);
    m->cfg = tiny_config();
    m->prec = prec;
    sbp_status st = sbp_config_validate(&m->cfg, "verify optim's model", err);
    if (!st) st = sbp_params_build(&m->params, &m->cfg, err);
    if (st) return st;
    size_t esz = prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    m->w = sbp_ledger_alloc(NULL, SBP_MEM_WEIGHTS, esz * (size_t)m->params.total);
    if (!m->w) {
        sbp_model_free(m, NULL);
        return sbp_fail(err, SBP_ENOMEM, "out of memory for verify optim's model");
    }
    uint64_t s = 7;
    for (int i = 0; i < m->params.n; i++) {
        const sbp_param *p = &m->params.p[i];
        for (int64_t j = p->offset; j < p->offset + p->numel; j++) {
            double x = is_norm(p->kind) ? 1 + 0.2 * unit(&s) : 0.2 * unit(&s);
            if (prec == SBP_FP64)
                ((double *)m->w)[j] = x;
            else
                ((float *)m->w)[j] = (float)x;
        }
    }
    return SBP_OK;
}

static sbp_status make_batch(sbp_batch *b, int V, sbp_err *err) {
    memset(b, 0, sizeof *b);
    b->B = 2, b->T = 12;
    int n = b->B * b->T;
    b->ids = calloc((size_t)n, sizeof *b->ids);
    b->labels = calloc((size_t)n, sizeof *b->labels);
    b->mask = calloc((size_t)n, 1);
    if (!b->ids || !b->labels || !b->mask) {
        sbp_batch_free(b);
        return sbp_fail(err, SBP_ENOMEM, "out of memory for verify optim's batch");
    }
    for (int i = 0; i < n; i++) {
        b->ids[i] = b->labels[i] = (int32_t)((i * 7 + 3) % V);
        b->mask[i] = 1;
    }
    b->labels[0] = b->labels[b->T] = SBP_IGNORE;
    sbp_batch_count_targets(b);
    return SBP_OK;
}

double sbp_optim_diff(const sbp_params *ps, const void *got, sbp_precision prec, const double *want,
                      const double *base, int *worst) {
    double w = 0;
    *worst = 0;
    for (int i = 0; i < ps->n; i++) {
        double d = 0, r = 0;
        for (int64_t j = ps->p[i].offset; j < ps->p[i].offset + ps->p[i].numel; j++) {
            double g = prec == SBP_FP64 ? ((const double *)got)[j] : ((const float *)got)[j];
            double b = base ? base[j] : 0;
            d = fmax(d, fabs(g - want[j]));
            r = fmax(r, fabs(want[j] - b));
            if (!isfinite(g)) d = INFINITY;
        }
        double rel = r > 0 ? d / r : d > 0 ? INFINITY : 0;
        if (!(rel <= w)) w = rel, *worst = i; /* a NaN is the worst */
    }
    return w;
}

static void note(sbp_optim_case *c, int q, double rel, const char *tensor, int step) {
    if (!(rel <= c->worst[q]) || !c->where[q][0]) {
        c->worst[q] = rel;
        snprintf(c->where[q], sizeof c->where[q], "%s, step %d", tensor, step + 1);
    }
}

static double rel_diff(double a, double b) {
    return a == b ? 0 : fabs(a - b) / fmax(fabs(a), fabs(b));
}

/* One case: `steps` train steps of the model's weights (lora 0) or of an adapter's. */
static sbp_status run_case(sbp_optim_case *c, int lora_on, sbp_precision prec, int steps,
                           sbp_err *err) {
    memset(c, 0, sizeof *c);
    c->prec = prec;
    c->budget = prec == SBP_FP64 ? SBP_OPTIM_BUDGET64 : SBP_OPTIM_BUDGET32;
    const sbp_lr_kind kind = lora_on ? SBP_LR_LINEAR : SBP_LR_COSINE;
    const double peak = lora_on ? 2e-2 : 1e-2;
    const int64_t warmup = lora_on ? 1 : 2;
    const sbp_adamw_opts ao = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
    const sbp_lr_sched sched = {.kind = kind, .lr = peak, .warmup = warmup, .total = steps};
    sbp_model m;
    sbp_batch b;
    sbp_lora lora = {0};
    sbp_adamw a = {0};
    sbp_range *nd = NULL;
    double *p = NULL, *p0 = NULL, *mm = NULL, *vv = NULL, *g = NULL;
    unsigned char *decay = NULL;
    sbp_status st = make_model(&m, prec, err);
    if (st) return st;
    if ((st = make_batch(&b, m.cfg.vocab, err))) goto out;
    if (lora_on) {
        const sbp_lora_config lc = {.r = 2, .alpha = 4, .targets = SBP_LORA_ALL};
        /* B not zero: with peft's B = 0 every gradient of A would be 0 at the first step */
        if ((st = sbp_lora_init(&lora, &m.cfg, &lc, 3, 0.05, prec, err))) goto out;
    }
    const sbp_params *ps = lora_on ? &lora.params : &m.params;
    void *w = lora_on ? lora.w : m.w;
    const int64_t n = ps->total;
    int n_nd = 0;
    if ((st = sbp_adamw_init(&a, &ao, prec, n, NULL, err))) goto out;
    if ((st = sbp_params_no_decay(&nd, &n_nd, ps, err))) goto out;
    if ((st = sbp_adamw_exclude_decay(&a, nd, n_nd, err))) goto out;
    p = malloc(sizeof *p * (size_t)n), p0 = malloc(sizeof *p0 * (size_t)n);
    mm = calloc((size_t)n, sizeof *mm), vv = calloc((size_t)n, sizeof *vv);
    g = malloc(sizeof *g * (size_t)n), decay = malloc((size_t)n);
    if (!p || !p0 || !mm || !vv || !g || !decay) {
        st = sbp_fail(err, SBP_ENOMEM, "out of memory for verify optim's oracle");
        goto out;
    }
    for (int i = 0; i < ps->n; i++) { /* HF Trainer's groups, by name: biases and norms */
        const char *name = ps->p[i].name;
        int keep = strstr(name, "bias") || strstr(name, "norm");
        memset(decay + ps->p[i].offset, !keep, (size_t)ps->p[i].numel);
    }
    for (int64_t j = 0; j < n; j++)
        p[j] = p0[j] = prec == SBP_FP64 ? ((double *)w)[j] : ((float *)w)[j];
    sbp_grad_opts go = {0};
    go.lora = lora_on ? &lora : NULL;
    for (int k = 0; k < steps; k++) {
        /* the gradient the step will use, as the oracle's input (the engine is deterministic) */
        sbp_grad_result gr;
        if ((st = sbp_grad_batches(&gr, &m, &b, 1, &go, NULL, err))) goto out;
        for (int64_t j = 0; j < n; j++)
            g[j] = prec == SBP_FP64 ? ((double *)gr.grads)[j] : ((float *)gr.grads)[j];
        sbp_grad_result_free(&gr, NULL);
        if (k == 0) { /* full weights clipped, the adapter (mostly) not: both branches */
            double s = 0;
            for (int64_t j = 0; j < n; j++) s += g[j] * g[j];
            c->max_norm = (lora_on ? 2.0 : 0.5) * sqrt(s);
        }
        double lr = sbp_lr_at(&sched, k), lr_ref = ref_lr_at(kind, peak, warmup, steps, k);
        sbp_step_result r;
        if ((st = sbp_train_step(&r, &m, lora_on ? &lora : NULL, &a, &b, 1, &go, lr, c->max_norm,
                                 NULL, err)))
            goto out;
        double norm_ref = ref_clip_grad_norm(g, ps, c->max_norm);
        ref_adamw_step(p, mm, vv, g, decay, n, k + 1, &ao, lr_ref);
        c->norm[k] = r.grad_norm;
        note(c, SBP_OQ_LR, rel_diff(lr, lr_ref), "the schedule", k);
        note(c, SBP_OQ_NORM, rel_diff(r.grad_norm, norm_ref), "the gradient", k);
        int t;
        double d = sbp_optim_diff(ps, w, prec, p, p0, &t);
        note(c, SBP_OQ_WEIGHTS, d, ps->p[t].name, k);
        d = sbp_optim_diff(ps, a.exp_avg, prec, mm, NULL, &t);
        note(c, SBP_OQ_EXP_AVG, d, ps->p[t].name, k);
        d = sbp_optim_diff(ps, a.exp_avg_sq, prec, vv, NULL, &t);
        note(c, SBP_OQ_EXP_AVG_SQ, d, ps->p[t].name, k);
    }
    for (int q = 0; q < SBP_OQ_N; q++) c->failed += !(c->worst[q] <= c->budget);
    snprintf(c->name, sizeof c->name, "%s %s, %s", lora_on ? "LoRA adapter" : "full weights",
             prec == SBP_FP64 ? "fp64" : "fp32", sbp_lr_kind_name(kind));
out:
    free(p), free(p0), free(mm), free(vv), free(g), free(decay), free(nd);
    sbp_adamw_free(&a, NULL);
    if (lora_on) sbp_lora_free(&lora, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
    return st;
}

sbp_status sbp_verify_optim(sbp_optim_report *rep, sbp_err *err) {
    memset(rep, 0, sizeof *rep);
    rep->steps = SBP_OPTIM_STEPS;
    for (int lora_on = 0; lora_on < 2; lora_on++)
        for (int pi = 0; pi < 2; pi++) {
            sbp_optim_case *c = &rep->c[rep->n++];
            sbp_status st = run_case(c, lora_on, pi ? SBP_FP32 : SBP_FP64, rep->steps, err);
            if (st) return st;
            rep->failed += c->failed;
        }
    return SBP_OK;
}
