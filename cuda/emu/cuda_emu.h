/* cuda_emu.h — the CUDA subset streambp's kernels use, as host C++17: a SIMT emulator.
 *
 * Include it through cuda/sbp_cuda.h, which is real CUDA under nvcc. Compiled with g++ -x c++,
 * a .cu file's kernels become plain functions and SBP_LAUNCH runs them: every block's threads are
 * cooperative fibers on the host thread that launched, the blocks one after another. A fiber runs
 * until it reaches a barrier (__syncthreads), a warp operation (shuffle, vote, __syncwarp) or the
 * end of the kernel; when no fiber of the block can run, the emulator completes the barriers and
 * warp operations whose every participant has arrived, and the next round resumes them in the
 * order sbp_emu_set_order() chose. So a barrier or a shuffle means what it means on the GPU, and
 * what it cannot mean is reported, never a hang:
 *   - a __syncthreads that a thread of the block never reaches (it returned, or waits at another
 *     __syncthreads call site);
 *   - a warp operation whose mask omits the calling lane, names a lane that does not exist or has
 *     exited, or a lane waiting somewhere else (another call site, another mask, a barrier);
 *     a shuffle that reads a lane outside the mask; a width that is not a power of two <= 32;
 *   - shared memory over 48 KiB per block (more only with cudaFuncSetAttribute, up to 227 KiB);
 *   - a launch configuration CUDA rejects (blockDim over 1024 threads, a zero dimension, ...),
 *     or a grid of more than 2^24 blocks (the emulator's own limit);
 *   - a cudaMemcpy/cudaMemset whose device range is not inside one cudaMalloc allocation, a NULL
 *     pointer, overlapping ranges, a host pointer where the kind says device or the reverse.
 * A fault inside a kernel stops the launch and is sticky, as on a GPU: cudaGetLastError,
 * cudaDeviceSynchronize and every later call return it until sbp_emu_clear_error() or
 * cudaDeviceReset(). A bad launch configuration is not sticky (cudaGetLastError returns it once).
 * The message (sbp_emu_last_message(), also in cudaGetErrorString of that error) names the kernel,
 * the block, the threads and the call sites.
 *
 * Memory, made for AddressSanitizer (make SAN=1): cudaMalloc returns host memory of exactly the
 * requested size, and each block's every SBP_SHARED array and its dynamic shared memory are
 * separate, exactly sized allocations made fresh for the block, so an out-of-bounds global or
 * shared access is a heap-buffer-overflow report. Fresh device and shared memory is filled with
 * the 32-bit pattern SBP_EMU_POISON (a quiet NaN as float, and as double), so a read of memory
 * nothing wrote shows up in the results.
 *
 * Idioms the kernels must follow (they are what sbp_cuda.h maps to CUDA):
 *   - shared memory: SBP_SHARED(T, name, n), SBP_SHARED2(T, name, n0, n1), SBP_SHARED_DYN(T,
 *     name). A bare `__shared__` does not compile here (it is not defined), on purpose;
 *   - launches: SBP_LAUNCH(kernel, grid, block, shared_bytes, args...), which stringizes the
 *     kernel's name for messages. Launches are synchronous;
 *   - warp operations with a full mask need a block size that is a multiple of 32 (a lane past the
 *     end of the block does not exist), and no thread may return before a barrier or a warp
 *     operation that names it;
 *   - no atomics (none are provided: streambp's sums have a fixed order, docs/numerics.md §4).
 *
 * Numerics: compile with -ffp-contract=off and without fast-math (the Makefile does), so a*b+c is
 * two roundings as under nvcc -fmad=false; fmaf()/fma()/sqrtf()/sqrt() are the host's libm,
 * correctly rounded like the GPU's. Subnormals are kept on both.
 *
 * Not emulated: atomics, cooperative groups, __activemask, warp-level reductions (__reduce_*),
 * match, textures, events, device properties, concurrent streams (all work is synchronous),
 * dynamic parallelism. Device assert() is the host's (it aborts the process). */
#ifndef SBP_CUDA_EMU_H
#define SBP_CUDA_EMU_H

#ifdef __CUDACC__
#error "cuda_emu.h emulates CUDA on the host; under nvcc include sbp_cuda.h"
#endif

