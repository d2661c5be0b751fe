/* gemma.c — what a Gemma-3 run needs beyond the other families, set up once per run
 * (HF transformers 4.51.3, modeling_gemma3.py):
 *
 *   - Gemma3RMSNorm computes x̂ · (1.0 + w.float()): every norm weight (input, post-attention,
 *     pre- and post-feedforward, q_norm, k_norm, final) is used as 1 + w, formed here once in the
 *     working precision (one rounded add; HF's float32, or float64 where HF's float64 runs keep
 *     the norm in float32: the float32 islands, docs/gemma3.md) into e->norm1p, and the weight
 *     views point there. d(1 + w)/dw = 1, so the gradients land on w's own views unchanged.
 *   - Gemma3TextScaledWordEmbedding: lookup · embed_scale, embed_scale = torch.tensor(C ** 0.5)
 *     (float32) cast to the weight's dtype: (float)sqrt(C) in fp32, bfloat16 of that in bf16
 *     storage, and sqrt(C) in double in fp64 (HF's float64 island, patched as the norm's).
 *   - Local (sliding) layers rotate with rope_local_base_freq and no scaling, global layers with
 *     rope_theta and rope_scaling: a second pair of tables, e->cos_l and e->sin_l.
 * Everything goes through the op table, so a planning run charges the same buffers. */
#include "../io/safetensors.h" /* sbp_f32_to_bf16 */
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The norms of layer l as used (pointers into lw) and their sizes. */
static int layer_norms(real **p[6], int n[6], layer_p *lw, int C, int HD) {
    real **v[6] = {&lw->in_norm,      &lw->post_norm, &lw->pre_ff_norm,
                   &lw->post_ff_norm, &lw->q_norm,    &lw->k_norm};
    const int sz[6] = {C, C, C, C, HD, HD};
    for (int i = 0; i < 6; i++) p[i] = v[i], n[i] = sz[i];
    return 6;
}

int gemma_begin(eng *e) {
    if (!e->gemma) return 1;
    const sbp_config *c = e->cfg;
    const int C = e->C, HD = e->HD, most = C > HD ? C : HD;
    const size_t n1p = (size_t)e->L * (4 * (size_t)C + 2 * (size_t)HD) + (size_t)C;
    e->norm1p = ealloc(e, SBP_MEM_WEIGHTS, n1p, "Gemma-3 norm weights as used (1 + w)");
    real *ones = ealloc(e, SBP_MEM_LAYER, (size_t)most, "ones");
    const size_t half = (size_t)e->T * (HD / 2);
    real *cos_l = ealloc(e, SBP_MEM_LAYER, half, "local RoPE cos table");
    real *sin_l = ealloc(e, SBP_MEM_LAYER, half, "local RoPE sin table");
    e->cos_l = cos_l, e->sin_l = sin_l;
    if (e->oom) {
        efree(e, ones);
        return 0;
    }
    /* 1 + w: the add of the op table against a row of ones, not rounded to bf16 (HF keeps
     * 1.0 + w.float() in float32) */
    eng raw = *e;
    raw.bf16 = 0;
    real *hones = malloc(sizeof *hones * (size_t)most);
    if (!hones) {
        efree(e, ones);
        snprintf(e->oom_what, sizeof e->oom_what, "ones");
        return e->oom = 1, 0;
    }
    for (int i = 0; i < most; i++) hones[i] = 1;
    e->ops->upload(e, ones, hones, sizeof *hones * (size_t)most);
    free(hones);
    real *dst = e->norm1p;
    for (int l = 0; l < e->L; l++) {
        real **p[6];
        int n[6];
        const int k = layer_norms(p, n, &e->w[l], C, HD);
        for (int i = 0; i < k; i++) {
            e->ops->add(&raw, dst, *p[i], ones, (size_t)n[i]);
            *p[i] = dst, dst += n[i];
        }
    }
    e->ops->add(&raw, dst, e->fnorm, ones, (size_t)C);
    e->fnorm = dst;
    efree(e, ones);
    /* the local layers' tables: rope_local_base_freq, no scaling */
    sbp_config lc = *c;
    lc.rope_theta = c->rope_local_theta, lc.rope_llama3 = 0, lc.rope_linear = 0;
    eng loc = *e;
    loc.cfg = &lc;
    e->ops->rope_table(&loc, cos_l, sin_l);
    /* the attention's softmax scale: query_pre_attn_scalar^-0.5, not head_dim's */
    e->attn_scale = sbp_attn_scale(c);
    /* the embedding scale in the weights' dtype */
    float s32 = (float)sqrt((double)C);
    if (e->bf16) {
        const uint32_t u = (uint32_t)sbp_f32_to_bf16(s32) << 16;
        memcpy(&s32, &u, sizeof s32);
    }
#ifdef SBP_REAL_F64
    e->emb_scale = e->bf16 ? (real)s32 : sqrt((double)C);
#else
    e->emb_scale = s32;
#endif
    return 1;
}

void gemma_end(eng *e) {
    efree(e, e->norm1p), efree(e, (void *)e->cos_l), efree(e, (void *)e->sin_l);
    e->norm1p = NULL, e->cos_l = e->sin_l = NULL;
}
