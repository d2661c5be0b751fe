/* cpu.c — the CPU op tables: fast (the products the build's instruction set picks,
 * docs/numerics.md §10) and portable (every operation by the contract of docs/numerics.md §2 to
 * §8). They share everything but those two kernels; the backend's memory is the host's, so
 * mirroring is the identity and up/downloads are copies at most.
 *
 * The bf16 storage mode (e->bf16) lives here: each operation rounds what it produces. */
#include "../../kernels/kernels.h"
#include "../engine.h"

#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

/* ---- the run and its memory -------------------------------------------------------------------
 */

int sbp_cpu_begin(eng *e, char *msg, size_t n) {
    return 1;
}

int sbp_cpu_end(eng *e, char *msg, size_t n) {
    return 1;
}

void *sbp_cpu_alloc(eng *e, sbp_mem_cat cat, size_t bytes, const char *what) {
    void *p = sbp_ledger_alloc_raw(e->lg, cat, bytes ? bytes : 1);
    if (!p && !e->oom) {
        e->oom = 1;
        snprintf(e->oom_what, sizeof e->oom_what, "%s", what);
    }
    return p;
}

void sbp_cpu_free(eng *e, void *p) {
    sbp_ledger_free(e->lg, p);
}

void *sbp_cpu_mirror(eng *e, sbp_mem_cat cat, const void *host, size_t bytes, const char *what) {
    return (void *)host;
}

void sbp_cpu_unmirror(eng *e, void *dev, const void *host) {}

static void cpu_move(const eng *e, void *dst, const void *src, size_t bytes) {
    if (dst != src) memcpy(dst, src, bytes);
}

static size_t max2(size_t a, size_t b) {
    return a > b ? a : b;
}

/* rows without a key (unattended.c) share the workspace, between the attention calls */
static size_t unattended_ws(const eng *e) {
    return e->unattended ? unattended_workspace(e->T) : 0;
}

/* The widest dimension of a layer's products (N and K of every projection, LoRA's rank). The
 * depth of a product is not bounded: pgemm's k blocks hold at most KC of it whatever it is. */
static int layer_width(const eng *e) {
    const int d[] = {e->C, e->Q, e->KV, e->F, e->lora_r};
    int w = 0;
    for (int i = 0; i < 5; i++) w = d[i] > w ? d[i] : w;
    return w;
}

/* The LM head's products, each bounded by its own N and K (a small model's hidden size is below
 * pgemm's k block, and the ledger should not count packing space no product touches): the
 * logits (N = V, K = C), dhn (N = C, K = V) and dW_head (N = C, K = the rows of a pass). */
static size_t head_workspace(const eng *e) {
    return max2(max2(pgemm_workspace(e->V, e->C), pgemm_workspace(e->C, e->V)),
                pgemm_workspace(e->C, e->T));
}

/* The fast products' pgemm workspace; the blocked weight gradients' partial sums follow it
 * (linear_backward_blocked; every product's K is at most layer_width, the head's C included). */
static size_t fast_gemm_ws(const eng *e) {
    return PGEMM_TUNED ? max2(pgemm_workspace(layer_width(e), INT_MAX), head_workspace(e)) : 0;
}

static size_t fast_workspace(const eng *e) {
    const size_t attn = tiled_attention_workspace(e->blk, e->NH, e->NKV, e->HD);
    const size_t gemm =
        PGEMM_TUNED ? fast_gemm_ws(e) + linear_blocked_workspace(layer_width(e), e->blk) : 0;
    return max2(max2(attn, gemm), unattended_ws(e));
}

static size_t portable_workspace(const eng *e) {
    const int lw = layer_width(e), n = lw > e->V ? lw : e->V; /* the LM head's V */
    return max2(max2(attention_workspace(e->HD), pgemm_workspace(n, INT_MAX)), unattended_ws(e));
}

/* ---- elementwise ----------------------------------------------------------------------------- */

static void store(const eng *e, real *x, size_t n) {
    if (e->bf16) round_to_bf16(x, n);
}

