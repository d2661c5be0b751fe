/* batch.c — reading and checking an SFT batch file (safetensors).
 *
 * Tensors: input_ids, labels, optional attention_mask, each [B, T] of any integer dtype (I64 and
 * I32 in practice). Every value is checked before anything runs, so a bad batch never produces a
 * half-written gradient file. */
#include "../core/err.h"
#include "../streambp.h"
#include "safetensors.h"

#include <stdlib.h>
#include <string.h>

/* Reads tensor `name` as int64 (B*T of them) after checking its shape is [B, T]; B and T are
 * taken from the first tensor read (*B == 0). */
static sbp_status read_bt(int64_t **out, const sbp_st_file *sf, const char *name, int *B, int *T,
                          sbp_err *err) {
    const sbp_st_tensor *t = sbp_st_find(sf, name);
    if (!t) return sbp_fail(err, SBP_EINPUT, "%s: batch has no tensor \"%s\"", sf->path, name);
    if (t->ndim != 2)
        return sbp_fail(err, SBP_EINPUT, "%s: tensor \"%s\" must be 2-D [B, T], not %d-D", sf->path,
                        name, t->ndim);
    if (*B == 0) {
        if (t->shape[0] < 1 || t->shape[1] < 1)
            return sbp_fail(err, SBP_EINPUT,
                            "%s: tensor \"%s\" has shape [%lld, %lld]; B and T "
                            "must be >= 1",
                            sf->path, name, (long long)t->shape[0], (long long)t->shape[1]);
        if (t->shape[0] > (1 << 20) || t->shape[1] > (1 << 30))
            return sbp_fail(err, SBP_EINPUT, "%s: tensor \"%s\" is too large", sf->path, name);
        *B = (int)t->shape[0];
        *T = (int)t->shape[1];
    } else if (t->shape[0] != *B || t->shape[1] != *T) {
        return sbp_fail(err, SBP_EINPUT,
                        "%s: tensor \"%s\" has shape [%lld, %lld] but input_ids is [%d, %d]",
                        sf->path, name, (long long)t->shape[0], (long long)t->shape[1], *B, *T);
    }
    *out = malloc(sizeof **out * (size_t)t->numel);
    if (!*out) return sbp_fail(err, SBP_ENOMEM, "%s: out of memory for \"%s\"", sf->path, name);
    return sbp_st_read(sf, t, *out, SBP_DT_I64, err);
}

sbp_status sbp_batch_load(sbp_batch *b, const char *path, const sbp_config *cfg, sbp_err *err) {
    memset(b, 0, sizeof *b);
    sbp_st_file sf;
    sbp_status st = sbp_st_open(&sf, path, err);
    if (st) return st;
    int64_t *ids = NULL, *labels = NULL, *mask = NULL;
    int B = 0, T = 0;
    if ((st = read_bt(&ids, &sf, "input_ids", &B, &T, err)) ||
        (st = read_bt(&labels, &sf, "labels", &B, &T, err)))
        goto out;
    if (sbp_st_find(&sf, "attention_mask") &&
        (st = read_bt(&mask, &sf, "attention_mask", &B, &T, err)))
        goto out;
    size_t n = (size_t)B * T;
    b->B = B;
    b->T = T;
    b->ids = malloc(sizeof *b->ids * n);
    b->labels = malloc(sizeof *b->labels * n);
    b->mask = malloc(n);
    if (!b->ids || !b->labels || !b->mask) {
        st = sbp_fail(err, SBP_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    for (size_t i = 0; i < n && !st; i++) {
        int r = (int)(i / (size_t)T), t = (int)(i % (size_t)T);
        if (ids[i] < 0 || ids[i] >= cfg->vocab)
            st = sbp_fail(err, SBP_EINPUT,
                          "%s: input_ids[%d][%d] = %lld is outside the vocabulary [0, %d)", path, r,
                          t, (long long)ids[i], cfg->vocab);
        else if (labels[i] != SBP_IGNORE && (labels[i] < 0 || labels[i] >= cfg->vocab))
            st = sbp_fail(err, SBP_EINPUT,
                          "%s: labels[%d][%d] = %lld is neither -100 nor in [0, %d)", path, r, t,
                          (long long)labels[i], cfg->vocab);
        else if (mask && mask[i] != 0 && mask[i] != 1)
            st = sbp_fail(err, SBP_EINPUT, "%s: attention_mask[%d][%d] = %lld is not 0 or 1", path,
                          r, t, (long long)mask[i]);
        if (st) break;
        b->ids[i] = (int32_t)ids[i];
        b->labels[i] = (int32_t)labels[i];
        b->mask[i] = mask ? (uint8_t)mask[i] : 1;
    }
    if (st) goto out;
    /* The target of position t is labels[t+1]; labels[t=0] is never a target. */
    for (int r = 0; r < B; r++)
        for (int t = 0; t + 1 < T; t++)
            if (b->labels[(size_t)r * T + t + 1] != SBP_IGNORE) {
                b->n_targets++;
                b->n_pad_targets += b->mask[(size_t)r * T + t] == 0;
            }
out:
    free(ids);
    free(labels);
    free(mask);
    sbp_st_close(&sf);
    if (st) sbp_batch_free(b);
    return st;
}

void sbp_batch_free(sbp_batch *b) {
    free(b->ids);
    free(b->labels);
    free(b->mask);
    memset(b, 0, sizeof *b);
}
