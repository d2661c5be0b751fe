/* io.c — the oracle's own readers: config.json, safetensors, model directories, batch files (see
 * ref.h). Written naively and separately from src/io on purpose: the verifier compares the
 * library against a truth computed from what these readers make of the raw files, so a reading
 * or derivation mistake in src/io (a target counted unshifted, DPO padding labelled 0, a biased
 * std, per-token log-probs left unshifted, a wrong default) shows up as a disagreement.
 *
 * A safetensors file is read whole into memory; only the tensors asked for are looked at. */
#include "ref.h"
#include "../src/core/err.h"
#include "../src/io/file.h"

#include <cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------------------------------------
 * Whole files */

static int slurp(unsigned char **out, size_t *n, const char *path, sbp_err *err) {
    FILE *f;
    uint64_t size;
    /* a regular file only (a FIFO would block, a device never end), read up to the size it had
     * when opened, so memory is bounded by what fstat said */
    sbp_status st = sbp_open_regular(&f, &size, path, err);
    if (st) return sbp_fail_prefix(err, "ref: ");
    if (size >= SIZE_MAX / 2) {
        fclose(f);
        return sbp_fail(err, SBP_EFORMAT, "ref: %s: too large (%llu bytes)", path,
                        (unsigned long long)size);
    }
    unsigned char *buf = malloc((size_t)size + 1);
    if (!buf) {
        fclose(f);
        return sbp_fail(err, SBP_ENOMEM, "ref: %s: out of memory", path);
    }
    size_t len = fread(buf, 1, (size_t)size, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || len != size) {
        free(buf);
        return sbp_fail(err, SBP_EIO, "ref: %s: read error%s", path,
                        bad ? "" : " (the file shrank while read)");
    }
    buf[len] = '\0';
    *out = buf, *n = len;
    return SBP_OK;
}

/* The JSON object in the file at path, or NULL with *st set (the caller deletes it). */
static cJSON *json_object_read(const char *path, int *st, sbp_err *err) {
    unsigned char *text;
    size_t n;
    if ((*st = slurp(&text, &n, path, err))) return NULL;
    cJSON *o = cJSON_ParseWithLength((const char *)text, n);
    free(text);
    if (cJSON_IsObject(o)) return o;
    cJSON_Delete(o);
    *st = sbp_fail(err, SBP_EFORMAT, "ref: %s: not a JSON object", path);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * config.json */

static int cfg_int(const cJSON *o, const char *key, int dflt, int *out, const char *path,
                   sbp_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (dflt < 0) return sbp_fail(err, SBP_EINPUT, "ref: %s: no \"%s\"", path, key);
        *out = dflt;
        return SBP_OK;
    }
    double d = cJSON_GetNumberValue(v);
    if (!cJSON_IsNumber(v) || d != floor(d) || d < 1 || d > 1e8)
        return sbp_fail(err, SBP_EINPUT, "ref: %s: \"%s\" is not a positive integer", path, key);
    *out = (int)d;
    return SBP_OK;
}

static double cfg_num(const cJSON *o, const char *key, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? cJSON_GetNumberValue(v) : dflt;
}

static int cfg_true(const cJSON *o, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

/* rope_scaling or rope_parameters (transformers 5 puts rope_theta in it) */
static int cfg_rope(sbp_config *c, const cJSON *rs, const char *path, sbp_err *err) {
    if (!cJSON_IsObject(rs)) return SBP_OK;
    c->rope_theta = cfg_num(rs, "rope_theta", c->rope_theta);
    const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rs, "rope_type"));
    if (!t) t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rs, "type"));
    if (!t || strcmp(t, "default") == 0) return SBP_OK;
    if (strcmp(t, "linear") == 0 && c->family == SBP_GEMMA3) { /* inv_freq / factor */
        c->rope_linear = 1;
        c->rope_factor = cfg_num(rs, "factor", NAN);
        if (!(c->rope_factor > 0))
            return sbp_fail(err, SBP_EINPUT, "ref: %s: linear rope scaling without a factor", path);
        return SBP_OK;
    }
    if (strcmp(t, "llama3") != 0)
        return sbp_fail(err, SBP_EINPUT, "ref: %s: rope type \"%s\" is not implemented", path, t);
    c->rope_llama3 = 1;
    c->rope_factor = cfg_num(rs, "factor", NAN);
    c->rope_low_freq = cfg_num(rs, "low_freq_factor", NAN);
    c->rope_high_freq = cfg_num(rs, "high_freq_factor", NAN);
    c->rope_orig_max = cfg_num(rs, "original_max_position_embeddings", NAN);
    if (!(c->rope_factor > 0) || !(c->rope_low_freq > 0) || !(c->rope_orig_max > 0) ||
        !(c->rope_high_freq > c->rope_low_freq))
        return sbp_fail(err, SBP_EINPUT, "ref: %s: incomplete llama3 rope scaling", path);
    return SBP_OK;
}

/* pad_token_id (HF's nn.Embedding padding_idx): absent gives `dflt`, null gives -1 (none). */
static int cfg_pad(const cJSON *o, int dflt, int *out, const char *path, sbp_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "pad_token_id");
    if (!v || cJSON_IsNull(v)) {
        *out = v ? -1 : dflt;
        return SBP_OK;
    }
    double d = cJSON_GetNumberValue(v);
    if (!cJSON_IsNumber(v) || d != floor(d) || d < 0 || d > 1e8)
        return sbp_fail(err, SBP_EINPUT, "ref: %s: \"pad_token_id\" is not a token id", path);
    *out = (int)d;
    return SBP_OK;
}

