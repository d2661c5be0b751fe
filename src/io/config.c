/* config.c — config.json (Hugging Face) for Qwen3, Qwen2/2.5, Llama-3 and Gemma-3, read with
 * cJSON.
 *
 * Accepts both ways HF writes RoPE settings: `rope_theta` + `rope_scaling` (transformers 4.x) and
 * `rope_parameters` (transformers 5). Gemma-3 is read as transformers 4.51.3's Gemma3TextConfig
 * reads it, defaults for absent keys included, from a gemma3_text config or from the
 * text_config of a multimodal gemma3 one. Anything the engine does not implement (Qwen2's
 * sliding windows, attention or MLP bias outside Qwen2, other activations, other RoPE types,
 * soft-capping) is rejected by name rather than silently computed wrong. */
#include "../core/err.h"
#include "../streambp.h"
#include "file.h"
#include "json.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads an integer field; `required` fields must be present. Returns 0 on failure (err filled). */
static int get_int(const cJSON *o, const char *key, int required, int dflt, int *out,
                   const char *what, sbp_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) {
            sbp_fail(err, SBP_EINPUT, "%s: missing required field \"%s\"", what, key);
            return 0;
        }
        *out = dflt;
        return 1;
    }
    double d = cJSON_GetNumberValue(v);
    if (!cJSON_IsNumber(v) || d != floor(d) || d < 0 || d > 1e9) {
        sbp_fail(err, SBP_EINPUT, "%s: field \"%s\" must be a non-negative integer", what, key);
        return 0;
    }
    *out = (int)d;
    return 1;
}

static int get_num(const cJSON *o, const char *key, int required, double dflt, double *out,
                   const char *what, sbp_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) {
            sbp_fail(err, SBP_EINPUT, "%s: missing required field \"%s\"", what, key);
            return 0;
        }
        *out = dflt;
        return 1;
    }
    if (!cJSON_IsNumber(v) || !isfinite(cJSON_GetNumberValue(v))) {
        sbp_fail(err, SBP_EINPUT, "%s: field \"%s\" must be a finite number", what, key);
        return 0;
    }
    *out = cJSON_GetNumberValue(v);
    return 1;
}

/* A boolean field; absent or null gives dflt. */
static int get_bool(const cJSON *o, const char *key, int dflt, int *out, const char *what,
                    sbp_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 1;
    }
    if (!cJSON_IsBool(v)) {
        sbp_fail(err, SBP_EINPUT, "%s: field \"%s\" must be true or false", what, key);
        return 0;
    }
    *out = cJSON_IsTrue(v);
    return 1;
}

/* rope_scaling / rope_parameters: the type is "default" (or absent) or "llama3". */
static int parse_rope(sbp_config *c, const cJSON *rs, const char *field, const char *what,
                      sbp_err *err) {
    if (!rs || cJSON_IsNull(rs)) return 1;
    if (!cJSON_IsObject(rs)) {
        sbp_fail(err, SBP_EINPUT, "%s: \"%s\" must be an object or null", what, field);
        return 0;
    }
    if (cJSON_GetObjectItemCaseSensitive(rs, "rope_theta") &&
        !get_num(rs, "rope_theta", 1, 0, &c->rope_theta, what, err))
        return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!type) type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const char *t = cJSON_GetStringValue(type);
    if (!type || (t && strcmp(t, "default") == 0)) return 1;
    if (t && strcmp(t, "linear") == 0 && c->family == SBP_GEMMA3) {
        /* HF _compute_linear_scaling_rope_parameters: inv_freq / factor (Gemma-3 4B and up) */
        c->rope_linear = 1;
        if (!get_num(rs, "factor", 1, 0, &c->rope_factor, what, err)) return 0;
        if (!(c->rope_factor > 0)) {
            sbp_fail(err, SBP_EINPUT, "%s: %s.factor must be > 0", what, field);
            return 0;
        }
        return 1;
    }
    if (!t || strcmp(t, "llama3") != 0) {
        sbp_fail(err, SBP_EINPUT,
                 "%s: %s.rope_type \"%s\" is not supported (only \"default\" and \"llama3\"%s)",
                 what, field, t ? t : "(not a string)",
                 c->family == SBP_GEMMA3 ? " and \"linear\"" : "");
        return 0;
    }
    c->rope_llama3 = 1;
    if (!get_num(rs, "factor", 1, 0, &c->rope_factor, what, err) ||
        !get_num(rs, "low_freq_factor", 1, 0, &c->rope_low_freq, what, err) ||
        !get_num(rs, "high_freq_factor", 1, 0, &c->rope_high_freq, what, err) ||
        !get_num(rs, "original_max_position_embeddings", 1, 0, &c->rope_orig_max, what, err))
        return 0;
    if (c->rope_factor <= 0 || c->rope_low_freq <= 0 || c->rope_orig_max <= 0 ||
        c->rope_high_freq <= c->rope_low_freq) {
        sbp_fail(err, SBP_EINPUT,
                 "%s: llama3 rope scaling needs factor > 0, original_max_position_embeddings > 0 "
                 "and high_freq_factor > low_freq_factor > 0",
                 what);
        return 0;
    }
    return 1;
}

