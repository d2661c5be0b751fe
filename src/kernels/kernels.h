/* kernels.h — the CPU kernels: forward/backward pairs on raw arrays of `real`.
 *
 * Contract, the same for every backward: gradients are ACCUMULATED (+=) into every output, both
 * parameter gradients and activation gradients; callers zero what must start at zero. Arguments
 * go outputs first, then inputs, then saved forward tensors, then weights, then sizes.
 *
 * Exactness rules these kernels keep (README, "Exactness"):
 *  - every sum over tokens runs in ascending token order, either sequentially into a persistent
 *    accumulator or as BLAS calls over fixed token blocks [kB, (k+1)B) in ascending order, so the
 *    sum is the same whichever rows a caller hands in one call;
 *  - row-wise products are also issued per token block, so every BLAS call has the same shape
 *    and operands whatever the chunking;
 *  - OpenMP loops run over independent outputs only, with a fixed order inside each output, so
 *    results do not depend on the thread count.
 * Row ranges are given as global token positions [s, e) within one sequence; pointers point at
 * row s. */
#ifndef SBP_KERNELS_H
#define SBP_KERNELS_H

#include "real.h"

#include <stddef.h>
#include <stdint.h>

/* ---- linear layers (OpenBLAS) --------------------------------------------------------------- */

/* y = x·Wᵀ (+ b), rows [s, e). */
void linear_forward(real *y,       /* (e-s, N) */
                    const real *x, /* (e-s, K) */
                    const real *w, /* (N, K) */
                    const real *b, /* (N) or NULL */
                    int s, int e, int N, int K, int blk);
/* dx += dy·W, dw += dyᵀ·x, db += Σ_rows dy. */
void linear_backward(real *dx,       /* (e-s, K) or NULL */
                     real *dw,       /* (N, K) */
                     real *db,       /* (N) or NULL */
                     const real *dy, /* (e-s, N) */
                     const real *x,  /* (e-s, K) */
                     const real *w,  /* (N, K) */
                     int s, int e, int N, int K, int blk);

/* ---- RMSNorm: out = (x · rsqrt(mean(x²) + eps)) · w, per row of C ---------------------------- */

void rmsnorm_forward(real *out,     /* (M, C) */
                     real *rstd,    /* (M) saved 1/sqrt(mean(x²)+eps) */
                     const real *x, /* (M, C) */
                     const real *w, /* (C) */
                     int M, int C, double eps);
void rmsnorm_backward(real *dx,         /* (M, C) += */
                      real *dw,         /* (C) += */
                      const real *dout, /* (M, C) */
                      const real *x,    /* (M, C) */
                      const real *rstd, /* (M) */
                      const real *w,    /* (C) */
                      int M, int C);

/* ---- RoPE, rotate-half: (a, b) = (x[i], x[i+HD/2]) -> (a·cos − b·sin, b·cos + a·sin) -------- */

/* cos/sin of position·inv_freq for positions [0, T), computed in double (see ref/SEMANTICS.md). */
void rope_table(real *cos, real *sin, /* (T, HD/2) each */
                int T, int HD, double theta, int llama3, double factor, double low_freq,
                double high_freq, double orig_max);
void rope_forward(real *x,                          /* (M, H, HD), rotated in place */
                  const real *cos, const real *sin, /* (T, HD/2) */
                  int s, int M, int H, int HD);     /* rows are positions s .. s+M-1 */
void rope_backward(real *dx,                        /* (M, H, HD), in place */
                   const real *cos, const real *sin, int s, int M, int H, int HD);

/* ---- causal GQA attention, tiled with an online softmax -------------------------------------- *
 * Query i (global position) sees key j iff j <= i and kmask[j] == 1; query head h reads kv head
 * h / (NH/NKV). Only O and the row log-sum-exp are kept; no T×T matrix exists. A query with no
 * visible key gets O = 0 and lse = +inf. K and V are given for the whole sequence (keys
 * 0..T-1). Tiles are attention_tile(blk) wide on the global grid, so chunks that are multiples
 * of blk make the same BLAS calls as one pass over all T. */

/* The tile width: the largest divisor of blk that is at most 128 (src/core/tiles.c: one
 * definition for both precisions and the FLOP count). */
int attention_tile(int blk);
/* Reals of scratch the two functions below need (per thread, times the OpenMP thread count). */
size_t attention_scratch(int blk, int HD);
void attention_forward(real *o,              /* (M, NH·HD) queries s .. s+M-1 */
                       real *lse,            /* (M, NH) */
                       real *scratch,        /* (attention_scratch(blk, HD)) */
                       const real *q,        /* (M, NH·HD) */
                       const real *k,        /* (T, NKV·HD) */
                       const real *v,        /* (T, NKV·HD) */
                       const uint8_t *kmask, /* (T) */
                       int s, int M, int T, int NH, int NKV, int HD, int blk);
void attention_backward(real *dq,             /* (M, NH·HD) += */
                        real *dk,             /* (T, NKV·HD) += keys 0 .. s+M-1 */
                        real *dv,             /* (T, NKV·HD) += */
                        real *dsum,           /* (M, NH) scratch: rowsum(dO ⊙ O) */
                        real *scratch,        /* (attention_scratch(blk, HD)) */
                        const real *dout,     /* (M, NH·HD) */
                        const real *o,        /* (M, NH·HD) */
                        const real *lse,      /* (M, NH) */
                        const real *q,        /* (M, NH·HD) */
                        const real *k,        /* (T, NKV·HD) */
                        const real *v,        /* (T, NKV·HD) */
                        const uint8_t *kmask, /* (T) */
                        int s, int M, int T, int NH, int NKV, int HD, int blk);

/* ---- SwiGLU: h = silu(g) ⊙ u ----------------------------------------------------------------- */

void swiglu_forward(real *h, const real *g, const real *u, size_t n);
void swiglu_backward(real *dg, real *du, /* += */
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
 * Rows with target < 0 are skipped (logp = lse = 0). Sums over V accumulate in double. */
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
