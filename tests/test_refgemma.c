/* test_refgemma.c — Gemma-3 in the float64 oracle (ref/, docs/gemma3.md), checked on its own:
 *  1. finite differences of ref's own loss on every tensor of data/models/gemma3-tiny.json (read
 *     by ref's reader, random weights including the (1 + w) norms, tied and untied heads) on a
 *     batch longer than the window with left, right and middle padding and pad-id tokens at real
 *     positions, for the unattended modes zero and hf-sdpa;
 *  2. the window boundary, exactly: in a one-layer sliding model the log-prob at t moves when
 *     token t − W + 1 changes and not when token t − W does; in a global layer it does;
 *  3. padding_idx: the pad row's gradient is 0 from lookups (untied), and with a tied head only
 *     the head's part; Llama with pad_token_id too;
 *  4. the reader: Gemma3TextConfig's defaults, the multimodal wrapper's text_config and
 *     language_model.* names, soft-capping refused by name;
 *  5. ref32 against ref on Gemma-3 (the float32 yardstick stays small).
 * The engine against this oracle is in test_ref's family loop once it runs Gemma-3. */
#include "testutil.h"
#include "../ref/ref.h"
#include "../src/core/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GEMMA_CFG "data/models/gemma3-tiny.json"

/* the same FD step and bounds as test_ref.c (measured there; re-measured here, see fd_gemma) */
#define FD_STEP 1e-5
#define FD_ATOL 2e-9
#define FD_RTOL 1e-7

/* ---------------------------------------------------------------------------------------------
 * Helpers */

typedef struct {
    sbp_config cfg;
    sbp_params ps;
    double *w; /* (ps.total) */
} model;

/* The oracle's model of a config file with random weights: matrices N(0, 0.1²), norm weights
 * N(0, 0.3²) (so 1 + w is not 1 and the (1 + w) form matters), the embedding N(0, 0.5²). */
static void model_make(model *m, const char *cfg_path, int tied, uint64_t seed) {
    sbp_err err = {0};
    ck_assert_msg(ref_config_read(&m->cfg, cfg_path, &err) == SBP_OK, "%s", err.msg);
    if (tied >= 0) m->cfg.tied = tied;
    ck_assert_msg(ref_params_build(&m->ps, &m->cfg, &err) == SBP_OK, "%s", err.msg);
    m->w = malloc(sizeof *m->w * (size_t)m->ps.total);
    ck_assert_ptr_nonnull(m->w);
    sbp_rng rng;
    sbp_rng_seed(&rng, seed);
    for (int i = 0; i < m->ps.n; i++) {
        const sbp_param *p = &m->ps.p[i];
        double sd = p->ndim == 1 ? 0.3 : p->kind == SBP_P_EMBED ? 0.5 : 0.1;
        /* a w-form norm (not Gemma-3) near 1, as a (1 + w) one */
        double mean = p->ndim == 1 && m->cfg.family != SBP_GEMMA3 ? 1 : 0;
        for (int64_t j = 0; j < p->numel; j++)
            m->w[p->offset + j] = mean + sd * sbp_rng_normal(&rng);
    }
}

static void model_free(model *m) {
    free(m->w);
    ref_params_free(&m->ps);
}

/* A batch of B rows of T tokens with the given masks (NULL: all real) and labels at every
 * position but the first of each row; ids pseudo-random in [0, V) with the pad id planted at
 * some real positions. */
static void batch_make(sbp_batch *b, int B, int T, int V, const uint8_t *mask, int pad_id) {
    memset(b, 0, sizeof *b);
    b->B = B, b->T = T;
    b->ids = malloc(sizeof *b->ids * (size_t)B * T);
    b->labels = malloc(sizeof *b->labels * (size_t)B * T);
    b->mask = malloc((size_t)B * T);
    ck_assert(b->ids && b->labels && b->mask);
    for (int r = 0; r < B; r++)
        for (int t = 0; t < T; t++) {
            int i = r * T + t;
            b->mask[i] = mask ? mask[i] : 1;
            b->ids[i] = (37 * i + 11) % V;
            if (pad_id >= 0 && t % 5 == 2) b->ids[i] = pad_id; /* the pad token as a real input */
            b->labels[i] = t == 0 ? SBP_IGNORE : (53 * i + 5) % V;
            if (t > 0) {
                b->n_targets++;
                b->n_pad_targets += b->mask[i - 1] == 0;
            }
        }
}

