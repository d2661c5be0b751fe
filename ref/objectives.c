/* objectives.c — DPO and GRPO in the float64 oracle (see ref.h and ref/SEMANTICS.md, "DPO",
 * "GRPO" and "Gradient accumulation").
 *
 * Both objectives are functions of the per-target log-probabilities logp[b,t] alone, so each is
 * computed in two steps: ref_logprobs gives every logp; the loss and c[b,t] = dL/dlogp[b,t]
 * follow from the formulas below in plain scalar code; and ref_backward turns Σ c·logp into the
 * parameter gradient (c is a constant there, which is exactly the chain rule through logp). */
#include "ref.h"
#include "../src/core/err.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The target of position t is labels[t+1] (the causal-LM shift); 0 when there is none. */
static int has_target(const sbp_batch *b, int r, int t) {
    return t + 1 < b->T && b->labels[(size_t)r * b->T + t + 1] != SBP_IGNORE;
}

/* n_r: the number of targets of row r (for GRPO: its completion tokens). */
static int row_targets(const sbp_batch *b, int r) {
    int n = 0;
    for (int t = 0; t < b->T; t++) n += has_target(b, r, t);
    return n;
}

/* log σ(x) = −log(1 + e^(−x)), written so that e^(·) never overflows:
 * x ≥ 0: −log1p(e^(−x));  x < 0: x − log1p(e^x). */
static double log_sigmoid(double x) {
    return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x));
}

/* σ(x) = 1/(1 + e^(−x)), likewise without overflow. */
static double sigmoid(double x) {
    if (x >= 0) return 1 / (1 + exp(-x));
    double e = exp(x);
    return e / (1 + e);
}

/* logp at temperature tau into a new array *out (B·T); *out stays NULL on failure. */
static int logprobs(double **out, const ref_net *net, const sbp_batch *b, double tau,
                    sbp_err *err) {
    size_t n = (size_t)b->B * b->T;
    double *logp = malloc(sizeof *logp * (n ? n : 1));
    *out = NULL;
    if (!logp) return sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    int st = REF_NAME(ref_logprobs)(logp, net, b, tau, err);
    if (st) {
        free(logp);
        return st;
    }
    *out = logp;
    return SBP_OK;
}

/* grads ← d/dw Σ coef·logp (zeroed first); nothing when grads is NULL. */
static int backward(double *grads, const double *coef, const ref_net *net, const sbp_batch *b,
                    double tau, sbp_err *err) {
    if (!grads) return SBP_OK;
    memset(grads, 0, sizeof *grads * (size_t)ref_grad_total(net));
    return REF_NAME(ref_backward)(grads, coef, net, b, tau, err);
}

/* ---------------------------------------------------------------------------------------------
 * SFT */

/* loss = −(1/N) Σ logp over the N targets, so dL/dlogp = −1/N for every target: the backward of
 * Σ coef·logp with coef = −1/N there. */
