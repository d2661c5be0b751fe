/* objective.h — evaluating an objective pass by pass (internal; the formulas are in
 * ref/SEMANTICS.md).
 *
 * Every objective is a sum over targets of terms that depend on the target's log-prob, with
 * weights known before the chunk loop, so the logits can be streamed. SFT and GRPO know them
 * from the batch. DPO couples the targets of a pair through the pair's summed log-probs: a first,
 * forward-only pass over the head collects every target's log-prob, sbp_obj_prepare turns them
 * into one factor per row, and the second pass backpropagates factor × per-token log-probs. */
#ifndef SBP_OBJECTIVE_H
#define SBP_OBJECTIVE_H

#include "../streambp.h"

typedef struct {
    const sbp_objective *o;
    const sbp_batch *b;
    double inv_tau;  /* 1 / temperature */
    double *row_w;   /* (B) per-row weight of dL/dlogp: DPO factor, GRPO normaliser */
    double w;        /* the global normaliser: SFT 1/N, GRPO bnpo/dapo/dr_grpo */
    int needs_logps; /* DPO: the first pass must run */
} sbp_obj_eval;

/* Checks the objective against the batch and sets the normalisers (the step's, for gradient
 * accumulation: o->num_items / num_sequences when set). */
sbp_status sbp_obj_begin(sbp_obj_eval *ev, const sbp_objective *o, const sbp_batch *b,
                         sbp_err *err);
/* DPO: from every target's log-prob (B·T, by predicting position; 0 where no target) the pair
 * losses, added to *loss pair by pair, and the per-row factors. */
void sbp_obj_prepare(sbp_obj_eval *ev, double *loss, const double *logp_all);
/* Targets predicted at rows [s, s+M) of row bi: each loss term added to *loss in ascending
 * order (so the sum does not depend on how rows are grouped into passes); coef[r] = dL/dlogp. */
void sbp_obj_terms(const sbp_obj_eval *ev, double *loss, double *coef /* (M) */, int bi, int s,
                   int M, const double *logp /* (M) */);
void sbp_obj_end(sbp_obj_eval *ev);

/* The one table of objective and loss-type names (what `--objective` and `--loss-type` take, what
 * reports and settings print): "sft" | "dpo" | "grpo"; DPO "sigmoid" | "ipo"; GRPO "grpo" |
 * "bnpo" | "dr_grpo" | "dapo"; "-" for SFT's loss type. */
const char *sbp_obj_kind_name(sbp_objective_kind k);
const char *sbp_obj_loss_name(const sbp_objective *o);
/* name -> *k; returns 0 when the name is no objective. */
int sbp_obj_kind_parse(sbp_objective_kind *k, const char *name);
/* name -> o->dpo_loss or o->grpo_loss for o->kind; returns 0 when it names no loss of that kind. */
int sbp_obj_loss_parse(sbp_objective *o, const char *name);

#endif
