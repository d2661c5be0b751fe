/* objective.c — SFT, DPO and GRPO as per-token terms (see objective.h, ref/SEMANTICS.md). */
#include "objective.h"
#include "err.h"
#include "pmath.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int is_target(const sbp_batch *b, int bi, int t) {
    return t + 1 < b->T && b->labels[(size_t)bi * b->T + t + 1] != SBP_IGNORE;
}

static int row_targets(const sbp_batch *b, int bi) {
    int n = 0;
    for (int t = 0; t + 1 < b->T; t++) n += is_target(b, bi, t);
    return n;
}

static int finite_nonneg(double x) {
    return isfinite(x) && x >= 0;
}

static sbp_status begin_dpo(sbp_obj_eval *ev, const sbp_objective *o, const sbp_batch *b,
                            sbp_err *err) {
    if (b->kind != SBP_OBJ_DPO || b->pairs < 1 || b->B != 2 * b->pairs)
        return sbp_fail(err, SBP_EINPUT,
                        "the DPO objective needs a DPO batch (chosen_* and "
                        "rejected_* tensors)");
    if (!(o->beta > 0) || !isfinite(o->beta))
        return sbp_fail(err, SBP_EUSAGE, "DPO needs beta > 0 and finite (got %g)", o->beta);
    if (!finite_nonneg(o->label_smoothing) || o->label_smoothing > 0.5)
        return sbp_fail(err, SBP_EUSAGE, "label smoothing must be in [0, 0.5], as in TRL (got %g)",
                        o->label_smoothing);
    if (!b->ref_seq_logps)
        return sbp_fail(err, SBP_EINPUT,
                        "DPO needs reference log-probs: ref_chosen_logps and "
                        "ref_rejected_logps in the batch, or a reference model");
    for (int r = 0; r < b->B; r++)
        if (row_targets(b, r) == 0)
            return sbp_fail(err, SBP_EINPUT,
                            "DPO pair %d: the %s sequence has no completion "
                            "token (every label is -100)",
                            r % b->pairs, r < b->pairs ? "chosen" : "rejected");
    ev->needs_logps = 1;
    return SBP_OK;
}

static sbp_status begin_grpo(sbp_obj_eval *ev, const sbp_objective *o, const sbp_batch *b,
                             sbp_err *err) {
    if (b->kind != SBP_OBJ_GRPO || !b->advantages)
        return sbp_fail(err, SBP_EINPUT,
                        "the GRPO objective needs a GRPO batch (completion_mask "
                        "and advantages or rewards)");
    if (!finite_nonneg(o->beta))
        return sbp_fail(err, SBP_EUSAGE, "the KL coefficient beta must be >= 0 and finite (got %g)",
                        o->beta);
    if (!finite_nonneg(o->epsilon_low) || !finite_nonneg(o->epsilon_high))
        return sbp_fail(err, SBP_EUSAGE, "epsilon_low and epsilon_high must be >= 0 (got %g, %g)",
                        o->epsilon_low, o->epsilon_high);
    if (o->beta > 0 && !b->ref_logps)
        return sbp_fail(err, SBP_EINPUT,
                        "the KL term (beta %g > 0) needs reference log-probs: "
                        "ref_logps in the batch, or a reference model",
                        o->beta);
    if (o->grpo_loss == SBP_GRPO_DR_GRPO && o->max_completion_length < 0)
        return sbp_fail(err, SBP_EUSAGE, "max_completion_length must be >= 1");
    double rows = o->num_sequences > 0 ? o->num_sequences : b->B;
#ifdef SBP_PLANT_MICRO_BNPO
    double tokens =
        (double)b->n_targets; /* planted bug (tests/test_plant.c); never in a normal build */
#else
    double tokens = o->num_items > 0 ? o->num_items : (double)b->n_targets;
#endif
#ifdef SBP_PLANT_MICRO_DR_GRPO_LMAX
    int lmax = b->T; /* planted bug (tests/test_plant.c); never in a normal build */
#else
    int lmax = o->max_completion_length > 0 ? o->max_completion_length : b->T;
#endif
    if (o->grpo_loss == SBP_GRPO_DAPO && tokens == 0)
        return sbp_fail(err, SBP_EINPUT,
                        "dapo divides by the completion tokens of the step, and "
                        "there are none (TRL would divide 0 by 0)");
    for (int r = 0; r < b->B; r++) {
        int n = row_targets(b, r);
        ev->row_w[r] = o->grpo_loss == SBP_GRPO_GRPO ? 1.0 / (rows * (n > 1 ? n : 1)) : 0;
    }
    if (o->grpo_loss == SBP_GRPO_BNPO)
        ev->w = 1.0 / (tokens > 1 ? tokens : 1); /* clamp(min=1) */
    else if (o->grpo_loss == SBP_GRPO_DAPO)
        ev->w = 1.0 / tokens;
    else if (o->grpo_loss == SBP_GRPO_DR_GRPO)
        ev->w = 1.0 / (rows * lmax);
    return SBP_OK;
}

