/* safetensors.c — a validating reader and an atomic writer for safetensors files. */
#include "safetensors.h"
#include "../core/err.h"
#include "file.h"
#include "json.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader assumes a little-endian host"
#endif

#define MAX_HEADER (100u << 20) /* the format's own limit */

static const struct {
    const char *name;
    size_t size;
} dtypes[SBP_DT_COUNT] = {
    [SBP_DT_BOOL] = {"BOOL", 1},       [SBP_DT_U8] = {"U8", 1},
    [SBP_DT_I8] = {"I8", 1},           [SBP_DT_I16] = {"I16", 2},
    [SBP_DT_U16] = {"U16", 2},         [SBP_DT_F16] = {"F16", 2},
    [SBP_DT_BF16] = {"BF16", 2},       [SBP_DT_I32] = {"I32", 4},
    [SBP_DT_U32] = {"U32", 4},         [SBP_DT_F32] = {"F32", 4},
    [SBP_DT_F64] = {"F64", 8},         [SBP_DT_I64] = {"I64", 8},
    [SBP_DT_U64] = {"U64", 8},         [SBP_DT_F8_E5M2] = {"F8_E5M2", 1},
    [SBP_DT_F8_E4M3] = {"F8_E4M3", 1},
};

const char *sbp_dtype_name(sbp_dtype d) {
    return (unsigned)d < SBP_DT_COUNT ? dtypes[d].name : "?";
}
size_t sbp_dtype_size(sbp_dtype d) {
    return (unsigned)d < SBP_DT_COUNT ? dtypes[d].size : 0;
}
int sbp_dtype_is_float(sbp_dtype d) {
    return d == SBP_DT_F64 || d == SBP_DT_F32 || d == SBP_DT_F16 || d == SBP_DT_BF16;
}
static int is_int(sbp_dtype d) {
    return d == SBP_DT_BOOL || d == SBP_DT_U8 || d == SBP_DT_I8 || d == SBP_DT_I16 ||
           d == SBP_DT_U16 || d == SBP_DT_I32 || d == SBP_DT_U32 || d == SBP_DT_I64 ||
           d == SBP_DT_U64;
}

/* ---------------------------------------------------------------------------------------------
 * Half-precision conversions */

float sbp_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t sbp_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float sbp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13); /* Inf or NaN */
    } else if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: value = man * 2^-24, exact in float */
            float f = (float)man * 0x1p-24f;
            memcpy(&u, &f, 4);
            u |= sign;
        }
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t sbp_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to >= 65520: infinity */
    if (a < 0x38800000u) {                       /* below the smallest normal 2^-14 */
        float v;
        memcpy(&v, &a, 4);
        return sign | (uint16_t)lrintf(v * 0x1p24f); /* subnormal steps of 2^-24, RNE */
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return sign | (uint16_t)(r >> 13);
}

/* ---------------------------------------------------------------------------------------------
 * Reader */

static int json_int64(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = cJSON_GetNumberValue(v);
    if (d < 0 || d != floor(d) || d > 9.0e15) return 0; /* integral and exact in a double */
    *out = (int64_t)d;
    return 1;
}

static int cmp_begin(const void *a, const void *b) {
    const sbp_st_tensor *x = *(const sbp_st_tensor *const *)a,
                        *y = *(const sbp_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const sbp_st_tensor *const *)a)->name,
                  (*(const sbp_st_tensor *const *)b)->name);
}