/* The Gemma-3 fields with Gemma3TextConfig's defaults (HF 4.51.3; docs/gemma3.md). The sizes'
 * defaults are read by the caller. Soft-capping is refused by name: not implemented. */
static int cfg_gemma3(sbp_config *c, const cJSON *t, const char *path, sbp_err *err) {
    const char *act =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(t, "hidden_activation"));
    if (act && strcmp(act, "gelu_pytorch_tanh") != 0)
        return sbp_fail(err, SBP_EINPUT, "ref: %s: hidden_activation \"%s\" is not implemented",
                        path, act);
    const char *caps[] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, caps[i]);
        if (v && !cJSON_IsNull(v))
            return sbp_fail(err, SBP_EINPUT, "ref: %s: %s is set; not implemented", path, caps[i]);
    }
    c->rope_local_theta = cfg_num(t, "rope_local_base_freq", 10000.0);
    c->query_pre_attn_scalar = cfg_num(t, "query_pre_attn_scalar", 256);
    int st = cfg_int(t, "sliding_window", 4096, &c->sliding_window, path, err);
    if (!st) st = cfg_int(t, "sliding_window_pattern", 6, &c->sliding_window_pattern, path, err);
    if (!st && (!(c->rope_local_theta > 0) || !(c->query_pre_attn_scalar > 0)))
        st = sbp_fail(err, SBP_EINPUT,
                      "ref: %s: rope_local_base_freq and query_pre_attn_scalar must be > 0", path);
    return st;
}

int ref_config_read(sbp_config *cfg, const char *path, sbp_err *err) {
    int st;
    cJSON *o = json_object_read(path, &st, err);
    if (!o) return st;
    sbp_config c;
    memset(&c, 0, sizeof c);
    const char *mt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "model_type"));
    const cJSON *t = o;  /* the text model's fields: a multimodal gemma3's are in text_config */
    cJSON *empty = NULL; /* an absent text_config: Gemma3Config makes one of all defaults */
    st = SBP_OK;
    if (mt && strcmp(mt, "qwen3") == 0)
        c.family = SBP_QWEN3;
    else if (mt && strcmp(mt, "qwen2") == 0)
        c.family = SBP_QWEN2;
    else if (mt && strcmp(mt, "llama") == 0)
        c.family = SBP_LLAMA;
    else if (mt && strcmp(mt, "gemma3_text") == 0)
        c.family = SBP_GEMMA3;
    else if (mt && strcmp(mt, "gemma3") == 0) {
        c.family = SBP_GEMMA3, c.wrapped = 1;
        t = cJSON_GetObjectItemCaseSensitive(o, "text_config");
        if (!t || cJSON_IsNull(t)) t = empty = cJSON_CreateObject();
        if (!cJSON_IsObject(t))
            st = sbp_fail(err, SBP_EINPUT, "ref: %s: text_config is not an object", path);
    } else
        st =
            sbp_fail(err, SBP_EINPUT,
                     "ref: %s: model_type is not qwen3, qwen2, llama, gemma3_text or gemma3", path);
    const int gem = c.family == SBP_GEMMA3;
    if (!st) snprintf(c.model_type, sizeof c.model_type, "%s", gem ? "gemma3_text" : mt);
    /* Gemma3TextConfig has a default for every size; the other families' configs name them */
    if (!st) st = cfg_int(t, "vocab_size", gem ? 262208 : -1, &c.vocab, path, err);
    if (!st) st = cfg_int(t, "hidden_size", gem ? 2304 : -1, &c.hidden, path, err);
    if (!st) st = cfg_int(t, "intermediate_size", gem ? 9216 : -1, &c.ffn, path, err);
    if (!st) st = cfg_int(t, "num_hidden_layers", gem ? 26 : -1, &c.layers, path, err);
    if (!st) st = cfg_int(t, "num_attention_heads", gem ? 8 : -1, &c.heads, path, err);
    if (!st) st = cfg_int(t, "num_key_value_heads", gem ? 4 : c.heads, &c.kv_heads, path, err);
    /* HF: Qwen3Config(head_dim=128), Gemma3TextConfig(head_dim=256); LlamaConfig and Qwen2 use
     * hidden_size // heads */
    if (!st)
        st = cfg_int(t, "head_dim",
                     c.family == SBP_QWEN3 ? 128
                     : gem                 ? 256
                                           : c.hidden / c.heads,
                     &c.head_dim, path, err);
    if (!st && (c.head_dim % 2 || c.heads % c.kv_heads))
        st = sbp_fail(err, SBP_EINPUT, "ref: %s: odd head_dim or heads not divisible", path);
    c.eps = cfg_num(t, "rms_norm_eps", gem ? 1e-6 : NAN);
    c.rope_theta = cfg_num(t, "rope_theta", gem ? 1e6 : 10000.0);
    c.init_range = cfg_num(t, "initializer_range", 0.02);
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(t, "tie_word_embeddings");
    c.tied = gem && !tie ? 1 : cJSON_IsTrue(tie); /* Gemma3TextConfig ties by default */
    c.qkv_bias = c.family == SBP_QWEN2;           /* hard-wired in HF's Qwen2Attention */
    c.qk_norm = c.family == SBP_QWEN3 || gem;
    if (!st) st = cfg_pad(t, gem ? 0 : -1, &c.pad_token_id, path, err);
    if (!st && gem) st = cfg_gemma3(&c, t, path, err);
    if (!st) st = cfg_rope(&c, cJSON_GetObjectItemCaseSensitive(t, "rope_scaling"), path, err);
    if (!st) st = cfg_rope(&c, cJSON_GetObjectItemCaseSensitive(t, "rope_parameters"), path, err);
    if (!st && (!(c.eps > 0) || !(c.rope_theta > 0)))
        st = sbp_fail(err, SBP_EINPUT, "ref: %s: rms_norm_eps and rope_theta must be > 0", path);
    const char *act = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(t, "hidden_act"));
    if (!st && !gem && act && strcmp(act, "silu") != 0)
        st = sbp_fail(err, SBP_EINPUT, "ref: %s: hidden_act \"%s\" is not implemented", path, act);
    if (!st && (cfg_true(t, "use_sliding_window") || cfg_true(t, "mlp_bias") ||
                (c.family != SBP_QWEN2 && cfg_true(t, "attention_bias"))))
        st = sbp_fail(err, SBP_EINPUT,
                      "ref: %s: sliding windows (outside Gemma-3) and extra biases are not "
                      "implemented",
                      path);
    if (!st && c.pad_token_id >= c.vocab)
        st = sbp_fail(err, SBP_EINPUT, "ref: %s: pad_token_id %d is outside the vocabulary", path,
                      c.pad_token_id);
    cJSON_Delete(empty);
    cJSON_Delete(o);
    if (!st) *cfg = c;
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * The parameter table */

