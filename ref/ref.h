/* ref.h — the independent float64 oracle (see ref/SEMANTICS.md, the contract it implements).
 *
 * A deliberately naive implementation of the decoder forward pass and its hand-derived backward:
 * plain nested loops, no BLAS, no chunking, every intermediate kept (full T×T attention
 * probabilities per head). It shares no numeric code with src/, so a mistake that the three
 * schedules of src/ share shows up as a disagreement with this file; it is itself checked by
 * central finite differences (tests/test_ref.c). Speed is irrelevant: it is meant for the tiny
 * test models.
 *
 * Weights and gradients are float64 slabs in the layout of sbp_params (m.w of a model loaded
 * with SBP_FP64). All functions return 0 (SBP_OK) on success and an sbp_status with err filled
 * otherwise; they never print or exit. */
#ifndef SBP_REF_H
#define SBP_REF_H

#include "../src/streambp.h"

/* Per-target log-probabilities:
 *   logp[b*T + t] = log softmax(logits[b,t,:] / temperature)[labels[b][t+1]]
 * for t in [0, T-1) where labels[b][t+1] != -100; 0 elsewhere (including t = T-1).
 * temperature must be > 0. */
int ref_logprobs(double *logp /* (B*T) */, const sbp_config *cfg, const sbp_params *ps,
                 const double *w /* (ps->total) */, const sbp_batch *b, double temperature,
                 sbp_err *err);

/* Adds to grads the gradient of L = Σ_{b,t} coef[b*T+t] · logp[b*T+t] (logp as above; coef is
 * ignored where there is no target). Recomputes the forward pass. */
int ref_backward(double *grads /* (ps->total), accumulated */, const double *coef /* (B*T) */,
                 const sbp_config *cfg, const sbp_params *ps, const double *w /* (ps->total) */,
                 const sbp_batch *b, double temperature, sbp_err *err);

/* SFT (HF causal-LM loss): loss = −(1/N) Σ logp over the N valid targets of the batch, at
 * temperature 1; grads is overwritten with d loss / d w. N = 0 is an input error. */
int ref_sft(double *loss, double *grads /* (ps->total), overwritten */, const sbp_config *cfg,
            const sbp_params *ps, const double *w /* (ps->total) */, const sbp_batch *b,
            sbp_err *err);

/* DPO (TRL DPOTrainer; SEMANTICS.md "DPO"): b holds 2·pairs rows, chosen rows [0, pairs), rejected
 * rows [pairs, 2·pairs), and b->ref_seq_logps (2·pairs), the reference statistic of each row (a
 * sum of log-probs for "sigmoid", a mean for "ipo"). Uses o->dpo_loss, beta (> 0),
 * label_smoothing (sigmoid; in [0, 0.5]) and num_sequences (the pairs of the whole step, 0: this
 * batch's). o->kind must be SBP_OBJ_DPO and o->temperature 0 or 1. Writes the loss and, unless
 * grads is NULL (loss only), overwrites grads with d loss / d w. A pair with a row without
 * targets is an input error. */
int ref_dpo(double *loss, double *grads /* (ps->total), overwritten, or NULL */,
            const sbp_config *cfg, const sbp_params *ps, const double *w /* (ps->total) */,
            const sbp_batch *b, const sbp_objective *o, sbp_err *err);

/* GRPO (TRL GRPOTrainer; SEMANTICS.md "GRPO"): b->advantages (B) set; b->old_logps and
 * b->ref_logps (B·T, by predicting position) may be NULL (old: the current log-probs, detached;
 * ref: needed only when beta > 0). Uses o->grpo_loss, beta (>= 0), epsilon_low/high (>= 0),
 * temperature (0: 1), max_completion_length (dr_grpo; 0: T) and the step normalisers
 * num_sequences (grpo, dr_grpo) and num_items (bnpo, dapo); 0: this batch's. o->kind must be
 * SBP_OBJ_GRPO. loss and grads as for ref_dpo. dapo over a step without completion tokens is an
 * input error (TRL divides 0 by 0 there). */
int ref_grpo(double *loss, double *grads /* (ps->total), overwritten, or NULL */,
             const sbp_config *cfg, const sbp_params *ps, const double *w /* (ps->total) */,
             const sbp_batch *b, const sbp_objective *o, sbp_err *err);

#endif
