/* run.h — the library half of `streambp train`: what a run is (its options and the settings a
 * resumed run must share), its state between steps, its checkpoints and its run directory. The
 * command (src/cli/cmd_train.c) parses options, prints and picks exit codes; everything here
 * returns an sbp_status with an sbp_err naming what is wrong and where, and never prints.
 *
 * A run directory:
 *   loss.csv, timing.csv              one row per optimizer step
 *   checkpoint-N/                     config.json, model.safetensors, optimizer.safetensors,
 *                                     trainer_state.json, loss.csv, timing.csv (up to step N);
 *                                     with a LoRA adapter adapter_config.json and
 *                                     adapter_model.safetensors (peft's layout) instead of the
 *                                     model's two files, the moments under the adapter's names
 *   config.json, model.safetensors    the final weights; with an adapter adapter_config.json,
 *                                     adapter_model.safetensors */
#ifndef SBP_TRAIN_RUN_H
#define SBP_TRAIN_RUN_H

#include "../streambp.h"

#include <stdint.h>
#include <stdio.h>

/* ---- what a run is ----------------------------------------------------------------------------
 */

/* A run's options: everything its settings and trainer_state.json record. */
typedef struct {
    const char *model;       /* directory of the model trained (or frozen under an adapter) */
    const char *lora;        /* NULL, or the adapter directory to train */
    const char *ref_model;   /* NULL, or the reference model's directory (DPO, GRPO) */
    const char *jsonl;       /* JSONL data, or NULL with data[] batch files */
    const char *const *data; /* (n_data) batch files or directories */
    int n_data;
    int T, B, shuffle;       /* jsonl: tokens per row, records per micro-batch; shuffle */
    unsigned long long seed; /* of the shuffle */
    int steps, grad_accum, warmup;
    sbp_lr_sched sched; /* lr and kind; warmup and total filled from the above */
    sbp_adamw_opts adam;
    int no_decay_nb;      /* no weight decay on norm weights and biases */
    double max_grad_norm; /* 0: no clipping */
    sbp_precision prec;
    sbp_grad_opts g;   /* schedule, chunks, block, objective */
    int scale_rewards; /* GRPO reward scaling */
    int threads;       /* recorded in trainer_state.json's "run" */
} sbp_train_opts;

/* The settings of a run as (key, text) pairs, in the order trainer_state.json lists them: a
 * resumed run must have every one the same. */
enum { SBP_TRAIN_MAX_SETTINGS = 48 };
typedef struct {
    const char *key[SBP_TRAIN_MAX_SETTINGS];
    char val[SBP_TRAIN_MAX_SETTINGS][160];
    int n;
} sbp_train_settings;

/* The settings of a run of o on model m (w_hash: sbp_hash64 of its weights), data d, and with
 * lora non-NULL the adapter (lora_hash of its initial tensors) after the model's; ref_hash of the
 * reference model's weights when o->ref_model is set. A full-weight run writes exactly the
 * settings it wrote before adapters existed, so its older checkpoints still resume. */
void sbp_train_settings_build(sbp_train_settings *s, const sbp_train_opts *o, const sbp_model *m,
                              uint64_t w_hash, const sbp_lora *lora, uint64_t lora_hash,
                              const sbp_data *d, uint64_t ref_hash);
/* How a setting is named in messages: the option that sets it, or what it is. */
const char *sbp_train_setting_label(const char *key);
/* sbp_hash64 over every key and value, NUL included, in order. */
uint64_t sbp_train_settings_hash(const sbp_train_settings *s);
/* "qwen3 L=2 C=64 F=128 heads 4/2 head_dim 16 V=512 tied qk-norm" */
void sbp_describe_model(char *buf, size_t n, const sbp_config *c);
/* "r 8, alpha 16, use_rslora 0, targets q_proj v_proj": what makes two adapters interchangeable */
void sbp_describe_lora(char *buf, size_t n, const sbp_lora_config *c);

/* ---- the state of a run between steps ---------------------------------------------------------
 */

typedef struct {
    int64_t step, tokens;        /* optimizer steps done; real (unmasked) tokens seen */
    sbp_sampler sampler;         /* the data position */
    char *loss_csv, *timing_csv; /* the logs so far, as written */
    size_t loss_len, loss_cap, timing_len, timing_cap;
} sbp_run_state;

/* The logs' first lines. */
extern const char sbp_loss_csv_header[], sbp_timing_csv_header[];
/* Appends text to the growing buffer *buf (*len bytes used of *cap, NUL-terminated); 0 when out of
 * memory (the buffer then unchanged). */
int sbp_text_append(char **buf, size_t *len, size_t *cap, const char *text);
/* The logs of a fresh run: their header lines. */
sbp_status sbp_run_state_start(sbp_run_state *rs, sbp_err *err);
void sbp_run_state_free(sbp_run_state *rs);

/* ---- checkpoints ------------------------------------------------------------------------------
 */

/* What a run trains, as a checkpoint or the end of a run writes it into dir: the model's files
 * (config.json with the text config_json, model.safetensors; a non-finite weight is refused,
 * naming it and the step), or with lora its adapter directory in peft's layout (base_model: the
 * model's path, recorded in adapter_config.json). */
