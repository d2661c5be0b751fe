/* fast.h — the fast mode's products: the BLAS product of the working precision (linear layers)
 * and the attention tiles' own (tile_mm.c). */
#ifndef SBP_FAST_H
#define SBP_FAST_H

#include "../kernels.h"

#include <cblas.h>

#ifdef SBP_REAL_F64
#define gemm cblas_dgemm
#else
#define gemm cblas_sgemm
#endif

/* C = (beta ? C : 0) + alpha·A·B for the attention tiles, one ascending fma chain per element
 * (tile_mm.c); A(i,p) = A[i·ars + p·acs], B row-major. */
void tile_mm(real *C,                               /* (m, n), leading dimension ldc */
             size_t ldc, const real *A,             /* (m, k) via strides ars, acs */
             size_t ars, size_t acs, const real *B, /* (k, n), leading dimension ldb */
             size_t ldb, int m, int n, int k, real alpha, int beta);

/* End of the block that starts at row r: the next multiple of blk, or e. */
static inline int block_end(int r, int e, int blk) {
    int next = (r / blk + 1) * blk;
    return next < e ? next : e;
}

#endif
