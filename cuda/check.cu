/* check.cu — the first error of a CUDA run: after a launch or a runtime call, check() records
 * the error it left (cuda.cuh); the run then fails with that message, which no later error
 * replaces. Every kernel file and the op table (ops.cu) call it; it calls none of them. */
#include "cuda.cuh"

#include <stdio.h>

namespace SBP_CUDA_NS {

void fail(const eng *e, const char *fmt, const char *a, const char *b) {
    device_state *d = device_of(e);
    if (d->failed) return;
    d->failed = 1;
    snprintf(d->msg, sizeof d->msg, fmt, a, b);
}

void check(const eng *e, const char *what) {
    if (device_of(e)->sync) {
        const cudaError_t serr = cudaDeviceSynchronize();
        if (serr != cudaSuccess)
            fail(e, "%s (SBP_CUDA_SYNC=1: at the synchronize after it): %s", what,
                 cudaGetErrorString(serr));
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) fail(e, "%s: %s", what, cudaGetErrorString(err));
}

} // namespace SBP_CUDA_NS
