/* accuracy.h — the float32 gradient's error against a float64 truth, per tensor (issue 37).
 *
 * Shared by the `make accuracy` table (bench/accuracy.c) and the CI bound test
 * (tests/test_accuracy.c); docs/accuracy.md gives the table and how to read it.
 *
 * For one family's measuring model (acc_config_json: hidden 128, 4 heads of 32, 2 kv heads,
 * 2 layers, V = 512, long positions) and T tokens of one sequence (ids from acc_token, labels =
 * ids, no padding, SFT), the float64 gradient (portable numerics, full BP) is the truth g64, and
 * for float32 fast and float32 portable each tensor's error is the relative L2
 *     ‖g32 − g64‖ / ‖g64‖     (sums in double, over the tensor's elements).
 * The float64 run has ~1e-13 error of its own: far below what is measured. */
#ifndef SBP_BENCH_ACCURACY_H
#define SBP_BENCH_ACCURACY_H

#include "../src/streambp.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { ACC_FAST, ACC_PORTABLE, ACC_NRUNS };

typedef struct {
    char name[80];
    sbp_param_kind kind;
    int layer;
    double err[ACC_NRUNS]; /* relative L2 error of float32 fast, float32 portable */
} acc_row;

/* The families measured, in the table's order. */
static const char *const acc_families[] = {"qwen3", "qwen2", "llama3", "gemma3"};
enum { ACC_NFAMILIES = 4 };

/* The measuring model of a family as a config.json; NULL for an unknown family. The same sizes
 * for every family: hidden 128 (4 query heads of 32, 2 kv heads), F = 256, 2 layers, V = 512,
 * positions up to 65536. Qwen2 has the q/k/v biases; Llama-3 its rope scaling; Gemma-3 a local
 * layer (window 256) and a global one. wide: a real model's widths (Qwen3-0.6B's hidden 1024,
 * F = 3072 and head_dim 128; 8 query heads, 4 kv heads), where the products' sums over K are as
 * long as a user's (the small model's are at most 256 terms); the weights' spread scaled by
 * sqrt(128 / 1024) so that activations keep the small model's size. */
static inline const char *acc_config_json(const char *family, int wide) {
#define ACC_SMALL                                                                                  \
    "\"vocab_size\": 512, \"hidden_size\": 128, \"intermediate_size\": 256, "                      \
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "           \
    "\"head_dim\": 32, \"max_position_embeddings\": 65536, \"initializer_range\": 0.1, "           \
    "\"torch_dtype\": \"float32\", "
#define ACC_WIDE                                                                                   \
    "\"vocab_size\": 512, \"hidden_size\": 1024, \"intermediate_size\": 3072, "                    \
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"num_key_value_heads\": 4, "           \
    "\"head_dim\": 128, \"max_position_embeddings\": 65536, \"initializer_range\": 0.035, "        \
    "\"torch_dtype\": \"float32\", "
#define ACC_QWEN3                                                                                  \
    "\"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "               \
    "\"attention_bias\": false, \"tie_word_embeddings\": true}"
#define ACC_QWEN2                                                                                  \
    "\"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "               \
    "\"use_sliding_window\": false, \"tie_word_embeddings\": false}"
#define ACC_LLAMA3                                                                                 \
    "\"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, "                \
    "\"rope_scaling\": {\"factor\": 8.0, \"high_freq_factor\": 4.0, "                              \
    "\"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, "                       \
    "\"rope_type\": \"llama3\"}, \"attention_bias\": false, \"mlp_bias\": false, "                 \
    "\"tie_word_embeddings\": false}"
#define ACC_GEMMA3(QPAS)                                                                           \
    "\"hidden_activation\": \"gelu_pytorch_tanh\", \"rms_norm_eps\": 1e-06, "                      \
    "\"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0, "                               \
    "\"rope_scaling\": null, \"query_pre_attn_scalar\": " QPAS ", \"sliding_window\": 256, "       \
    "\"sliding_window_pattern\": 2, \"attn_logit_softcapping\": null, "                            \
    "\"final_logit_softcapping\": null, \"attention_bias\": false, "                               \
    "\"pad_token_id\": 0, \"tie_word_embeddings\": true}"
#define ACC_HEAD(ARCH, TYPE) "{\"architectures\": [\"" ARCH "\"], \"model_type\": \"" TYPE "\", "
    if (!strcmp(family, "qwen3"))
        return wide ? ACC_HEAD("Qwen3ForCausalLM", "qwen3") ACC_WIDE ACC_QWEN3
                    : ACC_HEAD("Qwen3ForCausalLM", "qwen3") ACC_SMALL ACC_QWEN3;
    if (!strcmp(family, "qwen2"))
        return wide ? ACC_HEAD("Qwen2ForCausalLM", "qwen2") ACC_WIDE ACC_QWEN2
                    : ACC_HEAD("Qwen2ForCausalLM", "qwen2") ACC_SMALL ACC_QWEN2;
    if (!strcmp(family, "llama3"))
        return wide ? ACC_HEAD("LlamaForCausalLM", "llama") ACC_WIDE ACC_LLAMA3
                    : ACC_HEAD("LlamaForCausalLM", "llama") ACC_SMALL ACC_LLAMA3;
    if (!strcmp(family, "gemma3")) /* query_pre_attn_scalar: the head dim */
        return wide ? ACC_HEAD("Gemma3ForCausalLM", "gemma3_text") ACC_WIDE ACC_GEMMA3("128")
                    : ACC_HEAD("Gemma3ForCausalLM", "gemma3_text") ACC_SMALL ACC_GEMMA3("32");
    return NULL;
#undef ACC_HEAD
#undef ACC_GEMMA3
#undef ACC_LLAMA3
#undef ACC_QWEN2
#undef ACC_QWEN3
#undef ACC_WIDE
#undef ACC_SMALL
}

