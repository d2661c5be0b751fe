/* emu_kernels.cu — correct kernels that exercise the emulator: barriers over shared memory, every
 * shuffle and vote, a tiled matrix product, dynamic shared memory, 3-D blocks. They follow the
 * project's rules (explicit fmaf, fixed reduction trees, no atomics). Shapes are in
 * emu_kernels.h; tests/test_emu.cc compares each against a host computation, bit for bit, in
 * every fiber order. */
#include "emu_kernels.h"

#include "../../sbp_cuda.h"

#define FULL 0xffffffffu

__global__ void block_sum_kernel(float *out, const float *x, int n) {
    SBP_SHARED(float, s, 256);
    int t = threadIdx.x, i = blockIdx.x * 256 + t;
    s[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if (t < h) s[t] = s[t] + s[t + h];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

void emu_block_sum(float *out, const float *x, int n) {
    SBP_LAUNCH(block_sum_kernel, (n + 255) / 256, 256, 0, out, x, n);
}

__global__ void warp_ops_kernel(float *down, float *bfly, float *scan, float *idx, float *xorw,
                                const float *x, const int *src, const int *width) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
    float v = x[i];
    float d = v;
    for (int o = 16; o > 0; o >>= 1) d = d + __shfl_down_sync(FULL, d, o);
    down[i] = d;
    float b = v;
    for (int m = 16; m > 0; m >>= 1) b = b + __shfl_xor_sync(FULL, b, m);
    bfly[i] = b;
    float s = v;
    for (int o = 1; o < 16; o <<= 1) {
        float up = __shfl_up_sync(FULL, s, o, 16);
        if (lane % 16 >= o) s = s + up;
    }
    scan[i] = s;
    idx[i] = __shfl_sync(FULL, v, src[i], width[i]);
    xorw[i] = __shfl_xor_sync(FULL, v, 5, 4);
}

void emu_warp_ops(float *down, float *bfly, float *scan, float *idx, float *xorw, const float *x,
                  const int *src, const int *width, int n) {
    SBP_LAUNCH(warp_ops_kernel, n / 128, 128, 0, down, bfly, scan, idx, xorw, x, src, width);
}

__global__ void votes_kernel(unsigned *ballot, int *all, int *any, unsigned *half, int *count,
                             int *band, int *bor, const int *p) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
    int pred = p[i];
    ballot[i] = __ballot_sync(FULL, pred);
    all[i] = __all_sync(FULL, pred);
    any[i] = __any_sync(FULL, pred);
    __syncwarp();
    unsigned own_half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    half[i] = __ballot_sync(own_half, pred);
    count[i] = __syncthreads_count(pred);
    band[i] = __syncthreads_and(pred);
    bor[i] = __syncthreads_or(pred);
}

void emu_votes(unsigned *ballot, int *all, int *any, unsigned *half, int *count, int *band,
               int *bor, const int *p, int n) {
    SBP_LAUNCH(votes_kernel, n / 64, 64, 0, ballot, all, any, half, count, band, bor, p);
}

#define TILE 16

__global__ void matmul_kernel(float *C, const float *A, const float *B, int M, int N, int K) {
    SBP_SHARED2(float, As, TILE, TILE);
    SBP_SHARED2(float, Bs, TILE, TILE);
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        As[ty][tx] = row < M && k0 + tx < K ? A[row * K + k0 + tx] : 0.0f;
        Bs[ty][tx] = k0 + ty < K && col < N ? B[(k0 + ty) * N + col] : 0.0f;
        __syncthreads();
        /* only the real k: a padded fmaf(0, 0, -0.0f) would turn acc's -0 into +0 */
        int kn = K - k0 < TILE ? K - k0 : TILE;
        for (int kk = 0; kk < kn; kk++) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}

void emu_matmul(float *C, const float *A, const float *B, int M, int N, int K) {
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE), block(TILE, TILE);
    SBP_LAUNCH(matmul_kernel, grid, block, 0, C, A, B, M, N, K);
}

__global__ void reverse_dynamic_kernel(float *out, const float *x) {
    SBP_SHARED_DYN(float, s);
    int t = threadIdx.x, bs = blockDim.x, base = blockIdx.x * bs;
    s[t] = x[base + t];
    __syncthreads();
    out[base + t] = s[bs - 1 - t];
}

void emu_reverse_dynamic(float *out, const float *x, int n, int bs) {
    SBP_LAUNCH(reverse_dynamic_kernel, n / bs, bs, bs * sizeof(float), out, x);
}

__global__ void layout3d_kernel(int *out) {
    int linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int g = block * blockDim.x * blockDim.y * blockDim.z + linear;
    out[4 * g + 0] = blockIdx.x + 10 * blockIdx.y;
    out[4 * g + 1] = linear % 32;
    out[4 * g + 2] = __shfl_xor_sync(FULL, linear, 1);
    out[4 * g + 3] = threadIdx.x + 100 * threadIdx.y + 10000 * threadIdx.z;
}

void emu_layout3d(int *out) {
    SBP_LAUNCH(layout3d_kernel, dim3(2, 3, 1), dim3(8, 4, 2), 0, out);
}

__global__ void mul_add_kernel(float *out, float *fused, const float *a, const float *b,
                               const float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = a[i] * b[i] + c[i];
    fused[i] = fmaf(a[i], b[i], c[i]);
}

void emu_mul_add(float *out, float *fused, const float *a, const float *b, const float *c, int n) {
    SBP_LAUNCH(mul_add_kernel, (n + 63) / 64, 64, 0, out, fused, a, b, c, n);
}

__global__ void read_uninit_shared_kernel(float *out) {
    SBP_SHARED(float, s, 64);
    out[threadIdx.x] = s[threadIdx.x];
}

void emu_read_uninit_shared(float *out) {
    SBP_LAUNCH(read_uninit_shared_kernel, 1, 64, 0, out);
}

__global__ void neighbor_racy_kernel(float *out, const float *x) {
    SBP_SHARED(float, s, 64);
    int t = threadIdx.x;
    __syncthreads(); /* the race is in the second round: the order must apply after barriers */
    s[t] = x[t];
    out[t] = s[(t + 1) % 64]; /* the race: thread t + 1 may not have written yet */
}

__global__ void neighbor_fixed_kernel(float *out, const float *x) {
    SBP_SHARED(float, s, 64);
    int t = threadIdx.x;
    s[t] = x[t];
    __syncthreads();
    out[t] = s[(t + 1) % 64];
}

void emu_neighbor_racy(float *out, const float *x) {
    SBP_LAUNCH(neighbor_racy_kernel, 1, 64, 0, out, x);
}
void emu_neighbor_fixed(float *out, const float *x) {
    SBP_LAUNCH(neighbor_fixed_kernel, 1, 64, 0, out, x);
}

__global__ void last_writer_kernel(int *out) {
    if (threadIdx.x == 0) out[0] = blockIdx.x; /* the race: every block writes out[0] */
}

void emu_last_writer(int *out) {
    SBP_LAUNCH(last_writer_kernel, 8, 32, 0, out);
}

__global__ void touch_kernel(int *out) {
    int linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    out[blockIdx.x * blockDim.x * blockDim.y * blockDim.z + linear] = 1;
}

void emu_touch(int *out, unsigned gx, unsigned bx, unsigned by, unsigned bz,
               unsigned shared_bytes) {
    SBP_LAUNCH(touch_kernel, gx, dim3(bx, by, bz), shared_bytes, out);
}

int emu_touch_allow_shared(int bytes) {
    return (int)cudaFuncSetAttribute(touch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     bytes);
}
