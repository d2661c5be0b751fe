/* ref.h — the independent float64 oracle (see ref/SEMANTICS.md, the contract it implements).
 *
 * A deliberately naive implementation of the decoder forward pass and its hand-derived backward:
 * plain nested loops, no BLAS, no chunking. It shares no numeric code with src/, so a mistake that
 * the three schedules of src/ share shows up as a disagreement with this file; it is itself
 * checked by central finite differences (tests/test_ref.c). Speed is irrelevant: it is meant for
 * the tiny test models (and long sequences of them: attention keeps O(T) per head, not T×T).
 *
 * It also reads its inputs itself (ref/io.c): config.json, safetensors weights and batch files,
 * with none of src/io's code, and derives everything from the raw file contents — the targets
 * and their shift, padding, masks, DPO's padded rows, GRPO's completion labels, group-normalised
 * advantages and the shift of per-token log-probs, the config's defaults — so that a loading bug
 * in src/ does not reach the truth the verifier compares against. The types of streambp.h
 * (sbp_config, sbp_params, sbp_batch) are shared as plain structs; ref/ fills them itself.
 *
 * Everything exists twice: the float64 oracle (ref_*) and the same loops in float32
 * (ref_*_f32, ref32.c and objectives32.c compile the same sources with REF_F32), whose error
 * against the float64 oracle is the verifier's independent yardstick for float32 runs. Weights,
 * log-probs and gradients cross the interface in float64 either way.
 *
 * Weights and gradients are float64 slabs in the layout of an sbp_params table (ref's own, from
 * ref_params_build, or any other with the same kinds). All functions return 0 (SBP_OK) on success
 * and an sbp_status with err filled otherwise; they never print or exit. */
#ifndef SBP_REF_H
#define SBP_REF_H

#include "../src/streambp.h"

#ifdef REF_F32
#define REF_NAME(f) f##_f32
#else
#define REF_NAME(f) f
#endif

/* ---------------------------------------------------------------------------------------------
 * The oracle's own readers (ref/io.c) */

/* config.json read naively with cJSON (as HF's PretrainedConfig reads it): the fields of
 * sbp_config with HF's defaults (head_dim: 128 for qwen3, hidden/heads otherwise;
 * num_key_value_heads: the head count; rope_theta 10000; tie_word_embeddings false;
 * pad_token_id none). gemma3_text, and a multimodal gemma3's text_config, with every
 * Gemma3TextConfig default (HF 4.51.3: docs/gemma3.md), pad_token_id 0 and soft-capping
 * refused; a gemma3 config sets cfg->wrapped, and its tensors are named "language_model." + the
 * text model's names. */
int ref_config_read(sbp_config *cfg, const char *path, sbp_err *err);

/* The oracle's parameter table of cfg: HF names and shapes in state_dict order. */
int ref_params_build(sbp_params *ps, const sbp_config *cfg, sbp_err *err);
void ref_params_free(sbp_params *ps);

typedef struct {
    sbp_config cfg;
    sbp_params ps;
    double *w; /* (ps.total) */
} ref_model;

/* A model directory: config.json, and model.safetensors or the shards its index names. Every
 * tensor of the table must be there with the shape config.json implies; when some are not,
 * the error is SBP_EINPUT and `mismatch` (if not NULL) lists every one of them as
 * "name [file shape] != [config shape]" (or "name missing"), separated by "; ". */
int ref_model_read(ref_model *m, const char *dir, char *mismatch, size_t n, sbp_err *err);
void ref_model_free(ref_model *m);

/* A batch file for objective `kind`, checked against cfg (ids and labels in range, masks 0/1),
 * with everything derived here (ref/SEMANTICS.md): SFT rows as stored; DPO 2B rows, chosen
 * first, padded on the right to the longer side with id 0, mask 0, label −100; GRPO labels =
 * input_ids where completion_mask is 1, advantages from `advantages` or from `rewards` and the
 * metadata's group size ((r − mean)/(unbiased std + 1e-4), or r − mean when !scale_rewards),
 * per-token log-probs moved from the scored token's position t to the predicting t − 1. */
int ref_batch_read(sbp_batch *b, const char *path, const sbp_config *cfg, sbp_objective_kind kind,
                   int scale_rewards, sbp_err *err);
void ref_batch_free(sbp_batch *b);

