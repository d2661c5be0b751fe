/* run.c — a training run's state between steps and its checkpoints (see run.h).
 *
 * What makes a run resume to the bit: a checkpoint holds everything that is not a function of the
 * settings exactly: the trained weights or adapter and the moments as their bits, the step, the
 * data position and the generator state, and the logs so far (which hold only such values;
 * wall-clock times and memory peaks go to timing.csv). */
#include "run.h"

#include "../core/err.h"
#include "../dist/dist.h"
#include "../io/file.h"
#include "../io/train_state.h"

#include <cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char sbp_loss_csv_header[] = "step,epoch,loss,lr,grad_norm,targets,tokens\n";
const char sbp_timing_csv_header[] =
    "step,seconds,tokens_per_second,ledger_peak_bytes,rss_peak_bytes\n";

int sbp_text_append(char **buf, size_t *len, size_t *cap, const char *text) {
    size_t n = strlen(text);
    if (*len + n + 1 > *cap) {
        size_t nc = (*cap ? *cap * 2 : 4096) + n;
        char *nb = realloc(*buf, nc);
        if (!nb) return 0;
        *buf = nb, *cap = nc;
    }
    memcpy(*buf + *len, text, n + 1);
    *len += n;
    return 1;
}

sbp_status sbp_run_state_start(sbp_run_state *rs, sbp_err *err) {
    if (!sbp_text_append(&rs->loss_csv, &rs->loss_len, &rs->loss_cap, sbp_loss_csv_header) ||
        !sbp_text_append(&rs->timing_csv, &rs->timing_len, &rs->timing_cap, sbp_timing_csv_header))
        return sbp_fail(err, SBP_ENOMEM, "out of memory");
    return SBP_OK;
}

void sbp_run_state_free(sbp_run_state *rs) {
    sbp_sampler_free(&rs->sampler);
    free(rs->loss_csv), free(rs->timing_csv);
    rs->loss_csv = rs->timing_csv = NULL;
    rs->loss_len = rs->loss_cap = rs->timing_len = rs->timing_cap = 0;
}

/* ---- writing a checkpoint -----------------------------------------------------------------------
 */

static cJSON *state_json(const sbp_train_opts *o, const sbp_run_state *rs,
                         const sbp_train_settings *s, cJSON *files) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", "streambp-train-1");
    cJSON_AddNumberToObject(j, "step", (double)rs->step);
    cJSON_AddNumberToObject(j, "tokens", (double)rs->tokens);
    cJSON *data = cJSON_AddObjectToObject(j, "data_position");
    cJSON_AddNumberToObject(data, "epoch", (double)rs->sampler.epoch);
    cJSON_AddNumberToObject(data, "item", (double)rs->sampler.pos);
    cJSON *rng = cJSON_AddArrayToObject(data, "rng_at_epoch_start");
    for (int i = 0; i < 4; i++) {
        char h[20];
        snprintf(h, sizeof h, "%016" PRIx64, rs->sampler.rng[i]);
        cJSON_AddItemToArray(rng, cJSON_CreateString(h));
    }
    cJSON *set = cJSON_AddObjectToObject(j, "settings");
    for (int i = 0; i < s->n; i++) cJSON_AddStringToObject(set, s->key[i], s->val[i]);
    char h[20];
    snprintf(h, sizeof h, "%016" PRIx64, sbp_train_settings_hash(s));
    cJSON_AddStringToObject(j, "settings_hash", h);
    /* how this part of the run was made; free to differ on resume */
    cJSON *run = cJSON_AddObjectToObject(j, "run");
    cJSON_AddStringToObject(run, "model", o->model);
    if (o->lora) cJSON_AddStringToObject(run, "lora", o->lora);
    if (o->jsonl)
        cJSON_AddStringToObject(run, "jsonl", o->jsonl);
    else
        cJSON_AddItemToObject(run, "data", cJSON_CreateStringArray(o->data, o->n_data));
    cJSON_AddStringToObject(run, "schedule", sbp_schedule_name(o->g.schedule));
    cJSON_AddNumberToObject(run, "chunk", o->g.chunk);
    cJSON_AddNumberToObject(run, "logit_chunk", o->g.logit_chunk);
    cJSON_AddBoolToObject(run, "chunked_logits", o->g.chunked_logits);
    cJSON_AddNumberToObject(run, "threads", o->threads);
    cJSON_AddNumberToObject(run, "ranks", sbp_comm_size(o->g.comm)); /* informational */
    cJSON_AddStringToObject(run, "implementation", "streambp " SBP_VERSION);
    /* the SHA-256 of every other file of the checkpoint: resume checks them
     * (sbp_checkpoint_verify) */
    cJSON_AddItemToObject(j, "files", files);
    return j;
}

