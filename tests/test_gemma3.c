/* test_gemma3.c — the Gemma-3 model plumbing (issue 34): config.json as HF 4.51.3's
 * Gemma3TextConfig reads it (defaults included, and the multimodal "gemma3" wrapper), the
 * parameter table, pad_token_id for every family, and the engine's Gemma-3 layer: finite
 * differences in float64 and full = ckpt = stream bit for bit. */
#include "testutil.h"

#include <cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static sbp_status parse(sbp_config *c, const char *json, sbp_err *err) {
    memset(err, 0, sizeof *err);
    return sbp_config_parse(c, json, "test", err);
}

/* A config that must be refused with a message naming `name`. */
static void refused(const char *json, const char *name) {
    sbp_config c;
    sbp_err err;
    ck_assert_msg(parse(&c, json, &err) == SBP_EINPUT, "accepted: %s", json);
    ck_assert_msg(strstr(err.msg, name), "the message does not name %s: %s", name, err.msg);
}

START_TEST(config_tiny) {
    sbp_config c;
    sbp_err err = {0};
    ck_assert_msg(!sbp_config_load(&c, "data/models/gemma3-tiny.json", &err), "%s", err.msg);
    ck_assert_int_eq(c.family, SBP_GEMMA3);
    ck_assert_str_eq(c.model_type, "gemma3_text");
    ck_assert(c.vocab == 512 && c.hidden == 64 && c.ffn == 96 && c.layers == 4);
    ck_assert(c.heads == 4 && c.kv_heads == 2 && c.head_dim == 24);
    ck_assert(c.qk_norm && !c.qkv_bias && c.tied && !c.wrapped);
    ck_assert(c.sliding_window == 8 && c.sliding_window_pattern == 3);
    ck_assert(c.rope_theta == 1e6 && c.rope_local_theta == 1e4 && !c.rope_linear);
    ck_assert(c.query_pre_attn_scalar == 32 && c.pad_token_id == 0);
    /* HF: is_sliding = bool((layer_idx + 1) % sliding_window_pattern) */
    ck_assert_int_eq(sbp_layer_window(&c, 0), 8);
    ck_assert_int_eq(sbp_layer_window(&c, 1), 8);
    ck_assert_int_eq(sbp_layer_window(&c, 2), 0);
    ck_assert_int_eq(sbp_layer_window(&c, 3), 8);
    ck_assert(sbp_attn_scale(&c) == 1.0 / sqrt(32.0));
    /* every other family: no window, head_dim^-0.5 */
    sbp_config q;
    ck_assert(!sbp_config_load(&q, "data/models/qwen3-tiny.json", &err));
    ck_assert_int_eq(sbp_layer_window(&q, 0), 0);
    ck_assert(sbp_attn_scale(&q) == 1.0 / sqrt((double)q.head_dim));
    ck_assert_int_eq(q.pad_token_id, -1);
}
END_TEST

/* Gemma3TextConfig's defaults fill what a config leaves out (HF 4.51.3). */
START_TEST(config_defaults) {
    sbp_config c;
    sbp_err err;
    ck_assert_msg(!parse(&c, "{\"model_type\": \"gemma3_text\"}", &err), "%s", err.msg);
    ck_assert(c.vocab == 262208 && c.hidden == 2304 && c.ffn == 9216 && c.layers == 26);
    ck_assert(c.heads == 8 && c.kv_heads == 4 && c.head_dim == 256 && c.eps == 1e-6);
    ck_assert(c.rope_theta == 1e6 && c.rope_local_theta == 1e4 && c.query_pre_attn_scalar == 256);
    ck_assert(c.sliding_window == 4096 && c.sliding_window_pattern == 6 && c.pad_token_id == 0);
    ck_assert(c.tied && c.init_range == 0.02);
    ck_assert_int_eq(sbp_layer_window(&c, 4), 4096);
    ck_assert_int_eq(sbp_layer_window(&c, 5), 0); /* every sixth layer is global */
}
END_TEST

/* The multimodal wrapper (Gemma3ForConditionalGeneration, 4B and up): the text model's config is
 * text_config, its gaps filled by Gemma3TextConfig's defaults. */
START_TEST(config_wrapper) {
    static const char *json =
        "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": \"gemma3\","
        " \"boi_token_index\": 255999, \"text_config\": {\"hidden_size\": 2560,"
        " \"intermediate_size\": 10240, \"model_type\": \"gemma3_text\","
        " \"num_hidden_layers\": 34, \"rope_scaling\": {\"factor\": 8.0, \"rope_type\": "
        "\"linear\"}, \"sliding_window\": 1024}, \"vision_config\": {\"hidden_size\": 1152,"
        " \"model_type\": \"siglip_vision_model\"}}";
    sbp_config c;
    sbp_err err;
    ck_assert_msg(!parse(&c, json, &err), "%s", err.msg);
    ck_assert(c.family == SBP_GEMMA3 && c.wrapped);
    ck_assert_str_eq(c.model_type, "gemma3_text");
    ck_assert(c.hidden == 2560 && c.ffn == 10240 && c.layers == 34 && c.sliding_window == 1024);
    ck_assert(c.heads == 8 && c.kv_heads == 4 && c.head_dim == 256 && c.vocab == 262208);
    ck_assert(c.rope_linear && c.rope_factor == 8.0 && !c.rope_llama3 && c.tied);
    ck_assert(sbp_config_param_count(&c) > 3800000000LL); /* about 3.88e9 without the vision */
    /* an absent text_config is Gemma3TextConfig() */
    ck_assert(!parse(&c, "{\"model_type\": \"gemma3\"}", &err) && c.hidden == 2304 && c.wrapped);
    refused("{\"model_type\": \"gemma3\", \"text_config\": 3}", "text_config");
}
END_TEST