#include "sbp_emu.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- qualifiers -------------------------------------------------------------------------------
 * Kernels and device functions are ordinary host functions here. __shared__ is left undefined so
 * that kernels use SBP_SHARED, the per-block form the emulator can give each block anew. */
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __noinline__    __attribute__((noinline))
#define __align__(n)    __attribute__((aligned(n)))
#define __launch_bounds__(...)

#define SBP_EMULATED 1
/* The fill of fresh device and shared memory: a quiet NaN as float and as double (0x7ffdead7
 * twice), 2147347159 as int32. */
#define SBP_EMU_POISON 0x7ffdead7u

/* ---- vector types and built-in variables ------------------------------------------------------
 */
struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
        : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct __align__(8) float2 {
    float x, y;
};
struct __align__(16) float4 {
    float x, y, z, w;
};
struct __align__(8) int2 {
    int x, y;
};
struct __align__(16) int4 {
    int x, y, z, w;
};
struct __align__(16) double2 {
    double x, y;
};
inline float2 make_float2(float x, float y) {
    return {x, y};
}
inline float4 make_float4(float x, float y, float z, float w) {
    return {x, y, z, w};
}
inline int2 make_int2(int x, int y) {
    return {x, y};
}
inline int4 make_int4(int x, int y, int z, int w) {
    return {x, y, z, w};
}
inline double2 make_double2(double x, double y) {
    return {x, y};
}

static constexpr int warpSize = 32;

namespace sbp_emu {
/* The running fiber's CUDA coordinates. The emulator rewrites thread_idx at every fiber switch and
 * the others at every block; thread-local because fibers live on the host thread that launched. */
struct Builtins {
    uint3 thread_idx, block_idx;
    dim3 block_dim, grid_dim;
};
extern thread_local Builtins builtins;
} // namespace sbp_emu

#define threadIdx (static_cast<const uint3 &>(::sbp_emu::builtins.thread_idx))
#define blockIdx  (static_cast<const uint3 &>(::sbp_emu::builtins.block_idx))
#define blockDim  (static_cast<const dim3 &>(::sbp_emu::builtins.block_dim))
#define gridDim   (static_cast<const dim3 &>(::sbp_emu::builtins.grid_dim))

/* ---- runtime API types ------------------------------------------------------------------------
 */
/* Codes as in CUDA's driver_types.h. */
enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidSymbol = 13,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorInvalidDevice = 101,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
};
typedef enum cudaError cudaError_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};
/* Streams are accepted and ignored: all work is synchronous. */
typedef struct CUstream_st *cudaStream_t;

/* Every API function takes the caller's file and line as defaulted trailing arguments
 * (__builtin_FILE/__builtin_LINE), so a misuse is reported with its call site. */
#define SBP_EMU_CALLER const char *sbp_file = __builtin_FILE(), int sbp_line = __builtin_LINE()
#define SBP_EMU_AT                                                                                 \
    ::sbp_emu::Site {                                                                              \
        sbp_file, sbp_line, 0                                                                      \
    }

namespace sbp_emu {
struct Site {
    const char *file;
    int line, column;
};
} // namespace sbp_emu

