/* diff.c — two gradient files compared tensor by tensor (see diff.h). */
#include "diff.h"
#include "../src/core/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *sbp_row_status_name(sbp_row_status s) {
    switch (s) {
    case SBP_ROW_OK: return "ok";
    case SBP_ROW_MISMATCH: return "MISMATCH";
    case SBP_ROW_NONFINITE: return "NON-FINITE";
    case SBP_ROW_SHAPE: return "SHAPE";
    case SBP_ROW_MISSING: return "MISSING";
    case SBP_ROW_EXTRA: return "EXTRA";
    }
    return "?";
}

int sbp_promise_holds(const sbp_promise *p, const sbp_diff_row *r) {
    const sbp_tensor_cmp *c = &r->cmp;
    if (p->bitwise && !c->bitwise) return 0;
    if (p->use_ulp && !(c->max_ulp <= p->ulp)) return 0;
    if (p->use_allclose && c->allclose_fail) return 0;
    if (p->use_rel_l2 && !(c->rel_l2 <= p->rel_l2)) return 0;
    return 1;
}

static void shape_text(char *buf, size_t n, const sbp_st_tensor *t) {
    snprintf(buf, n, "[");
    for (int d = 0; d < t->ndim; d++)
        snprintf(buf + strlen(buf), n - strlen(buf), "%s%lld", d ? ", " : "",
                 (long long)t->shape[d]);
    snprintf(buf + strlen(buf), n - strlen(buf), "]");
}

/* The precision ULPs are counted in: the coarser of the two dtypes. */
static sbp_dtype coarser(sbp_dtype a, sbp_dtype b) {
    static const sbp_dtype order[] = {SBP_DT_BF16, SBP_DT_F16, SBP_DT_F32, SBP_DT_F64};
    for (int i = 0; i < 4; i++)
        if (a == order[i] || b == order[i]) return order[i];
    return SBP_DT_F64;
}

static sbp_status read_f64(double **out, const sbp_st_file *sf, const sbp_st_tensor *t,
                           sbp_err *err) {
    if (!sbp_dtype_is_float(t->dtype))
        return sbp_fail(err, SBP_EINPUT,
                        "%s: tensor \"%s\" has dtype %s; gradients must be F64, "
                        "F32, BF16 or F16",
                        sf->path, t->name, sbp_dtype_name(t->dtype));
    *out = malloc(sizeof **out * (size_t)(t->numel ? t->numel : 1));
    if (!*out) return sbp_fail(err, SBP_ENOMEM, "out of memory for \"%s\"", t->name);
    return sbp_st_read(sf, t, *out, SBP_DT_F64, err);
}

static sbp_status compare_pair(sbp_diff_row *r, const sbp_st_file *fa, const sbp_st_tensor *ta,
                               const sbp_st_file *fb, const sbp_st_tensor *tb, const sbp_promise *p,
                               sbp_err *err) {
    r->dtype_a = ta->dtype, r->dtype_b = tb->dtype;
    shape_text(r->shape_a, sizeof r->shape_a, ta);
    shape_text(r->shape_b, sizeof r->shape_b, tb);
    if (strcmp(r->shape_a, r->shape_b) != 0) {
        r->status = SBP_ROW_SHAPE;
        return SBP_OK;
    }
    double *a = NULL, *b = NULL;
    sbp_status st = read_f64(&a, fa, ta, err);
    if (!st) st = read_f64(&b, fb, tb, err);
    if (!st) {
        sbp_compare(&r->cmp, a, b, ta->numel, coarser(ta->dtype, tb->dtype), p->rtol, p->atol);
        if (r->cmp.first_diff >= 0)
            r->a_at_first = a[r->cmp.first_diff], r->b_at_first = b[r->cmp.first_diff];
        r->cmp.bitwise = 0;
        if (ta->dtype == tb->dtype) {
            size_t nb = (size_t)(ta->end - ta->begin);
            unsigned char *ra = malloc(nb ? nb : 1), *rb = malloc(nb ? nb : 1);
            if (!ra || !rb) st = sbp_fail(err, SBP_ENOMEM, "out of memory");
            if (!st) st = sbp_st_read_raw(fa, ta, ra, err);
            if (!st) st = sbp_st_read_raw(fb, tb, rb, err);
            if (!st) r->cmp.bitwise = memcmp(ra, rb, nb) == 0;
            free(ra), free(rb);
        }
        r->status = r->cmp.nonfinite_a        ? SBP_ROW_NONFINITE
                    : sbp_promise_holds(p, r) ? SBP_ROW_OK
                                              : SBP_ROW_MISMATCH;
    }
    free(a), free(b);
    return st;
}

