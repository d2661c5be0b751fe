/* selftest.c — faults planted into the verifier's own inputs, each of which a comparison must
 * flag (see selftest.h). */
#include "selftest.h"
#include "../ref/ref.h"
#include "../src/core/err.h"
#include "audit.h"
#include "diff.h"
#include "digest.h"
#include "matrix.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The budgets as docs/verify.md states them, written again here rather than read from the
 * verifier: a verifier whose budget has been loosened lets a fault of 4 × these through. */
#define DOC_TOL64     1e-10 /* fp64 vs truth */
#define DOC_SLACK     4.0   /* fp32 vs truth: slack × the oracle's float32 loops' own error */
#define DOC_FLOOR32   1e-7  /* ... with this floor */
#define DOC_RAGGED32  1e-5  /* ragged chunks against full BP */
#define DOC_RAGGED64  2e-14
#define FAULT_FACTOR  4.0 /* each fault is this many times the budget it must break */
#define BLOCK         4   /* the token block of the self-test's runs (T = 24: six blocks) */
#define ALIGNED_CHUNK 8
#define RAGGED_CHUNK  7

/* What the faults are sized by: the truth, its norms, the fp32 budget per tensor, and our own
 * float32 and float64 full-BP gradients (the files' contents and the fp32-as-fp64 fault). */
typedef struct {
    const sbp_params *ps; /* the library's table (m64's) */
    double *truth, *norm, *budget32;
    float *g32;
    double *g64;
    int at;       /* the tensor the element faults are planted in */
    int sw[2];    /* the two tensors of one shape the swap exchanges */
    int64_t elem; /* the element, from the start of the slab */
} base_data;

enum { F_ADD, F_ULP, F_SWAP, F_REPLACE };

typedef struct {
    int kind, roles, precs;
    int64_t at, at2, n; /* element (F_ADD, F_ULP); the swapped tensors' offsets and numel */
    double delta[2];    /* added to the element, by precision */
    const float *f32;   /* F_REPLACE: the float32 gradient every float64 run is given */
    int64_t total;
} fault;

static void plant_fn(void *ctx, void *g, sbp_precision p, int role) {
    const fault *f = ctx;
    if (!(f->precs & (1 << p)) || !(role & f->roles)) return;
    float *gf = g;
    double *gd = g;
    switch (f->kind) {
    case F_ADD:
        if (p == SBP_FP64)
            gd[f->at] += f->delta[SBP_FP64];
        else
            gf[f->at] = (float)(gf[f->at] + f->delta[SBP_FP32]);
        break;
    case F_ULP:
        if (p == SBP_FP64)
            gd[f->at] = nextafter(gd[f->at], INFINITY);
        else
            gf[f->at] = nextafterf(gf[f->at], INFINITY);
        break;
    case F_SWAP:
        for (int64_t i = 0; i < f->n; i++) {
            if (p == SBP_FP64) {
                double t = gd[f->at + i];
                gd[f->at + i] = gd[f->at2 + i], gd[f->at2 + i] = t;
            } else {
                float t = gf[f->at + i];
                gf[f->at + i] = gf[f->at2 + i], gf[f->at2 + i] = t;
            }
        }
        break;
    case F_REPLACE:
        if (p == SBP_FP64)
            for (int64_t i = 0; i < f->total; i++) gd[i] = f->f32[i];
        break;
    }
}

static sbp_selftest_row *add_row(sbp_selftest_report *rep, const char *check, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static sbp_selftest_row *add_row(sbp_selftest_report *rep, const char *check, const char *fmt,
                                 ...) {
    sbp_selftest_row *r = &rep->rows[rep->n < SBP_SELFTEST_MAX ? rep->n++ : SBP_SELFTEST_MAX - 1];
    memset(r, 0, sizeof *r);
    snprintf(r->check, sizeof r->check, "%s", check);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->fault, sizeof r->fault, fmt, ap);
    va_end(ap);
    return r;
}