/* The elementwise passes run on every thread above PAR_MIN elements: each element is computed
 * as before, by whichever thread, so no bit changes. Run on one thread they were a serial
 * stretch of each chunk (the backward clears 7-8 buffers of up to M·F reals per layer and
 * chunk, the residual adds and copies) that a second thread sat out. */
enum { PAR_MIN = 1 << 16 };

/* [lo, hi) of n elements for thread id of nth, cut on 16-element (64-byte) boundaries */
static void part(size_t n, int id, int nth, size_t *lo, size_t *hi) {
    const size_t units = (n + 15) / 16;
    *lo = units * (size_t)id / (size_t)nth * 16, *hi = units * (size_t)(id + 1) / (size_t)nth * 16;
    if (*lo > n) *lo = n;
    if (*hi > n) *hi = n;
}

static void cpu_zero(const eng *e, real *x, size_t n) {
#pragma omp parallel if (n > PAR_MIN)
    {
        size_t lo, hi;
        part(n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        if (hi > lo) memset(x + lo, 0, sizeof(real) * (hi - lo));
    }
}

static void cpu_copy(const eng *e, real *y, const real *x, size_t n) {
#pragma omp parallel if (n > PAR_MIN)
    {
        size_t lo, hi;
        part(n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        if (hi > lo) memcpy(y + lo, x + lo, sizeof(real) * (hi - lo));
    }
}

static void cpu_copy_cols(const eng *e, real *y, const real *x, int rows, int n, int ld) {
#pragma omp parallel for schedule(static) if ((size_t)rows * n > PAR_MIN)
    for (int r = 0; r < rows; r++)
        memcpy(y + (size_t)r * n, x + (size_t)r * ld, sizeof(real) * (size_t)n);
}

static void cpu_add(const eng *e, real *y, const real *a, const real *b, size_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
    store(e, y, n);
}

static void cpu_axpy(const eng *e, real *y, real a, const real *x, size_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = y[i] + x[i] * a;
    store(e, y, n);
}

/* not rounded: HF scales the logits after upcasting them to float */
static void cpu_scale(const eng *e, real *x, real a, size_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] = x[i] * a;
}

/* ---- kernels --------------------------------------------------------------------------------- */

static void cpu_rope_table(const eng *e, real *cos, real *sin) {
    const sbp_config *c = e->cfg;
    /* the scaling's kind as sbp_rope_inv_freq takes it: 1 llama3, 2 linear */
    const int scaling = c->rope_llama3 ? 1 : c->rope_linear ? 2 : 0;
    rope_table(cos, sin, e->T, e->HD, c->rope_theta, scaling, c->rope_factor, c->rope_low_freq,
               c->rope_high_freq, c->rope_orig_max);
}

/* The fast mode's linear products, the LM head's included, run on the portable product where
 * its micro-kernel is tuned (PGEMM_TUNED): one call over the whole row range packs each weight
 * panel once per call, where OpenBLAS's fixed tile grid packs it once per token block, and its
 * bits do not depend on the row range, so full, ckpt and stream still agree bit for bit. The
 * layers moved first (a full-BP step of the bench model at T = 2048 took 0.91x the time on 2
 * threads); the head followed once pgemm's packs streamed (gemm.c: its whole-range products
 * read 0.86-1.06 of cblas_sgemm at 2048 x 32000 x 512 and its two backward shapes, and a
 * full-BP step 0.91x the time on 1 thread; docs/performance-log.md). Where it is not tuned,
 * OpenBLAS's tiles (docs/numerics.md §10). */
static void fast_linear_forward(const eng *e, real *y, const real *x, const real *w, const real *b,
                                int s, int end, int N, int K) {
    if (PGEMM_TUNED) /* the portable forward: docs/numerics.md §10 */
        linear_forward(y, e->ws, x, w, b, s, end, N, K);
    else
        blas_linear_forward(y, x, w, b, s, end, N, K, e->blk);
    store(e, y, (size_t)(end - s) * N);
}

static void portable_linear_forward(const eng *e, real *y, const real *x, const real *w,
                                    const real *b, int s, int end, int N, int K) {
    linear_forward(y, e->ws, x, w, b, s, end, N, K);
    store(e, y, (size_t)(end - s) * N);
}

static void fast_linear_backward(const eng *e, real *dx, real *dw, real *db, const real *dy,
                                 const real *x, const real *w, int s, int end, int N, int K) {
    if (PGEMM_TUNED) /* dW, db per token block: docs/numerics.md §10, docs/accuracy.md */
        linear_backward_blocked(dx, dw, db, e->ws, e->ws + fast_gemm_ws(e), dy, x, w, s, end, N, K,
                                e->blk);
    else
        blas_linear_backward(dx, dw, db, dy, x, w, s, end, N, K, e->blk);
    if (dx) store(e, dx, (size_t)(end - s) * K);
}

static void portable_linear_backward(const eng *e, real *dx, real *dw, real *db, const real *dy,
                                     const real *x, const real *w, int s, int end, int N, int K) {
    linear_backward(dx, dw, db, e->ws, dy, x, w, s, end, N, K);
    if (dx) store(e, dx, (size_t)(end - s) * K);
}

static void cpu_rmsnorm_forward(const eng *e, real *out, real *rstd, const real *x, const real *w,
                                int M, int C) {
    rmsnorm_forward(out, rstd, x, w, M, C, e->cfg->eps);
    store(e, out, (size_t)M * C);
}

static void cpu_rmsnorm_backward(const eng *e, real *dx, real *dw, const real *dout, const real *x,
                                 const real *rstd, const real *w, int M, int C) {
    if (e->portable)
        rmsnorm_backward(dx, dw, dout, x, rstd, w, M, C);
    else /* dw per token block: docs/numerics.md §10 */
        rmsnorm_backward_blocked(dx, dw, dout, x, rstd, w, M, C, e->blk);
    if (dx) store(e, dx, (size_t)M * C);
}

static void cpu_rope_forward(const eng *e, real *x, int s, int M, int H) {
    rope_forward(x, e->cos, e->sin, s, M, H, e->HD);
    store(e, x, (size_t)M * H * e->HD);
}

static void cpu_rope_backward(const eng *e, real *dx, int s, int M, int H) {
    rope_backward(dx, e->cos, e->sin, s, M, H, e->HD);
    store(e, dx, (size_t)M * H * e->HD);
}

static void fast_attention_forward(const eng *e, real *o, real *lse, const real *q, const real *k,
                                   const real *v, const uint8_t *kmask, const sbp_attn_dims *d) {
    tiled_attention_forward(o, lse, e->ws, q, k, v, kmask, d);
    unattended_forward(o, e->ws, q, k, v, kmask, d, e->unattended);
    store(e, o, (size_t)d->M * e->Q);
}

static void portable_attention_forward(const eng *e, real *o, real *lse, const real *q,
                                       const real *k, const real *v, const uint8_t *kmask,
                                       const sbp_attn_dims *d) {
    attention_forward(o, lse, e->ws, q, k, v, kmask, d);
    unattended_forward(o, e->ws, q, k, v, kmask, d, e->unattended);
    store(e, o, (size_t)d->M * e->Q);
}

/* dK and dV accumulate over the chunks: they are stored once, complete (kv_backward). Rows
 * without a key go first: they precede every row with one (unattended.c). */
static void fast_attention_backward(const eng *e, real *dq, real *dk, real *dv, real *dsum,
                                    const real *dout, const real *o, const real *lse, const real *q,
                                    const real *k, const real *v, const uint8_t *kmask,
                                    const sbp_attn_dims *d) {
    unattended_backward(dq, dk, dv, e->ws, dout, o, q, k, v, kmask, d, e->unattended);
    tiled_attention_backward(dq, dk, dv, dsum, e->ws, dout, o, lse, q, k, v, kmask, d);
    if (!d->no_dq) store(e, dq, (size_t)d->M * e->Q);
}

static void portable_attention_backward(const eng *e, real *dq, real *dk, real *dv, real *dsum,
                                        const real *dout, const real *o, const real *lse,
                                        const real *q, const real *k, const real *v,
                                        const uint8_t *kmask, const sbp_attn_dims *d) {
    unattended_backward(dq, dk, dv, e->ws, dout, o, q, k, v, kmask, d, e->unattended);
    attention_backward(dq, dk, dv, dsum, e->ws, dout, o, lse, q, k, v, kmask, d);
    if (!d->no_dq) store(e, dq, (size_t)d->M * e->Q);
}

static void cpu_swiglu_forward(const eng *e, real *h, const real *g, const real *u, size_t n) {
    swiglu_forward(h, g, u, n);
    store(e, h, n);
}

static void cpu_swiglu_backward(const eng *e, real *dg, real *du, const real *dh, const real *g,
                                const real *u, size_t n) {
    swiglu_backward(dg, du, dh, g, u, n);
    store(e, dg, n), store(e, du, n);
}

static void cpu_geglu_forward(const eng *e, real *h, const real *g, const real *u, size_t n) {
    geglu_forward(h, g, u, n);
    store(e, h, n);
}

static void cpu_geglu_backward(const eng *e, real *dg, real *du, const real *dh, const real *g,
                               const real *u, size_t n) {
    geglu_backward(dg, du, dh, g, u, n);
    store(e, dg, n), store(e, du, n);
}

static void cpu_embedding_forward(const eng *e, real *x, const int32_t *ids, int T) {
    embedding_forward(x, ids, e->emb, T, e->C);
}

static void cpu_embedding_backward(const eng *e, real *demb, const real *dx, const int32_t *ids,
                                   int T) {
    embedding_backward(demb, dx, ids, T, e->C);
}

static void cpu_logprob_forward(const eng *e, double *logp, double *lse, const real *logits,
                                const int32_t *target, int M) {
    logprob_forward(logp, lse, logits, target, M, e->V);
}

static void cpu_logprob_backward(const eng *e, real *logits, const double *coef, const double *lse,
                                 const int32_t *target, int M) {
    logprob_backward(logits, coef, lse, target, M, e->V);
    store(e, logits, (size_t)M * e->V);
}

#define CPU_COMMON                                                                                 \
    .begin = sbp_cpu_begin, .end = sbp_cpu_end, .alloc = sbp_cpu_alloc, .free = sbp_cpu_free,      \
    .mirror = sbp_cpu_mirror, .unmirror = sbp_cpu_unmirror, .download = cpu_move,                  \
    .upload = cpu_move, .zero = cpu_zero, .copy = cpu_copy, .copy_cols = cpu_copy_cols,            \
    .add = cpu_add, .scale = cpu_scale, .axpy = cpu_axpy, .store = store,                          \
    .rope_table = cpu_rope_table, .rmsnorm_forward = cpu_rmsnorm_forward,                          \
    .rmsnorm_backward = cpu_rmsnorm_backward, .rope_forward = cpu_rope_forward,                    \
    .rope_backward = cpu_rope_backward, .swiglu_forward = cpu_swiglu_forward,                      \
    .swiglu_backward = cpu_swiglu_backward, .geglu_forward = cpu_geglu_forward,                    \
    .geglu_backward = cpu_geglu_backward, .embedding_forward = cpu_embedding_forward,              \
    .embedding_backward = cpu_embedding_backward, .logprob_forward = cpu_logprob_forward,          \
    .logprob_backward = cpu_logprob_backward

const sbp_ops sbp_ops_cpu_fast = {
    .name = "cpu-fast",
    CPU_COMMON,
    .workspace = fast_workspace,
    .linear_forward = fast_linear_forward,
    .linear_backward = fast_linear_backward,
    .attention_forward = fast_attention_forward,
    .attention_backward = fast_attention_backward,
};

const sbp_ops sbp_ops_cpu_portable = {
    .name = "cpu-portable",
    CPU_COMMON,
    .workspace = portable_workspace,
    .linear_forward = portable_linear_forward,
    .linear_backward = portable_linear_backward,
    .attention_forward = portable_attention_forward,
    .attention_backward = portable_attention_backward,
};