/* pad_token_id: absent gives the family's default (Gemma3TextConfig: 0; the others: None), null
 * gives -1 (no padding_idx), as HF's nn.Embedding(..., padding_idx=config.pad_token_id). */
static int get_pad(const cJSON *o, int dflt, int *out, const char *what, sbp_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "pad_token_id");
    if (!v) {
        *out = dflt;
        return 1;
    }
    if (cJSON_IsNull(v)) {
        *out = -1;
        return 1;
    }
    double d = cJSON_GetNumberValue(v);
    if (!cJSON_IsNumber(v) || d != floor(d) || d < 0 || d >= SBP_MAX_VOCAB) {
        sbp_fail(err, SBP_EINPUT,
                 "%s: field \"pad_token_id\" must be null or a token id (a non-negative integer "
                 "below vocab_size)",
                 what);
        return 0;
    }
    *out = (int)d;
    return 1;
}

/* A field that must be absent or null; `why` says what it would need. */
static int must_be_null(const cJSON *o, const char *key, const char *why, const char *what,
                        sbp_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 1;
    sbp_fail(err, SBP_EINPUT, "%s: %s is set; %s", what, key, why);
    return 0;
}

/* The layer kind HF's layer_types names for layer l, given as a string: 1 sliding, 0 full, -1 any
 * other (HF knows others, e.g. "chunked_attention", that these models do not use). */
static int layer_kind(const cJSON *v) {
    const char *s = cJSON_GetStringValue(v);
    return !s                                    ? -1
           : strcmp(s, "sliding_attention") == 0 ? 1
           : strcmp(s, "full_attention") == 0    ? 0
                                                 : -1;
}

/* layer_types (transformers 4.53 and later write it): a list of "sliding_attention" and
 * "full_attention", one per layer, that decides which layers are local, sliding_window_pattern
 * then being read only when layer_types is absent. The engine knows the pattern's layouts (every
 * pattern-th layer global: sbp_layer_window), and so do ref/ and verify/torch_grads.py, which
 * read sliding_window_pattern only; so a layer_types that the pattern (6 when absent, HF's
 * default) does not give is refused, naming the first layer that differs and the pattern that
 * would give it when there is one, rather than followed by one reader and not another. Every
 * other family's layers are all full attention. */
