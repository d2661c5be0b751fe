/* ops/profile.c — the timing table: every operation of e->inner, called as it is, with its
 * calls, wall seconds and (products, attention) floating-point operations added to e->prof
 * (sbp_profile, streambp.h). entry.c puts it in front of the CPU tables when a step is given a
 * profile (`streambp bench --profile`); docs/performance.md#where-a-step-spends-its-time.
 *
 * The driver calls the operations from one thread, and each runs its own parallel regions
 * inside, so the time between two clock reads around a call is the call's wall time on all the
 * threads. Operations do not call each other through the table, so no time is counted twice.
 * The arguments pass through untouched: the same bits as without the profile. */
#include "../../core/tiles.h"
#include "../engine.h"

#include <omp.h>
#include <stdio.h>
#include <string.h>

/* The row of (op, n, k): found, or a new one at the end; NULL when every row is taken. */
static sbp_profile_row *row_of(sbp_profile *p, const char *op, int n, int k) {
    for (int i = 0; i < p->n_rows; i++)
        if (p->rows[i].n == n && p->rows[i].k == k && !strcmp(p->rows[i].op, op))
            return &p->rows[i];
    if (p->n_rows == SBP_PROFILE_ROWS) return NULL;
    sbp_profile_row *r = &p->rows[p->n_rows++];
    *r = (sbp_profile_row){.n = n, .k = k};
    snprintf(r->op, sizeof r->op, "%s", op);
    return r;
}

/* A call of op that began at t0 (omp_get_wtime) and did flop floating-point operations. */
static void count(const eng *e, const char *op, int n, int k, double flop, double t0) {
    const double t = omp_get_wtime() - t0;
    sbp_profile_row *r = row_of(e->prof, op, n, k);
    if (!r) {
        e->prof->lost++;
        return;
    }
    r->calls++, r->seconds += t, r->flop += flop;
}

/* the call, timed, in row (op, n, k) */
#define TIMED(op, n, k, flop, call)                                                                \
    do {                                                                                           \
        const double t0_ = omp_get_wtime();                                                        \
        call;                                                                                      \
        count(e, op, n, k, flop, t0_);                                                             \
    } while (0)

/* ---- the run: its whole time --------------------------------------------------------------- */

static int p_begin(eng *e, char *msg, size_t n) {
    e->prof_start = omp_get_wtime();
    return e->inner->begin(e, msg, n);
}

static int p_end(eng *e, char *msg, size_t n) {
    const int ok = e->inner->end(e, msg, n);
    e->prof->seconds += omp_get_wtime() - e->prof_start;
    e->prof->steps++;
    return ok;
}

static size_t p_workspace(const eng *e) {
    return e->inner->workspace(e);
}

/* ---- memory ---------------------------------------------------------------------------------- */

static void *p_alloc(eng *e, sbp_mem_cat cat, size_t bytes, const char *what) {
    void *p;
    TIMED("alloc", 0, 0, 0, p = e->inner->alloc(e, cat, bytes, what));
    return p;
}

static void p_free(eng *e, void *p) {
    TIMED("free", 0, 0, 0, e->inner->free(e, p));
}

static void *p_mirror(eng *e, sbp_mem_cat cat, const void *host, size_t bytes, const char *what) {
    void *p;
    TIMED("mirror", 0, 0, 0, p = e->inner->mirror(e, cat, host, bytes, what));
    return p;
}

static void p_unmirror(eng *e, void *dev, const void *host) {
    TIMED("unmirror", 0, 0, 0, e->inner->unmirror(e, dev, host));
}

static void p_download(const eng *e, void *host, const void *dev, size_t bytes) {
    TIMED("download", 0, 0, 0, e->inner->download(e, host, dev, bytes));
}

static void p_upload(const eng *e, void *dev, const void *host, size_t bytes) {
    TIMED("upload", 0, 0, 0, e->inner->upload(e, dev, host, bytes));
}

/* ---- elementwise ----------------------------------------------------------------------------- */

