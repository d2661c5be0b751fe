/* cuda.cuh — what the CUDA op tables share: the engine's types, the launch shapes, the run's
 * device state, and the host launchers of every kernel pair (one .cu file per pair, as
 * src/kernels has one .c per pair).
 *
 * These sources are built four times: by nvcc for a GPU and by g++ against the SIMT emulator
 * (cuda/emu), each in float and in double (SBP_REAL_F64). SBP_CUDA_NS gives each build its own
 * namespace, so all four live in one binary; the tables are reached through registry.cc.
 *
 * The arithmetic is the portable contract of docs/numerics.md §11, the same chains and trees as the
 * CPU's portable kernels (src/kernels/): every output element has one owner (no atomics, no split
 * sums), every dot product and sum over tokens is one fma chain in ascending order from the
 * stored value, and row reductions use the 32-lane tree of src/kernels/lanes.h with lane k a
 * warp's lane k and the halving tree done by __shfl_down_sync. nvcc compiles with -fmad=false and
 * the emulator with -ffp-contract=off, so a*b+c is never fused behind our back. */
#ifndef SBP_CUDA_CUH
#define SBP_CUDA_CUH

#include "sbp_cuda.h"

extern "C" {
#include "../src/engine/engine.h"
#include "../src/kernels/kernels.h" /* ATTN_TILE: the key tiles of both */
}

#include <stddef.h>
#include <stdio.h>

#if SBP_EMULATED
#ifdef SBP_REAL_F64
#define SBP_CUDA_NS    sbp_cuda_emu_f64
#define SBP_CUDA_TABLE sbp_ops_cuda_emu_f64
#else
#define SBP_CUDA_NS    sbp_cuda_emu_f32
#define SBP_CUDA_TABLE sbp_ops_cuda_emu_f32
#endif
#else
#ifdef SBP_REAL_F64
#define SBP_CUDA_NS    sbp_cuda_gpu_f64
#define SBP_CUDA_TABLE sbp_ops_cuda_f64
#else
#define SBP_CUDA_NS    sbp_cuda_gpu_f32
#define SBP_CUDA_TABLE sbp_ops_cuda_f32
#endif
#endif

#define FULL_MASK 0xffffffffu

namespace SBP_CUDA_NS {

enum {
    WARP = 32,
    THREADS = 256,         /* threads of a one-dimensional block */
    WARPS = THREADS / WARP /* warps per block, for the kernels that give a warp to a row */
};

static inline unsigned blocks_for(size_t n, size_t per) {
    return (unsigned)((n + per - 1) / per);
}

/* The device state of one run (eng.backend): every live allocation with its size and ledger
 * category, and the first failure. */
struct device_block {
    void *p;
    size_t bytes;
    int cat; /* sbp_mem_cat */
};
struct device_state {
    device_block *blocks;
    int n, cap;
    int failed;
    int sync; /* SBP_CUDA_SYNC=1: every launch is followed by a synchronize (check) */
    char msg[640];
};

static inline device_state *device_of(const eng *e) {
    return (device_state *)e->backend;
}

/* check.cu. After a launch or a runtime call: records the first error of the run (the run then
 * fails, and the entry point reports the message). With SBP_CUDA_SYNC=1 in the environment it first
 * waits for the device, so that a fault inside a kernel is reported under that kernel's name
 * instead of at a later call (the launches are asynchronous on a GPU; the emulator runs them at
 * once). */
void check(const eng *e, const char *what);
/* Records the run's first failure, printf-style with two strings (check.cu); a later one is
 * dropped. */
void fail(const eng *e, const char *fmt, const char *a, const char *b);

/* ---- the kernel pairs (one file each) ------------------------------------------------------- */

/* gemm.cu: C (M, N; ldc) += A·B, a(i,p) = A[i·rsa + p·csa], b(p,j) = B[p·rsb + j·csb] */
void pgemm(const eng *e, real *C, size_t ldc, const real *A, size_t rsa, size_t csa, const real *B,
           size_t rsb, size_t csb, int M, int N, int K);
void linear_forward(const eng *e, real *y, const real *x, const real *w, const real *b, int s,
                    int end, int N, int K);
void linear_backward(const eng *e, real *dx, real *dw, real *db, const real *dy, const real *x,
                     const real *w, int s, int end, int N, int K);

/* rmsnorm.cu */
void rmsnorm_forward(const eng *e, real *out, real *rstd, const real *x, const real *w, int M,
                     int C);
void rmsnorm_backward(const eng *e, real *dx, real *dw, const real *dout, const real *x,
                      const real *rstd, const real *w, int M, int C);

/* rope.cu */
void rope_table(const eng *e, real *cos, real *sin);
void rope_forward(const eng *e, real *x, int s, int M, int H);
void rope_backward(const eng *e, real *dx, int s, int M, int H);

/* attention.cu */
void attention_forward(const eng *e, real *o, real *lse, const real *q, const real *k,
                       const real *v, const uint8_t *kmask, const sbp_attn_dims *d);
void attention_backward(const eng *e, real *dq, real *dk, real *dv, real *dsum, const real *dout,
                        const real *o, const real *lse, const real *q, const real *k, const real *v,
                        const uint8_t *kmask, const sbp_attn_dims *d);

/* unattended.cu: rows that see no key (src/kernels/unattended.c) */
size_t unattended_workspace(const eng *e);
void unattended_forward(const eng *e, real *o, const real *q, const real *k, const real *v,
                        const uint8_t *kmask, const sbp_attn_dims *d);
void unattended_backward(const eng *e, real *dq, real *dk, real *dv, const real *dout,
                         const real *o, const real *q, const real *k, const real *v,
                         const uint8_t *kmask, const sbp_attn_dims *d);

/* swiglu.cu */
void swiglu_forward(const eng *e, real *h, const real *g, const real *u, size_t n);
void swiglu_backward(const eng *e, real *dg, real *du, const real *dh, const real *g, const real *u,
                     size_t n);

/* geglu.cu */
void geglu_forward(const eng *e, real *h, const real *g, const real *u, size_t n);
void geglu_backward(const eng *e, real *dg, real *du, const real *dh, const real *g, const real *u,
                    size_t n);

/* embedding.cu */
void embedding_forward(const eng *e, real *x, const int32_t *ids, int T);
void embedding_backward(const eng *e, real *demb, const real *dx, const int32_t *ids, int T);

/* logprob.cu */
void logprob_forward(const eng *e, double *logp, double *lse, const real *logits,
                     const int32_t *target, int M);
void logprob_backward(const eng *e, real *logits, const double *coef, const double *lse,
                      const int32_t *target, int M);

} // namespace SBP_CUDA_NS

#endif