/* An adapter on the base model as the oracle reads it (ref_lora_read): peft's LoRA. Each
 * targeted projection y = x·Wᵀ (+ b) becomes y + s·(x·Aᵀ)·Bᵀ with A (r, in), B (out, r). */
typedef struct {
    int r;
    double scale;     /* lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora */
    unsigned targets; /* SBP_LORA_* bits */
    sbp_params ps;    /* the oracle's own table: peft's names, per layer and targeted projection
                       * lora_A (lora = 1) then lora_B (lora = 2), kind = the projection */
    double *w;        /* (ps.total) */
} ref_lora;

/* An adapter directory: adapter_config.json (peft_type LORA, r, lora_alpha, use_rslora,
 * target_modules as a list or "all-linear", bias "none") and adapter_model.safetensors with
 * every tensor of the table for cfg, of the right shape; anything else is an input error. */
int ref_lora_read(ref_lora *a, const char *dir, const sbp_config *cfg, sbp_err *err);
void ref_lora_free(ref_lora *a);

/* The network the oracle differentiates: a base model's weights and what sits on them. */
typedef struct {
    const sbp_config *cfg;
    const sbp_params *ps;
    const double *w;           /* (ps->total) */
    sbp_unattended unattended; /* what a row that sees no key computes (SEMANTICS.md) */
    const ref_lora *lora;      /* NULL, or an adapter: the base is then frozen, and every gradient
                                * of the oracle is the adapter's, in lora->ps's layout */
} ref_net;

/* The plain network of a table and weights (unattended rows zero, no adapter). */
#define REF_NET(cfg_, ps_, w_) (&(const ref_net){.cfg = (cfg_), .ps = (ps_), .w = (w_)})

/* The length of net's gradient slab: the adapter's with one, else the base model's. */
static inline int64_t ref_grad_total(const ref_net *net) {
    return net->lora ? net->lora->ps.total : net->ps->total;
}

/* Replaces b's reference log-probs by those of the reference model m, computed by the oracle:
 * DPO the per-row sum of target log-probs (the mean for ipo), GRPO per target at the objective's
 * temperature; rows that see no key follow `unattended`, as in the policy's pass. */
int ref_set_reference(sbp_batch *b, const ref_model *m, const sbp_objective *o,
                      sbp_unattended unattended, sbp_err *err);

/* ---------------------------------------------------------------------------------------------
 * The oracle */

/* The files of one step, as the verifier's commands name them. */
typedef struct {
    const char *model_dir, *batch_path;
    const sbp_objective *o;
    int scale_rewards;         /* GRPO rewards: divide by the group std */
    const char *ref_model_dir; /* DPO/GRPO: the reference model, or NULL (the batch's values) */
    const char *lora_dir;      /* an adapter on the policy, or NULL */
    sbp_unattended unattended;
    int f32; /* the float32 loops instead of float64 */
} ref_files;

/* The truth of one step from the files alone: the loss and d loss / d w (the adapter's with
 * f->lora_dir, in lora's layout, else the model's in m's layout). m (and lora, with an adapter)
 * are filled: free them with ref_model_free and ref_lora_free. A mismatch between config.json
 * and the weights is reported as by ref_model_read. */
int ref_truth_files(double *loss, double **grads /* malloc'd */, ref_model *m, ref_lora *lora,
                    const ref_files *f, char *mismatch, size_t n_mismatch, sbp_err *err);

/* The same on a network and a batch already read: the loss and grads (ref_grad_total(net),
 * overwritten). The batch's step normalisers in o (num_items, num_sequences,
 * max_completion_length) apply. */
int ref_truth(double *loss, double *grads, const ref_net *net, const sbp_batch *b,
              const sbp_objective *o, int f32, sbp_err *err);

/* Per-target log-probabilities:
 *   logp[b*T + t] = log softmax(logits[b,t,:] / temperature)[labels[b][t+1]]
 * for t in [0, T-1) where labels[b][t+1] != -100; 0 elsewhere (including t = T-1).
 * temperature must be > 0. */
int ref_logprobs(double *logp /* (B*T) */, const ref_net *net, const sbp_batch *b,
                 double temperature, sbp_err *err);
int ref_logprobs_f32(double *logp, const ref_net *net, const sbp_batch *b, double temperature,
                     sbp_err *err);

