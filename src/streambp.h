/*
 * streambp.h — the public API of libstreambp.
 *
 * The library computes exact parameter gradients of a Hugging Face decoder (Qwen3, Qwen2/2.5,
 * Llama-3, Gemma-3's text model) for a training objective, with one of three backprop schedules:
 * full BP, gradient checkpointing, and StreamBP (arXiv 2506.03077). The three give bit-identical
 * gradients: in the portable numerics for every chunk size, in the fast one for chunks that are
 * multiples of the token block (docs/numerics.md §1).
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

#ifdef __cplusplus
extern "C" {
#endif

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
    SBP_EPEER,    /* another process of a distributed run failed or went silent (exit 3) */
} sbp_status;

typedef struct {
    sbp_status status;
    char msg[768];
} sbp_err;

const char *sbp_status_name(sbp_status st);

/* ---------------------------------------------------------------------------------------------
 * Model configuration (config.json as Hugging Face writes it) */

typedef enum { SBP_QWEN3, SBP_QWEN2, SBP_LLAMA, SBP_GEMMA3 } sbp_family;

typedef struct {
    sbp_family family;
    char model_type[16]; /* "qwen3", "qwen2", "llama", "gemma3_text" (also for a "gemma3"
                          * multimodal directory: its text model is what is read) */
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
    int rope_linear;   /* 1 when rope_type is "linear": inv_freq / rope_factor (Gemma-3 4B+) */
    int tied;          /* tie_word_embeddings: lm_head is the embedding */
    int qkv_bias;      /* Qwen2: bias on q/k/v projections */
    int qk_norm;       /* Qwen3, Gemma-3: per-head RMSNorm of q and k before RoPE */
    double init_range; /* initializer_range, used by sbp_model_init */
    int pad_token_id;  /* every family: HF's nn.Embedding padding_idx, the row that gets no
                        * gradient from input lookups (a tied head still gives it one); -1 when
                        * absent or null */
    /* Gemma-3 (gemma3_text); zero in the other families */
    int sliding_window;         /* W: a local layer's query i sees keys i−W < j <= i; 0: none */
    int sliding_window_pattern; /* layer l is local iff (l+1) % pattern != 0 (HF 4.51.3) */
    double rope_local_theta;    /* rope_local_base_freq: the local layers' RoPE base (no scaling) */
    double query_pre_attn_scalar; /* the attention scale is its ^-0.5 (not head_dim's) */
    int wrapped; /* read from a multimodal "gemma3" directory: config under text_config, weights
                  * named "language_model." + the text model's names; vision tower ignored */
} sbp_config;

/* The attention window of layer l: W for a Gemma-3 sliding (local) layer, 0 for a global layer
 * and for every layer of the other families. */
int sbp_layer_window(const sbp_config *cfg, int layer);
/* The softmax scale of the attention as HF forms it: query_pre_attn_scalar^-0.5 (Gemma-3) or
 * head_dim^-0.5, in double (1/sqrt, two correctly rounded operations; round it to the working
 * precision once). */
double sbp_attn_scale(const sbp_config *cfg);

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
#define SBP_MAX_LORA_R   65536       /* a LoRA adapter's rank r */

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
    SBP_P_PRE_FF_NORM,  /* Gemma-3 pre_feedforward_layernorm */
    SBP_P_POST_FF_NORM, /* Gemma-3 post_feedforward_layernorm (SBP_P_POST_NORM is its
                         * post_attention_layernorm: a norm of the attention output there) */
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
    int lora;       /* 0: a model weight; a LoRA adapter's 1: lora_A (r, in), 2: lora_B (out, r) of
                     * the projection `kind` */
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
/* the same in an adapter's table: lora 1 (lora_A) or 2 (lora_B) of the projection kind */
int64_t sbp_params_offset_lora(const sbp_params *ps, sbp_param_kind kind, int layer, int lora);

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
    SBP_MEM_BATCH,       /* the batch's host arrays (ids, labels, mask, per-row and per-token
                          * log-probs and advantages), charged by sbp_grad for its duration */
    SBP_MEM_NCATS
} sbp_mem_cat;

typedef struct {
    int64_t cur[SBP_MEM_NCATS];
    int64_t peak[SBP_MEM_NCATS];    /* peak of each category on its own */
    int64_t at_peak[SBP_MEM_NCATS]; /* each category at the moment of the total peak */
    int64_t cur_total, peak_total;
    int64_t n_allocs;
    int plan;         /* set before use: allocations only reserve address space (PROT_NONE), so a
                       * planning run that touched a buffer would fault instead of computing */
    void *pool;       /* regions large blocks are carved from (sbp_ledger_keep_blocks), or NULL */
    int64_t cached;   /* their resident bytes that no block uses (not in cur_total) */
    int64_t slack;    /* the regions' rounding to small pages (two a region): in use plus
                         cached stays within the recorded peak plus this */
    int64_t returned; /* bytes the pool has given back to the system so far (to be faulted in
                         again when a block covers them) */
} sbp_ledger;

