/* kernels.h — the CPU kernels: forward/backward pairs on raw arrays of `real`.
 *
 * Contract, the same for every backward: gradients are ACCUMULATED (+=) into every output, both
 * parameter gradients and activation gradients; callers zero what must start at zero. Arguments
 * go outputs first, then inputs, then saved forward tensors, then weights, then sizes.
 *
 * Two families (docs/numerics.md §1, §10):
 *  - the portable kernels (this directory) keep the arithmetic contract of docs/numerics.md: every
 *    dot product and every sum over tokens is one fma chain in ascending order that continues
 *    from the stored value, row reductions use the fixed tree of lanes.h, the transcendental
 *    functions are our own (pmath.h), nothing is contracted or reassociated, threads split
 *    outputs only. Their bits depend on the inputs alone: not on the machine, the compiler, the
 *    thread count, or how the rows are split between calls. The CUDA kernels of cuda/ compute
 *    the same chains.
 *  - the kernels of fast/ are the fast mode's products (which runs where: docs/numerics.md
 *    §10): the linear layers on OpenBLAS (where PGEMM_TUNED is 0; otherwise the fast mode uses
 *    linear.c's, whose bits do not depend on the row split) and the attention tiles on a
 *    register-blocked product of our own (fast/tile_mm.c, the machine's vector fma), issued
 *    over fixed global token blocks [kB, (k+1)B) so that full BP, checkpointing and StreamBP
 *    make the same calls whenever their chunks are multiples of B.
 * The elementwise and row kernels (RMSNorm, RoPE, SwiGLU, embedding, log-prob) are the portable
 * ones in both modes.
 * Row ranges are given as global token positions [s, e) within one sequence; pointers point at
 * row s. */
#ifndef SBP_KERNELS_H
#define SBP_KERNELS_H

#include "../core/tiles.h"
#include "../streambp.h"
#include "real.h"

#include <stddef.h>
#include <stdint.h>

/* ---- the portable matrix product (gemm.c) ---------------------------------------------------- */

/* 1 where gemm.c's micro-kernel is in intrinsics (AVX-512, or AVX2 + FMA), tuned against
 * OpenBLAS: the fast mode then runs every linear product, the LM head's included, on it; 0 where
 * it is plain C (docs/numerics.md §10; the rates that chose this: docs/performance.md, "The AVX2
 * path"). */
/* make OPT="-O3 -DPGEMM_TUNED=0": OpenBLAS's tiles in the fast mode, to time the two builds */
#ifndef PGEMM_TUNED
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define PGEMM_TUNED 1
#else
#define PGEMM_TUNED 0
#endif
#endif

/* Reals of workspace pgemm needs for products of at most N columns and depth K (for the
 * current OpenMP thread count); a bound over several products serves all of them. One A block
 * per thread: a workspace serves calls at the thread count it was sized at or fewer, and a call
 * after omp_set_num_threads raised the count overruns it (nothing here can check: size it
 * after setting the threads, as the engine does after sbp_set_threads). */
size_t pgemm_workspace(int N, int K);
/* C (M, N; row stride ldc) += A·B, a(i,p) = A[i·rsa + p·csa], b(p,j) = B[p·rsb + j·csb]; each
 * element one chain c ← fma(a(i,p), b(p,j), c), p ascending, from its stored value. */
void pgemm(real *C, size_t ldc, real *ws /* (pgemm_workspace(N, K)) */, const real *A, size_t rsa,
           size_t csa, const real *B, size_t rsb, size_t csb, int M, int N, int K);
/* C = A·B: the same chains from +0, C's prior contents ignored (as if cleared first, which
 * gives the same bits, without a pass over C). */
void pgemm_set(real *C, size_t ldc, real *ws /* (pgemm_workspace(N, K)) */, const real *A,
               size_t rsa, size_t csa, const real *B, size_t rsb, size_t csb, int M, int N, int K);
