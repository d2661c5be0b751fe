/* batch.c — reading and checking batch files (safetensors) for SFT, DPO and GRPO.
 *
 * Every objective becomes rows of (input_ids, labels, attention_mask) with labels shifted inside
 * (position t predicts labels[t+1]; −100 ignored), plus what the objective needs on top:
 *   SFT   input_ids, labels, optional attention_mask                               [B, T]
 *   DPO   chosen_/rejected_ input_ids, labels, optional attention_mask    [B, Tc], [B, Tr]
 *         optional ref_chosen_logps, ref_rejected_logps                                [B]
 *         -> 2B rows, chosen first, padded on the right to T = max(Tc, Tr)
 *   GRPO  input_ids, completion_mask, optional attention_mask                        [B, T]
 *         advantages [B], or rewards [B] with "group_size"/"num_generations" in the metadata
 *         optional old_logps, ref_logps [B, T], the value for token t at position t
 *         -> labels = input_ids on completion tokens, −100 elsewhere
 * Integer tensors may be any integer dtype, float ones any float dtype. Every value is checked
 * before anything runs, so a bad batch never produces a half-written gradient file. */
#include "../core/err.h"
#include "../streambp.h"
#include "safetensors.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Reads 2-D tensor `name` as int64 (rows × cols); rows and cols are taken from it when 0, else
 * must match. */
static sbp_status read_int2(int64_t **out, const sbp_st_file *sf, const char *name, int *rows,
                            int *cols, const char *like, sbp_err *err) {
    const sbp_st_tensor *t = sbp_st_find(sf, name);
    if (!t) return sbp_fail(err, SBP_EINPUT, "%s: batch has no tensor \"%s\"", sf->path, name);
    if (t->ndim != 2)
        return sbp_fail(err, SBP_EINPUT, "%s: tensor \"%s\" must be 2-D [B, T], not %d-D", sf->path,
                        name, t->ndim);
    if (*rows == 0) {
        if (t->shape[0] < 1 || t->shape[1] < 1)
            return sbp_fail(err, SBP_EINPUT,
                            "%s: tensor \"%s\" has shape [%lld, %lld]; B and T must be >= 1",
                            sf->path, name, (long long)t->shape[0], (long long)t->shape[1]);
        if (t->shape[0] > (1 << 20) || t->shape[1] > (1 << 30))
            return sbp_fail(err, SBP_EINPUT, "%s: tensor \"%s\" is too large", sf->path, name);
        *rows = (int)t->shape[0];
        *cols = (int)t->shape[1];
    } else if (t->shape[0] != *rows || t->shape[1] != *cols) {
        return sbp_fail(err, SBP_EINPUT,
                        "%s: tensor \"%s\" has shape [%lld, %lld] but %s is "
                        "[%d, %d]",
                        sf->path, name, (long long)t->shape[0], (long long)t->shape[1], like, *rows,
                        *cols);
    }
    *out = malloc(sizeof **out * (size_t)t->numel);
    if (!*out) return sbp_fail(err, SBP_ENOMEM, "%s: out of memory for \"%s\"", sf->path, name);
    return sbp_st_read(sf, t, *out, SBP_DT_I64, err);
}

/* Reads float tensor `name` of exactly `n` elements in shape [d0] (d1 == 0) or [d0, d1]. */
static sbp_status read_float(double **out, const sbp_st_file *sf, const char *name, int d0, int d1,
                             sbp_err *err) {
    const sbp_st_tensor *t = sbp_st_find(sf, name);
    if (!t) return sbp_fail(err, SBP_EINPUT, "%s: batch has no tensor \"%s\"", sf->path, name);
    int ok = d1 ? t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1
                : t->ndim == 1 && t->shape[0] == d0;
    if (!ok) {
        char want[48];
        if (d1)
            snprintf(want, sizeof want, "[%d, %d]", d0, d1);
        else
            snprintf(want, sizeof want, "[%d]", d0);
        return sbp_fail(err, SBP_EINPUT, "%s: tensor \"%s\" must have shape %s", sf->path, name,
                        want);
    }
    size_t n = (size_t)t->numel;
    *out = malloc(sizeof **out * (n ? n : 1));
    if (!*out) return sbp_fail(err, SBP_ENOMEM, "%s: out of memory for \"%s\"", sf->path, name);
    sbp_status st = sbp_st_read(sf, t, *out, SBP_DT_F64, err);
    for (size_t i = 0; i < n && !st; i++)
        if (!isfinite((*out)[i]))
            st = sbp_fail(err, SBP_EINPUT, "%s: tensor \"%s\" element %zu is not finite", sf->path,
                          name, i);
    return st;
}