/* A tensor's HF name: `prefix` ("language_model." for a multimodal gemma3 checkpoint's text
 * model, else "") + the text model's name. */
static void table_add(sbp_params *ps, const char *prefix, sbp_param_kind kind, int layer,
                      const char *suffix, int64_t d0, int64_t d1) {
    sbp_param *p = &ps->p[ps->n++];
    if (layer < 0)
        snprintf(p->name, sizeof p->name, "%s%s", prefix, suffix);
    else
        snprintf(p->name, sizeof p->name, "%smodel.layers.%d.%s", prefix, layer, suffix);
    p->kind = kind, p->layer = layer;
    p->ndim = d1 ? 2 : 1;
    p->shape[0] = d0, p->shape[1] = d1;
    p->numel = d1 ? d0 * d1 : d0;
    p->offset = ps->total;
    ps->total += p->numel;
}

int ref_params_build(sbp_params *ps, const sbp_config *c, sbp_err *err) {
    memset(ps, 0, sizeof *ps);
    if (c->layers < 1 || c->layers > 4096)
        return sbp_fail(err, SBP_EINPUT, "ref: %d layers", c->layers);
    if (!(ps->p = calloc((size_t)c->layers * 16 + 3, sizeof *ps->p)))
        return sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    const int64_t C = c->hidden, V = c->vocab, F = c->ffn, HD = c->head_dim;
    const int64_t Q = c->heads * HD, KV = c->kv_heads * HD;
    const char *pre = c->wrapped ? "language_model." : "";
    table_add(ps, pre, SBP_P_EMBED, -1, "model.embed_tokens.weight", V, C);
    for (int l = 0; l < c->layers; l++) {
        table_add(ps, pre, SBP_P_Q, l, "self_attn.q_proj.weight", Q, C);
        if (c->qkv_bias) table_add(ps, pre, SBP_P_QB, l, "self_attn.q_proj.bias", Q, 0);
        table_add(ps, pre, SBP_P_K, l, "self_attn.k_proj.weight", KV, C);
        if (c->qkv_bias) table_add(ps, pre, SBP_P_KB, l, "self_attn.k_proj.bias", KV, 0);
        table_add(ps, pre, SBP_P_V, l, "self_attn.v_proj.weight", KV, C);
        if (c->qkv_bias) table_add(ps, pre, SBP_P_VB, l, "self_attn.v_proj.bias", KV, 0);
        table_add(ps, pre, SBP_P_O, l, "self_attn.o_proj.weight", C, Q);
        if (c->qk_norm) {
            table_add(ps, pre, SBP_P_QNORM, l, "self_attn.q_norm.weight", HD, 0);
            table_add(ps, pre, SBP_P_KNORM, l, "self_attn.k_norm.weight", HD, 0);
        }
        table_add(ps, pre, SBP_P_GATE, l, "mlp.gate_proj.weight", F, C);
        table_add(ps, pre, SBP_P_UP, l, "mlp.up_proj.weight", F, C);
        table_add(ps, pre, SBP_P_DOWN, l, "mlp.down_proj.weight", C, F);
        table_add(ps, pre, SBP_P_IN_NORM, l, "input_layernorm.weight", C, 0);
        table_add(ps, pre, SBP_P_POST_NORM, l, "post_attention_layernorm.weight", C, 0);
        if (c->family == SBP_GEMMA3) { /* Gemma3DecoderLayer's sandwich norms, in its order */
            table_add(ps, pre, SBP_P_PRE_FF_NORM, l, "pre_feedforward_layernorm.weight", C, 0);
            table_add(ps, pre, SBP_P_POST_FF_NORM, l, "post_feedforward_layernorm.weight", C, 0);
        }
    }
    table_add(ps, pre, SBP_P_FINAL_NORM, -1, "model.norm.weight", C, 0);
    if (!c->tied) table_add(ps, pre, SBP_P_LM_HEAD, -1, "lm_head.weight", V, C);
    return SBP_OK;
}

void ref_params_free(sbp_params *ps) {
    free(ps->p);
    memset(ps, 0, sizeof *ps);
}

/* ---------------------------------------------------------------------------------------------
 * safetensors, naively: the whole file in memory, the header parsed with cJSON */

typedef struct {
    char path[4200];
    unsigned char *bytes;
    size_t n;
    cJSON *hdr;
    const unsigned char *data; /* the data buffer */
    size_t ndata;
} st_file;

