/* ops/defer.c — the deferring table (sequence parallel, docs/distributed.md §8, stage 3): put in
 * front of a rank's table while it runs a layer's backward ahead of the gradient bucket's relay.
 *
 * A layer's weight, bias and norm-weight gradients are chains over the tokens, which the ranks
 * continue in token order (relay.c): a rank after the first may add to them only once the
 * bucket has arrived from the rank before. Nothing of the backward's dX path reads a gradient,
 * so a rank runs that path at once and defers the rest: every call that writes into a region the
 * driver names (the layer's bucket, the open token blocks' partial sums, a local layer's
 * K/V-path norm chain) is split into the part that feeds dX, which runs now, and the gradient's
 * part, which is logged with copies of what it reads and replayed in order by defer_replay once
 * the bucket is here:
 *   linear_backward(dx, dw, db, dy, x, w)  →  now (dx, NULL, NULL, ...), later (NULL, dw, db, ...)
 *   rmsnorm_backward(dx, dw, dout, x, rstd) →  now (dx, NULL, ...),       later (NULL, dw, ...)
 *   zero and add into a region               →  later
 * Both products' halves are separate computations in every CPU table (the dX product and the
 * weight product; the norm's dx and dw loops), so a rank's gradients get the same calls on the
 * same values in the same order as without the table: the same bits. The copies are charged to
 * the ledger (a planning run charges them as a run allocates them). */
#include "../engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { D_LINEAR, D_NORM, D_ZERO, D_ADD } d_kind;

/* One deferred call. Copies (owned, freed after the replay): dy and x of a product; dout, x and
 * rstd of a norm. */
typedef struct {
    d_kind kind;
    int bf16;         /* the caller's e->bf16 (the sums' folds pass a copy of e with it off) */
    real *out, *out2; /* dw, db; dw; the zeroed; the sum */
    const real *a, *b, *c;
    real *own[3]; /* the copies among a, b, c */
    const real *w;
    int s, end, N, K; /* linear: rows [s, end), N, K; norm: M = s, C = K */
    size_t n;         /* zero, add */
} d_call;

struct defer_log {
    eng *e; /* allocations charge its ledger */
    const sbp_ops *next;
    struct {
        const char *lo, *hi;
    } region[DEFER_REGIONS];
    int nregion;
    d_call *call;
    int n, cap;
};

static int in_region(const struct defer_log *d, const void *p) {
    for (int i = 0; i < d->nregion; i++)
        if ((const char *)p >= d->region[i].lo && (const char *)p < d->region[i].hi) return 1;
    return 0;
}

/* A new record, NULL (e->oom set) when out of memory. */
static d_call *record(struct defer_log *d, d_kind kind, int bf16) {
    if (d->n == d->cap) {
        const int cap = d->cap ? 2 * d->cap : 64;
        d_call *c = realloc(d->call, sizeof *c * (size_t)cap);
        if (!c) {
            d->e->oom = 1;
            snprintf(d->e->oom_what, sizeof d->e->oom_what, "deferred gradient calls");
            return NULL;
        }
        d->call = c, d->cap = cap;
    }
    d_call *c = &d->call[d->n++];
    memset(c, 0, sizeof *c);
    c->kind = kind, c->bf16 = bf16;
    return c;
}

/* A copy of x (n reals) for record c's slot i: through the next table, charged to the ledger. */
static const real *keep(struct defer_log *d, d_call *c, int i, const real *x, size_t n) {
    real *y = ealloc(d->e, SBP_MEM_LAYER, n, "deferred gradient operands");
    if (!y) return NULL;
    d->next->copy(d->e, y, x, n);
    return c->own[i] = y;
}

static void d_linear_backward(const eng *e, real *dx, real *dw, real *db, const real *dy,
                              const real *x, const real *w, int s, int end, int N, int K) {
    struct defer_log *d = e->defer;
    const int later = (dw && in_region(d, dw)) || (db && in_region(d, db));
    if (dx || !later)
        d->next->linear_backward(e, dx, later ? NULL : dw, later ? NULL : db, dy, x, w, s, end, N,
                                 K);
    if (!later) return;
    d_call *c = record(d, D_LINEAR, e->bf16);
    if (!c) return;
    const size_t M = (size_t)(end - s);
    c->out = dw, c->out2 = db, c->w = w, c->s = s, c->end = end, c->N = N, c->K = K;
    c->a = keep(d, c, 0, dy, M * (size_t)N);
    if (dw) c->b = keep(d, c, 1, x, M * (size_t)K);
}