/* coef for the SFT loss: −1/N at every valid target. */
static double *sft_coef(const sbp_batch *b) {
    double *coef = calloc((size_t)b->B * b->T, sizeof *coef);
    ck_assert_ptr_nonnull(coef);
    for (int r = 0; r < b->B; r++)
        for (int t = 0; t + 1 < b->T; t++)
            if (b->labels[(size_t)r * b->T + t + 1] != SBP_IGNORE)
                coef[(size_t)r * b->T + t] = -1.0 / (double)b->n_targets;
    return coef;
}

typedef struct {
    const model *m;
    const sbp_batch *b;
    const double *coef;
    sbp_unattended mode;
} obj_ctx;

/* Σ coef·logp of the model at weights w, from ref_logprobs alone. */
static double objective_at(const double *w, void *ctx) {
    const obj_ctx *c = ctx;
    ref_net net = {.cfg = &c->m->cfg, .ps = &c->m->ps, .w = w, .unattended = c->mode};
    size_t n = (size_t)c->b->B * c->b->T;
    double *logp = malloc(sizeof *logp * n), f = 0;
    ck_assert_ptr_nonnull(logp);
    sbp_err err = {0};
    if (ref_logprobs(logp, &net, c->b, 1.0, &err)) ck_abort_msg("ref_logprobs: %s", err.msg);
    for (size_t i = 0; i < n; i++) f += c->coef[i] * logp[i];
    free(logp);
    return f;
}

/* ref_backward of Σ coef·logp (allocated). */
static double *ref_grad(const model *m, const sbp_batch *b, const double *coef,
                        sbp_unattended mode) {
    double *g = calloc((size_t)m->ps.total, sizeof *g);
    ck_assert_ptr_nonnull(g);
    ref_net net = {.cfg = &m->cfg, .ps = &m->ps, .w = m->w, .unattended = mode};
    sbp_err err = {0};
    ck_assert_msg(ref_backward(g, coef, &net, b, 1.0, &err) == SBP_OK, "%s", err.msg);
    return g;
}

/* ---------------------------------------------------------------------------------------------
 * 1. finite differences */

/* The padding of the FD batch (B = 3, T = 20, W = 8 on gemma3-tiny): row 0 left-padded by 3
 * (queries 0..2 see no key), row 1 right-padded by 4, row 2 with holes, one of them just inside
 * the window of later queries. T > 2W, so local layers drop keys and the global layer (2) not. */
#define FB 3
#define FT 20
static const uint8_t pad_mask[FB * FT] = {
    0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* left padding */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, /* right padding */
    1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, /* holes */
};

/* _i: 0 tied, 1 untied, 2 tied with linear RoPE scaling (factor 8) on the global layer; mode
 * zero (hf-eager's gradient, which Gemma-3's hf-sdpa also is, is autograd's, not the derivative
 * of its forward: test_ref checks that mode its own way) */
START_TEST(fd_gemma) {
    model m;
    model_make(&m, GEMMA_CFG, _i == 1 ? 0 : 1, 11 + (uint64_t)_i);
    ck_assert_int_eq(m.cfg.sliding_window, 8);
    if (_i == 2) m.cfg.rope_linear = 1, m.cfg.rope_factor = 8;
    sbp_batch b;
    batch_make(&b, FB, FT, m.cfg.vocab, pad_mask, m.cfg.pad_token_id);
    /* padding_idx is not a derivative (the row is used, its lookups' gradient dropped), so the
     * differences check the plain one; padding_idx_* check the dropping */
    m.cfg.pad_token_id = -1;
    double *coef = sft_coef(&b);
    sbp_unattended mode = SBP_UNATTENDED_ZERO;
    double *g = ref_grad(&m, &b, coef, mode);
    obj_ctx c = {&m, &b, coef, mode};
    char what[96];
    snprintf(what, sizeof what, "gemma3-tiny %s%s", _i == 1 ? "untied" : "tied",
             _i == 2 ? ", linear RoPE x8" : "");
    tu_fd_check(&m.ps, m.w, g, objective_at, &c, FD_STEP, FD_ATOL, FD_RTOL, 3, 500 + (uint64_t)_i,
                what);
    free(g);
    free(coef);
    sbp_batch_free(&b);
    model_free(&m);
}
END_TEST

