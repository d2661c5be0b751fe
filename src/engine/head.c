/* head.c — final RMSNorm, LM head and the SFT objective, in passes of rows, with the backward
 * done pass by pass so that only `rows`·V logits exist at a time (unless the caller hands in a
 * buffer for all of them, as HF's baseline materialises them).
 *
 * For rows [s, e) of sequence b:
 *   hn     = rmsnorm(hL[s:e], w_final)
 *   logits = hn·W_headᵀ
 *   logp_t = log softmax(logits_t)[labels[t+1]]           (targets shifted inside, as HF does)
 *   loss  += the objective's terms (SFT: −Σ_t w_t·logp_t / N), coef = dL/dlogp
 * and back: dlogits = coef·(onehot − softmax), dhn = dlogits·W_head,
 * dW_head += dlogitsᵀ·hn, then the final-norm backward into dh. The loss is summed in double in
 * ascending (sequence, token) order, the same in every schedule. */
#include "engine.h"

#include <string.h>

int head_step(eng *e, double *loss, real *dh, const real *hL, const sbp_batch *b, real *logits,
              size_t stride_b, int rows, const sbp_objective *obj) {
    const int T = e->T, C = e->C, V = e->V;
    real *hn = ealloc(e, SBP_MEM_LOGITS, (size_t)rows * C, "final-norm output");
    real *dhn = ealloc(e, SBP_MEM_LOGITS, (size_t)rows * C, "final-norm output gradient");
    real *rstd = ealloc(e, SBP_MEM_LOGITS, (size_t)rows, "final-norm rstd");
    double *row = ealloc_bytes(e, SBP_MEM_LOGITS, 3 * sizeof(double) * rows, "per-row log-probs");
    int32_t *tgt = ealloc_bytes(e, SBP_MEM_LOGITS, sizeof(int32_t) * rows, "targets");
    if (e->oom || e->plan) goto out;
    double *logp = row, *lse = row + rows, *coef = row + 2 * (size_t)rows;
    for (int bi = 0; bi < b->B; bi++) {
        const int32_t *labels = b->labels + (size_t)bi * T;
        for (int s = 0, end; s < T; s = end) {
            end = s + rows < T ? s + rows : T;
            const int M = end - s;
            const real *h_s = hL + ((size_t)bi * T + s) * C;
            real *z = logits + stride_b * bi + (stride_b ? (size_t)s * V : 0);
            rmsnorm_forward(hn, rstd, h_s, e->fnorm, M, C, e->cfg->eps);
            bf16(e, hn, (size_t)M * C);
            linear_forward(z, hn, e->head, NULL, s, end, V, C, e->blk);
            bf16(e, z, (size_t)M * V); /* HF upcasts bf16 logits to float for the loss */
            for (int r = 0; r < M; r++) tgt[r] = s + r + 1 < T ? labels[s + r + 1] : -1;
            for (int r = 0; r < M; r++)
                if (tgt[r] == SBP_IGNORE) tgt[r] = -1;
            logprob_forward(logp, lse, z, tgt, M, V);
            sbp_objective_terms(loss, coef, obj, b, bi, s, M, logp);
            logprob_backward(z, coef, lse, tgt, M, V);
            bf16(e, z, (size_t)M * V);
            memset(dhn, 0, sizeof(real) * (size_t)M * C);
            linear_backward(dhn, e->ghead, NULL, z, hn, e->head, s, end, V, C, e->blk);
            bf16(e, dhn, (size_t)M * C);
            real *dh_s = dh + ((size_t)bi * T + s) * C;
            rmsnorm_backward(dh_s, e->gfnorm, dhn, h_s, rstd, e->fnorm, M, C);
            bf16(e, dh_s, (size_t)M * C);
        }
    }
out:
    efree(e, hn), efree(e, dhn), efree(e, rstd), efree(e, row), efree(e, tgt);
    return !e->oom;
}