sbp_status sbp_train_save_trained(const char *dir, const char *base_model, const sbp_model *m,
                                  const sbp_lora *lora, const char *config_json, int64_t step,
                                  sbp_err *err);
/* Writes out/checkpoint-<rs->step> atomically (sbp_outdir): the trained weights or adapter, the
 * optimizer's moments, the logs so far and trainer_state.json (the step, the data position, the
 * settings s, how this part of the run was made (o), and the SHA-256 of every other file). Its
 * path goes to where. */
sbp_status sbp_checkpoint_save(char *where, size_t where_n, const char *out,
                               const sbp_train_opts *o, const sbp_run_state *rs,
                               const sbp_train_settings *s, const sbp_model *m,
                               const sbp_lora *lora, const char *config_json, const sbp_adamw *opt,
                               sbp_err *err);
/* Reads the checkpoint ckpt's trainer_state.json and logs and checks it belongs to a run of the
 * settings s (a full-weight run and an adapter's told apart first, then the first setting that
 * differs named); fills rs (the logs, the step, the tokens, the data position). The weights and
 * the moments are the caller's to load (they need the run's model). Nothing is written. */
sbp_status sbp_checkpoint_read(sbp_run_state *rs, const char *ckpt, const sbp_train_settings *s,
                               sbp_err *err);

/* ---- the run directory ------------------------------------------------------------------------
 */

/* The longest path a run takes for its directory, model, data and checkpoints: every buffer
 * leaves room for what is appended to it. */
enum { SBP_RUN_PATH_MAX = 3000 };

/* What dir holds that marks it as a training run's directory ("model.safetensors",
 * "trainer_state.json", "adapter_model.safetensors" or "checkpoint directories"), or NULL: a real
 * directory only (not a link to one), and the logs alone are no run (a run that died before its
 * first checkpoint leaves only them). */
const char *sbp_rundir_holds_run(const char *dir);

/* Where a run into the directory out starts. */
typedef struct {
    char ckpt[4300]; /* the checkpoint resumed from, verified; "" for a fresh run */
    int unverified;  /* ckpt lists no file hashes (written before checkpoints recorded them) */
    int stale_logs;  /* out holds only the logs of a run that ended before its first checkpoint:
                      * a fresh run replaces them */
} sbp_run_start;
/* Checks out against resume (NULL: a fresh run) before anything is written: out is no file; the
 * checkpoint of resume (a checkpoint directory, or the newest checkpoint-N of a run directory
 * that verifies: sbp_checkpoint_resume_point); out holds no run unless resuming, and then only
 * the checkpoint's own. s->unverified is set as soon as the checkpoint is found, also when a
 * later check fails. */
sbp_status sbp_rundir_start(sbp_run_start *s, const char *out, const char *resume, sbp_err *err);

/* The two logs of a run directory, open for appending. */
typedef struct {
    FILE *loss, *timing;
    const char *out;
} sbp_run_logs;
/* Creates out (and its parents), removes what dead writers left there (sbp_remove_stale), writes
 * rs's logs as loss.csv and timing.csv atomically and opens them for appending (never through a
 * symbolic link, regular files only). */
sbp_status sbp_rundir_open_logs(sbp_run_logs *l, const char *out, const sbp_run_state *rs,
                                sbp_err *err);
/* Appends one row to each log: to rs's copies (the next checkpoint's) and to the files, flushed. */
sbp_status sbp_rundir_log(sbp_run_logs *l, sbp_run_state *rs, const char *loss_row,
                          const char *timing_row, sbp_err *err);
void sbp_rundir_close_logs(sbp_run_logs *l);

/* ---- a run, loaded and checked, ready to step -------------------------------------------------
 */

typedef struct {
    sbp_model m;   /* the model: trained, or frozen under the adapter */
    sbp_model ref; /* has_ref: the reference model (DPO, GRPO) */
    sbp_lora lora; /* has_lora: the adapter trained */
    int has_ref, has_lora;
    sbp_data *data;
    sbp_adamw opt;
    sbp_run_state rs;
    sbp_train_settings settings;
    char *config_json; /* the model's config.json, as read */
    sbp_batch *mb;     /* (grad_accum) the micro-batches of a step */
    int64_t *items;    /* (items per micro-batch) sampler output */
    int n_mb;
} sbp_train_run;

/* Loads and checks everything a run of o needs before anything is written: the model, the
 * adapter, the reference model, the data, the settings, the optimizer; with ckpt (a verified
 * checkpoint: sbp_rundir_start) the state, the weights or adapter and the moments of that
 * checkpoint, checked to belong to this run; otherwise the logs' headers. */
sbp_status sbp_train_run_open(sbp_train_run *r, const sbp_train_opts *o, const char *ckpt,
                              sbp_ledger *lg, sbp_err *err);
/* The next step's r->n_mb (= o->grad_accum) micro-batches into r->mb, in the sampler's order
 * (with a reference model, their reference log-probabilities from o's objective); *tokens: their
 * real (unmasked) tokens. */
sbp_status sbp_train_run_batches(sbp_train_run *r, const sbp_train_opts *o, int64_t *tokens,
                                 sbp_ledger *lg, sbp_err *err);
void sbp_train_run_free(sbp_train_run *r, sbp_ledger *lg);

#endif
