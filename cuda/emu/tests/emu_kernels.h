/* emu_kernels.h — host launchers of the emulator's test kernels (emu_kernels.cu, correct kernels;
 * emu_bad_kernels.cu, kernels that break a rule on purpose). Every pointer argument is device
 * memory (cudaMalloc); every launcher only launches, the caller checks cudaGetLastError(). The
 * same sources compile with nvcc (make, CUDA=1), so they are real CUDA. */
#ifndef SBP_EMU_KERNELS_H
#define SBP_EMU_KERNELS_H

/* ---- emu_kernels.cu: each is compared bitwise against a host computation ---- */

/* out[b] = sum of x[256b .. 256b + 255] (0 past n) by a halving tree in shared memory: s[t] +=
 * s[t + h] for h = 128, 64, ..., 1, a barrier after each step. Grid ceil(n/256), block 256. */
void emu_block_sum(float *out, const float *x, int n);

/* Warp operations on x[n], n a multiple of 128; grid n/128, block 128 (4 warps). Per 32-lane warp:
 *   down[i]  = tree sum by __shfl_down_sync with offsets 16, 8, 4, 2, 1 (lane 0's value is the sum)
 *   bfly[i]  = butterfly sum by __shfl_xor_sync with lane masks 16, 8, 4, 2, 1 (every lane)
 *   scan[i]  = inclusive prefix sum by __shfl_up_sync (Hillis–Steele), in segments of 16 lanes
 *   idx[i]   = __shfl_sync(x, src[i], width[i]) with per-lane source and width {32,16,8,4,2,1}
 *   xorw[i]  = __shfl_xor_sync(x, 5, 4): lane mask 5 with width 4 */
void emu_warp_ops(float *down, float *bfly, float *scan, float *idx, float *xorw, const float *x,
                  const int *src, const int *width, int n);

/* Votes on p[n] (n a multiple of 64; grid n/64, block 64): per thread i of warp w,
 *   ballot[i] = __ballot_sync(full, p[i]); all[i] = __all_sync; any[i] = __any_sync;
 *   half[i]   = __ballot_sync of the thread's own half-warp (masks 0x0000ffff and 0xffff0000 at
 *               one call site, two disjoint groups);
 *   count[i]  = __syncthreads_count(p[i]), band[i] = __syncthreads_and, bor[i] = __syncthreads_or
 *               over the block; __syncwarp() in between. */
void emu_votes(unsigned *ballot, int *all, int *any, unsigned *half, int *count, int *band,
               int *bor, const int *p, int n);

/* C[M×N] = A[M×K] · B[K×N], row-major, 16×16 shared tiles, block (16,16), grid (⌈N/16⌉, ⌈M/16⌉).
 * Each C element is one chain acc ← fmaf(a_k, b_k, acc) over k ascending from acc = 0
 * (docs/numerics.md §4), tiles or not. */
void emu_matmul(float *C, const float *A, const float *B, int M, int N, int K);

/* Reverses each block's segment of x[n] through dynamic shared memory: out[b·bs + t] =
 * x[b·bs + bs − 1 − t]; n a multiple of bs; grid n/bs, block bs, shared bs floats. */
void emu_reverse_dynamic(float *out, const float *x, int n, int bs);

/* A 3-D block (8,4,2) in a grid (2,3,1): out[4 g + 0..3] for global thread g (block-major, then
 * linear id x + 8y + 32z) = blockIdx.x + 10 blockIdx.y, lane id as the emulator assigns it
 * (linear % 32), the linear id of the lane's xor-1 partner read through __shfl_xor_sync, and
 * threadIdx.x + 100 threadIdx.y + 10000 threadIdx.z. */
void emu_layout3d(int *out);

/* out[i] = a[i]·b[i] + c[i] written as an expression (two roundings: no contraction may fuse
 * it), fused[i] = fmaf(a[i], b[i], c[i]). Grid ⌈n/64⌉, block 64. */
void emu_mul_add(float *out, float *fused, const float *a, const float *b, const float *c, int n);

/* out[t] = the block's 64-float shared array read before any thread writes it (block 64): the
 * emulator's poison, shared memory being uninitialised on the GPU. */
void emu_read_uninit_shared(float *out);

/* A race and its fix, 64 threads: s[t] = x[t]; then out[t] = s[(t + 1) % 64], with no barrier
 * in between (racy, after a first barrier) or with one (fixed). */
void emu_neighbor_racy(float *out, const float *x);
void emu_neighbor_fixed(float *out, const float *x);
/* A race between blocks: 8 blocks of 32, thread 0 of each writes out[0] = blockIdx.x. */
void emu_last_writer(int *out);

/* Launch configurations for the launch checks: any block shape, `shared_bytes` of dynamic shared
 * memory, each thread writing out[linear id of the thread in the grid] = 1. */
void emu_touch(int *out, unsigned gx, unsigned bx, unsigned by, unsigned bz, unsigned shared_bytes);
/* Sets cudaFuncAttributeMaxDynamicSharedMemorySize of emu_touch's kernel; returns the result. */
int emu_touch_allow_shared(int bytes);

/* ---- emu_bad_kernels.cu: each breaks a rule; the emulator must report it ---- */
void bad_skip_barrier(float *out);        /* thread 5 returns before __syncthreads (block 64) */
void bad_split_barrier(float *out);       /* odd and even threads at two __syncthreads */
void bad_mask_excludes_lane(float *out);  /* all 32 lanes shuffle with mask 0x0000ffff */
void bad_exited_lane(float *out);         /* lane 31 returns, the others shuffle with a full mask */
void bad_mask_mismatch(float *out);       /* lanes 0-15 pass 0x0000ffff, lanes 16-31 0xffffffff */
void bad_source_outside_mask(float *out); /* lanes 0, 1 read lane 5 with mask 0x3 */
void bad_shuffle_vs_barrier(float *out);  /* lanes 0-15 at __syncthreads, 16-31 at a shuffle */
void bad_width(float *out);               /* __shfl_sync with width 12 */
void bad_partial_warp(float *out);        /* a full-mask shuffle in a block of 48 threads */
void bad_static_shared(float *out);       /* 52 KiB of static shared memory (emulated build only) */
void bad_static_plus_dynamic(float *out); /* 40 KiB static + 16 KiB dynamic shared memory */
void bad_oob_shared(float *out);        /* thread 31 writes s[32] of a 32-float array, by pointer */
void bad_oob_shared_index(float *out);  /* the same, indexing the SBP_SHARED array */
void bad_oob_global(float *out, int n); /* writes out[n] of an n-float allocation */

#endif