const char *sbp_mem_cat_name(sbp_mem_cat c);
/* 64-byte aligned, zero-filled (in a planning ledger: inaccessible); NULL when out of memory or
 * address space (nothing is charged then). */
void *sbp_ledger_alloc(sbp_ledger *lg, sbp_mem_cat cat, size_t bytes);
/* The same without the promise of zeros (the caller writes before it reads). */
void *sbp_ledger_alloc_raw(sbp_ledger *lg, sbp_mem_cat cat, size_t bytes);
void sbp_ledger_free(sbp_ledger *lg, void *p);
/* For a ledger that runs many steps: large blocks are carved from regions that stay mapped, so
 * later steps reuse the first one's pages (no new mapping, no page faults); in-use plus cached
 * bytes stay within the ledger's recorded peak (plus slack). drop hands the regions back (those
 * still holding blocks when the last of them is freed). A pooled block is freed with the ledger it
 * came from. */
void sbp_ledger_keep_blocks(sbp_ledger *lg);
void sbp_ledger_drop_blocks(sbp_ledger *lg);
/* Records memory allocated elsewhere (a GPU's): bytes > 0 when it is allocated, < 0 when freed. */
void sbp_ledger_charge(sbp_ledger *lg, sbp_mem_cat cat, int64_t bytes);

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
/* The same for any objective (file formats in docs/training.md#objectives): DPO pairs become 2B
 * rows, GRPO completion masks become labels; scale_rewards: divide GRPO group-normalised rewards by
 * the group std (TRL's default). */
sbp_status sbp_batch_load_as(sbp_batch *b, const char *path, const sbp_config *cfg,
                             sbp_objective_kind kind, int scale_rewards, sbp_err *err);
void sbp_batch_free(sbp_batch *b);
/* Bytes of host memory the batch's arrays hold: ids, labels and mask, and whichever of the
 * objective's per-row and per-token arrays it has (what sbp_grad charges to SBP_MEM_BATCH). */
int64_t sbp_batch_bytes(const sbp_batch *b);
/* Sets n_targets and n_pad_targets from labels and mask (the loaders do this); call it after
 * building or editing a batch in memory. */
void sbp_batch_count_targets(sbp_batch *b);
/* The attention rows that see no key (positions before a row's first real token) and the
 * targets predicted from them: where --unattended changes the result. */
void sbp_batch_count_unattended(const sbp_batch *b, int64_t *rows, int64_t *targets);

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
 * LoRA adapters, with peft's semantics: a projection y = x·Wᵀ (+ b) with an adapter on it becomes
 *     y = x·Wᵀ (+ b) + s·(x·Aᵀ)·Bᵀ,   A: (r, in), B: (out, r),   s = alpha / r (alpha / √r with
 * use_rslora); the base model is frozen. Adapter tensors carry peft's names
 * ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight") and files peft's layout
 * (adapter_config.json + adapter_model.safetensors), so peft reads ours and we read peft's. */

enum {
    SBP_LORA_Q = 1 << 0,
    SBP_LORA_K = 1 << 1,
    SBP_LORA_V = 1 << 2,
    SBP_LORA_O = 1 << 3,
    SBP_LORA_GATE = 1 << 4,
    SBP_LORA_UP = 1 << 5,
    SBP_LORA_DOWN = 1 << 6,
    SBP_LORA_ALL = (1 << 7) - 1 /* peft's "all-linear" (the LM head excluded, as peft does) */
};

typedef struct {
    int r;            /* rank, >= 1 */
    double alpha;     /* lora_alpha, > 0 */
    int use_rslora;   /* scale by alpha / sqrt(r) instead of alpha / r */
    unsigned targets; /* bit set of SBP_LORA_* */
} sbp_lora_config;

typedef struct {
    sbp_lora_config cfg;
    sbp_params params; /* the adapter tensors, peft's names and order (layer by layer, A then B) */
    sbp_precision prec;
    void *w; /* (params.total) float or double */
} sbp_lora;

/* s = alpha / r, or alpha / sqrt(r) with use_rslora. */
double sbp_lora_scaling(const sbp_lora_config *c);
/* "q_proj,k_proj,..." (any of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj) or
 * "all-linear"; 1 on success. */
int sbp_lora_targets_parse(const char *s, unsigned *out);
/* The adapter tensors of model cfg. */
sbp_status sbp_lora_params_build(sbp_params *ps, const sbp_config *cfg, const sbp_lora_config *c,
                                 sbp_err *err);
/* A new adapter as peft initialises one: A Kaiming-uniform (bound 1/sqrt(in), from the seeded
 * generator), B zero — or, with b_std > 0, B normal with that std (a trained-looking adapter,
 * for tests: with B = 0 every gradient of A is 0). */
sbp_status sbp_lora_init(sbp_lora *a, const sbp_config *cfg, const sbp_lora_config *c,
                         uint64_t seed, double b_std, sbp_precision prec, sbp_err *err);