static void finish(sbp_selftest_report *rep, sbp_selftest_row *r, int ok) {
    r->ok = ok;
    rep->failed += !ok;
}

/* The matrix on the self-test's model with fault f planted (NULL: none). */
static sbp_status matrix(sbp_verify_report *rep, const sbp_selftest_opts *so, const fault *f,
                         int precs, int nums, int chunk, int threads, sbp_err *err) {
    sbp_verify_fault pl = {plant_fn, (void *)f};
    sbp_verify_opts o = {.model = so->model,
                         .batch = so->batch,
                         .block = BLOCK,
                         .chunks = {chunk},
                         .n_chunks = 1,
                         .schedules = (1 << SBP_FULL) | (1 << SBP_STREAM),
                         .precisions = precs,
                         .numerics = nums,
                         .threads = {1, 2},
                         .n_threads = threads,
                         .fault = f ? &pl : NULL};
    return sbp_verify_run(rep, &o, err);
}

static int in_set(int i, const int *set, int n) {
    for (int k = 0; k < n; k++)
        if (set[k] == i || set[k] < 0) return 1;
    return 0;
}

/* Whether each group of `must` flags every tensor of `planted` (-1: every tensor) and no group
 * flags any other; what was seen goes to r->seen. */
static int judge(sbp_selftest_row *r, const sbp_verify_report *rep, const int *must, int n_must,
                 const int *planted, int n_planted) {
    size_t len = 0;
    int ok = 1;
    for (int k = 0; k < n_must; k++) {
        const sbp_verify_group *g = &rep->g[must[k]];
        int flagged = 0, want = 0;
        const sbp_verify_row *shown = NULL;
        for (int i = 0; i < g->n_rows; i++) {
            if (!in_set(i, planted, n_planted)) continue;
            want++, flagged += g->rows[i].failed > 0;
            if (!shown || (!g->rows[i].failed && shown->failed)) shown = &g->rows[i];
        }
        ok &= flagged == want && want > 0;
        if (!shown) continue;
        if (shown->budget > 0)
            len += (size_t)snprintf(r->seen + len, sizeof r->seen - len,
                                    "%s%s %s %d/%d (rel L2 %.2g, budget %.2g)", k ? "; " : "",
                                    g->title, flagged == want ? "flagged" : "MISSED", flagged, want,
                                    shown->rel_l2, shown->budget);
        else
            len += (size_t)snprintf(r->seen + len, sizeof r->seen - len,
                                    "%s%s %s %d/%d (bitwise in %d/%d runs)", k ? "; " : "",
                                    g->title, flagged == want ? "flagged" : "MISSED", flagged, want,
                                    shown->bitwise_runs, shown->runs);
        if (len >= sizeof r->seen) len = sizeof r->seen - 1;
    }
    for (int gi = 0; gi < SBP_VG_N; gi++)
        for (int i = 0; i < rep->g[gi].n_rows; i++)
            if (rep->g[gi].rows[i].failed && !in_set(i, planted, n_planted)) {
                if (ok)
                    len += (size_t)snprintf(r->seen + len, sizeof r->seen - len,
                                            "%sbut %s also flags the unplanted %s", len ? "; " : "",
                                            rep->g[gi].title, rep->g[gi].rows[i].name);
                ok = 0;
                if (len >= sizeof r->seen) len = sizeof r->seen - 1;
            }
    if (rep->load_notes[0]) {
        ok = 0;
        snprintf(r->seen + len, sizeof r->seen - len, "%sloading: %.120s", len ? "; " : "",
                 rep->load_notes);
    }
    return ok;
}

/* One matrix fault: run it, judge it. */
static sbp_status matrix_fault(sbp_selftest_report *rep, sbp_selftest_row *r,
                               const sbp_selftest_opts *so, const fault *f, int precs, int nums,
                               int chunk, int threads, const int *must, int n_must,
                               const int *planted, int n_planted, sbp_err *err) {
    sbp_verify_report vr;
    sbp_status st = matrix(&vr, so, f, precs, nums, chunk, threads, err);
    if (st) return st;
    finish(rep, r, judge(r, &vr, must, n_must, planted, n_planted));
    sbp_verify_report_free(&vr);
    return SBP_OK;
}