static int check_layer_types(const cJSON *t, const sbp_config *c, int pattern_given,
                             const char *what, sbp_err *err) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(t, "layer_types");
    if (!lt || cJSON_IsNull(lt)) return 1;
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->layers) {
        sbp_fail(err, SBP_EINPUT,
                 "%s: layer_types must be a list of %d layer kinds (one per layer, "
                 "num_hidden_layers)",
                 what, c->layers);
        return 0;
    }
    int first_full = -1; /* the pattern layer_types has: first_full + 1, when it has one */
    for (int l = 0; l < c->layers; l++) {
        const int k = layer_kind(cJSON_GetArrayItem(lt, l));
        if (k < 0 || (k == 1 && c->family != SBP_GEMMA3)) {
            sbp_fail(err, SBP_EINPUT, "%s: layer_types[%d] is not %s", what, l,
                     c->family == SBP_GEMMA3 ? "\"sliding_attention\" or \"full_attention\""
                                             : "\"full_attention\" (sliding-window attention "
                                               "is Gemma-3's only)");
            return 0;
        }
        if (k == 0 && first_full < 0) first_full = l;
    }
    if (c->family != SBP_GEMMA3) return 1;
    const int implied = first_full < 0 ? c->layers + 1 : first_full + 1;
    int periodic = 1, differs = -1;
    for (int l = 0; l < c->layers; l++) {
        const int k = layer_kind(cJSON_GetArrayItem(lt, l));
        periodic &= k == ((l + 1) % implied != 0);
        if (differs < 0 && k != ((l + 1) % c->sliding_window_pattern != 0)) differs = l;
    }
    if (differs < 0) return 1;
    char fix[160];
    if (periodic)
        snprintf(fix, sizeof fix,
                 "give \"sliding_window_pattern\": %d, which makes the same layers "
                 "local",
                 implied);
    else
        snprintf(fix, sizeof fix,
                 "its layout is no sliding_window_pattern's (every pattern-th "
                 "layer global), the only ones streambp computes");
    sbp_fail(err, SBP_EINPUT,
             "%s: layer_types[%d] is \"%s_attention\", but sliding_window_pattern %d%s makes "
             "layer %d %s; HF follows layer_types, streambp reads the pattern: %s",
             what, differs, layer_kind(cJSON_GetArrayItem(lt, differs)) ? "sliding" : "full",
             c->sliding_window_pattern, pattern_given ? "" : " (the default)", differs,
             (differs + 1) % c->sliding_window_pattern ? "local" : "global", fix);
    return 0;
}

/* The Gemma-3 fields (Gemma3TextConfig, HF 4.51.3, with its defaults). */
static int parse_gemma3(const cJSON *t, sbp_config *c, const char *what, sbp_err *err) {
    const char *act =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(t, "hidden_activation"));
    if (cJSON_GetObjectItemCaseSensitive(t, "hidden_activation") &&
        (!act || strcmp(act, "gelu_pytorch_tanh") != 0)) {
        sbp_fail(err, SBP_EINPUT,
                 "%s: hidden_activation \"%s\" is not supported (only \"gelu_pytorch_tanh\")", what,
                 act ? act : "(not a string)");
        return 0;
    }
    if (!must_be_null(t, "attn_logit_softcapping",
                      "attention logit soft-capping is not implemented (Gemma-3 has none)", what,
                      err) ||
        !must_be_null(t, "final_logit_softcapping",
                      "final logit soft-capping is not implemented (Gemma-3 has none)", what, err))
        return 0;
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(t, "sliding_window");
    if (sw && cJSON_IsNull(sw)) {
        sbp_fail(err, SBP_EINPUT,
                 "%s: sliding_window is null; Gemma-3's local layers need a window (HF's "
                 "Gemma3DecoderLayer fails without one)",
                 what);
        return 0;
    }
    if (!get_int(t, "sliding_window", 0, 4096, &c->sliding_window, what, err) ||
        !get_int(t, "sliding_window_pattern", 0, 6, &c->sliding_window_pattern, what, err) ||
        !get_num(t, "rope_local_base_freq", 0, 10000.0, &c->rope_local_theta, what, err) ||
        !get_num(t, "query_pre_attn_scalar", 0, 256, &c->query_pre_attn_scalar, what, err))
        return 0;
    if (c->sliding_window < 1 || c->sliding_window_pattern < 1) {
        sbp_fail(err, SBP_EINPUT, "%s: sliding_window and sliding_window_pattern must be >= 1",
                 what);
        return 0;
    }
    /* EmbeddingGemma's configs (transformers 4.56 and later): every query sees every key, the
     * window halved; the engine computes causal decoders */
    int bidirectional;
    if (!get_bool(t, "use_bidirectional_attention", 0, &bidirectional, what, err)) return 0;
    if (bidirectional) {
        sbp_fail(err, SBP_EINPUT,
                 "%s: use_bidirectional_attention is true; bidirectional (non-causal) attention "
                 "is not implemented: streambp computes causal decoders",
                 what);
        return 0;
    }
    if (!(c->rope_local_theta > 0) || !(c->query_pre_attn_scalar > 0)) {
        sbp_fail(err, SBP_EINPUT, "%s: rope_local_base_freq and query_pre_attn_scalar must be > 0",
                 what);
        return 0;
    }
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(t, "sliding_window_pattern");
    return check_layer_types(t, c, pattern && !cJSON_IsNull(pattern), what, err);
}