/* The SHA-256 of every file in the directory being written (ours, from mkdtemp), as a JSON
 * object name -> hex; NULL with err set on failure. */
static cJSON *hash_files(const sbp_outdir *d, sbp_err *err) {
    static const char *const names[] = {"config.json",
                                        "model.safetensors",
                                        "adapter_config.json",
                                        "adapter_model.safetensors",
                                        "optimizer.safetensors",
                                        "loss.csv",
                                        "timing.csv"};
    cJSON *files = cJSON_CreateObject();
    char p[4300], hex[65];
    for (size_t i = 0; files && i < sizeof names / sizeof *names; i++) {
        struct stat sb;
        if (lstat(sbp_outdir_file(d, names[i], p, sizeof p), &sb) != 0) continue;
        if (sbp_file_sha256(hex, p, err)) {
            cJSON_Delete(files);
            return NULL;
        }
        cJSON_AddStringToObject(files, names[i], hex);
    }
    if (!files) sbp_fail(err, SBP_ENOMEM, "out of memory");
    return files;
}

sbp_status sbp_train_save_trained(const char *dir, const char *base_model, const sbp_model *m,
                                  const sbp_lora *lora, const char *config_json, int64_t step,
                                  sbp_err *err) {
    if (lora) return sbp_lora_save(dir, lora, base_model, err); /* refuses non-finite tensors */
    /* a step that left a non-finite weight fails here instead of writing it */
    for (int i = 0; i < m->params.n; i++) {
        const sbp_param *p = &m->params.p[i];
        for (int64_t j = 0; j < p->numel; j++) {
            const double v = m->prec == SBP_FP64 ? ((const double *)m->w)[p->offset + j]
                                                 : ((const float *)m->w)[p->offset + j];
            if (!isfinite(v))
                return sbp_fail(err, SBP_ENUMERIC,
                                "step %lld: weight \"%s\" element %lld is %g; not saved",
                                (long long)step, p->name, (long long)j, v);
        }
    }
    char stepv[32];
    snprintf(stepv, sizeof stepv, "%lld", (long long)step);
    const char *meta[] = {"format", "pt", "generator", "streambp train", "step", stepv, NULL};
    return sbp_model_save_files(dir, m, config_json, meta, err);
}

sbp_status sbp_checkpoint_save(char *where, size_t where_n, const char *out,
                               const sbp_train_opts *o, const sbp_run_state *rs,
                               const sbp_train_settings *s, const sbp_model *m,
                               const sbp_lora *lora, const char *config_json, const sbp_adamw *opt,
                               sbp_err *err) {
    if (snprintf(where, where_n, "%s/checkpoint-%lld", out, (long long)rs->step) >= (int)where_n)
        return sbp_fail(err, SBP_EUSAGE, "%.80s...: path too long", out);
    sbp_outdir d;
    sbp_status st = sbp_outdir_open(&d, where, err);
    if (st) return st;
    char p[4300];
    st = sbp_train_save_trained(d.tmp, o->model, m, lora, config_json, rs->step, err);
    if (!st)
        st = sbp_adamw_save(sbp_outdir_file(&d, "optimizer.safetensors", p, sizeof p), opt,
                            lora ? &lora->params : &m->params, err);
    if (!st)
        st = sbp_write_atomic(sbp_outdir_file(&d, "loss.csv", p, sizeof p), rs->loss_csv,
                              rs->loss_len, err);
    if (!st)
        st = sbp_write_atomic(sbp_outdir_file(&d, "timing.csv", p, sizeof p), rs->timing_csv,
                              rs->timing_len, err);
    cJSON *files = st ? NULL : hash_files(&d, err);
    if (!st && !files) st = err->status ? err->status : SBP_ENOMEM;
    if (!st) {
        cJSON *j = state_json(o, rs, s, files);
        char *text = cJSON_Print(j);
        cJSON_Delete(j);
        if (!text)
            st = sbp_fail(err, SBP_ENOMEM, "out of memory");
        else {
            st = sbp_write_atomic(sbp_outdir_file(&d, "trainer_state.json", p, sizeof p), text,
                                  strlen(text), err);
            free(text);
        }
    }
    if (st) {
        sbp_outdir_abort(&d);
        return st;
    }
    return sbp_outdir_commit(&d, err);
}