/* The truth, its norms and the fp32 budget by the documented rule, from the oracle; our float32
 * and float64 full-BP gradients; the tensors the faults aim at. */
static sbp_status base_make(base_data *bd, const sbp_model *m32, const sbp_model *m64,
                            const sbp_batch *b32, const sbp_batch *b64, const sbp_selftest_opts *so,
                            sbp_err *err) {
    const sbp_params *ps = &m64->params;
    const sbp_objective obj = {0};
    memset(bd, 0, sizeof *bd);
    bd->ps = ps;
    bd->truth = calloc((size_t)ps->total, sizeof(double));
    bd->norm = calloc((size_t)ps->n, sizeof(double));
    bd->budget32 = calloc((size_t)ps->n, sizeof(double));
    if (!bd->truth || !bd->norm || !bd->budget32) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    double *t[2] = {NULL, NULL}, loss;
    sbp_status st = SBP_OK;
    for (int f32 = 0; f32 < 2 && !st; f32++) {
        ref_model rm;
        const ref_files rf = {
            .model_dir = so->model, .batch_path = so->batch, .o = &obj, .f32 = f32};
        if ((st = ref_truth_files(&loss, &t[f32], &rm, NULL, &rf, NULL, 0, err))) break;
        for (int i = 0; i < ps->n && !st; i++) {
            const int j = sbp_params_find(&rm.ps, ps->p[i].name);
            if (j < 0 || rm.ps.p[j].numel != ps->p[i].numel)
                st = sbp_fail(err, SBP_EINPUT, "the oracle has no tensor \"%s\"", ps->p[i].name);
            else if (!f32)
                memcpy(bd->truth + ps->p[i].offset, t[0] + rm.ps.p[j].offset,
                       sizeof(double) * (size_t)ps->p[i].numel);
            else { /* the oracle's float32 loops against its float64 ones */
                double dd = 0, tt = 0;
                for (int64_t e = 0; e < ps->p[i].numel; e++) {
                    const double a = t[1][rm.ps.p[j].offset + e],
                                 x = bd->truth[ps->p[i].offset + e];
                    dd += (a - x) * (a - x), tt += x * x;
                }
                bd->norm[i] = sqrt(tt);
                bd->budget32[i] = DOC_SLACK * fmax(tt > 0 ? sqrt(dd / tt) : sqrt(dd), DOC_FLOOR32);
            }
        }
        ref_model_free(&rm);
    }
    free(t[0]), free(t[1]);
    if (st) return st;
    for (int p = 0; p < 2 && !st; p++) {
        sbp_grad_result r;
        sbp_grad_opts g = {.schedule = SBP_FULL, .block = BLOCK};
        sbp_set_threads(1);
        if ((st = sbp_grad(&r, p ? m64 : m32, p ? b64 : b32, &g, NULL, err))) break;
        const size_t esz = p ? sizeof(double) : sizeof(float);
        void *copy = malloc(esz * (size_t)ps->total);
        if (!copy)
            st = sbp_fail(err, SBP_ENOMEM, "out of memory");
        else
            memcpy(copy, r.grads, esz * (size_t)ps->total);
        if (p)
            bd->g64 = copy;
        else
            bd->g32 = copy;
        sbp_grad_result_free(&r, NULL);
    }
    if (st) return st;
    /* the element faults' tensor: an MLP weight of the last layer, where the backward starts */
    char name[96];
    snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", m64->cfg.layers - 1);
    bd->at = sbp_params_find(ps, name);
    if (bd->at < 0) bd->at = ps->n - 1;
    bd->elem = ps->p[bd->at].offset + ps->p[bd->at].numel / 3;
    /* two tensors of one shape in one layer (k_proj and v_proj of layer 0 in the GQA models) */
    bd->sw[0] = bd->sw[1] = -1;
    for (int i = 0; i < ps->n && bd->sw[0] < 0; i++)
        for (int j = i + 1; j < ps->n && bd->sw[0] < 0; j++)
            if (ps->p[i].layer == 0 && ps->p[j].layer == 0 && ps->p[i].ndim == 2 &&
                ps->p[i].ndim == ps->p[j].ndim && ps->p[i].shape[0] == ps->p[j].shape[0] &&
                ps->p[i].shape[1] == ps->p[j].shape[1])
                bd->sw[0] = i, bd->sw[1] = j;
    if (bd->sw[0] < 0)
        return sbp_fail(err, SBP_EUSAGE,
                        "the self-test's model has no two tensors of one shape in layer 0");
    return SBP_OK;
}

