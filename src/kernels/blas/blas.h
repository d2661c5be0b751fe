/* blas.h — the BLAS product of the working precision, for the fast mode's kernels. */
#ifndef SBP_BLAS_H
#define SBP_BLAS_H

#include "../kernels.h"

#include <cblas.h>

#ifdef SBP_REAL_F64
#define gemm cblas_dgemm
#else
#define gemm cblas_sgemm
#endif

/* End of the block that starts at row r: the next multiple of blk, or e. */
static inline int block_end(int r, int e, int blk) {
    int next = (r / blk + 1) * blk;
    return next < e ? next : e;
}

#endif