cudaError_t cudaMalloc(void **ptr, size_t bytes, SBP_EMU_CALLER);
template <class T> inline cudaError_t cudaMalloc(T **ptr, size_t bytes, SBP_EMU_CALLER) {
    return cudaMalloc(reinterpret_cast<void **>(ptr), bytes, sbp_file, sbp_line);
}
cudaError_t cudaFree(void *ptr, SBP_EMU_CALLER);
cudaError_t cudaMallocHost(void **ptr, size_t bytes, SBP_EMU_CALLER);
template <class T> inline cudaError_t cudaMallocHost(T **ptr, size_t bytes, SBP_EMU_CALLER) {
    return cudaMallocHost(reinterpret_cast<void **>(ptr), bytes, sbp_file, sbp_line);
}
cudaError_t cudaFreeHost(void *ptr, SBP_EMU_CALLER);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                       SBP_EMU_CALLER);
cudaError_t cudaMemset(void *ptr, int value, size_t bytes, SBP_EMU_CALLER);
inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t = nullptr, SBP_EMU_CALLER) {
    return cudaMemcpy(dst, src, bytes, kind, sbp_file, sbp_line);
}
inline cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t = nullptr,
                                   SBP_EMU_CALLER) {
    return cudaMemset(ptr, value, bytes, sbp_file, sbp_line);
}
namespace sbp_emu {
cudaError_t symbol_copy(void *symbol, size_t symbol_bytes, size_t offset, void *host, size_t bytes,
                        bool to_symbol, Site site);
}
/* __constant__ (and __device__) variables are host globals; these copy to and from them. */
template <class T>
inline cudaError_t cudaMemcpyToSymbol(T &symbol, const void *src, size_t bytes, size_t offset = 0,
                                      cudaMemcpyKind = cudaMemcpyHostToDevice, SBP_EMU_CALLER) {
    return sbp_emu::symbol_copy(const_cast<void *>(static_cast<const void *>(&symbol)), sizeof(T),
                                offset, const_cast<void *>(src), bytes, true, SBP_EMU_AT);
}
template <class T>
inline cudaError_t cudaMemcpyFromSymbol(void *dst, T &symbol, size_t bytes, size_t offset = 0,
                                        cudaMemcpyKind = cudaMemcpyDeviceToHost, SBP_EMU_CALLER) {
    return sbp_emu::symbol_copy(const_cast<void *>(static_cast<const void *>(&symbol)), sizeof(T),
                                offset, dst, bytes, false, SBP_EMU_AT);
}
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
namespace sbp_emu {
cudaError_t func_set_attribute(const void *func, cudaFuncAttribute attr, int value, Site site);
}
/* Only cudaFuncAttributeMaxDynamicSharedMemorySize (the opt-in above 48 KiB) is emulated. */
template <class F>
inline cudaError_t cudaFuncSetAttribute(F *func, cudaFuncAttribute attr, int value,
                                        SBP_EMU_CALLER) {
    return sbp_emu::func_set_attribute(reinterpret_cast<const void *>(func), attr, value,
                                       SBP_EMU_AT);
}

/* ---- barriers and warp operations -------------------------------------------------------------
 * Each takes its call site as defaulted arguments: the emulator matches the participants of a
 * barrier or a warp operation by call site, and names it in messages. The site is file:line, and
 * the column too where the compiler has __builtin_COLUMN (clang; GCC 12 does not), so under GCC two
 * calls of one operation on one source line count as one site. */
#if defined(__has_builtin)
#if __has_builtin(__builtin_COLUMN)
#define SBP_EMU_COLUMN __builtin_COLUMN()
#endif
#endif
#ifndef SBP_EMU_COLUMN
#define SBP_EMU_COLUMN 0
#endif
#define SBP_EMU_SITE                                                                               \
    const char *sbp_file = __builtin_FILE(), int sbp_line = __builtin_LINE(),                      \
               int sbp_column = SBP_EMU_COLUMN
#define SBP_EMU_HERE                                                                               \
    ::sbp_emu::Site {                                                                              \
        sbp_file, sbp_line, sbp_column                                                             \
    }

namespace sbp_emu {
enum Barrier { BAR_SYNC, BAR_COUNT, BAR_AND, BAR_OR };
enum WarpOp { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR, VOTE_BALLOT, VOTE_ALL, VOTE_ANY, SYNCWARP };
/* Blocks the calling fiber until the whole block arrives; returns the count/and/or of pred. */
int barrier(Barrier kind, int pred, Site site);
/* Blocks until every lane of mask arrives at the same operation; returns the lane's result
 * (a shuffle's value bits, a vote's result). b is the source lane, delta or lane mask. */
uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int b, int width, Site site);

template <class T> inline T shuffle(WarpOp op, unsigned mask, T var, int b, int width, Site site) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
                  "warp shuffles move values of at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &var, sizeof(T));
    bits = warp_op(op, mask, bits, b, width, site);
    memcpy(&var, &bits, sizeof(T));
    return var;
}
} // namespace sbp_emu

