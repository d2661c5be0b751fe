/*
 * streambp.h — the public API of libstreambp.
 *
 * The library computes exact parameter gradients of a Hugging Face decoder (Qwen3, Qwen2/2.5,
 * Llama-3) for a training objective, with one of three backprop schedules: full BP, gradient
 * checkpointing, and StreamBP (arXiv 2506.03077). In deterministic mode the three give
 * bit-identical gradients (see README, "Exactness").
 *
 * Conventions: every function that can fail returns an sbp_status and, on failure, fills the
 * sbp_err it was given with a message naming the file, tensor or value at fault. Nothing here
 * prints, exits, or keeps global state, with one documented exception: sbp_set_threads() sets the
 * process-wide OpenMP and OpenBLAS thread counts, since both libraries only have global ones.
 *
 * Dimension letters used in shape comments throughout the project:
 *   B batch rows, T tokens per row, C hidden size, NH query heads, NKV key/value heads,
 *   HD head dim, Q = NH*HD, KV = NKV*HD, F MLP width, V vocabulary, L layers.
 */
#ifndef STREAMBP_H
#define STREAMBP_H

#include <stddef.h>
#include <stdint.h>

#define SBP_VERSION "0.1.0"

/* ---------------------------------------------------------------------------------------------
 * Errors */

typedef enum {
    SBP_OK = 0,
    SBP_EUSAGE,   /* a bad argument from the caller (chunk <= 0, unknown schedule) */
    SBP_EIO,      /* a file cannot be opened, read or written */
    SBP_EFORMAT,  /* a malformed file: safetensors header, JSON, dtype, offsets */
    SBP_EINPUT,   /* well-formed input that is inconsistent: config, shapes, token ids, labels */
    SBP_ENOMEM,   /* an allocation failed */
    SBP_ENUMERIC, /* NaN or Inf in a loss or gradient */
} sbp_status;

typedef struct {
    sbp_status status;
    char msg[768];
} sbp_err;

const char *sbp_status_name(sbp_status st);

/* ---------------------------------------------------------------------------------------------
 * Model configuration (config.json as Hugging Face writes it) */

typedef enum { SBP_QWEN3, SBP_QWEN2, SBP_LLAMA } sbp_family;

typedef struct {
    sbp_family family;
    char model_type[16]; /* "qwen3", "qwen2", "llama" */
    int vocab;           /* V, e.g. 151936 */
    int hidden;          /* C, e.g. 4096 */
    int ffn;             /* F, intermediate_size, e.g. 12288 */
    int layers;          /* L */
    int heads;           /* NH */
    int kv_heads;        /* NKV; NH % NKV == 0 */
    int head_dim;        /* HD; even; need not equal C/NH (Qwen3) */
    double eps;          /* rms_norm_eps */
    double rope_theta;
    int rope_llama3; /* 1 when rope_type is "llama3"; the four fields below apply */
    double rope_factor, rope_low_freq, rope_high_freq, rope_orig_max;
    int tied;          /* tie_word_embeddings: lm_head is the embedding */
    int qkv_bias;      /* Qwen2: bias on q/k/v projections */
    int qk_norm;       /* Qwen3: per-head RMSNorm of q and k before RoPE */
    double init_range; /* initializer_range, used by sbp_model_init */
} sbp_config;

/* What streambp accepts, and why each limit is where it is: past them a value has no meaning for
 * a model that fits any machine, and every size product stays far from int64 overflow. The
 * largest public models are within them (Llama-3.1-405B: vocab 128256, hidden 16384,
 * intermediate 53248, 126 layers, 128 heads of 128; 4.1e11 parameters). */
#define SBP_MAX_VOCAB    (1 << 24)   /* vocab_size */
#define SBP_MAX_HIDDEN   (1 << 17)   /* hidden_size */
#define SBP_MAX_FFN      (1 << 20)   /* intermediate_size */
#define SBP_MAX_LAYERS   1024        /* num_hidden_layers */
#define SBP_MAX_HEADS    1024        /* num_attention_heads, num_key_value_heads */
#define SBP_MAX_HEAD_DIM 512         /* head_dim */
#define SBP_MAX_PARAMS   (1LL << 42) /* parameters: 4.4e12, 16 TiB in float32 */
#define SBP_MAX_BLOCK    (1 << 20)   /* sbp_grad_opts.block: a token block of 1M tokens */
#define SBP_MAX_THREADS  4096        /* sbp_set_threads */

/* Reads and validates a config.json. */
sbp_status sbp_config_load(sbp_config *cfg, const char *path, sbp_err *err);
/* The same from a JSON string; `what` names it in error messages. */
sbp_status sbp_config_parse(sbp_config *cfg, const char *json, const char *what, sbp_err *err);
/* Checks a config built in memory as sbp_config_load checks a file: every size >= 1 and within
 * the SBP_MAX_* limits, heads divisible, head_dim even, eps and rope_theta > 0, and the
 * parameter count within SBP_MAX_PARAMS. `what` names the config in the message. */
