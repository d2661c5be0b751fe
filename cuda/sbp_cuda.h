/* sbp_cuda.h — the one header every .cu source of streambp includes. Under nvcc it is real CUDA;
 * compiled as host C++ (g++ -x c++) it is the SIMT emulator in cuda/emu, so the same kernel
 * source runs on a GPU and, bit for bit, on a CPU-only machine.
 *
 * Write kernels with these idioms, not the raw CUDA syntax they stand for:
 *   SBP_LAUNCH(k, grid, block, shared_bytes, args...)    k<<<grid, block, shared_bytes>>>(args...)
 *   SBP_LAUNCH_STREAM(k, grid, block, shared_bytes, stream, args...)    the same with a stream
 *   SBP_SHARED(T, name, n);                               __shared__ T name[n];  (one per block)
 *   SBP_SHARED2(T, name, n0, n1);                         __shared__ T name[n0][n1];
 *   SBP_SHARED_DYN(T, name);                              the dynamic shared memory as T *name
 * A template kernel whose argument list has a comma goes in parentheses, so that the macro sees
 * one argument: SBP_LAUNCH((fill<float, 4>), grid, block, 0, out). Everything else in a kernel
 * is plain CUDA: threadIdx, __syncthreads(), __shfl_down_sync(), fmaf(), ... (see
 * emu/cuda_emu.h for what the emulator provides and checks).
 *
 * Numerics (docs/numerics.md §11): nvcc compiles with -fmad=false and the emulator with
 * -ffp-contract=off, never fast-math; a fused multiply-add is written as fmaf()/fma(). */
#ifndef SBP_CUDA_H
#define SBP_CUDA_H

#ifdef __CUDACC__

#include <cuda_runtime.h>

#define SBP_EMULATED 0
#define SBP_LAUNCH(kernel, grid, block, shared_bytes, ...)                                         \
    kernel<<<(grid), (block), (shared_bytes)>>>(__VA_ARGS__)
#define SBP_LAUNCH_STREAM(kernel, grid, block, shared_bytes, stream, ...)                          \
    kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
#define SBP_SHARED(T, name, n)       __shared__ T name[n]
#define SBP_SHARED2(T, name, n0, n1) __shared__ T name[n0][n1]
/* One extern array of bytes for every kernel (extern __shared__ arrays of different types in one
 * translation unit would conflict); 16-byte aligned like the emulator's. */
#define SBP_SHARED_DYN(T, name)                                                                    \
    extern __shared__ __align__(16) unsigned char sbp_dynamic_shared_[];                           \
    T *name = reinterpret_cast<T *>(sbp_dynamic_shared_)

#else

#include "emu/cuda_emu.h"

#endif

#endif
