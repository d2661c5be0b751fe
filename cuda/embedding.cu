/* embedding.cu — the token embedding and its scatter-add on the GPU (src/kernels/embedding.c is
 * the CPU's). The backward gives each thread one column: repeated ids accumulate in ascending
 * token order, one chain per element, no atomics. */
#include "cuda.cuh"

namespace SBP_CUDA_NS {

__global__ void embedding_forward_kernel(real *x, const int32_t *ids, const real *emb, int T,
                                         int C) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    const int t = (int)(i / C), c = (int)(i % C);
    x[i] = emb[(size_t)ids[t] * C + c];
}

__global__ void embedding_backward_kernel(real *demb, const real *dx, const int32_t *ids, int T,
                                          int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int t = 0; t < T; t++) {
        real *e = demb + (size_t)ids[t] * C + c;
        *e = *e + dx[(size_t)t * C + c];
    }
}

void embedding_forward(const eng *e, real *x, const int32_t *ids, int T) {
    SBP_LAUNCH(embedding_forward_kernel, blocks_for((size_t)T * e->C, THREADS), THREADS, 0, x, ids,
               e->emb, T, e->C);
    check(e, "embedding_forward_kernel");
}

void embedding_backward(const eng *e, real *demb, const real *dx, const int32_t *ids, int T) {
    SBP_LAUNCH(embedding_backward_kernel, blocks_for((size_t)e->C, THREADS), THREADS, 0, demb, dx,
               ids, T, e->C);
    check(e, "embedding_backward_kernel");
}

} // namespace SBP_CUDA_NS