inline void __syncthreads(SBP_EMU_SITE) {
    sbp_emu::barrier(sbp_emu::BAR_SYNC, 0, SBP_EMU_HERE);
}
inline int __syncthreads_count(int pred, SBP_EMU_SITE) {
    return sbp_emu::barrier(sbp_emu::BAR_COUNT, pred, SBP_EMU_HERE);
}
inline int __syncthreads_and(int pred, SBP_EMU_SITE) {
    return sbp_emu::barrier(sbp_emu::BAR_AND, pred, SBP_EMU_HERE);
}
inline int __syncthreads_or(int pred, SBP_EMU_SITE) {
    return sbp_emu::barrier(sbp_emu::BAR_OR, pred, SBP_EMU_HERE);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, SBP_EMU_SITE) {
    sbp_emu::warp_op(sbp_emu::SYNCWARP, mask, 0, 0, warpSize, SBP_EMU_HERE);
}
template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, SBP_EMU_SITE) {
    return sbp_emu::shuffle(sbp_emu::SHFL_IDX, mask, var, src_lane, width, SBP_EMU_HERE);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize,
                        SBP_EMU_SITE) {
    return sbp_emu::shuffle(sbp_emu::SHFL_UP, mask, var, (int)delta, width, SBP_EMU_HERE);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize,
                          SBP_EMU_SITE) {
    return sbp_emu::shuffle(sbp_emu::SHFL_DOWN, mask, var, (int)delta, width, SBP_EMU_HERE);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, SBP_EMU_SITE) {
    return sbp_emu::shuffle(sbp_emu::SHFL_XOR, mask, var, lane_mask, width, SBP_EMU_HERE);
}
inline unsigned __ballot_sync(unsigned mask, int pred, SBP_EMU_SITE) {
    return (unsigned)sbp_emu::warp_op(sbp_emu::VOTE_BALLOT, mask, pred != 0, 0, warpSize,
                                      SBP_EMU_HERE);
}
inline int __all_sync(unsigned mask, int pred, SBP_EMU_SITE) {
    return (int)sbp_emu::warp_op(sbp_emu::VOTE_ALL, mask, pred != 0, 0, warpSize, SBP_EMU_HERE);
}
inline int __any_sync(unsigned mask, int pred, SBP_EMU_SITE) {
    return (int)sbp_emu::warp_op(sbp_emu::VOTE_ANY, mask, pred != 0, 0, warpSize, SBP_EMU_HERE);
}
/* One block runs at a time and memory is the host's: fences have nothing to order. */
inline void __threadfence(void) {}
inline void __threadfence_block(void) {}

/* ---- shared memory ----------------------------------------------------------------------------
 * SBP_SHARED declares a reference to the block's array for this call site: the first thread of
 * the block that reaches it allocates it (exactly sizeof(T[n]) bytes, filled with the poison), the
 * others get the same array, and it is freed when the block ends. The call site is identified by
 * the address of a function-local static, so every template instance has its own array, as under
 * nvcc. */
namespace sbp_emu {
void *shared_array(const void *key, size_t bytes, size_t align, const char *name, Site site);
void *dynamic_shared(void);
} // namespace sbp_emu

