/* ledger_ops.c — the planning op table (sbp_ops_plan): buffers are allocated as the CPU allocates
 * them (through a planning ledger, which only reserves address space, so nothing can be touched)
 * and every operation does nothing. A plan therefore walks the driver and the steps of a real run,
 * with the same allocations and frees in the same order, in milliseconds for any model and T. */
#include "../engine.h"

/* The planned run's table sizes the workspace: a device's differs from the CPU's. */
static size_t planned_workspace(const eng *e) {
    return e->planned->workspace(e);
}

/* A device run copies the host arrays it reads into device memory, which its ledger records
 * (only the device's memory: the host arrays are not in it). The weights and gradients the
 * planner holds (sbp_plan) stand for their device copies, the same bytes in the same
 * categories; the rest — the batch's ids, mask and targets — is charged here as the device
 * charges it. */
static void *planned_mirror(eng *e, sbp_mem_cat cat, const void *host, size_t bytes,
                            const char *what) {
    if (e->planned->mirror == sbp_cpu_mirror || cat == SBP_MEM_WEIGHTS || cat == SBP_MEM_GRADS)
        return (void *)host;
    return sbp_cpu_alloc(e, cat, bytes, what);
}

static void planned_unmirror(eng *e, void *dev, const void *host) {
    if (dev != host) sbp_cpu_free(e, dev);
}

static void no_move(const eng *e, void *dst, const void *src, size_t bytes) {}
static void no_x(const eng *e, real *x, size_t n) {}
static void no_copy(const eng *e, real *y, const real *x, size_t n) {}
static void no_copy_cols(const eng *e, real *y, const real *x, int rows, int n, int ld) {}
static void no_add(const eng *e, real *y, const real *a, const real *b, size_t n) {}
static void no_scale(const eng *e, real *x, real a, size_t n) {}
static void no_axpy(const eng *e, real *y, real a, const real *x, size_t n) {}
static void no_table(const eng *e, real *cos, real *sin) {}
static void no_linear_forward(const eng *e, real *y, const real *x, const real *w, const real *b,
                              int s, int end, int N, int K) {}
static void no_linear_backward(const eng *e, real *dx, real *dw, real *db, const real *dy,
                               const real *x, const real *w, int s, int end, int N, int K) {}
static void no_norm_forward(const eng *e, real *out, real *rstd, const real *x, const real *w,
                            int M, int C) {}
static void no_norm_backward(const eng *e, real *dx, real *dw, const real *dout, const real *x,
                             const real *rstd, const real *w, int M, int C) {}
static void no_rope(const eng *e, real *x, int s, int M, int H) {}
static void no_attention_forward(const eng *e, real *o, real *lse, const real *q, const real *k,
                                 const real *v, const uint8_t *kmask, const sbp_attn_dims *d) {}
static void no_attention_backward(const eng *e, real *dq, real *dk, real *dv, real *dsum,
                                  const real *dout, const real *o, const real *lse, const real *q,
                                  const real *k, const real *v, const uint8_t *kmask,
                                  const sbp_attn_dims *d) {}
static void no_swiglu_forward(const eng *e, real *h, const real *g, const real *u, size_t n) {}
static void no_swiglu_backward(const eng *e, real *dg, real *du, const real *dh, const real *g,
                               const real *u, size_t n) {}
static void no_embedding_forward(const eng *e, real *x, const int32_t *ids, int T) {}
static void no_embedding_backward(const eng *e, real *demb, const real *dx, const int32_t *ids,
                                  int T) {}
static void no_logprob_forward(const eng *e, double *logp, double *lse, const real *logits,
                               const int32_t *target, int M) {}
static void no_logprob_backward(const eng *e, real *logits, const double *coef, const double *lse,
                                const int32_t *target, int M) {}

const sbp_ops sbp_ops_plan = {
    .name = "plan",
    .begin = sbp_cpu_begin,
    .end = sbp_cpu_end,
    .alloc = sbp_cpu_alloc,
    .free = sbp_cpu_free,
    .mirror = planned_mirror,
    .unmirror = planned_unmirror,
    .download = no_move,
    .upload = no_move,
    .workspace = planned_workspace,
    .zero = no_x,
    .copy = no_copy,
    .copy_cols = no_copy_cols,
    .add = no_add,
    .scale = no_scale,
    .axpy = no_axpy,
    .store = no_x,
    .rope_table = no_table,
    .linear_forward = no_linear_forward,
    .linear_backward = no_linear_backward,
    .rmsnorm_forward = no_norm_forward,
    .rmsnorm_backward = no_norm_backward,
    .rope_forward = no_rope,
    .rope_backward = no_rope,
    .attention_forward = no_attention_forward,
    .attention_backward = no_attention_backward,
    .swiglu_forward = no_swiglu_forward,
    .swiglu_backward = no_swiglu_backward,
    .geglu_forward = no_swiglu_forward,
    .geglu_backward = no_swiglu_backward,
    .embedding_forward = no_embedding_forward,
    .embedding_backward = no_embedding_backward,
    .logprob_forward = no_logprob_forward,
    .logprob_backward = no_logprob_backward,
};