sbp_status sbp_config_validate(const sbp_config *cfg, const char *what, sbp_err *err);
/* The number of parameters of the model, or -1 when a size is out of range or the count would
 * pass SBP_MAX_PARAMS (computed without overflow). */
int64_t sbp_config_param_count(const sbp_config *cfg);
/* Writes cfg as a HF-style config.json that transformers can read (atomic). */
sbp_status sbp_config_save(const sbp_config *cfg, const char *path, sbp_err *err);

/* ---------------------------------------------------------------------------------------------
 * Parameter table: every tensor of the model, under its HF name, in HF state_dict order. One slab
 * holds them all; `offset` is in elements. Gradients use the same layout. */

typedef enum {
    SBP_P_EMBED,
    SBP_P_Q,
    SBP_P_QB,
    SBP_P_K,
    SBP_P_KB,
    SBP_P_V,
    SBP_P_VB,
    SBP_P_O,
    SBP_P_QNORM,
    SBP_P_KNORM,
    SBP_P_GATE,
    SBP_P_UP,
    SBP_P_DOWN,
    SBP_P_IN_NORM,
    SBP_P_POST_NORM,
    SBP_P_FINAL_NORM,
    SBP_P_LM_HEAD,
    SBP_P_NKINDS
} sbp_param_kind;

typedef struct {
    char name[80];
    sbp_param_kind kind;
    int layer; /* -1 for embedding, final norm and head */
    int ndim;  /* 1 or 2 */
    int64_t shape[2];
    int64_t numel;
    int64_t offset; /* in elements, into the parameter (and gradient) slab */
} sbp_param;

typedef struct {
    sbp_param *p; /* (n) */
    int n;
    int64_t total; /* elements in the slab */
} sbp_params;

sbp_status sbp_params_build(sbp_params *ps, const sbp_config *cfg, sbp_err *err);
void sbp_params_free(sbp_params *ps);
int sbp_params_find(const sbp_params *ps, const char *name); /* index or -1 */
/* offset of one tensor, or -1 when the family has no such tensor (e.g. q bias in Qwen3) */
int64_t sbp_params_offset(const sbp_params *ps, sbp_param_kind kind, int layer);

/* ---------------------------------------------------------------------------------------------
 * Memory ledger: every buffer of a run is charged to one category; current and peak bytes are
 * kept per category and in total, together with the breakdown at the moment of the total peak. */

typedef enum {
    SBP_MEM_WEIGHTS,
    SBP_MEM_GRADS,
    SBP_MEM_OPTIMIZER,
    SBP_MEM_CHECKPOINTS, /* kept layer inputs (ckpt, stream) */
    SBP_MEM_ACTIVATIONS, /* activations kept by full BP */
    SBP_MEM_LAYER,       /* the working set of the layer being processed */
    SBP_MEM_LOGITS,      /* logits and their gradient */
    SBP_MEM_NCATS
} sbp_mem_cat;

typedef struct {
    int64_t cur[SBP_MEM_NCATS];
    int64_t peak[SBP_MEM_NCATS];    /* peak of each category on its own */
    int64_t at_peak[SBP_MEM_NCATS]; /* each category at the moment of the total peak */
    int64_t cur_total, peak_total;
    int64_t n_allocs;
    int plan; /* set before use: allocations only reserve address space (PROT_NONE), so a
               * planning run that touched a buffer would fault instead of computing */
} sbp_ledger;

const char *sbp_mem_cat_name(sbp_mem_cat c);
/* 64-byte aligned, zero-filled (in a planning ledger: inaccessible); NULL when out of memory or
 * address space (nothing is charged then). */
void *sbp_ledger_alloc(sbp_ledger *lg, sbp_mem_cat cat, size_t bytes);
void sbp_ledger_free(sbp_ledger *lg, void *p);

/* The training objectives (details below, with sbp_objective). */
typedef enum { SBP_OBJ_SFT, SBP_OBJ_DPO, SBP_OBJ_GRPO } sbp_objective_kind;
typedef enum { SBP_DPO_SIGMOID, SBP_DPO_IPO } sbp_dpo_loss;
typedef enum { SBP_GRPO_GRPO, SBP_GRPO_BNPO, SBP_GRPO_DR_GRPO, SBP_GRPO_DAPO } sbp_grpo_loss;

/* ---------------------------------------------------------------------------------------------
 * Models and batches */

typedef enum { SBP_FP32, SBP_FP64 } sbp_precision;

typedef struct {
    sbp_config cfg;
    sbp_params params;
    sbp_precision prec;
    void *w; /* (params.total) float or double, per prec */
} sbp_model;