/* Checks names are unique and the tensors tile [0, data_size) exactly. */
static sbp_status check_layout(const sbp_st_file *sf, sbp_err *err) {
    if (sf->n == 0) {
        if (sf->data_size != 0)
            return sbp_fail(err, SBP_EFORMAT, "%s: %llu data bytes but no tensors", sf->path,
                            (unsigned long long)sf->data_size);
        return SBP_OK;
    }
    const sbp_st_tensor **v = malloc(sizeof *v * (size_t)sf->n);
    if (!v) return sbp_fail(err, SBP_ENOMEM, "%s: out of memory", sf->path);
    for (int i = 0; i < sf->n; i++) v[i] = &sf->t[i];
    sbp_status st = SBP_OK;
    qsort(v, (size_t)sf->n, sizeof *v, cmp_name);
    for (int i = 1; i < sf->n && !st; i++)
        if (strcmp(v[i]->name, v[i - 1]->name) == 0)
            st = sbp_fail(err, SBP_EFORMAT, "%s: tensor \"%s\" appears twice in the header",
                          sf->path, v[i]->name);
    qsort(v, (size_t)sf->n, sizeof *v, cmp_begin);
    uint64_t at = 0;
    for (int i = 0; i < sf->n && !st; i++) {
        if (v[i]->begin < at)
            st = sbp_fail(err, SBP_EFORMAT,
                          "%s: tensor \"%s\" data [%llu, %llu) overlaps tensor \"%s\"", sf->path,
                          v[i]->name, (unsigned long long)v[i]->begin,
                          (unsigned long long)v[i]->end, v[i - 1]->name);
        else if (v[i]->begin > at)
            st = sbp_fail(err, SBP_EFORMAT,
                          "%s: bytes [%llu, %llu) of the data buffer belong to no tensor (before "
                          "\"%s\")",
                          sf->path, (unsigned long long)at, (unsigned long long)v[i]->begin,
                          v[i]->name);
        at = v[i]->end;
    }
    if (!st && at != sf->data_size)
        st = sbp_fail(err, SBP_EFORMAT,
                      "%s: the data buffer has %llu bytes but the tensors end at byte %llu",
                      sf->path, (unsigned long long)sf->data_size, (unsigned long long)at);
    free(v);
    return st;
}

/* Parses one header entry into t. */
static sbp_status parse_entry(sbp_st_tensor *t, const cJSON *item, const sbp_st_file *sf,
                              sbp_err *err) {
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return sbp_fail(err, SBP_EFORMAT, "%s: header entry \"%s\" is not an object", sf->path,
                        name);
    const char *dt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(item, "dtype"));
    if (!dt) return sbp_fail(err, SBP_EFORMAT, "%s: tensor \"%s\" has no dtype", sf->path, name);
    t->dtype = SBP_DT_COUNT;
    for (int d = 0; d < SBP_DT_COUNT; d++)
        if (strcmp(dt, dtypes[d].name) == 0) t->dtype = (sbp_dtype)d;
    if (t->dtype == SBP_DT_COUNT)
        return sbp_fail(err, SBP_EFORMAT, "%s: tensor \"%s\" has unknown dtype \"%s\"", sf->path,
                        name, dt);
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > SBP_ST_MAX_DIMS)
        return sbp_fail(err, SBP_EFORMAT,
                        "%s: tensor \"%s\" has no valid shape (an array of at "
                        "most %d integers)",
                        sf->path, name, SBP_ST_MAX_DIMS);
    t->ndim = cJSON_GetArraySize(shape);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (!json_int64(cJSON_GetArrayItem(shape, i), &t->shape[i]))
            return sbp_fail(err, SBP_EFORMAT,
                            "%s: tensor \"%s\": shape[%d] is not a "
                            "non-negative integer",
                            sf->path, name, i);
        if (t->shape[i] && numel > UINT64_MAX / 16 / (uint64_t)t->shape[i])
            return sbp_fail(err, SBP_EFORMAT, "%s: tensor \"%s\": shape is too large", sf->path,
                            name);
        numel *= (uint64_t)t->shape[i];
    }
    t->numel = (int64_t)numel;
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    int64_t b, e;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
        !json_int64(cJSON_GetArrayItem(off, 0), &b) || !json_int64(cJSON_GetArrayItem(off, 1), &e))
        return sbp_fail(err, SBP_EFORMAT,
                        "%s: tensor \"%s\": data_offsets must be two "
                        "non-negative integers",
                        sf->path, name);
    if (e < b)
        return sbp_fail(err, SBP_EFORMAT,
                        "%s: tensor \"%s\": data_offsets [%lld, %lld) end before "
                        "they begin",
                        sf->path, name, (long long)b, (long long)e);
    if ((uint64_t)e > sf->data_size)
        return sbp_fail(err, SBP_EFORMAT,
                        "%s: tensor \"%s\": data_offsets [%lld, %lld) lie outside the %llu-byte "
                        "data buffer (file truncated, or offsets out of range)",
                        sf->path, name, (long long)b, (long long)e,
                        (unsigned long long)sf->data_size);
    if ((uint64_t)(e - b) != numel * dtypes[t->dtype].size)
        return sbp_fail(err, SBP_EFORMAT,
                        "%s: tensor \"%s\": %lld bytes of data for %llu elements of %s", sf->path,
                        name, (long long)(e - b), (unsigned long long)numel, dt);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    t->name = strdup(name);
    if (!t->name) return sbp_fail(err, SBP_ENOMEM, "%s: out of memory", sf->path);
    return SBP_OK;
}