static int check_unsupported(const cJSON *o, const sbp_config *c, const char *what, sbp_err *err) {
    int flag;
    const char *act = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "hidden_act"));
    /* Gemma-3 reads hidden_activation (parse_gemma3); its hidden_act is never used by HF */
    if (c->family != SBP_GEMMA3 && act && strcmp(act, "silu") != 0) {
        sbp_fail(err, SBP_EINPUT, "%s: hidden_act \"%s\" is not supported (only \"silu\")", what,
                 act);
        return 0;
    }
    if (!get_bool(o, "use_sliding_window", 0, &flag, what, err)) return 0;
    if (flag && c->family != SBP_GEMMA3) {
        sbp_fail(err, SBP_EINPUT,
                 "%s: use_sliding_window is true; sliding-window attention is "
                 "not supported",
                 what);
        return 0;
    }
    if (c->family != SBP_QWEN2) {
        if (!get_bool(o, "attention_bias", 0, &flag, what, err)) return 0;
        if (flag) {
            sbp_fail(err, SBP_EINPUT,
                     "%s: attention_bias is true; only Qwen2 attention biases "
                     "are supported",
                     what);
            return 0;
        }
    }
    if (!get_bool(o, "mlp_bias", 0, &flag, what, err)) return 0;
    if (flag) {
        sbp_fail(err, SBP_EINPUT, "%s: mlp_bias is true; MLP biases are not supported", what);
        return 0;
    }
    return 1;
}

/* The sizes of streambp.h's SBP_MAX_*, checked one by one so that the message names the field;
 * sbp_config_validate checks their products. */
static int within_limits(const sbp_config *c, const char *what, sbp_err *err) {
    const struct {
        const char *field;
        int value, max;
    } f[] = {{"vocab_size", c->vocab, SBP_MAX_VOCAB},
             {"hidden_size", c->hidden, SBP_MAX_HIDDEN},
             {"intermediate_size", c->ffn, SBP_MAX_FFN},
             {"num_hidden_layers", c->layers, SBP_MAX_LAYERS},
             {"num_attention_heads", c->heads, SBP_MAX_HEADS},
             {"num_key_value_heads", c->kv_heads, SBP_MAX_HEADS}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].value > f[i].max) {
            sbp_fail(err, SBP_EINPUT, "%s: %s %d is more than the supported %d", what, f[i].field,
                     f[i].value, f[i].max);
            return 0;
        }
    return 1;
}

/* a + b·c, or -1 when it would pass SBP_MAX_PARAMS (or overflow) */
static int64_t add_mul(int64_t a, int64_t b, int64_t c) {
    int64_t p, r;
    if (a < 0 || __builtin_mul_overflow(b, c, &p) || __builtin_add_overflow(a, p, &r) ||
        r > SBP_MAX_PARAMS)
        return -1;
    return r;
}