START_TEST(config_refused) {
    refused("{\"model_type\": \"gemma3_text\", \"hidden_activation\": \"gelu\"}",
            "hidden_activation");
    refused("{\"model_type\": \"gemma3_text\", \"attn_logit_softcapping\": 50.0}",
            "attn_logit_softcapping");
    refused("{\"model_type\": \"gemma3_text\", \"final_logit_softcapping\": 30.0}",
            "final_logit_softcapping");
    refused("{\"model_type\": \"gemma3_text\", \"sliding_window\": null}", "sliding_window");
    refused("{\"model_type\": \"gemma3_text\", \"sliding_window\": 0}", "sliding_window");
    refused("{\"model_type\": \"gemma3_text\", \"sliding_window_pattern\": 0}",
            "sliding_window_pattern");
    refused("{\"model_type\": \"gemma3_text\", \"query_pre_attn_scalar\": 0}",
            "query_pre_attn_scalar");
    refused("{\"model_type\": \"gemma3_text\", \"attention_bias\": true}", "attention_bias");
    refused("{\"model_type\": \"gemma3_text\", \"rope_scaling\": {\"rope_type\": \"yarn\", "
            "\"factor\": 2}}",
            "yarn");
    refused("{\"model_type\": \"gemma3_text\", \"rope_scaling\": {\"rope_type\": \"linear\"}}",
            "factor");
    refused("{\"model_type\": \"gemma3_text\", \"pad_token_id\": 262208}", "pad_token_id");
    /* linear scaling is Gemma's; the other families keep default and llama3 */
    refused("{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 8, "
            "\"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
            "\"rms_norm_eps\": 1e-5, \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2}}",
            "linear");
    /* a Gemma config's hidden_act is never read by HF */
    sbp_config c;
    sbp_err err;
    ck_assert_msg(!parse(&c, "{\"model_type\": \"gemma3_text\", \"hidden_act\": \"gelu\"}", &err),
                  "%s", err.msg);
}
END_TEST

/* layer_types and use_bidirectional_attention (tests/gemma3_layer_types.json; what HF makes of the
 * same configs: python/tests/test_gemma3_config_hf.py): accepted where layer_types is the
 * pattern's layout, with those layers local; refused, named, where HF would compute another
 * model than the pattern's, which ref/ and the torch cross-check read. */
START_TEST(config_layer_types) {
    size_t n;
    char *text = tu_slurp("tests/gemma3_layer_types.json", &n);
    cJSON *doc = cJSON_ParseWithLength(text, n);
    free(text);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(doc, "cases"), *k;
    ck_assert_msg(cJSON_GetArraySize(cases) >= 7, "tests/gemma3_layer_types.json: no cases");
    cJSON_ArrayForEach(k, cases) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(k, "name"));
        char *json = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(k, "config"));
        const cJSON *local = cJSON_GetObjectItemCaseSensitive(k, "local");
        const char *why = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(k, "refused"));
        sbp_config c;
        sbp_err err;
        sbp_status st = parse(&c, json, &err);
        if (why) {
            ck_assert_msg(st == SBP_EINPUT, "%s: accepted", name);
            ck_assert_msg(strstr(err.msg, why), "%s: the message does not say \"%s\": %s", name,
                          why, err.msg);
        } else {
            ck_assert_msg(!st, "%s: %s", name, err.msg);
            ck_assert_int_eq(cJSON_GetArraySize(local), c.layers);
            for (int l = 0; l < c.layers; l++)
                ck_assert_msg((sbp_layer_window(&c, l) > 0) ==
                                  (int)cJSON_GetNumberValue(cJSON_GetArrayItem(local, l)),
                              "%s: layer %d", name, l);
        }
        cJSON_free(json);
    }
    cJSON_Delete(doc);
    /* the other families' layers are all full attention */
    static const char *llama =
        "{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 8, "
        "\"intermediate_size\": 8, \"num_hidden_layers\": 2, "
        "\"num_attention_heads\": 2, \"rms_norm_eps\": 1e-5, \"layer_types\": ";
    char buf[512];
    snprintf(buf, sizeof buf, "%s[\"full_attention\", \"full_attention\"]}", llama);
    sbp_config c;
    sbp_err err;
    ck_assert_msg(!parse(&c, buf, &err), "%s", err.msg);
    snprintf(buf, sizeof buf, "%s[\"full_attention\", \"sliding_attention\"]}", llama);
    refused(buf, "layer_types[1] is not \"full_attention\"");
    refused("{\"model_type\": \"gemma3_text\", \"num_hidden_layers\": 2, \"layer_types\": "
            "[\"sliding_attention\"]}",
            "layer_types must be a list of 2");
    refused("{\"model_type\": \"gemma3_text\", \"num_hidden_layers\": 2, \"layer_types\": "
            "[\"sliding_attention\", \"chunked_attention\"]}",
            "layer_types[1] is not");
    refused("{\"model_type\": \"gemma3_text\", \"use_bidirectional_attention\": \"yes\"}",
            "use_bidirectional_attention");
}
END_TEST

