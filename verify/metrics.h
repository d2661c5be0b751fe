/* metrics.h — how two gradient tensors are compared.
 *
 * a is the tensor being judged, b the reference. Both are read as double; `ulp_dtype` is the
 * precision in which ULP distances are counted (the coarser of the two files' dtypes, since a
 * float32 gradient cannot be closer than its own rounding to a float64 one). Cosine alone cannot
 * see a uniform scale error (a gradient off by a factor k keeps cosine 1), so it is always
 * reported together with the norm ratio ‖a‖/‖b‖ and the relative L2 error ‖a − b‖/‖b‖. */
#ifndef SBP_METRICS_H
#define SBP_METRICS_H

#include "../src/io/safetensors.h"

#include <stdint.h>

typedef struct {
    int64_t n;
    int bitwise;        /* identical bytes (same dtype); set by the caller */
    double max_abs;     /* max |a_i − b_i| */
    int64_t max_abs_at; /* where */
    int64_t first_diff; /* first i with a_i != b_i, or -1 */
    double max_ulp;     /* max ULP distance in ulp_dtype (capped at 2^62) */
    double rel_l2;      /* ‖a − b‖ / ‖b‖ (‖a − b‖ when ‖b‖ = 0) */
    double cosine;      /* a·b / (‖a‖‖b‖); 1 when both are zero */
    double norm_ratio;  /* ‖a‖ / ‖b‖; 1 when both are zero */
    double norm_a, norm_b;
    int64_t nonfinite_a, nonfinite_b;             /* NaN/Inf counts */
    int64_t first_nonfinite_a, first_nonfinite_b; /* or -1 */
    int64_t allclose_fail;                        /* elements with |a−b| > atol + rtol·|b| */
    int64_t first_allclose_fail;
    /* The best single factor: scale = a·b / ‖b‖² minimises ‖a − k·b‖, and rel_l2_rescaled =
     * ‖a − scale·b‖ / ‖b‖ is what is left after it (a second pass, so it stays accurate far
     * below the √ε that 1 − cosine can resolve). A pure scale error has rel_l2_rescaled ≈ 0. */
    double scale, rel_l2_rescaled;
    /* every value of a survives a round trip through float32 / bfloat16 (a float64 file that
     * was computed or stored in a narrower type and widened) */
    int a_is_f32, a_is_bf16;
} sbp_tensor_cmp;

/* Compares n elements; rtol/atol define allclose_fail. */
void sbp_compare(sbp_tensor_cmp *c, const double *a, const double *b, int64_t n,
                 sbp_dtype ulp_dtype, double rtol, double atol);

/* ULP distance between x and y after rounding both to dtype (F64, F32, BF16 or F16). */
double sbp_ulp_distance(double x, double y, sbp_dtype dtype);

#endif