sbp_status sbp_obj_begin(sbp_obj_eval *ev, const sbp_objective *o, const sbp_batch *b,
                         sbp_err *err) {
    memset(ev, 0, sizeof *ev);
    ev->o = o, ev->b = b;
    double tau = o->temperature ? o->temperature : 1;
    if (!(tau > 0) || !isfinite(tau))
        return sbp_fail(err, SBP_EUSAGE, "the temperature must be > 0 and finite (got %g)", tau);
    if (o->kind != SBP_OBJ_GRPO && tau != 1)
        return sbp_fail(err, SBP_EUSAGE, "a temperature applies to GRPO only");
    ev->inv_tau = 1 / tau;
    if (!(o->num_items >= 0) || !isfinite(o->num_items) || o->num_sequences < 0)
        return sbp_fail(err, SBP_EUSAGE, "the step normalisers must be >= 0");
    if (!(ev->row_w = calloc((size_t)b->B, sizeof *ev->row_w)))
        return sbp_fail(err, SBP_ENOMEM, "out of memory");
    sbp_status st = SBP_OK;
    if (o->kind == SBP_OBJ_SFT) {
#ifdef SBP_PLANT_MICRO_SFT_NORMALISER
        double n =
            (double)b->n_targets; /* planted bug (tests/test_plant.c); never in a normal build */
#else
        double n = o->num_items > 0 ? o->num_items : (double)b->n_targets;
#endif
        if (n == 0)
            st = sbp_fail(err, SBP_EINPUT,
                          b->T == 1 ? "the batch has no valid target: with T = 1 no position has "
                                      "a next token to predict"
                                    : "the batch has no valid target: every shifted label is "
                                      "-100, so the mean loss is undefined (HF would return NaN)");
        ev->w = n > 0 ? 1 / n : 0;
    } else if (o->kind == SBP_OBJ_DPO) {
        st = begin_dpo(ev, o, b, err);
    } else if (o->kind == SBP_OBJ_GRPO) {
        st = begin_grpo(ev, o, b, err);
    } else {
        st = sbp_fail(err, SBP_EUSAGE, "unknown objective %d", (int)o->kind);
    }
    if (st) sbp_obj_end(ev);
    return st;
}

static double log_sigmoid(double x) {
    return x >= 0 ? -sbp_plog1p(sbp_pexp(-x)) : x - sbp_plog1p(sbp_pexp(x));
}
static double sigmoid(double x) {
    return x >= 0 ? 1 / (1 + sbp_pexp(-x)) : sbp_pexp(x) / (1 + sbp_pexp(x));
}

void sbp_obj_prepare(sbp_obj_eval *ev, double *loss, const double *logp_all) {
    const sbp_objective *o = ev->o;
    const sbp_batch *b = ev->b;
    const int P = b->pairs, T = b->T;
    const double pairs = o->num_sequences > 0 ? o->num_sequences : P, beta = o->beta,
                 ls = o->label_smoothing;
    double *S = calloc((size_t)b->B, sizeof *S);
    int ipo = o->dpo_loss == SBP_DPO_IPO;
    for (int r = 0; r < b->B; r++) { /* the row statistic: sum (sigmoid) or mean (ipo) */
        int n = 0;
        for (int t = 0; t + 1 < T; t++)
            if (is_target(b, r, t)) S[r] += logp_all[(size_t)r * T + t], n++;
        if (ipo) S[r] /= n;
    }
    for (int p = 0; p < P; p++) {
        double z = (S[p] - S[P + p]) - (b->ref_seq_logps[p] - b->ref_seq_logps[P + p]), l, dz;
        if (ipo) {
            double d = z - 1 / (2 * beta);
            l = d * d, dz = 2 * d;
        } else {
            l = -(1 - ls) * log_sigmoid(beta * z) - ls * log_sigmoid(-beta * z);
            dz = -beta * (1 - ls) * sigmoid(-beta * z) + beta * ls * sigmoid(beta * z);
        }
        *loss += l / pairs;
        /* dL/dlogp of a target of row r: ±dℓ/dz / pairs (÷ n_r for ipo's mean) */
        ev->row_w[p] = dz / pairs / (ipo ? row_targets(b, p) : 1);
        ev->row_w[P + p] = -dz / pairs / (ipo ? row_targets(b, P + p) : 1);
    }
    free(S);
}