static sbp_status parse_metadata(sbp_st_file *sf, const cJSON *meta, sbp_err *err) {
    if (!cJSON_IsObject(meta))
        return sbp_fail(err, SBP_EFORMAT, "%s: __metadata__ is not an object", sf->path);
    if (sf->meta_key) /* the arrays below are sized for one map */
        return sbp_fail(err, SBP_EFORMAT, "%s: __metadata__ appears twice", sf->path);
    int n = cJSON_GetArraySize(meta);
    sf->meta_key = calloc((size_t)n + 1, sizeof(char *));
    sf->meta_val = calloc((size_t)n + 1, sizeof(char *));
    if (!sf->meta_key || !sf->meta_val)
        return sbp_fail(err, SBP_ENOMEM, "%s: out of memory", sf->path);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, meta) {
        if (!cJSON_IsString(kv))
            return sbp_fail(err, SBP_EFORMAT, "%s: __metadata__ value \"%s\" is not a string",
                            sf->path, kv->string);
        sf->meta_key[sf->n_meta] = strdup(kv->string);
        sf->meta_val[sf->n_meta] = strdup(kv->valuestring);
        if (!sf->meta_key[sf->n_meta] || !sf->meta_val[sf->n_meta])
            return sbp_fail(err, SBP_ENOMEM, "%s: out of memory", sf->path);
        sf->n_meta++;
    }
    return SBP_OK;
}

/* The header: strict JSON (UTF-8, no duplicate keys; see json.h) whose top level is an
 * object; the format pads it with trailing spaces. */
static sbp_status parse_header(sbp_st_file *sf, const char *text, size_t n_text, sbp_err *err) {
    char what[4200];
    snprintf(what, sizeof what, "%s: header", sf->path);
    cJSON *root;
    sbp_status st = sbp_json_parse(&root, text, n_text, what, err);
    if (st) return st;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return sbp_fail(err, SBP_EFORMAT, "%s: the header is not a JSON object", sf->path);
    }
    int n = cJSON_GetArraySize(root);
    sf->t = calloc((size_t)n + 1, sizeof *sf->t);
    if (!sf->t) st = sbp_fail(err, SBP_ENOMEM, "%s: out of memory", sf->path);
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        if (st) break;
        if (strcmp(item->string, "__metadata__") == 0)
            st = parse_metadata(sf, item, err);
        else if ((st = parse_entry(&sf->t[sf->n], item, sf, err)) == SBP_OK)
            sf->n++;
    }
    cJSON_Delete(root);
    return st ? st : check_layout(sf, err);
}

sbp_status sbp_st_open(sbp_st_file *sf, const char *path, sbp_err *err) {
    memset(sf, 0, sizeof *sf);
    snprintf(sf->path, sizeof sf->path, "%s", path);
    uint64_t size;
    sbp_status st = sbp_open_regular(&sf->f, &size, path, err);
    if (st) return st;
    uint64_t hlen = 0;
    unsigned char len8[8];
    if (size < 8 || fread(len8, 1, 8, sf->f) != 8) {
        sbp_st_close(sf);
        return sbp_fail(err, SBP_EFORMAT,
                        "%s: truncated: %llu bytes, shorter than the 8-byte "
                        "header length",
                        path, (unsigned long long)size);
    }
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    if (hlen < 2 || hlen > MAX_HEADER || hlen > size - 8) {
        sbp_st_close(sf);
        return sbp_fail(err, SBP_EFORMAT,
                        "%s: header length %llu is impossible for a %llu-byte file (truncated or "
                        "not a safetensors file)",
                        path, (unsigned long long)hlen, (unsigned long long)size);
    }
    char *text = malloc(hlen + 1);
    if (!text) {
        sbp_st_close(sf);
        return sbp_fail(err, SBP_ENOMEM, "%s: out of memory for a %llu-byte header", path,
                        (unsigned long long)hlen);
    }
    if (fread(text, 1, hlen, sf->f) != hlen)
        st = sbp_fail(err, SBP_EIO, "%s: cannot read the header", path);
    text[hlen] = '\0';
    if (!st && text[0] != '{')
        st = sbp_fail(err, SBP_EFORMAT, "%s: the header does not start with '{'", path);
    sf->data_start = 8 + hlen;
    sf->data_size = size - 8 - hlen;
    if (!st) st = parse_header(sf, text, hlen, err);
    free(text);
    if (st) sbp_st_close(sf);
    return st;
}

