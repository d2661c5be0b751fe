/* plan.c — sbp_plan: the ledger of one step without its memory.
 *
 * The float engine runs in planning mode over a batch of B zero-token rows: every buffer the
 * schedule allocates is reserved (never touched) and charged at storage_bytes per element, and
 * every operation of the planning table does nothing, so the ledger sees exactly the allocations
 * and frees of a real run, in the same order. The objective (SFT) runs on the host over the
 * zeros it is handed, as it would over real log-probs. Weights and gradients are charged at the storage size too;
 * AdamW's moments, when asked for, at 4 bytes each. */
#include "../core/objective.h"
#include "../engine/entry.h"
#include "../streambp.h"
#include "../core/err.h"

#include <stdlib.h>
#include <string.h>

sbp_status sbp_plan(sbp_ledger *lg, const sbp_config *cfg, const sbp_plan_opts *o, sbp_err *err) {
    memset(lg, 0, sizeof *lg);
    lg->plan = 1;
    int sb = o->storage_bytes ? o->storage_bytes : 4;
    if (sb != 2 && sb != 4 && sb != 8)
        return sbp_fail(err, SBP_EUSAGE,
                        "storage must be 2 (bf16), 4 (fp32) or 8 (fp64) bytes, not %d", sb);
    if (o->B < 1 || o->T < 1)
        return sbp_fail(err, SBP_EUSAGE, "B and T must be >= 1 (got %d, %d)", o->B, o->T);
    sbp_engine_opts eo;
    sbp_status st = sbp_engine_resolve(&eo, &o->grad, o->T, err);
    if (st) return st;
    eo.plan = 1;
    eo.elem_bytes = sb;
    sbp_model m = {.cfg = *cfg, .prec = SBP_FP32};
    if ((st = sbp_params_build(&m.params, cfg, err))) return st;
    size_t n = (size_t)o->B * (size_t)o->T;
    sbp_batch b = {.B = o->B, .T = o->T};
    sbp_objective sft = {.kind = SBP_OBJ_SFT, .num_items = 1};
    sbp_obj_eval ev = {0};
    b.ids = calloc(n, sizeof *b.ids);
    b.labels = calloc(n, sizeof *b.labels);
    b.mask = calloc(n, 1);
    m.w = sbp_ledger_alloc(lg, SBP_MEM_WEIGHTS, (size_t)sb * (size_t)m.params.total);
    void *grads = sbp_ledger_alloc(lg, SBP_MEM_GRADS, (size_t)sb * (size_t)m.params.total);
    void *adam =
        o->optimizer ? sbp_ledger_alloc(lg, SBP_MEM_OPTIMIZER, 8 * (size_t)m.params.total) : NULL;
    if (!b.ids || !b.labels || !b.mask || !m.w || !grads || (o->optimizer && !adam)) {
        st = sbp_fail(err, SBP_ENOMEM, "out of address space planning %lld parameters",
                      (long long)m.params.total);
    } else if (!(st = sbp_obj_begin(&ev, &sft, &b, err))) {
        double loss = 0;
        eo.ev = &ev;
        st = sbp_engine_grad_f32(&loss, grads, &m, &b, &eo, lg, err);
        sbp_obj_end(&ev);
    }
    sbp_ledger_free(lg, adam);
    sbp_ledger_free(lg, grads);
    sbp_ledger_free(lg, m.w);
    free(b.ids), free(b.labels), free(b.mask);
    sbp_params_free(&m.params);
    return st;
}