/* pad_token_id in every family: absent is the family's default (HF: Gemma3TextConfig 0, the
 * others None), null is none (-1), a token id is kept, anything else is refused by name. */
START_TEST(config_pad) {
#define LLAMA                                                                                      \
    "{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 8, "                         \
    "\"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "             \
    "\"rms_norm_eps\": 1e-5"
    sbp_config c;
    sbp_err err;
    ck_assert(!parse(&c, LLAMA "}", &err) && c.pad_token_id == -1);
    ck_assert(!parse(&c, LLAMA ", \"pad_token_id\": null}", &err) && c.pad_token_id == -1);
    ck_assert(!parse(&c, LLAMA ", \"pad_token_id\": 9}", &err) && c.pad_token_id == 9);
    refused(LLAMA ", \"pad_token_id\": 10}", "pad_token_id");
    refused(LLAMA ", \"pad_token_id\": -1}", "pad_token_id");
    refused(LLAMA ", \"pad_token_id\": 1.5}", "pad_token_id");
    refused(LLAMA ", \"pad_token_id\": \"0\"}", "pad_token_id");
    ck_assert(!parse(&c, "{\"model_type\": \"gemma3_text\", \"pad_token_id\": null}", &err) &&
              c.pad_token_id == -1);
#undef LLAMA
}
END_TEST

/* sbp_config_save writes a gemma3_text config that reads back the same (and that transformers
 * reads: the key names of Gemma3TextConfig). */
START_TEST(config_save) {
    sbp_config a, b;
    sbp_err err = {0};
    ck_assert(!sbp_config_load(&a, "data/models/gemma3-tiny.json", &err));
    a.rope_linear = 1, a.rope_factor = 8, a.pad_token_id = -1, a.wrapped = 1;
    const char *path = tu_path("gemma3-config.json");
    ck_assert_msg(!sbp_config_save(&a, path, &err), "%s", err.msg);
    ck_assert_msg(!sbp_config_load(&b, path, &err), "%s", err.msg);
    char *text = tu_slurp(path, NULL);
    ck_assert(strstr(text, "\"gemma3_text\"") && strstr(text, "\"Gemma3ForCausalLM\"") &&
              strstr(text, "\"gelu_pytorch_tanh\"") && strstr(text, "\"linear\"") &&
              !strstr(text, "hidden_act\""));
    free(text);
    a.wrapped = 0; /* what is written is the text model */
    ck_assert(b.family == a.family && !strcmp(b.model_type, a.model_type));
    ck_assert(b.vocab == a.vocab && b.hidden == a.hidden && b.ffn == a.ffn &&
              b.layers == a.layers && b.heads == a.heads && b.kv_heads == a.kv_heads &&
              b.head_dim == a.head_dim && b.eps == a.eps && b.tied == a.tied);
    ck_assert(b.rope_theta == a.rope_theta && b.rope_linear && b.rope_factor == 8 &&
              b.rope_local_theta == a.rope_local_theta);
    ck_assert(b.sliding_window == a.sliding_window &&
              b.sliding_window_pattern == a.sliding_window_pattern &&
              b.query_pre_attn_scalar == a.query_pre_attn_scalar && b.pad_token_id == -1 &&
              !b.wrapped && b.qk_norm);
}
END_TEST