/* Gemma-3's hf-sdpa is hf-eager (HF never unmasks its rows), bit for bit, and differs from
 * zero on a batch with targets predicted from pads. */
START_TEST(unattended_modes) {
    model m;
    model_make(&m, GEMMA_CFG, 1, 13);
    sbp_batch b;
    batch_make(&b, FB, FT, m.cfg.vocab, pad_mask, m.cfg.pad_token_id);
    double *coef = sft_coef(&b);
    double *g[3];
    for (int k = 0; k < 3; k++) g[k] = ref_grad(&m, &b, coef, (sbp_unattended)k);
    ck_assert(SBP_UNATTENDED_ZERO == 0 && SBP_UNATTENDED_HF_EAGER == 1 &&
              SBP_UNATTENDED_HF_SDPA == 2);
    ck_assert(memcmp(g[1], g[2], sizeof *g[1] * (size_t)m.ps.total) == 0);
    ck_assert(memcmp(g[0], g[1], sizeof *g[1] * (size_t)m.ps.total) != 0);
    for (int k = 0; k < 3; k++) free(g[k]);
    free(coef);
    sbp_batch_free(&b);
    model_free(&m);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 2. the window boundary */

/* A one-layer copy of gemma3-tiny (pattern p: p = 2 makes layer 0 sliding, p = 1 global). */
static void one_layer(model *m, int pattern) {
    model_make(m, GEMMA_CFG, 1, 21);
    ref_params_free(&m->ps);
    free(m->w);
    m->cfg.layers = 1;
    m->cfg.sliding_window_pattern = pattern;
    sbp_err err = {0};
    ck_assert_int_eq(ref_params_build(&m->ps, &m->cfg, &err), SBP_OK);
    m->w = malloc(sizeof *m->w * (size_t)m->ps.total);
    ck_assert_ptr_nonnull(m->w);
    sbp_rng rng;
    sbp_rng_seed(&rng, 22);
    for (int64_t j = 0; j < m->ps.total; j++) m->w[j] = 0.3 * sbp_rng_normal(&rng);
}

/* logp at position t of the batch with token j replaced (j < 0: none). */
static double logp_at(const model *m, sbp_batch *b, int t, int j) {
    int32_t keep = j >= 0 ? b->ids[j] : 0;
    if (j >= 0) b->ids[j] = (b->ids[j] + 7) % m->cfg.vocab;
    double *logp = malloc(sizeof *logp * (size_t)b->T);
    ck_assert_ptr_nonnull(logp);
    sbp_err err = {0};
    ck_assert_msg(ref_logprobs(logp, REF_NET(&m->cfg, &m->ps, m->w), b, 1.0, &err) == 0, "%s",
                  err.msg);
    double v = logp[t];
    free(logp);
    if (j >= 0) b->ids[j] = keep;
    return v;
}

START_TEST(window_boundary) {
    for (int pattern = 2; pattern >= 1; pattern--) {
        model m;
        one_layer(&m, pattern);
        const int W = m.cfg.sliding_window, T = 3 * W;
        sbp_batch b;
        batch_make(&b, 1, T, m.cfg.vocab, NULL, -1);
        for (int t = W; t < T - 1; t += 3) {
            double base = logp_at(&m, &b, t, -1);
            /* distance W − 1: inside the window (HF: t − W < j ≤ t) */
            ck_assert_msg(logp_at(&m, &b, t, t - W + 1) != base,
                          "t %d: key t - W + 1 is not seen (pattern %d)", t, pattern);
            /* distance W: outside a sliding layer's window, inside a global layer's view */
            double far = logp_at(&m, &b, t, t - W);
            if (pattern == 2)
                ck_assert_msg(far == base, "t %d: key t - W is seen by a sliding layer", t);
            else
                ck_assert_msg(far != base, "t %d: key t - W is not seen by a global layer", t);
            /* a future key is never seen */
            ck_assert(logp_at(&m, &b, t, t + 1) == base);
        }
        sbp_batch_free(&b);
        model_free(&m);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 3. padding_idx */

/* The untied copy of a tied model: the same function (lm_head = the embedding), so its head's
 * gradient is the head's part of the tied embedding's. */
static void untie(model *u, const model *t) {
    *u = *t;
    u->cfg.tied = 0;
    sbp_err err = {0};
    ck_assert_int_eq(ref_params_build(&u->ps, &u->cfg, &err), SBP_OK);
    u->w = malloc(sizeof *u->w * (size_t)u->ps.total);
    ck_assert_ptr_nonnull(u->w);
    for (int i = 0; i < u->ps.n; i++) {
        const sbp_param *p = &u->ps.p[i];
        sbp_param_kind k = p->kind == SBP_P_LM_HEAD ? SBP_P_EMBED : p->kind;
        int64_t o = sbp_params_offset(&t->ps, k, p->layer);
        ck_assert_int_ge(o, 0);
        memcpy(u->w + p->offset, t->w + o, sizeof *u->w * (size_t)p->numel);
    }
}

/* The pad row's gradient with the pad token at real input positions: untied, exactly 0 (and
 * not 0 with padding_idx off, so the batch exercises it); tied, the head's part only, which the
 * untied copy has in lm_head. */
static void pad_row_check(const char *cfg_path, int pad_id) {
    model t, u;
    model_make(&t, cfg_path, 1, 31);
    untie(&u, &t);
    sbp_batch b;
    batch_make(&b, 2, 12, t.cfg.vocab, NULL, pad_id);
    double *coef = sft_coef(&b);
    t.cfg.pad_token_id = u.cfg.pad_token_id = -1;
    double *g_off = ref_grad(&u, &b, coef, 0);
    t.cfg.pad_token_id = u.cfg.pad_token_id = pad_id;
    double *g_u = ref_grad(&u, &b, coef, 0), *g_t = ref_grad(&t, &b, coef, 0);
    const int64_t C = t.cfg.hidden, row = (int64_t)pad_id * C;
    const int64_t et = sbp_params_offset(&t.ps, SBP_P_EMBED, -1);
    const int64_t eu = sbp_params_offset(&u.ps, SBP_P_EMBED, -1);
    const int64_t hu = sbp_params_offset(&u.ps, SBP_P_LM_HEAD, -1);
    double lookup = 0, head = 0;
    for (int64_t c = 0; c < C; c++) {
        ck_assert_msg(g_u[eu + row + c] == 0, "untied: the pad row got lookup gradient");
        lookup = fmax(lookup, fabs(g_off[eu + row + c]));
        head = fmax(head, fabs(g_u[hu + row + c]));
        ck_assert_msg(
            fabs(g_t[et + row + c] - g_u[hu + row + c]) <= 1e-13 * fabs(g_u[hu + row + c]),
            "tied: pad row %.17g != the head's part %.17g", g_t[et + row + c], g_u[hu + row + c]);
    }
    ck_assert_msg(lookup > 1e-6 && head > 1e-6, "the batch does not exercise the pad row");
    /* and another row gets its lookups as before */
    const int64_t other = (int64_t)b.ids[0] * C;
    ck_assert(b.ids[0] != pad_id && g_u[eu + other] == g_off[eu + other]);
    free(g_off);
    free(g_u);
    free(g_t);
    free(coef);
    sbp_batch_free(&b);
    model_free(&u);
    model_free(&t);
}

START_TEST(padding_idx_gemma) {
    pad_row_check(GEMMA_CFG, 0);
}
END_TEST

START_TEST(padding_idx_llama) {
    pad_row_check("data/models/llama3-tiny.json", 7);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 4. the reader */

static const char *write_cfg(const char *name, const char *json) {
    const char *p = tu_path("%s", name);
    tu_spit(p, json, strlen(json));
    return p;
}

START_TEST(reader_gemma) {
    sbp_config c;
    sbp_err err = {0};
    /* gemma3_text with nothing but the model type: every Gemma3TextConfig default */
    ck_assert_msg(ref_config_read(&c, write_cfg("g0.json", "{\"model_type\":\"gemma3_text\"}"),
                                  &err) == SBP_OK,
                  "%s", err.msg);
    ck_assert(c.family == SBP_GEMMA3 && !c.wrapped && c.vocab == 262208 && c.hidden == 2304 &&
              c.ffn == 9216 && c.layers == 26 && c.heads == 8 && c.kv_heads == 4 &&
              c.head_dim == 256 && c.eps == 1e-6 && c.rope_theta == 1e6 &&
              c.rope_local_theta == 1e4 && c.query_pre_attn_scalar == 256 &&
              c.sliding_window == 4096 && c.sliding_window_pattern == 6 && c.tied && c.qk_norm &&
              !c.qkv_bias && c.pad_token_id == 0 && !c.rope_linear);
    /* the multimodal wrapper, as google/gemma-3-4b-pt ships it: a partial text_config */
    ck_assert_msg(
        ref_config_read(&c,
                        write_cfg("g4.json",
                                  "{\"model_type\":\"gemma3\",\"text_config\":{\"hidden_size\":"
                                  "2560,\"intermediate_size\":10240,\"model_type\":\"gemma3_text\","
                                  "\"num_hidden_layers\":34,\"rope_scaling\":{\"factor\":8.0,"
                                  "\"rope_type\":\"linear\"},\"sliding_window\":1024},"
                                  "\"vision_config\":{\"hidden_size\":1152}}"),
                        &err) == SBP_OK,
        "%s", err.msg);
    ck_assert(c.family == SBP_GEMMA3 && c.wrapped && c.hidden == 2560 && c.layers == 34 &&
              c.heads == 8 && c.vocab == 262208 && c.rope_linear && c.rope_factor == 8 &&
              c.sliding_window == 1024);
    sbp_params ps;
    c.layers = 2;
    ck_assert_int_eq(ref_params_build(&ps, &c, &err), SBP_OK);
    ck_assert_str_eq(ps.p[0].name, "language_model.model.embed_tokens.weight");
    ck_assert_int_ge(sbp_params_find(&ps, "language_model.model.layers.1.post_feedforward_"
                                          "layernorm.weight"),
                     0);
    ck_assert_int_ge(sbp_params_find(&ps, "language_model.model.layers.0.self_attn.q_norm.weight"),
                     0);
    ck_assert_int_eq(sbp_params_find(&ps, "language_model.lm_head.weight"), -1); /* tied */
    ck_assert_int_eq(ps.n, 1 + 2 * 13 + 1);
    ref_params_free(&ps);
    /* soft-capping, by name; another activation; pad_token_id null and outside the vocabulary */
    ck_assert(ref_config_read(&c,
                              write_cfg("g5.json", "{\"model_type\":\"gemma3_text\","
                                                   "\"final_logit_softcapping\":30.0}"),
                              &err) == SBP_EINPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "final_logit_softcapping"));
    ck_assert(ref_config_read(&c,
                              write_cfg("g6.json", "{\"model_type\":\"gemma3_text\","
                                                   "\"attn_logit_softcapping\":50.0}"),
                              &err) == SBP_EINPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "attn_logit_softcapping"));
    ck_assert(ref_config_read(&c,
                              write_cfg("g7.json", "{\"model_type\":\"gemma3_text\","
                                                   "\"hidden_activation\":\"silu\"}"),
                              &err) == SBP_EINPUT);
    ck_assert(ref_config_read(&c,
                              write_cfg("g8.json", "{\"model_type\":\"gemma3_text\","
                                                   "\"pad_token_id\":null}"),
                              &err) == SBP_OK &&
              c.pad_token_id == -1);
    ck_assert(ref_config_read(&c,
                              write_cfg("g9.json", "{\"model_type\":\"gemma3_text\","
                                                   "\"vocab_size\":10,\"pad_token_id\":10}"),
                              &err) == SBP_EINPUT);
    /* Llama: pad_token_id absent is none (LlamaConfig's None), a number is honoured */
    ck_assert(ref_config_read(&c, "data/models/llama3-tiny.json", &err) == SBP_OK &&
              c.pad_token_id == -1);
}
END_TEST

/* The committed real configs (data/configs/gemma3-*.json) read as the HF checkpoints are, by
 * the oracle and by the library (for plan), with the parameter counts HF 4.51.3 builds from
 * them (sum of numel of Gemma3ForCausalLM's parameters, the tied head once). */
START_TEST(reader_real_configs) {
    static const struct {
        const char *name;
        int hidden, layers, heads, kv, hd, ffn, vocab, window, qpas, linear, wrapped;
        int64_t params;
    } want[] = {
        {"gemma3-1b", 1152, 26, 4, 1, 256, 6912, 262144, 512, 256, 0, 0, 999885952},
        {"gemma3-4b", 2560, 34, 8, 4, 256, 10240, 262208, 1024, 256, 1, 1, 3880263168},
        {"gemma3-12b", 3840, 48, 16, 8, 256, 15360, 262208, 1024, 256, 1, 1, 11766034176},
        {"gemma3-27b", 5376, 62, 32, 16, 128, 21504, 262208, 1024, 168, 1, 1, 27009346304},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        sbp_config c;
        sbp_err err = {0};
        char path[128];
        snprintf(path, sizeof path, "data/configs/%s.json", want[i].name);
        ck_assert_msg(ref_config_read(&c, path, &err) == SBP_OK, "%s", err.msg);
        ck_assert_msg(
            c.hidden == want[i].hidden && c.layers == want[i].layers && c.heads == want[i].heads &&
                c.kv_heads == want[i].kv && c.head_dim == want[i].hd && c.ffn == want[i].ffn &&
                c.vocab == want[i].vocab && c.sliding_window == want[i].window &&
                c.query_pre_attn_scalar == want[i].qpas && c.rope_linear == want[i].linear &&
                c.wrapped == want[i].wrapped && c.sliding_window_pattern == 6 &&
                c.rope_theta == 1e6 && c.rope_local_theta == 1e4 && c.tied && c.pad_token_id == 0,
            "%s", want[i].name);
        if (want[i].linear) ck_assert(c.rope_factor == 8);
        sbp_config lib;
        ck_assert_msg(sbp_config_load(&lib, path, &err) == SBP_OK, "%s", err.msg);
        ck_assert_msg(sbp_config_param_count(&lib) == want[i].params, "%s: %lld parameters",
                      want[i].name, (long long)sbp_config_param_count(&lib));
        ck_assert(lib.sliding_window == c.sliding_window && lib.wrapped == c.wrapped &&
                  lib.rope_linear == c.rope_linear && lib.head_dim == c.head_dim);
    }
}
END_TEST

/* A multimodal gemma3 directory (text_config and language_model.* names, a vision tower the
 * oracle must not need) holding data/hf-gemma3's text model: the oracle's loss and gradient are
 * those of the plain gemma3_text directory, bit for bit. */
START_TEST(reader_wrapped_model) {
    const char *dir = tu_new_dir("wrapped");
    char *cfg = tu_slurp("data/hf-gemma3/config.json", NULL);
    size_t n = strlen(cfg) + 200;
    char *wrapped = malloc(n);
    ck_assert_ptr_nonnull(wrapped);
    snprintf(wrapped, n,
             "{\"model_type\": \"gemma3\", \"vision_config\": {\"hidden_size\": 8}, "
             "\"text_config\": %s}",
             cfg);
    tu_spit(tu_join(dir, "config.json"), wrapped, strlen(wrapped));
    tu_tensors ts;
    tu_tensors_load(&ts, "data/hf-gemma3/model.safetensors");
    static char names[TU_MAX_TENSORS][128];
    for (int i = 0; i < ts.n; i++) {
        snprintf(names[i], sizeof names[i], "language_model.%s", ts.names[i]);
        ts.e[i].name = names[i];
    }
    /* a tensor the oracle must skip: the vision tower's */
    static const float vt[4] = {1, 2, 3, 4};
    ts.e[ts.n] = (sbp_st_entry){.name = "vision_tower.vision_model.post_layernorm.weight",
                                .dtype = SBP_DT_F32,
                                .ndim = 1,
                                .shape = {4},
                                .data = vt};
    sbp_err err = {0};
    ck_assert_int_eq(sbp_st_write(tu_join(dir, "model.safetensors"), ts.e, ts.n + 1, NULL, &err),
                     SBP_OK);
    sbp_objective o = {.kind = SBP_OBJ_SFT};
    double loss[2], *g[2];
    ref_model m[2];
    ref_lora la;
    const char *dirs[2] = {"data/hf-gemma3", dir};
    for (int k = 0; k < 2; k++) {
        ref_files f = {
            .model_dir = dirs[k], .batch_path = "data/hf-gemma3/batch.safetensors", .o = &o};
        char mm[256];
        ck_assert_msg(ref_truth_files(&loss[k], &g[k], &m[k], &la, &f, mm, sizeof mm, &err) ==
                          SBP_OK,
                      "%s %s", err.msg, mm);
    }
    ck_assert(m[1].cfg.wrapped && !m[0].cfg.wrapped && m[0].ps.total == m[1].ps.total);
    ck_assert(loss[0] == loss[1]);
    ck_assert(memcmp(g[0], g[1], sizeof *g[0] * (size_t)m[0].ps.total) == 0);
    ck_assert_str_eq(m[1].ps.p[0].name, "language_model.model.embed_tokens.weight");
    for (int k = 0; k < 2; k++) {
        free(g[k]);
        ref_model_free(&m[k]);
    }
    tu_tensors_free(&ts);
    free(wrapped);
    free(cfg);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 5. ref32 */

/* The float32 loops on Gemma-3 against float64: the yardstick of fp32 runs stays float32-sized
 * (measured 2e-7 to 2e-6 per tensor; a float32 (1 + w) or GeGLU slip would be ~1). */
START_TEST(ref32_gemma) {
    model m;
    model_make(&m, GEMMA_CFG, -1, 41);
    sbp_batch b;
    batch_make(&b, FB, FT, m.cfg.vocab, pad_mask, m.cfg.pad_token_id);
    double *g64 = calloc((size_t)m.ps.total, sizeof *g64), *g32 = calloc((size_t)m.ps.total, 8);
    ck_assert(g64 && g32);
    double l64, l32;
    sbp_err err = {0};
    ck_assert_int_eq(ref_sft(&l64, g64, REF_NET(&m.cfg, &m.ps, m.w), &b, &err), 0);
    ck_assert_int_eq(ref_sft_f32(&l32, g32, REF_NET(&m.cfg, &m.ps, m.w), &b, &err), 0);
    ck_assert_msg(fabs(l32 - l64) <= 1e-5 * fabs(l64), "loss %.9g vs %.9g", l32, l64);
    double worst = 0;
    for (int i = 0; i < m.ps.n; i++) {
        const sbp_param *p = &m.ps.p[i];
        double num = 0, den = 0;
        for (int64_t j = 0; j < p->numel; j++) {
            double d = g32[p->offset + j] - g64[p->offset + j];
            num += d * d, den += g64[p->offset + j] * g64[p->offset + j];
        }
        double rel = sqrt(num / (den > 0 ? den : 1));
        worst = fmax(worst, rel);
        ck_assert_msg(rel < 1e-4, "%s: ref32 rel. L2 %.3g", p->name, rel);
    }
    printf("ref32 vs ref on gemma3-tiny: worst per-tensor rel. L2 %.3g\n", worst);
    free(g64);
    free(g32);
    sbp_batch_free(&b);
    model_free(&m);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 6. the engine against the oracle */

/* Every schedule (chunks below, at and above the window, straddling its edge), fast and
 * portable, fp64 (<= 1e-10 per tensor, as test_ref) and fp32 (<= 1e-4) on gemma3-tiny (W = 8,
 * layer 2 global) with the two window batches of verify --suite. The unattended rows in mode
 * zero and hf-eager (what HF's Gemma-3 computes). */
START_TEST(engine_against_ref) {
    static const char *batches[] = {"data/batches/suite-gemma3-long.safetensors",
                                    "data/batches/suite-gemma3-left-pad-window.safetensors"};
    static const struct {
        sbp_schedule s;
        int chunk;
    } runs[] = {{SBP_FULL, 0},   {SBP_CKPT, 0},    {SBP_STREAM, 4}, {SBP_STREAM, 5},
                {SBP_STREAM, 8}, {SBP_STREAM, 12}, {SBP_STREAM, 20}};
    const char *dir = tu_model("gemma3-tiny", 7);
    double worst[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        sbp_model m64, m32;
        sbp_batch b;
        tu_load(&m64, &b, dir, batches[k], SBP_FP64);
        tu_load(&m32, NULL, dir, NULL, SBP_FP32);
        for (int mode = 0; mode < 2; mode++) {
            sbp_unattended un = mode ? SBP_UNATTENDED_HF_EAGER : SBP_UNATTENDED_ZERO;
            ref_net net = {.cfg = &m64.cfg, .ps = &m64.params, .w = m64.w, .unattended = un};
            double ref_loss, *g = calloc((size_t)m64.params.total, sizeof *g);
            ck_assert_ptr_nonnull(g);
            sbp_err err = {0};
            ck_assert_msg(ref_sft(&ref_loss, g, &net, &b, &err) == 0, "%s", err.msg);
            for (int prec = 0; prec < 2; prec++)
                for (int num = 0; num < 2; num++)
                    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
                        const sbp_model *m = prec ? &m32 : &m64;
                        sbp_grad_opts o = {.schedule = runs[i].s,
                                           .block = 4,
                                           .chunk = runs[i].chunk,
                                           .numerics = (sbp_numerics)num,
                                           .unattended = un};
                        sbp_grad_result r;
                        ck_assert_msg(sbp_grad(&r, m, &b, &o, NULL, &err) == SBP_OK, "%s", err.msg);
                        double tol = prec ? 1e-4 : 1e-10;
                        for (int j = 0; j < m->params.n; j++) {
                            const sbp_param *p = &m->params.p[j];
                            double e = tu_rel_l2(m, r.grads, &m64, g, p);
                            ck_assert_msg(e <= tol,
                                          "%s, %s %s %s chunk %d, unattended %d: %s rel. L2 "
                                          "%.3g against ref",
                                          batches[k], prec ? "fp32" : "fp64",
                                          num ? "portable" : "fast", sbp_schedule_name(runs[i].s),
                                          runs[i].chunk, mode, p->name, e);
                            worst[prec] = fmax(worst[prec], e);
                        }
                        ck_assert_msg(fabs(r.loss - ref_loss) <= (prec ? 1e-5 : 1e-12) * ref_loss,
                                      "loss %.17g vs ref %.17g", r.loss, ref_loss);
                        sbp_grad_result_free(&r, NULL);
                    }
            free(g);
        }
        sbp_batch_free(&b);
        sbp_model_free(&m64, NULL);
        sbp_model_free(&m32, NULL);
    }
    printf("engine vs ref on gemma3-tiny: worst rel. L2 fp64 %.3g, fp32 %.3g\n", worst[0],
           worst[1]);
}
END_TEST

int main(void) {
    Suite *s = suite_create("refgemma");
    TCase *fd = tcase_create("fd");
    tcase_set_timeout(fd, 600);
    tcase_add_loop_test(fd, fd_gemma, 0, 3);
    suite_add_tcase(s, fd);
    TCase *sem = tcase_create("semantics");
    tcase_set_timeout(sem, 300);
    tcase_add_test(sem, window_boundary);
    tcase_add_test(sem, unattended_modes);
    tcase_add_test(sem, padding_idx_gemma);
    tcase_add_test(sem, padding_idx_llama);
    tcase_add_test(sem, ref32_gemma);
    suite_add_tcase(s, sem);
    TCase *rd = tcase_create("reader");
    tcase_add_test(rd, reader_gemma);
    tcase_add_test(rd, reader_real_configs);
    tcase_add_test(rd, reader_wrapped_model);
    suite_add_tcase(s, rd);
    TCase *src = tcase_create("engine");
    tcase_set_timeout(src, 900);
    tcase_add_test(src, engine_against_ref);
    suite_add_tcase(s, src);
    return tu_run_suite(s);
}