static void d_rmsnorm_backward(const eng *e, real *dx, real *dw, const real *dout, const real *x,
                               const real *rstd, const real *w, int M, int C) {
    struct defer_log *d = e->defer;
    const int later = dw && in_region(d, dw);
    if (dx || !later) d->next->rmsnorm_backward(e, dx, later ? NULL : dw, dout, x, rstd, w, M, C);
    if (!later) return;
    d_call *c = record(d, D_NORM, e->bf16);
    if (!c) return;
    const size_t MC = (size_t)M * C;
    c->out = dw, c->w = w, c->s = M, c->K = C;
    c->a = keep(d, c, 0, dout, MC), c->b = keep(d, c, 1, x, MC), c->c = keep(d, c, 2, rstd, M);
}

static void d_zero(const eng *e, real *x, size_t n) {
    struct defer_log *d = e->defer;
    if (!in_region(d, x)) return d->next->zero(e, x, n);
    d_call *c = record(d, D_ZERO, e->bf16);
    if (c) c->out = x, c->n = n;
}

static void d_add(const eng *e, real *y, const real *a, const real *b, size_t n) {
    struct defer_log *d = e->defer;
    if (!in_region(d, y)) return d->next->add(e, y, a, b, n);
    d_call *c = record(d, D_ADD, e->bf16);
    if (c) c->out = y, c->a = a, c->b = b, c->n = n;
}

int defer_begin(eng *e, struct defer_log **log, const relay_item *region, int n) {
    struct defer_log *d = calloc(1, sizeof *d);
    sbp_ops *t = malloc(sizeof *t);
    if (!d || !t || n > DEFER_REGIONS) {
        free(d), free(t);
        e->oom = 1;
        snprintf(e->oom_what, sizeof e->oom_what, "the deferring table");
        return 0;
    }
    d->e = e, d->next = e->ops;
    for (int i = 0; i < n; i++)
        if (region[i].p && region[i].bytes)
            d->region[d->nregion].lo = region[i].p,
            d->region[d->nregion++].hi = (const char *)region[i].p + region[i].bytes;
    *t = *e->ops;
    t->linear_backward = d_linear_backward;
    t->rmsnorm_backward = d_rmsnorm_backward;
    t->zero = d_zero;
    t->add = d_add;
    e->ops = t, e->defer = d;
    *log = d;
    return 1;
}

/* The table back as it was; the log stays to be replayed. */
void defer_pause(eng *e, struct defer_log *d) {
    const sbp_ops *t = e->ops;
    e->ops = d->next, e->defer = NULL;
    free((void *)t);
}

void defer_replay(eng *e, struct defer_log *d) {
    const sbp_ops *op = d->next;
    for (int i = 0; i < d->n; i++) {
        const d_call *c = &d->call[i];
        eng ec = *e;
        ec.bf16 = c->bf16;
        switch (c->kind) {
        case D_LINEAR:
            op->linear_backward(&ec, NULL, c->out, c->out2, c->a, c->b, c->w, c->s, c->end, c->N,
                                c->K);
            break;
        case D_NORM:
            op->rmsnorm_backward(&ec, NULL, c->out, c->a, c->b, c->c, c->w, c->s, c->K);
            break;
        case D_ZERO: op->zero(&ec, c->out, c->n); break;
        case D_ADD: op->add(&ec, c->out, c->a, c->b, c->n); break;
        }
    }
}

void defer_end(eng *e, struct defer_log *d) {
    if (!d) return;
    if (e->defer == d) defer_pause(e, d);
    for (int i = 0; i < d->n; i++)
        for (int j = 0; j < 3; j++) efree(e, d->call[i].own[j]);
    free(d->call), free(d);
}