/* The diagnosis of a diff: B is the reference; A claims its own dtype's precision when B is at
 * least as precise (an F32 file against an F64 one is judged as float32, F64 against F64 as
 * float64); a relative-L2 promise is the threshold of the scale rule. */
static void diagnose(sbp_diff *d, const sbp_promise *p) {
    sbp_diag_row *dr = calloc((size_t)d->n + 1, sizeof *dr);
    const char **extra = calloc((size_t)d->n + 1, sizeof *extra);
    int n = 0, n_extra = 0, has_head = 0, has_embed = 0, f64 = 0, f32 = 0, judged = 0;
    if (!dr || !extra) goto out;
    for (int i = 0; i < d->n; i++) {
        const sbp_diff_row *r = &d->rows[i];
        if (r->status == SBP_ROW_EXTRA) {
            extra[n_extra++] = r->name;
            continue;
        }
        has_head |= strcmp(r->name, "lm_head.weight") == 0;
        has_embed |= strcmp(r->name, "model.embed_tokens.weight") == 0;
        sbp_diag_row *x = &dr[n++];
        x->name = r->name;
        sbp_diag_classify(r->name, &x->kind, &x->layer);
        x->missing = r->status == SBP_ROW_MISSING;
        x->shape = r->status == SBP_ROW_SHAPE;
        x->judged = r->status <= SBP_ROW_NONFINITE;
        x->failed = r->status == SBP_ROW_MISMATCH || r->status == SBP_ROW_NONFINITE;
        x->cmp = r->cmp;
        x->budget = p->use_rel_l2 ? p->rel_l2 : 0;
        if (x->judged) {
            judged++;
            f64 += r->dtype_a == SBP_DT_F64 && r->dtype_b == SBP_DT_F64;
            f32 +=
                r->dtype_a == SBP_DT_F32 && (r->dtype_b == SBP_DT_F32 || r->dtype_b == SBP_DT_F64);
        }
    }
    char *end;
    double lb = d->loss_b[0] ? strtod(d->loss_b, &end) : 0;
    sbp_diag_input in = {.claimed = judged && f64 == judged   ? SBP_DIAG_FP64
                                    : judged && f32 == judged ? SBP_DIAG_FP32
                                                              : SBP_DIAG_UNKNOWN,
                         .tied = has_embed ? !has_head : -1,
                         .reference = "B",
                         .extra = extra,
                         .n_extra = n_extra,
                         .their_loss = d->loss_a[0] && d->loss_b[0] ? d->loss_a : NULL,
                         .truth_loss = lb};
    sbp_diagnose(&d->diag, dr, n, &in);
out:
    free(dr), free(extra);
}

sbp_status sbp_diff_files(sbp_diff *d, const char *a, const char *b, const sbp_promise *p,
                          sbp_err *err) {
    memset(d, 0, sizeof *d);
    sbp_st_file fa, fb;
    sbp_status st = sbp_st_open(&fa, a, err);
    if (st) return st;
    if ((st = sbp_st_open(&fb, b, err))) {
        sbp_st_close(&fa);
        return st;
    }
    const char *la = sbp_st_meta(&fa, "loss"), *lb = sbp_st_meta(&fb, "loss");
    snprintf(d->loss_a, sizeof d->loss_a, "%s", la ? la : "");
    snprintf(d->loss_b, sizeof d->loss_b, "%s", lb ? lb : "");
    d->rows = calloc((size_t)(fa.n + fb.n) + 1, sizeof *d->rows);
    if (!d->rows) st = sbp_fail(err, SBP_ENOMEM, "out of memory");
    for (int i = 0; i < fb.n && !st; i++) {
        sbp_diff_row *r = &d->rows[d->n++];
        snprintf(r->name, sizeof r->name, "%s", fb.t[i].name);
        const sbp_st_tensor *ta = sbp_st_find(&fa, fb.t[i].name);
        if (!ta)
            r->status = SBP_ROW_MISSING;
        else
            st = compare_pair(r, &fa, ta, &fb, &fb.t[i], p, err);
    }
    for (int i = 0; i < fa.n && !st; i++)
        if (!sbp_st_find(&fb, fa.t[i].name)) {
            sbp_diff_row *r = &d->rows[d->n++];
            snprintf(r->name, sizeof r->name, "%s", fa.t[i].name);
            r->status = SBP_ROW_EXTRA;
        }
    for (int i = 0; i < d->n; i++) {
        d->n_failed += d->rows[i].status != SBP_ROW_OK;
        d->n_bitwise += d->rows[i].cmp.bitwise;
    }
    if (!st && d->n_failed) diagnose(d, p);
    sbp_st_close(&fa);
    sbp_st_close(&fb);
    if (st) sbp_diff_free(d);
    return st;
}

void sbp_diff_free(sbp_diff *d) {
    free(d->rows);
    memset(d, 0, sizeof *d);
}
