/* test_objectives.c — DPO and GRPO (ref/SEMANTICS.md "DPO", "GRPO", "Gradient accumulation"):
 *  1. the oracle ref_dpo / ref_grpo by central finite differences of its own loss: both DPO loss
 *     types, all four GRPO ones, a temperature ≠ 1, old log-probs that put ratios on both sides
 *     of the clip range, and the "no old log-probs" case; its error cases; and its step
 *     normalisers (micro-batches with num_items / num_sequences add up to the whole batch);
 *  2. src against ref per objective and loss type, on qwen3-tiny and llama3-tiny with the fixture
 *     batches: every schedule in float64 (≤ 1e-10 rel. L2 per parameter, loss ≤ 1e-12), full,
 *     ckpt and stream bitwise equal with block-multiple chunks, float32 within 1e-4; and
 *     sbp_grad_batches (gradient accumulation) against ref;
 *  3. ref against verify/torch_grads.py (PyTorch autograd, float64), when torch is installed;
 *  4. GRPO with equal rewards in a group: zero advantages there, finite gradients.
 * The reference values of dpo-noref and of grpo-adv with β > 0 come from a second model (the same
 * config, seed 2): ref_logprobs for ref, sbp_logprobs for src, --ref-model for torch. */
#include "testutil.h"
#include "../ref/ref.h"
#include "../src/core/rng.h"
#include "../src/io/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *families[] = {"qwen3-tiny", "llama3-tiny"};
#define NFAM        2
#define POLICY_SEED 1
#define REF_SEED    2 /* the reference model */

#define DPO_TINY  "data/batches/dpo-tiny.safetensors"
#define DPO_NOREF "data/batches/dpo-noref.safetensors"
#define GRPO_TINY "data/batches/grpo-tiny.safetensors"
#define GRPO_ADV  "data/batches/grpo-adv.safetensors"
#define GRPO_EQ   "data/batches/grpo-equal-rewards.safetensors"

/* Finite differences of the loss, step h = 1e-5 (as tests/test_ref.c, where the error budget is
 * measured: truncation ~h²·|f‴|, rounding ~ε·|f|/h). The rounding here comes from sums of many
 * log-probs (a DPO row sums up to 20, ~100 in magnitude) scaled by dL/dS, which grows with the
 * loss (ipo: 2(z − 1/2β)), so the absolute term scales with it: atol = FD_ATOL·max(1, |L|).
 * Measured over the checks below (each prints its worst): |fd − g| ≤ 1.4e-10 for DPO sigmoid
 * (L ≈ 1.2-1.4), 6.8e-9 for ipo (L ≈ 34-40, at |g| = 18.5: 3.7e-10 relative, truncation) and
 * 2.7e-9 for GRPO (at |g| = 1.2); relative to |g| ≥ 1e-4 at most 4.4e-7. A wrong factor in a
 * loss derivative (1/n_r, a sign, σ(βz) for σ(−βz), the clip branch) gives errors of order |g|. */
#define FD_STEP 1e-5
#define FD_ATOL 2e-9
#define FD_RTOL 1e-7

/* src and torch against ref (as tests/test_ref.c): rounding differences only. */
#define SRC_TOL_FP64      1e-10
#define SRC_LOSS_TOL_FP64 1e-12
#define SRC_TOL_FP32      1e-4
#define TORCH_TOL         1e-10

/* ---------------------------------------------------------------------------------------------
 * Cases */

typedef int (*ref_loss_fn)(double *loss, double *grads, const ref_net *net, const sbp_batch *b,
                           const sbp_objective *o, sbp_err *err);

typedef struct {
    char name[96];
    const char *batch; /* fixture path */
    sbp_objective o;
    int ref_model; /* reference values from the seed-2 model */
} ocase;

static const char *dpo_loss_name(sbp_dpo_loss l) {
    return l == SBP_DPO_IPO ? "ipo" : "sigmoid";
}

static const char *grpo_loss_name(sbp_grpo_loss l) {
    static const char *n[] = {"grpo", "bnpo", "dr_grpo", "dapo"};
    return n[l];
}

static const char *stem(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* The groups of the comparisons, one per objective and loss type:
 *   0-2 DPO sigmoid (ls 0), sigmoid (ls 0.1), ipo; β 0.1; on dpo-tiny and dpo-noref;
 *   3-6 GRPO grpo, bnpo, dr_grpo, dapo; β 0.04 at τ 0.7 and 1 on grpo-tiny, grpo-adv (reference
 *       model) and grpo-equal-rewards, plus β 0 on grpo-adv (no reference at all) at τ 0.7;
 *       dr_grpo with max_completion_length 20 at τ 0.7 (T otherwise), dapo with ε_high 0.28. */
#define NGROUPS 7
static const char *group_names[NGROUPS] = {"DPO sigmoid ls 0", "DPO sigmoid ls 0.1", "DPO ipo",
                                           "GRPO grpo",        "GRPO bnpo",          "GRPO dr_grpo",
                                           "GRPO dapo"};

static int group_cases(int g, ocase *out /* (16) */) {
    int n = 0;
    if (g < 3) {
        const char *batches[] = {DPO_TINY, DPO_NOREF};
        for (int i = 0; i < 2; i++) {
            ocase *c = &out[n++];
            memset(c, 0, sizeof *c);
            c->batch = batches[i];
            c->ref_model = i == 1;
            c->o.kind = SBP_OBJ_DPO;
            c->o.dpo_loss = g == 2 ? SBP_DPO_IPO : SBP_DPO_SIGMOID;
            c->o.beta = 0.1;
            c->o.label_smoothing = g == 1 ? 0.1 : 0;
            snprintf(c->name, sizeof c->name, "%s %s", group_names[g], stem(c->batch));
        }
        return n;
    }
    const char *batches[] = {GRPO_TINY, GRPO_ADV, GRPO_ADV, GRPO_EQ};
    const double taus[] = {0.7, 1};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 2; k++) {
            int no_kl = i == 2;
            if (no_kl && k == 1) continue;
            ocase *c = &out[n++];
            memset(c, 0, sizeof *c);
            c->batch = batches[i];
            c->ref_model = i == 1;
            c->o.kind = SBP_OBJ_GRPO;
            c->o.grpo_loss = (sbp_grpo_loss)(g - 3);
            c->o.beta = no_kl ? 0 : 0.04;
            c->o.epsilon_low = 0.2;
            c->o.epsilon_high = c->o.grpo_loss == SBP_GRPO_DAPO ? 0.28 : 0.2;
            c->o.temperature = taus[k];
            c->o.max_completion_length = c->o.grpo_loss == SBP_GRPO_DR_GRPO && k == 0 ? 20 : 0;
            snprintf(c->name, sizeof c->name, "%s %s tau %g beta %g", group_names[g],
                     stem(c->batch), taus[k], c->o.beta);
        }
    return n;
}

/* ---------------------------------------------------------------------------------------------
 * Helpers */

static void load_model(sbp_model *m, const char *family, uint64_t seed, sbp_precision prec) {
    tu_load(m, NULL, tu_model(family, seed), NULL, prec);
}

