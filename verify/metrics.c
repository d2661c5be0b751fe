/* metrics.c — per-tensor comparison metrics (see metrics.h). */
#include "metrics.h"

#include <math.h>
#include <string.h>

/* Maps a float's bits to an integer scale where adjacent floats differ by 1 (sign-magnitude to
 * two's complement), so a ULP distance is a subtraction. */
static int64_t ordered64(double x) {
    int64_t i;
    memcpy(&i, &x, 8);
    return i < 0 ? INT64_MIN - i : i;
}

static int64_t ordered32(float x) {
    int32_t i;
    memcpy(&i, &x, 4);
    return i < 0 ? (int64_t)INT32_MIN - i : i;
}

static int64_t ordered16(uint16_t h) {
    return h & 0x8000u ? -(int64_t)(h & 0x7fffu) : (int64_t)h;
}

double sbp_ulp_distance(double x, double y, sbp_dtype dtype) {
    if (isnan(x) || isnan(y)) return INFINITY;
    int64_t a, b;
    switch (dtype) {
    case SBP_DT_F32: a = ordered32((float)x), b = ordered32((float)y); break;
    case SBP_DT_BF16:
        a = ordered16(sbp_f32_to_bf16((float)x)), b = ordered16(sbp_f32_to_bf16((float)y));
        break;
    case SBP_DT_F16:
        a = ordered16(sbp_f32_to_f16((float)x)), b = ordered16(sbp_f32_to_f16((float)y));
        break;
    default: a = ordered64(x), b = ordered64(y); break;
    }
    __int128 d = (__int128)a - b; /* two int64 can be 2^64 apart */
    double u = (double)(d < 0 ? -d : d);
    return u > 0x1p62 ? 0x1p62 : u;
}

void sbp_compare(sbp_tensor_cmp *c, const double *a, const double *b, int64_t n,
                 sbp_dtype ulp_dtype, double rtol, double atol) {
    memset(c, 0, sizeof *c);
    c->n = n;
    c->first_diff = c->max_abs_at = c->first_nonfinite_a = c->first_nonfinite_b = -1;
    c->first_allclose_fail = -1;
    double dd = 0, aa = 0, bb = 0, ab = 0;
    c->a_is_f32 = c->a_is_bf16 = 1;
    for (int64_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        if (!isfinite(x) && c->nonfinite_a++ == 0) c->first_nonfinite_a = i;
        if (!isfinite(y) && c->nonfinite_b++ == 0) c->first_nonfinite_b = i;
        if (x != y && c->first_diff < 0 && !(isnan(x) && isnan(y))) c->first_diff = i;
        double d = fabs(x - y);
        if (d > c->max_abs || (isnan(d) && !isnan(c->max_abs))) c->max_abs = d, c->max_abs_at = i;
        double u = sbp_ulp_distance(x, y, ulp_dtype);
        if (u > c->max_ulp) c->max_ulp = u;
        if (!(d <= atol + rtol * fabs(y)) && c->allclose_fail++ == 0) c->first_allclose_fail = i;
        dd += d * d, aa += x * x, bb += y * y, ab += x * y;
        if (isfinite(x)) {
            c->a_is_f32 &= (double)(float)x == x;
            c->a_is_bf16 &= (double)sbp_bf16_to_f32(sbp_f32_to_bf16((float)x)) == x;
        }
    }
    c->norm_a = sqrt(aa), c->norm_b = sqrt(bb);
    c->rel_l2 = bb > 0 ? sqrt(dd / bb) : sqrt(dd);
    if (aa == 0 && bb == 0) {
        c->cosine = c->norm_ratio = 1;
    } else {
        c->cosine = aa > 0 && bb > 0 ? ab / (c->norm_a * c->norm_b) : 0;
        c->norm_ratio = bb > 0 ? c->norm_a / c->norm_b : INFINITY;
    }
    c->scale = bb > 0 ? ab / bb : 0;
    double rr = 0;
    for (int64_t i = 0; i < n && isfinite(c->scale); i++) {
        double r = a[i] - c->scale * b[i];
        rr += r * r;
    }
    c->rel_l2_rescaled = isfinite(c->scale) ? (bb > 0 ? sqrt(rr / bb) : sqrt(rr)) : NAN;
}