/* GRPO's per-token loss ℓ and dℓ/dlogp (ref/SEMANTICS.md). */
static double grpo_token(const sbp_objective *o, double logp, double old, double ref, double A,
                         double *dl) {
    double ratio = sbp_pexp(logp - old);
#ifdef SBP_PLANT_CLIP_ONE_EPSILON
    double clipped =
        fmin(fmax(ratio, 1 - o->epsilon_low),
             1 + o->epsilon_low); /* planted bug (tests/test_plant.c); never in a normal build */
#else
    double clipped = fmin(fmax(ratio, 1 - o->epsilon_low), 1 + o->epsilon_high);
#endif
    double un = ratio * A, cl = clipped * A;
    double l = -(un <= cl ? un : cl);
    *dl = un <= cl ? -A * ratio : 0; /* a tie (inside the clip range) passes the full gradient */
    if (o->beta > 0) {
        double d = ref - logp;
        l += o->beta * (sbp_pexp(d) - d - 1);
        *dl += o->beta * (1 - sbp_pexp(d));
    }
    return l;
}

void sbp_obj_terms(const sbp_obj_eval *ev, double *loss, double *coef, int bi, int s, int M,
                   const double *logp) {
    const sbp_objective *o = ev->o;
    const sbp_batch *b = ev->b;
    for (int r = 0; r < M; r++) {
        const int t = s + r;
        const size_t at = (size_t)bi * b->T + t;
        coef[r] = 0;
        if (!is_target(b, bi, t)) continue;
        if (o->kind == SBP_OBJ_SFT) { /* L = Σ w·(−logp) / N */
            double w = (o->target_weight ? o->target_weight[at] : 1.0) * ev->w;
            *loss -= w * logp[r];
            coef[r] = -w;
        } else if (o->kind == SBP_OBJ_DPO) { /* the loss was added by sbp_obj_prepare */
            coef[r] = ev->row_w[bi];
        } else {
            double old = b->old_logps ? b->old_logps[at] : logp[r];
            double ref = b->ref_logps ? b->ref_logps[at] : 0, dl;
            double l = grpo_token(o, logp[r], old, ref, b->advantages[bi], &dl);
            double w = o->grpo_loss == SBP_GRPO_GRPO ? ev->row_w[bi] : ev->w;
            *loss += w * l;
            coef[r] = w * dl;
        }
    }
}

void sbp_obj_end(sbp_obj_eval *ev) {
    free(ev->row_w);
    ev->row_w = NULL;
}

static const char *const kind_names[] = {"sft", "dpo", "grpo"}; /* by sbp_objective_kind */
static const char *const dpo_names[] = {"sigmoid", "ipo"};      /* by sbp_dpo_loss */
static const char *const grpo_names[] = {"grpo", "bnpo", "dr_grpo", "dapo"}; /* by sbp_grpo_loss */

const char *sbp_obj_kind_name(sbp_objective_kind k) {
    return k == SBP_OBJ_DPO ? kind_names[1] : k == SBP_OBJ_GRPO ? kind_names[2] : kind_names[0];
}

const char *sbp_obj_loss_name(const sbp_objective *o) {
    return o->kind == SBP_OBJ_DPO    ? dpo_names[o->dpo_loss]
           : o->kind == SBP_OBJ_GRPO ? grpo_names[o->grpo_loss]
                                     : "-";
}

int sbp_obj_kind_parse(sbp_objective_kind *k, const char *name) {
    static const sbp_objective_kind kinds[] = {SBP_OBJ_SFT, SBP_OBJ_DPO, SBP_OBJ_GRPO};
    for (int i = 0; i < 3; i++)
        if (strcmp(name, kind_names[i]) == 0) return *k = kinds[i], 1;
    return 0;
}

int sbp_obj_loss_parse(sbp_objective *o, const char *name) {
    if (o->kind == SBP_OBJ_DPO)
        for (int i = 0; i < 2; i++)
            if (strcmp(name, dpo_names[i]) == 0) return o->dpo_loss = (sbp_dpo_loss)i, 1;
    if (o->kind == SBP_OBJ_GRPO)
        for (int i = 0; i < 4; i++)
            if (strcmp(name, grpo_names[i]) == 0) return o->grpo_loss = (sbp_grpo_loss)i, 1;
    return 0;
}