int64_t sbp_config_param_count(const sbp_config *c) {
    if (c->vocab < 1 || c->hidden < 1 || c->ffn < 1 || c->layers < 1 || c->heads < 1 ||
        c->kv_heads < 1 || c->head_dim < 1 || !within_limits(c, "", NULL) ||
        c->head_dim > SBP_MAX_HEAD_DIM)
        return -1;
    int64_t C = c->hidden, F = c->ffn, V = c->vocab, HD = c->head_dim;
    int64_t Q = (int64_t)c->heads * HD, KV = (int64_t)c->kv_heads * HD;
    int64_t layer = add_mul(0, Q, C);                          /* q_proj */
    layer = add_mul(layer, 2 * KV, C);                         /* k_proj, v_proj */
    layer = add_mul(layer, C, Q);                              /* o_proj */
    layer = add_mul(layer, 3 * F, C);                          /* gate, up, down */
    layer = add_mul(layer, 2, C);                              /* the two norms */
    if (c->family == SBP_GEMMA3) layer = add_mul(layer, 2, C); /* the feed-forward norms */
    if (c->qkv_bias) layer = add_mul(layer, 1, Q + 2 * KV);
    if (c->qk_norm) layer = add_mul(layer, 2, HD);
    int64_t total = add_mul(0, c->layers, layer < 0 ? SBP_MAX_PARAMS + 1 : layer);
    total = add_mul(total, c->tied ? 1 : 2, V * C); /* embedding (and lm_head) */
    return add_mul(total, 1, C);                    /* final norm */
}