/* ---- reading one back ----------------------------------------------------------------------- */

/* The checkpoint's settings against s: the kind of run first (full weights or an adapter), then
 * every setting, naming the first that differs, then their number. */
static sbp_status check_settings(const cJSON *set, const char *ckpt, const sbp_train_settings *s,
                                 sbp_err *err) {
    const char *their_lora = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(set, "lora"));
    int ours_lora = 0;
    for (int i = 0; i < s->n; i++) ours_lora |= strcmp(s->key[i], "lora") == 0;
    if (their_lora && !ours_lora)
        return sbp_fail(err, SBP_EINPUT,
                        "--resume %s: the checkpoint's run trains a LoRA adapter (%s); this run "
                        "trains the full weights. Give --lora with the adapter that run started "
                        "from",
                        ckpt, their_lora);
    if (!their_lora && ours_lora)
        return sbp_fail(err, SBP_EINPUT,
                        "--resume %s: the checkpoint's run trains the full weights; this run a "
                        "LoRA adapter (--lora). Resume it without --lora",
                        ckpt);
    for (int i = 0; i < s->n; i++) {
        const char *theirs = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(set, s->key[i]));
        if (!theirs || strcmp(theirs, s->val[i]) != 0)
            return sbp_fail(err, SBP_EINPUT,
                            "--resume %s: the checkpoint's run has %s = %s, this run %s. A run "
                            "resumes with the settings it started with; only --schedule, "
                            "--chunk, --logit-chunk, --chunked-logits, --threads, --save-every, "
                            "--stop-at, --log-every, --plot and --json may change",
                            ckpt, sbp_train_setting_label(s->key[i]), theirs ? theirs : "(missing)",
                            s->val[i]);
    }
    if (cJSON_GetArraySize(set) != s->n)
        return sbp_fail(err, SBP_EINPUT,
                        "--resume %s: the checkpoint's settings hold %d entries, "
                        "this version writes %d",
                        ckpt, cJSON_GetArraySize(set), s->n);
    return SBP_OK;
}

/* ckpt/name (a log) into the buffer *buf, replacing what it held. */
static sbp_status read_log(char **buf, size_t *len, size_t *cap, const char *ckpt, const char *name,
                           sbp_err *err) {
    char p[4300], *csv = NULL;
    if (snprintf(p, sizeof p, "%s/%s", ckpt, name) >= (int)sizeof p)
        return sbp_fail(err, SBP_EUSAGE, "%.80s...: path too long", ckpt);
    sbp_status st = sbp_read_text(&csv, NULL, p, 1u << 30, err);
    if (st) return st;
    *len = *cap = 0;
    free(*buf);
    *buf = NULL;
    if (!sbp_text_append(buf, len, cap, csv)) st = sbp_fail(err, SBP_ENOMEM, "out of memory");
    free(csv);
    return st;
}

sbp_status sbp_checkpoint_read(sbp_run_state *rs, const char *ckpt, const sbp_train_settings *s,
                               sbp_err *err) {
    char p[4300], *text = NULL;
    size_t n = 0;
    sbp_train_state ts;
    if (snprintf(p, sizeof p, "%s/trainer_state.json", ckpt) >= (int)sizeof p)
        return sbp_fail(err, SBP_EUSAGE, "%.80s...: path too long", ckpt);
    sbp_status st = sbp_read_text(&text, &n, p, 16u << 20, err);
    if (!st) st = sbp_train_state_parse(&ts, text, n, p, err);
    free(text);
    if (st) return st;
    st = check_settings(ts.settings, ckpt, s, err);
    if (!st) {
        rs->step = ts.step;
        rs->tokens = ts.tokens;
        st = sbp_sampler_restore(&rs->sampler, ts.epoch, ts.item, ts.rng, err);
        if (st) sbp_fail_prefix(err, "%s: ", p);
    }
    sbp_train_state_free(&ts);
    /* the logs up to this step */
    if (!st) st = read_log(&rs->loss_csv, &rs->loss_len, &rs->loss_cap, ckpt, "loss.csv", err);
    if (!st)
        st = read_log(&rs->timing_csv, &rs->timing_len, &rs->timing_cap, ckpt, "timing.csv", err);
    return st;
}