void sbp_st_close(sbp_st_file *sf) {
    if (sf->f) fclose(sf->f);
    for (int i = 0; i < sf->n; i++) free(sf->t[i].name);
    free(sf->t);
    for (int i = 0; i < sf->n_meta; i++) {
        free(sf->meta_key[i]);
        free(sf->meta_val[i]);
    }
    free(sf->meta_key);
    free(sf->meta_val);
    memset(sf, 0, sizeof *sf);
}

const sbp_st_tensor *sbp_st_find(const sbp_st_file *sf, const char *name) {
    for (int i = 0; i < sf->n; i++)
        if (strcmp(sf->t[i].name, name) == 0) return &sf->t[i];
    return NULL;
}

const char *sbp_st_meta(const sbp_st_file *sf, const char *key) {
    for (int i = 0; i < sf->n_meta; i++)
        if (strcmp(sf->meta_key[i], key) == 0) return sf->meta_val[i];
    return NULL;
}

sbp_status sbp_st_read_raw(const sbp_st_file *sf, const sbp_st_tensor *t, void *dst, sbp_err *err) {
    size_t n = (size_t)(t->end - t->begin);
    if (fseeko(sf->f, (off_t)(sf->data_start + t->begin), SEEK_SET) != 0 ||
        fread(dst, 1, n, sf->f) != n)
        return sbp_fail(err, SBP_EIO, "%s: cannot read the data of tensor \"%s\"", sf->path,
                        t->name);
    return SBP_OK;
}