/* HF's state_dict of Gemma3ForCausalLM, in order; the counts agree. */
START_TEST(params_table) {
    sbp_config c;
    sbp_params ps;
    sbp_err err = {0};
    ck_assert(!sbp_config_load(&c, "data/models/gemma3-tiny.json", &err));
    ck_assert_msg(!sbp_params_build(&ps, &c, &err), "%s", err.msg);
    static const char *const layer[] = {"self_attn.q_proj.weight",
                                        "self_attn.k_proj.weight",
                                        "self_attn.v_proj.weight",
                                        "self_attn.o_proj.weight",
                                        "self_attn.q_norm.weight",
                                        "self_attn.k_norm.weight",
                                        "mlp.gate_proj.weight",
                                        "mlp.up_proj.weight",
                                        "mlp.down_proj.weight",
                                        "input_layernorm.weight",
                                        "post_attention_layernorm.weight",
                                        "pre_feedforward_layernorm.weight",
                                        "post_feedforward_layernorm.weight"};
    const int nl = (int)(sizeof layer / sizeof layer[0]);
    ck_assert_int_eq(ps.n, 2 + c.layers * nl); /* embedding, layers, final norm; tied head */
    ck_assert_str_eq(ps.p[0].name, "model.embed_tokens.weight");
    for (int l = 0; l < c.layers; l++)
        for (int i = 0; i < nl; i++) {
            char want[96];
            snprintf(want, sizeof want, "model.layers.%d.%s", l, layer[i]);
            ck_assert_str_eq(ps.p[1 + l * nl + i].name, want);
        }
    ck_assert_str_eq(ps.p[ps.n - 1].name, "model.norm.weight");
    const sbp_param *qn = &ps.p[sbp_params_find(&ps, "model.layers.0.self_attn.q_norm.weight")];
    ck_assert(qn->ndim == 1 && qn->shape[0] == 24);
    const sbp_param *pf =
        &ps.p[sbp_params_find(&ps, "model.layers.3.post_feedforward_layernorm.weight")];
    ck_assert(pf->kind == SBP_P_POST_FF_NORM && pf->layer == 3 && pf->shape[0] == 64);
    ck_assert(sbp_params_offset(&ps, SBP_P_PRE_FF_NORM, 1) >= 0);
    ck_assert_int_eq(sbp_config_param_count(&c), ps.total);
    /* the other families have no feed-forward norms */
    sbp_config q;
    sbp_params qs;
    ck_assert(!sbp_config_load(&q, "data/models/qwen3-tiny.json", &err));
    ck_assert(!sbp_params_build(&qs, &q, &err));
    ck_assert(sbp_params_offset(&qs, SBP_P_PRE_FF_NORM, 0) < 0);
    ck_assert_int_eq(sbp_config_param_count(&q), qs.total);
    sbp_params_free(&qs);
    sbp_params_free(&ps);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * The engine's Gemma-3 against a naive float64 forward written from HF's modeling_gemma3.py
 * (libm's tanh, sin, cos, exp: nothing shared with the engine), against finite differences of
 * itself, and full = ckpt = stream bit for bit. */

/* A batch of B rows of T tokens in memory: row 0 all real, row 1 right-padded by `pad` tokens
 * (id 0, HF's pad, mask 0, label -100); the pad token also sits at real positions of row 0
 * (pad = eos, as many tokenizers have it), so padding_idx matters. */
static void make_batch(sbp_batch *b, int T, int pad, int V) {
    memset(b, 0, sizeof *b);
    b->B = 2, b->T = T;
    const size_t n = (size_t)2 * T;
    b->ids = calloc(n, sizeof *b->ids);
    b->labels = calloc(n, sizeof *b->labels);
    b->mask = calloc(n, 1);
    ck_assert(b->ids && b->labels && b->mask);
    uint64_t z = 12345;
    for (size_t i = 0; i < n; i++) {
        z = z * 6364136223846793005ULL + 1442695040888963407ULL;
        const int row = (int)(i / (size_t)T), t = (int)(i % (size_t)T);
        const int real = row == 0 || t < T - pad;
        b->ids[i] = real ? (int32_t)(1 + (z >> 33) % (uint64_t)(V - 1)) : 0;
        if (row == 0 && (t == 3 || t == T - 2)) b->ids[i] = 0; /* the pad token, real */
        b->mask[i] = (uint8_t)real;
        b->labels[i] = real && t >= 2 ? b->ids[i] : SBP_IGNORE;
    }
    sbp_batch_count_targets(b);
}

/* the weights of one tensor in a float64 model */
static const double *W(const sbp_model *m, sbp_param_kind k, int l) {
    int64_t off = sbp_params_offset(&m->params, k, l);
    ck_assert(off >= 0);
    return (const double *)m->w + off;
}

/* y (n) = x̂·(1 + w), Gemma3RMSNorm */
static void norm1p(double *y, const double *x, const double *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double r = 1 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * (1 + w[i]);
}

/* y (T, N) = x (T, K) · Wᵀ */
static void matmul(double *y, const double *x, const double *w, int T, int N, int K) {
    for (int t = 0; t < T; t++)
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += x[(size_t)t * K + k] * w[(size_t)j * K + k];
            y[(size_t)t * N + j] = acc;
        }
}

/* rotate-half RoPE of one head vector at position t */
static void rope1(double *x, int HD, int t, double theta, double linear) {
    for (int i = 0; i < HD / 2; i++) {
        const double f = pow(theta, -2.0 * i / HD) / linear, a = x[i], b = x[i + HD / 2];
        x[i] = a * cos(t * f) - b * sin(t * f);
        x[i + HD / 2] = b * cos(t * f) + a * sin(t * f);
    }
}

/* Gemma3ForCausalLM's SFT loss (mean over targets) of one row; `window`: apply the sliding
 * window (query i sees key j iff i − W < j <= i) in the local layers, else every layer global.
 * Adds the row's summed −logp to *sum and its targets to *n. */
static void naive_row(double *sum, int *n, const sbp_model *m, const sbp_batch *b, int row,
                      int window) {
    const sbp_config *c = &m->cfg;
    const int T = b->T, C = c->hidden, F = c->ffn, NH = c->heads, NKV = c->kv_heads;
    const int HD = c->head_dim, Q = NH * HD, KV = NKV * HD, V = c->vocab;
    const int32_t *ids = b->ids + (size_t)row * T, *lab = b->labels + (size_t)row * T;
    const uint8_t *mask = b->mask + (size_t)row * T;
    double *x = calloc((size_t)T * C, 8), *xn = calloc((size_t)T * C, 8);
    double *q = calloc((size_t)T * Q, 8), *k = calloc((size_t)T * KV, 8);
    double *v = calloc((size_t)T * KV, 8), *o = calloc((size_t)T * Q, 8);
    double *a = calloc((size_t)T * C, 8), *g = calloc((size_t)T * F, 8);
    double *u = calloc((size_t)T * F, 8), *p = calloc((size_t)T, 8);
    double *logits = calloc((size_t)V, 8);
    const double *E = W(m, SBP_P_EMBED, -1);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < C; i++) x[(size_t)t * C + i] = E[(size_t)ids[t] * C + i] * sqrt(C);
    for (int l = 0; l < c->layers; l++) {
        const int local = (l + 1) % c->sliding_window_pattern != 0;
        const double theta = local ? c->rope_local_theta : c->rope_theta;
        const double lin = !local && c->rope_linear ? c->rope_factor : 1;
        for (int t = 0; t < T; t++)
            norm1p(xn + (size_t)t * C, x + (size_t)t * C, W(m, SBP_P_IN_NORM, l), C, c->eps);
        matmul(q, xn, W(m, SBP_P_Q, l), T, Q, C);
        matmul(k, xn, W(m, SBP_P_K, l), T, KV, C);
        matmul(v, xn, W(m, SBP_P_V, l), T, KV, C);
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                double *qh = q + (size_t)t * Q + h * HD;
                norm1p(qh, qh, W(m, SBP_P_QNORM, l), HD, c->eps);
                rope1(qh, HD, t, theta, lin);
            }
            for (int h = 0; h < NKV; h++) {
                double *kh = k + (size_t)t * KV + h * HD;
                norm1p(kh, kh, W(m, SBP_P_KNORM, l), HD, c->eps);
                rope1(kh, HD, t, theta, lin);
            }
        }
        const double scale = pow(c->query_pre_attn_scalar, -0.5);
        for (int i = 0; i < T; i++)
            for (int h = 0; h < NH; h++) {
                const int kh = h / (NH / NKV);
                double mx = -INFINITY, den = 0;
                for (int j = 0; j <= i; j++) {
                    p[j] = -INFINITY;
                    if (!mask[j] || (window && local && i - j >= c->sliding_window)) continue;
                    double s = 0;
                    for (int d = 0; d < HD; d++)
                        s += q[(size_t)i * Q + h * HD + d] * k[(size_t)j * KV + kh * HD + d];
                    p[j] = s * scale, mx = fmax(mx, p[j]);
                }
                for (int j = 0; j <= i; j++) den += p[j] == -INFINITY ? 0 : exp(p[j] - mx);
                for (int d = 0; d < HD; d++) {
                    double acc = 0;
                    for (int j = 0; j <= i; j++)
                        if (p[j] != -INFINITY)
                            acc += exp(p[j] - mx) / den * v[(size_t)j * KV + kh * HD + d];
                    o[(size_t)i * Q + h * HD + d] = acc;
                }
            }
        matmul(a, o, W(m, SBP_P_O, l), T, C, Q);
        for (int t = 0; t < T; t++) { /* x2 = x + post_attention_layernorm(o·Woᵀ) */
            norm1p(a + (size_t)t * C, a + (size_t)t * C, W(m, SBP_P_POST_NORM, l), C, c->eps);
            for (int i = 0; i < C; i++) x[(size_t)t * C + i] += a[(size_t)t * C + i];
            norm1p(xn + (size_t)t * C, x + (size_t)t * C, W(m, SBP_P_PRE_FF_NORM, l), C, c->eps);
        }
        matmul(g, xn, W(m, SBP_P_GATE, l), T, F, C);
        matmul(u, xn, W(m, SBP_P_UP, l), T, F, C);
        for (size_t i = 0; i < (size_t)T * F; i++) {
            const double z = g[i];
            g[i] = 0.5 * z * (1 + tanh(sqrt(2 / M_PI) * (z + 0.044715 * z * z * z))) * u[i];
        }
        matmul(a, g, W(m, SBP_P_DOWN, l), T, C, F);
        for (int t = 0; t < T; t++) {
            norm1p(a + (size_t)t * C, a + (size_t)t * C, W(m, SBP_P_POST_FF_NORM, l), C, c->eps);
            for (int i = 0; i < C; i++) x[(size_t)t * C + i] += a[(size_t)t * C + i];
        }
    }
    for (int t = 0; t + 1 < T; t++) {
        if (lab[t + 1] == SBP_IGNORE) continue;
        norm1p(xn, x + (size_t)t * C, W(m, SBP_P_FINAL_NORM, -1), C, c->eps);
        matmul(logits, xn, E, 1, V, C); /* tied head */
        double mx = -INFINITY, den = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, logits[j]);
        for (int j = 0; j < V; j++) den += exp(logits[j] - mx);
        *sum -= logits[lab[t + 1]] - mx - log(den);
        (*n)++;
    }
    free(x), free(xn), free(q), free(k), free(v), free(o), free(a), free(g), free(u), free(p);
    free(logits);
}

