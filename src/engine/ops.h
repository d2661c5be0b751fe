/* ops.h — the table of operations the steps are written against
 * (docs/development.md#the-op-table).
 *
 * The schedule driver (driver.c) and the steps (steps/) never call a kernel, a BLAS routine or
 * memcpy by name: they call through e->ops. One table per backend and precision:
 *   cpu-fast      the fast mode: its faster products, chosen by the build's instruction set
 *                 (ops/cpu.c; which ones: docs/numerics.md §10)
 *   cpu-portable  the portable mode: every product and reduction by docs/numerics.md §4, §5
 *                 (ops/cpu.c)
 *   plan          allocation only: the buffers are reserved by a planning ledger, every
 *                 operation does nothing (ops/ledger_ops.c), so a plan walks the very code of a run
 * and the CUDA tables of cuda/. Buffers are the backend's memory ("device" below; on the CPU it
 * is host memory); the host sees only what it uploads and downloads.
 *
 * bf16 storage is a property of the CPU tables: when e->bf16 is set, every tensor an operation
 * produces is rounded to bfloat16 before the operation returns (pure-bf16 training stores every
 * activation and gradient that way; the products themselves accumulate in float, as bf16 GEMMs
 * do). Accumulators that span several operations (dK and dV over the chunks, the parameter
 * gradients) are rounded where they are complete, through `store`.
 *
 * Shapes use the letters of streambp.h; e gives the model's sizes and the run's tables. */
#ifndef SBP_OPS_H
#define SBP_OPS_H

#include "../kernels/kernels.h" /* sbp_attn_dims */
#include "../kernels/real.h"
#include "../streambp.h"

#include <stddef.h>
#include <stdint.h>

typedef struct eng eng;

typedef struct sbp_ops {
    const char *name;

    /* ---- the run ---- */
    /* before anything else: 0 (and a message in msg) when the backend cannot run, e.g. no GPU */
    int (*begin)(eng *e, char *msg, size_t n);
    /* after everything else, buffers freed or not: 0 (and a message) when an operation of the
     * run failed on the backend (a kernel fault, a lost device) */
    int (*end)(eng *e, char *msg, size_t n);

    /* ---- memory ---- */
    /* bytes of backend memory charged to cat in the ledger, uninitialised (the steps write
     * before they read, or zero explicitly); NULL (and e->oom set, naming `what`) when it cannot
     * be had */
    void *(*alloc)(eng *e, sbp_mem_cat cat, size_t bytes, const char *what);
    void (*free)(eng *e, void *p);
    /* the host array on the backend: the same pointer where the backend is the host, else a
     * copy charged to cat; unmirror releases it */
    void *(*mirror)(eng *e, sbp_mem_cat cat, const void *host, size_t bytes, const char *what);
    void (*unmirror)(eng *e, void *dev, const void *host);
    void (*download)(const eng *e, void *host, const void *dev, size_t bytes);
    void (*upload)(const eng *e, void *dev, const void *host, size_t bytes);
    /* reals of workspace the products and attention of this table need (e->ws) */
    size_t (*workspace)(const eng *e);

    /* ---- elementwise ---- */
    void (*zero)(const eng *e, real *x, size_t n);
    void (*copy)(const eng *e, real *y, const real *x, size_t n);
    /* y (rows, n) = the first n columns of x (rows, ld): one call for a block of columns */
    void (*copy_cols)(const eng *e, real *y, const real *x, int rows, int n, int ld);
    void (*add)(const eng *e, real *y, const real *a, const real *b, size_t n); /* y = a + b */
    void (*scale)(const eng *e, real *x, real a, size_t n);                     /* x = x·a */
    void (*axpy)(const eng *e, real *y, real a, const real *x, size_t n);       /* y = y + x·a */
    void (*store)(const eng *e, real *x, size_t n); /* round to the storage precision */

    /* ---- the kernel pairs of kernels.h (shapes there) ---- */
    void (*rope_table)(const eng *e, real *cos, real *sin); /* (T, HD/2) each */
    void (*linear_forward)(const eng *e, real *y, const real *x, const real *w, const real *b,
                           int s, int end, int N, int K);
    /* dx, dw, db may each be NULL (a frozen weight has no gradient) */
    void (*linear_backward)(const eng *e, real *dx, real *dw, real *db, const real *dy,
                            const real *x, const real *w, int s, int end, int N, int K);
    void (*rmsnorm_forward)(const eng *e, real *out, real *rstd, const real *x, const real *w,
                            int M, int C);
    void (*rmsnorm_backward)(const eng *e, real *dx, real *dw /* or NULL */, const real *dout,
                             const real *x, const real *rstd, const real *w, int M, int C);
    void (*rope_forward)(const eng *e, real *x, int s, int M, int H);
    void (*rope_backward)(const eng *e, real *dx, int s, int M, int H);
    /* d: the queries, sizes, window and scale of the call (kernels.h's sbp_attn_dims) */
    void (*attention_forward)(const eng *e, real *o, real *lse, const real *q, const real *k,
                              const real *v, const uint8_t *kmask, const sbp_attn_dims *d);
    void (*attention_backward)(const eng *e, real *dq, real *dk, real *dv, real *dsum,
                               const real *dout, const real *o, const real *lse, const real *q,
                               const real *k, const real *v, const uint8_t *kmask,
                               const sbp_attn_dims *d);
    void (*swiglu_forward)(const eng *e, real *h, const real *g, const real *u, size_t n);
    void (*swiglu_backward)(const eng *e, real *dg, real *du, const real *dh, const real *g,
                            const real *u, size_t n);
    /* Gemma-3's gelu_tanh(g) ⊙ u; NULL in a table that does not run Gemma-3 */
    void (*geglu_forward)(const eng *e, real *h, const real *g, const real *u, size_t n);
    void (*geglu_backward)(const eng *e, real *dg, real *du, const real *dh, const real *g,
                           const real *u, size_t n);
    void (*embedding_forward)(const eng *e, real *x, const int32_t *ids, int T);
    void (*embedding_backward)(const eng *e, real *demb, const real *dx, const int32_t *ids, int T);
    void (*logprob_forward)(const eng *e, double *logp, double *lse, const real *logits,
                            const int32_t *target, int M);
    void (*logprob_backward)(const eng *e, real *logits, const double *coef, const double *lse,
                             const int32_t *target, int M);
} sbp_ops;

/* The tables of this precision (ops/cpu.c, ops/ledger_ops.c), and the timing table that wraps
 * another, e->inner, adding each call's time to e->prof (ops/profile.c). */
extern const sbp_ops sbp_ops_cpu_fast, sbp_ops_cpu_portable, sbp_ops_plan, sbp_ops_profiled;

/* The CPU's run and memory, shared by the CPU and planning tables (ops/cpu.c). */
int sbp_cpu_begin(eng *e, char *msg, size_t n);
int sbp_cpu_end(eng *e, char *msg, size_t n);
void *sbp_cpu_alloc(eng *e, sbp_mem_cat cat, size_t bytes, const char *what);
void sbp_cpu_free(eng *e, void *p);
void *sbp_cpu_mirror(eng *e, sbp_mem_cat cat, const void *host, size_t bytes, const char *what);
void sbp_cpu_unmirror(eng *e, void *dev, const void *host);

#endif