static void load_batch(sbp_batch *b, const char *path, const sbp_config *cfg,
                       sbp_objective_kind kind) {
    sbp_err err = {0};
    if (sbp_batch_load_as(b, path, cfg, kind, 1, &err))
        ck_abort_msg("sbp_batch_load_as %s: %s", path, err.msg);
}

static double *alloc_doubles(size_t n) {
    double *p = calloc(n ? n : 1, sizeof *p);
    ck_assert_ptr_nonnull(p);
    return p;
}

static int row_targets(const sbp_batch *b, int r) {
    int n = 0;
    for (int t = 0; t + 1 < b->T; t++) n += b->labels[(size_t)r * b->T + t + 1] != SBP_IGNORE;
    return n;
}

/* ref_logprobs at temperature tau (allocated, B·T). */
static double *ref_logp(const sbp_model *m, const sbp_batch *b, double tau) {
    double *logp = alloc_doubles((size_t)b->B * b->T);
    sbp_err err = {0};
    if (ref_logprobs(logp, REF_NET(&m->cfg, &m->params, m->w), b, tau, &err))
        ck_abort_msg("ref_logprobs: %s", err.msg);
    return logp;
}

/* Fills b's reference values from per-target log-probs of the reference model (B·T, by
 * predicting position): DPO's row statistic (Σ, or the mean for ipo), or GRPO's per-token
 * values. Takes ownership of logp. */
static void set_reference(sbp_batch *b, const sbp_objective *o, double *logp) {
    if (o->kind == SBP_OBJ_DPO) {
        free(b->ref_seq_logps);
        b->ref_seq_logps = alloc_doubles((size_t)b->B);
        for (int r = 0; r < b->B; r++) {
            double s = 0;
            for (int t = 0; t < b->T; t++) s += logp[(size_t)r * b->T + t]; /* 0 off-target */
            b->ref_seq_logps[r] = o->dpo_loss == SBP_DPO_IPO ? s / row_targets(b, r) : s;
        }
        free(logp);
    } else {
        free(b->ref_logps);
        b->ref_logps = logp;
    }
}

static double tau_of(const sbp_objective *o) {
    return o->temperature == 0 ? 1 : o->temperature;
}

/* The batch of case c for ref: loaded, with reference values from ref_logprobs of refm. */
static void ref_case_batch(sbp_batch *b, const ocase *c, const sbp_model *m,
                           const sbp_model *refm /* fp64 */) {
    load_batch(b, c->batch, &m->cfg, c->o.kind);
    if (c->ref_model) set_reference(b, &c->o, ref_logp(refm, b, tau_of(&c->o)));
}

/* The same for src, with sbp_logprobs of refm (float64) for the reference values. */
static void src_case_batch(sbp_batch *b, const ocase *c, const sbp_model *m, const sbp_model *refm,
                           const char *what) {
    load_batch(b, c->batch, &m->cfg, c->o.kind);
    if (!c->ref_model) return;
    double *logp = alloc_doubles((size_t)b->B * b->T);
    sbp_grad_opts op = {.schedule = SBP_STREAM, .block = 4, .chunk = 8};
    sbp_err err = {0};
    if (sbp_logprobs(logp, refm, b, &op, tau_of(&c->o), NULL, &err))
        ck_abort_msg("%s: sbp_logprobs: %s", what, err.msg);
    set_reference(b, &c->o, logp);
}

static double *ref_grads(double *loss, const sbp_model *m, const sbp_batch *b,
                         const sbp_objective *o, const char *what) {
    double *g = alloc_doubles((size_t)m->params.total);
    sbp_err err = {0};
    ref_loss_fn fn = o->kind == SBP_OBJ_DPO ? ref_dpo : ref_grpo;
    if (fn(loss, g, REF_NET(&m->cfg, &m->params, m->w), b, o, &err))
        ck_abort_msg("%s: ref: %s", what, err.msg);
    return g;
}

static double ref_loss_only(const sbp_model *m, const double *w, const sbp_batch *b,
                            const sbp_objective *o) {
    double loss;
    sbp_err err = {0};
    ref_loss_fn fn = o->kind == SBP_OBJ_DPO ? ref_dpo : ref_grpo;
    if (fn(&loss, NULL, REF_NET(&m->cfg, &m->params, w), b, o, &err))
        ck_abort_msg("ref: %s", err.msg);
    return loss;
}

/* Worst rel. L2 over the parameters of a (model ma: float32 or float64) against g (float64);
 * fails naming the first parameter above tol. */
static double compare_grads(const sbp_model *ma, const void *a, const sbp_model *m64,
                            const double *g, double tol, const char *what) {
    double worst = 0;
    for (int i = 0; i < ma->params.n; i++) {
        const sbp_param *p = &ma->params.p[i];
        double e = tu_rel_l2(ma, a, m64, g, p);
        ck_assert_msg(e <= tol, "%s: %s rel. L2 %.3g > %.3g against ref", what, p->name, e, tol);
        worst = fmax(worst, e);
    }
    return worst;
}

static int all_finite(const double *g, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(g[i])) return 0;
    return 1;
}

/* ---------------------------------------------------------------------------------------------
 * 1. ref by finite differences */

typedef struct {
    const sbp_model *m;
    const sbp_batch *b;
    const sbp_objective *o;
} loss_ctx;

static double loss_at(const double *w, void *ctx) {
    const loss_ctx *c = ctx;
    return ref_loss_only(c->m, w, c->b, c->o);
}

/* Central differences of ref's loss against its gradient g on k random entries of every tensor
 * and the largest-|g| entry of each; fails outside FD_ATOL·max(1, |L|) + FD_RTOL·|g|. */
static void fd_check(const sbp_model *m, const sbp_batch *b, const sbp_objective *o,
                     const double *g, double loss, int k, uint64_t seed, const char *what) {
    char label[160];
    snprintf(label, sizeof label, "%s loss %.4g", what, loss);
    loss_ctx c = {m, b, o};
    tu_fd_check(&m->params, m->w, g, loss_at, &c, FD_STEP, FD_ATOL * fmax(1, fabs(loss)), FD_RTOL,
                k, seed, label);
}

/* GRPO's targets by branch of the clipped term (at w = the model's weights): ratio inside the
 * clip range; outside it with the unclipped term the minimum (gradient −A·ratio, A ≠ 0); outside
 * with the clipped term the minimum, or A = 0 (no gradient). Also the distance of log ratio from
 * the two kinks log(1 − ε_low), log(1 + ε_high), which must exceed what an FD step can move it. */
static void grpo_branches(int count[3], double *kink, const sbp_model *m, const sbp_batch *b,
                          const sbp_objective *o) {
    double *logp = ref_logp(m, b, tau_of(o));
    double lo = log(1 - o->epsilon_low), hi = log(1 + o->epsilon_high);
    count[0] = count[1] = count[2] = 0;
    *kink = INFINITY;
    for (int r = 0; r < b->B; r++)
        for (int t = 0; t + 1 < b->T; t++) {
            size_t i = (size_t)r * b->T + t;
            if (b->labels[i + 1] == SBP_IGNORE) continue;
            double lr = b->old_logps ? logp[i] - b->old_logps[i] : 0, A = b->advantages[r];
            *kink = fmin(*kink, fmin(fabs(lr - lo), fabs(lr - hi)));
            if (lr >= lo && lr <= hi)
                count[0]++;
            else
                count[A != 0 && (lr < lo) == (A > 0) ? 1 : 2]++;
        }
    free(logp);
}