static void base_free(base_data *bd) {
    free(bd->truth), free(bd->norm), free(bd->budget32), free(bd->g32), free(bd->g64);
    memset(bd, 0, sizeof *bd);
}

/* A gradient file of the float64 gradient g, with tensor `skip` left out (-1: none). */
static sbp_status write_grads(const char *path, const sbp_params *ps, const double *g, int skip,
                              sbp_err *err) {
    sbp_params sub = *ps;
    sub.p = malloc(sizeof *sub.p * (size_t)ps->n);
    if (!sub.p) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    sub.n = 0;
    for (int i = 0; i < ps->n; i++)
        if (i != skip) sub.p[sub.n++] = ps->p[i];
    sbp_status st = sbp_grads_save(path, &sub, SBP_FP64, g, NULL, err);
    free(sub.p);
    return st;
}

/* A gradient file without one tensor: diff and audit must fail it as missing. */
static sbp_status missing_faults(sbp_selftest_report *rep, const base_data *bd,
                                 const sbp_selftest_opts *so, sbp_err *err) {
    char full[1100], part[1100];
    const char *name = bd->ps->p[bd->at].name;
    snprintf(full, sizeof full, "%s/full.safetensors", so->workdir);
    snprintf(part, sizeof part, "%s/missing.safetensors", so->workdir);
    sbp_status st = write_grads(full, bd->ps, bd->g64, -1, err);
    if (!st) st = write_grads(part, bd->ps, bd->g64, bd->at, err);
    if (st) return st;
    sbp_selftest_row *r = add_row(rep, "verify diff", "missing: a gradient file without %s", name);
    sbp_diff d;
    const sbp_promise bitwise = {.bitwise = 1};
    if ((st = sbp_diff_files(&d, part, full, &bitwise, err))) return st;
    int status = -1, others = 0;
    for (int i = 0; i < d.n; i++)
        if (strcmp(d.rows[i].name, name) == 0)
            status = d.rows[i].status;
        else
            others += d.rows[i].status != SBP_ROW_OK;
    snprintf(r->seen, sizeof r->seen, "%s: %s, %d failed of %d, %d others not ok", name,
             status < 0 ? "no row" : sbp_row_status_name((sbp_row_status)status), d.n_failed, d.n,
             others);
    finish(rep, r, status == SBP_ROW_MISSING && d.n_failed == 1 && others == 0);
    sbp_diff_free(&d);

    r = add_row(rep, "verify audit", "missing: the same file audited as fp64 gradients");
    sbp_audit_report ar;
    const sbp_audit_opts ao = {.model = so->model,
                               .batch = so->batch,
                               .grads = part,
                               .precision = SBP_THEIRS_FP64,
                               .block = BLOCK};
    if ((st = sbp_audit(&ar, &ao, err))) return st;
    status = -1, others = 0;
    for (int i = 0; i < ar.n; i++)
        if (strcmp(ar.rows[i].name, name) == 0)
            status = ar.rows[i].status;
        else
            others += ar.rows[i].status != 0;
    snprintf(r->seen, sizeof r->seen, "%s: %s, %d failed of %d, %d others not ok", name,
             status < 0 ? "no row" : sbp_audit_status_name(status), ar.failed, ar.n, others);
    finish(rep, r, status == 4 && ar.failed == 1 && others == 0);
    sbp_audit_free(&ar);
    return SBP_OK;
}

