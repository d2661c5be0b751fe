/* head.c — final RMSNorm, LM head and the objective, in passes of rows, with the backward
 * done pass by pass so that only `rows`·V logits exist at a time (unless the caller hands in a
 * buffer for all of them, as HF's baseline materialises them).
 *
 * For rows [s, e) of sequence b:
 *   hn     = rmsnorm(hL[s:e], w_final)
 *   logits = hn·W_headᵀ / τ                                  (τ: GRPO's temperature)
 *   logp_t = log softmax(logits_t)[labels[t+1]]              (targets shifted inside, as HF)
 *   loss  += the objective's terms, coef_t = dL/dlogp_t
 * and back: dlogits = coef·(onehot − softmax)/τ, dhn = dlogits·W_head, dW_head += dlogitsᵀ·hn,
 * then the final-norm backward into dh. DPO first runs the same forward without the backward
 * over every row, to learn each pair's factor (objective.h). The loss is summed term by term in
 * ascending (sequence, token) order, the same in every schedule. */
#include "../core/objective.h"
#include "engine.h"

#include <string.h>

typedef struct {
    real *hn, *dhn, *rstd;     /* (rows, C), (rows, C), (rows) */
    double *logp, *lse, *coef; /* (rows) each */
    int32_t *tgt;              /* (rows) target id, or −1 */
} head_work;

/* hn and the (temperature-scaled) logits of rows [s, end) of sequence bi; the targets. */
static void head_forward(const eng *e, head_work *w, real *z, const real *h_s, const sbp_batch *b,
                         int bi, int s, int end, double inv_tau) {
    const int M = end - s, C = e->C, V = e->V, T = e->T;
    const int32_t *labels = b->labels + (size_t)bi * T;
    rmsnorm_forward(w->hn, w->rstd, h_s, e->fnorm, M, C, e->cfg->eps);
    bf16(e, w->hn, (size_t)M * C);
    linear_forward(z, w->hn, e->head, NULL, s, end, V, C, e->blk);
    bf16(e, z, (size_t)M * V); /* HF upcasts bf16 logits to float for the loss */
    if (inv_tau != 1)
        for (size_t i = 0; i < (size_t)M * V; i++) z[i] *= (real)inv_tau;
    for (int r = 0; r < M; r++) {
        int y = s + r + 1 < T ? labels[s + r + 1] : SBP_IGNORE;
        w->tgt[r] = y == SBP_IGNORE ? -1 : y;
    }
    logprob_forward(w->logp, w->lse, z, w->tgt, M, V);
}

int head_step(eng *e, double *loss, real *dh, const real *hL, const sbp_batch *b, real *logits,
              size_t stride_b, int rows, sbp_obj_eval *ev, int needs_logps) {
    const int T = e->T, C = e->C, V = e->V;
    head_work w;
    w.hn = ealloc(e, SBP_MEM_LOGITS, (size_t)rows * C, "final-norm output");
    w.dhn = ealloc(e, SBP_MEM_LOGITS, (size_t)rows * C, "final-norm output gradient");
    w.rstd = ealloc(e, SBP_MEM_LOGITS, (size_t)rows, "final-norm rstd");
    double *row = ealloc_bytes(e, SBP_MEM_LOGITS, 3 * sizeof(double) * rows, "per-row log-probs");
    w.tgt = ealloc_bytes(e, SBP_MEM_LOGITS, sizeof(int32_t) * rows, "targets");
    double *logp_all = needs_logps
                           ? ealloc_bytes(e, SBP_MEM_LOGITS, sizeof(double) * (size_t)b->B * T,
                                          "log-probs of every target")
                           : NULL;
    if (e->oom || e->plan) goto out;
    w.logp = row, w.lse = row + rows, w.coef = row + 2 * (size_t)rows;
    const double inv_tau = ev->inv_tau;
    if (needs_logps) { /* DPO's first pass: forward only, every target's log-prob */
        for (int bi = 0; bi < b->B; bi++)
            for (int s = 0, end; s < T; s = end) {
                end = s + rows < T ? s + rows : T;
                real *z = logits + stride_b * bi + (stride_b ? (size_t)s * V : 0);
                head_forward(e, &w, z, hL + ((size_t)bi * T + s) * C, b, bi, s, end, inv_tau);
                memcpy(logp_all + (size_t)bi * T + s, w.logp, sizeof(double) * (end - s));
            }
        sbp_obj_prepare(ev, loss, logp_all);
    }
    for (int bi = 0; bi < b->B; bi++) {
        for (int s = 0, end; s < T; s = end) {
            end = s + rows < T ? s + rows : T;
            const int M = end - s;
            const real *h_s = hL + ((size_t)bi * T + s) * C;
            real *z = logits + stride_b * bi + (stride_b ? (size_t)s * V : 0);
            head_forward(e, &w, z, h_s, b, bi, s, end, inv_tau);
            sbp_obj_terms(ev, loss, w.coef, bi, s, M, w.logp);
            /* the gradient of the scaled logits, then through the scaling by 1/τ */
            for (int r = 0; r < M; r++) w.coef[r] *= inv_tau;
            logprob_backward(z, w.coef, w.lse, w.tgt, M, V);
            bf16(e, z, (size_t)M * V);
            memset(w.dhn, 0, sizeof(real) * (size_t)M * C);
            linear_backward(w.dhn, e->ghead, NULL, z, w.hn, e->head, s, end, V, C, e->blk);
            bf16(e, w.dhn, (size_t)M * C);
            real *dh_s = dh + ((size_t)bi * T + s) * C;
            rmsnorm_backward(dh_s, e->gfnorm, w.dhn, h_s, w.rstd, e->fnorm, M, C);
            bf16(e, dh_s, (size_t)M * C);
        }
    }
out:
    efree(e, w.hn), efree(e, w.dhn), efree(e, w.rstd), efree(e, row), efree(e, w.tgt);
    efree(e, logp_all);
    return !e->oom;
}

int head_logprobs(eng *e, double *logp, const real *hL, const sbp_batch *b, int rows,
                  double inv_tau) {
    const int T = e->T, C = e->C, V = e->V;
    head_work w = {0};
    w.hn = ealloc(e, SBP_MEM_LOGITS, (size_t)rows * C, "final-norm output");
    w.rstd = ealloc(e, SBP_MEM_LOGITS, (size_t)rows, "final-norm rstd");
    real *z = ealloc(e, SBP_MEM_LOGITS, (size_t)rows * V, "logits chunk");
    double *lse = ealloc_bytes(e, SBP_MEM_LOGITS, sizeof(double) * rows, "per-row lse");
    w.tgt = ealloc_bytes(e, SBP_MEM_LOGITS, sizeof(int32_t) * rows, "targets");
    if (!e->oom && !e->plan) {
        w.lse = lse;
        for (int bi = 0; bi < b->B; bi++)
            for (int s = 0, end; s < T; s = end) {
                end = s + rows < T ? s + rows : T;
                w.logp = logp + (size_t)bi * T + s;
                head_forward(e, &w, z, hL + ((size_t)bi * T + s) * C, b, bi, s, end, inv_tau);
            }
    }
    efree(e, w.hn), efree(e, w.rstd), efree(e, z), efree(e, lse), efree(e, w.tgt);
    return !e->oom;
}