int REF_NAME(ref_sft)(double *loss, double *grads, const ref_net *net, const sbp_batch *b,
                      sbp_err *err) {
    if (b->B < 1 || b->T < 1) return sbp_fail(err, SBP_EINPUT, "ref: empty batch");
    const size_t n = (size_t)b->B * b->T;
    int64_t N = 0;
    for (int r = 0; r < b->B; r++) N += row_targets(b, r);
    if (N == 0)
        return sbp_fail(err, SBP_EINPUT,
                        "ref: the batch has no target (every shifted label is -100)");
    double *logp, *coef = calloc(n, sizeof *coef);
    if (!coef) return sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    int st = logprobs(&logp, net, b, 1.0, err);
    if (st) {
        free(coef);
        return st;
    }
    double sum = 0;
    for (int r = 0; r < b->B; r++)
        for (int t = 0; t < b->T; t++)
            if (has_target(b, r, t)) {
                coef[(size_t)r * b->T + t] = -1.0 / (double)N;
                sum += logp[(size_t)r * b->T + t];
            }
    st = backward(grads, coef, net, b, 1.0, err);
    if (!st) *loss = -sum / (double)N;
    free(logp), free(coef);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * DPO */

static int dpo_check(const sbp_batch *b, const sbp_objective *o, sbp_err *err) {
    if (o->kind != SBP_OBJ_DPO)
        return sbp_fail(err, SBP_EUSAGE, "ref_dpo: the objective is not DPO (kind %d)",
                        (int)o->kind);
    if (o->dpo_loss != SBP_DPO_SIGMOID && o->dpo_loss != SBP_DPO_IPO)
        return sbp_fail(err, SBP_EUSAGE, "ref_dpo: unknown DPO loss type %d", (int)o->dpo_loss);
    if (o->temperature != 0 && o->temperature != 1)
        return sbp_fail(err, SBP_EUSAGE, "ref_dpo: DPO runs at temperature 1, not %g",
                        o->temperature);
    if (!(o->beta > 0) || !isfinite(o->beta))
        return sbp_fail(err, SBP_EUSAGE, "ref_dpo: beta %g must be finite and > 0", o->beta);
    if (o->dpo_loss == SBP_DPO_SIGMOID && !(o->label_smoothing >= 0 && o->label_smoothing <= 0.5))
        return sbp_fail(err, SBP_EUSAGE, "ref_dpo: label smoothing %g is not in [0, 0.5]",
                        o->label_smoothing);
    if (o->num_sequences < 0)
        return sbp_fail(err, SBP_EUSAGE, "ref_dpo: num_sequences %d < 0", o->num_sequences);
    if (b->pairs < 1 || b->B != 2 * b->pairs)
        return sbp_fail(err, SBP_EINPUT, "ref_dpo: %d rows do not hold %d chosen/rejected pairs",
                        b->B, b->pairs);
    if (!b->ref_seq_logps)
        return sbp_fail(err, SBP_EINPUT, "ref_dpo: no reference log-probs (ref_seq_logps is NULL)");
    for (int r = 0; r < b->B; r++) {
        if (!isfinite(b->ref_seq_logps[r]))
            return sbp_fail(err, SBP_EINPUT, "ref_dpo: reference log-prob of row %d is %g", r,
                            b->ref_seq_logps[r]);
        if (row_targets(b, r) == 0)
            return sbp_fail(err, SBP_EINPUT, "ref_dpo: pair %d: the %s row %d has no target",
                            r % b->pairs, r < b->pairs ? "chosen" : "rejected", r);
    }
    return SBP_OK;
}

/* Per row r the statistic S_r = Σ_t logp[r,t] (sigmoid) or (1/n_r) Σ_t logp[r,t] (ipo); per
 * pair p (chosen row p, rejected row P+p), with R the reference statistics,
 *   z = (S_p − S_{P+p}) − (R_p − R_{P+p}),
 *   sigmoid: ℓ = −(1 − ls)·log σ(βz) − ls·log σ(−βz),
 *            dℓ/dz = −β(1 − ls)·σ(−βz) + β·ls·σ(βz)     (d log σ(x)/dx = σ(−x));
 *   ipo:     ℓ = (z − 1/(2β))²,   dℓ/dz = 2(z − 1/(2β));
 * L = (1/S) Σ_p ℓ with S the pairs of the step. Since dS_r/dlogp[r,t] = 1 (or 1/n_r) and z has
 * S_p with sign + and S_{P+p} with sign −:
 *   dL/dlogp[r,t] = ±(1/S)·dℓ/dz·(1 or 1/n_r). */
int REF_NAME(ref_dpo)(double *loss, double *grads, const ref_net *net, const sbp_batch *b,
                      const sbp_objective *o, sbp_err *err) {
    int st = dpo_check(b, o, err);
    if (st) return st;
    const int P = b->pairs, T = b->T, ipo = o->dpo_loss == SBP_DPO_IPO;
    const double beta = o->beta, ls = o->label_smoothing;
    const double S = o->num_sequences > 0 ? o->num_sequences : P;
    double *logp;
    if ((st = logprobs(&logp, net, b, 1.0, err))) return st;
    double *stat = calloc((size_t)b->B, sizeof *stat);
    double *coef = calloc((size_t)b->B * T, sizeof *coef);
    if (!stat || !coef) {
        free(logp), free(stat), free(coef);
        return sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    }
    for (int r = 0; r < b->B; r++) {
        for (int t = 0; t < T; t++)
            if (has_target(b, r, t)) stat[r] += logp[(size_t)r * T + t];
        if (ipo) stat[r] /= row_targets(b, r);
    }
    double L = 0;
    for (int p = 0; p < P; p++) {
        const int c = p, j = P + p; /* chosen and rejected rows */
        double z = (stat[c] - stat[j]) - (b->ref_seq_logps[c] - b->ref_seq_logps[j]);
        double l, dl;
        if (ipo) {
            double d = z - 1 / (2 * beta);
            l = d * d;
            dl = 2 * d;
        } else {
            l = -(1 - ls) * log_sigmoid(beta * z) - ls * log_sigmoid(-beta * z);
            dl = -beta * (1 - ls) * sigmoid(-beta * z) + beta * ls * sigmoid(beta * z);
        }
        L += l;
        for (int side = 0; side < 2; side++) {
            int r = side ? j : c;
            double g = (side ? -dl : dl) / S / (ipo ? row_targets(b, r) : 1);
            for (int t = 0; t < T; t++)
                if (has_target(b, r, t)) coef[(size_t)r * T + t] = g;
        }
    }
    st = backward(grads, coef, net, b, 1.0, err);
    if (!st) *loss = L / S;
    free(logp), free(stat), free(coef);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * GRPO */

static int grpo_check(const sbp_batch *b, const sbp_objective *o, double *tau, sbp_err *err) {
    if (o->kind != SBP_OBJ_GRPO)
        return sbp_fail(err, SBP_EUSAGE, "ref_grpo: the objective is not GRPO (kind %d)",
                        (int)o->kind);
    if (o->grpo_loss != SBP_GRPO_GRPO && o->grpo_loss != SBP_GRPO_BNPO &&
        o->grpo_loss != SBP_GRPO_DR_GRPO && o->grpo_loss != SBP_GRPO_DAPO)
        return sbp_fail(err, SBP_EUSAGE, "ref_grpo: unknown GRPO loss type %d", (int)o->grpo_loss);
    *tau = o->temperature == 0 ? 1.0 : o->temperature;
    if (!(*tau > 0) || !isfinite(*tau))
        return sbp_fail(err, SBP_EUSAGE, "ref_grpo: temperature %g must be finite and > 0",
                        o->temperature);
    if (!(o->beta >= 0) || !isfinite(o->beta))
        return sbp_fail(err, SBP_EUSAGE, "ref_grpo: beta %g must be finite and >= 0", o->beta);
    if (!(o->epsilon_low >= 0) || !isfinite(o->epsilon_low) || !(o->epsilon_high >= 0) ||
        !isfinite(o->epsilon_high))
        return sbp_fail(err, SBP_EUSAGE,
                        "ref_grpo: epsilon_low %g and epsilon_high %g must be finite and >= 0",
                        o->epsilon_low, o->epsilon_high);
    if (o->max_completion_length < 0 || o->num_sequences < 0 || !(o->num_items >= 0) ||
        !isfinite(o->num_items))
        return sbp_fail(err, SBP_EUSAGE,
                        "ref_grpo: max_completion_length %d, num_sequences %d and num_items %g "
                        "must be >= 0",
                        o->max_completion_length, o->num_sequences, o->num_items);
    if (b->B < 1 || b->T < 1) return sbp_fail(err, SBP_EINPUT, "ref_grpo: empty batch");
    if (!b->advantages) return sbp_fail(err, SBP_EINPUT, "ref_grpo: no advantages");
    if (o->beta > 0 && !b->ref_logps)
        return sbp_fail(err, SBP_EINPUT,
                        "ref_grpo: the KL term (beta %g > 0) needs reference log-probs", o->beta);
    for (int r = 0; r < b->B; r++) {
        if (!isfinite(b->advantages[r]))
            return sbp_fail(err, SBP_EINPUT, "ref_grpo: advantage of row %d is %g", r,
                            b->advantages[r]);
        for (int t = 0; t < b->T; t++) {
            size_t i = (size_t)r * b->T + t;
            if (!has_target(b, r, t)) continue;
            if ((b->old_logps && !isfinite(b->old_logps[i])) ||
                (b->ref_logps && !isfinite(b->ref_logps[i])))
                return sbp_fail(err, SBP_EINPUT,
                                "ref_grpo: old or reference log-prob at [%d][%d] is not finite", r,
                                t);
        }
    }
    return SBP_OK;
}

/* Per target (row b, position t) with A = A_b, o = the old log-prob (logp itself, as a constant,
 * when there is none), ref = the reference log-prob:
 *   ratio = e^(logp − o),   clipped = clamp(ratio, 1 − ε_low, 1 + ε_high),
 *   ℓ = −min(ratio·A, clipped·A) + β·(e^(ref − logp) − (ref − logp) − 1).
 * d ratio/d logp = ratio. The min takes the unclipped term when ratio·A < clipped·A: dℓ/dlogp =
 * −A·ratio. When clipped·A is smaller, ratio lies outside [1 − ε_low, 1 + ε_high] (inside, the
 * two terms are equal), where clamp is constant: 0. At a tie ratio·A = clipped·A, either ratio
 * lies in the closed clip range, where PyTorch's min sends half the gradient to each term and
 * clamp passes its half on, so the whole −A·ratio arrives, or A = 0 and both are 0. The KL term
 * with d = ref − logp: β(e^d − d − 1), d/dlogp = β(−e^d + 1). */
static double grpo_token(double *dl, double logp, double old, double ref, double A,
                         const sbp_objective *o) {
    double ratio = exp(logp - old);
    double lo = 1 - o->epsilon_low, hi = 1 + o->epsilon_high;
    double clipped = ratio < lo ? lo : ratio > hi ? hi : ratio;
    double un = ratio * A, cl = clipped * A;
    double l = -(un <= cl ? un : cl);
    *dl = un <= cl ? -A * ratio : 0;
    if (o->beta > 0) {
        double d = ref - logp;
        l += o->beta * (exp(d) - d - 1);
        *dl += o->beta * (1 - exp(d));
    }
    return l;
}

/* L = Σ_{b,t} ν_b·ℓ[b,t] over targets, with n_b the targets of row b, S the rows of the step
 * (o->num_sequences or B), I its completion tokens (o->num_items or Σ_b n_b), and
 *   grpo: ν_b = 1/(S·max(n_b, 1)),   bnpo: 1/max(I, 1),
 *   dr_grpo: 1/(S·max_completion_length),   dapo: 1/I;
 * dL/dlogp[b,t] = ν_b·dℓ/dlogp (the old log-prob, when absent, is a detached copy of logp). */
int REF_NAME(ref_grpo)(double *loss, double *grads, const ref_net *net, const sbp_batch *b,
                       const sbp_objective *o, sbp_err *err) {
    double tau = 1;
    int st = grpo_check(b, o, &tau, err);
    if (st) return st;
    const int B = b->B, T = b->T;
    int64_t own_items = 0;
    for (int r = 0; r < B; r++) own_items += row_targets(b, r);
    const double S = o->num_sequences > 0 ? o->num_sequences : B;
    const double I = o->num_items > 0 ? o->num_items : (double)own_items;
    const double Lmax = o->max_completion_length > 0 ? o->max_completion_length : T;
    if (o->grpo_loss == SBP_GRPO_DAPO && I == 0)
        return sbp_fail(err, SBP_EINPUT,
                        "ref_grpo: dapo divides by the completion tokens of the step, and there "
                        "are none");
    double *logp;
    if ((st = logprobs(&logp, net, b, tau, err))) return st;
    double *coef = calloc((size_t)B * T, sizeof *coef);
    if (!coef) {
        free(logp);
        return sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    }
    double L = 0;
    for (int r = 0; r < B; r++) {
        int n = row_targets(b, r);
        double nu = o->grpo_loss == SBP_GRPO_GRPO      ? 1 / (S * (n > 1 ? n : 1))
                    : o->grpo_loss == SBP_GRPO_BNPO    ? 1 / (I > 1 ? I : 1)
                    : o->grpo_loss == SBP_GRPO_DR_GRPO ? 1 / (S * Lmax)
                                                       : 1 / I;
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)r * T + t;
            if (!has_target(b, r, t)) continue;
            double dl, old = b->old_logps ? b->old_logps[i] : logp[i];
            double ref = b->ref_logps ? b->ref_logps[i] : 0;
            L += nu * grpo_token(&dl, logp[i], old, ref, b->advantages[r], o);
            coef[i] = nu * dl;
        }
    }
    st = backward(grads, coef, net, b, tau, err);
    if (!st) *loss = L;
    free(logp), free(coef);
    return st;
}