sbp_status sbp_config_validate(const sbp_config *c, const char *what, sbp_err *err) {
    if ((unsigned)c->family > SBP_GEMMA3)
        return sbp_fail(err, SBP_EINPUT, "%s: unknown model family %d", what, (int)c->family);
    if (c->vocab < 1 || c->hidden < 1 || c->ffn < 1 || c->layers < 1 || c->heads < 1 ||
        c->kv_heads < 1 || c->head_dim < 1)
        return sbp_fail(err, SBP_EINPUT,
                        "%s: vocab_size, hidden_size, intermediate_size, num_hidden_layers, the "
                        "head counts and head_dim must all be >= 1",
                        what);
    if (!within_limits(c, what, err)) return err ? err->status : SBP_EINPUT;
    if (c->head_dim > SBP_MAX_HEAD_DIM || c->head_dim % 2 != 0)
        return sbp_fail(err, SBP_EINPUT, "%s: head_dim %d must be even and at most %d", what,
                        c->head_dim, SBP_MAX_HEAD_DIM);
    if (c->heads % c->kv_heads != 0)
        return sbp_fail(
            err, SBP_EINPUT,
            "%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)", what,
            c->heads, c->kv_heads);
    if (!(c->eps > 0) || !isfinite(c->eps) || !(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return sbp_fail(err, SBP_EINPUT, "%s: rms_norm_eps and rope_theta must be finite and > 0",
                        what);
    if (c->pad_token_id < -1 || c->pad_token_id >= c->vocab)
        return sbp_fail(err, SBP_EINPUT,
                        "%s: pad_token_id %d is not a token of the vocabulary [0, %d)", what,
                        c->pad_token_id, c->vocab);
    if (c->family == SBP_GEMMA3 &&
        (c->sliding_window < 1 || c->sliding_window_pattern < 1 || !(c->rope_local_theta > 0) ||
         !isfinite(c->rope_local_theta) || !(c->query_pre_attn_scalar > 0) ||
         !isfinite(c->query_pre_attn_scalar)))
        return sbp_fail(err, SBP_EINPUT,
                        "%s: Gemma-3 needs sliding_window >= 1, sliding_window_pattern >= 1, and "
                        "rope_local_base_freq and query_pre_attn_scalar finite and > 0",
                        what);
    if (c->rope_linear && (c->rope_llama3 || !(c->rope_factor > 0)))
        return sbp_fail(err, SBP_EINPUT, "%s: linear rope scaling needs a factor > 0", what);
    if (sbp_config_param_count(c) < 0)
        return sbp_fail(err, SBP_EINPUT,
                        "%s: the model would have more than %lld parameters (vocab %d, hidden %d, "
                        "intermediate %d, %d layers, %d heads of %d); that is past what any "
                        "machine holds and what streambp supports",
                        what, (long long)SBP_MAX_PARAMS, c->vocab, c->hidden, c->ffn, c->layers,
                        c->heads, c->head_dim);
    return SBP_OK;
}

/* head_dim (1 when read and valid; else 0 with err set). */
static int parse_head_dim(const cJSON *t, sbp_config *c, const char *what, sbp_err *err) {
    /* head_dim: explicit in Qwen3 and recent Llama configs, where it need not be C/NH. When it
     * is absent HF's Qwen3Config falls back to 128; Llama and Qwen2 use C/NH. */
#ifdef SBP_PLANT_HEAD_DIM_DEFAULT
    int dflt_hd = c->hidden % c->heads == 0
                      ? c->hidden / c->heads
                      : 0; /* planted bug (tests/test_plant.c); never in a normal build */
#else
    int dflt_hd = c->family == SBP_QWEN3      ? 128
                  : c->family == SBP_GEMMA3   ? 256 /* Gemma3TextConfig's default */
                  : c->hidden % c->heads == 0 ? c->hidden / c->heads
                                              : 0;
#endif
    if (!get_int(t, "head_dim", 0, dflt_hd, &c->head_dim, what, err)) return 0;
    if (c->head_dim == 0 && cJSON_GetObjectItemCaseSensitive(t, "head_dim")) {
        sbp_fail(err, SBP_EINPUT, "%s: head_dim 0 must be >= 1", what);
        return 0;
    }
    if (c->head_dim == 0) {
        sbp_fail(err, SBP_EINPUT,
                 "%s: hidden_size (%d) is not a multiple of num_attention_heads (%d) and no "
                 "head_dim is given",
                 what, c->hidden, c->heads);
        return 0;
    }
    if (c->head_dim > 512) {
        sbp_fail(err, SBP_EINPUT, "%s: head_dim %d is larger than the supported 512", what,
                 c->head_dim);
        return 0;
    }
    if (c->head_dim % 2 != 0) {
        sbp_fail(err, SBP_EINPUT, "%s: head_dim %d is odd; RoPE needs an even head_dim", what,
                 c->head_dim);
        return 0;
    }
    return 1;
}

sbp_status sbp_config_parse(sbp_config *cfg, const char *json, const char *what, sbp_err *err) {
    sbp_config c;
    memset(&c, 0, sizeof c);
    cJSON *o;
    sbp_status st0 = sbp_json_parse(&o, json, strlen(json), what, err);
    if (st0) return st0;
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return sbp_fail(err, SBP_EFORMAT, "%s: the top level is not a JSON object", what);
    }
    sbp_status st = SBP_EINPUT;
    cJSON *empty = NULL; /* a gemma3 config's missing text_config */
    const char *mt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "model_type"));
    if (!mt) {
        sbp_fail(err, SBP_EINPUT, "%s: missing required field \"model_type\"", what);
        goto out;
    }
    /* t: the text model's config; the top level, or a multimodal gemma3's text_config */
    const cJSON *t = o;
    if (strcmp(mt, "qwen3") == 0)
        c.family = SBP_QWEN3;
    else if (strcmp(mt, "qwen2") == 0)
        c.family = SBP_QWEN2;
    else if (strcmp(mt, "llama") == 0)
        c.family = SBP_LLAMA;
    else if (strcmp(mt, "gemma3_text") == 0)
        c.family = SBP_GEMMA3;
    else if (strcmp(mt, "gemma3") == 0) {
        /* Gemma3ForConditionalGeneration: the language model is Gemma3TextConfig(**text_config),
         * whose defaults fill the keys text_config leaves out (an absent text_config: all) */
        c.family = SBP_GEMMA3, c.wrapped = 1;
        t = cJSON_GetObjectItemCaseSensitive(o, "text_config");
        if (!t || cJSON_IsNull(t)) t = empty = cJSON_CreateObject();
        if (!t || !cJSON_IsObject(t)) {
            sbp_fail(err, SBP_EINPUT, "%s: \"text_config\" must be an object", what);
            goto out;
        }
    } else {
        sbp_fail(err, SBP_EINPUT,
                 "%s: model_type \"%s\" is not supported (qwen3, qwen2, llama, gemma3_text, "
                 "gemma3)",
                 what, mt);
        goto out;
    }
    const int gem = c.family == SBP_GEMMA3;
    snprintf(c.model_type, sizeof c.model_type, "%s", gem ? "gemma3_text" : mt);
    /* Gemma3TextConfig gives every field a default (HF 4.51.3); the other families' configs
     * must name their sizes */
    if (!get_int(t, "vocab_size", !gem, 262208, &c.vocab, what, err) ||
        !get_int(t, "hidden_size", !gem, 2304, &c.hidden, what, err) ||
        !get_int(t, "intermediate_size", !gem, 9216, &c.ffn, what, err) ||
        !get_int(t, "num_hidden_layers", !gem, 26, &c.layers, what, err) ||
        !get_int(t, "num_attention_heads", !gem, 8, &c.heads, what, err) ||
        !get_int(t, "num_key_value_heads", 0, gem ? 4 : c.heads, &c.kv_heads, what, err) ||
        !get_num(t, "rms_norm_eps", !gem, 1e-6, &c.eps, what, err) ||
        !get_num(t, "initializer_range", 0, 0.02, &c.init_range, what, err) ||
        !get_bool(t, "tie_word_embeddings", gem, &c.tied, what, err) ||
        !get_pad(t, gem ? 0 : -1, &c.pad_token_id, what, err))
        goto out;
    if (c.vocab < 1 || c.hidden < 1 || c.ffn < 1 || c.layers < 1 || c.heads < 1 || c.kv_heads < 1) {
        sbp_fail(err, SBP_EINPUT,
                 "%s: vocab_size, hidden_size, intermediate_size, "
                 "num_hidden_layers and the head counts must all be >= 1",
                 what);
        goto out;
    }
    if (!within_limits(&c, what, err)) goto out;
    if (c.heads % c.kv_heads != 0) {
        sbp_fail(err, SBP_EINPUT,
                 "%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)", what,
                 c.heads, c.kv_heads);
        goto out;
    }
    if (!parse_head_dim(t, &c, what, err)) goto out;
    if (!(c.eps > 0)) {
        sbp_fail(err, SBP_EINPUT, "%s: rms_norm_eps must be > 0", what);
        goto out;
    }
    c.qkv_bias = c.family == SBP_QWEN2;
    c.qk_norm = c.family == SBP_QWEN3 || gem;
    if (!check_unsupported(t, &c, what, err) || (gem && !parse_gemma3(t, &c, what, err)) ||
        (!gem && !check_layer_types(t, &c, 0, what, err)))
        goto out;
    if (!get_num(t, "rope_theta", 0, gem ? 1e6 : 10000.0, &c.rope_theta, what, err)) goto out;
    if (!parse_rope(&c, cJSON_GetObjectItemCaseSensitive(t, "rope_scaling"), "rope_scaling", what,
                    err) ||
        !parse_rope(&c, cJSON_GetObjectItemCaseSensitive(t, "rope_parameters"), "rope_parameters",
                    what, err))
        goto out;
    if (!(c.rope_theta > 0)) {
        sbp_fail(err, SBP_EINPUT, "%s: rope_theta must be > 0", what);
        goto out;
    }
    if (sbp_config_validate(&c, what, err)) goto out; /* the parameter count */
    *cfg = c;
    st = SBP_OK;