static double naive_loss(const sbp_model *m, const sbp_batch *b, int window) {
    double sum = 0;
    int n = 0;
    for (int r = 0; r < b->B; r++) naive_row(&sum, &n, m, b, r, window);
    return sum / n;
}

static double engine_loss(const sbp_model *m, const sbp_batch *b, sbp_numerics nu) {
    sbp_grad_result r;
    tu_grad_n(&r, m, b, nu, SBP_FULL, 4, 0, 0, 0);
    const double loss = r.loss;
    sbp_grad_result_free(&r, NULL);
    return loss;
}

/* The loss of the engine's Gemma-3 is HF's (the naive forward's) in float64, with T = 8 within
 * the window (every layer sees every key: right whatever the attention's window does). */
START_TEST(oracle_loss) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, NULL, tu_model("gemma3-tiny", 5), NULL, SBP_FP64);
    make_batch(&b, 8, 2, m.cfg.vocab);
    const double want = naive_loss(&m, &b, 1);
    for (int nu = 0; nu < 2; nu++) {
        const double got = engine_loss(&m, &b, nu ? SBP_NUMERICS_PORTABLE : SBP_NUMERICS_FAST);
        printf("gemma3 oracle T=8 %s: engine %.15g naive %.15g\n", nu ? "portable" : "fast", got,
               want);
        ck_assert_msg(fabs(got - want) <= 1e-12 * fabs(want), "engine %.17g, naive %.17g", got,
                      want);
    }
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* The same past the window (T = 24, W = 8): the local layers' window (D2's attention). */
START_TEST(oracle_loss_window) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, NULL, tu_model("gemma3-tiny", 5), NULL, SBP_FP64);
    make_batch(&b, 24, 5, m.cfg.vocab);
    const double want = naive_loss(&m, &b, 1), global = naive_loss(&m, &b, 0);
    ck_assert_msg(fabs(want - global) > 1e-6, "the window does not matter here: %.17g", want);
    const double got = engine_loss(&m, &b, SBP_NUMERICS_PORTABLE);
    printf("gemma3 oracle T=24: engine %.15g naive %.15g (all global %.15g)\n", got, want, global);
    ck_assert_msg(fabs(got - want) <= 1e-12 * fabs(want), "engine %.17g, naive %.17g", got, want);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

