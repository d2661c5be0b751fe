/* fd.c — finite-difference spot checks (see fd.h). */
#include "fd.h"
#include "../src/core/err.h"
#include "../src/core/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Loss at w + t·u, the model restored afterwards from a saved copy (exactly). */
static sbp_status loss_at(double *loss, sbp_model *m, const double *w0, const double *u,
                          int64_t off, int64_t n, double t, const sbp_batch *b,
                          const sbp_grad_opts *opts, sbp_err *err) {
    double *w = m->w;
    for (int64_t i = 0; i < n; i++) w[off + i] = w0[off + i] + t * u[i];
    sbp_grad_result r;
    sbp_status st = sbp_grad(&r, m, b, opts, NULL, err);
    memcpy(w + off, w0 + off, sizeof(double) * (size_t)n);
    if (st) return st;
    *loss = r.loss;
    sbp_grad_result_free(&r, NULL);
    return SBP_OK;
}

/* One direction over parameters [off, off+n): fills the row. */
static sbp_status check_direction(sbp_fd_row *row, sbp_model *m, const double *w0, const double *g,
                                  int64_t off, int64_t n, double h, sbp_rng *rng,
                                  const sbp_batch *b, const sbp_grad_opts *opts, sbp_err *err) {
    double *u = malloc(sizeof *u * (size_t)n), norm = 0;
    if (!u) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) u[i] = sbp_rng_normal(rng), norm += u[i] * u[i];
    norm = sqrt(norm);
    row->analytic = 0;
    for (int64_t i = 0; i < n; i++) u[i] /= norm, row->analytic += g[off + i] * u[i];
    double lp = 0, lm = 0, lp2 = 0, lm2 = 0;
    sbp_status st = loss_at(&lp, m, w0, u, off, n, h, b, opts, err);
    if (!st) st = loss_at(&lm, m, w0, u, off, n, -h, b, opts, err);
    if (!st) st = loss_at(&lp2, m, w0, u, off, n, 2 * h, b, opts, err);
    if (!st) st = loss_at(&lm2, m, w0, u, off, n, -2 * h, b, opts, err);
    free(u);
    if (st) return st;
    row->central = (lp - lm) / (2 * h);
    row->four_point = (8 * (lp - lm) - (lp2 - lm2)) / (12 * h);
    /* The floor keeps a vanishing derivative from turning rounding noise into a large ratio:
     * below it, the error is reported relative to the floor (an absolute error). */
    double scale = fmax(fabs(row->analytic), 1e-8);
    row->err_central = fabs(row->central - row->analytic) / scale;
    row->err_four = fabs(row->four_point - row->analytic) / scale;
    return SBP_OK;
}

sbp_status sbp_fd_check(sbp_fd_report *rep, sbp_model *m, const sbp_batch *b,
                        const sbp_grad_opts *opts, double step, uint64_t seed, sbp_err *err) {
    memset(rep, 0, sizeof *rep);
    if (m->prec != SBP_FP64)
        return sbp_fail(err, SBP_EUSAGE, "finite differences need a float64 model");
    const sbp_params *ps = &m->params;
    sbp_grad_result r;
    sbp_status st = sbp_grad(&r, m, b, opts, NULL, err);
    if (st) return st;
    double *w0 = malloc(sizeof *w0 * (size_t)ps->total);
    rep->rows = calloc((size_t)ps->n + 1, sizeof *rep->rows);
    if (!w0 || !rep->rows) {
        free(w0);
        sbp_grad_result_free(&r, NULL);
        sbp_fd_free(rep);
        return sbp_fail(err, SBP_ENOMEM, "out of memory");
    }
    memcpy(w0, m->w, sizeof *w0 * (size_t)ps->total);
    rep->step = step;
    rep->loss = r.loss;
    sbp_rng rng;
    sbp_rng_seed(&rng, seed);
    for (int i = 0; i <= ps->n && !st; i++) {
        sbp_fd_row *row = &rep->rows[rep->n];
        int all = i == ps->n;
        snprintf(row->name, sizeof row->name, "%s", all ? "(all parameters)" : ps->p[i].name);
        st = check_direction(row, m, w0, r.grads, all ? 0 : ps->p[i].offset,
                             all ? ps->total : ps->p[i].numel, step, &rng, b, opts, err);
        if (st) break;
        rep->worst_four = fmax(rep->worst_four, row->err_four);
        rep->worst_central = fmax(rep->worst_central, row->err_central);
        rep->n++;
    }
    free(w0);
    sbp_grad_result_free(&r, NULL);
    if (st) sbp_fd_free(rep);
    return st;
}

void sbp_fd_free(sbp_fd_report *rep) {
    free(rep->rows);
    memset(rep, 0, sizeof *rep);
}