out:
    cJSON_Delete(empty);
    cJSON_Delete(o);
    return st;
}

sbp_status sbp_config_load(sbp_config *cfg, const char *path, sbp_err *err) {
    char *text = NULL;
    sbp_status st = sbp_read_text(&text, NULL, path, 16u << 20, err);
    if (st) return st;
    st = sbp_config_parse(cfg, text, path, err);
    free(text);
    return st;
}

sbp_status sbp_config_save(const sbp_config *c, const char *path, sbp_err *err) {
    static const char *arch[] = {"Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM",
                                 "Gemma3ForCausalLM"};
    const int gem = c->family == SBP_GEMMA3;
    cJSON *o = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(arch[c->family]));
    cJSON_AddStringToObject(o, "model_type", c->model_type);
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab);
    cJSON_AddNumberToObject(o, "hidden_size", c->hidden);
    cJSON_AddNumberToObject(o, "intermediate_size", c->ffn);
    cJSON_AddNumberToObject(o, "num_hidden_layers", c->layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", c->heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", c->kv_heads);
    cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
    if (gem)
        cJSON_AddStringToObject(o, "hidden_activation", "gelu_pytorch_tanh");
    else
        cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddItemToObject(o, "rms_norm_eps", sbp_json_number(c->eps));
    cJSON_AddItemToObject(o, "rope_theta", sbp_json_number(c->rope_theta));
    if (c->rope_llama3) {
        cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddItemToObject(rs, "factor", sbp_json_number(c->rope_factor));
        cJSON_AddItemToObject(rs, "low_freq_factor", sbp_json_number(c->rope_low_freq));
        cJSON_AddItemToObject(rs, "high_freq_factor", sbp_json_number(c->rope_high_freq));
        cJSON_AddItemToObject(rs, "original_max_position_embeddings",
                              sbp_json_number(c->rope_orig_max));
    } else if (c->rope_linear) {
        cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "linear");
        cJSON_AddItemToObject(rs, "factor", sbp_json_number(c->rope_factor));
    } else {
        cJSON_AddNullToObject(o, "rope_scaling");
    }
    if (c->family != SBP_QWEN2) cJSON_AddFalseToObject(o, "attention_bias");
    if (c->family == SBP_LLAMA) cJSON_AddFalseToObject(o, "mlp_bias");
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tied);
    if (c->pad_token_id >= 0)
        cJSON_AddNumberToObject(o, "pad_token_id", c->pad_token_id);
    else if (gem) /* absent would mean Gemma3TextConfig's 0 */
        cJSON_AddNullToObject(o, "pad_token_id");
    if (gem) {
        cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window);
        cJSON_AddNumberToObject(o, "sliding_window_pattern", c->sliding_window_pattern);
        cJSON_AddItemToObject(o, "rope_local_base_freq", sbp_json_number(c->rope_local_theta));
        cJSON_AddItemToObject(o, "query_pre_attn_scalar",
                              sbp_json_number(c->query_pre_attn_scalar));
        cJSON_AddNullToObject(o, "attn_logit_softcapping");
        cJSON_AddNullToObject(o, "final_logit_softcapping");
    } else {
        cJSON_AddFalseToObject(o, "use_sliding_window");
    }
    cJSON_AddItemToObject(o, "initializer_range", sbp_json_number(c->init_range));
    cJSON_AddStringToObject(o, "torch_dtype", "float32");
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return sbp_fail(err, SBP_ENOMEM, "%s: cannot format config JSON", path);
    size_t n = strlen(text);
    text[n] = '\n'; /* cJSON_Print leaves no newline; its buffer has room for the NUL we replace */
    sbp_status st = sbp_write_atomic(path, text, n + 1, err);
    free(text);
    return st;
}
