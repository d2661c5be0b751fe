/* real.h — the working precision of the numeric code.
 *
 * Everything under src/kernels and src/engine is compiled twice: once with `real` = float and once
 * with -DSBP_REAL_F64 (`real` = double). The Makefile links each precision into one relocatable
 * object whose only global symbols are the entry points named with SBP_ENTRY, so the two copies
 * coexist in one executable without any renaming in the source.
 *
 * The scalar functions are the project's own (src/core/pmath.h): built from +, −, ×, /, sqrt and
 * fma only, so that they give the same bits on every machine (docs/numerics.md §3). Everything is
 * compiled with -ffp-contract=off: an fma is written as rfma where one is meant, and nowhere
 * else. */
#ifndef SBP_REAL_H
#define SBP_REAL_H

#include "../core/pmath.h"

#include <math.h>

#ifdef SBP_REAL_F64
typedef double real;
#define SBP_ENTRY(name) name##_f64
#define rexp            sbp_pexp
#define rlog            sbp_plog
#define rfma            fma
#define rsqrt_(x)       (1.0 / sqrt(x))
#else
typedef float real;
#define SBP_ENTRY(name) name##_f32
#define rexp            sbp_pexpf
#define rlog            sbp_plogf
#define rfma            fmaf
#define rsqrt_(x)       (1.0f / sqrtf(x))
#endif

#endif