/* The fast mode's dx and dW (docs/numerics.md §10): C += A·B with every element's sum over k cut
 * into panels [q, q + panel), q = 0, panel, 2·panel, ...: each panel's chain from +0, added to C
 * in ascending panel order, as a BLAS call with beta = 1 sums its k blocks. A sum over k terms
 * then grows its error with panel + k/panel instead of k (the LM head's dx sums over the
 * vocabulary, ~150k terms; a layer's forward over C or F, 1024–8192). The panels are fixed by k
 * alone: the bits do not depend on the rows, the row split, the threads or the machine's k
 * blocks. panel: a divisor of gemm.c's k block KC (512); PGEMM_PANEL for a product and for
 * linear_backward_blocked's dW over tokens. */
enum { PGEMM_PANEL = 128 }; /* torch's MKL cuts its k at 128 too (docs/accuracy.md) */
void pgemm_fold(real *C, size_t ldc, real *ws /* (pgemm_workspace(N, K)) */, const real *A,
                size_t rsa, size_t csa, const real *B, size_t rsb, size_t csb, int M, int N, int K,
                int panel);
/* The portable numerics' products (docs/numerics.md §4): C += A·B in the same panels, except that
 * the first panel continues C's chain (the rule of every portable sum cut into blocks: a sum of at
 * most one panel keeps the single chain's bits). */
void pgemm_panels(real *C, size_t ldc, real *ws /* (pgemm_workspace(N, K)) */, const real *A,
                  size_t rsa, size_t csa, const real *B, size_t rsb, size_t csb, int M, int N,
                  int K, int panel);
/* C = the same panel sums: the first panel's sum is C's first value (C's prior contents ignored);
 * both numerics' forward */
void pgemm_fold_set(real *C, size_t ldc, real *ws /* (pgemm_workspace(N, K)) */, const real *A,
                    size_t rsa, size_t csa, const real *B, size_t rsb, size_t csb, int M, int N,
                    int K, int panel);

/* ---- linear layers: y = x·Wᵀ + b, rows [s, e) -------------------------------------------------
 */

/* both numerics (linear.c): y = (Σ_k x·w in panels of PGEMM_PANEL, pgemm_fold_set) + b */
void linear_forward(real *y,       /* (e-s, N) */
                    real *ws,      /* (pgemm_workspace(N, K)) */
                    const real *x, /* (e-s, K) */
                    const real *w, /* (N, K) */
                    const real *b, /* (N) or NULL */
                    int s, int e, int N, int K);
/* portable: dx += dy·W (over N in panels of PGEMM_PANEL, the first continuing dx's chain:
 * pgemm_panels), dw += dyᵀ·x and db += Σ_rows dy (chains over the rows, in ascending order,
 * continuing from what dw and db hold: calls over consecutive row ranges give the same bits as
 * one call over their union). dx, dw, db may each be NULL. */
void linear_backward(real *dx,       /* (e-s, K) or NULL */
                     real *dw,       /* (N, K) */
                     real *db,       /* (N) or NULL */
                     real *ws,       /* (pgemm_workspace(K, max(N, e-s))) */
                     const real *dy, /* (e-s, N) */
                     const real *x,  /* (e-s, K) */
                     const real *w,  /* (N, K) */
                     int s, int e, int N, int K);

/* fast, where PGEMM_TUNED (linear.c): dx += dy·W by pgemm_fold in panels of PGEMM_PANEL; dw summed
 * per global token panel [kP, (k+1)P) ∩ [s, e), P = PGEMM_PANEL, by pgemm_fold straight into dw
 * where PGEMM_PANEL divides the token block B, else per global token block [kB, (k+1)B) ∩ [s, e)
 * (LINEAR_PANEL output rows at a time into part, then added); db per global token block, in
 * double, one rounding per fold. Each panel's or block's part from +0, folded in ascending order.
 * Calls over consecutive row ranges that end on block boundaries give the bits of one call over
 * their union. */
enum { LINEAR_PANEL = 192 };
/* db (N) += Σ_rows dy (e-s, N), per global token block of blk rows as above (also OpenBLAS's) */
void linear_bias_blocked(real *db, const real *dy, int s, int e, int N, int blk);
/* reals of part, for every K <= width; 0 where PGEMM_PANEL divides blk, the path without part */
size_t linear_blocked_workspace(int width, int blk);
void linear_backward_blocked(real *dx,       /* (e-s, K) or NULL */
                             real *dw,       /* (N, K) */
                             real *db,       /* (N) or NULL */
                             real *ws,       /* (pgemm_workspace(K, max(N, e-s))) */
                             real *part,     /* (linear_blocked_workspace(K, blk)) */
                             const real *dy, /* (e-s, N) */
                             const real *x,  /* (e-s, K) */
                             const real *w,  /* (N, K) */
                             int s, int e, int N, int K, int blk);