static void fd_grpo_case(const char *family, const char *batch, sbp_objective o, int old_mode,
                         uint64_t seed) {
    sbp_model m;
    sbp_batch b;
    load_model(&m, family, POLICY_SEED, SBP_FP64);
    load_batch(&b, batch, &m.cfg, SBP_OBJ_GRPO);
    if (!b.ref_logps) { /* grpo-adv: reference values from the second model */
        sbp_model rm;
        load_model(&rm, family, REF_SEED, SBP_FP64);
        set_reference(&b, &o, ref_logp(&rm, &b, tau_of(&o)));
        sbp_model_free(&rm, NULL);
    }
    double loss, *g;
    char what[128];
    if (old_mode == 1) {
        /* old = logp + noise, noise in ±[0.01, 0.15], more than 3e-3 away from the kinks in log
         * space, so that ratios fall inside and on both sides of the clip range */
        double *logp = ref_logp(&m, &b, tau_of(&o)), lo = log(1 - o.epsilon_low),
               hi = log(1 + o.epsilon_high);
        sbp_rng rng;
        sbp_rng_seed(&rng, seed);
        for (size_t i = 0; i < (size_t)b.B * b.T; i++) {
            double nz;
            do {
                nz = (0.01 + 0.14 * sbp_rng_uniform(&rng)) * (sbp_rng_uniform(&rng) < 0.5 ? -1 : 1);
            } while (fabs(-nz - lo) < 3e-3 || fabs(-nz - hi) < 3e-3); /* log ratio = −noise */
            logp[i] += nz;
        }
        free(b.old_logps);
        b.old_logps = logp;
    } else if (old_mode == 2) {
        /* no old log-probs: old = logp detached, ratio exactly 1. The loss then does not move
         * with the weights through the ratio, so the differences use the frozen copy old =
         * logp(w), which has the same gradient at w; the two gradients must agree bitwise. */
        free(b.old_logps);
        b.old_logps = NULL;
        double l0, *g0 = ref_grads(&l0, &m, &b, &o, "no old");
        b.old_logps = ref_logp(&m, &b, tau_of(&o));
        g = ref_grads(&loss, &m, &b, &o, "frozen old");
        ck_assert_msg(memcmp(g0, g, sizeof *g * (size_t)m.params.total) == 0 && l0 == loss,
                      "GRPO without old log-probs differs from old = logp (frozen)");
        free(g0);
        free(g);
    }
    int count[3];
    double kink;
    grpo_branches(count, &kink, &m, &b, &o);
    ck_assert_msg(kink > 1e-3, "an FD point lies %.3g from a clip kink", kink);
    if (old_mode == 1)
        ck_assert_msg(count[0] && count[1] && count[2],
                      "clip branches not all exercised: %d inside, %d outside with gradient, %d "
                      "clipped",
                      count[0], count[1], count[2]);
    snprintf(what, sizeof what, "%s %s %s tau %g eps %g/%g%s", family, grpo_loss_name(o.grpo_loss),
             stem(batch), tau_of(&o), o.epsilon_low, o.epsilon_high,
             old_mode == 1   ? " old=logp+noise"
             : old_mode == 2 ? " no old"
                             : "");
    g = ref_grads(&loss, &m, &b, &o, what);
    printf("   %s: targets inside the clip range %d, outside with gradient %d, clipped %d; "
           "closest kink %.2e\n",
           what, count[0], count[1], count[2], kink);
    fd_check(&m, &b, &o, g, loss, 2, seed, what);
    free(g);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}

/* qwen3: grpo at τ 0.7 with the file's old and reference log-probs (ε 0.2: many ratios far
 * below 1 − ε); llama3: bnpo at τ 0.7, old = logp + noise with ε 0.05 (all three branches);
 * qwen3: dr_grpo at τ 1.3, noise again; llama3: dapo without old log-probs at τ 0.7 on grpo-adv
 * (reference from the second model). β = 0.04 throughout. */
START_TEST(fd_grpo) {
    sbp_objective o = {.kind = SBP_OBJ_GRPO, .beta = 0.04, .temperature = 0.7};
    switch (_i) {
    case 0:
        o.grpo_loss = SBP_GRPO_GRPO, o.epsilon_low = o.epsilon_high = 0.2;
        fd_grpo_case("qwen3-tiny", GRPO_TINY, o, 0, 400);
        break;
    case 1:
        o.grpo_loss = SBP_GRPO_BNPO, o.epsilon_low = o.epsilon_high = 0.05;
        fd_grpo_case("llama3-tiny", GRPO_TINY, o, 1, 401);
        break;
    case 2:
        o.grpo_loss = SBP_GRPO_DR_GRPO, o.epsilon_low = o.epsilon_high = 0.05;
        o.temperature = 1.3, o.max_completion_length = 30;
        fd_grpo_case("qwen3-tiny", GRPO_EQ, o, 1, 402);
        break;
    default:
        o.grpo_loss = SBP_GRPO_DAPO, o.epsilon_low = 0.2, o.epsilon_high = 0.28;
        fd_grpo_case("llama3-tiny", GRPO_ADV, o, 2, 403);
    }
}
END_TEST

/* DPO: sigmoid on dpo-tiny (its reference sums from the file) with ls 0 (qwen3) and 0.1
 * (llama3); ipo on dpo-noref with reference means from the second model (qwen3, llama3). */
START_TEST(fd_dpo) {
    static const char *fam[] = {"qwen3-tiny", "llama3-tiny", "qwen3-tiny", "llama3-tiny"};
    sbp_objective o = {.kind = SBP_OBJ_DPO, .beta = 0.1};
    o.dpo_loss = _i < 2 ? SBP_DPO_SIGMOID : SBP_DPO_IPO;
    o.label_smoothing = _i == 1 ? 0.1 : 0;
    const char *batch = _i < 2 ? DPO_TINY : DPO_NOREF;
    sbp_model m;
    sbp_batch b;
    load_model(&m, fam[_i], POLICY_SEED, SBP_FP64);
    load_batch(&b, batch, &m.cfg, SBP_OBJ_DPO);
    if (!b.ref_seq_logps) {
        sbp_model rm;
        load_model(&rm, fam[_i], REF_SEED, SBP_FP64);
        set_reference(&b, &o, ref_logp(&rm, &b, 1));
        sbp_model_free(&rm, NULL);
    }
    char what[128];
    snprintf(what, sizeof what, "%s dpo %s ls %g %s", fam[_i], dpo_loss_name(o.dpo_loss),
             o.label_smoothing, stem(batch));
    double loss, *g = ref_grads(&loss, &m, &b, &o, what);
    fd_check(&m, &b, &o, g, loss, 2, 500 + (uint64_t)_i, what);
    free(g);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* The pair losses by hand from ref_logprobs, against ref_dpo's loss: checks the statistic (sum
 * vs mean), the pairing (row p with row P+p) and the sign of z, which the FD test cannot see
 * (it only checks that the gradient is that of whatever ref_dpo computes). Likewise GRPO's
 * per-token loss on a hand-picked ratio per branch. */