/* The tensor's kind as the bound tables name it: its name with the layer number replaced by '*'
 * ("model.layers.*.self_attn.k_proj.bias"). */
static inline void acc_kind_key(char *out, size_t n, const char *name) {
    const char *p = strstr(name, "layers.");
    if (!p) {
        snprintf(out, n, "%s", name);
        return;
    }
    const char *q = p + 7;
    while (*q >= '0' && *q <= '9') q++;
    snprintf(out, n, "%.*s*%s", (int)(p + 7 - name), name, q);
}

/* Token t of the measuring batch: splitmix64(seed·2^32 + t) mod V (python/tests can redo it). */
static inline int32_t acc_token(uint64_t seed, int t, int V) {
    uint64_t z = (seed << 32) + (uint64_t)t + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (int32_t)(z % (uint64_t)V);
}

/* Writes the family's measuring model (the weights of `streambp init --seed seed`; wide:
 * acc_config_json's) under dir (created by the caller's mkdtemp). The table and the CI bound use
 * seed 1; other seeds draw other weights and tokens for the same model, to tell a tensor's
 * systematic excess from the spread of one draw (docs/accuracy.md). */
static inline sbp_status acc_make_model(const char *family, int wide, uint64_t seed,
                                        const char *dir, sbp_err *err) {
    const char *json = acc_config_json(family, wide);
    if (!json) {
        snprintf(err->msg, sizeof err->msg, "accuracy: unknown family '%s'", family);
        return SBP_EUSAGE;
    }
    sbp_config cfg;
    sbp_status st = sbp_config_parse(&cfg, json, family, err);
    return st ? st : sbp_model_init(&cfg, seed, dir, err);
}

static inline sbp_status acc_batch(sbp_batch *b, int T, int V, uint64_t seed) {
    memset(b, 0, sizeof *b);
    b->B = 1, b->T = T, b->kind = SBP_OBJ_SFT;
    b->ids = malloc(sizeof(int32_t) * (size_t)T);
    b->labels = malloc(sizeof(int32_t) * (size_t)T);
    b->mask = malloc((size_t)T);
    if (!b->ids || !b->labels || !b->mask) return sbp_batch_free(b), SBP_ENOMEM;
    for (int t = 0; t < T; t++) b->ids[t] = b->labels[t] = acc_token(seed, t, V), b->mask[t] = 1;
    sbp_batch_count_targets(b);
    return SBP_OK;
}

static inline sbp_status acc_run(sbp_grad_result *r, const sbp_model *m, const sbp_batch *b,
                                 sbp_numerics n, int block, sbp_err *err) {
    sbp_grad_opts o = {.schedule = SBP_FULL, .numerics = n, .block = block, .chunked_logits = 1};
    return sbp_grad(r, m, b, &o, NULL, err);
}

/* rows[i] for every tensor of the model in dir at T tokens (acc_token(seed, ...)): the errors
 * of float32 fast and portable against the float64 truth, with the token block `block` (0: the
 * default). *rows is malloc'ed (n = the model's tensors). */
static inline sbp_status acc_measure(acc_row **rows, int *n, const char *dir, int T, int block,
                                     uint64_t seed, sbp_err *err) {
    sbp_model m64 = {0}, m32 = {0};
    sbp_batch b = {0};
    sbp_grad_result g64 = {0}, g32[ACC_NRUNS] = {{0}};
    sbp_status st = sbp_model_load(&m64, dir, SBP_FP64, NULL, err);
    if (!st) st = sbp_model_load(&m32, dir, SBP_FP32, NULL, err);
    if (!st) st = acc_batch(&b, T, m64.cfg.vocab, seed);
    if (!st) st = acc_run(&g64, &m64, &b, SBP_NUMERICS_PORTABLE, block, err);
    if (!st) st = acc_run(&g32[ACC_FAST], &m32, &b, SBP_NUMERICS_FAST, block, err);
    if (!st) st = acc_run(&g32[ACC_PORTABLE], &m32, &b, SBP_NUMERICS_PORTABLE, block, err);
    if (!st && !(*rows = calloc((size_t)m64.params.n, sizeof **rows))) st = SBP_ENOMEM;
    for (int i = 0; !st && i < m64.params.n; i++) {
        const sbp_param *p = &m64.params.p[i];
        acc_row *row = &(*rows)[i];
        snprintf(row->name, sizeof row->name, "%s", p->name);
        row->kind = p->kind, row->layer = p->layer;
        const double *t = (const double *)g64.grads + p->offset;
        for (int k = 0; k < ACC_NRUNS; k++) {
            const float *g = (const float *)g32[k].grads + p->offset;
            double num = 0, den = 0;
            for (int64_t x = 0; x < p->numel; x++) {
                const double d = (double)g[x] - t[x];
                num += d * d, den += t[x] * t[x];
            }
            row->err[k] = den > 0 ? sqrt(num / den) : sqrt(num);
        }
    }
    if (!st) *n = m64.params.n;
    for (int k = 0; k < ACC_NRUNS; k++) sbp_grad_result_free(&g32[k], NULL);
    sbp_grad_result_free(&g64, NULL);
    sbp_batch_free(&b), sbp_model_free(&m32, NULL), sbp_model_free(&m64, NULL);
    return st;
}

#endif