/* Reads a peft adapter directory for model cfg (checks the targets, rank and every shape). */
sbp_status sbp_lora_load(sbp_lora *a, const char *dir, const sbp_config *cfg, sbp_precision prec,
                         sbp_ledger *lg, sbp_err *err);
/* Writes a peft adapter directory (atomic per file); base_model: adapter_config.json's
 * base_model_name_or_path. */
sbp_status sbp_lora_save(const char *dir, const sbp_lora *a, const char *base_model, sbp_err *err);
void sbp_lora_free(sbp_lora *a, sbp_ledger *lg);

/* ---------------------------------------------------------------------------------------------
 * Gradients */

typedef enum { SBP_FULL, SBP_CKPT, SBP_STREAM } sbp_schedule;

const char *sbp_schedule_name(sbp_schedule s);
int sbp_schedule_parse(const char *s, sbp_schedule *out); /* 1 on success */

/* How the arithmetic is done (docs/numerics.md §1, §10):
 *   FAST      faster products, chosen by the instruction set of the build (which ones:
 *             docs/numerics.md §10): the three schedules agree bit for bit for chunks that are
 *             multiples of the block, at any thread count; the bits depend on the machine;
 *   PORTABLE  every operation by the portable arithmetic contract: the bits of every gradient
 *             and of the loss depend on (model, batch, objective, precision) only — not on the
 *             schedule, the chunk sizes, the thread count, the machine or the compiler. */
typedef enum { SBP_NUMERICS_FAST, SBP_NUMERICS_PORTABLE } sbp_numerics;

const char *sbp_numerics_name(sbp_numerics n);
int sbp_numerics_parse(const char *s, sbp_numerics *out); /* 1 on success */

/* Where the arithmetic runs: the CPU, a CUDA GPU, or the CUDA kernels on the CPU through the
 * SIMT emulator of cuda/emu (a test harness: exact, slow). The CUDA backends implement the
 * portable numerics, so they give the portable CPU run's bits. */
typedef enum { SBP_DEVICE_CPU, SBP_DEVICE_CUDA, SBP_DEVICE_CUDA_EMU } sbp_device;

/* Attention rows that see no key (queries before the first real token of a left-padded row):
 *   ZERO     output 0, no gradient (the default; what a masked softmax over nothing means);
 *   HF_EAGER HF's eager attention: the mask's finite minimum swamps the scores, so the softmax is
 *            uniform over all T keys; autograd still passes dS = P(dP − D) to q and k;
 *   HF_SDPA  HF's sdpa path: the row is unmasked and attends to every key with its real scores.
 * Only such rows change; ref/SEMANTICS.md gives the formulas. */
typedef enum {
    SBP_UNATTENDED_ZERO,
    SBP_UNATTENDED_HF_EAGER,
    SBP_UNATTENDED_HF_SDPA
} sbp_unattended;

const char *sbp_unattended_name(sbp_unattended u);
int sbp_unattended_parse(const char *s, sbp_unattended *out); /* 1 on success */

const char *sbp_device_name(sbp_device d);
int sbp_device_parse(const char *s, sbp_device *out); /* 1 on success */
/* 1 when this build has the backend (for cuda: built with nvcc; whether a GPU is present is
 * known when a run starts). */
int sbp_device_built(sbp_device d);

#define SBP_DEFAULT_BLOCK 512
/* The stream chunk when none is given: two blocks (1024 tokens at the default block). The logits
 * chunk's default is one block. */
#define SBP_DEFAULT_CHUNK(block) (2 * (block))

/* Where a step's time goes: each operation of the engine's table (src/engine/ops.h) that the
 * step called, with its calls and wall seconds, the matrix products by shape
 * (docs/performance.md#where-a-step-spends-its-time). Give one in sbp_grad_opts.profile (CPU
 * only); every step it is given to adds to it, so zero it first. Timing costs two clock reads
 * per call and changes no bit. */
enum { SBP_PROFILE_ROWS = 64 };
typedef struct {
    char op[24]; /* the operation's name in the table: "linear_forward", "attention_backward" */
    int n, k;    /* a product's output and input features (N, K); 0 for the other operations */
    int64_t calls;
    double seconds; /* wall time inside the calls */
    double flop;    /* the products' floating-point operations (2·M·N·K each); 0 elsewhere */
} sbp_profile_row;
typedef struct {
    sbp_profile_row rows[SBP_PROFILE_ROWS]; /* in the order of their first call */
    int n_rows;
    int64_t lost;   /* calls of a kind that found every row taken: counted in no row */
    int64_t steps;  /* engine runs added (one per step, one per micro-batch) */
    double seconds; /* their wall time: the rows' sum and what the driver does between calls */
} sbp_profile;