/* fast (fast/linear.c): the same on OpenBLAS, one single-threaded call per tile of a fixed grid
 * (global token blocks of blk rows, panels of BLAS_LINEAR_N_PANEL output features, of
 * BLAS_LINEAR_K_PANEL input features for dW and of BLAS_LINEAR_DX_K_PANEL for dx), the tiles
 * shared among the OpenMP threads */
#define BLAS_LINEAR_N_PANEL    1024
#define BLAS_LINEAR_K_PANEL    256
#define BLAS_LINEAR_DX_K_PANEL 512
void blas_linear_forward(real *y, const real *x, const real *w, const real *b, int s, int e, int N,
                         int K, int blk);
void blas_linear_backward(real *dx, real *dw, real *db, const real *dy, const real *x,
                          const real *w, int s, int e, int N, int K, int blk);

/* ---- RMSNorm: out = (x · rsqrt(mean(x²) + eps)) · w, per row of C ---------------------------- */

void rmsnorm_forward(real *out,     /* (M, C) */
                     real *rstd,    /* (M) saved 1/sqrt(mean(x²)+eps) */
                     const real *x, /* (M, C) */
                     const real *w, /* (C) */
                     int M, int C, double eps);
void rmsnorm_backward(real *dx,         /* (M, C) += (NULL: dw alone) */
                      real *dw,         /* (C) += , a chain over the rows; or NULL */
                      const real *dout, /* (M, C) */
                      const real *x,    /* (M, C) */
                      const real *rstd, /* (M) */
                      const real *w,    /* (C) */
                      int M, int C);

/* The fast mode's (docs/numerics.md §10): dx as rmsnorm_backward; dw summed per block of blk rows
 * counted from row 0 of the call (a sum in double from +0 each, folded in ascending order with one
 * rounding). Every fast-mode call starts on a token block boundary when the chunks are block
 * multiples (and a row of q_norm's M·NH rows at token s is row s·NH, a multiple of blk too), so
 * the blocks are the same global ones in every schedule. */
void rmsnorm_backward_blocked(real *dx, real *dw, const real *dout, const real *x, const real *rstd,
                              const real *w, int M, int C, int blk);

/* ---- RoPE, rotate-half: (a, b) = (x[i], x[i+HD/2]) -> (a·cos − b·sin, b·cos + a·sin) -------- */

/* cos/sin of position·inv_freq for positions [0, T), computed in double with pmath.h's
 * functions (see ref/SEMANTICS.md) and rounded to real. */
void rope_table(real *cos, real *sin, /* (T, HD/2) each */
                int T, int HD, double theta, int llama3, double factor, double low_freq,
                double high_freq, double orig_max);
void rope_forward(real *x,                          /* (M, H, HD), rotated in place */
                  const real *cos, const real *sin, /* (T, HD/2) */
                  int s, int M, int H, int HD);     /* rows are positions s .. s+M-1 */
void rope_backward(real *dx,                        /* (M, H, HD), in place */
                   const real *cos, const real *sin, int s, int M, int H, int HD);

/* ---- causal GQA attention, tiled with an online softmax -------------------------------------- *
 * Query i (global position) sees key j iff j <= i, kmask[j] == 1 and, on a sliding-window layer
 * (window W > 0), i − W < j: the W most recent keys, the query's own included (HF's
 * tril(diagonal=−W) mask, docs/gemma3.md). Query head h reads kv head h / (NH/NKV). Only O and
 * the row log-sum-exp are kept; no T×T matrix exists. A query with no visible key gets O = 0 and
 * lse = +inf. K and V are given for the whole sequence (keys 0..T-1); dK and dV are accumulated
 * for keys 0 .. s+M-1 (on a window layer only keys from s − W + 1 on receive anything). */