/* Loads a HF model directory (config.json + model.safetensors or an index of shards), converting
 * F32/F64/BF16/F16 tensors to prec. The weights are charged to lg (which may be NULL). */
sbp_status sbp_model_load(sbp_model *m, const char *dir, sbp_precision prec, sbp_ledger *lg,
                          sbp_err *err);
void sbp_model_free(sbp_model *m, sbp_ledger *lg);
/* Checks a model directory as sbp_model_load does, reading no weight: config.json (into cfg),
 * and every tensor of the model present in the files with the shape the config implies. */
sbp_status sbp_model_check(sbp_config *cfg, const char *dir, sbp_err *err);
/* Rounds every weight to bfloat16 in place (for emulated bf16 runs). */
void sbp_model_round_bf16(sbp_model *m);
/* Writes a seeded random model directory (config.json + model.safetensors, F32). */
sbp_status sbp_model_init(const sbp_config *cfg, uint64_t seed, const char *dir, sbp_err *err);

#define SBP_IGNORE (-100)

typedef struct {
    int B, T;
    int32_t *ids;            /* (B, T) input_ids in [0, V) */
    int32_t *labels;         /* (B, T) in [0, V) or SBP_IGNORE; position t+1 is the target at t */
    uint8_t *mask;           /* (B, T) attention_mask, 1 = real token */
    int64_t n_targets;       /* valid shifted targets in the batch */
    int64_t n_pad_targets;   /* of those, targets predicted from a padded position */
    sbp_objective_kind kind; /* what the file holds */
    /* DPO: rows [0, pairs) are the chosen sequences, rows [pairs, 2·pairs) the rejected ones */
    int pairs;
    double *ref_seq_logps; /* (B) the reference statistic of each row (DPO), or NULL */
    /* GRPO; per-token arrays are indexed by the predicting position: [b·T + t] belongs to the
     * target labels[b][t+1] (the file stores it at t+1) */
    double *advantages; /* (B) */
    double *old_logps;  /* (B, T) or NULL: the current log-probs, detached */
    double *ref_logps;  /* (B, T) or NULL */
} sbp_batch;

/* Reads an SFT batch (input_ids, labels, optional attention_mask; I32 or I64) and checks it
 * against cfg: equal shapes, ids and labels in range, mask in {0,1}, T > 0. */
sbp_status sbp_batch_load(sbp_batch *b, const char *path, const sbp_config *cfg, sbp_err *err);
/* The same for any objective (file formats in README "Objectives"): DPO pairs become 2B rows,
 * GRPO completion masks become labels; scale_rewards: divide GRPO group-normalised rewards by
 * the group std (TRL's default). */
sbp_status sbp_batch_load_as(sbp_batch *b, const char *path, const sbp_config *cfg,
                             sbp_objective_kind kind, int scale_rewards, sbp_err *err);
void sbp_batch_free(sbp_batch *b);
/* Sets n_targets and n_pad_targets from labels and mask (the loaders do this); call it after
 * building or editing a batch in memory. */
void sbp_batch_count_targets(sbp_batch *b);

/* ---------------------------------------------------------------------------------------------
 * Objectives. Every objective is a sum over target tokens of terms that depend on the token's
 * log-probability logp_t = log softmax(logits_t)[labels[t+1]], with weights known before the
 * chunk loop, so the logits can be streamed: each pass of rows is backpropagated at once with
 * dL/dlogits_t = (dL/dlogp_t) · (onehot − softmax). */

/* The exact formulas, with TRL's names, are in ref/SEMANTICS.md. */
typedef struct {
    sbp_objective_kind kind; /* zero-initialised: SFT */
    /* SFT (HF causal-LM loss): L = Σ_t w_t · (−logp_t) / N */
    const double *target_weight; /* (B·T) w_t of the target predicted at position t; NULL: 1 */
    /* DPO (TRL DPOTrainer): pairs of chosen and rejected rows (see sbp_batch) */
    sbp_dpo_loss dpo_loss;
    double beta;            /* DPO β, and GRPO's KL coefficient β (0: no KL term) */
    double label_smoothing; /* DPO sigmoid */
    /* GRPO (TRL GRPOTrainer) */
    sbp_grpo_loss grpo_loss;
    double epsilon_low, epsilon_high; /* clip range [1 − ε_low, 1 + ε_high] */
    double temperature;               /* logits / τ; 0: 1 */
    int max_completion_length;        /* dr_grpo */
    /* Normalisers of the whole step, for gradient accumulation; 0: this batch's own. */
    double num_items;  /* SFT: valid targets; GRPO bnpo/dapo: completion tokens */
    int num_sequences; /* DPO: pairs; GRPO grpo/dr_grpo: rows */
} sbp_objective;

/* ---------------------------------------------------------------------------------------------
 * Gradients */