/* Adds to grads the gradient of L = Σ_{b,t} coef[b*T+t] · logp[b*T+t] (logp as above; coef is
 * ignored where there is no target). Recomputes the forward pass. */
int ref_backward(double *grads /* (ref_grad_total(net)), accumulated */,
                 const double *coef /* (B*T) */, const ref_net *net, const sbp_batch *b,
                 double temperature, sbp_err *err);
int ref_backward_f32(double *grads, const double *coef, const ref_net *net, const sbp_batch *b,
                     double temperature, sbp_err *err);

/* SFT (HF causal-LM loss): loss = −(1/N) Σ logp over the N valid targets of the batch, at
 * temperature 1; grads (unless NULL) is overwritten with d loss / d w. N = 0 is an input error.
 * (num_items of a step is not taken here: ref_truth applies it.) */
int ref_sft(double *loss, double *grads /* (ref_grad_total(net)), overwritten, or NULL */,
            const ref_net *net, const sbp_batch *b, sbp_err *err);
int ref_sft_f32(double *loss, double *grads, const ref_net *net, const sbp_batch *b, sbp_err *err);

/* DPO (TRL DPOTrainer; SEMANTICS.md "DPO"): b holds 2·pairs rows, chosen rows [0, pairs), rejected
 * rows [pairs, 2·pairs), and b->ref_seq_logps (2·pairs), the reference statistic of each row (a
 * sum of log-probs for "sigmoid", a mean for "ipo"). Uses o->dpo_loss, beta (> 0),
 * label_smoothing (sigmoid; in [0, 0.5]) and num_sequences (the pairs of the whole step, 0: this
 * batch's). o->kind must be SBP_OBJ_DPO and o->temperature 0 or 1. Writes the loss and, unless
 * grads is NULL (loss only), overwrites grads with d loss / d w. A pair with a row without
 * targets is an input error. */
int ref_dpo(double *loss, double *grads /* (ref_grad_total(net)), overwritten, or NULL */,
            const ref_net *net, const sbp_batch *b, const sbp_objective *o, sbp_err *err);
int ref_dpo_f32(double *loss, double *grads, const ref_net *net, const sbp_batch *b,
                const sbp_objective *o, sbp_err *err);

/* GRPO (TRL GRPOTrainer; SEMANTICS.md "GRPO"): b->advantages (B) set; b->old_logps and
 * b->ref_logps (B·T, by predicting position) may be NULL (old: the current log-probs, detached;
 * ref: needed only when beta > 0). Uses o->grpo_loss, beta (>= 0), epsilon_low/high (>= 0),
 * temperature (0: 1), max_completion_length (dr_grpo; 0: T) and the step normalisers
 * num_sequences (grpo, dr_grpo) and num_items (bnpo, dapo); 0: this batch's. o->kind must be
 * SBP_OBJ_GRPO. loss and grads as for ref_dpo. dapo over a step without completion tokens is an
 * input error (TRL divides 0 by 0 there). */
int ref_grpo(double *loss, double *grads /* (ref_grad_total(net)), overwritten, or NULL */,
             const ref_net *net, const sbp_batch *b, const sbp_objective *o, sbp_err *err);
int ref_grpo_f32(double *loss, double *grads, const ref_net *net, const sbp_batch *b,
                 const sbp_objective *o, sbp_err *err);

/* ---------------------------------------------------------------------------------------------
 * The optimizer's oracle (ref/adamw.c): torch.optim.AdamW, clip_grad_norm_ and the warm-up
 * schedules from their documented formulas, in float64, for `streambp verify optim`. */

/* The learning rate of optimizer step k (0-based) of a run of `total` steps. */
double ref_lr_at(sbp_lr_kind kind, double peak, int64_t warmup, int64_t total, int64_t k);
/* Scales g (laid out as ps) by min(1, max_norm / (norm + 1e-6)), max_norm 0: not at all; returns
 * the norm before clipping (the norm of the per-tensor norms). */
double ref_clip_grad_norm(double *g /* (ps->total) */, const sbp_params *ps, double max_norm);
/* One AdamW step t (from 1) at learning rate lr; decay[i] 0 keeps element i out of the weight
 * decay. */
void ref_adamw_step(double *p, double *m, double *v, const double *g,
                    const unsigned char *decay /* (n) */, int64_t n, int64_t t,
                    const sbp_adamw_opts *o, double lr);

#endif