/* What one attention call computes: the sizes, the queries, and the two parameters of the
 * softmax. Shared by the portable, fast, unattended and CUDA kernels. */
typedef struct {
    int s, M;        /* the queries: global positions s .. s+M-1 */
    int T;           /* tokens of the sequence (keys 0 .. T-1) */
    int NH, NKV, HD; /* query heads, key/value heads, head dim */
    int blk;         /* the fast mode's token block (its tiles divide it); unused elsewhere */
    int window;   /* 0: causal (global); W > 0: key j visible from query i iff i − W < j ≤ i */
    double scale; /* the scores are (q·k)·(real)scale: 1/sqrt(HD), or Gemma-3's
                     query_pre_attn_scalar^−0.5 */
    /* The backward split between ranks (sequence parallel, docs/distributed.md §8); all 0 in
     * one process, and for the forward. kv_lo, kv_hi: dK and dV of the keys [kv_lo, kv_hi) only,
     * which dk and dv then hold from row 0 (kv_hi = 0: every key, key j at row j), kv_lo a
     * multiple of every kernel's key tile and kv_hi one too, or past the call's last key (a
     * tile is owned by where it starts); no_dq: dQ is not formed (dq unused); dsum_in: dsum
     * holds D = rowsum(dO ⊙ O) on entry (o unused). A key's dK, dV and a query's dQ get the very
     * terms, in the very order, of the call without them. The CPU kernels only (the CUDA ones
     * are not run with them). */
    int kv_lo, kv_hi, no_dq, dsum_in;
} sbp_attn_dims;

/* Whether the key tile at j0 receives dK and dV in the call d (kv_lo, kv_hi above). */
static inline int attn_kv_owned(const sbp_attn_dims *d, int j0) {
    return !d->kv_hi || (j0 >= d->kv_lo && j0 < d->kv_hi);
}

/* Whether kmask lets any of the keys [j0, j0 + nk) be seen. A key tile without such a key adds
 * nothing to any query: its P is 0 and its dS ±0, and every sum it would join (l, O, dQ, dK,
 * dV, from +0 and never −0) keeps its bits, so the CPU kernels skip it. Left padding makes such
 * tiles: every tile before a row's first real token, for each of the row's query tiles. */
static inline int attn_tile_has_key(const uint8_t *kmask, int j0, int nk) {
    for (int c = 0; c < nk; c++)
        if (kmask[j0 + c]) return 1;
    return 0;
}

/* The row of dk and dv that holds key j in the call d. */
static inline size_t attn_kv_row(const sbp_attn_dims *d, int j) {
    return (size_t)(d->kv_hi ? j - d->kv_lo : j);
}

/* portable (attention.c): key tiles of ATTN_TILE keys at fixed absolute positions; a query's
 * result depends on its position and the keys alone, never on the chunk it is computed in. */
enum { ATTN_TILE = 64 };
size_t attention_workspace(int HD);          /* reals, for the current OpenMP thread count */
void attention_forward(real *o,              /* (M, NH·HD) queries s .. s+M-1 */
                       real *lse,            /* (M, NH) */
                       real *ws,             /* (attention_workspace(HD)) */
                       const real *q,        /* (M, NH·HD) */
                       const real *k,        /* (T, NKV·HD) */
                       const real *v,        /* (T, NKV·HD) */
                       const uint8_t *kmask, /* (T) */
                       const sbp_attn_dims *d);
void attention_backward(real *dq,             /* (M, NH·HD) += */
                        real *dk,             /* (T, NKV·HD) += keys 0 .. s+M-1 */
                        real *dv,             /* (T, NKV·HD) += */
                        real *dsum,           /* (M, NH) scratch: rowsum(dO ⊙ O) */
                        real *ws,             /* (attention_workspace(HD)) */
                        const real *dout,     /* (M, NH·HD) */
                        const real *o,        /* (M, NH·HD) */
                        const real *lse,      /* (M, NH) */
                        const real *q,        /* (M, NH·HD) */
                        const real *k,        /* (T, NKV·HD) */
                        const real *v,        /* (T, NKV·HD) */
                        const uint8_t *kmask, /* (T) */
                        const sbp_attn_dims *d);