/* Element i of a raw buffer of dtype d, as a double (floats) or an int64 (integers). */
static double float_at(const unsigned char *p, sbp_dtype d, size_t i) {
    switch (d) {
    case SBP_DT_F64: {
        double v;
        memcpy(&v, p + 8 * i, 8);
        return v;
    }
    case SBP_DT_F32: {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case SBP_DT_F16: {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return sbp_f16_to_f32(v);
    }
    case SBP_DT_BF16: {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return sbp_bf16_to_f32(v);
    }
    default: return NAN;
    }
}

static int64_t int_at(const unsigned char *p, sbp_dtype d, size_t i) {
    switch (d) {
    case SBP_DT_BOOL:
    case SBP_DT_U8: return p[i];
    case SBP_DT_I8: return (int8_t)p[i];
    case SBP_DT_I16: {
        int16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    case SBP_DT_U16: {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    case SBP_DT_I32: {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case SBP_DT_U32: {
        uint32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case SBP_DT_I64: {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        return v;
    }
    case SBP_DT_U64: {
        uint64_t v;
        memcpy(&v, p + 8 * i, 8);
        return v > INT64_MAX ? INT64_MAX : (int64_t)v;
    }
    default: return 0;
    }
}

sbp_status sbp_st_read(const sbp_st_file *sf, const sbp_st_tensor *t, void *dst, sbp_dtype dst_type,
                       sbp_err *err) {
    int want_float = dst_type == SBP_DT_F32 || dst_type == SBP_DT_F64;
    if (want_float && !sbp_dtype_is_float(t->dtype))
        return sbp_fail(err, SBP_EINPUT,
                        "%s: tensor \"%s\" has dtype %s; a float dtype (F32, "
                        "F64, BF16, F16) is needed",
                        sf->path, t->name, sbp_dtype_name(t->dtype));
    if (dst_type == SBP_DT_I64 && !is_int(t->dtype))
        return sbp_fail(err, SBP_EINPUT,
                        "%s: tensor \"%s\" has dtype %s; an integer dtype (I64, "
                        "I32, ...) is needed",
                        sf->path, t->name, sbp_dtype_name(t->dtype));
    if (!want_float && dst_type != SBP_DT_I64)
        return sbp_fail(err, SBP_EUSAGE, "sbp_st_read: unsupported destination dtype");
    if (fseeko(sf->f, (off_t)(sf->data_start + t->begin), SEEK_SET) != 0)
        return sbp_fail(err, SBP_EIO, "%s: cannot seek to tensor \"%s\"", sf->path, t->name);
    enum { PIECE = 1 << 16 };
    size_t esz = sbp_dtype_size(t->dtype);
    unsigned char *buf = malloc(PIECE * esz);
    if (!buf) return sbp_fail(err, SBP_ENOMEM, "%s: out of memory", sf->path);
    sbp_status st = SBP_OK;
    for (size_t at = 0; at < (size_t)t->numel && !st; at += PIECE) {
        size_t n = (size_t)t->numel - at < PIECE ? (size_t)t->numel - at : PIECE;
        if (fread(buf, esz, n, sf->f) != n) {
            st = sbp_fail(err, SBP_EIO, "%s: cannot read the data of tensor \"%s\"", sf->path,
                          t->name);
            break;
        }
        for (size_t i = 0; i < n; i++) {
            if (dst_type == SBP_DT_I64) {
                ((int64_t *)dst)[at + i] = int_at(buf, t->dtype, i);
                continue;
            }
            double v = float_at(buf, t->dtype, i);
            if (dst_type == SBP_DT_F32)
                ((float *)dst)[at + i] = (float)v;
            else
                ((double *)dst)[at + i] = v;
        }
    }
    free(buf);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Writer */

/* An integer printed with all its digits (cJSON would print 15 significant ones). */
static cJSON *json_uint(uint64_t v) {
    char buf[24];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(buf);
}

char *sbp_st_header(size_t *padded, const sbp_st_entry *e, int n, const char *const *meta) {
    cJSON *root = cJSON_CreateObject();
    if (meta && meta[0]) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; meta[i] && meta[i + 1]; i += 2)
            cJSON_AddStringToObject(m, meta[i], meta[i + 1]);
    }
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_AddObjectToObject(root, e[i].name);
        cJSON_AddStringToObject(t, "dtype", sbp_dtype_name(e[i].dtype));
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        uint64_t numel = 1;
        for (int d = 0; d < e[i].ndim; d++) {
            cJSON_AddItemToArray(shape, json_uint(e[i].shape[d]));
            numel *= (uint64_t)e[i].shape[d];
        }
        uint64_t bytes = numel * sbp_dtype_size(e[i].dtype);
        cJSON *off = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(off, json_uint(at));
        cJSON_AddItemToArray(off, json_uint(at + bytes));
        at += bytes;
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (text) *padded = (strlen(text) + 8 + 7) / 8 * 8 - 8; /* data starts 8-aligned */
    return text;
}

sbp_status sbp_st_write_header(sbp_outfile *o, const sbp_st_entry *e, int n,
                               const char *const *meta, const char *path, sbp_err *err) {
    size_t padded = 0;
    char *text = sbp_st_header(&padded, e, n, meta);
    if (!text) return sbp_fail(err, SBP_ENOMEM, "%s: cannot format the header", path);
    size_t len = strlen(text);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    sbp_status st = sbp_outfile_write(o, len8, 8, err);
    if (!st) st = sbp_outfile_write(o, text, len, err);
    for (size_t i = len; i < padded && !st; i++) st = sbp_outfile_write(o, " ", 1, err);
    free(text);
    return st;
}

sbp_status sbp_st_write(const char *path, const sbp_st_entry *e, int n, const char *const *meta,
                        sbp_err *err) {
    sbp_outfile o;
    sbp_status st = sbp_outfile_open(&o, path, err);
    if (st) return st;
    st = sbp_st_write_header(&o, e, n, meta, path, err);
    for (int i = 0; i < n && !st; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < e[i].ndim; d++) numel *= (uint64_t)e[i].shape[d];
        st = sbp_outfile_write(&o, e[i].data, numel * sbp_dtype_size(e[i].dtype), err);
    }
    if (st) sbp_outfile_abort(&o); /* idempotent: a failed write has aborted already */
    return st ? st : sbp_outfile_commit(&o, err);
}
