/* engine.h — the decoder layer, the LM head and the three schedules, in the working precision.
 *
 * Every schedule is built from the same four layer steps (layer.c):
 *   kv_forward      input RMSNorm, K and V of all T tokens of one sequence (the part every chunk
 *                   attends to);
 *   chunk_forward   queries, attention, o_proj, residual, post-norm and MLP of rows [s, e);
 *   chunk_backward  the backward of chunk_forward for rows [s, e): dX of the rows through the
 *                   residual and the query path, dK/dV of keys [0, e) accumulated;
 *   kv_backward     the backward of kv_forward for all T, adding the K/V path to dX.
 * full BP runs them once per layer over [0, T) and keeps everything; ckpt keeps layer inputs and
 * recomputes one layer over [0, T) during the backward; stream recomputes K/V once and loops over
 * chunks. Internal to the library. */
#ifndef SBP_ENGINE_H
#define SBP_ENGINE_H

#include "../core/objective.h"
#include "../kernels/kernels.h"
#include "../streambp.h"

/* The tensors of one layer: weights, or their gradients (same layout). NULL where the family has
 * no such tensor. */
typedef struct {
    real *wq, *bq;         /* (Q, C), (Q) */
    real *wk, *bk;         /* (KV, C), (KV) */
    real *wv, *bv;         /* (KV, C), (KV) */
    real *wo;              /* (C, Q) */
    real *q_norm, *k_norm; /* (HD) each, Qwen3 */
    real *wg, *wu;         /* (F, C) each */
    real *wd;              /* (C, F) */
    real *in_norm;         /* (C) */
    real *post_norm;       /* (C) */
} layer_p;

/* Everything a run needs that does not change while it runs. */
typedef struct {
    const sbp_config *cfg;
    int C, Q, KV, F, V, NH, NKV, HD, L;
    int blk; /* token block */
    int T;   /* tokens per sequence in this batch */
    sbp_ledger *lg;
    const real *cos, *sin; /* (T, HD/2) RoPE tables */
    layer_p *w, *g;        /* (L) weight and gradient views */
    real *emb, *gemb;      /* (V, C) */
    real *head, *ghead;    /* (V, C): lm_head, or the embedding when tied */
    real *fnorm, *gfnorm;  /* (C) final norm */
    int plan;              /* planning run: buffers are reserved, never touched; steps return */
    int elem_bytes;        /* bytes charged per real: sizeof(real), or the planner's storage size */
    int bf16;              /* emulate pure-bf16 training: round every tensor an op writes to bf16 */
    int oom;               /* set by ealloc when an allocation fails */
    char oom_what[64];
} eng;

/* Allocates n reals (ealloc) or n bytes (ealloc_bytes) charged to cat, zero-filled; on failure
 * records `what` in e->oom_what and returns NULL. */
real *ealloc(eng *e, sbp_mem_cat cat, size_t n, const char *what);
void *ealloc_bytes(eng *e, sbp_mem_cat cat, size_t bytes, const char *what);
void efree(eng *e, void *p);

/* In a bf16-emulating run, every tensor an op writes is rounded to bf16, as pure-bf16 training
 * stores it; the products themselves accumulate in float, as bf16 GEMMs do. */
static inline void bf16(const eng *e, real *p, size_t n) {
    if (e->bf16) round_to_bf16(p, n);
}

/* K/V side of one layer for one sequence: all T rows. The input-norm output xn = rmsnorm(x) is
 * not kept: it is formed again a block of rows at a time wherever it is needed (the K/V
 * projections, each chunk's queries, the K/V weight gradients), so no T×C buffer but the layer
 * input and its gradient exists. */
typedef struct {
    real *kpre;  /* (T, KV) k before k_norm (Qwen3 only, else NULL) */
    real *krstd; /* (T, NKV) (Qwen3 only) */
    real *k;     /* (T, KV) after k_norm and RoPE */
    real *v;     /* (T, KV) */
} kv_acts;

/* Activations of rows [s, e) of one layer for one sequence; c = capacity in rows. */
typedef struct {
    real *xn;    /* (c, C) input RMSNorm output of the chunk */
    real *rstd1; /* (c) */
    real *qpre;  /* (c, Q) q before q_norm (Qwen3 only, else NULL) */
    real *qrstd; /* (c, NH) (Qwen3 only) */
    real *q;     /* (c, Q) after q_norm and RoPE */
    real *o;     /* (c, Q) attention output */
    real *lse;   /* (c, NH) */
    real *x2;    /* (c, C) residual after attention */
    real *xn2;   /* (c, C) post-attention RMSNorm output */
    real *rstd2; /* (c) */
    real *g, *u; /* (c, F) gate and up projections */
    real *h;     /* (c, F) silu(g)·u */
} chunk_acts;

/* Scratch gradients of one chunk; c = capacity in rows. */
typedef struct {
    real *dh, *dg, *du;     /* (c, F) */
    real *dxn2, *dx2, *dxn; /* (c, C) */
    real *dout, *dq;        /* (c, Q) */
    real *dqpre;            /* (c, Q) (Qwen3 only) */
    real *dsum;             /* (c, NH) */
} chunk_grads;

/* The gradient accumulators of the K/V side of one sequence. */
typedef struct {
    real *dk, *dv; /* (T, KV) */
    real *dkpre;   /* (T, KV) (Qwen3 only) */
} kv_work;

/* Scratch every step may use: attention's, and one block of input-norm rows. */
typedef struct {
    real *attn;     /* (attention_scratch(blk, HD)) */
    real *xn, *dxn; /* (blk, C) */
    real *rstd;     /* (blk) */
} layer_scratch;