typedef struct {
    sbp_schedule schedule;
    int block;               /* token block of every token reduction; 0 = SBP_DEFAULT_BLOCK */
    int chunk;               /* stream: rows per layer chunk; 0 = SBP_DEFAULT_CHUNK; clamped to T */
    int logit_chunk;         /* rows per logits pass; 0 = one block (stream) or T (full, ckpt) */
    int chunked_logits;      /* full/ckpt: use logit_chunk instead of materialising B*T*V logits */
    sbp_objective objective; /* zero-initialised: SFT */
    sbp_numerics numerics;   /* zero-initialised: fast */
    sbp_device device;       /* zero-initialised: the CPU; cuda devices need portable numerics */
    sbp_unattended unattended; /* rows with no visible key; zero-initialised: output 0 */
    const sbp_lora *lora;      /* with an adapter: the base model is frozen, and the gradient is
                                * the adapter's (laid out as lora->params, lora->prec = the
                                * model's) */
    int emulate_bf16; /* float32 engine only: round every stored tensor and the gradients to
                       * bfloat16, as pure-bf16 training does (give it a model whose weights
                       * went through sbp_model_round_bf16); verify audit's bf16 yardstick */
    /* NULL, or a transport of one process: the whole step here; else this process runs
     * micro-batches k = rank (mod N) and every process ends with the same bits (src/dist,
     * docs/distributed.md); CPU only */
    struct sbp_comm *comm;
    /* with a comm of N > 1: 0, every process ends with the whole gradient; 1 (ZeRO-2: train,
     * grad under mpirun), each ends with its share only, the 4096-element blocks it owns packed
     * in ascending order (res->numel elements; src/dist, docs/distributed.md §7) */
    int sharded;
    /* with a comm of N > 1: S > 1 processes share every sequence (sequence parallel,
     * docs/distributed.md §8), each holding whole token blocks of it; the same bits as one
     * process. S divides N: N / S groups of S, data parallel between the groups (N = D × S);
     * 0 or 1: every process holds whole sequences */
    int seq_ranks;
    /* with seq_ranks > 1: 1, a rank after the first runs each layer's backward without waiting
     * for the previous rank's part of the layer's gradient, keeping the operands of its weight
     * products until that arrives (faster, more memory; the same bits); 0: it waits */
    int seq_overlap;
    /* NULL, or where each operation's calls and time are added (sbp_profile; CPU only) */
    sbp_profile *profile;
    /* NULL: the result holds the whole gradient. Else the gradient is never held whole: each
     * piece of it (a layer's tensors, the head's with the final norm's, the embedding's: the
     * slab's elements [off, off + n), g of the model's precision, rounded to its storage) goes
     * to grad_sink once, as soon as the backward completes it, and its memory is reused for the
     * next; res->grads stays NULL. The same bits as a held gradient. 0 from the sink stops the
     * step (SBP_EIO). One micro-batch, one process, the CPU (sbp_grads_out_put writes a
     * gradient file so; in a plan only its being set is read) */
    int (*grad_sink)(void *ctx, int64_t off, int64_t n, const void *g);
    void *grad_sink_ctx;
} sbp_grad_opts;

typedef struct {
    double loss;
    int64_t n_targets;
    void *grads;                   /* (numel), same precision as the model; charged to the ledger */
    int64_t numel;                 /* the trained table's params.total, or a sharded step's share */
    int block, chunk, logit_chunk; /* the values used after defaults and clamping */
    sbp_device device;             /* where it ran: on a device, grads are not in the ledger */
} sbp_grad_result;

/* One forward + backward step. The gradient slab is allocated into res->grads (free it with
 * sbp_grad_result_free), unless opts->grad_sink takes the gradient piece by piece. The ledger
 * records every buffer of the step: on the CPU, the gradient slab included; on a device
 * (opts->device), the device's buffers only. */
sbp_status sbp_grad(sbp_grad_result *res, const sbp_model *m, const sbp_batch *b,
                    const sbp_grad_opts *opts, sbp_ledger *lg, sbp_err *err);
void sbp_grad_result_free(sbp_grad_result *res, sbp_ledger *lg);

/* Sequence parallel (docs/distributed.md §8): SBP_OK when the N processes of g->comm can share
 * sequences of T tokens as g->seq_ranks asks — S dividing N, each rank whole blocks of the
 * sequence (the portable sums' 128 tokens; in the fast numerics also g->block) — else SBP_EUSAGE
 * naming what is wrong; T = 0 checks the settings alone. Nothing to check with seq_ranks 0 or
 * 1. */
sbp_status sbp_seq_check(int T, const sbp_grad_opts *g, sbp_err *err);

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

/* The same file, the same bytes, written while the step runs, piece by piece as the backward
 * completes them (sbp_grad_opts.grad_sink = sbp_grads_out_put, grad_sink_ctx = the writer), so
 * that the gradient is never held whole. open creates the unnamed output; begin fixes the header
 * from meta, and with it where the data start, before the first piece (a sink can call it at its
 * first piece: the step's loss is known by then); commit writes that header, checks that meta
 * still gives it and that every element was written, and puts the file in place; abort removes
 * it. Both free the writer. A failed put stops the step; sbp_grads_out_error then gives the
 * failure's own error (SBP_OK when none failed). */
