/* ops.cu — the CUDA op table (src/engine/ops.h): device memory charged to the ledger, transfers,
 * the elementwise operations, and the kernel pairs of the other files. The schedule driver and
 * the steps run unchanged on top of it; the host sees the weights and the batch going up, the
 * gradients and the per-row log-probs coming down.
 *
 * The table implements the portable numerics only (docs/numerics.md §11): the same bits as the
 * portable CPU table, on a GPU or in the emulator. */
#include "cuda.cuh"

#include <stdlib.h>
#include <string.h>

namespace SBP_CUDA_NS {

/* ---- the run --------------------------------------------------------------------------------- */

static int dev_begin(eng *e, char *msg, size_t n) {
    const char *sync = getenv("SBP_CUDA_SYNC");
    if (sync && *sync && strcmp(sync, "0") != 0 && strcmp(sync, "1") != 0) {
        snprintf(msg, n, "SBP_CUDA_SYNC=\"%.40s\": must be 0 or 1", sync);
        return 0;
    }
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        snprintf(msg, n, "no CUDA device (%s)",
                 err != cudaSuccess ? cudaGetErrorString(err) : "none found");
        return 0;
    }
    device_state *d = (device_state *)calloc(1, sizeof *d);
    if (!d) {
        snprintf(msg, n, "out of host memory");
        return 0;
    }
    d->sync = sync && strcmp(sync, "1") == 0;
    e->backend = d;
    return 1;
}

static int dev_end(eng *e, char *msg, size_t n) {
    device_state *d = device_of(e);
    if (!d) return 1;
    for (int i = 0; i < d->n; i++) { /* what a failed run left behind */
        cudaFree(d->blocks[i].p);
        sbp_ledger_charge(e->lg, (sbp_mem_cat)d->blocks[i].cat, -(int64_t)d->blocks[i].bytes);
    }
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess && !d->failed)
        d->failed = 1, snprintf(d->msg, sizeof d->msg, "%s", cudaGetErrorString(err));
    const int ok = !d->failed;
    if (!ok) snprintf(msg, n, "%s", d->msg);
    free(d->blocks);
    free(d);
    e->backend = NULL;
    return ok;
}

/* ---- memory ---------------------------------------------------------------------------------- */

static void *dev_alloc(eng *e, sbp_mem_cat cat, size_t bytes, const char *what) {
    device_state *d = device_of(e);
    void *p = NULL;
    if (d->n == d->cap) {
        const int cap = d->cap ? 2 * d->cap : 64;
        void *nb = realloc(d->blocks, sizeof *d->blocks * (size_t)cap);
        if (!nb) goto oom;
        d->blocks = (device_block *)nb, d->cap = cap;
    }
    bytes = bytes ? bytes : 1; /* what is allocated is charged, as on the CPU (ops/cpu.c) */
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky */
        goto oom;
    }
    d->blocks[d->n++] = {p, bytes, (int)cat};
    sbp_ledger_charge(e->lg, cat, (int64_t)bytes);
    return p;
oom:
    if (!e->oom) e->oom = 1, snprintf(e->oom_what, sizeof e->oom_what, "%s (device)", what);
    return NULL;
}

static void dev_free(eng *e, void *p) {
    device_state *d = device_of(e);
    for (int i = 0; i < d->n; i++)
        if (d->blocks[i].p == p) {
            sbp_ledger_charge(e->lg, (sbp_mem_cat)d->blocks[i].cat, -(int64_t)d->blocks[i].bytes);
            cudaFree(p);
            d->blocks[i] = d->blocks[--d->n];
            return;
        }
    fail(e, "%s%s", "free of a pointer the device table did not allocate", "");
}

static void *dev_mirror(eng *e, sbp_mem_cat cat, const void *host, size_t bytes, const char *what) {
    void *p = dev_alloc(e, cat, bytes, what);
    if (p && cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) check(e, what);
    return p;
}

static void dev_unmirror(eng *e, void *dev, const void *host) {
    dev_free(e, dev);
}

static void dev_download(const eng *e, void *host, const void *dev, size_t bytes) {
    cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
    check(e, "download");
}