START_TEST(loss_values) {
    sbp_model m;
    sbp_batch b;
    load_model(&m, "qwen3-tiny", POLICY_SEED, SBP_FP64);
    load_batch(&b, DPO_TINY, &m.cfg, SBP_OBJ_DPO);
    double *logp = ref_logp(&m, &b, 1);
    const int P = b.pairs;
    ck_assert_int_eq(P, 2);
    ck_assert_int_eq(b.B, 4);
    for (int ipo = 0; ipo < 2; ipo++) {
        sbp_objective o = {.kind = SBP_OBJ_DPO,
                           .dpo_loss = ipo ? SBP_DPO_IPO : SBP_DPO_SIGMOID,
                           .beta = 0.3,
                           .label_smoothing = ipo ? 0 : 0.2};
        double S[4], want = 0;
        for (int r = 0; r < 4; r++) {
            S[r] = 0;
            for (int t = 0; t < b.T; t++) S[r] += logp[r * b.T + t];
            if (ipo) S[r] /= row_targets(&b, r);
        }
        for (int p = 0; p < P; p++) {
            double z = S[p] - S[P + p] - (b.ref_seq_logps[p] - b.ref_seq_logps[P + p]);
            want += ipo ? (z - 1 / 0.6) * (z - 1 / 0.6)
                        : -0.8 * log(1 / (1 + exp(-0.3 * z))) - 0.2 * log(1 / (1 + exp(0.3 * z)));
        }
        want /= P;
        double got = ref_loss_only(&m, m.w, &b, &o);
        ck_assert_msg(fabs(got - want) <= 1e-13 * fabs(want), "DPO %s loss %.17g, by hand %.17g",
                      dpo_loss_name(o.dpo_loss), got, want);
    }
    free(logp);
    sbp_batch_free(&b);

    /* GRPO, one target per row (row 0: A = 2, row 1: A = −1), bnpo over 2 tokens, β = 0.5,
     * ε = 0.1/0.2. Row 0: log ratio +0.5 (ratio > 1.2, A > 0: clipped term is the min, ℓ =
     * −1.2·2); row 1: log ratio −0.5 (ratio < 0.9, A < 0: clipped min, ℓ = 0.9). KL with
     * d = ref − logp = 0.3 and −0.2. */
    load_batch(&b, GRPO_ADV, &m.cfg, SBP_OBJ_GRPO);
    sbp_batch one = {0};
    one.B = 2, one.T = b.T, one.kind = SBP_OBJ_GRPO;
    size_t n = (size_t)2 * b.T;
    one.ids = malloc(sizeof *one.ids * n), one.labels = malloc(sizeof *one.labels * n);
    one.mask = malloc(n);
    ck_assert(one.ids && one.labels && one.mask);
    memcpy(one.ids, b.ids, sizeof *one.ids * n);
    memcpy(one.mask, b.mask, n);
    int tt[2] = {-1, -1};
    for (size_t i = 0; i < n; i++) one.labels[i] = SBP_IGNORE;
    for (int r = 0; r < 2; r++)
        for (int t = 0; t + 1 < b.T && tt[r] < 0; t++)
            if (b.labels[r * b.T + t + 1] != SBP_IGNORE) {
                tt[r] = t;
                one.labels[r * b.T + t + 1] = b.labels[r * b.T + t + 1];
            }
    ck_assert(tt[0] >= 0 && tt[1] >= 0);
    one.advantages = alloc_doubles(2);
    one.advantages[0] = 2, one.advantages[1] = -1;
    double *lp = ref_logp(&m, &one, 1);
    one.old_logps = alloc_doubles(n), one.ref_logps = alloc_doubles(n);
    const double lr[2] = {0.5, -0.5}, d[2] = {0.3, -0.2};
    for (int r = 0; r < 2; r++) {
        size_t i = (size_t)r * b.T + tt[r];
        one.old_logps[i] = lp[i] - lr[r];
        one.ref_logps[i] = lp[i] + d[r];
    }
    sbp_objective o = {.kind = SBP_OBJ_GRPO,
                       .grpo_loss = SBP_GRPO_BNPO,
                       .beta = 0.5,
                       .epsilon_low = 0.1,
                       .epsilon_high = 0.2};
    double want = 0;
    want += -1.2 * 2 + 0.5 * (exp(0.3) - 0.3 - 1);
    want += 0.9 + 0.5 * (exp(-0.2) + 0.2 - 1);
    want /= 2;
    double got = ref_loss_only(&m, m.w, &one, &o);
    ck_assert_msg(fabs(got - want) <= 1e-12, "GRPO loss %.17g, by hand %.17g", got, want);
    free(lp);
    sbp_batch_free(&one);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* Bad input: an error with a message; loss and grads untouched. */
START_TEST(errors) {
    sbp_model m;
    sbp_batch d, g;
    load_model(&m, "qwen3-tiny", POLICY_SEED, SBP_FP64);
    load_batch(&d, DPO_TINY, &m.cfg, SBP_OBJ_DPO);
    load_batch(&g, GRPO_TINY, &m.cfg, SBP_OBJ_GRPO);
    size_t n = (size_t)m.params.total;
    double *gr = malloc(sizeof *gr * n), loss = 42;
    ck_assert_ptr_nonnull(gr);
    for (size_t i = 0; i < n; i++) gr[i] = 7;
    sbp_err err = {0};
    const sbp_objective dpo = {.kind = SBP_OBJ_DPO, .beta = 0.1};
    const sbp_objective grpo = {
        .kind = SBP_OBJ_GRPO, .beta = 0.04, .epsilon_low = 0.2, .epsilon_high = 0.2};
    sbp_objective o;
#define EXPECT(call, st, text)                                                                     \
    do {                                                                                           \
        err.msg[0] = '\0';                                                                         \
        ck_assert_int_eq((call), (st));                                                            \
        ck_assert_msg(strstr(err.msg, (text)) != NULL, "message \"%s\" lacks \"%s\"", err.msg,     \
                      (text));                                                                     \
    } while (0)
    /* DPO: a rejected row without targets */
    int32_t *lab = malloc(sizeof *lab * (size_t)d.B * d.T);
    ck_assert_ptr_nonnull(lab);
    memcpy(lab, d.labels, sizeof *lab * (size_t)d.B * d.T);
    for (int t = 0; t < d.T; t++) d.labels[3 * d.T + t] = SBP_IGNORE;
    EXPECT(ref_dpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &d, &dpo, &err), SBP_EINPUT,
           "rejected row 3 has no target");
    memcpy(d.labels, lab, sizeof *lab * (size_t)d.B * d.T);
    free(lab);
    /* DPO: no reference values; β ≤ 0; a temperature; label smoothing; GRPO objective */
    double *rs = d.ref_seq_logps;
    d.ref_seq_logps = NULL;
    EXPECT(ref_dpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &d, &dpo, &err), SBP_EINPUT,
           "no reference");
    d.ref_seq_logps = rs;
    o = dpo, o.beta = 0;
    EXPECT(ref_dpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &d, &o, &err), SBP_EUSAGE, "beta");
    o = dpo, o.temperature = 0.7;
    EXPECT(ref_dpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &d, &o, &err), SBP_EUSAGE,
           "temperature");
    o = dpo, o.label_smoothing = -0.1;
    EXPECT(ref_dpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &d, &o, &err), SBP_EUSAGE,
           "smoothing");
    EXPECT(ref_dpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &d, &grpo, &err), SBP_EUSAGE,
           "not DPO");
    /* DPO: rows that are not pairs */
    d.pairs = 1;
    EXPECT(ref_dpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &d, &dpo, &err), SBP_EINPUT,
           "pairs");
    d.pairs = 2;
    /* GRPO: β > 0 without reference log-probs; bad temperatures; bad ε; no advantages */
    double *rl = g.ref_logps;
    g.ref_logps = NULL;
    EXPECT(ref_grpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &g, &grpo, &err), SBP_EINPUT,
           "needs reference");
    g.ref_logps = rl;
    o = grpo, o.temperature = -1;
    EXPECT(ref_grpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &g, &o, &err), SBP_EUSAGE,
           "temperature");
    o.temperature = NAN;
    EXPECT(ref_grpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &g, &o, &err), SBP_EUSAGE,
           "temperature");
    o = grpo, o.epsilon_high = -0.1;
    EXPECT(ref_grpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &g, &o, &err), SBP_EUSAGE,
           "epsilon");
    o = grpo, o.beta = -1;
    EXPECT(ref_grpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &g, &o, &err), SBP_EUSAGE, "beta");
    EXPECT(ref_grpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &g, &dpo, &err), SBP_EUSAGE,
           "not GRPO");
    double *adv = g.advantages;
    g.advantages = NULL;
    EXPECT(ref_grpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &g, &grpo, &err), SBP_EINPUT,
           "no advantages");
    g.advantages = adv;
    /* GRPO dapo over a batch without completion tokens: 0/0 */
    for (size_t i = 0; i < (size_t)g.B * g.T; i++) g.labels[i] = SBP_IGNORE;
    o = grpo, o.grpo_loss = SBP_GRPO_DAPO;
    EXPECT(ref_grpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &g, &o, &err), SBP_EINPUT, "none");