typedef struct sbp_grads_out sbp_grads_out;
sbp_status sbp_grads_out_open(sbp_grads_out **w, const char *path, const sbp_params *ps,
                              sbp_precision prec, sbp_err *err);
sbp_status sbp_grads_out_begin(sbp_grads_out *w, const char *const *meta, sbp_err *err);
int sbp_grads_out_put(void *w, int64_t off, int64_t n, const void *g);
sbp_status sbp_grads_out_error(const sbp_grads_out *w, sbp_err *err);
sbp_status sbp_grads_out_commit(sbp_grads_out *w, const char *const *meta, sbp_err *err);
void sbp_grads_out_abort(sbp_grads_out *w);

/* ---------------------------------------------------------------------------------------------
 * Planning: the peak memory of a step without the memory. The same schedule code runs with a
 * planning ledger and every arithmetic step skipped. */

typedef struct {
    sbp_grad_opts grad;   /* schedule, block, chunk, logit chunk, chunked logits, and the
                           * objective (its kind sets the batch's shape); grad.lora is not read */
    int B;                /* SFT: rows; DPO: pairs (2B rows, chosen then rejected); GRPO: rows
                           * (a group of G = B completions) */
    int T;                /* tokens per row */
    int storage_bytes;    /* bytes per stored element: 4 (fp32), 2 (bf16) or 8 (fp64); 0 = 4 */
    int optimizer;        /* also charge AdamW's two fp32 moments per trainable parameter */
    int micro_batches;    /* n micro-batches per step (0 = 1): n > 1 charges the fold's scratch
                           * (the largest gradient bucket, and a tied embedding's) */
    int ranks;            /* N > 1: one process of N running the step (docs/distributed.md): the
                           * rank holding the most; n = 0 then means N micro-batches */
    int seq_ranks;        /* S > 1: groups of S processes share every sequence (sequence parallel,
                           * docs/distributed.md §8), ranks / S groups (ranks 0: one group);
                           * the rank holding the most; n = 0 means one micro-batch a group */
    sbp_lora_config lora; /* r > 0: a LoRA adapter of this rank on these targets is trained:
                           * the base is frozen (its weights, no gradients), the adapter's
                           * weights, gradients (and moments) are charged; alpha is not read */
} sbp_plan_opts;

/* Fills lg (zeroed first) with the ledger of one step of model cfg: the weights (and adapter),
 * the gradients of what is trained, the moments when asked, the batch's host arrays of the
 * objective's shape (sbp_batch_bytes), and every buffer the engine allocates for that
 * objective (DPO's first-pass log-probs included). */
sbp_status sbp_plan(sbp_ledger *lg, const sbp_config *cfg, const sbp_plan_opts *o, sbp_err *err);
/* The most tokens a planned step may hold (rows x T, a DPO pair two rows): planning walks the
 * step and its host arrays token by token (about 8 s and 1 GiB at this limit), so a larger step
 * is refused (SBP_EUSAGE) rather than left running for minutes. */
#define SBP_PLAN_MAX_TOKENS (1 << 26)
/* Sequence parallel's network model (o->seq_ranks S > 1, o->ranks N or S processes): what the
 * rank sending the most sends in a step, in bytes and messages — its engine's K/V, hand-overs
 * and gathers for each of its group's micro-batches (the planning walk with a link that
 * counts), the pieces a group's last rank sends to their owners, the losses' all-gather, and
 * then grad's share to rank 0 or, with o->optimizer, train's clip-norm block sums and updated
 * weights (docs/distributed.md §8). A run's transport counters equal it, plus the start-up
 * check, when its micro-batches have the planned shape. */
sbp_status sbp_plan_seq_traffic(int64_t *bytes, int64_t *messages, const sbp_config *cfg,
                                const sbp_plan_opts *o, sbp_err *err);
/* The largest T of the step o (its T is not read) whose planned peak (lg.peak_total, bytes)
 * fits budget: 0 if not even the shortest fits (T = 1, or 2 for DPO, whose rows need a target);
 * that T's ledger in *at (zeroed when 0). A guess from the peak's slope, a widening bracket, then
 * bisection, which alone decides; a plan too large to reserve address space for does not fit. */
int sbp_plan_largest_T(const sbp_config *cfg, const sbp_plan_opts *o, int64_t budget,
                       sbp_ledger *at);
/* The longest T planning takes for the rows of o (SBP_PLAN_MAX_TOKENS / rows): the search's
 * ceiling, so sbp_plan_largest_T's answer equal to it means "at least". */
/* The fewest tokens a planned step may hold: 1, a DPO pair 2, and with seq_ranks S > 1 enough
 * for every rank to hold whole blocks (sbp_seq_check). */
int sbp_plan_min_T(const sbp_plan_opts *o);
int sbp_plan_max_T(const sbp_plan_opts *o);

/* Checks before any work is spent that an output file can be created at path: it must not be a
 * directory, and its directory must accept a new file. */
