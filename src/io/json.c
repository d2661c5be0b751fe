/* json.c — strict JSON parsing and exact number printing on top of cJSON (see json.h). */
#include "json.h"
#include "../core/err.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at s (at most n bytes left), or 0 if it is not one. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xbf; /* the allowed range of the second byte */
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0; /* overlong */
        if (c == 0xed) hi = 0x9f; /* UTF-16 surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90; /* overlong */
        if (c == 0xf4) hi = 0x8f; /* past U+10FFFF */
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return len;
}

/* UTF-8 and no \u0000 inside a string; fills err with the byte offset of the first problem. */
static sbp_status check_text(const char *text, size_t n, const char *what, sbp_err *err) {
    const unsigned char *s = (const unsigned char *)text;
    int in_string = 0;
    for (size_t i = 0; i < n;) {
        size_t len = utf8_seq(s + i, n - i);
        if (!len)
            return sbp_fail(err, SBP_EFORMAT,
                            "%s: byte %zu of the JSON text (0x%02x) is not valid UTF-8", what, i,
                            s[i]);
        if (s[i] == '\0')
            return sbp_fail(err, SBP_EFORMAT, "%s: the JSON text contains a NUL byte at byte %zu",
                            what, i);
        if (in_string && s[i] < 0x20)
            return sbp_fail(err, SBP_EFORMAT,
                            "%s: a string contains the control character 0x%02x at byte %zu "
                            "(JSON needs it escaped)",
                            what, s[i], i);
        if (s[i] == '"') in_string = !in_string;
        if (in_string && s[i] == '\\' && i + 1 < n) {
            if (s[i + 1] == 'u' && i + 6 <= n && memcmp(s + i + 2, "0000", 4) == 0)
                return sbp_fail(err, SBP_EFORMAT,
                                "%s: a string contains the escape \\u0000 (byte %zu), which "
                                "would cut it short",
                                what, i);
            i += 2; /* the escaped character (a quote or backslash among them) is skipped */
            continue;
        }
        i += len;
    }
    return SBP_OK;
}

static int cmp_key(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* The first key that appears twice in one object of the tree at o, or NULL; *nomem when the
 * sort buffer could not be allocated. */
static const char *duplicate_key(const cJSON *o, int *nomem) {
    if (!cJSON_IsObject(o) && !cJSON_IsArray(o)) return NULL;
    const cJSON *c;
    cJSON_ArrayForEach(c, o) {
        const char *d = duplicate_key(c, nomem);
        if (d || *nomem) return d;
    }
    if (!cJSON_IsObject(o)) return NULL;
    int n = cJSON_GetArraySize(o);
    if (n < 2) return NULL;
    if (n <= 16) { /* small objects, the common case: no allocation */
        for (const cJSON *a = o->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (strcmp(a->string, b->string) == 0) return a->string;
        return NULL;
    }
    const cJSON **v = malloc(sizeof *v * (size_t)n);
    if (!v) {
        *nomem = 1;
        return NULL;
    }
    int i = 0;
    cJSON_ArrayForEach(c, o) v[i++] = c;
    qsort(v, (size_t)n, sizeof *v, cmp_key);
    const char *d = NULL;
    for (i = 1; i < n && !d; i++)
        if (strcmp(v[i]->string, v[i - 1]->string) == 0) d = v[i]->string;
    free(v);
    return d;
}

sbp_status sbp_json_parse(cJSON **out, const char *text, size_t n, const char *what, sbp_err *err) {
    *out = NULL;
    sbp_status st = check_text(text, n, what, err);
    if (st) return st;
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    if (!o) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + n ? (size_t)(at - text) : n;
        return sbp_fail(err, SBP_EFORMAT,
                        "%s: malformed JSON (parse error at byte %zu, near \"%.*s\")", what, off,
                        (int)(n - off < 20 ? n - off : 20), text + off); /* text: not NUL-ended */
    }
    for (const char *p = end ? end : text + n; p < text + n && !st; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            st = sbp_fail(err, SBP_EFORMAT, "%s: text after the JSON value (at byte %zu)", what,
                          (size_t)(p - text));
    int nomem = 0;
    const char *dup = st ? NULL : duplicate_key(o, &nomem);
    if (nomem)
        st = sbp_fail(err, SBP_ENOMEM, "%s: out of memory checking the JSON keys", what);
    else if (dup)
        st = sbp_fail(err, SBP_EFORMAT,
                      "%s: the key \"%.200s\" appears twice in one JSON object (readers "
                      "disagree on which one counts)",
                      what, dup);
    if (st)
        cJSON_Delete(o);
    else
        *out = o;
    return st;
}

cJSON *sbp_json_number(double v) {
    char buf[40];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    return cJSON_CreateRaw(buf);
}

int sbp_json_int(const cJSON *x, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(x)) return 0;
    double v = x->valuedouble;
    /* NaN fails every comparison; v is within [lo, hi] and int64's range before it is converted
     * ((double)INT64_MAX rounds up to 2^63, hence the second test) */
    if (!(v >= (double)lo && v <= (double)hi) || !(v >= -0x1p63 && v < 0x1p63) || v != floor(v))
        return 0;
    *out = (int64_t)v;
    return 1;
}
