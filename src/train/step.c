/* step.c — one optimizer step: gradient (any schedule, any objective, accumulated over
 * micro-batches), clipping, AdamW, of the model's weights or of a LoRA adapter's. */
#include "../core/err.h"
#include "../dist/dist.h"
#include "../streambp.h"
#include "zero2.h"

#include <math.h>

static const char *prec_name(sbp_precision p) {
    return p == SBP_FP64 ? "fp64" : "fp32";
}

sbp_status sbp_train_step(sbp_step_result *r, sbp_model *m, sbp_lora *lora, sbp_adamw *a,
                          const sbp_batch *b, int n, const sbp_grad_opts *g, double lr,
                          double max_grad_norm, sbp_ledger *lg, sbp_err *err) {
    r->loss = r->grad_norm = r->lr = 0;
    r->n_targets = 0;
    /* the trainable slab: the weights, or the adapter's tensors with the model frozen */
    void *w = lora ? lora->w : m->w;
    const int64_t n_w = lora ? lora->params.total : m->params.total;
    const sbp_precision prec = lora ? lora->prec : m->prec;
    if (a->n != n_w || a->prec != prec)
        return sbp_fail(err, SBP_EUSAGE,
                        "the optimizer holds %lld %s elements; the %s %lld %s elements",
                        (long long)a->n, prec_name(a->prec), lora ? "adapter" : "model",
                        (long long)n_w, prec_name(prec));
    if (!(lr >= 0) || !isfinite(lr))
        return sbp_fail(err, SBP_EUSAGE, "the learning rate must be >= 0 and finite (got %g)", lr);
    if (!(max_grad_norm >= 0) || !isfinite(max_grad_norm))
        return sbp_fail(err, SBP_EUSAGE, "the clipping norm must be >= 0 and finite (got %g)",
                        max_grad_norm);
    sbp_grad_opts go = *g;
    go.lora = lora;
    sbp_grad_result gr;
    /* ZeRO-2 (zero2.h): the gradient step leaves each rank its own blocks, packed */
    const int held = a->held != NULL;
    if (held && a->comm != g->comm)
        return sbp_fail(err, SBP_EUSAGE, "the optimizer's shard belongs to another process group");
    go.sharded = held;
    sbp_status st = sbp_grad_batches(&gr, m, b, n, &go, lg, err);
    if (st) return st;
    const sbp_params *ps = lora ? &lora->params : &m->params;
    double norm = 0;
    if (held)
        st = sbp_clip_grad_norm_held(&norm, gr.grads, a, ps, max_grad_norm, err);
    else
        norm = sbp_clip_grad_norm(gr.grads, n_w, prec, max_grad_norm);
    if (!st && !isfinite(norm)) /* finite gradients whose norm overflows the precision */
        st = sbp_fail(err, SBP_ENUMERIC, "the gradient norm is not finite in %s (%g)",
                      prec_name(prec), norm);
    if (!st) sbp_adamw_step(a, w, gr.grads, lr);
    /* every rank's updated blocks to every other: the same weights everywhere */
    if (!st && held)
        st = sbp_dist_spread(a->comm, w, ps, prec == SBP_FP64 ? 8 : 4, "the updated weights", err);
    r->loss = gr.loss, r->grad_norm = norm, r->lr = lr, r->n_targets = gr.n_targets;
    sbp_grad_result_free(&gr, lg);
    return st;
}
