/* emu_bad_kernels.cu — kernels that break a rule of CUDA on purpose (on a GPU they hang, or give
 * undefined results). tests/test_emu.cc checks that the emulator reports each one as an error
 * naming the kernel, instead of hanging or computing something. They are real CUDA (nvcc
 * compiles them), only wrong. Every launch is one block. */
#include "emu_kernels.h"

#include "../../sbp_cuda.h"

#define FULL 0xffffffffu

__global__ void skip_barrier_kernel(float *out) {
    SBP_SHARED(float, s, 64);
    int t = threadIdx.x;
    if (t == 5) return; /* the bug: thread 5 never reaches the barrier */
    s[t] = (float)t;
    __syncthreads();
    out[t] = s[63 - t];
}
void bad_skip_barrier(float *out) {
    SBP_LAUNCH(skip_barrier_kernel, 1, 64, 0, out);
}

__global__ void split_barrier_kernel(float *out) {
    int t = threadIdx.x;
    if (t % 2) {
        __syncthreads();
        out[t] = 1.0f;
    } else {
        __syncthreads();
        out[t] = 2.0f;
    }
}
void bad_split_barrier(float *out) {
    SBP_LAUNCH(split_barrier_kernel, 1, 64, 0, out);
}

__global__ void mask_excludes_lane_kernel(float *out) {
    float v = (float)threadIdx.x;
    out[threadIdx.x] = __shfl_down_sync(0x0000ffffu, v, 1); /* lanes 16-31 are not in the mask */
}
void bad_mask_excludes_lane(float *out) {
    SBP_LAUNCH(mask_excludes_lane_kernel, 1, 32, 0, out);
}

__global__ void exited_lane_kernel(float *out) {
    if (threadIdx.x == 31) return;
    out[threadIdx.x] = __shfl_xor_sync(FULL, (float)threadIdx.x, 1);
}
void bad_exited_lane(float *out) {
    SBP_LAUNCH(exited_lane_kernel, 1, 32, 0, out);
}

__global__ void mask_mismatch_kernel(float *out) {
    unsigned mask = threadIdx.x < 16 ? 0x0000ffffu : FULL;
    out[threadIdx.x] = __shfl_sync(mask, (float)threadIdx.x, 0);
}
void bad_mask_mismatch(float *out) {
    SBP_LAUNCH(mask_mismatch_kernel, 1, 32, 0, out);
}

__global__ void source_outside_mask_kernel(float *out) {
    if (threadIdx.x >= 2) return;
    out[threadIdx.x] = __shfl_sync(0x3u, (float)threadIdx.x, 5); /* lane 5 is not in 0x3 */
}
void bad_source_outside_mask(float *out) {
    SBP_LAUNCH(source_outside_mask_kernel, 1, 32, 0, out);
}

__global__ void shuffle_vs_barrier_kernel(float *out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x < 16)
        __syncthreads();
    else
        v = __shfl_down_sync(FULL, v, 1);
    out[threadIdx.x] = v;
}
void bad_shuffle_vs_barrier(float *out) {
    SBP_LAUNCH(shuffle_vs_barrier_kernel, 1, 32, 0, out);
}

__global__ void width_kernel(float *out) {
    out[threadIdx.x] = __shfl_sync(FULL, (float)threadIdx.x, 0, 12);
}
void bad_width(float *out) {
    SBP_LAUNCH(width_kernel, 1, 32, 0, out);
}

__global__ void partial_warp_kernel(float *out) {
    /* 48 threads: the second warp has lanes 0-15 only, and a full mask names lanes 16-31 */
    out[threadIdx.x] = __shfl_down_sync(FULL, (float)threadIdx.x, 1);
}
void bad_partial_warp(float *out) {
    SBP_LAUNCH(partial_warp_kernel, 1, 48, 0, out);
}

/* 52 KiB of static shared memory. ptxas rejects this kernel itself ("uses too much shared data"),
 * so only the emulated build has it; the emulator reports it when a thread reaches the array. */
#if SBP_EMULATED
__global__ void static_shared_kernel(float *out) {
    SBP_SHARED(float, big, 13 * 1024);
    big[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = big[31 - threadIdx.x];
}
#endif
void bad_static_shared(float *out) {
#if SBP_EMULATED
    SBP_LAUNCH(static_shared_kernel, 1, 32, 0, out);
#endif
}

/* 40 KiB static and 16 KiB dynamic: each fits, the 56 KiB together do not. */
__global__ void static_plus_dynamic_kernel(float *out) {
    SBP_SHARED(float, s, 10 * 1024);
    SBP_SHARED_DYN(float, d);
    s[threadIdx.x] = 1.0f;
    d[threadIdx.x] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = s[31 - threadIdx.x] + d[31 - threadIdx.x];
}
void bad_static_plus_dynamic(float *out) {
    SBP_LAUNCH(static_plus_dynamic_kernel, 1, 32, 16 * 1024, out);
}

__global__ void oob_shared_kernel(float *out) {
    SBP_SHARED(float, s, 32);
    float *p = s;              /* through a pointer, as a helper taking the tile would see it */
    p[threadIdx.x + 1] = 1.0f; /* thread 31 writes s[32] */
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}
void bad_oob_shared(float *out) {
    SBP_LAUNCH(oob_shared_kernel, 1, 32, 0, out);
}

__global__ void oob_shared_index_kernel(float *out) {
    SBP_SHARED(float, s, 32);
    s[threadIdx.x + 1] = 1.0f; /* thread 31 writes s[32], indexing the array itself */
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}
void bad_oob_shared_index(float *out) {
    SBP_LAUNCH(oob_shared_index_kernel, 1, 32, 0, out);
}

__global__ void oob_global_kernel(float *out, int n) {
    out[threadIdx.x + n - 31] = 1.0f; /* thread 31 writes out[n] */
}
void bad_oob_global(float *out, int n) {
    SBP_LAUNCH(oob_global_kernel, 1, 32, 0, out, n);
}