#define SBP_SHARED(T, name, n)                                                                     \
    static char sbp_shared_site_##name;                                                            \
    auto &name = *static_cast<T(*)[n]>(::sbp_emu::shared_array(                                    \
        &sbp_shared_site_##name, sizeof(T[n]), alignof(T), #name, {__FILE__, __LINE__, 0}))
#define SBP_SHARED2(T, name, n0, n1)                                                               \
    static char sbp_shared_site_##name;                                                            \
    auto &name = *static_cast<T(*)[n0][n1]>(::sbp_emu::shared_array(                               \
        &sbp_shared_site_##name, sizeof(T[n0][n1]), alignof(T), #name, {__FILE__, __LINE__, 0}))
/* The launch's dynamic shared memory: exactly shared_bytes, 16-byte aligned, poisoned. */
#define SBP_SHARED_DYN(T, name) T *name = static_cast<T *>(::sbp_emu::dynamic_shared())

/* ---- arithmetic -------------------------------------------------------------------------------
 * fma/fmaf/sqrt/sqrtf come from <math.h>. The CUDA intrinsics that name a rounding are the plain
 * operations here (the emulator is compiled with -ffp-contract=off, so they are never fused). */
inline float __fadd_rn(float a, float b) {
    return a + b;
}
inline float __fsub_rn(float a, float b) {
    return a - b;
}
inline float __fmul_rn(float a, float b) {
    return a * b;
}
inline float __fdiv_rn(float a, float b) {
    return a / b;
}
inline float __fsqrt_rn(float a) {
    return sqrtf(a);
}
inline float __fmaf_rn(float a, float b, float c) {
    return fmaf(a, b, c);
}
inline double __dadd_rn(double a, double b) {
    return a + b;
}
inline double __dsub_rn(double a, double b) {
    return a - b;
}
inline double __dmul_rn(double a, double b) {
    return a * b;
}
inline double __ddiv_rn(double a, double b) {
    return a / b;
}
inline double __dsqrt_rn(double a) {
    return sqrt(a);
}
inline double __fma_rn(double a, double b, double c) {
    return fma(a, b, c);
}
inline unsigned int __float_as_uint(float x) {
    unsigned int u;
    memcpy(&u, &x, 4);
    return u;
}
inline float __uint_as_float(unsigned int u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
inline int __float_as_int(float x) {
    return (int)__float_as_uint(x);
}
inline float __int_as_float(int i) {
    return __uint_as_float((unsigned int)i);
}
inline long long __double_as_longlong(double x) {
    long long i;
    memcpy(&i, &x, 8);
    return i;
}
inline double __longlong_as_double(long long i) {
    double x;
    memcpy(&x, &i, 8);
    return x;
}
/* CUDA's device min/max overloads. */
inline int min(int a, int b) {
    return a < b ? a : b;
}
inline int max(int a, int b) {
    return a > b ? a : b;
}
inline unsigned int min(unsigned int a, unsigned int b) {
    return a < b ? a : b;
}
inline unsigned int max(unsigned int a, unsigned int b) {
    return a > b ? a : b;
}
inline long long min(long long a, long long b) {
    return a < b ? a : b;
}
inline long long max(long long a, long long b) {
    return a > b ? a : b;
}
inline float min(float a, float b) {
    return fminf(a, b);
}
inline float max(float a, float b) {
    return fmaxf(a, b);
}
inline double min(double a, double b) {
    return fmin(a, b);
}
inline double max(double a, double b) {
    return fmax(a, b);
}

/* ---- launches ---------------------------------------------------------------------------------
 * SBP_LAUNCH(kernel, grid, block, shared_bytes, args...) evaluates the arguments once, converts
 * them to the kernel's parameter types (as <<<>>> does), and runs every block to completion before
 * it returns. A fault ends the launch; see cudaGetLastError(). */
namespace sbp_emu {
struct Launch {
    const char *kernel; /* the kernel expression as written, e.g. "block_sum<float>" */
    const char *file;
    int line;
    const void *func; /* identifies the kernel for cudaFuncSetAttribute */
    dim3 grid, block;
    size_t shared_bytes;
};
void launch(const Launch &l, void (*body)(void *), void *ctx);

template <class... P> struct Launcher {
    Launch l;
    void (*kernel)(P...);
    template <class... A> void operator()(A &&...args) const {
        static_assert(sizeof...(A) == sizeof...(P), "SBP_LAUNCH: wrong number of arguments");
        struct Call {
            void (*kernel)(P...);
            std::tuple<typename std::decay<P>::type...> args;
        } call{kernel, std::tuple<typename std::decay<P>::type...>(std::forward<A>(args)...)};
        /* every thread gets its own copies of the parameters, as on the GPU */
        launch(
            l,
            [](void *c) {
                std::apply(static_cast<Call *>(c)->kernel, static_cast<Call *>(c)->args);
            },
            &call);
    }
};
template <class... P>
inline Launcher<P...> launcher(const char *name, const char *file, int line, dim3 grid, dim3 block,
                               size_t shared_bytes, void (*kernel)(P...)) {
    return Launcher<P...>{
        Launch{name, file, line, reinterpret_cast<const void *>(kernel), grid, block, shared_bytes},
        kernel};
}
} // namespace sbp_emu

#define SBP_LAUNCH(kernel, grid, block, shared_bytes, ...)                                         \
    ::sbp_emu::launcher(#kernel, __FILE__, __LINE__, (grid), (block), (shared_bytes),              \
                        kernel)(__VA_ARGS__)
#define SBP_LAUNCH_STREAM(kernel, grid, block, shared_bytes, stream, ...)                          \
    ((void)(stream), SBP_LAUNCH(kernel, grid, block, shared_bytes, __VA_ARGS__))

#endif