typedef struct {
    sbp_model *m;
    const sbp_batch *b;
} fd_ctx;

static double fd_loss(const double *w, void *ctx) {
    fd_ctx *c = ctx;
    void *w0 = c->m->w;
    c->m->w = (void *)w;
    const double l = engine_loss(c->m, c->b, SBP_NUMERICS_PORTABLE);
    c->m->w = w0;
    return l;
}

/* Every tensor's gradient against central differences of the engine's own float64 loss, T = 24
 * (both layer kinds, a right-padded row). Without padding_idx: with it, HF's pad row is by
 * design not the derivative of the loss (pad_row tests it). */
START_TEST(fd_gradients) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, NULL, tu_model("gemma3-tiny", 5), NULL, SBP_FP64);
    m.cfg.pad_token_id = -1;
    make_batch(&b, 24, 5, m.cfg.vocab);
    sbp_grad_result r;
    tu_grad_n(&r, &m, &b, SBP_NUMERICS_PORTABLE, SBP_STREAM, 4, 8, 8, 0);
    fd_ctx c = {&m, &b};
    tu_fd_check(&m.params, m.w, r.grads, fd_loss, &c, 1e-5, 2e-9, 1e-7, 2, 11, "gemma3-tiny");
    sbp_grad_result_free(&r, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* HF's padding_idx: the pad row of the embedding gets no gradient from lookups, only from the
 * tied head; without pad_token_id the lookups add to it. */
START_TEST(pad_row) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, NULL, tu_model("gemma3-tiny", 5), NULL, SBP_FP64);
    make_batch(&b, 24, 5, m.cfg.vocab);
    sbp_grad_result with, without;
    tu_grad_n(&with, &m, &b, SBP_NUMERICS_PORTABLE, SBP_STREAM, 4, 8, 8, 0);
    m.cfg.pad_token_id = -1;
    tu_grad_n(&without, &m, &b, SBP_NUMERICS_PORTABLE, SBP_STREAM, 4, 8, 8, 0);
    const double *g1 = with.grads, *g0 = without.grads;
    const int C = m.cfg.hidden;
    int differ0 = 0, differ_other = 0;
    for (int64_t i = 0; i < m.params.total; i++) {
        if (g1[i] == g0[i]) continue;
        if (i < C) /* row 0 of the embedding, the first tensor */
            differ0++;
        else
            differ_other++;
    }
    ck_assert_msg(differ0 > 0 && differ_other == 0,
                  "pad row: %d elements differ, elsewhere %d (want > 0 and 0)", differ0,
                  differ_other);
    /* the pad row's gradient is the head's alone: the gradient at pad 1 (a token that occurs
     * nowhere) is the same as without padding_idx */
    sbp_grad_result_free(&with, NULL);
    sbp_grad_result_free(&without, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

static void assert_same(const sbp_model *m, const sbp_grad_result *a, const sbp_grad_result *b,
                        const char *what) {
    const int i = tu_first_diff(m, a->grads, b->grads);
    ck_assert_msg(i < 0, "%s: the gradient of %s differs from the reference's", what,
                  i < 0 ? "" : m->params.p[i].name);
    ck_assert_msg(memcmp(&a->loss, &b->loss, sizeof a->loss) == 0, "%s: the loss differs", what);
}

/* full, ckpt and stream bit for bit: both numerics, both precisions, chunks below, at and above
 * the window (8) and the token block (4), with LoRA adapters absent. */
START_TEST(schedules_bitwise) {
    const sbp_precision prec = _i & 1 ? SBP_FP64 : SBP_FP32;
    const sbp_numerics nu = _i & 2 ? SBP_NUMERICS_PORTABLE : SBP_NUMERICS_FAST;
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model("gemma3-tiny", 7), "data/batches/sft-tiny.safetensors", prec);
    sbp_grad_result ref, r;
    tu_grad_n(&ref, &m, &b, nu, SBP_FULL, 4, 0, 0, 0);
    char what[128];
    tu_grad_n(&r, &m, &b, nu, SBP_CKPT, 4, 0, 0, 0);
    snprintf(what, sizeof what, "%s %s ckpt", sbp_numerics_name(nu), prec ? "fp64" : "fp32");
    assert_same(&m, &ref, &r, what);
    sbp_grad_result_free(&r, NULL);
    static const int chunks[] = {4, 8, 12, 16, 24};
    for (int i = 0; i < 5; i++) {
        tu_grad_n(&r, &m, &b, nu, SBP_STREAM, 4, chunks[i], 4, 0);
        snprintf(what, sizeof what, "%s %s stream chunk %d", sbp_numerics_name(nu),
                 prec ? "fp64" : "fp32", chunks[i]);
        assert_same(&m, &ref, &r, what);
        sbp_grad_result_free(&r, NULL);
    }
    sbp_grad_result_free(&ref, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* The CUDA op tables in the SIMT emulator give the portable CPU's bits (GeGLU, the (1 + w)
 * norms, the scaled embedding, the pad rows, the local RoPE tables), fp32 and fp64; T = 8 within
 * the window (the CUDA attention's window is tested with the attention). */
START_TEST(cuda_emu_bitwise) {
    const sbp_precision prec = _i ? SBP_FP64 : SBP_FP32;
    sbp_model m;
    sbp_batch b;
    tu_load(&m, NULL, tu_model("gemma3-tiny", 7), NULL, prec);
    make_batch(&b, 8, 2, m.cfg.vocab);
    sbp_grad_result cpu, emu;
    sbp_grad_opts o = {.schedule = SBP_STREAM,
                       .block = 4,
                       .chunk = 8,
                       .logit_chunk = 4,
                       .numerics = SBP_NUMERICS_PORTABLE};
    sbp_err err = {0};
    ck_assert_msg(!sbp_grad(&cpu, &m, &b, &o, NULL, &err), "%s", err.msg);
    o.device = SBP_DEVICE_CUDA_EMU;
    ck_assert_msg(!sbp_grad(&emu, &m, &b, &o, NULL, &err), "%s", err.msg);
    assert_same(&m, &cpu, &emu, prec ? "cuda-emu fp64" : "cuda-emu fp32");
    sbp_grad_result_free(&cpu, NULL);
    sbp_grad_result_free(&emu, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* The planner walks the same code with a planning ledger: its peak is the measured one to the
 * byte for Gemma-3's extra buffers too (the 1 + w weights, the local RoPE tables, the kept
 * post-norm inputs and their gradients), every schedule. */
START_TEST(plan_equals_measured) {
    const sbp_schedule sched = (sbp_schedule)_i;
    sbp_ledger real = {0}, plan;
    sbp_model m;
    sbp_batch b;
    sbp_err err = {0};
    ck_assert_msg(!sbp_model_load(&m, tu_model("gemma3-tiny", 1), SBP_FP32, &real, &err), "%s",
                  err.msg);
    ck_assert_msg(!sbp_batch_load(&b, "data/batches/sft-tiny.safetensors", &m.cfg, &err), "%s",
                  err.msg);
    sbp_grad_opts o = {.schedule = sched, .block = 4, .chunk = 8, .logit_chunk = 4};
    sbp_grad_result r;
    ck_assert_msg(!sbp_grad(&r, &m, &b, &o, &real, &err), "%s", err.msg);
    sbp_plan_opts po = {.grad = o, .B = b.B, .T = b.T, .storage_bytes = 4};
    ck_assert_msg(!sbp_plan(&plan, &m.cfg, &po, &err), "plan: %s", err.msg);
    ck_assert_msg(plan.peak_total == real.peak_total, "%s: planned peak %lld, measured %lld",
                  sbp_schedule_name(sched), (long long)plan.peak_total, (long long)real.peak_total);
    ck_assert_int_eq(plan.n_allocs, real.n_allocs);
    sbp_grad_result_free(&r, &real);
    sbp_batch_free(&b);
    sbp_model_free(&m, &real);
}
END_TEST

/* A multimodal gemma3 directory (Gemma3ForConditionalGeneration, as the 4B and larger
 * checkpoints ship): config under text_config, the text model's tensors named
 * "language_model." + its own names, a vision tower and a projector beside them. It loads as the
 * text model: the same weights as the plain gemma3_text directory, the same gradient. */
START_TEST(wrapped_directory) {
    const char *plain = tu_model("gemma3-tiny", 9), *dir = tu_new_dir("gemma3-wrapped");
    char *text = tu_slurp(tu_join(plain, "config.json"), NULL);
    char cfg[8192];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": "
             "\"gemma3\", \"mm_tokens_per_image\": 256, \"text_config\": %s, \"vision_config\": "
             "{\"model_type\": \"siglip_vision_model\", \"hidden_size\": 16}}",
             text);
    free(text);
    tu_spit(tu_join(dir, "config.json"), cfg, strlen(cfg));
    tu_tensors ts;
    tu_tensors_load(&ts, tu_join(plain, "model.safetensors"));
    for (int i = 0; i < ts.n; i++) {
        char name[96];
        snprintf(name, sizeof name, "language_model.%s", ts.names[i]);
        snprintf(ts.names[i], sizeof ts.names[i], "%s", name);
    }
    static const float extra[4] = {1, 2, 3, 4};
    ck_assert_int_lt(ts.n + 2, TU_MAX_TENSORS);
    ts.e[ts.n] = (sbp_st_entry){.name = "vision_tower.vision_model.post_layernorm.weight",
                                .dtype = SBP_DT_F32,
                                .ndim = 1,
                                .shape = {4},
                                .data = extra};
    ts.e[ts.n + 1] = (sbp_st_entry){.name = "multi_modal_projector.mm_soft_emb_norm.weight",
                                    .dtype = SBP_DT_F32,
                                    .ndim = 1,
                                    .shape = {4},
                                    .data = extra};
    sbp_err err = {0};
    ck_assert_msg(!sbp_st_write(tu_join(dir, "model.safetensors"), ts.e, ts.n + 2, NULL, &err),
                  "%s", err.msg);
    tu_tensors_free(&ts);
    sbp_model a, b;
    sbp_batch batch;
    tu_load(&a, &batch, plain, "data/batches/sft-tiny.safetensors", SBP_FP32);
    ck_assert_msg(!sbp_model_load(&b, dir, SBP_FP32, NULL, &err), "%s", err.msg);
    ck_assert(b.cfg.wrapped && !a.cfg.wrapped && b.cfg.family == SBP_GEMMA3);
    ck_assert_int_eq(a.params.total, b.params.total);
    ck_assert(memcmp(a.w, b.w, sizeof(float) * (size_t)a.params.total) == 0);
    sbp_grad_result ra, rb;
    tu_grad_n(&ra, &a, &batch, SBP_NUMERICS_PORTABLE, SBP_STREAM, 4, 8, 4, 0);
    tu_grad_n(&rb, &b, &batch, SBP_NUMERICS_PORTABLE, SBP_STREAM, 4, 8, 4, 0);
    assert_same(&a, &ra, &rb, "wrapped directory");
    sbp_grad_result_free(&ra, NULL);
    sbp_grad_result_free(&rb, NULL);
    /* a wrapper without the text model's tensors is refused by name */
    tu_tensors_load(&ts, tu_join(plain, "model.safetensors"));
    ck_assert(!sbp_st_write(tu_join(dir, "model.safetensors"), ts.e, ts.n, NULL, &err));
    tu_tensors_free(&ts);
    sbp_model c;
    ck_assert_int_eq(sbp_model_load(&c, dir, SBP_FP32, NULL, &err), SBP_EINPUT);
    ck_assert_msg(strstr(err.msg, "language_model.model.embed_tokens.weight"), "%s", err.msg);
    sbp_batch_free(&batch);
    sbp_model_free(&a, NULL);
    sbp_model_free(&b, NULL);
}
END_TEST

/* The FLOPs of a step as the engine runs it: Gemma-3's recompute (ckpt, stream) runs the down
 * projection too (its post-feedforward norm needs the MLP output), 2·F·C per token and layer more
 * than a Llama layer of the same sizes; full BP's are the same. */
START_TEST(flops_recompute) {
    sbp_config g;
    sbp_err err = {0};
    ck_assert(!sbp_config_load(&g, "data/models/gemma3-tiny.json", &err));
    g.sliding_window_pattern = 1; /* every layer global: the same attention as Llama's */
    sbp_config l = g;
    l.family = SBP_LLAMA;
    const int T = 64, B = 2;
    for (int s = 0; s < 3; s++) {
        sbp_grad_opts o = {.schedule = (sbp_schedule)s, .block = 16};
        const double d = sbp_step_flops(&g, B, T, &o) - sbp_step_flops(&l, B, T, &o);
        const double want = s == SBP_FULL ? 0 : 2.0 * g.ffn * g.hidden * T * B * g.layers;
        ck_assert_msg(d == want, "%s: gemma3 - llama = %g, want %g", sbp_schedule_name(o.schedule),
                      d, want);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("gemma3");
    TCase *tc = tcase_create("config");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, config_tiny);
    tcase_add_test(tc, config_defaults);
    tcase_add_test(tc, config_wrapper);
    tcase_add_test(tc, config_refused);
    tcase_add_test(tc, config_layer_types);
    tcase_add_test(tc, config_pad);
    tcase_add_test(tc, config_save);
    tcase_add_test(tc, params_table);
    tcase_add_test(tc, flops_recompute);
    suite_add_tcase(s, tc);
    tc = tcase_create("engine");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, oracle_loss);
    tcase_add_test(tc, oracle_loss_window);
    tcase_add_test(tc, fd_gradients);
    tcase_add_test(tc, pad_row);
    tcase_add_loop_test(tc, schedules_bitwise, 0, 4);
    tcase_add_loop_test(tc, cuda_emu_bitwise, 0, 2);
    tcase_add_loop_test(tc, plan_equals_measured, 0, 3);
    tcase_add_test(tc, wrapped_directory);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