static sbp_status alloc_rows(sbp_batch *b, int B, int T, const char *path, sbp_err *err) {
    size_t n = (size_t)B * T;
    b->B = B, b->T = T;
    b->ids = calloc(n, sizeof *b->ids);
    b->labels = malloc(sizeof *b->labels * n);
    b->mask = calloc(n, 1);
    if (!b->ids || !b->labels || !b->mask)
        return sbp_fail(err, SBP_ENOMEM, "%s: out of memory", path);
#ifdef SBP_PLANT_DPO_PAD_LABEL_ZERO
    for (size_t i = 0; i < n; i++)
        b->labels[i] = 0; /* planted bug (tests/test_plant.c); never in a normal build */
#else
    for (size_t i = 0; i < n; i++) b->labels[i] = SBP_IGNORE;
#endif
    return SBP_OK;
}

/* Copies rows × cols of (ids, labels, mask) into rows [r0, r0+rows) of b, checking values. A
 * NULL mask means all ones. `what` names the tensors in messages ("chosen_"). */
static sbp_status put_rows(sbp_batch *b, int r0, int rows, int cols, const int64_t *ids,
                           const int64_t *labels, const int64_t *mask, const sbp_config *cfg,
                           const char *path, const char *what, sbp_err *err) {
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < cols; t++) {
            size_t i = (size_t)r * cols + t, o = (size_t)(r0 + r) * b->T + t;
            if (ids[i] < 0 || ids[i] >= cfg->vocab)
                return sbp_fail(err, SBP_EINPUT,
                                "%s: %sinput_ids[%d][%d] = %lld is outside the vocabulary [0, %d)",
                                path, what, r, t, (long long)ids[i], cfg->vocab);
            if (labels[i] != SBP_IGNORE && (labels[i] < 0 || labels[i] >= cfg->vocab))
                return sbp_fail(err, SBP_EINPUT,
                                "%s: %slabels[%d][%d] = %lld is neither -100 nor in [0, %d)", path,
                                what, r, t, (long long)labels[i], cfg->vocab);
            if (mask && mask[i] != 0 && mask[i] != 1)
                return sbp_fail(err, SBP_EINPUT,
                                "%s: %sattention_mask[%d][%d] = %lld is not 0 or 1", path, what, r,
                                t, (long long)mask[i]);
            b->ids[o] = (int32_t)ids[i];
            b->labels[o] = (int32_t)labels[i];
            b->mask[o] = mask ? (uint8_t)mask[i] : 1;
        }
    return SBP_OK;
}