sbp_status sbp_check_writable(const char *path, sbp_err *err);

/* Matrix-product FLOPs of one step of B sequences of T tokens as the engine executes it,
 * recomputation included (src/core/flops.c gives the formula). */
double sbp_step_flops(const sbp_config *c, int B, int T, const sbp_grad_opts *o);

/* The rows of T tokens cut for S ranks of a sequence group (sequence parallel) in whole grains,
 * as sbp_seq_slices (src/dist/seqlink.h) but by a stream step's work instead of by rows: the
 * later tokens' queries see more keys, so the earlier ranks take more rows. The bits do not
 * depend on the cut; its memory does (the first rank holds the most rows). bounds (S + 1);
 * 0 when there are fewer grains than ranks. */
int sbp_seq_slices_by_work(int *bounds, const sbp_config *c, int T, int S, int grain);
/* The share of a step's FLOPs on rows [r0, r1) of T (0 … 1): the per-token work above, its
 * attention at its FLOP count (the network model's compute of a rank, plan --seq-ranks). */
double sbp_seq_work_share(const sbp_config *c, int T, int r0, int r1);

/* C (M, N) = A (M, K) · Bᵀ (B: (N, K)), all row-major, with the portable product of the
 * portable numerics: every element one chain of fused multiply-adds in ascending k, so the bits
 * are the same on every machine and thread count (docs/numerics.md §4). 0 on success, -1 when out
 * of memory for its packing buffers. */
int sbp_portable_gemm_f32(float *C, const float *A, const float *B, int M, int N, int K);
int sbp_portable_gemm_f64(double *C, const double *A, const double *B, int M, int N, int K);

/* Sets OpenMP and OpenBLAS to n threads (process-wide; see the header comment). */
void sbp_set_threads(int n);

/* =============================================================================================
 * Training (src/train): AdamW, gradient clipping, learning-rate schedules, data sources and
 * checkpoints, used by `streambp train`. The optimizer and the clipping work on any trainable
 * slab — a pointer, an element count and a precision — so that the full weights and LoRA
 * adapters are trained by the same code. */

/* ---- AdamW: torch.optim.AdamW (decoupled weight decay, bias correction), single-tensor
 * implementation, in torch 2.x's operation order (src/train/adamw.c quotes it). The moments have
 * the slab's precision, as PyTorch keeps them for float32 and float64 parameters. */

typedef struct {
    double beta1, beta2; /* 0 <= beta < 1 (defaults 0.9, 0.999) */
    double eps;          /* >= 0 (default 1e-8) */
    double weight_decay; /* >= 0 (default 0, as HF TrainingArguments) */
} sbp_adamw_opts;

typedef struct {
    int64_t begin, end; /* elements [begin, end) */
} sbp_range;

typedef struct {
    sbp_adamw_opts o;
    sbp_precision prec;
    int64_t n;           /* elements of the trainable slab */
    void *exp_avg;       /* (n) first moments, in prec; charged to SBP_MEM_OPTIMIZER */
    void *exp_avg_sq;    /* (n) second moments, in prec; charged to SBP_MEM_OPTIMIZER */
    int64_t step;        /* steps taken (torch's state["step"]) */
    sbp_range *no_decay; /* (n_no_decay) ascending, disjoint ranges without weight decay */
    int n_no_decay;
    /* ZeRO-2 (docs/distributed.md): NULL, or this process's share of a distributed run (comm of
     * N > 1): the moments of the 4096-element blocks it owns only, the ascending ranges held
     * (n_held), packed in that order in exp_avg and exp_avg_sq; step, save and load then work
     * on those and the others' (src/train/zero2.h) */
    sbp_range *held;
    int n_held;
    struct sbp_comm *comm;
    sbp_ledger *lg; /* ZeRO-2: where save's and load's buffer of one tensor is charged */
} sbp_adamw;

/* Checks the hyper-parameters as torch.optim.AdamW does; the message names the bad one. */
sbp_status sbp_adamw_check(const sbp_adamw_opts *o, sbp_err *err);
/* Zero moments for a slab of n elements in prec, step 0. */
sbp_status sbp_adamw_init(sbp_adamw *a, const sbp_adamw_opts *o, sbp_precision prec, int64_t n,
                          sbp_ledger *lg, sbp_err *err);
/* Excludes ranges of the slab from weight decay (a second parameter group with weight_decay 0,
 * as HF Trainer makes for norms and biases); the ranges are copied. */
sbp_status sbp_adamw_exclude_decay(sbp_adamw *a, const sbp_range *r /* (n) */, int n, sbp_err *err);
void sbp_adamw_free(sbp_adamw *a, sbp_ledger *lg);
/* One optimizer step at learning rate lr: p ← p·(1 − lr·wd), moments, p ← p − lr/bc1 · m /
 * (sqrt(v)/sqrt(bc2) + eps). Every element's arithmetic is the same whatever the thread count. */
void sbp_adamw_step(sbp_adamw *a, void *p /* (n) */, const void *g /* (n), ZeRO-2: the share */,
                    double lr);