static void p_zero(const eng *e, real *x, size_t n) {
    TIMED("zero", 0, 0, 0, e->inner->zero(e, x, n));
}

static void p_copy(const eng *e, real *y, const real *x, size_t n) {
    TIMED("copy", 0, 0, 0, e->inner->copy(e, y, x, n));
}

static void p_copy_cols(const eng *e, real *y, const real *x, int rows, int n, int ld) {
    TIMED("copy_cols", 0, 0, 0, e->inner->copy_cols(e, y, x, rows, n, ld));
}

static void p_add(const eng *e, real *y, const real *a, const real *b, size_t n) {
    TIMED("add", 0, 0, 0, e->inner->add(e, y, a, b, n));
}

static void p_scale(const eng *e, real *x, real a, size_t n) {
    TIMED("scale", 0, 0, 0, e->inner->scale(e, x, a, n));
}

static void p_axpy(const eng *e, real *y, real a, const real *x, size_t n) {
    TIMED("axpy", 0, 0, 0, e->inner->axpy(e, y, a, x, n));
}

static void p_store(const eng *e, real *x, size_t n) {
    TIMED("store", 0, 0, 0, e->inner->store(e, x, n));
}

/* ---- the kernel pairs ------------------------------------------------------------------------ */

static void p_rope_table(const eng *e, real *cos, real *sin) {
    TIMED("rope_table", 0, 0, 0, e->inner->rope_table(e, cos, sin));
}

/* the products: a row per (N, K), 2·M·N·K per product */
static void p_linear_forward(const eng *e, real *y, const real *x, const real *w, const real *b,
                             int s, int end, int N, int K) {
    const double flop = 2.0 * (end - s) * N * K;
    TIMED("linear_forward", N, K, flop, e->inner->linear_forward(e, y, x, w, b, s, end, N, K));
}

static void p_linear_backward(const eng *e, real *dx, real *dw, real *db, const real *dy,
                              const real *x, const real *w, int s, int end, int N, int K) {
    const double flop = 2.0 * (end - s) * N * K * ((dx != NULL) + (dw != NULL));
    TIMED("linear_backward", N, K, flop,
          e->inner->linear_backward(e, dx, dw, db, dy, x, w, s, end, N, K));
}

static void p_rmsnorm_forward(const eng *e, real *out, real *rstd, const real *x, const real *w,
                              int M, int C) {
    TIMED("rmsnorm_forward", 0, 0, 0, e->inner->rmsnorm_forward(e, out, rstd, x, w, M, C));
}

static void p_rmsnorm_backward(const eng *e, real *dx, real *dw, const real *dout, const real *x,
                               const real *rstd, const real *w, int M, int C) {
    TIMED("rmsnorm_backward", 0, 0, 0,
          e->inner->rmsnorm_backward(e, dx, dw, dout, x, rstd, w, M, C));
}

static void p_rope_forward(const eng *e, real *x, int s, int M, int H) {
    TIMED("rope_forward", 0, 0, 0, e->inner->rope_forward(e, x, s, M, H));
}

static void p_rope_backward(const eng *e, real *dx, int s, int M, int H) {
    TIMED("rope_backward", 0, 0, 0, e->inner->rope_backward(e, dx, s, M, H));
}

/* the products of the fast attention's tiles (src/core/flops.c counts them the same way): per
 * (query, key) pair of a computed tile and head, 4·HD forward, 10·HD (one pass) or 14·HD
 * (two) backward; the portable attention (64-wide tiles) is counted on the same grid */
static double attention_flop(const eng *e, const sbp_attn_dims *d, int per_hd) {
    return (double)per_hd * d->HD * d->NH *
           attention_tile_pairs(d->s, d->s + d->M, attention_tile(e->blk), d->window);
}

static void p_attention_forward(const eng *e, real *o, real *lse, const real *q, const real *k,
                                const real *v, const uint8_t *kmask, const sbp_attn_dims *d) {
    TIMED("attention_forward", 0, 0, attention_flop(e, d, 4),
          e->inner->attention_forward(e, o, lse, q, k, v, kmask, d));
}

