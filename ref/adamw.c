/* adamw.c — the optimizer's oracle: AdamW, global-norm clipping and the warm-up schedules in
 * float64, written from the documentation of the PyTorch and transformers functions the
 * library claims to match, not from src/train (whose operation order is torch's kernels'):
 *
 *   torch.optim.AdamW (docs, "Algorithm"), step t from 1:
 *       θ ← θ − γλθ
 *       m ← β1·m + (1 − β1)·g
 *       v ← β2·v + (1 − β2)·g²
 *       m̂ = m / (1 − β1^t),  v̂ = v / (1 − β2^t)
 *       θ ← θ − γ·m̂ / (√v̂ + ε)
 *   torch.nn.utils.clip_grad_norm_: total = ‖(‖g_1‖, ‖g_2‖, ...)‖ over the tensors,
 *       g ← g · min(1, max_norm / (total + 1e-6))
 *   transformers get_{cosine,linear,constant}_schedule_with_warmup, step k from 0:
 *       k < warmup: k / max(1, warmup); else with p = (k − warmup) / max(1, total − warmup):
 *       cosine max(0, ½(1 + cos(π·p))), linear max(0, (total − k) / max(1, total − warmup)),
 *       constant 1.
 * Two readings of the library's own documentation (streambp.h) are kept: max_norm 0 means no
 * clipping (torch would zero the gradient), and the weight decay skips the elements whose
 * decay flag is 0 (HF Trainer's second parameter group). */
#include "ref.h"

#include <math.h>

double ref_lr_at(sbp_lr_kind kind, double peak, int64_t warmup, int64_t total, int64_t k) {
    if (k < warmup) return peak * ((double)k / (double)(warmup > 1 ? warmup : 1));
    double span = (double)(total - warmup > 1 ? total - warmup : 1);
    double p = (double)(k - warmup) / span;
    double f = 1;
    if (kind == SBP_LR_COSINE) f = fmax(0.0, 0.5 * (1.0 + cos(M_PI * p)));
    if (kind == SBP_LR_LINEAR) f = fmax(0.0, (double)(total - k) / span);
    return peak * f;
}

double ref_clip_grad_norm(double *g, const sbp_params *ps, double max_norm) {
    double total = 0;
    for (int i = 0; i < ps->n; i++) {
        double s = 0;
        for (int64_t j = 0; j < ps->p[i].numel; j++) {
            double x = g[ps->p[i].offset + j];
            s += x * x;
        }
        double norm_i = sqrt(s);
        total += norm_i * norm_i;
    }
    total = sqrt(total);
    double coef = max_norm / (total + 1e-6);
    if (max_norm > 0 && coef < 1)
        for (int64_t j = 0; j < ps->total; j++) g[j] *= coef;
    return total;
}

void ref_adamw_step(double *p, double *m, double *v, const double *g, const unsigned char *decay,
                    int64_t n, int64_t t, const sbp_adamw_opts *o, double lr) {
    double b1 = o->beta1, b2 = o->beta2;
    for (int64_t i = 0; i < n; i++) {
        if (decay[i]) p[i] = p[i] - lr * o->weight_decay * p[i];
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        double mhat = m[i] / (1 - pow(b1, (double)t));
        double vhat = v[i] / (1 - pow(b2, (double)t));
        p[i] = p[i] - lr * mhat / (sqrt(vhat) + o->eps);
    }
}