/* A gradient file with one element one ULP off: its fingerprint differs on that tensor's line. */
static sbp_status digest_fault(sbp_selftest_report *rep, const base_data *bd,
                               const sbp_selftest_opts *so, sbp_err *err) {
    char full[1100], ulp[1100];
    snprintf(full, sizeof full, "%s/full.safetensors", so->workdir);
    snprintf(ulp, sizeof ulp, "%s/ulp.safetensors", so->workdir);
    const sbp_params *ps = bd->ps;
    double *g = malloc(sizeof(double) * (size_t)ps->total);
    if (!g) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    memcpy(g, bd->g64, sizeof(double) * (size_t)ps->total);
    g[bd->elem] = nextafter(g[bd->elem], INFINITY);
    sbp_status st = write_grads(ulp, ps, g, -1, err);
    free(g);
    if (st) return st;
    sbp_file_digest da, db;
    if ((st = sbp_digest_file(&da, full, err))) return st;
    if ((st = sbp_digest_file(&db, ulp, err))) {
        sbp_file_digest_free(&da);
        return st;
    }
    char *ta = sbp_digest_text(&da), *tb = sbp_digest_text(&db), diff[256] = "", want[160] = "";
    sbp_file_digest_free(&da), sbp_file_digest_free(&db);
    if (!ta || !tb) {
        free(ta), free(tb);
        return sbp_fail(err, SBP_ENOMEM, "out of memory");
    }
    /* line 1 is the loss; the tensors follow in the table's order */
    snprintf(want, sizeof want, "line %d (%s)", bd->at + 2, ps->p[bd->at].name);
    sbp_digest_first_difference(diff, sizeof diff, tb, ta);
    char same[256];
    sbp_digest_first_difference(same, sizeof same, ta, ta);
    sbp_selftest_row *r = add_row(rep, "verify golden",
                                  "digest byte: one element of %s one ULP off in a gradient file",
                                  ps->p[bd->at].name);
    /* the precisions keep the row inside r->seen (256): the line names are short */
    snprintf(r->seen, sizeof r->seen, "fingerprints part at %.100s (want %.60s)%s",
             diff[0] ? diff : "no line", want,
             same[0] ? "; and the same text differs from itself" : "");
    finish(rep, r, strcmp(diff, want) == 0 && !same[0]);
    free(ta), free(tb);
    return SBP_OK;
}

/* Every golden digest text with one line changed (the first, one in the middle and the last), a
 * line dropped and a line added: the golden comparison names the line; the text itself is equal
 * to itself. */