int kv_acts_alloc(eng *e, kv_acts *a, sbp_mem_cat cat);
void kv_acts_free(eng *e, kv_acts *a);
int chunk_acts_alloc(eng *e, chunk_acts *a, int c, sbp_mem_cat cat);
void chunk_acts_free(eng *e, chunk_acts *a);
int chunk_grads_alloc(eng *e, chunk_grads *d, int c);
void chunk_grads_free(eng *e, chunk_grads *d);
int kv_work_alloc(eng *e, kv_work *d);
void kv_work_free(eng *e, kv_work *d);
int layer_scratch_alloc(eng *e, layer_scratch *sc);
void layer_scratch_free(eng *e, layer_scratch *sc);

void kv_forward(const eng *e, kv_acts *a, layer_scratch *sc, const real *x /* (T, C) */,
                const layer_p *w);
/* y may be NULL (a recompute needs the activations, not the output). */
void chunk_forward(const eng *e, chunk_acts *a, real *y /* (e-s, C) */, layer_scratch *sc,
                   const real *x /* (e-s, C) rows s.. */, const kv_acts *kv, const layer_p *w,
                   const uint8_t *kmask, int s, int end);
/* Rows [s, e): dx ← the residual path, then += the query path through the input norm; dy is
 * read before dx is written, so dx may be dy (the gradient is updated in place). kvw->dk,
 * kvw->dv += keys [0, e). */
void chunk_backward(const eng *e, real *dx /* (e-s, C) */, kv_work *kvw, layer_p *gw,
                    chunk_grads *d, layer_scratch *sc, const real *dy /* (e-s, C) */,
                    const chunk_acts *a, const kv_acts *kv, const real *x /* (e-s, C) */,
                    const layer_p *w, const uint8_t *kmask, int s, int end);
/* dx: (T, C) += the K/V path through the input norm; consumes kvw->dk, kvw->dv. */
void kv_backward(const eng *e, real *dx, layer_p *gw, kv_work *kvw, layer_scratch *sc,
                 const kv_acts *kv, const real *x /* (T, C) */, const layer_p *w);

/* ---- the LM head and the objective (head.c) ------------------------------------------------- */

/* Final norm, logits in passes of `rows` rows, the objective, and the backward down to dH.
 * For each sequence b: dh[b] (T, C) is written (+=), the head, final-norm (and tied embedding)
 * gradients accumulate, and the loss terms are added to *loss. logits: rows·V reals, or B·T·V
 * when materialised (`stride_b` apart per sequence; 0 reuses one buffer). needs_logps: run
 * DPO's forward-only first pass. */
int head_step(eng *e, double *loss, real *dh /* (B, T, C) */, const real *hL /* (B, T, C) */,
              const sbp_batch *b, real *logits, size_t stride_b, int rows, sbp_obj_eval *ev,
              int needs_logps);
/* Forward only: the log-prob of every target (B·T, by predicting position; 0 elsewhere). */
int head_logprobs(eng *e, double *logp, const real *hL /* (B, T, C) */, const sbp_batch *b,
                  int rows, double inv_tau);

/* ---- schedules (full.c, ckpt.c, stream.c) ---------------------------------------------------- */

typedef struct {
    int chunk;        /* stream layer chunk */
    int logit_rows;   /* rows per logits pass */
    int materialise;  /* one B·T·V logits buffer */
    sbp_obj_eval *ev; /* the objective (NULL when planning) */
    int needs_logps;  /* DPO: the head's forward-only first pass */
    double inv_tau;   /* forward-only runs: 1 / temperature */
} sched_opts;

int schedule_full(eng *e, double *loss, const sbp_batch *b, const sched_opts *o);
int schedule_ckpt(eng *e, double *loss, const sbp_batch *b, const sched_opts *o);
int schedule_stream(eng *e, double *loss, const sbp_batch *b, const sched_opts *o);
/* forward.c: forward only, streamed; logp as head_logprobs */
int schedule_forward(eng *e, double *logp, const sbp_batch *b, const sched_opts *o);

/* Shared by the schedules (steps.c): embedding forward of all sequences, the head step with its
 * logits buffer, and the embedding backward. */
void embed_forward(const eng *e, real *x0 /* (B, T, C) */, const sbp_batch *b);
int run_head(eng *e, double *loss, real *dh, const real *hL, const sbp_batch *b,
             const sched_opts *o);
void embed_backward(eng *e, const real *dx0 /* (B, T, C) */, const sbp_batch *b);
/* Before a layer's backward: zeroed dK, dV, dxn accumulators. */
void kv_begin_backward(const eng *e, kv_work *kvw);
void zero_reals(const eng *e, real *p, size_t n);
/* A whole layer of one sequence as a single chunk [0, T): used by full and ckpt. */
void layer_forward_whole(const eng *e, chunk_acts *a, kv_acts *kv, layer_scratch *sc,
                         real *y /* (T, C) or NULL */, const real *x /* (T, C) */, const layer_p *w,
                         const uint8_t *kmask);
/* dx may be dy: the gradient is updated in place. */
void layer_backward_whole(const eng *e, real *dx /* (T, C) */, kv_work *kvw, chunk_grads *cg,
                          layer_scratch *sc, layer_p *gw, const real *dy /* (T, C) */,
                          const chunk_acts *a, const kv_acts *kv, const real *x /* (T, C) */,
                          const layer_p *w, const uint8_t *kmask);

#endif
