/* test_gemma3.c — the Gemma-3 model plumbing (issue 34): config.json as HF 4.51.3's
 * Gemma3TextConfig reads it (defaults included, and the multimodal "gemma3" wrapper), the
 * parameter table, pad_token_id for every family, and the engine's Gemma-3 layer: finite
 * differences in float64 and full = ckpt = stream bit for bit. */
#include "testutil.h"

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

static Suite *suite(void) {
    Suite *s = suite_create("gemma3");
    TCase *tc = tcase_create("config");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, config_tiny);
    tcase_add_test(tc, config_defaults);
    tcase_add_test(tc, config_wrapper);
    tcase_add_test(tc, config_refused);
    tcase_add_test(tc, config_pad);
    tcase_add_test(tc, config_save);
    tcase_add_test(tc, params_table);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