static void st_close(st_file *f) {
    free(f->bytes);
    cJSON_Delete(f->hdr);
    memset(f, 0, sizeof *f);
}

static int st_open(st_file *f, const char *path, sbp_err *err) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    int st = slurp(&f->bytes, &f->n, path, err);
    if (st) return st;
    uint64_t h = 0;
    for (int i = 7; i >= 0 && f->n >= 8; i--) h = h << 8 | f->bytes[i];
    if (f->n < 8 || h > f->n - 8 ||
        !(f->hdr = cJSON_ParseWithLength((const char *)f->bytes + 8, (size_t)h)) ||
        !cJSON_IsObject(f->hdr)) {
        st_close(f);
        return sbp_fail(err, SBP_EFORMAT, "ref: %s: not a safetensors file", path);
    }
    f->data = f->bytes + 8 + h;
    f->ndata = f->n - 8 - (size_t)h;
    return SBP_OK;
}

/* A tensor as doubles: shape (ndim dims into shape), element count, values (malloc'd). Returns
 * SBP_OK, or SBP_EINPUT when absent (*found = 0) or malformed. */
typedef struct {
    int ndim;
    int64_t shape[8], numel;
    int is_float;
    double *v;
} st_tensor;

static double half_value(unsigned h, int bf16) {
    if (bf16) { /* the upper half of a float */
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static int st_get(st_tensor *t, int *found, const st_file *f, const char *name, sbp_err *err) {
    memset(t, 0, sizeof *t);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(f->hdr, name);
    *found = e != NULL;
    if (!e) return SBP_EINPUT;
    const char *dt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "dtype"));
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    static const struct {
        const char *name;
        int size, is_float;
    } types[] = {{"F64", 8, 1}, {"F32", 4, 1}, {"BF16", 2, 1}, {"F16", 2, 1}, {"I64", 8, 0},
                 {"I32", 4, 0}, {"I16", 2, 0}, {"I8", 1, 0},   {"U8", 1, 0},  {"BOOL", 1, 0},
                 {"U16", 2, 0}, {"U32", 4, 0}, {"U64", 8, 0}};
    int ty = -1;
    for (int i = 0; dt && i < (int)(sizeof types / sizeof types[0]); i++)
        if (strcmp(dt, types[i].name) == 0) ty = i;
    if (ty < 0 || !cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > 8 || !cJSON_IsArray(off) ||
        cJSON_GetArraySize(off) != 2)
        return sbp_fail(err, SBP_EFORMAT, "ref: %s: tensor \"%s\" has an unusable header entry",
                        f->path, name);
    t->ndim = cJSON_GetArraySize(shape);
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        double x = cJSON_GetNumberValue(cJSON_GetArrayItem(shape, d));
        if (!(x >= 0) || x > 1e12)
            return sbp_fail(err, SBP_EFORMAT, "ref: %s: bad shape of \"%s\"", f->path, name);
        t->shape[d] = (int64_t)x;
        t->numel *= t->shape[d];
    }
    double b = cJSON_GetNumberValue(cJSON_GetArrayItem(off, 0));
    double e2 = cJSON_GetNumberValue(cJSON_GetArrayItem(off, 1));
    if (!(b >= 0) || !(e2 >= b) || e2 > (double)f->ndata ||
        e2 - b != (double)t->numel * types[ty].size)
        return sbp_fail(err, SBP_EFORMAT, "ref: %s: bad data offsets of \"%s\"", f->path, name);
    t->is_float = types[ty].is_float;
    t->v = malloc(sizeof *t->v * (size_t)(t->numel ? t->numel : 1));
    if (!t->v) return sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    const unsigned char *p = f->data + (size_t)b;
    for (int64_t i = 0; i < t->numel; i++) {
        const unsigned char *q = p + (size_t)i * types[ty].size;
        uint64_t u = 0; /* little-endian bytes */
        for (int k = types[ty].size - 1; k >= 0; k--) u = u << 8 | q[k];
        double v;
        const char *n = types[ty].name;
        if (!strcmp(n, "F64")) {
            memcpy(&v, &u, 8);
        } else if (!strcmp(n, "F32")) {
            uint32_t u32 = (uint32_t)u;
            float f32;
            memcpy(&f32, &u32, 4);
            v = f32;
        } else if (!strcmp(n, "BF16") || !strcmp(n, "F16")) {
            v = half_value((unsigned)u, n[0] == 'B');
        } else if (!strcmp(n, "I64")) {
            v = (double)(int64_t)u;
        } else if (!strcmp(n, "I32")) {
            v = (int32_t)(uint32_t)u;
        } else if (!strcmp(n, "I16")) {
            v = (int16_t)(uint16_t)u;
        } else if (!strcmp(n, "I8")) {
            v = (int8_t)(uint8_t)u;
        } else if (!strcmp(n, "U64") && u > INT64_MAX) {
            v = (double)INT64_MAX; /* out of any vocabulary, as a count it is */
        } else {
            v = (double)u;
        }
        t->v[i] = v;
    }
    return SBP_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Model directories */

static void append(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t n, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, n - len, fmt, ap);
    va_end(ap);
}

/* The file that holds tensor `name`: model.safetensors, or the one the index maps it to. */
static const char *shard_of(const cJSON *index, const char *name) {
    if (!index) return "model.safetensors";
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(index, "weight_map"), name));
}

