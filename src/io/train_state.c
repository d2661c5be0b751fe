/* train_state.c — a checkpoint's trainer_state.json, read and checked (see train_state.h). */
#include "train_state.h"

#include "../core/err.h"
#include "json.h"

#include <stdlib.h>
#include <string.h>

/* An integer field in [0, SBP_STATE_INT_MAX], or an error naming it. */
static sbp_status get_int(int64_t *out, const cJSON *parent, const char *key, const char *field,
                          const char *what, sbp_err *err) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(parent, key);
    if (!x)
        return sbp_fail(err, SBP_EFORMAT, "%s: no \"%s\" (not a streambp trainer state)", what,
                        field);
    if (!sbp_json_int(x, 0, SBP_STATE_INT_MAX, out))
        return sbp_fail(err, SBP_EFORMAT,
                        "%s: \"%s\" is not a whole number in [0, 2^53] (a damaged or edited state)",
                        what, field);
    return SBP_OK;
}

static int is_hex64(const char *h) {
    if (strlen(h) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!((h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'f'))) return 0;
    return 1;
}

/* A name a checkpoint's file may have: one path component, printable ASCII, not "." or "..",
 * not trainer_state.json itself. */
static int is_file_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 255 || !strcmp(s, ".") || !strcmp(s, "..") ||
        !strcmp(s, "trainer_state.json"))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '/' || s[i] < 0x21 || s[i] > 0x7e) return 0;
    return 1;
}

static sbp_status check(sbp_train_state *s, const char *what, sbp_err *err) {
    const cJSON *o = s->root;
    if (!cJSON_IsObject(o))
        return sbp_fail(err, SBP_EFORMAT, "%s: not a JSON object (not a streambp trainer state)",
                        what);
    const char *format = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "format"));
    if (format && strcmp(format, "streambp-train-1") != 0)
        return sbp_fail(err, SBP_EFORMAT, "%s: format \"%.40s\", this version reads \"%s\"", what,
                        format, "streambp-train-1");
    sbp_status st = get_int(&s->step, o, "step", "step", what, err);
    if (!st) st = get_int(&s->tokens, o, "tokens", "tokens", what, err);
    if (st) return st;
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(o, "data_position");
    if (!cJSON_IsObject(dp))
        return sbp_fail(err, SBP_EFORMAT, "%s: \"data_position\" is not an object", what);
    st = get_int(&s->epoch, dp, "epoch", "data_position.epoch", what, err);
    if (!st) st = get_int(&s->item, dp, "item", "data_position.item", what, err);
    if (st) return st;
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(dp, "rng_at_epoch_start");
    if (!cJSON_IsArray(rng) || cJSON_GetArraySize(rng) != 4)
        return sbp_fail(err, SBP_EFORMAT,
                        "%s: data_position.rng_at_epoch_start is not an array of 4", what);
    for (int i = 0; i < 4; i++) {
        const char *h = cJSON_GetStringValue(cJSON_GetArrayItem(rng, i));
        size_t len = h ? strlen(h) : 0;
        int ok = len > 0 && len <= 16;
        uint64_t v = 0;
        for (size_t j = 0; ok && j < len; j++) {
            const char c = h[j];
            const int d = c >= '0' && c <= '9'   ? c - '0'
                          : c >= 'a' && c <= 'f' ? c - 'a' + 10
                          : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                 : -1;
            ok = d >= 0;
            v = v << 4 | (uint64_t)(d & 15);
        }
        if (!ok)
            return sbp_fail(err, SBP_EFORMAT,
                            "%s: data_position.rng_at_epoch_start[%d] is not a hexadecimal "
                            "number of at most 16 digits",
                            what, i);
        s->rng[i] = v;
    }
    s->settings = cJSON_GetObjectItemCaseSensitive(o, "settings");
    if (!cJSON_IsObject(s->settings))
        return sbp_fail(err, SBP_EFORMAT, "%s: \"settings\" is not an object", what);
    const cJSON *x;
    cJSON_ArrayForEach(x, s->settings) if (!cJSON_IsString(x)) return sbp_fail(
        err, SBP_EFORMAT, "%s: settings.%.80s is not a string", what, x->string);
    s->files = cJSON_GetObjectItemCaseSensitive(o, "files");
    if (s->files && !cJSON_IsObject(s->files))
        return sbp_fail(err, SBP_EFORMAT, "%s: \"files\" is not an object", what);
    cJSON_ArrayForEach(x, s->files) {
        if (!is_file_name(x->string))
            return sbp_fail(err, SBP_EFORMAT,
                            "%s: files: \"%.80s\" is not a file name of a "
                            "checkpoint",
                            what, x->string);
        if (!cJSON_IsString(x) || !is_hex64(x->valuestring))
            return sbp_fail(err, SBP_EFORMAT,
                            "%s: files.%s is not a SHA-256 (64 lowercase hexadecimal digits)", what,
                            x->string);
    }
    return SBP_OK;
}

sbp_status sbp_train_state_parse(sbp_train_state *s, const char *text, size_t n, const char *what,
                                 sbp_err *err) {
    memset(s, 0, sizeof *s);
    sbp_status st = sbp_json_parse(&s->root, text, n, what, err);
    if (!st) st = check(s, what, err);
    if (st) sbp_train_state_free(s);
    return st;
}

void sbp_train_state_free(sbp_train_state *s) {
    cJSON_Delete(s->root);
    memset(s, 0, sizeof *s);
}