static void p_attention_backward(const eng *e, real *dq, real *dk, real *dv, real *dsum,
                                 const real *dout, const real *o, const real *lse, const real *q,
                                 const real *k, const real *v, const uint8_t *kmask,
                                 const sbp_attn_dims *d) {
    TIMED("attention_backward", 0, 0, attention_flop(e, d, attention_one_pass(d->NKV) ? 10 : 14),
          e->inner->attention_backward(e, dq, dk, dv, dsum, dout, o, lse, q, k, v, kmask, d));
}

static void p_swiglu_forward(const eng *e, real *h, const real *g, const real *u, size_t n) {
    TIMED("swiglu_forward", 0, 0, 0, e->inner->swiglu_forward(e, h, g, u, n));
}

static void p_swiglu_backward(const eng *e, real *dg, real *du, const real *dh, const real *g,
                              const real *u, size_t n) {
    TIMED("swiglu_backward", 0, 0, 0, e->inner->swiglu_backward(e, dg, du, dh, g, u, n));
}

static void p_geglu_forward(const eng *e, real *h, const real *g, const real *u, size_t n) {
    TIMED("geglu_forward", 0, 0, 0, e->inner->geglu_forward(e, h, g, u, n));
}

static void p_geglu_backward(const eng *e, real *dg, real *du, const real *dh, const real *g,
                             const real *u, size_t n) {
    TIMED("geglu_backward", 0, 0, 0, e->inner->geglu_backward(e, dg, du, dh, g, u, n));
}

static void p_embedding_forward(const eng *e, real *x, const int32_t *ids, int T) {
    TIMED("embedding_forward", 0, 0, 0, e->inner->embedding_forward(e, x, ids, T));
}

static void p_embedding_backward(const eng *e, real *demb, const real *dx, const int32_t *ids,
                                 int T) {
    TIMED("embedding_backward", 0, 0, 0, e->inner->embedding_backward(e, demb, dx, ids, T));
}

static void p_logprob_forward(const eng *e, double *logp, double *lse, const real *logits,
                              const int32_t *target, int M) {
    TIMED("logprob_forward", 0, 0, 0, e->inner->logprob_forward(e, logp, lse, logits, target, M));
}

static void p_logprob_backward(const eng *e, real *logits, const double *coef, const double *lse,
                               const int32_t *target, int M) {
    TIMED("logprob_backward", 0, 0, 0, e->inner->logprob_backward(e, logits, coef, lse, target, M));
}

const sbp_ops sbp_ops_profiled = {
    .name = "profiled",
    .begin = p_begin,
    .end = p_end,
    .alloc = p_alloc,
    .free = p_free,
    .mirror = p_mirror,
    .unmirror = p_unmirror,
    .download = p_download,
    .upload = p_upload,
    .workspace = p_workspace,
    .zero = p_zero,
    .copy = p_copy,
    .copy_cols = p_copy_cols,
    .add = p_add,
    .scale = p_scale,
    .axpy = p_axpy,
    .store = p_store,
    .rope_table = p_rope_table,
    .linear_forward = p_linear_forward,
    .linear_backward = p_linear_backward,
    .rmsnorm_forward = p_rmsnorm_forward,
    .rmsnorm_backward = p_rmsnorm_backward,
    .rope_forward = p_rope_forward,
    .rope_backward = p_rope_backward,
    .attention_forward = p_attention_forward,
    .attention_backward = p_attention_backward,
    .swiglu_forward = p_swiglu_forward,
    .swiglu_backward = p_swiglu_backward,
    .geglu_forward = p_geglu_forward,
    .geglu_backward = p_geglu_backward,
    .embedding_forward = p_embedding_forward,
    .embedding_backward = p_embedding_backward,
    .logprob_forward = p_logprob_forward,
    .logprob_backward = p_logprob_backward,
};