int ref_model_read(ref_model *m, const char *dir, char *mismatch, size_t n_mismatch, sbp_err *err) {
    memset(m, 0, sizeof *m);
    char mm_local[1];
    if (!mismatch) mismatch = mm_local, n_mismatch = 1;
    mismatch[0] = '\0';
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int st = ref_config_read(&m->cfg, path, err);
    if (!st) st = ref_params_build(&m->ps, &m->cfg, err);
    if (st) return st;
    cJSON *index = NULL;
    struct stat sb;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    /* stat, not an open: a FIFO here must not block (slurp refuses it when it is read) */
    if (stat(path, &sb) != 0) {
        unsigned char *text;
        size_t n;
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if ((st = slurp(&text, &n, path, err))) {
            ref_params_free(&m->ps);
            return st;
        }
        index = cJSON_ParseWithLength((const char *)text, n);
        free(text);
    }
    m->w = calloc((size_t)m->ps.total, sizeof *m->w);
    if (!m->w) st = sbp_fail(err, SBP_ENOMEM, "ref: out of memory for the weights");
    st_file f;
    memset(&f, 0, sizeof f);
    int bad = 0;
    for (int i = 0; i < m->ps.n && !st; i++) {
        const sbp_param *p = &m->ps.p[i];
        const char *file = shard_of(index, p->name);
        if (!file || strchr(file, '/')) {
            append(mismatch, n_mismatch, "%s%s missing", bad++ ? "; " : "", p->name);
            continue;
        }
        snprintf(path, sizeof path, "%s/%s", dir, file);
        if (strcmp(f.path, path) != 0) {
            st_close(&f);
            if ((st = st_open(&f, path, err))) break;
        }
        st_tensor t;
        int found;
        st = st_get(&t, &found, &f, p->name, err);
        if (!found) {
            append(mismatch, n_mismatch, "%s%s missing", bad++ ? "; " : "", p->name);
            st = SBP_OK;
            continue;
        }
        if (st) break;
        int same = t.ndim == p->ndim && t.shape[0] == p->shape[0] &&
                   (p->ndim == 1 || t.shape[1] == p->shape[1]);
        if (!same || !t.is_float) {
            append(mismatch, n_mismatch, "%s%s [", bad++ ? "; " : "", p->name);
            for (int d = 0; d < t.ndim; d++)
                append(mismatch, n_mismatch, "%s%lld", d ? ", " : "", (long long)t.shape[d]);
            if (p->ndim == 2)
                append(mismatch, n_mismatch, "] != [%lld, %lld]", (long long)p->shape[0],
                       (long long)p->shape[1]);
            else
                append(mismatch, n_mismatch, "] != [%lld]", (long long)p->shape[0]);
            if (!t.is_float) append(mismatch, n_mismatch, " (not a float dtype)");
        } else {
            for (int64_t j = 0; j < p->numel && !st; j++)
                if (!isfinite(t.v[j]))
                    st = sbp_fail(err, SBP_EINPUT, "ref: %s: \"%s\" holds a non-finite value", path,
                                  p->name);
            memcpy(m->w + p->offset, t.v, sizeof *t.v * (size_t)p->numel);
        }
        free(t.v);
    }
    st_close(&f);
    cJSON_Delete(index);
    if (!st && bad)
        st = sbp_fail(err, SBP_EINPUT,
                      "ref: %s: %d tensors do not have the shape config.json implies to the "
                      "oracle: %.600s",
                      dir, bad, mismatch);
    if (st) ref_model_free(m);
    return st;
}

void ref_model_free(ref_model *m) {
    free(m->w);
    ref_params_free(&m->ps);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------------------------------------
 * LoRA adapter directories (peft's layout) */

/* peft's module names, in the order of the SBP_LORA_* bits and of a layer's tensors. */
static const struct {
    const char *name, *path;
    sbp_param_kind kind;
} lora_modules[] = {
    {"q_proj", "self_attn.q_proj", SBP_P_Q},    {"k_proj", "self_attn.k_proj", SBP_P_K},
    {"v_proj", "self_attn.v_proj", SBP_P_V},    {"o_proj", "self_attn.o_proj", SBP_P_O},
    {"gate_proj", "mlp.gate_proj", SBP_P_GATE}, {"up_proj", "mlp.up_proj", SBP_P_UP},
    {"down_proj", "mlp.down_proj", SBP_P_DOWN},
};

/* The settings of adapter_config.json that the oracle implements; anything that changes the
 * function computed (DoRA, per-module ranks, biases, ...) is refused. */
static int lora_config_read(ref_lora *a, const char *path, sbp_err *err) {
    int st;
    cJSON *o = json_object_read(path, &st, err);
    if (!o) return st;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "r");
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(o, "lora_alpha");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(o, "target_modules");
    const char *bias = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "bias"));
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rank_pattern");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(o, "alpha_pattern");
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(o, "layers_to_transform");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "LORA"))
        st = sbp_fail(err, SBP_EINPUT, "ref: %s: peft_type is not LORA", path);
    else if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > 65536 ||
             r->valuedouble != floor(r->valuedouble))
        st = sbp_fail(err, SBP_EINPUT, "ref: %s: r is not a positive integer", path);
    else if (!cJSON_IsNumber(alpha) || !isfinite(alpha->valuedouble) || alpha->valuedouble <= 0)
        st = sbp_fail(err, SBP_EINPUT, "ref: %s: lora_alpha is not a positive number", path);
    else if ((bias && strcmp(bias, "none")) || cJSON_IsTrue(cJSON_GetObjectItem(o, "use_dora")) ||
             cJSON_IsTrue(cJSON_GetObjectItem(o, "fan_in_fan_out")) ||
             (cJSON_IsObject(rp) && cJSON_GetArraySize(rp)) ||
             (cJSON_IsObject(ap) && cJSON_GetArraySize(ap)) || (lt && !cJSON_IsNull(lt)) ||
             cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, "modules_to_save")))
        st = sbp_fail(err, SBP_EINPUT,
                      "ref: %s: only plain LoRA is implemented (bias none, no DoRA, no per-module "
                      "rank or alpha, every layer, no modules_to_save)",
                      path);
    if (!st) {
        a->r = (int)r->valuedouble;
        a->scale = alpha->valuedouble / (cJSON_IsTrue(cJSON_GetObjectItem(o, "use_rslora"))
                                             ? sqrt((double)a->r)
                                             : (double)a->r);
        a->targets = 0;
        const char *one = cJSON_GetStringValue(tm);
        if (one && !strcmp(one, "all-linear")) {
            a->targets = (1u << 7) - 1; /* every projection; peft leaves the head out */
        } else if (cJSON_IsArray(tm) || one) {
            const cJSON *it = one ? tm : tm->child;
            for (; it && !st; it = one ? NULL : it->next) {
                const char *name = cJSON_GetStringValue(it);
                int k = -1;
                for (int i = 0; name && i < 7; i++)
                    if (!strcmp(name, lora_modules[i].name)) k = i;
                if (k < 0)
                    st = sbp_fail(err, SBP_EINPUT, "ref: %s: target module %s is not a projection",
                                  path, name ? name : "(not a string)");
                else
                    a->targets |= 1u << k;
            }
        } else {
            st = sbp_fail(err, SBP_EINPUT, "ref: %s: no target_modules", path);
        }
        if (!st && !a->targets) st = sbp_fail(err, SBP_EINPUT, "ref: %s: no target module", path);
    }
    cJSON_Delete(o);
    return st;
}