typedef enum { SBP_FULL, SBP_CKPT, SBP_STREAM } sbp_schedule;

const char *sbp_schedule_name(sbp_schedule s);
int sbp_schedule_parse(const char *s, sbp_schedule *out); /* 1 on success */

#define SBP_DEFAULT_BLOCK 256

typedef struct {
    sbp_schedule schedule;
    int block;               /* token block of every token reduction; 0 = SBP_DEFAULT_BLOCK */
    int chunk;               /* stream: rows per layer chunk; 0 = 4 blocks; clamped to T */
    int logit_chunk;         /* rows per logits pass; 0 = one block (stream) or T (full, ckpt) */
    int chunked_logits;      /* full/ckpt: use logit_chunk instead of materialising B*T*V logits */
    sbp_objective objective; /* zero-initialised: SFT */
    int emulate_bf16;        /* float32 engine only: round every stored tensor and the gradients to
                              * bfloat16, as pure-bf16 training does (give it a model whose weights
                              * went through sbp_model_round_bf16); verify audit's bf16 yardstick */
} sbp_grad_opts;

typedef struct {
    double loss;
    int64_t n_targets;
    void *grads; /* (params.total), same precision as the model; charged to the ledger */
    int block, chunk, logit_chunk; /* the values used after defaults and clamping */
} sbp_grad_result;

/* One forward + backward step. The gradient slab is allocated into res->grads (free it with
 * sbp_grad_result_free). The ledger records every buffer of the step. */
sbp_status sbp_grad(sbp_grad_result *res, const sbp_model *m, const sbp_batch *b,
                    const sbp_grad_opts *opts, sbp_ledger *lg, sbp_err *err);
void sbp_grad_result_free(sbp_grad_result *res, sbp_ledger *lg);

/* Gradient accumulation: one step over n micro-batches, normalised as the concatenated batch
 * would be (ref/SEMANTICS.md, "Gradient accumulation"); the gradients and the loss accumulate
 * micro-batch by micro-batch into one result. */
sbp_status sbp_grad_batches(sbp_grad_result *res, const sbp_model *m, const sbp_batch *batches,
                            int n, const sbp_grad_opts *opts, sbp_ledger *lg, sbp_err *err);

/* Fills the batch's reference log-probs from a reference model (a streamed forward pass):
 * DPO: each row's sum of target log-probs (the mean for ipo); GRPO: per token, at the
 * objective's temperature. Replaces what the batch file held. */
sbp_status sbp_batch_set_reference(sbp_batch *b, const sbp_model *ref, const sbp_objective *o,
                                   const sbp_grad_opts *g, sbp_ledger *lg, sbp_err *err);

/* Forward only, streamed: logp[b·T + t] = log softmax(logits[b,t] / temperature)[labels[b][t+1]]
 * for every target, 0 elsewhere (a reference model's log-probs for DPO and GRPO). Only the
 * chunk, block and logit-chunk options are used. */
sbp_status sbp_logprobs(double *logp /* (B·T) */, const sbp_model *m, const sbp_batch *b,
                        const sbp_grad_opts *opts, double temperature, sbp_ledger *lg,
                        sbp_err *err);

/* Writes a gradient file: one tensor per parameter under its HF name, F32 or F64 per prec, with
 * the NULL-terminated key/value pairs of meta in __metadata__. Atomic. */
sbp_status sbp_grads_save(const char *path, const sbp_params *ps, sbp_precision prec,
                          const void *grads, const char *const *meta, sbp_err *err);

/* ---------------------------------------------------------------------------------------------
 * Planning: the peak memory of a step without the memory. The same schedule code runs with a
 * planning ledger and every arithmetic step skipped. */

typedef struct {
    sbp_grad_opts grad; /* schedule, block, chunk, logit chunk, chunked logits */
    int B, T;
    int storage_bytes; /* bytes per stored element: 4 (fp32), 2 (bf16) or 8 (fp64); 0 = 4 */
    int optimizer;     /* also charge AdamW's two fp32 moments per parameter */
} sbp_plan_opts;

/* Fills lg (zeroed first) with the ledger of one step of model cfg. */
sbp_status sbp_plan(sbp_ledger *lg, const sbp_config *cfg, const sbp_plan_opts *o, sbp_err *err);

/* Checks before any work is spent that an output file can be created at path: it must not be a
 * directory, and its directory must accept a new file. */
sbp_status sbp_check_writable(const char *path, sbp_err *err);

/* Matrix-product FLOPs of one step of B sequences of T tokens as the engine executes it,
 * recomputation included (src/core/flops.c gives the formula). */
double sbp_step_flops(const sbp_config *c, int B, int T, const sbp_grad_opts *o);

/* Sets OpenMP and OpenBLAS to n threads (process-wide; see the header comment). */
void sbp_set_threads(int n);

#endif /* STREAMBP_H */