void sbp_batch_count_targets(sbp_batch *b) {
    b->n_targets = b->n_pad_targets = 0;
    for (int r = 0; r < b->B; r++)
        for (int t = 0; t + 1 < b->T; t++)
#ifdef SBP_PLANT_UNSHIFTED_NORMALISER
            if (b->labels[(size_t)r * b->T + t] !=
                SBP_IGNORE) { /* planted bug (tests/test_plant.c); never in a normal build */
#else
            if (b->labels[(size_t)r * b->T + t + 1] != SBP_IGNORE) {
#endif
                b->n_targets++;
                b->n_pad_targets += b->mask[(size_t)r * b->T + t] == 0;
            }
}

static sbp_status load_sft(sbp_batch *b, const sbp_st_file *sf, const sbp_config *cfg,
                           sbp_err *err) {
    int64_t *ids = NULL, *labels = NULL, *mask = NULL;
    int B = 0, T = 0;
    sbp_status st = read_int2(&ids, sf, "input_ids", &B, &T, "", err);
    if (!st) st = read_int2(&labels, sf, "labels", &B, &T, "input_ids", err);
    if (!st && sbp_st_find(sf, "attention_mask"))
        st = read_int2(&mask, sf, "attention_mask", &B, &T, "input_ids", err);
    if (!st) st = alloc_rows(b, B, T, sf->path, err);
    if (!st) st = put_rows(b, 0, B, T, ids, labels, mask, cfg, sf->path, "", err);
    free(ids), free(labels), free(mask);
    return st;
}

static sbp_status load_dpo(sbp_batch *b, const sbp_st_file *sf, const sbp_config *cfg,
                           sbp_err *err) {
    int64_t *ci = NULL, *cl = NULL, *cm = NULL, *ri = NULL, *rl = NULL, *rm = NULL;
    int B = 0, Tc = 0, Br = 0, Tr = 0;
    sbp_status st = read_int2(&ci, sf, "chosen_input_ids", &B, &Tc, "", err);
    if (!st) st = read_int2(&cl, sf, "chosen_labels", &B, &Tc, "chosen_input_ids", err);
    if (!st && sbp_st_find(sf, "chosen_attention_mask"))
        st = read_int2(&cm, sf, "chosen_attention_mask", &B, &Tc, "chosen_input_ids", err);
    if (!st) st = read_int2(&ri, sf, "rejected_input_ids", &Br, &Tr, "", err);
    if (!st && Br != B)
        st = sbp_fail(err, SBP_EINPUT, "%s: %d chosen but %d rejected sequences", sf->path, B, Br);
    if (!st) st = read_int2(&rl, sf, "rejected_labels", &Br, &Tr, "rejected_input_ids", err);
    if (!st && sbp_st_find(sf, "rejected_attention_mask"))
        st = read_int2(&rm, sf, "rejected_attention_mask", &Br, &Tr, "rejected_input_ids", err);
    if (!st) st = alloc_rows(b, 2 * B, Tc > Tr ? Tc : Tr, sf->path, err);
    if (!st) st = put_rows(b, 0, B, Tc, ci, cl, cm, cfg, sf->path, "chosen_", err);
    if (!st) st = put_rows(b, B, B, Tr, ri, rl, rm, cfg, sf->path, "rejected_", err);
    b->pairs = B;
    int has_c = sbp_st_find(sf, "ref_chosen_logps") != NULL;
    int has_r = sbp_st_find(sf, "ref_rejected_logps") != NULL;
    if (!st && has_c != has_r)
        st = sbp_fail(err, SBP_EINPUT, "%s: ref_chosen_logps and ref_rejected_logps come together",
                      sf->path);
    double *rc = NULL, *rr = NULL;
    if (!st && has_c) {
        st = read_float(&rc, sf, "ref_chosen_logps", B, 0, err);
        if (!st) st = read_float(&rr, sf, "ref_rejected_logps", B, 0, err);
        if (!st && !(b->ref_seq_logps = malloc(sizeof(double) * 2 * (size_t)B)))
            st = sbp_fail(err, SBP_ENOMEM, "out of memory");
        for (int i = 0; i < B && !st; i++)
            b->ref_seq_logps[i] = rc[i], b->ref_seq_logps[B + i] = rr[i];
    }
    free(ci), free(cl), free(cm), free(ri), free(rl), free(rm), free(rc), free(rr);
    return st;
}

/* Group-normalised advantages, TRL: (r − mean) / (std + 1e-4) per group of G consecutive rows,
 * with the unbiased std; or r − mean without scaling. */
static sbp_status advantages_from_rewards(double *adv, const double *r, int B, int G, int scale,
                                          const char *path, sbp_err *err) {
    if (G < 1 || B % G != 0)
        return sbp_fail(err, SBP_EINPUT, "%s: the group size %d does not divide B = %d", path, G,
                        B);
    for (int g0 = 0; g0 < B; g0 += G) {
        double mean = 0, var = 0;
        for (int i = 0; i < G; i++) mean += r[g0 + i];
        mean /= G;
        for (int i = 0; i < G; i++) var += (r[g0 + i] - mean) * (r[g0 + i] - mean);
#ifdef SBP_PLANT_BIASED_STD
        double sd = sqrt(var / G); /* planted bug (tests/test_plant.c); never in a normal build */
#else
        double sd = G > 1 ? sqrt(var / (G - 1)) : 0;
#endif
        for (int i = 0; i < G; i++)
            adv[g0 + i] = scale ? (r[g0 + i] - mean) / (sd + 1e-4) : r[g0 + i] - mean;
    }
    return SBP_OK;
}

/* Per-token log-probs stored at the scored token's position t, moved to the predicting
 * position t − 1. */
static sbp_status read_token_logps(double **out, const sbp_st_file *sf, const char *name, int B,
                                   int T, sbp_err *err) {
    double *raw = NULL;
    sbp_status st = read_float(&raw, sf, name, B, T, err);
    if (!st && !(*out = calloc((size_t)B * T, sizeof **out)))
        st = sbp_fail(err, SBP_ENOMEM, "out of memory");
    for (int r = 0; r < B && !st; r++)
#ifdef SBP_PLANT_UNSHIFTED_TOKEN_LOGPS
        for (int t = 0; t + 1 < T; t++)
            (*out)[(size_t)r * T + t] =
                raw[(size_t)r * T +
                    t]; /* planted bug (tests/test_plant.c); never in a normal build */
#else
        for (int t = 0; t + 1 < T; t++) (*out)[(size_t)r * T + t] = raw[(size_t)r * T + t + 1];
#endif
    free(raw);
    return st;
}

static sbp_status load_grpo(sbp_batch *b, const sbp_st_file *sf, const sbp_config *cfg,
                            int scale_rewards, sbp_err *err) {
    int64_t *ids = NULL, *cmask = NULL, *mask = NULL;
    int B = 0, T = 0;
    sbp_status st = read_int2(&ids, sf, "input_ids", &B, &T, "", err);
    if (!st) st = read_int2(&cmask, sf, "completion_mask", &B, &T, "input_ids", err);
    if (!st && sbp_st_find(sf, "attention_mask"))
        st = read_int2(&mask, sf, "attention_mask", &B, &T, "input_ids", err);
    for (size_t i = 0; !st && i < (size_t)B * T; i++) {
        if (cmask[i] != 0 && cmask[i] != 1)
            st = sbp_fail(err, SBP_EINPUT, "%s: completion_mask[%zu][%zu] = %lld is not 0 or 1",
                          sf->path, i / (size_t)T, i % (size_t)T, (long long)cmask[i]);
        cmask[i] = cmask[i] ? ids[i] : SBP_IGNORE; /* the labels */
    }
    if (!st) st = alloc_rows(b, B, T, sf->path, err);
    if (!st) st = put_rows(b, 0, B, T, ids, cmask, mask, cfg, sf->path, "", err);
    int has_adv = sbp_st_find(sf, "advantages") != NULL,
        has_rew = sbp_st_find(sf, "rewards") != NULL;
    if (!st && has_adv == has_rew)
        st = sbp_fail(err, SBP_EINPUT,
                      "%s: a GRPO batch needs exactly one of \"advantages\" and "
                      "\"rewards\"",
                      sf->path);
    if (!st && has_adv) st = read_float(&b->advantages, sf, "advantages", B, 0, err);
    if (!st && has_rew) {
        const char *gs = sbp_st_meta(sf, "group_size");
        if (!gs) gs = sbp_st_meta(sf, "num_generations");
        char *end = NULL;
        errno = 0;
        long long G = gs ? strtoll(gs, &end, 10) : 0;
        double *rew = NULL;
        if (!gs || !end || end == gs || *end || errno || G < 1)
            st = sbp_fail(err, SBP_EINPUT,
                          "%s: rewards need the group size: a positive integer "
                          "\"group_size\" (or \"num_generations\") in __metadata__%s%s%s",
                          sf->path, gs ? ", not \"" : "", gs ? gs : "", gs ? "\"" : "");
        else if (G > B) /* before any narrowing: 2^32 + 2 must not become 2 */
            st = sbp_fail(err, SBP_EINPUT, "%s: the group size %lld is larger than B = %d",
                          sf->path, G, B);
        if (!st) st = read_float(&rew, sf, "rewards", B, 0, err);
        if (!st && !(b->advantages = malloc(sizeof(double) * (size_t)B)))
            st = sbp_fail(err, SBP_ENOMEM, "out of memory");
        if (!st)
            st = advantages_from_rewards(b->advantages, rew, B, (int)G, scale_rewards, sf->path,
                                         err);
        free(rew);
    }
    if (!st && sbp_st_find(sf, "old_logps"))
        st = read_token_logps(&b->old_logps, sf, "old_logps", B, T, err);
    if (!st && sbp_st_find(sf, "ref_logps"))
        st = read_token_logps(&b->ref_logps, sf, "ref_logps", B, T, err);
    free(ids), free(cmask), free(mask);
    return st;
}

sbp_status sbp_batch_load_as(sbp_batch *b, const char *path, const sbp_config *cfg,
                             sbp_objective_kind kind, int scale_rewards, sbp_err *err) {
    memset(b, 0, sizeof *b);
    sbp_st_file sf;
    sbp_status st = sbp_st_open(&sf, path, err);
    if (st) return st;
    b->kind = kind;
    if (kind == SBP_OBJ_DPO)
        st = load_dpo(b, &sf, cfg, err);
    else if (kind == SBP_OBJ_GRPO)
        st = load_grpo(b, &sf, cfg, scale_rewards, err);
    else
        st = load_sft(b, &sf, cfg, err);
    sbp_st_close(&sf);
    if (!st) sbp_batch_count_targets(b);
    if (st) sbp_batch_free(b);
    return st;
}

sbp_status sbp_batch_load(sbp_batch *b, const char *path, const sbp_config *cfg, sbp_err *err) {
    return sbp_batch_load_as(b, path, cfg, SBP_OBJ_SFT, 1, err);
}

void sbp_batch_free(sbp_batch *b) {
    free(b->ids), free(b->labels), free(b->mask);
    free(b->ref_seq_logps), free(b->advantages), free(b->old_logps), free(b->ref_logps);
    memset(b, 0, sizeof *b);
}

int64_t sbp_batch_bytes(const sbp_batch *b) {
    const int64_t n = (int64_t)b->B * b->T;
    int64_t bytes = 0;
    if (b->ids) bytes += n * (int64_t)sizeof *b->ids;
    if (b->labels) bytes += n * (int64_t)sizeof *b->labels;
    if (b->mask) bytes += n;
    if (b->ref_seq_logps) bytes += b->B * (int64_t)sizeof(double);
    if (b->advantages) bytes += b->B * (int64_t)sizeof(double);
    if (b->old_logps) bytes += n * (int64_t)sizeof(double);
    if (b->ref_logps) bytes += n * (int64_t)sizeof(double);
    return bytes;
}

void sbp_batch_count_unattended(const sbp_batch *b, int64_t *rows, int64_t *targets) {
    *rows = *targets = 0;
    for (int r = 0; r < b->B; r++) {
        const uint8_t *m = b->mask + (size_t)r * b->T;
        const int32_t *lab = b->labels + (size_t)r * b->T;
        for (int t = 0; t < b->T && !m[t]; t++) {
            (*rows)++;
            *targets += t + 1 < b->T && lab[t + 1] != SBP_IGNORE;
        }
    }
}