static void dev_upload(const eng *e, void *dev, const void *host, size_t bytes) {
    cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
    check(e, "upload");
}

/* the kernels stage in shared memory and registers; only rows without a key need scratch */
static size_t dev_workspace(const eng *e) {
    return unattended_workspace(e);
}

/* ---- elementwise ----------------------------------------------------------------------------- */

__global__ void add_kernel(real *y, const real *a, const real *b, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

__global__ void axpy_kernel(real *y, real a, const real *x, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] + x[i] * a;
}

__global__ void scale_kernel(real *x, real a, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a;
}

__global__ void copy_cols_kernel(real *y, const real *x, int rows, int n, int ld) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)rows * n) y[i] = x[i / n * ld + i % n];
}

static void dev_zero(const eng *e, real *x, size_t n) {
    cudaMemset(x, 0, sizeof(real) * n);
    check(e, "cudaMemset");
}

static void dev_copy(const eng *e, real *y, const real *x, size_t n) {
    cudaMemcpy(y, x, sizeof(real) * n, cudaMemcpyDeviceToDevice);
    check(e, "cudaMemcpy");
}

static void dev_copy_cols(const eng *e, real *y, const real *x, int rows, int n, int ld) {
    const size_t total = (size_t)rows * n;
    SBP_LAUNCH(copy_cols_kernel, blocks_for(total, THREADS), THREADS, 0, y, x, rows, n, ld);
    check(e, "copy_cols_kernel");
}

static void dev_add(const eng *e, real *y, const real *a, const real *b, size_t n) {
    SBP_LAUNCH(add_kernel, blocks_for(n, THREADS), THREADS, 0, y, a, b, n);
    check(e, "add_kernel");
}

static void dev_scale(const eng *e, real *x, real a, size_t n) {
    SBP_LAUNCH(scale_kernel, blocks_for(n, THREADS), THREADS, 0, x, a, n);
    check(e, "scale_kernel");
}

static void dev_axpy(const eng *e, real *y, real a, const real *x, size_t n) {
    SBP_LAUNCH(axpy_kernel, blocks_for(n, THREADS), THREADS, 0, y, a, x, n);
    check(e, "axpy_kernel");
}

static void dev_store(const eng *e, real *x, size_t n) {} /* no bf16 storage on the device */

static const sbp_ops table = {
    .name = SBP_EMULATED ? "cuda-emu" : "cuda",
    .begin = dev_begin,
    .end = dev_end,
    .alloc = dev_alloc,
    .free = dev_free,
    .mirror = dev_mirror,
    .unmirror = dev_unmirror,
    .download = dev_download,
    .upload = dev_upload,
    .workspace = dev_workspace,
    .zero = dev_zero,
    .copy = dev_copy,
    .copy_cols = dev_copy_cols,
    .add = dev_add,
    .scale = dev_scale,
    .axpy = dev_axpy,
    .store = dev_store,
    .rope_table = rope_table,
    .linear_forward = linear_forward,
    .linear_backward = linear_backward,
    .rmsnorm_forward = rmsnorm_forward,
    .rmsnorm_backward = rmsnorm_backward,
    .rope_forward = rope_forward,
    .rope_backward = rope_backward,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .swiglu_forward = swiglu_forward,
    .swiglu_backward = swiglu_backward,
    .geglu_forward = geglu_forward,
    .geglu_backward = geglu_backward,
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
    .logprob_forward = logprob_forward,
    .logprob_backward = logprob_backward,
};

} // namespace SBP_CUDA_NS

/* SBP_CUDA_TABLE (cuda.cuh) names the four definitions, one per build of this file, that
 * cuda/registry.cc hands to the API:
 *   const void *sbp_ops_cuda_emu_f32(void)   const void *sbp_ops_cuda_emu_f64(void)
 *   const void *sbp_ops_cuda_f32(void)       const void *sbp_ops_cuda_f64(void) */
extern "C" const void *SBP_CUDA_TABLE(void) {
    return &SBP_CUDA_NS::table;
}
