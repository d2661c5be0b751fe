/* views.c — the tensors of a parameter slab as the steps see them: one layer's weights or
 * gradients (layer_p), its adapters, and the model-wide tensors, each a pointer into the slab or
 * into a bucket's scratch that holds part of it. Compiled once per precision. */
#include "engine.h"

real *slab_view(real *slab, int64_t base, const sbp_params *ps, sbp_param_kind kind, int layer) {
    int64_t off = sbp_params_offset(ps, kind, layer);
    return off < 0 || !slab ? NULL : slab + (off - base);
}

/* The adapter of projection kind in layer l (lora_A, lora_B views), from an adapter table. */
static lora_ab adapter(real *slab, int64_t base, const sbp_params *ps, sbp_param_kind kind, int l) {
    lora_ab ab = {NULL, NULL};
    if (!slab || !ps) return ab;
    const int64_t a = sbp_params_offset_lora(ps, kind, l, 1),
                  b = sbp_params_offset_lora(ps, kind, l, 2);
    if (a >= 0 && b >= 0) ab.A = slab + (a - base), ab.B = slab + (b - base);
    return ab;
}

void adapter_views(layer_p *lp, real *slab, int64_t base, const sbp_params *ps, int l) {
    lp->aq = adapter(slab, base, ps, SBP_P_Q, l), lp->ak = adapter(slab, base, ps, SBP_P_K, l);
    lp->av = adapter(slab, base, ps, SBP_P_V, l), lp->ao = adapter(slab, base, ps, SBP_P_O, l);
    lp->ag = adapter(slab, base, ps, SBP_P_GATE, l), lp->au = adapter(slab, base, ps, SBP_P_UP, l);
    lp->ad = adapter(slab, base, ps, SBP_P_DOWN, l);
}

void layer_views(layer_p *lp, real *slab, int64_t base, const sbp_params *ps, int l) {
    lp->wq = slab_view(slab, base, ps, SBP_P_Q, l), lp->bq = slab_view(slab, base, ps, SBP_P_QB, l);
    lp->wk = slab_view(slab, base, ps, SBP_P_K, l), lp->bk = slab_view(slab, base, ps, SBP_P_KB, l);
    lp->wv = slab_view(slab, base, ps, SBP_P_V, l), lp->bv = slab_view(slab, base, ps, SBP_P_VB, l);
    lp->wo = slab_view(slab, base, ps, SBP_P_O, l);
    lp->q_norm = slab_view(slab, base, ps, SBP_P_QNORM, l);
    lp->k_norm = slab_view(slab, base, ps, SBP_P_KNORM, l);
    lp->wg = slab_view(slab, base, ps, SBP_P_GATE, l);
    lp->wu = slab_view(slab, base, ps, SBP_P_UP, l);
    lp->wd = slab_view(slab, base, ps, SBP_P_DOWN, l);
    lp->in_norm = slab_view(slab, base, ps, SBP_P_IN_NORM, l);
    lp->post_norm = slab_view(slab, base, ps, SBP_P_POST_NORM, l);
    lp->pre_ff_norm = slab_view(slab, base, ps, SBP_P_PRE_FF_NORM, l);
    lp->post_ff_norm = slab_view(slab, base, ps, SBP_P_POST_FF_NORM, l);
}
