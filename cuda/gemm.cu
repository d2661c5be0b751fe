/* gemm.cu — the portable product on the GPU, and the linear layers on it (src/kernels/gemm.c and
 * linear.c are the CPU's).
 *
 * C (M, N) += A·B: every element of C one chain c ← fma(a(i,p), b(p,j), c) over p ascending,
 * starting from the value C holds — the CPU's chain; or (panel > 0, the linear layers' y and dx)
 * the CPU's panels (pgemm_panels, src/kernels/gemm.c): the chain over [0, panel) continues C's,
 * every later panel's chain starts from +0 and is added to the running value once complete.
 * A 16×16-thread block owns a 64×64 tile of C (each thread a 4×4 register tile), walks k in
 * steps of 16 with the operand tiles staged in shared memory, and stores its tile at the end.
 * No split of k between threads, no atomics. */
#include "cuda.cuh"

namespace SBP_CUDA_NS {

enum { TILE = 64, KT = 16, SIDE = 16, PER = TILE / SIDE };
enum { PANEL = 128 }; /* PGEMM_PANEL (src/kernels/kernels.h): a multiple of KT */
static_assert(PANEL % KT == 0, "a panel is whole k steps of the staged tiles");

__global__ void pgemm_kernel(real *C, size_t ldc, const real *A, size_t rsa, size_t csa,
                             const real *B, size_t rsb, size_t csb, int M, int N, int K,
                             int panel) {
    SBP_SHARED2(real, As, KT, TILE); /* As[k][i] */
    SBP_SHARED2(real, Bs, KT, TILE); /* Bs[k][j] */
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * SIDE + tx;
    const int i0 = blockIdx.y * TILE, j0 = blockIdx.x * TILE;
    real acc[PER][PER], tot[PER][PER]; /* the current chain; the panels before it, added */
    for (int a = 0; a < PER; a++)
        for (int b = 0; b < PER; b++) {
            const int i = i0 + ty + SIDE * a, j = j0 + tx + SIDE * b;
            acc[a][b] = i < M && j < N ? C[(size_t)i * ldc + j] : 0;
            tot[a][b] = 0;
        }
    for (int k0 = 0; k0 < K; k0 += KT) {
        const int kn = K - k0 < KT ? K - k0 : KT;
        if (panel && k0 > 0 && k0 % panel == 0) /* a panel is complete */
            for (int a = 0; a < PER; a++)
                for (int b = 0; b < PER; b++) {
                    tot[a][b] = k0 == panel ? acc[a][b] : tot[a][b] + acc[a][b];
                    acc[a][b] = 0;
                }
        for (int l = tid; l < KT * TILE; l += SIDE * SIDE) {
            const int kk = l / TILE, r = l % TILE;
            As[kk][r] =
                kk < kn && i0 + r < M ? A[(size_t)(i0 + r) * rsa + (size_t)(k0 + kk) * csa] : 0;
            Bs[kk][r] =
                kk < kn && j0 + r < N ? B[(size_t)(k0 + kk) * rsb + (size_t)(j0 + r) * csb] : 0;
        }
        __syncthreads();
        for (int kk = 0; kk < kn; kk++) /* only p < K: the chain has exactly K links */
            for (int a = 0; a < PER; a++)
                for (int b = 0; b < PER; b++)
                    acc[a][b] = rfma(As[kk][ty + SIDE * a], Bs[kk][tx + SIDE * b], acc[a][b]);
        __syncthreads();
    }
    const int folded = panel && K > panel;
    for (int a = 0; a < PER; a++)
        for (int b = 0; b < PER; b++) {
            const int i = i0 + ty + SIDE * a, j = j0 + tx + SIDE * b;
            if (i < M && j < N) C[(size_t)i * ldc + j] = folded ? tot[a][b] + acc[a][b] : acc[a][b];
        }
}

/* panel: 0 for one chain, else PANEL (the linear layers' y and dx) */
static void launch_gemm(const eng *e, real *C, size_t ldc, const real *A, size_t rsa, size_t csa,
                        const real *B, size_t rsb, size_t csb, int M, int N, int K, int panel) {
    if (M <= 0 || N <= 0 || K <= 0) return;
    const dim3 grid(blocks_for((size_t)N, TILE), blocks_for((size_t)M, TILE)), block(SIDE, SIDE);
    SBP_LAUNCH(pgemm_kernel, grid, block, 0, C, ldc, A, rsa, csa, B, rsb, csb, M, N, K, panel);
    check(e, "pgemm_kernel");
}

void pgemm(const eng *e, real *C, size_t ldc, const real *A, size_t rsa, size_t csa, const real *B,
           size_t rsb, size_t csb, int M, int N, int K) {
    launch_gemm(e, C, ldc, A, rsa, csa, B, rsb, csb, M, N, K, 0);
}

/* y(r, n) += b(n) */
__global__ void bias_kernel(real *y, const real *b, int M, int N) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)M * N) y[i] = y[i] + b[i % N];
}

/* db(n) += Σ_r dy(r, n), rows ascending */
__global__ void bias_grad_kernel(real *db, const real *dy, int M, int N) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    real acc = db[n];
    for (int r = 0; r < M; r++) acc = acc + dy[(size_t)r * N + n];
    db[n] = acc;
}

void linear_forward(const eng *e, real *y, const real *x, const real *w, const real *b, int s,
                    int end, int N, int K) {
    const int M = end - s;
    cudaMemset(y, 0, sizeof(real) * (size_t)M * N);
    check(e, "cudaMemset");
    /* y(t, n) = Σ_k x(t, k)·w(n, k), in panels (the first continuing the +0 just set) */
    launch_gemm(e, y, (size_t)N, x, (size_t)K, 1, w, 1, (size_t)K, M, N, K, PANEL);
    if (!b) return;
    SBP_LAUNCH(bias_kernel, blocks_for((size_t)M * N, THREADS), THREADS, 0, y, b, M, N);
    check(e, "bias_kernel");
}

void linear_backward(const eng *e, real *dx, real *dw, real *db, const real *dy, const real *x,
                     const real *w, int s, int end, int N, int K) {
    const int M = end - s;
    /* dW(n, k) += Σ_t dy(t, n)·x(t, k) */
    if (dw) pgemm(e, dw, (size_t)K, dy, 1, (size_t)N, x, (size_t)K, 1, N, K, M);
    /* dx(t, k) += Σ_n dy(t, n)·w(n, k), in panels over n */
    if (dx) launch_gemm(e, dx, (size_t)K, dy, (size_t)N, 1, w, (size_t)K, 1, M, K, N, PANEL);
    if (!db) return;
    SBP_LAUNCH(bias_grad_kernel, blocks_for((size_t)N, THREADS), THREADS, 0, db, dy, M, N);
    check(e, "bias_grad_kernel");
}

} // namespace SBP_CUDA_NS
