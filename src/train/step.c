/* step.c — one optimizer step of full-weight training: gradient (any schedule, any objective,
 * accumulated over micro-batches), clipping, AdamW. */
#include "../core/err.h"
#include "../streambp.h"

#include <math.h>

sbp_status sbp_train_step(sbp_step_result *r, sbp_model *m, sbp_adamw *a, const sbp_batch *b, int n,
                          const sbp_grad_opts *g, double lr, double max_grad_norm, sbp_ledger *lg,
                          sbp_err *err) {
    r->loss = r->grad_norm = r->lr = 0;
    r->n_targets = 0;
    if (a->n != m->params.total || a->prec != m->prec)
        return sbp_fail(err, SBP_EUSAGE,
                        "the optimizer holds %lld %s elements; the model %lld %s weights",
                        (long long)a->n, a->prec == SBP_FP64 ? "fp64" : "fp32",
                        (long long)m->params.total, m->prec == SBP_FP64 ? "fp64" : "fp32");
    if (!(lr >= 0) || !isfinite(lr))
        return sbp_fail(err, SBP_EUSAGE, "the learning rate must be >= 0 and finite (got %g)", lr);
    if (!(max_grad_norm >= 0) || !isfinite(max_grad_norm))
        return sbp_fail(err, SBP_EUSAGE, "the clipping norm must be >= 0 and finite (got %g)",
                        max_grad_norm);
    sbp_grad_result gr;
    sbp_status st = sbp_grad_batches(&gr, m, b, n, g, lg, err);
    if (st) return st;
    double norm = sbp_clip_grad_norm(gr.grads, m->params.total, m->prec, max_grad_norm);
    if (!isfinite(norm)) { /* finite gradients whose norm overflows the precision */
        sbp_grad_result_free(&gr, lg);
        return sbp_fail(err, SBP_ENUMERIC, "the gradient norm is not finite in %s (%g)",
                        m->prec == SBP_FP64 ? "fp64" : "fp32", norm);
    }
    sbp_adamw_step(a, m->w, gr.grads, lr);
    r->loss = gr.loss, r->grad_norm = norm, r->lr = lr, r->n_targets = gr.n_targets;
    sbp_grad_result_free(&gr, lg);
    return SBP_OK;
}
