/* grad.c — sbp_grad: resolves the options (defaults, clamping, checks) and dispatches to the
 * float or double engine. */
#include "../engine/entry.h"
#include "../streambp.h"
#include "err.h"

#include <math.h>
#include <omp.h>
#include <string.h>

void openblas_set_num_threads(int n); /* from OpenBLAS; not in every cblas.h */

void sbp_set_threads(int n) {
    if (n < 1) n = 1;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

const char *sbp_schedule_name(sbp_schedule s) {
    return s == SBP_FULL ? "full" : s == SBP_CKPT ? "ckpt" : s == SBP_STREAM ? "stream" : "?";
}

int sbp_schedule_parse(const char *s, sbp_schedule *out) {
    if (strcmp(s, "full") == 0)
        *out = SBP_FULL;
    else if (strcmp(s, "ckpt") == 0)
        *out = SBP_CKPT;
    else if (strcmp(s, "stream") == 0)
        *out = SBP_STREAM;
    else
        return 0;
    return 1;
}

static int clamp(int v, int hi) {
    return v < hi ? v : hi;
}

sbp_status sbp_engine_resolve(sbp_engine_opts *eo, const sbp_grad_opts *opts, int T, sbp_err *err) {
    memset(eo, 0, sizeof *eo);
    if (opts->block < 0 || opts->chunk < 0 || opts->logit_chunk < 0)
        return sbp_fail(err, SBP_EUSAGE,
                        "block, chunk and logit chunk must be positive (got %d, %d, %d)",
                        opts->block, opts->chunk, opts->logit_chunk);
    if ((unsigned)opts->schedule > SBP_STREAM)
        return sbp_fail(err, SBP_EUSAGE, "unknown schedule %d", (int)opts->schedule);
    if (T < 1) return sbp_fail(err, SBP_EINPUT, "the batch has T = 0 tokens");
    eo->schedule = opts->schedule;
    eo->objective = opts->objective;
    eo->emulate_bf16 = opts->emulate_bf16;
    eo->block = opts->block ? opts->block : SBP_DEFAULT_BLOCK;
    eo->chunk = clamp(opts->chunk ? opts->chunk : 4 * eo->block, T);
    eo->materialise = opts->schedule != SBP_STREAM && !opts->chunked_logits;
    eo->logit_chunk = clamp(opts->logit_chunk ? opts->logit_chunk : eo->block, T);
    if (eo->materialise) eo->logit_chunk = T;
    return SBP_OK;
}

sbp_status sbp_grad(sbp_grad_result *res, const sbp_model *m, const sbp_batch *b,
                    const sbp_grad_opts *opts, sbp_ledger *lg, sbp_err *err) {
    memset(res, 0, sizeof *res);
    sbp_engine_opts eo;
    sbp_status st = sbp_engine_resolve(&eo, opts, b->T, err);
    if (st) return st;
    const sbp_objective *ob = &opts->objective;
    if (!(ob->num_items >= 0) || !isfinite(ob->num_items))
        return sbp_fail(err, SBP_EUSAGE, "the objective's num_items must be >= 0 and finite");
    if (opts->emulate_bf16 && m->prec != SBP_FP32)
        return sbp_fail(err, SBP_EUSAGE, "bf16 emulation runs on the float32 engine");
    if (b->n_targets == 0 && ob->num_items == 0)
        return sbp_fail(err, SBP_EINPUT,
                        b->T == 1 ? "the batch has no valid target: with T = 1 no position has a "
                                    "next token to predict"
                                  : "the batch has no valid target: every shifted label is -100, "
                                    "so the mean loss is undefined (HF would return NaN)");
    size_t esz = m->prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    res->grads = sbp_ledger_alloc(lg, SBP_MEM_GRADS, esz * (size_t)m->params.total);
    if (!res->grads)
        return sbp_fail(err, SBP_ENOMEM, "out of memory for the gradients (%lld parameters)",
                        (long long)m->params.total);
    st = m->prec == SBP_FP64 ? sbp_engine_grad_f64(&res->loss, res->grads, m, b, &eo, lg, err)
                             : sbp_engine_grad_f32(&res->loss, res->grads, m, b, &eo, lg, err);
    if (st) {
        sbp_grad_result_free(res, lg);
        return st;
    }
    res->n_targets = b->n_targets;
    res->block = eo.block, res->chunk = eo.chunk, res->logit_chunk = eo.logit_chunk;
    return SBP_OK;
}

void sbp_grad_result_free(sbp_grad_result *res, sbp_ledger *lg) {
    sbp_ledger_free(lg, res->grads);
    memset(res, 0, sizeof *res);
}