static sbp_status golden_faults(sbp_selftest_report *rep, const sbp_selftest_opts *so,
                                sbp_err *err) {
    sbp_selftest_row *r = add_row(rep, "verify golden",
                                  "golden line: %d committed digests, each with a line changed, "
                                  "dropped or added",
                                  so->n_golden);
    int tried = 0, caught = 0;
    char miss[160] = "";
    for (int k = 0; k < so->n_golden; k++) {
        const char *t = so->golden_text[k];
        const size_t n = strlen(t);
        int lines = 0;
        for (size_t i = 0; i < n; i++) lines += t[i] == '\n';
        if (lines < 2 || t[n - 1] != '\n') {
            snprintf(miss, sizeof miss, "%s is not a digest text", so->golden_name[k]);
            tried++;
            continue;
        }
        char *c = malloc(n + 64);
        if (!c) return sbp_fail(err, SBP_ENOMEM, "out of memory");
        char diff[256], want[64];
        /* the text against itself */
        sbp_digest_first_difference(diff, sizeof diff, t, t);
        tried++, caught += !diff[0];
        if (diff[0] && !miss[0])
            snprintf(miss, sizeof miss, "%s differs from itself", so->golden_name[k]);
        const int at[3] = {1, lines / 2 + 1, lines};
        for (int v = 0; v < 5; v++) {
            memcpy(c, t, n + 1);
            int line = v < 3 ? at[v] : lines;
            if (v < 3) { /* the last character of the line: a hex digit of the SHA-256 or loss */
                char *p = c;
                for (int l = 1; l < line; l++) p = strchr(p, '\n') + 1;
                char *e = strchr(p, '\n');
                e[-1] = e[-1] == '0' ? '1' : '0';
            } else if (v == 3) { /* the last line dropped */
                c[n - 1] = '\0';
                *(strrchr(c, '\n') + 1) = '\0';
            } else { /* a line added */
                strcat(c, "model.extra.weight F32 0\n");
                line = lines + 1;
            }
            /* got: the run's fingerprint (the committed text); want: the changed golden file */
            if (v == 4)
                sbp_digest_first_difference(diff, sizeof diff, c, t);
            else
                sbp_digest_first_difference(diff, sizeof diff, t, c);
            snprintf(want, sizeof want, "line %d (", line);
            const int ok = strncmp(diff, want, strlen(want)) == 0;
            tried++, caught += ok;
            if (!ok && !miss[0])
                snprintf(miss, sizeof miss, "%.60s, line %d %s: %.60s", so->golden_name[k], line,
                         v < 3    ? "changed"
                         : v == 3 ? "dropped"
                                  : "added",
                         diff[0] ? diff : "no difference found");
        }
        free(c);
    }
    snprintf(r->seen, sizeof r->seen, "%d of %d comparisons right%s%s", caught, tried,
             miss[0] ? "; first wrong: " : "", miss);
    finish(rep, r, tried > 0 && caught == tried);
    return SBP_OK;
}