#undef EXPECT
    ck_assert(loss == 42);
    for (size_t i = 0; i < n; i++) ck_assert(gr[i] == 7);
    /* the other loss types accept it: rows without targets contribute nothing */
    o = grpo, o.grpo_loss = SBP_GRPO_BNPO;
    ck_assert_int_eq(ref_grpo(&loss, gr, REF_NET(&m.cfg, &m.params, m.w), &g, &o, &err), 0);
    ck_assert(loss == 0);
    for (size_t i = 0; i < n; i++) ck_assert(gr[i] == 0);
    free(gr);
    sbp_batch_free(&d);
    sbp_batch_free(&g);
    sbp_model_free(&m, NULL);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * Gradient accumulation */

/* An empty batch shaped like proto (B rows of T tokens): every position padding (id 0, mask 0,
 * label −100, per-token log-probs 0), with the objective's arrays proto has. */
static void alloc_like(sbp_batch *dst, const sbp_batch *proto, int B, int T) {
    size_t n = (size_t)B * T;
    memset(dst, 0, sizeof *dst);
    dst->B = B, dst->T = T, dst->kind = proto->kind, dst->pairs = proto->pairs ? B / 2 : 0;
    dst->ids = calloc(n, sizeof *dst->ids);
    dst->labels = malloc(sizeof *dst->labels * n);
    dst->mask = calloc(n, 1);
    ck_assert(dst->ids && dst->labels && dst->mask);
    for (size_t i = 0; i < n; i++) dst->labels[i] = SBP_IGNORE;
    if (proto->ref_seq_logps) dst->ref_seq_logps = alloc_doubles((size_t)B);
    if (proto->advantages) dst->advantages = alloc_doubles((size_t)B);
    if (proto->old_logps) dst->old_logps = alloc_doubles(n);
    if (proto->ref_logps) dst->ref_logps = alloc_doubles(n);
}

/* Row sr of src into row dr of dst, its first min(T) positions. Per-token values are indexed by
 * the predicting position, so a cut row keeps those of the targets it keeps. */
static void copy_row(sbp_batch *dst, int dr, const sbp_batch *src, int sr) {
    int T = dst->T < src->T ? dst->T : src->T;
    size_t o = (size_t)dr * dst->T, i = (size_t)sr * src->T;
    memcpy(dst->ids + o, src->ids + i, sizeof *dst->ids * T);
    memcpy(dst->labels + o, src->labels + i, sizeof *dst->labels * T);
    memcpy(dst->mask + o, src->mask + i, (size_t)T);
    if (dst->ref_seq_logps) dst->ref_seq_logps[dr] = src->ref_seq_logps[sr];
    if (dst->advantages) dst->advantages[dr] = src->advantages[sr];
    if (dst->old_logps) memcpy(dst->old_logps + o, src->old_logps + i, sizeof(double) * T);
    if (dst->ref_logps) memcpy(dst->ref_logps + o, src->ref_logps + i, sizeof(double) * T);
}

/* dst = the rows `rows` (n) of src, cut to T tokens. */
static void take_rows(sbp_batch *dst, const sbp_batch *src, const int *rows, int n, int T) {
    alloc_like(dst, src, n, T);
    for (int k = 0; k < n; k++) copy_row(dst, k, src, rows[k]);
    sbp_batch_count_targets(dst);
}

/* dst = a and b as one batch, padded on the right to the longer T (which changes nothing before
 * the padding, under causal attention); DPO: a's chosen rows, b's chosen rows, then the rejected
 * rows in the same order. */
static void concat(sbp_batch *dst, const sbp_batch *a, const sbp_batch *b) {
    alloc_like(dst, a, a->B + b->B, a->T > b->T ? a->T : b->T);
    for (int r = 0; r < a->B; r++)
        copy_row(dst, a->pairs && r >= a->pairs ? r + b->pairs : r, a, r);
    for (int r = 0; r < b->B; r++)
        copy_row(dst, b->pairs ? (r < b->pairs ? a->pairs + r : a->B + r) : a->B + r, b, r);
    sbp_batch_count_targets(dst);
}