/* The ranges of a parameter table that HF Trainer keeps out of weight decay: every norm weight
 * and every bias. *out is malloc'd (free it); *n may be 0. */
sbp_status sbp_params_no_decay(sbp_range **out, int *n, const sbp_params *ps, sbp_err *err);
/* The moments as safetensors ("<name>.exp_avg", "<name>.exp_avg_sq" per tensor of ps, in the
 * slab's precision; "step" and the hyper-parameters in __metadata__), and back. Load checks
 * every name, shape and dtype and fills a, which must have been initialised for ps. */
sbp_status sbp_adamw_save(const char *path, const sbp_adamw *a, const sbp_params *ps, sbp_err *err);
sbp_status sbp_adamw_load(sbp_adamw *a, const char *path, const sbp_params *ps, sbp_err *err);

/* ---- Gradient clipping: torch.nn.utils.clip_grad_norm_ */

/* The L2 norm of the slab, accumulated in float64 in a fixed order (blocks of 4096 elements in
 * ascending order), so it is the same for every thread count. */
double sbp_grad_norm(const void *g /* (n) */, int64_t n, sbp_precision prec);
/* Scales g by min(1, max_norm · 1/(norm + 1e-6)) in the slab's precision, as torch does, and
 * returns the norm before clipping, rounded to the slab's precision (torch's total_norm).
 * max_norm 0: no clipping, the norm is still returned. */
double sbp_clip_grad_norm(void *g /* (n) */, int64_t n, sbp_precision prec, double max_norm);

/* ---- Learning-rate schedules: transformers.get_{cosine,linear,constant}_schedule_with_warmup */

typedef enum { SBP_LR_COSINE, SBP_LR_LINEAR, SBP_LR_CONSTANT } sbp_lr_kind;

typedef struct {
    sbp_lr_kind kind;
    double lr;      /* the peak learning rate */
    int64_t warmup; /* steps of linear warm-up from 0 */
    int64_t total;  /* optimizer steps of the run (num_training_steps) */
} sbp_lr_sched;

const char *sbp_lr_kind_name(sbp_lr_kind k);
int sbp_lr_kind_parse(const char *s, sbp_lr_kind *out); /* 1 on success */
/* The learning rate of optimizer step `step` (0-based; HF: lr_lambda(step), so a run with
 * warm-up takes its first step at lr 0). */
double sbp_lr_at(const sbp_lr_sched *s, int64_t step);

/* ---- Data: batch files, or token-id records from a JSONL file padded into batches */

typedef struct {
    const char *const *paths; /* (n_paths) batch files or directories of them (*.safetensors,
                               * in name order); files named directly keep the order given */
    int n_paths;
    const char *jsonl; /* instead: one record {"input_ids": [...], "labels": [...]} a line */
    int T;             /* jsonl: tokens per row; longer records are truncated, shorter padded */
    int B;             /* jsonl: records per micro-batch */
    sbp_objective objective; /* every batch is checked against it before training starts */
    int scale_rewards;       /* GRPO rewards: as sbp_batch_load_as */
    int reference_model;     /* reference log-probs will come from a model, not the files */
} sbp_data_opts;

typedef struct sbp_data sbp_data;

/* Opens and checks every batch file, or reads and checks every record, before anything runs. */
sbp_status sbp_data_open(sbp_data **d, const sbp_data_opts *o, const sbp_config *cfg, sbp_err *err);
void sbp_data_free(sbp_data *d);
int64_t sbp_data_items(const sbp_data *d);       /* items of an epoch: files, or records */
int sbp_data_items_per_batch(const sbp_data *d); /* 1 (files) or B (jsonl) */
uint64_t sbp_data_hash(const sbp_data *d);       /* of the contents, in order */
int64_t sbp_data_truncated(const sbp_data *d);   /* jsonl records cut to T */
int64_t sbp_data_skipped(const sbp_data *d);     /* jsonl records without a target within T */
/* A file path, or "FILE:LINE"; valid until the next call. */
const char *sbp_data_item_name(sbp_data *d, int64_t i);
/* The micro-batch of items[0..n): a batch file (n = 1), or n records, one a row. */
sbp_status sbp_data_batch(sbp_batch *b, const sbp_data *d, const int64_t *items, int n,
                          sbp_err *err);

/* The order of the items: epochs in sequence, each in file order or in a seeded random
 * permutation (Fisher-Yates on xoshiro256**); the whole state is a few integers, so a
 * checkpoint restores it exactly. */
typedef struct {
    int64_t n;     /* items per epoch */
    int per_batch; /* items per micro-batch; the last one of an epoch may have fewer */
    int shuffle;
    uint64_t seed;
    uint64_t rng[4];    /* the generator's state at the start of the current epoch */
    int64_t epoch, pos; /* the next item is order[pos] of epoch `epoch` */
    int64_t *order;     /* (n) the current epoch's order */
} sbp_sampler;