int ref_lora_read(ref_lora *a, const char *dir, const sbp_config *c, sbp_err *err) {
    memset(a, 0, sizeof *a);
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    int st = lora_config_read(a, path, err);
    if (st) return st;
    const int64_t C = c->hidden, F = c->ffn, Q = (int64_t)c->heads * c->head_dim,
                  KV = (int64_t)c->kv_heads * c->head_dim, R = a->r;
    const int64_t in[7] = {C, C, C, Q, C, C, F}, out[7] = {Q, KV, KV, C, F, F, C};
    if (!(a->ps.p = calloc((size_t)c->layers * 14, sizeof *a->ps.p)))
        return sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    for (int l = 0; l < c->layers; l++)
        for (int k = 0; k < 7; k++) {
            if (!(a->targets >> k & 1)) continue;
            for (int which = 1; which <= 2; which++) {
                sbp_param *p = &a->ps.p[a->ps.n++];
                snprintf(p->name, sizeof p->name,
                         "base_model.model.model.layers.%d.%s.lora_%c.weight", l,
                         lora_modules[k].path, which == 1 ? 'A' : 'B');
                p->kind = lora_modules[k].kind, p->layer = l, p->lora = which, p->ndim = 2;
                p->shape[0] = which == 1 ? R : out[k];
                p->shape[1] = which == 1 ? in[k] : R;
                p->numel = p->shape[0] * p->shape[1];
                p->offset = a->ps.total;
                a->ps.total += p->numel;
            }
        }
    if (!(a->w = calloc((size_t)(a->ps.total ? a->ps.total : 1), sizeof *a->w))) {
        ref_lora_free(a);
        return sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st_file f;
    if ((st = st_open(&f, path, err))) {
        ref_lora_free(a);
        return st;
    }
    for (int i = 0; i < a->ps.n && !st; i++) {
        const sbp_param *p = &a->ps.p[i];
        st_tensor t;
        int found;
        st = st_get(&t, &found, &f, p->name, err);
        if (!found) {
            st = sbp_fail(err, SBP_EINPUT, "ref: %s: no tensor \"%s\"", path, p->name);
        } else if (!st && (t.ndim != 2 || t.shape[0] != p->shape[0] || t.shape[1] != p->shape[1] ||
                           !t.is_float)) {
            st = sbp_fail(err, SBP_EINPUT, "ref: %s: \"%s\" is not a float tensor [%lld, %lld]",
                          path, p->name, (long long)p->shape[0], (long long)p->shape[1]);
        } else if (!st) {
            for (int64_t j = 0; j < p->numel && !st; j++)
                if (!isfinite(t.v[j]))
                    st = sbp_fail(err, SBP_EINPUT, "ref: %s: \"%s\" holds a non-finite value", path,
                                  p->name);
            memcpy(a->w + p->offset, t.v, sizeof *t.v * (size_t)p->numel);
        }
        free(t.v);
    }
    st_close(&f);
    if (st) ref_lora_free(a);
    return st;
}

void ref_lora_free(ref_lora *a) {
    free(a->w);
    free(a->ps.p);
    memset(a, 0, sizeof *a);
}

/* ---------------------------------------------------------------------------------------------
 * Batches */

/* A [rows, cols] integer tensor (rows, cols taken from it when 0); NULL when absent and not
 * required. */
static int int2(double **out, const st_file *f, const char *name, int required, int *rows,
                int *cols, sbp_err *err) {
    st_tensor t;
    int found;
    *out = NULL;
    int st = st_get(&t, &found, f, name, err);
    if (!found)
        return required ? sbp_fail(err, SBP_EINPUT, "ref: %s: no \"%s\"", f->path, name) : SBP_OK;
    if (st) return st;
    if (t.ndim != 2 || t.is_float || t.shape[0] < 1 || t.shape[1] < 1 ||
        (*rows && (t.shape[0] != *rows || t.shape[1] != *cols))) {
        free(t.v);
        return sbp_fail(err, SBP_EINPUT,
                        "ref: %s: \"%s\" is not an integer [B, T] tensor of the "
                        "batch's shape",
                        f->path, name);
    }
    *rows = (int)t.shape[0], *cols = (int)t.shape[1];
    *out = t.v;
    return SBP_OK;
}

/* A float tensor of n elements in shape [d0] or [d0, d1]; NULL when absent. */
static int floats(double **out, const st_file *f, const char *name, int d0, int d1, sbp_err *err) {
    st_tensor t;
    int found;
    *out = NULL;
    int st = st_get(&t, &found, f, name, err);
    if (!found) return SBP_OK;
    if (st) return st;
    int ok = t.is_float && t.ndim == (d1 ? 2 : 1) && t.shape[0] == d0 && (!d1 || t.shape[1] == d1);
    for (int64_t i = 0; ok && i < t.numel; i++) ok = isfinite(t.v[i]);
    if (!ok) {
        free(t.v);
        return sbp_fail(err, SBP_EINPUT,
                        "ref: %s: \"%s\" is not a finite float tensor of the "
                        "expected shape",
                        f->path, name);
    }
    *out = t.v;
    return SBP_OK;
}

static int put_row(sbp_batch *b, int r, const double *ids, const double *labels, const double *mask,
                   int T, const sbp_config *cfg, const char *path, sbp_err *err) {
    for (int t = 0; t < T; t++) {
        double id = ids[t], y = labels[t], mk = mask ? mask[t] : 1;
        if (id < 0 || id >= cfg->vocab || (y != SBP_IGNORE && (y < 0 || y >= cfg->vocab)) ||
            (mk != 0 && mk != 1))
            return sbp_fail(err, SBP_EINPUT,
                            "ref: %s: row %d, position %d: id, label or mask "
                            "out of range",
                            path, r, t);
        b->ids[(size_t)r * b->T + t] = (int32_t)id;
        b->labels[(size_t)r * b->T + t] = (int32_t)y;
        b->mask[(size_t)r * b->T + t] = (uint8_t)mk;
    }
    return SBP_OK;
}

static int rows_alloc(sbp_batch *b, int B, int T) {
    size_t n = (size_t)B * T;
    b->B = B, b->T = T;
    b->ids = calloc(n, sizeof *b->ids);
    b->labels = malloc(sizeof *b->labels * n);
    b->mask = calloc(n, 1);
    if (!b->ids || !b->labels || !b->mask) return 0;
    for (size_t i = 0; i < n; i++) b->labels[i] = SBP_IGNORE; /* padding predicts nothing */
    return 1;
}

/* the value for token t, stored at t, moved to the position t − 1 that predicts it */
static double *shift_left(const double *raw, int B, int T) {
    double *out = calloc((size_t)B * T, sizeof *out);
    for (int r = 0; out && r < B; r++)
        for (int t = 1; t < T; t++) out[(size_t)r * T + t - 1] = raw[(size_t)r * T + t];
    return out;
}

static int read_sft(sbp_batch *b, const st_file *f, const sbp_config *cfg, sbp_err *err) {
    double *ids, *labels = NULL, *mask = NULL;
    int B = 0, T = 0;
    int st = int2(&ids, f, "input_ids", 1, &B, &T, err);
    if (!st) st = int2(&labels, f, "labels", 1, &B, &T, err);
    if (!st) st = int2(&mask, f, "attention_mask", 0, &B, &T, err);
    if (!st && !rows_alloc(b, B, T)) st = sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    for (int r = 0; r < B && !st; r++)
        st = put_row(b, r, ids + (size_t)r * T, labels + (size_t)r * T,
                     mask ? mask + (size_t)r * T : NULL, T, cfg, f->path, err);
    free(ids), free(labels), free(mask);
    return st;
}

static int read_dpo(sbp_batch *b, const st_file *f, const sbp_config *cfg, sbp_err *err) {
    double *ci = NULL, *cl = NULL, *cm = NULL, *ri = NULL, *rl = NULL, *rm = NULL;
    int P = 0, Tc = 0, Pr = 0, Tr = 0;
    int st = int2(&ci, f, "chosen_input_ids", 1, &P, &Tc, err);
    if (!st) st = int2(&cl, f, "chosen_labels", 1, &P, &Tc, err);
    if (!st) st = int2(&cm, f, "chosen_attention_mask", 0, &P, &Tc, err);
    if (!st) st = int2(&ri, f, "rejected_input_ids", 1, &Pr, &Tr, err);
    if (!st) st = int2(&rl, f, "rejected_labels", 1, &Pr, &Tr, err);
    if (!st) st = int2(&rm, f, "rejected_attention_mask", 0, &Pr, &Tr, err);
    if (!st && Pr != P)
        st = sbp_fail(err, SBP_EINPUT, "ref: %s: %d chosen, %d rejected", f->path, P, Pr);
    /* chosen rows first, then rejected, both padded on the right to the longer side */
    if (!st && !rows_alloc(b, 2 * P, Tc > Tr ? Tc : Tr))
        st = sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    for (int r = 0; r < P && !st; r++)
        st = put_row(b, r, ci + (size_t)r * Tc, cl + (size_t)r * Tc,
                     cm ? cm + (size_t)r * Tc : NULL, Tc, cfg, f->path, err);
    for (int r = 0; r < P && !st; r++)
        st = put_row(b, P + r, ri + (size_t)r * Tr, rl + (size_t)r * Tr,
                     rm ? rm + (size_t)r * Tr : NULL, Tr, cfg, f->path, err);
    b->pairs = P;
    double *rc = NULL, *rr = NULL;
    if (!st) st = floats(&rc, f, "ref_chosen_logps", P, 0, err);
    if (!st) st = floats(&rr, f, "ref_rejected_logps", P, 0, err);
    if (!st && !rc != !rr)
        st = sbp_fail(err, SBP_EINPUT, "ref: %s: only one side's reference log-probs", f->path);
    if (!st && rc) {
        if (!(b->ref_seq_logps = malloc(sizeof(double) * 2 * (size_t)P)))
            st = sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
        for (int r = 0; r < P && !st; r++)
            b->ref_seq_logps[r] = rc[r], b->ref_seq_logps[P + r] = rr[r];
    }
    free(ci), free(cl), free(cm), free(ri), free(rl), free(rm), free(rc), free(rr);
    return st;
}

/* Group-normalised advantages as TRL computes them: per group of G consecutive rows, with the
 * unbiased standard deviation (torch.std's default), A = (r − mean) / (std + 1e-4). */
static void group_advantages(double *A, const double *r, int B, int G, int scale) {
    for (int g = 0; g < B / G; g++) {
        const double *rg = r + (size_t)g * G;
        double mean = 0, ss = 0;
        for (int i = 0; i < G; i++) mean += rg[i] / G;
        for (int i = 0; i < G; i++) ss += (rg[i] - mean) * (rg[i] - mean);
        double std = G > 1 ? sqrt(ss / (G - 1)) : 0;
        for (int i = 0; i < G; i++)
            A[g * G + i] = scale ? (rg[i] - mean) / (std + 1e-4) : rg[i] - mean;
    }
}

static int read_grpo(sbp_batch *b, const st_file *f, const sbp_config *cfg, int scale,
                     sbp_err *err) {
    double *ids, *cm = NULL, *mask = NULL;
    int B = 0, T = 0;
    int st = int2(&ids, f, "input_ids", 1, &B, &T, err);
    if (!st) st = int2(&cm, f, "completion_mask", 1, &B, &T, err);
    if (!st) st = int2(&mask, f, "attention_mask", 0, &B, &T, err);
    if (!st && !rows_alloc(b, B, T)) st = sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    double *labels = st ? NULL : malloc(sizeof *labels * (size_t)B * T);
    if (!st && !labels) st = sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    for (size_t i = 0; !st && i < (size_t)B * T; i++) {
        if (cm[i] != 0 && cm[i] != 1)
            st = sbp_fail(err, SBP_EINPUT, "ref: %s: completion_mask is not 0/1", f->path);
        labels[i] = cm[i] == 1 ? ids[i] : SBP_IGNORE; /* completion tokens are the targets */
    }
    for (int r = 0; r < B && !st; r++)
        st = put_row(b, r, ids + (size_t)r * T, labels + (size_t)r * T,
                     mask ? mask + (size_t)r * T : NULL, T, cfg, f->path, err);
    double *adv = NULL, *rew = NULL, *old = NULL, *ref = NULL;
    if (!st) st = floats(&adv, f, "advantages", B, 0, err);
    if (!st) st = floats(&rew, f, "rewards", B, 0, err);
    if (!st && !adv == !rew)
        st = sbp_fail(err, SBP_EINPUT, "ref: %s: needs advantages or rewards", f->path);
    if (!st && rew) {
        const cJSON *meta = cJSON_GetObjectItemCaseSensitive(f->hdr, "__metadata__");
        const char *g = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "group_size"));
        if (!g) g = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "num_generations"));
        char *end = NULL;
        double G = g ? strtod(g, &end) : 0;
        if (!g || end == g || *end || G != floor(G) || G < 1 || G > B || B % (int)G)
            st =
                sbp_fail(err, SBP_EINPUT, "ref: %s: no group size that divides B = %d", f->path, B);
        else if (!(adv = malloc(sizeof *adv * (size_t)B)))
            st = sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
        else
            group_advantages(adv, rew, B, (int)G, scale);
    }
    b->advantages = adv;
    adv = NULL;
    if (!st) st = floats(&old, f, "old_logps", B, T, err);
    if (!st) st = floats(&ref, f, "ref_logps", B, T, err);
    if (!st && old && !(b->old_logps = shift_left(old, B, T)))
        st = sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    if (!st && ref && !(b->ref_logps = shift_left(ref, B, T)))
        st = sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    free(ids), free(cm), free(mask), free(labels), free(adv), free(rew), free(old), free(ref);
    return st;
}

int ref_batch_read(sbp_batch *b, const char *path, const sbp_config *cfg, sbp_objective_kind kind,
                   int scale_rewards, sbp_err *err) {
    memset(b, 0, sizeof *b);
    st_file f;
    int st = st_open(&f, path, err);
    if (st) return st;
    b->kind = kind;
    st = kind == SBP_OBJ_DPO    ? read_dpo(b, &f, cfg, err)
         : kind == SBP_OBJ_GRPO ? read_grpo(b, &f, cfg, scale_rewards, err)
                                : read_sft(b, &f, cfg, err);
    st_close(&f);
    for (int r = 0; r < b->B && !st; r++) /* counted here, not by the library's helper */
        for (int t = 0; t + 1 < b->T; t++)
            if (b->labels[(size_t)r * b->T + t + 1] != SBP_IGNORE) {
                b->n_targets++;
                b->n_pad_targets += b->mask[(size_t)r * b->T + t] == 0;
            }
    if (st) ref_batch_free(b);
    return st;
}

void ref_batch_free(sbp_batch *b) {
    free(b->ids), free(b->labels), free(b->mask);
    free(b->ref_seq_logps), free(b->advantages), free(b->old_logps), free(b->ref_logps);
    memset(b, 0, sizeof *b);
}
