/* audit.c — another implementation's gradients judged per tensor (see audit.h). */
#include "audit.h"
#include "../ref/ref.h"
#include "../src/core/err.h"
#include "../src/io/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The smallest budget, whatever our own run achieves: a few units of the precision. */
static double budget_floor(sbp_theirs_precision p) {
    return p == SBP_THEIRS_FP64 ? 1e-13 : p == SBP_THEIRS_FP32 ? 1e-7 : 1e-3;
}

const char *sbp_audit_status_name(int status) {
    static const char *names[] = {"ok", "OVER BUDGET", "NON-FINITE", "SHAPE", "MISSING"};
    return status >= 0 && status <= 4 ? names[status] : "?";
}

/* truth (doubles) and our own run at their precision (as doubles), same layout. */
static sbp_status truth_and_ours(sbp_audit_report *rep, double *truth, double *ours,
                                 const sbp_audit_opts *o, sbp_model *m64, const sbp_batch *b,
                                 sbp_err *err) {
    sbp_grad_opts g = {.schedule = SBP_FULL, .block = o->block};
    sbp_grad_result r;
    sbp_status st;
    const int64_t n = m64->params.total;
    if (o->no_ref) {
        rep->truth = "float64 full BP";
        if ((st = sbp_grad(&r, m64, b, &g, NULL, err))) return st;
        memcpy(truth, r.grads, sizeof(double) * (size_t)n);
        rep->truth_loss = r.loss;
        sbp_grad_result_free(&r, NULL);
    } else { /* from the files, read by the oracle itself */
        rep->truth = "ref/ float64 oracle";
        ref_model rm;
        double *tg;
        sbp_objective sft = {.kind = SBP_OBJ_SFT};
        if ((st = ref_truth_files(&rep->truth_loss, &tg, &rm, o->model, o->batch, &sft, 1, NULL, 0,
                                  NULL, 0, err)))
            return st;
        for (int i = 0; i < m64->params.n && !st; i++) {
            const sbp_param *p = &m64->params.p[i];
            int j = sbp_params_find(&rm.ps, p->name);
            if (j < 0 || rm.ps.p[j].numel != p->numel)
                st = sbp_fail(err, SBP_EINPUT,
                              "%s: the oracle's reading of the model has no tensor \"%s\" of "
                              "the library's shape",
                              o->model, p->name);
            else
                memcpy(truth + p->offset, tg + rm.ps.p[j].offset,
                       sizeof(double) * (size_t)p->numel);
        }
        free(tg);
        ref_model_free(&rm);
        if (st) return st;
    }
    if (o->precision == SBP_THEIRS_FP64) {
        if ((st = sbp_grad(&r, m64, b, &g, NULL, err))) return st;
        memcpy(ours, r.grads, sizeof(double) * (size_t)n);
    } else {
        sbp_model m32;
        if ((st = sbp_model_load(&m32, o->model, SBP_FP32, NULL, err))) return st;
        if (o->precision == SBP_THEIRS_BF16) sbp_model_round_bf16(&m32), g.emulate_bf16 = 1;
        st = sbp_grad(&r, &m32, b, &g, NULL, err);
        sbp_model_free(&m32, NULL);
        if (st) return st;
        for (int64_t i = 0; i < n; i++) ours[i] = ((const float *)r.grads)[i];
    }
    rep->our_loss = r.loss;
    sbp_grad_result_free(&r, NULL);
    return SBP_OK;
}

sbp_status sbp_audit(sbp_audit_report *rep, const sbp_audit_opts *o, sbp_err *err) {
    memset(rep, 0, sizeof *rep);
    const double slack = o->slack > 0 ? o->slack : 4;
    sbp_model m64;
    sbp_batch b = {0};
    sbp_st_file sf = {0};
    double *truth = NULL, *ours = NULL, *theirs = NULL;
    sbp_status st = sbp_model_load(&m64, o->model, SBP_FP64, NULL, err);
    if (st) return st;
    const sbp_params *ps = &m64.params;
    if ((st = sbp_batch_load(&b, o->batch, &m64.cfg, err)) ||
        (st = sbp_st_open(&sf, o->grads, err)))
        goto out;
    truth = malloc(sizeof(double) * (size_t)ps->total);
    ours = malloc(sizeof(double) * (size_t)ps->total);
    rep->rows = calloc((size_t)ps->n, sizeof *rep->rows);
    if (!truth || !ours || !rep->rows) {
        st = sbp_fail(err, SBP_ENOMEM, "out of memory");
        goto out;
    }
    if ((st = truth_and_ours(rep, truth, ours, o, &m64, &b, err))) goto out;
    const char *tl = sbp_st_meta(&sf, "loss");
    snprintf(rep->their_loss, sizeof rep->their_loss, "%s", tl ? tl : "");
    rep->n = ps->n;
    for (int i = 0; i < ps->n && !st; i++) {
        const sbp_param *p = &ps->p[i];
        sbp_audit_row *row = &rep->rows[i];
        snprintf(row->name, sizeof row->name, "%s", p->name);
        sbp_tensor_cmp oc;
        sbp_compare(&oc, ours + p->offset, truth + p->offset, p->numel, SBP_DT_F64, 0, 0);
        row->ours_rel_l2 = oc.rel_l2;
        row->budget = slack * fmax(oc.rel_l2, budget_floor(o->precision));
        const sbp_st_tensor *t = sbp_st_find(&sf, p->name);
        if (!t) {
            row->status = 4;
            continue;
        }
        int same = t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same) {
            snprintf(row->shape, sizeof row->shape, "%d-D", t->ndim);
            row->status = 3;
            continue;
        }
        if (!sbp_dtype_is_float(t->dtype)) {
            st = sbp_fail(err, SBP_EINPUT, "%s: tensor \"%s\" has dtype %s, not a float dtype",
                          o->grads, p->name, sbp_dtype_name(t->dtype));
            break;
        }
        free(theirs);
        if (!(theirs = malloc(sizeof(double) * (size_t)p->numel))) {
            st = sbp_fail(err, SBP_ENOMEM, "out of memory");
            break;
        }
        if ((st = sbp_st_read(&sf, t, theirs, SBP_DT_F64, err))) break;
        sbp_compare(&row->theirs, theirs, truth + p->offset, p->numel, t->dtype, 0, 0);
        row->status = row->theirs.nonfinite_a ? 2 : row->theirs.rel_l2 <= row->budget ? 0 : 1;
    }
    for (int i = 0; i < sf.n && !st; i++)
        if (sbp_params_find(ps, sf.t[i].name) < 0 &&
            strlen(rep->extra) + strlen(sf.t[i].name) + 3 < sizeof rep->extra)
            snprintf(rep->extra + strlen(rep->extra), sizeof rep->extra - strlen(rep->extra),
                     "%s%s", rep->extra[0] ? ", " : "", sf.t[i].name);
    for (int i = 0; i < rep->n; i++) rep->failed += rep->rows[i].status != 0;
out:
    free(truth), free(ours), free(theirs);
    sbp_st_close(&sf);
    sbp_batch_free(&b);
    sbp_model_free(&m64, NULL);
    if (st) sbp_audit_free(rep);
    return st;
}

void sbp_audit_free(sbp_audit_report *rep) {
    free(rep->rows);
    memset(rep, 0, sizeof *rep);
}