sbp_status sbp_selftest_run(sbp_selftest_report *rep, const sbp_selftest_opts *so, sbp_err *err) {
    memset(rep, 0, sizeof *rep);
    sbp_model m32 = {0}, m64 = {0};
    sbp_batch b32 = {0}, b64 = {0};
    base_data bd = {0};
    sbp_status st = sbp_model_load(&m64, so->model, SBP_FP64, NULL, err);
    if (!st) st = sbp_model_load(&m32, so->model, SBP_FP32, NULL, err);
    if (!st) st = sbp_batch_load(&b64, so->batch, &m64.cfg, err);
    if (!st) st = sbp_batch_load(&b32, so->batch, &m32.cfg, err);
    if (!st) st = base_make(&bd, &m32, &m64, &b32, &b64, so, err);
    if (st) goto out;
    const sbp_params *ps = &m64.params;
    const int at = bd.at, both = 3, fp64 = 1 << SBP_FP64, fp32 = 1 << SBP_FP32;
    const int fast = 1 << SBP_NUMERICS_FAST, all_nums = 3;
    const int every =
        SBP_RUN_BASE | SBP_RUN_ALIGNED | SBP_RUN_RAGGED | SBP_RUN_THREADS | SBP_RUN_MICRO;
    const char *name = ps->p[at].name;
    sbp_selftest_row *r;

    r = add_row(rep, "every group", "none: the inputs as they are (the control)");
    {
        sbp_verify_report vr;
        if ((st = matrix(&vr, so, NULL, both, all_nums, RAGGED_CHUNK, 2, err))) goto out;
        finish(rep, r, judge(r, &vr, NULL, 0, NULL, 0));
        if (r->ok) snprintf(r->seen, sizeof r->seen, "%d runs, every group passes", vr.n_runs);
        sbp_verify_report_free(&vr);
    }

    fault f = {.kind = F_ADD, .roles = every, .precs = fp64, .at = bd.elem};
    f.delta[SBP_FP64] = FAULT_FACTOR * DOC_TOL64 * bd.norm[at];
    r = add_row(rep, "fp64 vs truth", "fp64 element: %s off by %g x 1e-10 x |truth|", name,
                FAULT_FACTOR);
    const int m_truth64[] = {SBP_VG_TRUTH64, SBP_VG_MICRO}, one[] = {at};
    if ((st =
             matrix_fault(rep, r, so, &f, fp64, fast, ALIGNED_CHUNK, 1, m_truth64, 2, one, 1, err)))
        goto out;

    f = (fault){.kind = F_ADD, .roles = every, .precs = fp32, .at = bd.elem};
    f.delta[SBP_FP32] = FAULT_FACTOR * bd.budget32[at] * bd.norm[at];
    r = add_row(rep, "fp32 vs truth", "fp32 element: %s off by %g x its budget %.2g x |truth|",
                name, FAULT_FACTOR, bd.budget32[at]);
    const int m_truth32[] = {SBP_VG_TRUTH32, SBP_VG_MICRO};
    if ((st =
             matrix_fault(rep, r, so, &f, fp32, fast, ALIGNED_CHUNK, 1, m_truth32, 2, one, 1, err)))
        goto out;

    f = (fault){.kind = F_ULP,
                .roles = SBP_RUN_ALIGNED | SBP_RUN_RAGGED | SBP_RUN_THREADS,
                .precs = fp64,
                .at = bd.elem};
    r = add_row(rep, "bitwise groups", "one ULP: %s one ULP off in every run but the reference",
                name);
    const int m_bitwise[] = {SBP_VG_SCHEDULES, SBP_VG_THREADS, SBP_VG_PORTABLE};
    if ((st = matrix_fault(rep, r, so, &f, fp64, all_nums, ALIGNED_CHUNK, 2, m_bitwise, 3, one, 1,
                           err)))
        goto out;

    f = (fault){.kind = F_ADD, .roles = SBP_RUN_RAGGED, .precs = both, .at = bd.elem};
    f.delta[SBP_FP32] = FAULT_FACTOR * DOC_RAGGED32 * bd.norm[at];
    f.delta[SBP_FP64] = FAULT_FACTOR * DOC_RAGGED64 * bd.norm[at];
    r = add_row(rep, "ragged chunks", "ragged: %s off by %g x the ragged tolerance in ragged runs",
                name, FAULT_FACTOR);
    const int m_ragged[] = {SBP_VG_RAGGED};
    if ((st = matrix_fault(rep, r, so, &f, both, fast, RAGGED_CHUNK, 1, m_ragged, 1, one, 1, err)))
        goto out;

    const sbp_param *s0 = &ps->p[bd.sw[0]], *s1 = &ps->p[bd.sw[1]];
    f = (fault){.kind = F_SWAP,
                .roles = every,
                .precs = fp64,
                .at = s0->offset,
                .at2 = s1->offset,
                .n = s0->numel};
    r = add_row(rep, "fp64 vs truth", "swapped: %s and %s exchanged", s0->name, s1->name);
    const int m_swap[] = {SBP_VG_TRUTH64}, two[] = {bd.sw[0], bd.sw[1]};
    if ((st = matrix_fault(rep, r, so, &f, fp64, fast, ALIGNED_CHUNK, 1, m_swap, 1, two, 2, err)))
        goto out;

    f = (fault){
        .kind = F_REPLACE, .roles = every, .precs = fp64, .f32 = bd.g32, .total = ps->total};
    r = add_row(rep, "fp64 vs truth", "fp32 as fp64: every fp64 run given the fp32 gradient");
    const int all[] = {-1};
    if ((st = matrix_fault(rep, r, so, &f, fp64, fast, ALIGNED_CHUNK, 1, m_swap, 1, all, 1, err)))
        goto out;

    if ((st = missing_faults(rep, &bd, so, err))) goto out;
    if ((st = digest_fault(rep, &bd, so, err))) goto out;
    st = golden_faults(rep, so, err);
out:
    base_free(&bd);
    sbp_batch_free(&b32), sbp_batch_free(&b64);
    sbp_model_free(&m32, NULL), sbp_model_free(&m64, NULL);
    sbp_set_threads(1);
    return st;
}
