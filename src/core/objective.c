/* objective.c — the loss terms of each objective, token by token (see streambp.h).
 * Sums run in ascending token order, so every schedule adds the same terms in the same order. */
#include "../streambp.h"

void sbp_objective_terms(double *loss, double *coef, const sbp_objective *o, const sbp_batch *b,
                         int bi, int s, int M, const double *logp) {
    const int T = b->T;
    const int32_t *labels = b->labels + (size_t)bi * T;
    const double inv_n = 1.0 / (o->num_items > 0 ? o->num_items : (double)b->n_targets);
    for (int r = 0; r < M; r++) {
        int t = s + r;
        coef[r] = 0;
        if (t + 1 >= T || labels[t + 1] == SBP_IGNORE) continue;
        double w = o->target_weight ? o->target_weight[(size_t)bi * T + t] : 1.0;
        *loss -= w * logp[r] * inv_n; /* SFT: L = Σ w·(−logp)/N */
        coef[r] = -w * inv_n;
    }
}