static double rel_l2(const double *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Gradient accumulation, case _i = 2·objective group + split:
 *   groups: DPO sigmoid, DPO ipo, GRPO grpo and bnpo, GRPO dr_grpo and dapo (τ 0.7, β 0.04,
 *   max_completion_length 20);
 *   split 0: one fixture in two micro-batches (DPO pair by pair; GRPO rows {0} and {1, 2, 3}, so
 *            that bnpo/dapo's token counts differ);
 *   split 1: two batches of different T (dpo-tiny and dpo-tiny cut to T = 18; grpo-tiny and
 *            grpo-equal-rewards cut to T = 16).
 * The whole batch is the concatenation. Checked: ref on the micro-batches with the step's
 * normalisers (num_sequences, num_items) sums to ref on the whole batch (≤ 1e-13: the same sums
 * regrouped), and src's sbp_grad_batches (float64, every schedule) matches it (≤ 1e-10). */
START_TEST(accumulation) {
    const int grp = _i / 2, split = _i % 2, is_dpo = grp < 2;
    sbp_model m;
    sbp_batch first, second, part[2], whole;
    load_model(&m, "llama3-tiny", POLICY_SEED, SBP_FP64);
    sbp_objective_kind kind = is_dpo ? SBP_OBJ_DPO : SBP_OBJ_GRPO;
    load_batch(&first, is_dpo ? DPO_TINY : GRPO_TINY, &m.cfg, kind);
    if (!split) {
        static const int dpo_rows[2][2] = {{0, 2}, {1, 3}}; /* pair p: rows p and P + p */
        static const int grpo_rows[2][3] = {{0}, {1, 2, 3}};
        for (int k = 0; k < 2; k++)
            take_rows(&part[k], &first, is_dpo ? dpo_rows[k] : grpo_rows[k], is_dpo ? 2 : 1 + 2 * k,
                      first.T);
    } else {
        static const int all[4] = {0, 1, 2, 3};
        load_batch(&second, is_dpo ? DPO_TINY : GRPO_EQ, &m.cfg, kind);
        take_rows(&part[0], &first, all, 4, first.T);
        take_rows(&part[1], &second, all, 4, is_dpo ? 18 : 16);
        sbp_batch_free(&second);
    }
    sbp_batch_free(&first);
    concat(&whole, &part[0], &part[1]);
    for (int l = 0; l < (is_dpo ? 1 : 2); l++) {
        sbp_objective o = {.beta = is_dpo ? 0.1 : 0.04, .epsilon_low = 0.2, .epsilon_high = 0.2};
        if (is_dpo) {
            o.kind = SBP_OBJ_DPO, o.dpo_loss = grp ? SBP_DPO_IPO : SBP_DPO_SIGMOID;
        } else {
            o.kind = SBP_OBJ_GRPO, o.grpo_loss = (sbp_grpo_loss)(2 * (grp - 2) + l);
            o.temperature = 0.7, o.max_completion_length = 20;
        }
        char what[96];
        snprintf(what, sizeof what, "%s %s, %s", is_dpo ? "DPO" : "GRPO",
                 is_dpo ? dpo_loss_name(o.dpo_loss) : grpo_loss_name(o.grpo_loss),
                 split ? "T 24 + shorter" : "one batch split");
        double L, *g = ref_grads(&L, &m, &whole, &o, what);
        sbp_objective step = o;
        step.num_sequences = is_dpo ? whole.pairs : whole.B;
        step.num_items = (double)whole.n_targets;
        double Lsum = 0, *gsum = alloc_doubles((size_t)m.params.total);
        for (int k = 0; k < 2; k++) {
            double Lk, *gk = ref_grads(&Lk, &m, &part[k], &step, what);
            Lsum += Lk;
            for (int64_t i = 0; i < m.params.total; i++) gsum[i] += gk[i];
            free(gk);
        }
        double eg = rel_l2(gsum, g, m.params.total), el = fabs(Lsum - L) / fabs(L);
        ck_assert_msg(eg <= 1e-13 && el <= 1e-13,
                      "%s: micro-batches %.3g (loss %.3g) from the whole batch", what, eg, el);
        double worst = 0; /* src: the whole step from the two micro-batches */
        for (int s = SBP_FULL; s <= SBP_STREAM; s++) {
            sbp_grad_opts op = {.schedule = (sbp_schedule)s,
                                .block = 4,
                                .chunk = s == SBP_STREAM ? 8 : 0,
                                .objective = o};
            sbp_grad_result r;
            sbp_err err = {0};
            if (sbp_grad_batches(&r, &m, part, 2, &op, NULL, &err))
                ck_abort_msg("%s: sbp_grad_batches (%s): %s", what,
                             sbp_schedule_name((sbp_schedule)s), err.msg);
            worst = fmax(worst, compare_grads(&m, r.grads, &m, g, SRC_TOL_FP64, what));
            ck_assert_msg(fabs(r.loss - L) <= SRC_LOSS_TOL_FP64 * fabs(L),
                          "%s: sbp_grad_batches loss %.17g vs ref %.17g", what, r.loss, L);
            sbp_grad_result_free(&r, NULL);
        }
        printf("accumulation %-32s ref: micro-batches vs whole, grads %.2e, loss %.2e; src "
               "sbp_grad_batches vs ref %.2e\n",
               what, eg, el, worst);
        fflush(stdout);
        free(g);
        free(gsum);
    }
    for (int k = 0; k < 2; k++) sbp_batch_free(&part[k]);
    sbp_batch_free(&whole);
    sbp_model_free(&m, NULL);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 2. src against ref */

typedef struct {
    double g64, l64, g32, l32;
    int runs;
} worst_seen;

static const sbp_schedule schedules[3] = {SBP_FULL, SBP_CKPT, SBP_STREAM};

/* The runs of one case, block 4 throughout: the three schedules with block-multiple chunks
 * (bitwise equal to full BP), ckpt with chunked logits (also a block multiple: bitwise), and a
 * ragged stream chunk and logits chunk (7, 5: within the tolerance only in fast numerics,
 * bitwise in portable numerics, where every run is). */
typedef struct {
    sbp_schedule s;
    int chunk, logit_chunk, chunked_logits, bitwise;
} sched;
static const sched runs[5] = {{SBP_FULL, 0, 0, 0, 1},
                              {SBP_CKPT, 0, 0, 0, 1},
                              {SBP_STREAM, 8, 0, 0, 1},
                              {SBP_CKPT, 0, 8, 1, 1},
                              {SBP_STREAM, 7, 5, 0, 0}};

/* One case on one family: ref once; src in both precisions and every run above. */
static void src_case(const char *family, const ocase *c, const sbp_model *m64, const sbp_model *m32,
                     const sbp_model *r64, worst_seen *ws) {
    char what[200];
    snprintf(what, sizeof what, "%.32s %.95s", family, c->name);
    sbp_batch rb, sb;
    ref_case_batch(&rb, c, m64, r64);
    double L, *g = ref_grads(&L, m64, &rb, &c->o, what);
    ck_assert_msg(all_finite(g, m64->params.total) && isfinite(L), "%s: ref not finite", what);
    src_case_batch(&sb, c, m64, r64, what);
    if (c->ref_model) { /* src's and ref's reference values: the same forward pass */
        size_t n = c->o.kind == SBP_OBJ_DPO ? (size_t)rb.B : (size_t)rb.B * rb.T;
        const double *x = c->o.kind == SBP_OBJ_DPO ? sb.ref_seq_logps : sb.ref_logps;
        const double *y = c->o.kind == SBP_OBJ_DPO ? rb.ref_seq_logps : rb.ref_logps;
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(fabs(x[i] - y[i]) <= 1e-12 * fmax(1, fabs(y[i])),
                          "%s: sbp_logprobs %.17g vs ref_logprobs %.17g at %zu", what, x[i], y[i],
                          i);
    }
    for (int pn = 0; pn < 4; pn++) {
        const int prec = pn % 2, portable = pn / 2;
        const sbp_model *m = prec ? m32 : m64;
        sbp_grad_result first = {0};
        for (int k = 0; k < 5; k++) {
            const sched *rs = &runs[k];
            char w2[300];
            snprintf(w2, sizeof w2, "%s %s %s %s chunk %d logit chunk %d%s", what,
                     prec ? "fp32" : "fp64", portable ? "portable" : "fast",
                     sbp_schedule_name(rs->s), rs->chunk, rs->logit_chunk,
                     rs->chunked_logits ? " (chunked)" : "");
            sbp_grad_opts op = {.schedule = rs->s,
                                .block = 4,
                                .chunk = rs->chunk,
                                .logit_chunk = rs->logit_chunk,
                                .chunked_logits = rs->chunked_logits,
                                .objective = c->o,
                                .numerics = portable ? SBP_NUMERICS_PORTABLE : SBP_NUMERICS_FAST};
            sbp_grad_result r;
            sbp_err err = {0};
            if (sbp_grad(&r, m, &sb, &op, NULL, &err))
                ck_abort_msg("%s: sbp_grad: %s", w2, err.msg);
            ck_assert_int_eq(r.n_targets, sb.n_targets);
            double tol = prec ? SRC_TOL_FP32 : SRC_TOL_FP64;
            double e = compare_grads(m, r.grads, m64, g, tol, w2);
            double le = fabs(r.loss - L) / fabs(L);
            ck_assert_msg(le <= (prec ? SRC_TOL_FP32 : SRC_LOSS_TOL_FP64),
                          "%s: loss %.17g vs ref %.17g (rel. %.3g)", w2, r.loss, L, le);
            if (prec) {
                ws->g32 = fmax(ws->g32, e), ws->l32 = fmax(ws->l32, le);
            } else {
                ws->g64 = fmax(ws->g64, e), ws->l64 = fmax(ws->l64, le);
            }
            ws->runs++;
            if (k == 0) {
                first = r;
                continue;
            }
            if (rs->bitwise || portable) {
                int i = tu_first_diff(m, first.grads, r.grads);
                ck_assert_msg(i < 0, "%s: gradient of %s differs bitwise from full BP", w2,
                              i < 0 ? "" : m->params.p[i].name);
                ck_assert_msg(memcmp(&first.loss, &r.loss, sizeof r.loss) == 0,
                              "%s: loss %.17g differs bitwise from full BP's %.17g", w2, r.loss,
                              first.loss);
            }
            sbp_grad_result_free(&r, NULL);
        }
        sbp_grad_result_free(&first, NULL);
    }
    free(g);
    sbp_batch_free(&rb);
    sbp_batch_free(&sb);
}

/* One objective / loss type (group _i / NFAM) on one family (_i % NFAM), all its batches. */
START_TEST(src_against_ref) {
    const int gi = _i / NFAM;
    const char *family = families[_i % NFAM];
    ocase cases[16];
    int n = group_cases(gi, cases);
    worst_seen ws = {0};
    sbp_model m64, m32, r64;
    load_model(&m64, family, POLICY_SEED, SBP_FP64);
    load_model(&m32, family, POLICY_SEED, SBP_FP32);
    load_model(&r64, family, REF_SEED, SBP_FP64);
    for (int k = 0; k < n; k++) src_case(family, &cases[k], &m64, &m32, &r64, &ws);
    sbp_model_free(&m64, NULL);
    sbp_model_free(&m32, NULL);
    sbp_model_free(&r64, NULL);
    printf("src vs ref %-18s %-11s (%3d runs): fp64 worst rel. L2 %.2e, loss %.2e; fp32 %.2e, "
           "loss %.2e; full = ckpt = stream bitwise (fast: block multiples; portable: all)\n",
           group_names[gi], family, ws.runs, ws.g64, ws.l64, ws.g32, ws.l32);
    fflush(stdout);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 3. PyTorch cross-check */

/* The torch_grads.py arguments of case c on family f (output path in out). */
static void torch_args(char *buf, size_t cap, const char *family, const ocase *c, char *out,
                       size_t outcap, int idx) {
    snprintf(out, outcap, "%s/torch-obj-%s-%d.safetensors", tu_tmpdir(), family, idx);
    const sbp_objective *o = &c->o;
    int k = snprintf(buf, cap, "--model '%s' --batch '%s' --out '%s' --threads 1 --beta %.17g",
                     tu_model(family, POLICY_SEED), c->batch, out, o->beta);
    if (o->kind == SBP_OBJ_DPO)
        k += snprintf(buf + k, cap - (size_t)k,
                      " --objective dpo --loss-type %s --label-smoothing %.17g",
                      dpo_loss_name(o->dpo_loss), o->label_smoothing);
    else
        k += snprintf(buf + k, cap - (size_t)k,
                      " --objective grpo --loss-type %s --epsilon-low %.17g --epsilon-high %.17g "
                      "--temperature %.17g",
                      grpo_loss_name(o->grpo_loss), o->epsilon_low, o->epsilon_high, tau_of(o));
    if (o->max_completion_length > 0)
        k += snprintf(buf + k, cap - (size_t)k, " --max-completion-length %d",
                      o->max_completion_length);
    if (c->ref_model)
        snprintf(buf + k, cap - (size_t)k, " --ref-model '%s'", tu_model(family, REF_SEED));
}

/* ref against one torch_grads.py output file; returns the worst rel. L2, *loss_err the loss's. */
static double against_torch(const char *path, const sbp_model *m, const double *g, double L,
                            double *loss_err, const char *what) {
    sbp_st_file sf;
    sbp_err err = {0};
    if (sbp_st_open(&sf, path, &err)) ck_abort_msg("%s: %s", what, err.msg);
    const char *ls = sbp_st_meta(&sf, "loss");
    ck_assert_msg(ls != NULL, "%s: no loss in __metadata__", path);
    *loss_err = fabs(strtod(ls, NULL) - L) / fabs(L);
    ck_assert_msg(*loss_err <= SRC_LOSS_TOL_FP64, "%s: torch loss %s vs ref %.17g", what, ls, L);
    double worst = 0;
    for (int i = 0; i < m->params.n; i++) {
        const sbp_param *p = &m->params.p[i];
        const sbp_st_tensor *t = sbp_st_find(&sf, p->name);
        ck_assert_msg(t != NULL && t->numel == p->numel, "%s: tensor %s", path, p->name);
        double *tg = alloc_doubles((size_t)p->numel);
        if (sbp_st_read(&sf, t, tg, SBP_DT_F64, &err)) ck_abort_msg("%s", err.msg);
        double e = rel_l2(tg, g + p->offset, p->numel);
        ck_assert_msg(e <= TORCH_TOL, "%s: %s rel. L2 torch vs ref %.3g > %.3g", what, p->name, e,
                      TORCH_TOL);
        worst = fmax(worst, e);
        free(tg);
    }
    sbp_st_close(&sf);
    return worst;
}

/* Every case of every group on both families: one torch process (--jobs) writes all the gradient
 * files, then each is compared with ref. */
START_TEST(torch_cross_check) {
    if (!tu_python_has("/usr/bin/python3", "torch")) {
        printf("SKIPPED: PyTorch not installed (python3-torch); DPO/GRPO cross-check not run\n");
        fflush(stdout);
        return;
    }
    static ocase cases[NGROUPS][16];
    int ncase[NGROUPS];
    char jobs[600], line[2048], out[700];
    snprintf(jobs, sizeof jobs, "%s/torch-obj-jobs.txt", tu_tmpdir());
    FILE *f = fopen(jobs, "w");
    ck_assert_ptr_nonnull(f);
    int idx = 0;
    for (int gi = 0; gi < NGROUPS; gi++) {
        ncase[gi] = group_cases(gi, cases[gi]);
        for (int fam = 0; fam < NFAM; fam++)
            for (int k = 0; k < ncase[gi]; k++, idx++) {
                torch_args(line, sizeof line, families[fam], &cases[gi][k], out, sizeof out, idx);
                fprintf(f, "%s\n", line);
            }
    }
    fclose(f);
    int rc = tu_sh("/usr/bin/python3 verify/torch_grads.py --jobs '%s'", jobs);
    ck_assert_msg(rc == 0, "torch_grads.py --jobs failed (%d): %s", rc, tu_last_output());
    idx = 0;
    for (int gi = 0; gi < NGROUPS; gi++) {
        double worst = 0, worst_loss = 0;
        for (int fam = 0; fam < NFAM; fam++) {
            sbp_model m, rm;
            load_model(&m, families[fam], POLICY_SEED, SBP_FP64);
            load_model(&rm, families[fam], REF_SEED, SBP_FP64);
            for (int k = 0; k < ncase[gi]; k++, idx++) {
                const ocase *c = &cases[gi][k];
                char what[200];
                snprintf(what, sizeof what, "%s %s", families[fam], c->name);
                torch_args(line, sizeof line, families[fam], c, out, sizeof out, idx);
                sbp_batch b;
                ref_case_batch(&b, c, &m, &rm);
                double L, le, *g = ref_grads(&L, &m, &b, &c->o, what);
                worst = fmax(worst, against_torch(out, &m, g, L, &le, what));
                worst_loss = fmax(worst_loss, le);
                free(g);
                sbp_batch_free(&b);
            }
            sbp_model_free(&m, NULL);
            sbp_model_free(&rm, NULL);
        }
        printf("ref vs torch %-18s (%2d cases): worst per-parameter rel. L2 %.2e, loss %.2e\n",
               group_names[gi], NFAM * ncase[gi], worst, worst_loss);
    }
    fflush(stdout);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 4. Equal rewards */

/* grpo-equal-rewards: rewards (0.5, 0.5 | 1, 0) in groups of 2. The first group's advantages are
 * exactly 0 (r − mean = 0, and 0 / (0 + 1e-4) = 0); the second's are ±0.5 / (std + 1e-4) with the
 * unbiased std sqrt(0.5), or ±0.5 unscaled. The gradient is finite in ref and in src (all
 * schedules), and only the KL term (β > 0) moves the first group's rows. */
START_TEST(equal_rewards) {
    sbp_model m;
    load_model(&m, families[_i], POLICY_SEED, SBP_FP64);
    for (int scale = 0; scale < 2; scale++) {
        sbp_batch b;
        sbp_err err = {0};
        if (sbp_batch_load_as(&b, GRPO_EQ, &m.cfg, SBP_OBJ_GRPO, scale, &err))
            ck_abort_msg("%s", err.msg);
        ck_assert_int_eq(b.B, 4);
        ck_assert_msg(b.advantages[0] == 0 && b.advantages[1] == 0,
                      "equal rewards: advantages %.17g, %.17g, expected 0", b.advantages[0],
                      b.advantages[1]);
        double want = scale ? 0.5 / (sqrt(0.5) + 1e-4) : 0.5;
        ck_assert_msg(
            fabs(b.advantages[2] - want) <= 1e-15 && fabs(b.advantages[3] + want) <= 1e-15,
            "advantages %.17g, %.17g, expected ±%.17g", b.advantages[2], b.advantages[3], want);
        for (int beta = 0; beta < 2; beta++) {
            sbp_objective o = {.kind = SBP_OBJ_GRPO,
                               .beta = beta ? 0.04 : 0,
                               .epsilon_low = 0.2,
                               .epsilon_high = 0.2,
                               .temperature = 0.7};
            double L, *g = ref_grads(&L, &m, &b, &o, "equal rewards");
            ck_assert(isfinite(L) && all_finite(g, m.params.total));
            if (!beta) { /* without KL, rows 0 and 1 carry no gradient: ref on rows 2, 3 alone
                          * (with the step's row count) gives the same */
                static const int rows[2] = {2, 3};
                sbp_batch half;
                take_rows(&half, &b, rows, 2, b.T);
                sbp_objective oh = o;
                oh.num_sequences = 4;
                double Lh, *gh = ref_grads(&Lh, &m, &half, &oh, "equal rewards, rows 2-3");
                ck_assert_msg(rel_l2(gh, g, m.params.total) <= 1e-14,
                              "rows with zero advantage move the gradient");
                free(gh);
                sbp_batch_free(&half);
            }
            for (int k = 0; k < 3; k++) {
                sbp_grad_opts op = {.schedule = schedules[k],
                                    .block = 4,
                                    .chunk = schedules[k] == SBP_STREAM ? 8 : 0,
                                    .objective = o};
                sbp_grad_result r;
                if (sbp_grad(&r, &m, &b, &op, NULL, &err))
                    ck_abort_msg("equal rewards, %s: sbp_grad: %s", sbp_schedule_name(schedules[k]),
                                 err.msg);
                ck_assert(isfinite(r.loss) && all_finite(r.grads, m.params.total));
                compare_grads(&m, r.grads, &m, g, SRC_TOL_FP64, "equal rewards");
                sbp_grad_result_free(&r, NULL);
            }
            free(g);
        }
        sbp_batch_free(&b);
    }
    sbp_model_free(&m, NULL);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("objectives");
    TCase *ref = tcase_create("ref");
    tcase_set_timeout(ref, 300);
    tcase_add_loop_test(ref, fd_dpo, 0, 4);
    tcase_add_loop_test(ref, fd_grpo, 0, 4);
    tcase_add_test(ref, loss_values);
    tcase_add_test(ref, errors);
    tcase_add_loop_test(ref, accumulation, 0, 8);
    suite_add_tcase(s, ref);
    TCase *torch = tcase_create("torch");
    tcase_set_timeout(torch, 300);
    tcase_add_test(torch, torch_cross_check);
    suite_add_tcase(s, torch);
    TCase *src = tcase_create("src against ref");
    tcase_set_timeout(src, 300);
    tcase_add_loop_test(src, src_against_ref, 0, NGROUPS * NFAM);
    tcase_add_loop_test(src, equal_rewards, 0, NFAM);
    suite_add_tcase(s, src);
    return s;
}

/* One thread: the objectives run outside the parallel kernels (whose thread-count independence
 * tests/test_schedules.c checks), the tiny models gain nothing from threads, and on a loaded
 * machine libgomp's spin-waiting made the two-thread runs of this suite 50× slower (418 s
 * instead of 9 s for "src against ref" with two copies running on two cores). */
int main(void) {
    sbp_set_threads(1);
    return tu_run_suite(suite());
}
