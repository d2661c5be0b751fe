/* params.c — the parameter table: HF names, shapes and slab offsets of every tensor.
 *
 * Order follows HF's state_dict: the embedding, then per layer the attention projections (with
 * Qwen2's biases after their weights), Qwen3's and Gemma-3's q_norm/k_norm, the MLP, the two
 * norms (Gemma-3: four; its post_attention_layernorm normalises the attention output, and
 * pre_feedforward_layernorm is the MLP's input norm); then the final norm and, when the head is
 * not tied, lm_head. */
#include "../core/err.h"
#include "../streambp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add(sbp_params *ps, sbp_param_kind kind, int layer, const char *suffix, int64_t d0,
                int64_t d1) {
    sbp_param *p = &ps->p[ps->n++];
    if (layer >= 0)
        snprintf(p->name, sizeof p->name, "model.layers.%d.%s", layer, suffix);
    else
        snprintf(p->name, sizeof p->name, "%s", suffix);
    p->kind = kind;
    p->layer = layer;
    p->ndim = d1 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->numel = d1 ? d0 * d1 : d0;
    p->offset = ps->total;
    ps->total += p->numel;
}

sbp_status sbp_params_build(sbp_params *ps, const sbp_config *c, sbp_err *err) {
    memset(ps, 0, sizeof *ps);
    /* a config built in memory gets the checks a file gets, the size products among them */
    sbp_status st = sbp_config_validate(c, "config", err);
    if (st) return st;
    int per_layer = 16;
    ps->p = calloc((size_t)c->layers * per_layer + 3, sizeof *ps->p);
    if (!ps->p) return sbp_fail(err, SBP_ENOMEM, "out of memory for the parameter table");
    int64_t C = c->hidden, F = c->ffn, V = c->vocab;
    int64_t Q = (int64_t)c->heads * c->head_dim, KV = (int64_t)c->kv_heads * c->head_dim;
    add(ps, SBP_P_EMBED, -1, "model.embed_tokens.weight", V, C);
    for (int l = 0; l < c->layers; l++) {
        add(ps, SBP_P_Q, l, "self_attn.q_proj.weight", Q, C);
        if (c->qkv_bias) add(ps, SBP_P_QB, l, "self_attn.q_proj.bias", Q, 0);
        add(ps, SBP_P_K, l, "self_attn.k_proj.weight", KV, C);
        if (c->qkv_bias) add(ps, SBP_P_KB, l, "self_attn.k_proj.bias", KV, 0);
        add(ps, SBP_P_V, l, "self_attn.v_proj.weight", KV, C);
        if (c->qkv_bias) add(ps, SBP_P_VB, l, "self_attn.v_proj.bias", KV, 0);
        add(ps, SBP_P_O, l, "self_attn.o_proj.weight", C, Q);
        if (c->qk_norm) {
            add(ps, SBP_P_QNORM, l, "self_attn.q_norm.weight", c->head_dim, 0);
            add(ps, SBP_P_KNORM, l, "self_attn.k_norm.weight", c->head_dim, 0);
        }
        add(ps, SBP_P_GATE, l, "mlp.gate_proj.weight", F, C);
        add(ps, SBP_P_UP, l, "mlp.up_proj.weight", F, C);
        add(ps, SBP_P_DOWN, l, "mlp.down_proj.weight", C, F);
        add(ps, SBP_P_IN_NORM, l, "input_layernorm.weight", C, 0);
        add(ps, SBP_P_POST_NORM, l, "post_attention_layernorm.weight", C, 0);
        if (c->family == SBP_GEMMA3) {
            add(ps, SBP_P_PRE_FF_NORM, l, "pre_feedforward_layernorm.weight", C, 0);
            add(ps, SBP_P_POST_FF_NORM, l, "post_feedforward_layernorm.weight", C, 0);
        }
    }
    add(ps, SBP_P_FINAL_NORM, -1, "model.norm.weight", C, 0);
    if (!c->tied) add(ps, SBP_P_LM_HEAD, -1, "lm_head.weight", V, C);
    return SBP_OK;
}

void sbp_params_free(sbp_params *ps) {
    free(ps->p);
    memset(ps, 0, sizeof *ps);
}

int sbp_params_find(const sbp_params *ps, const char *name) {
    for (int i = 0; i < ps->n; i++)
        if (strcmp(ps->p[i].name, name) == 0) return i;
    return -1;
}

int64_t sbp_params_offset(const sbp_params *ps, sbp_param_kind kind, int layer) {
    return sbp_params_offset_lora(ps, kind, layer, 0);
}

int64_t sbp_params_offset_lora(const sbp_params *ps, sbp_param_kind kind, int layer, int lora) {
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i].kind == kind && ps->p[i].layer == layer && ps->p[i].lora == lora)
            return ps->p[i].offset;
    return -1;
}
