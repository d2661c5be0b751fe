/* reference.c — a reference model's log-probs for DPO and GRPO (sbp_batch_set_reference). */
#include "../streambp.h"
#include "../core/err.h"

#include <stdlib.h>

sbp_status sbp_batch_set_reference(sbp_batch *b, const sbp_model *ref, const sbp_objective *o,
                                   const sbp_grad_opts *g, sbp_ledger *lg, sbp_err *err) {
    if (o->kind == SBP_OBJ_SFT) return sbp_fail(err, SBP_EUSAGE, "SFT has no reference model");
    const int B = b->B, T = b->T;
    double *logp = malloc(sizeof(double) * (size_t)B * T);
    if (!logp) return sbp_fail(err, SBP_ENOMEM, "out of memory");
#ifdef SBP_PLANT_REF_IGNORES_TEMPERATURE
    double tau = 1; /* planted bug (tests/test_plant.c); never in a normal build */
#else
    double tau = o->kind == SBP_OBJ_GRPO && o->temperature ? o->temperature : 1;
#endif
    sbp_status st = sbp_logprobs(logp, ref, b, g, tau, lg, err);
    if (st) {
        free(logp);
        return st;
    }
    if (o->kind == SBP_OBJ_GRPO) {
        free(b->ref_logps);
        b->ref_logps = logp;
        return SBP_OK;
    }
    double *seq = calloc((size_t)B, sizeof *seq); /* DPO: the row statistic */
    if (!seq) {
        free(logp);
        return sbp_fail(err, SBP_ENOMEM, "out of memory");
    }
    for (int r = 0; r < B; r++) {
        int n = 0;
        for (int t = 0; t + 1 < T; t++)
            if (b->labels[(size_t)r * T + t + 1] != SBP_IGNORE)
                seq[r] += logp[(size_t)r * T + t], n++;
        if (o->dpo_loss == SBP_DPO_IPO && n) seq[r] /= n;
    }
    free(logp);
    free(b->ref_seq_logps);
    b->ref_seq_logps = seq;
    return SBP_OK;
}
