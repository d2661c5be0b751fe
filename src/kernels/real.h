/* real.h — the working precision of the numeric code.
 *
 * Everything under src/kernels and src/engine is compiled twice: once with `real` = float and once
 * with -DSBP_REAL_F64 (`real` = double). The Makefile links each precision into one relocatable
 * object whose only global symbols are the entry points named with SBP_ENTRY, so the two copies
 * coexist in one executable without any renaming in the source. */
#ifndef SBP_REAL_H
#define SBP_REAL_H

#include "exp.h"

#include <cblas.h>
#include <math.h>

#ifdef SBP_REAL_F64
typedef double real;
#define SBP_ENTRY(name) name##_f64
#define gemm            cblas_dgemm
#define rexp            sbp_exp
#define rlog            log
#define rsqrt_(x)       (1.0 / sqrt(x))
#else
typedef float real;
#define SBP_ENTRY(name) name##_f32
#define gemm            cblas_sgemm
#define rexp            sbp_expf
#define rlog            logf
#define rsqrt_(x)       (1.0f / sqrtf(x))
#endif

#endif