/* fast (fast/attention.c): tiles of attention_tile(d->blk) on the global grid, products in
 * registers (fast/tile_mm.c); the arguments and shapes are the portable kernels' */
/* attention_tile and attention_one_pass: src/core/tiles.h */
size_t tiled_attention_workspace(int blk, int NH, int NKV, int HD); /* reals */
void tiled_attention_forward(real *o, real *lse, real *ws, const real *q, const real *k,
                             const real *v, const uint8_t *kmask, const sbp_attn_dims *d);
void tiled_attention_backward(real *dq, real *dk, real *dv, real *dsum, real *ws, const real *dout,
                              const real *o, const real *lse, const real *q, const real *k,
                              const real *v, const uint8_t *kmask, const sbp_attn_dims *d);

/* Rows with no visible key (unattended.c): mode is an sbp_unattended. The attention kernels
 * leave such rows at O = 0, lse = +inf and add nothing for them in the backward; these give the
 * row HF's output, after the forward kernel, and its gradients, before the backward kernel. */
size_t unattended_workspace(int T);           /* reals */
void unattended_forward(real *o,              /* (M, NH·HD) rows without a key overwritten */
                        real *ws,             /* (unattended_workspace(T)) */
                        const real *q,        /* (M, NH·HD) */
                        const real *k,        /* (T, NKV·HD) */
                        const real *v,        /* (T, NKV·HD) */
                        const uint8_t *kmask, /* (T) */
                        const sbp_attn_dims *d, int mode);
void unattended_backward(real *dq,             /* (M, NH·HD) += */
                         real *dk,             /* (T, NKV·HD) += every key */
                         real *dv,             /* (T, NKV·HD) += every key */
                         real *ws,             /* (unattended_workspace(T)) */
                         const real *dout,     /* (M, NH·HD) */
                         const real *o,        /* (M, NH·HD) */
                         const real *q,        /* (M, NH·HD) */
                         const real *k,        /* (T, NKV·HD) */
                         const real *v,        /* (T, NKV·HD) */
                         const uint8_t *kmask, /* (T) */
                         const sbp_attn_dims *d, int mode);

/* ---- SwiGLU: h = silu(g) ⊙ u ----------------------------------------------------------------- */

void swiglu_forward(real *h, const real *g, const real *u, size_t n);
void swiglu_backward(real *dg, real *du, /* += */
                     const real *dh, const real *g, const real *u, size_t n);

/* ---- GeGLU (Gemma-3): h = gelu_tanh(g) ⊙ u, torch's approximate="tanh" (geglu.c) ----------- */

void geglu_forward(real *h, const real *g, const real *u, size_t n);
void geglu_backward(real *dg, real *du, /* += */
                    const real *dh, const real *g, const real *u, size_t n);

/* ---- storage precision ---------------------------------------------------------------------- */

/* x[i] ← x[i] rounded to bfloat16 (round to nearest even), kept in the working precision. */
void round_to_bf16(real *x, size_t n);

/* ---- embedding ------------------------------------------------------------------------------- */

void embedding_forward(real *x,            /* (T, C) */
                       const int32_t *ids, /* (T) */
                       const real *emb,    /* (V, C) */
                       int T, int C);
void embedding_backward(real *demb,     /* (V, C) += rows of ids, in ascending t */
                        const real *dx, /* (T, C) */
                        const int32_t *ids, int T, int C);

/* ---- log-probability of a target under softmax(logits) -------------------------------------- *
 * Rows with target < 0 are skipped (logp = lse = 0). The sum over V accumulates in double. */
void logprob_forward(double *logp,          /* (M) logits[y] − logsumexp(logits) */
                     double *lse,           /* (M) */
                     const real *logits,    /* (M, V) */
                     const int32_t *target, /* (M) */
                     int M, int V);
/* Overwrites logits with dL/dlogits = coef · (onehot(y) − softmax), coef = dL/dlogp per row;
 * rows with target < 0 or coef == 0 become zero. */
void logprob_backward(real *logits,       /* (M, V) in: logits, out: their gradient */
                      const double *coef, /* (M) */
                      const double *lse,  /* (M) */
                      const int32_t *target, int M, int V);

#endif