sbp_status sbp_sampler_init(sbp_sampler *s, int64_t n, int per_batch, int shuffle, uint64_t seed,
                            sbp_err *err);
/* Restores a state saved from epoch, pos and rng (as a checkpoint holds them). */
sbp_status sbp_sampler_restore(sbp_sampler *s, int64_t epoch, int64_t pos, const uint64_t rng[4],
                               sbp_err *err);
/* The items of the next micro-batch into items (per_batch of room); returns how many. */
int sbp_sampler_next(sbp_sampler *s, int64_t *items);
void sbp_sampler_free(sbp_sampler *s);

/* ---- One training step and checkpoints */

typedef struct {
    double loss;      /* of the step's micro-batches taken together */
    double grad_norm; /* before clipping */
    double lr;
    int64_t n_targets;
} sbp_step_result;

/* Gradient of the micro-batches (sbp_grad_batches), clipping to max_grad_norm (0: none), one
 * AdamW step at learning rate lr of the trainable slab: the model's weights, or with an adapter
 * (lora non-NULL; g->lora is not read) the adapter's tensors, the model frozen. The optimizer
 * must have been initialised for that slab. The gradient slab lives only inside. */
sbp_status sbp_train_step(sbp_step_result *r, sbp_model *m, sbp_lora *lora, sbp_adamw *a,
                          const sbp_batch *b, int n, const sbp_grad_opts *g, double lr,
                          double max_grad_norm, sbp_ledger *lg, sbp_err *err);

/* A 64-bit hash of bytes, continuing from h (start with 0), for recognising a run's model and
 * data again; not cryptographic. */
uint64_t sbp_hash64(const void *data, size_t n, uint64_t h);

/* A directory that appears under its final name only when complete: files go into
 * "<path>.tmp.<pid>.XXXXXX" (mkdtemp: unpredictable); commit fsyncs every file and the
 * directory, puts it in place (swapping it with an older directory of that name in one
 * renameat2(RENAME_EXCHANGE), then removing the older one) and fsyncs the parent. A symbolic
 * link at path is refused, never followed or replaced. */
typedef struct {
    char path[4096];
    char tmp[4200];
} sbp_outdir;

sbp_status sbp_outdir_open(sbp_outdir *d, const char *path, sbp_err *err);
/* The path of a file inside the directory being written (buf of n bytes). */
const char *sbp_outdir_file(const sbp_outdir *d, const char *name, char *buf, size_t n);
sbp_status sbp_outdir_commit(sbp_outdir *d, sbp_err *err);
void sbp_outdir_abort(sbp_outdir *d);
/* Removes path: a file or a symbolic link as itself (never what it points to), a directory with
 * everything under it walked through its own descriptors (openat/unlinkat, O_NOFOLLOW). 0 when
 * done or absent, -1 with errno otherwise. */
int sbp_remove_tree(const char *path);
/* In a run directory: the leftovers of writers that were killed ("<name>.tmp.<pid>[.X]",
 * "<name>.old.<pid>[.X]" for the names a run writes, pid no longer alive) removed as
 * sbp_remove_tree does; an older checkpoint moved aside by a writer killed before the new one
 * was in place is renamed back when its name is free. */
void sbp_remove_stale(const char *dir);
/* The SHA-256 of a regular file, as 64 hex digits (out: 65 bytes). */
sbp_status sbp_file_sha256(char out[65], const char *path, sbp_err *err);
/* Checks every file a checkpoint's trainer_state.json lists under "files" against the SHA-256
 * recorded there, naming the first that differs or is missing. *recorded: whether the state
 * lists its files (checkpoints written before this check do not; they pass). */
sbp_status sbp_checkpoint_verify(const char *ckpt, int *recorded, sbp_err *err);
/* N of a name "checkpoint-N" (N at most 9 decimal digits, nothing else), or -1. */
long sbp_checkpoint_number(const char *name);
/* The newest checkpoint-N of run directory dir with N < below (LONG_MAX: any) that is a
 * directory, not a link, holding a regular trainer_state.json; its path in out. N, or -1. */
long sbp_checkpoint_newest(char *out, size_t n, const char *dir, long below);
/* The checkpoint `train --resume PATH` starts from: PATH itself when it holds a
 * trainer_state.json, else its newest checkpoint-N; verified (sbp_checkpoint_verify). One that
 * fails is never replaced silently by an older one: the error names it, why, and the newest
 * that verifies. *recorded as sbp_checkpoint_verify's. */
sbp_status sbp_checkpoint_resume_point(char *ckpt, size_t n, const char *path, int *recorded,
                                       sbp_err *err);
/* Writes a model directory's two files into dir: config.json (config_json verbatim) and
 * model.safetensors (the weights under their HF names, F32 or F64 as m holds them). */
sbp_status sbp_model_save_files(const char *dir, const sbp_model *m, const char *config_json,
                                const char *const *meta, sbp_err *err);

#ifdef __cplusplus
}
#endif

#endif /* STREAMBP_H */
