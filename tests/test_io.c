/* test_io.c — unit tests of the file formats: safetensors (round trips, conversions, every way a
 * header can be malformed), the float16/bfloat16 conversions, config.json, the parameter table
 * and model loading (single file, shards, BF16/F16 weights, bad tensors).
 *
 * Malformed files are written byte by byte here (the writer cannot produce them); good ones go
 * through sbp_st_write. Models come from sbp_model_init (tu_model). Everything is written under
 * tu_tmpdir(). */
#include "testutil.h"
#include "../src/core/rng.h"
#include "../src/io/safetensors.h"

#include <cJSON.h>
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ck_assert_msg that costs nothing when it holds: Check's asserts record a mark point (a write
 * to the test runner) on every success, which takes seconds in loops over millions of values. */
#define require(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

/* ---------------------------------------------------------------------------------------------
 * Files */

/* An error with the wanted status whose message contains `want`. */
static void assert_err(sbp_status st, const sbp_err *err, sbp_status want, const char *want_msg,
                       const char *what) {
    require(st == want, "%s: status %s, want %s (message: %s)", what, sbp_status_name(st),
            sbp_status_name(want), st ? err->msg : "");
    require(strstr(err->msg, want_msg) != NULL, "%s: message \"%s\" does not mention \"%s\"", what,
            err->msg, want_msg);
}

/* ---------------------------------------------------------------------------------------------
 * safetensors: round trip */

START_TEST(st_roundtrip) {
    const float f32[6] = {1.5f, -2.25f, 0.0f, 3.4e38f, -1e-40f /* subnormal */, 7.0f};
    const double pi = 3.14159265358979323846, f64[3] = {pi, -1e300, 4.9e-324};
    /* bf16 1.0, −2.0, the smallest subnormal, −inf; f16 1.0, 65504, 2^-24, −0, 0.333 (0x3555) */
    const uint16_t bf16[4] = {0x3f80, 0xc000, 0x0001, 0xff80};
    const uint16_t f16[5] = {0x3c00, 0x7bff, 0x0001, 0x8000, 0x3555};
    const int32_t i32[4] = {0, -1, INT32_MAX, INT32_MIN};
    const int64_t i64[2] = {INT64_MIN, 1234567890123ll};
    const float scalar = 42.0f;
    const sbp_st_entry e[] = {
        {"f32", SBP_DT_F32, 2, {2, 3}, f32},     {"f64", SBP_DT_F64, 1, {3}, f64},
        {"bf16", SBP_DT_BF16, 2, {2, 2}, bf16},  {"f16", SBP_DT_F16, 1, {5}, f16},
        {"i32", SBP_DT_I32, 1, {4}, i32},        {"i64", SBP_DT_I64, 2, {2, 1}, i64},
        {"scalar", SBP_DT_F32, 0, {0}, &scalar}, {"empty", SBP_DT_F32, 2, {0, 4}, NULL},
        {"empty_i", SBP_DT_I64, 1, {0}, NULL},
    };
    const int n = (int)(sizeof e / sizeof e[0]);
    const char *meta[] = {"format", "pt", "note", "a \"quoted\" value, ünïcode", NULL};
    const char *dir = tu_new_dir("st-roundtrip"), *path = tu_path("st-roundtrip/t.safetensors");
    sbp_err err = {0};
    require(sbp_st_write(path, e, n, meta, &err) == SBP_OK, "write: %s", err.msg);
    tu_assert_no_tmp(dir);

    sbp_st_file sf;
    require(sbp_st_open(&sf, path, &err) == SBP_OK, "open: %s", err.msg);
    ck_assert_int_eq(sf.n, n);
    require(sf.data_start % 8 == 0, "data starts at byte %llu, not 8-aligned",
            (unsigned long long)sf.data_start);
    ck_assert_str_eq(sbp_st_meta(&sf, "format"), "pt");
    ck_assert_str_eq(sbp_st_meta(&sf, "note"), meta[3]);
    ck_assert_ptr_null(sbp_st_meta(&sf, "absent"));
    for (int i = 0; i < n; i++) {
        const sbp_st_tensor *t = &sf.t[i];
        ck_assert_str_eq(t->name, e[i].name); /* header order = write order */
        ck_assert_ptr_eq(sbp_st_find(&sf, e[i].name), t);
        ck_assert_int_eq(t->dtype, e[i].dtype);
        ck_assert_int_eq(t->ndim, e[i].ndim);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            ck_assert_int_eq(t->shape[d], e[i].shape[d]);
            numel *= e[i].shape[d];
        }
        ck_assert_int_eq(t->numel, numel);
        size_t bytes = (size_t)numel * sbp_dtype_size(e[i].dtype);
        ck_assert_uint_eq(t->end - t->begin, bytes);
        unsigned char raw[64];
        ck_assert_int_eq(sbp_st_read_raw(&sf, t, raw, &err), SBP_OK);
        require(bytes == 0 || memcmp(raw, e[i].data, bytes) == 0, "%s: raw bytes differ",
                e[i].name);
    }
    ck_assert_ptr_null(sbp_st_find(&sf, "nope"));
    ck_assert_int_eq(sf.t[6].ndim, 0); /* a 0-d tensor holds one element */
    ck_assert_int_eq(sf.t[6].numel, 1);

    /* conversions: float dtypes to F64 and F32, integer dtypes to I64 */
    double d[8];
    float f[8];
    int64_t l[8];
    ck_assert_int_eq(sbp_st_read(&sf, sbp_st_find(&sf, "f32"), d, SBP_DT_F64, &err), SBP_OK);
    for (int i = 0; i < 6; i++) require(d[i] == (double)f32[i], "F32→F64 [%d] %g", i, d[i]);
    ck_assert_int_eq(sbp_st_read(&sf, sbp_st_find(&sf, "f32"), f, SBP_DT_F32, &err), SBP_OK);
    require(memcmp(f, f32, sizeof f32) == 0, "F32→F32 is not bit-exact");
    ck_assert_int_eq(sbp_st_read(&sf, sbp_st_find(&sf, "f64"), d, SBP_DT_F64, &err), SBP_OK);
    require(memcmp(d, f64, sizeof f64) == 0, "F64→F64 is not bit-exact");
    ck_assert_int_eq(sbp_st_read(&sf, sbp_st_find(&sf, "f64"), f, SBP_DT_F32, &err), SBP_OK);
    require(f[0] == (float)pi && f[1] == -INFINITY && f[2] == 0,
            "F64→F32: %a %a %a, want (float)π, −inf (beyond float's range), 0", f[0], f[1], f[2]);
    static const double bf16_want[4] = {1.0, -2.0, 0x1p-133, -INFINITY};
    ck_assert_int_eq(sbp_st_read(&sf, sbp_st_find(&sf, "bf16"), d, SBP_DT_F64, &err), SBP_OK);
    ck_assert_int_eq(sbp_st_read(&sf, sbp_st_find(&sf, "bf16"), f, SBP_DT_F32, &err), SBP_OK);
    for (int i = 0; i < 4; i++)
        require(d[i] == bf16_want[i] && f[i] == (float)bf16_want[i],
                "BF16 0x%04x: %a (F64) %a (F32), want %a", bf16[i], d[i], f[i], bf16_want[i]);
    static const double f16_want[5] = {1.0, 65504.0, 0x1p-24, -0.0, 0x1.554p-2};
    ck_assert_int_eq(sbp_st_read(&sf, sbp_st_find(&sf, "f16"), d, SBP_DT_F64, &err), SBP_OK);
    ck_assert_int_eq(sbp_st_read(&sf, sbp_st_find(&sf, "f16"), f, SBP_DT_F32, &err), SBP_OK);
    for (int i = 0; i < 5; i++)
        require(d[i] == f16_want[i] && f[i] == (float)f16_want[i] &&
                    !signbit(d[i]) == !signbit(f16_want[i]),
                "F16 0x%04x: %a (F64) %a (F32), want %a", f16[i], d[i], f[i], f16_want[i]);
    ck_assert_int_eq(sbp_st_read(&sf, sbp_st_find(&sf, "i32"), l, SBP_DT_I64, &err), SBP_OK);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(l[i], i32[i]);
    ck_assert_int_eq(sbp_st_read(&sf, sbp_st_find(&sf, "i64"), l, SBP_DT_I64, &err), SBP_OK);
    for (int i = 0; i < 2; i++) ck_assert_int_eq(l[i], i64[i]);
    ck_assert_int_eq(sbp_st_read(&sf, sbp_st_find(&sf, "scalar"), d, SBP_DT_F64, &err), SBP_OK);
    ck_assert(d[0] == 42.0);
    ck_assert_int_eq(sbp_st_read(&sf, sbp_st_find(&sf, "empty"), d, SBP_DT_F64, &err), SBP_OK);
    ck_assert_int_eq(sbp_st_read(&sf, sbp_st_find(&sf, "empty_i"), l, SBP_DT_I64, &err), SBP_OK);
    /* the kind must match: integers are not read as floats, nor floats as integers */
    assert_err(sbp_st_read(&sf, sbp_st_find(&sf, "i32"), d, SBP_DT_F64, &err), &err, SBP_EINPUT,
               "\"i32\"", "I32 read as F64");
    assert_err(sbp_st_read(&sf, sbp_st_find(&sf, "f32"), l, SBP_DT_I64, &err), &err, SBP_EINPUT,
               "\"f32\"", "F32 read as I64");
    sbp_st_close(&sf);

    /* the header length on disk: 8 + N is a multiple of 8 */
    size_t len;
    char *bytes = tu_slurp(path, &len);
    uint64_t hlen;
    memcpy(&hlen, bytes, 8);
    require((8 + hlen) % 8 == 0 && 8 + hlen <= len, "header length %llu", (unsigned long long)hlen);
    free(bytes);
}
END_TEST

/* No tensors and no metadata: a valid file of an empty header. */
START_TEST(st_empty_file) {
    const char *path = tu_path("st-empty.safetensors");
    sbp_err err = {0};
    ck_assert_int_eq(sbp_st_write(path, NULL, 0, NULL, &err), SBP_OK);
    sbp_st_file sf;
    require(sbp_st_open(&sf, path, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(sf.n, 0);
    ck_assert_int_eq(sf.n_meta, 0);
    ck_assert_uint_eq(sf.data_size, 0);
    ck_assert_uint_eq(sf.data_start % 8, 0);
    sbp_st_close(&sf);
}
END_TEST

/* Atomic writes: into a missing directory nothing appears; over an existing file the new content
 * replaces the old whole, and no temporary file stays. */
START_TEST(st_write_atomic) {
    const float x[2] = {1, 2}, y[3] = {3, 4, 5};
    sbp_st_entry e = {"x", SBP_DT_F32, 1, {2}, x};
    sbp_err err = {0};
    const char *missing = tu_path("no-such-dir/t.safetensors");
    assert_err(sbp_st_write(missing, &e, 1, NULL, &err), &err, SBP_EIO, "no-such-dir",
               "write into a missing directory");
    require(!tu_exists(missing) && !tu_exists(tu_path("no-such-dir")), "a failed write created %s",
            missing);

    const char *dir = tu_new_dir("st-atomic"), *path = tu_path("st-atomic/t.safetensors");
    ck_assert_int_eq(sbp_st_write(path, &e, 1, NULL, &err), SBP_OK);
    e = (sbp_st_entry){"y", SBP_DT_F32, 1, {3}, y};
    ck_assert_int_eq(sbp_st_write(path, &e, 1, NULL, &err), SBP_OK);
    tu_assert_no_tmp(dir);
    sbp_st_file sf;
    ck_assert_int_eq(sbp_st_open(&sf, path, &err), SBP_OK);
    ck_assert_int_eq(sf.n, 1);
    ck_assert_str_eq(sf.t[0].name, "y");
    sbp_st_close(&sf);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * A gradient file written piece by piece while the step runs (sbp_grads_out) */

/* The llama3-tiny table and a gradient of distinct values (their slab index), fp32 and fp64. */
static void grads_out_fixture(sbp_params *ps, void **g, sbp_precision prec) {
    sbp_config cfg;
    sbp_err err = {0};
    require(sbp_config_load(&cfg, "data/models/llama3-tiny.json", &err) == SBP_OK, "%s", err.msg);
    require(sbp_params_build(ps, &cfg, &err) == SBP_OK, "%s", err.msg);
    *g = malloc((size_t)ps->total * (prec == SBP_FP64 ? 8 : 4));
    for (int64_t i = 0; i < ps->total; i++)
        if (prec == SBP_FP64)
            ((double *)*g)[i] = (double)i + 0.25;
        else
            ((float *)*g)[i] = (float)i + 0.5f;
}

/* Pieces in any order (the backward's: the head, the layers from the top, the embedding; here
 * each tensor from the last, in two pieces, the second first) give the very bytes of the file
 * sbp_grads_save writes from the whole gradient, header included. */
START_TEST(grads_out_pieces) {
    const sbp_precision prec = _i ? SBP_FP64 : SBP_FP32;
    const size_t esz = _i ? 8 : 4;
    sbp_params ps;
    void *g;
    grads_out_fixture(&ps, &g, prec);
    const char *dir = tu_new_dir("grads-out"), *path = tu_path("grads-out/g.safetensors"),
               *ref = tu_path("grads-out/ref.safetensors");
    const char *meta[] = {"loss", "2.0794415416798357", "schedule", "stream", NULL};
    sbp_err err = {0};
    sbp_grads_out *w;
    require(sbp_grads_out_open(&w, path, &ps, prec, &err) == SBP_OK, "%s", err.msg);
    ck_assert(!tu_exists(path)); /* nothing under the name before the commit */
    require(sbp_grads_out_begin(w, meta, &err) == SBP_OK, "%s", err.msg);
    for (int i = ps.n - 1; i >= 0; i--) {
        const sbp_param *p = &ps.p[i];
        const int64_t half = p->numel / 2;
        ck_assert(sbp_grads_out_put(w, p->offset + half, p->numel - half,
                                    (char *)g + esz * (size_t)(p->offset + half)));
        ck_assert(sbp_grads_out_put(w, p->offset, half, (char *)g + esz * (size_t)p->offset));
    }
    ck_assert_int_eq(sbp_grads_out_error(w, &err), SBP_OK);
    require(sbp_grads_out_commit(w, meta, &err) == SBP_OK, "%s", err.msg);
    require(sbp_grads_save(ref, &ps, prec, g, meta, &err) == SBP_OK, "%s", err.msg);
    tu_assert_no_tmp(dir);
    size_t na, nb;
    char *fa = tu_slurp(path, &na), *fb = tu_slurp(ref, &nb);
    ck_assert_uint_eq(na, nb);
    ck_assert_msg(memcmp(fa, fb, na) == 0, "the file differs from sbp_grads_save's");
    free(fa), free(fb);
    free(g);
    sbp_params_free(&ps);
}
END_TEST

/* What the writer refuses, leaving nothing behind: a piece before the header is fixed, the
 * header fixed twice, a piece outside the slab, a file with a piece missing, metadata that no
 * longer gives the header the data were placed after, and a write the file system refuses
 * (here its size limit, RLIMIT_FSIZE, in a child process: EFBIG as a full disk gives ENOSPC). */
START_TEST(grads_out_refusals) {
    sbp_params ps;
    void *g;
    grads_out_fixture(&ps, &g, SBP_FP32);
    const char *dir = tu_new_dir("grads-out-bad"), *path = tu_path("grads-out-bad/g.safetensors");
    const char *meta[] = {"loss", "1.5", NULL}, *other[] = {"loss", "1.25", NULL};
    sbp_err err = {0};
    sbp_grads_out *w;
    /* before the header: refused, and the first error stands */
    require(sbp_grads_out_open(&w, path, &ps, SBP_FP32, &err) == SBP_OK, "%s", err.msg);
    ck_assert(!sbp_grads_out_put(w, 0, 1, g));
    ck_assert_int_eq(sbp_grads_out_begin(w, meta, &err), SBP_EUSAGE);
    assert_err(sbp_grads_out_commit(w, meta, &err), &err, SBP_EUSAGE, "before the header",
               "a piece before the header");
    ck_assert(!tu_exists(path));
    /* the header twice */
    require(sbp_grads_out_open(&w, path, &ps, SBP_FP32, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(sbp_grads_out_begin(w, meta, &err), SBP_OK);
    assert_err(sbp_grads_out_begin(w, meta, &err), &err, SBP_EUSAGE, "fixed already",
               "the header twice");
    sbp_grads_out_abort(w);
    /* outside the slab */
    require(sbp_grads_out_open(&w, path, &ps, SBP_FP32, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(sbp_grads_out_begin(w, meta, &err), SBP_OK);
    ck_assert(!sbp_grads_out_put(w, ps.total - 1, 2, g));
    ck_assert(!sbp_grads_out_put(w, 0, ps.total, g));
    ck_assert_int_eq(sbp_grads_out_error(w, &err), SBP_EUSAGE);
    ck_assert_msg(strstr(err.msg, "outside"), "%s", err.msg);
    assert_err(sbp_grads_out_commit(w, meta, &err), &err, SBP_EUSAGE, "outside", "a bad piece");
    ck_assert(!tu_exists(path));
    /* a piece missing */
    require(sbp_grads_out_open(&w, path, &ps, SBP_FP32, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(sbp_grads_out_begin(w, meta, &err), SBP_OK);
    ck_assert(sbp_grads_out_put(w, 1, ps.total - 1, (float *)g + 1));
    assert_err(sbp_grads_out_commit(w, meta, &err), &err, SBP_EUSAGE, "of the gradient's",
               "a missing piece");
    ck_assert(!tu_exists(path));
    /* the metadata changed: the header would no longer end where the data start */
    require(sbp_grads_out_open(&w, path, &ps, SBP_FP32, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(sbp_grads_out_begin(w, meta, &err), SBP_OK);
    ck_assert(sbp_grads_out_put(w, 0, ps.total, g));
    assert_err(sbp_grads_out_commit(w, other, &err), &err, SBP_EUSAGE, "metadata changed",
               "changed metadata");
    ck_assert(!tu_exists(path));
    /* abort: nothing stays either */
    require(sbp_grads_out_open(&w, path, &ps, SBP_FP32, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(sbp_grads_out_begin(w, meta, &err), SBP_OK);
    ck_assert(sbp_grads_out_put(w, 0, 10, g));
    sbp_grads_out_abort(w);
    sbp_grads_out_abort(NULL);
    ck_assert(!tu_exists(path));
    /* the file system refuses a write */
    const pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {4096, 4096};
        setrlimit(RLIMIT_FSIZE, &rl);
        int ok = sbp_grads_out_open(&w, path, &ps, SBP_FP32, &err) == SBP_OK;
        ok = ok && sbp_grads_out_begin(w, meta, &err) == SBP_OK;
        ok = ok && !sbp_grads_out_put(w, 0, ps.total, g);
        ok = ok && sbp_grads_out_error(w, &err) == SBP_EIO && strstr(err.msg, "write failed");
        ok = ok && !sbp_grads_out_put(w, 0, 1, g); /* not called again after a failure */
        ok = ok && sbp_grads_out_commit(w, meta, &err) == SBP_EIO;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "a refused write was not reported as SBP_EIO");
    ck_assert(!tu_exists(path));
    tu_assert_no_tmp(dir);
    free(g);
    sbp_params_free(&ps);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * float16 / bfloat16 */

/* The value of a binary16 pattern, from its definition: (−1)^s · m·2^−24 (exponent field 0),
 * (−1)^s · (1024 + m)·2^(e−25) (1..30), ±inf or NaN (31). */
static double f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/* f rounded to nearest even on a grid of p significant bits with minimum exponent emin (the
 * subnormal spacing is 2^(emin − p + 1)), and to ±inf at or above max + ulp/2. In double, where
 * all these steps are exact. */
static double round_ref(float f, int p, int emin, double max) {
    double x = f, ax = fabs(x);
    if (isnan(x) || isinf(x)) return x;
    int e;
    frexp(ax, &e); /* ax in [2^(e−1), 2^e) */
    int ulp_exp = (e - 1 < emin ? emin : e - 1) - (p - 1);
    double r = ldexp(nearbyint(ldexp(ax, -ulp_exp)), ulp_exp); /* nearbyint: ties to even */
    if (r > max) r = INFINITY;
    return x < 0 ? -r : r;
}

/* Every binary16 pattern: the value matches the definition, and converting back gives the
 * same pattern (NaN stays NaN). Every bfloat16 pattern: the upper half of its float. */
START_TEST(half_exhaustive) {
    for (uint32_t h = 0; h < 65536; h++) {
        double want = f16_value((uint16_t)h);
        float f = sbp_f16_to_f32((uint16_t)h);
        if (isnan(want)) {
            require(isnan(f), "f16 0x%04x: %a, want NaN", h, f);
            require(isnan(sbp_f16_to_f32(sbp_f32_to_f16(f))), "f16 NaN 0x%04x lost", h);
            continue;
        }
        require(f == want && !signbit(f) == !signbit(want), "f16 0x%04x: %a, want %a", h, f, want);
        require(sbp_f32_to_f16(f) == h, "f16 0x%04x → %a → 0x%04x", h, f, sbp_f32_to_f16(f));
        float b = sbp_bf16_to_f32((uint16_t)h);
        ck_assert_uint_eq(tu_bits(b), h << 16);
        if (!isnan(b))
            require(sbp_f32_to_bf16(b) == h, "bf16 0x%04x → %a → 0x%04x", h, b, sbp_f32_to_bf16(b));
        else
            require(isnan(sbp_bf16_to_f32(sbp_f32_to_bf16(b))), "bf16 NaN 0x%04x lost", h);
    }
}
END_TEST

/* Rounding down from float: ties to even, overflow, subnormals, against round_ref on random
 * float bit patterns (every exponent) and on the edge cases named below. */
START_TEST(half_rounding) {
    /* binary16: 11 significant bits, emin −14, max 65504; bfloat16: 8 bits, emin −126, max
     * (2 − 2^−7)·2^127 */
    const double f16_max = 65504, bf16_max = ldexp(255, 120);
    sbp_rng r;
    sbp_rng_seed(&r, 31);
    for (int i = 0; i < 2000000; i++) {
        float f = tu_float((uint32_t)sbp_rng_next(&r));
        if (isnan(f)) continue;
        double w16 = round_ref(f, 11, -14, f16_max), wb = round_ref(f, 8, -126, bf16_max);
        float g16 = sbp_f16_to_f32(sbp_f32_to_f16(f)), gb = sbp_bf16_to_f32(sbp_f32_to_bf16(f));
        require(g16 == w16 && !signbit(g16) == !signbit(w16),
                "f32_to_f16(%a) = %a, want %a (seed 31, draw %d)", f, g16, w16, i);
        require(gb == wb && !signbit(gb) == !signbit(wb),
                "f32_to_bf16(%a) = %a, want %a (seed 31, draw %d)", f, gb, wb, i);
    }
    static const struct {
        float f;
        uint16_t f16, bf16;
    } cases[] = {
        {1.0f, 0x3c00, 0x3f80},
        {1 + 0x1p-11f, 0x3c00, 0x3f80},            /* f16 tie between 1 and 1 + 2^-10: even (1) */
        {1 + 3 * 0x1p-11f, 0x3c02, 0x3f80},        /* f16 tie: even is 1 + 2^-9 */
        {1 + 0x1p-11f + 0x1p-23f, 0x3c01, 0x3f80}, /* just above the tie: up */
        {1 + 0x1p-8f, 0x3c04, 0x3f80},             /* bf16 tie between 1 and 1 + 2^-7: even (1) */
        {1 + 3 * 0x1p-8f, 0x3c0c, 0x3f82},         /* bf16 tie: even is 1 + 2^-6 */
        {-(1 + 0x1p-8f + 0x1p-23f), 0xbc04, 0xbf81},
        {65504.0f, 0x7bff, 0x4780},  /* f16 max finite */
        {65519.99f, 0x7bff, 0x4780}, /* below the f16 overflow threshold */
        {65520.0f, 0x7c00, 0x4780},  /* the tie with 2^16 rounds to even: inf */
        {-1e6f, 0xfc00, 0xc974},
        {FLT_MAX, 0x7c00, 0x7f80},     /* above bf16's max + ulp/2: inf */
        {0x1.fep127f, 0x7c00, 0x7f7f}, /* bf16 max finite */
        {INFINITY, 0x7c00, 0x7f80},
        {-INFINITY, 0xfc00, 0xff80},
        {0x1p-24f, 0x0001, 0x3380},        /* f16 smallest subnormal */
        {0x1p-25f, 0x0000, 0x3300},        /* tie between 0 and 2^-24: even (0) */
        {0x1.000002p-25f, 0x0001, 0x3300}, /* just above the tie: up */
        {3 * 0x1p-25f, 0x0002, 0x33c0},    /* tie between 1 and 2 steps: even (2) */
        {0x1.ff8p-15f, 0x03ff, 0x3880},    /* f16 largest subnormal; bf16 rounds up */
        {0x1p-14f, 0x0400, 0x3880},        /* f16 smallest normal */
        {-0.0f, 0x8000, 0x8000},
        {0x1p-149f, 0x0000, 0x0000}, /* below half of bf16's smallest subnormal 2^-133 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        require(sbp_f32_to_f16(cases[i].f) == cases[i].f16, "f32_to_f16(%a) = 0x%04x, want 0x%04x",
                cases[i].f, sbp_f32_to_f16(cases[i].f), cases[i].f16);
        require(sbp_f32_to_bf16(cases[i].f) == cases[i].bf16,
                "f32_to_bf16(%a) = 0x%04x, want 0x%04x", cases[i].f, sbp_f32_to_bf16(cases[i].f),
                cases[i].bf16);
    }
    ck_assert(isnan(sbp_f16_to_f32(sbp_f32_to_f16(NAN))));
    ck_assert(isnan(sbp_bf16_to_f32(sbp_f32_to_bf16(NAN))));
    ck_assert(isnan(sbp_bf16_to_f32(sbp_f32_to_bf16(-NAN))));
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * safetensors: malformed files, each rejected by sbp_st_open with a message naming the problem */

/* u64 little-endian header length, then the header text, then ndata data bytes (zeros). The
 * length is hlen when hlen >= 0, else the text's own length. */
static const char *write_raw(const char *name, const char *header, size_t header_len, long hlen,
                             size_t ndata) {
    const char *path = tu_path("%s.safetensors", name);
    size_t n = 8 + header_len + ndata;
    unsigned char *b = calloc(n, 1);
    ck_assert_ptr_nonnull(b);
    uint64_t h = hlen >= 0 ? (uint64_t)hlen : header_len;
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(h >> (8 * i));
    memcpy(b + 8, header, header_len);
    tu_spit(path, b, n);
    free(b);
    return path;
}

static void expect_open(const char *path, sbp_status want, const char *want_msg) {
    sbp_st_file sf;
    sbp_err err = {0};
    sbp_status st = sbp_st_open(&sf, path, &err);
    if (st == SBP_OK) sbp_st_close(&sf);
    assert_err(st, &err, want, want_msg, path);
    if (want != SBP_OK)
        require(strstr(err.msg, path) != NULL, "message \"%s\" does not name the file", err.msg);
}

/* Header text and data size, the expected status and message substring. */
typedef struct {
    const char *name, *header;
    size_t ndata;
    sbp_status want;
    const char *msg;
} bad_header;

#define T4(name, b, e)                                                                             \
    "\"" name "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" #b "," #e "]}"

static const bad_header bad_headers[] = {
    {"not-json", "{this is not json}", 0, SBP_EFORMAT, "malformed JSON"},
    {"not-object", "[1, 2]", 0, SBP_EFORMAT, "does not start with '{'"},
    {"trailing-garbage", "{" T4("a", 0, 4) "} x", 4, SBP_EFORMAT, "text after the JSON value"},
    {"unknown-dtype-f8", "{\"a\":{\"dtype\":\"F8_E3M4\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
     SBP_EFORMAT, "unknown dtype \"F8_E3M4\""},
    {"unknown-dtype-q4", "{\"a\":{\"dtype\":\"Q4\",\"shape\":[4],\"data_offsets\":[0,2]}}", 2,
     SBP_EFORMAT, "unknown dtype \"Q4\""},
    {"size-mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
     SBP_EFORMAT, "8 bytes of data for 3 elements"},
    {"out-of-range", "{" T4("a", 0, 4) "," T4("b", 400, 404) "}", 8, SBP_EFORMAT,
     "lie outside the 8-byte data buffer"},
    {"reversed", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, SBP_EFORMAT,
     "end before they begin"},
    {"negative-offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4,
     SBP_EFORMAT, "data_offsets must be two non-negative integers"},
    {"overlap",
     "{" T4("a", 0, 4) ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[2,10]}}", 10,
     SBP_EFORMAT, "overlaps tensor \"a\""},
    {"hole", "{" T4("a", 0, 4) "," T4("b", 8, 12) "}", 12, SBP_EFORMAT,
     "bytes [4, 8) of the data buffer belong to no tensor"},
    {"trailing-bytes", "{" T4("a", 0, 4) "}", 12, SBP_EFORMAT,
     "has 12 bytes but the tensors end at byte 4"},
    {"no-tensors-but-data", "{}", 8, SBP_EFORMAT, "8 data bytes but no tensors"},
    {"duplicate-name", "{" T4("a", 0, 4) "," T4("a", 4, 8) "}", 8, SBP_EFORMAT,
     "key \"a\" appears twice"},
    {"metadata-not-string", "{\"__metadata__\":{\"format\":\"pt\",\"n\":1}," T4("a", 0, 4) "}", 4,
     SBP_EFORMAT, "__metadata__ value \"n\" is not a string"},
    {"metadata-not-object", "{\"__metadata__\":[1]," T4("a", 0, 4) "}", 4, SBP_EFORMAT,
     "__metadata__ is not an object"},
    {"no-dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, SBP_EFORMAT, "no dtype"},
    {"bad-shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
     SBP_EFORMAT, "shape[0] is not a non-negative integer"},
    {"entry-not-object", "{\"a\":5}", 0, SBP_EFORMAT, "\"a\" is not an object"},
};

START_TEST(st_bad_header) {
    const bad_header *b = &bad_headers[_i];
    expect_open(write_raw(b->name, b->header, strlen(b->header), -1, b->ndata), b->want, b->msg);
}
END_TEST

/* The control: padding the header with spaces (the writer's 8-byte alignment) is fine. */
START_TEST(st_good_raw_header) {
    const char *h = "{" T4("a", 0, 4) "," T4("b", 4, 8) "}     ";
    expect_open(write_raw("good-raw", h, strlen(h), -1, 8), SBP_OK, "");
}
END_TEST

START_TEST(st_bad_framing) {
    /* shorter than the 8-byte length */
    const char *p = tu_path("short.safetensors");
    tu_spit(p, "\x10\0\0\0\0", 5);
    expect_open(p, SBP_EFORMAT, "shorter than the 8-byte header length");
    /* a header length beyond the end of the file */
    const char *h = "{" T4("a", 0, 4) "}";
    expect_open(write_raw("long-header", h, strlen(h), 1000, 4), SBP_EFORMAT,
                "header length 1000 is impossible");
    expect_open(write_raw("huge-header", h, strlen(h), (long)1 << 40, 4), SBP_EFORMAT,
                "is impossible");
    /* a NUL byte inside the header */
    static const char nul[] = "{\"a\":{\"dtype\":\"F32\",\0\"shape\":[1],\"data_offsets\":[0,4]}}";
    expect_open(write_raw("nul", nul, sizeof nul - 1, -1, 4), SBP_EFORMAT, "NUL byte");
    /* a header cut short by the end of the file: the JSON is incomplete */
    expect_open(write_raw("cut", h, 10, -1, 0), SBP_EFORMAT, "malformed JSON");
    /* no file */
    expect_open(tu_path("does-not-exist.safetensors"), SBP_EIO, "cannot open");
    /* a directory */
    expect_open(tu_new_dir("a-directory"), SBP_EIO, "not a regular file");
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * config.json */

static sbp_config load_cfg(const char *path) {
    sbp_config c;
    sbp_err err = {0};
    require(sbp_config_load(&c, path, &err) == SBP_OK, "%s: %s", path, err.msg);
    return c;
}

START_TEST(config_bundled) {
    sbp_config c = load_cfg("data/models/qwen3-tiny.json");
    ck_assert_int_eq(c.family, SBP_QWEN3);
    ck_assert_str_eq(c.model_type, "qwen3");
    ck_assert(c.vocab == 200 && c.hidden == 64 && c.ffn == 96 && c.layers == 2);
    ck_assert(c.heads == 4 && c.kv_heads == 2 && c.head_dim == 32);
    ck_assert(c.eps == 1e-6 && c.rope_theta == 1e6 && !c.rope_llama3 && c.init_range == 0.1);
    ck_assert(c.tied && !c.qkv_bias && c.qk_norm);

    c = load_cfg("data/models/qwen2-tiny.json");
    ck_assert_int_eq(c.family, SBP_QWEN2);
    ck_assert_str_eq(c.model_type, "qwen2");
    ck_assert(c.vocab == 176 && c.hidden == 64 && c.ffn == 112 && c.layers == 2);
    ck_assert(c.heads == 4 && c.kv_heads == 4 && c.head_dim == 16); /* C / NH */
    ck_assert(c.eps == 1e-6 && c.rope_theta == 1e6 && !c.rope_llama3);
    ck_assert(!c.tied && c.qkv_bias && !c.qk_norm);

    c = load_cfg("data/models/llama3-tiny.json");
    ck_assert_int_eq(c.family, SBP_LLAMA);
    ck_assert_str_eq(c.model_type, "llama");
    ck_assert(c.vocab == 256 && c.hidden == 64 && c.ffn == 128 && c.layers == 2);
    ck_assert(c.heads == 4 && c.kv_heads == 1 && c.head_dim == 16);
    ck_assert(c.eps == 1e-5 && c.rope_theta == 500000.0);
    ck_assert(c.rope_llama3 && c.rope_factor == 8 && c.rope_low_freq == 1 &&
              c.rope_high_freq == 4 && c.rope_orig_max == 8192);
    ck_assert(!c.tied && !c.qkv_bias && !c.qk_norm);
}
END_TEST

/* A minimal valid config of one family with the fields of `extra` (JSON object members, e.g.
 * "\"head_dim\":7") added or replacing the base ones. */
static char *cfg_json(const char *model_type, const char *extra) {
    static char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"model_type\":\"%s\",\"vocab_size\":32,\"hidden_size\":16,\"intermediate_size\":24,"
             "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
             "\"head_dim\":8,\"rms_norm_eps\":1e-6}",
             model_type);
    char wrapped[1024];
    snprintf(wrapped, sizeof wrapped, "{%s}", extra);
    cJSON *base = cJSON_Parse(buf), *ex = cJSON_Parse(wrapped);
    require(base && ex, "test bug: bad JSON %s", wrapped);
    while (ex->child) {
        cJSON *item = cJSON_DetachItemViaPointer(ex, ex->child);
        char key[64]; /* cJSON frees item->string while it renames the item */
        snprintf(key, sizeof key, "%s", item->string);
        if (cJSON_GetObjectItemCaseSensitive(base, key))
            cJSON_ReplaceItemInObjectCaseSensitive(base, key, item);
        else
            cJSON_AddItemToObject(base, key, item);
    }
    char *text = cJSON_PrintUnformatted(base);
    snprintf(buf, sizeof buf, "%s", text);
    free(text);
    cJSON_Delete(base);
    cJSON_Delete(ex);
    return buf;
}

static sbp_config parse_ok(const char *json) {
    sbp_config c;
    sbp_err err = {0};
    require(sbp_config_parse(&c, json, "test.json", &err) == SBP_OK, "%s: %s", json, err.msg);
    return c;
}

START_TEST(config_rope_forms) {
    /* transformers 5: rope_parameters carries the theta and the type */
    sbp_config c = parse_ok(
        cfg_json("llama", "\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":500000.0,"
                          "\"factor\":32.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                          "\"original_max_position_embeddings\":8192}"));
    ck_assert(c.rope_llama3 && c.rope_theta == 500000.0 && c.rope_factor == 32 &&
              c.rope_low_freq == 1 && c.rope_high_freq == 4 && c.rope_orig_max == 8192);
    c = parse_ok(cfg_json(
        "qwen3", "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000}"));
    ck_assert(!c.rope_llama3 && c.rope_theta == 1e6);
    /* transformers 4: rope_theta beside rope_scaling, whose type may be under "type" */
    c = parse_ok(cfg_json("llama", "\"rope_theta\":250000,\"rope_scaling\":{\"type\":\"llama3\","
                                   "\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,"
                                   "\"original_max_position_embeddings\":8192}"));
    ck_assert(c.rope_llama3 && c.rope_theta == 250000 && c.rope_factor == 8);
    c = parse_ok(cfg_json("qwen2", "\"rope_theta\":1e6,\"rope_scaling\":null"));
    ck_assert(!c.rope_llama3 && c.rope_theta == 1e6);
    c = parse_ok(cfg_json("qwen2", "\"rope_scaling\":{\"rope_type\":\"default\"}"));
    ck_assert(!c.rope_llama3 && c.rope_theta == 10000); /* HF's default theta */
}
END_TEST

/* Qwen3 without head_dim: HF's Qwen3Config default is 128, not hidden_size / heads. */
START_TEST(config_qwen3_default_head_dim) {
    const char *j = "{\"model_type\":\"qwen3\",\"vocab_size\":32,\"hidden_size\":16,"
                    "\"intermediate_size\":24,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                    "\"rms_norm_eps\":1e-6}";
    sbp_config c = parse_ok(j);
    ck_assert_int_eq(c.head_dim, 128);
    ck_assert_int_eq(c.kv_heads, 4); /* num_key_value_heads defaults to the head count */
    const char *l = "{\"model_type\":\"llama\",\"vocab_size\":32,\"hidden_size\":16,"
                    "\"intermediate_size\":24,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                    "\"rms_norm_eps\":1e-6}";
    ck_assert_int_eq(parse_ok(l).head_dim, 4); /* Llama: C / NH */
}
END_TEST

typedef struct {
    const char *name, *json; /* json NULL: cfg_json(model_type, extra) */
    const char *model_type, *extra;
    sbp_status want;
    const char *msg;
} bad_config;

static const bad_config bad_configs[] = {
    {"missing field",
     "{\"model_type\":\"llama\",\"vocab_size\":32,\"intermediate_size\":24,"
     "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"rms_norm_eps\":1e-6}",
     NULL, NULL, SBP_EINPUT, "missing required field \"hidden_size\""},
    {"missing model_type", "{\"vocab_size\":32}", NULL, NULL, SBP_EINPUT,
     "missing required field \"model_type\""},
    {"heads not a multiple", NULL, "llama", "\"num_key_value_heads\":3", SBP_EINPUT,
     "num_attention_heads (4) is not a multiple of num_key_value_heads (3)"},
    {"odd head_dim", NULL, "qwen3", "\"head_dim\":7", SBP_EINPUT, "head_dim 7 is odd"},
    {"unknown model_type", NULL, "mistral", "", SBP_EINPUT, "model_type \"mistral\""},
    {"yarn", NULL, "llama",
     "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,"
     "\"original_max_position_embeddings\":4096}",
     SBP_EINPUT, "rope_type \"yarn\" is not supported"},
    {"yarn in rope_parameters", NULL, "qwen3",
     "\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":1e6}", SBP_EINPUT,
     "rope_parameters.rope_type \"yarn\""},
    {"llama3 without factor", NULL, "llama",
     "\"rope_scaling\":{\"rope_type\":\"llama3\",\"low_freq_factor\":1,\"high_freq_factor\":4,"
     "\"original_max_position_embeddings\":8192}",
     SBP_EINPUT, "\"factor\""},
    {"attention_bias llama", NULL, "llama", "\"attention_bias\":true", SBP_EINPUT,
     "attention_bias"},
    {"attention_bias qwen3", NULL, "qwen3", "\"attention_bias\":true", SBP_EINPUT,
     "attention_bias"},
    {"mlp_bias", NULL, "llama", "\"mlp_bias\":true", SBP_EINPUT, "mlp_bias"},
    {"sliding window", NULL, "qwen2", "\"use_sliding_window\":true", SBP_EINPUT,
     "use_sliding_window"},
    {"gelu", NULL, "llama", "\"hidden_act\":\"gelu\"", SBP_EINPUT, "hidden_act \"gelu\""},
    {"malformed json", "{\"model_type\": \"llama\",", NULL, NULL, SBP_EFORMAT, "malformed JSON"},
    {"not an object", "[1]", NULL, NULL, SBP_EFORMAT, "not a JSON object"},
    {"string for int", NULL, "llama", "\"num_hidden_layers\":\"2\"", SBP_EINPUT,
     "num_hidden_layers"},
    {"zero vocab", NULL, "llama", "\"vocab_size\":0", SBP_EINPUT, "vocab_size"},
    {"eps zero", NULL, "llama", "\"rms_norm_eps\":0", SBP_EINPUT, "rms_norm_eps"},
    {"tie not bool", NULL, "llama", "\"tie_word_embeddings\":1", SBP_EINPUT, "tie_word_embeddings"},
};

START_TEST(config_errors) {
    const bad_config *b = &bad_configs[_i];
    const char *json = b->json ? b->json : cfg_json(b->model_type, b->extra);
    sbp_config c;
    sbp_err err = {0};
    assert_err(sbp_config_parse(&c, json, "test.json", &err), &err, b->want, b->msg, b->name);
    require(strstr(err.msg, "test.json") != NULL, "%s: message does not name the file: %s", b->name,
            err.msg);
}
END_TEST

/* Equality field by field (the struct has padding). */
static void assert_config_eq(const sbp_config *a, const sbp_config *b, const char *what) {
    require(a->family == b->family && strcmp(a->model_type, b->model_type) == 0, "%s: type", what);
    require(a->vocab == b->vocab && a->hidden == b->hidden && a->ffn == b->ffn &&
                a->layers == b->layers && a->heads == b->heads && a->kv_heads == b->kv_heads &&
                a->head_dim == b->head_dim,
            "%s: sizes", what);
    require(a->eps == b->eps && a->rope_theta == b->rope_theta &&
                a->rope_llama3 == b->rope_llama3 && a->rope_factor == b->rope_factor &&
                a->rope_low_freq == b->rope_low_freq && a->rope_high_freq == b->rope_high_freq &&
                a->rope_orig_max == b->rope_orig_max,
            "%s: eps %.17g/%.17g, rope %.17g/%.17g", what, a->eps, b->eps, a->rope_theta,
            b->rope_theta);
    require(a->tied == b->tied && a->qkv_bias == b->qkv_bias && a->qk_norm == b->qk_norm &&
                a->init_range == b->init_range,
            "%s: flags", what);
}

START_TEST(config_save_roundtrip) {
    static const char *files[] = {"data/models/qwen3-tiny.json", "data/models/qwen2-tiny.json",
                                  "data/models/llama3-tiny.json"};
    for (int i = 0; i < 3; i++) {
        sbp_config c = load_cfg(files[i]);
        c.eps = 1.0 / 3 * 1e-5; /* a value that needs all 17 digits */
        c.rope_theta = 123456.789;
        const char *path = tu_path("cfg-%d.json", i);
        sbp_err err = {0};
        require(sbp_config_save(&c, path, &err) == SBP_OK, "%s", err.msg);
        sbp_config back = load_cfg(path);
        assert_config_eq(&back, &c, files[i]);
    }
    tu_assert_no_tmp(tu_tmpdir());
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * Parameter table */

/* The expected table of one family, from ref/SEMANTICS.md. */
static int expected_params(const sbp_config *c, char names[][80], int64_t shapes[][2]) {
    int n = 0;
    const int64_t C = c->hidden, F = c->ffn, V = c->vocab, Q = (int64_t)c->heads * c->head_dim,
                  KV = (int64_t)c->kv_heads * c->head_dim, HD = c->head_dim;
#define ADD(d0, d1, ...)                                                                           \
    do {                                                                                           \
        snprintf(names[n], 80, __VA_ARGS__);                                                       \
        shapes[n][0] = d0, shapes[n][1] = d1;                                                      \
        n++;                                                                                       \
    } while (0)
    ADD(V, C, "model.embed_tokens.weight");
    for (int l = 0; l < c->layers; l++) {
        ADD(Q, C, "model.layers.%d.self_attn.q_proj.weight", l);
        if (c->family == SBP_QWEN2) ADD(Q, 0, "model.layers.%d.self_attn.q_proj.bias", l);
        ADD(KV, C, "model.layers.%d.self_attn.k_proj.weight", l);
        if (c->family == SBP_QWEN2) ADD(KV, 0, "model.layers.%d.self_attn.k_proj.bias", l);
        ADD(KV, C, "model.layers.%d.self_attn.v_proj.weight", l);
        if (c->family == SBP_QWEN2) ADD(KV, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        ADD(C, Q, "model.layers.%d.self_attn.o_proj.weight", l);
        if (c->family == SBP_QWEN3) {
            ADD(HD, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            ADD(HD, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        ADD(F, C, "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(F, C, "model.layers.%d.mlp.up_proj.weight", l);
        ADD(C, F, "model.layers.%d.mlp.down_proj.weight", l);
        ADD(C, 0, "model.layers.%d.input_layernorm.weight", l);
        ADD(C, 0, "model.layers.%d.post_attention_layernorm.weight", l);
    }
    ADD(C, 0, "model.norm.weight");
    if (!c->tied) ADD(V, C, "lm_head.weight");
#undef ADD
    return n;
}

static const char *families[] = {"qwen3-tiny", "qwen2-tiny", "llama3-tiny"};

START_TEST(params_table) {
    char path[128];
    snprintf(path, sizeof path, "data/models/%s.json", families[_i]);
    sbp_config c = load_cfg(path);
    sbp_params ps;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_params_build(&ps, &c, &err), SBP_OK);
    char names[64][80];
    int64_t shapes[64][2];
    int n = expected_params(&c, names, shapes);
    /* qwen3-tiny: 1 + 2·11 + 1 (tied); qwen2-tiny: 1 + 2·12 + 2; llama3-tiny: 1 + 2·9 + 2 */
    static const int counts[] = {24, 27, 21};
    ck_assert_int_eq(n, counts[_i]);
    ck_assert_int_eq(ps.n, n);
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        const sbp_param *p = &ps.p[i];
        require(strcmp(p->name, names[i]) == 0, "%s param %d: \"%s\", want \"%s\"", families[_i], i,
                p->name, names[i]);
        require(p->ndim == (shapes[i][1] ? 2 : 1) && p->shape[0] == shapes[i][0] &&
                    (p->ndim == 1 || p->shape[1] == shapes[i][1]),
                "%s: shape [%lld, %lld] ndim %d, want [%lld, %lld]", p->name,
                (long long)p->shape[0], (long long)p->shape[1], p->ndim, (long long)shapes[i][0],
                (long long)shapes[i][1]);
        ck_assert_int_eq(p->numel, shapes[i][0] * (shapes[i][1] ? shapes[i][1] : 1));
        require(p->offset == at, "%s: offset %lld, want %lld (contiguous)", p->name,
                (long long)p->offset, (long long)at);
        ck_assert_int_eq(sbp_params_find(&ps, p->name), i);
        ck_assert_int_eq(sbp_params_offset(&ps, p->kind, p->layer), p->offset);
        at += p->numel;
    }
    ck_assert_int_eq(ps.total, at);
    ck_assert_int_eq(sbp_params_find(&ps, "lm_head.weight") < 0, c.tied);
    ck_assert_int_eq(sbp_params_find(&ps, "model.layers.1.self_attn.q_proj.bias") >= 0,
                     c.family == SBP_QWEN2);
    ck_assert_int_eq(sbp_params_find(&ps, "model.layers.1.self_attn.k_norm.weight") >= 0,
                     c.family == SBP_QWEN3);
    ck_assert_int_eq(sbp_params_offset(&ps, SBP_P_QB, 0) >= 0, c.family == SBP_QWEN2);
    ck_assert_int_eq(sbp_params_offset(&ps, SBP_P_QNORM, 1) >= 0, c.family == SBP_QWEN3);
    ck_assert_int_eq(sbp_params_offset(&ps, SBP_P_Q, c.layers), -1);
    ck_assert_int_eq(sbp_params_find(&ps, "model.layers.2.mlp.up_proj.weight"), -1);
    sbp_params_free(&ps);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * Model loading */

static int64_t entry_numel(const sbp_st_entry *e) {
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
    return n;
}

/* A model directory `name`: the config.json of `from` and the entries e[0..n) as
 * model.safetensors. */
static const char *write_model(const char *name, const char *from, const sbp_st_entry *e, int n) {
    const char *dir = tu_new_dir(name);
    size_t len;
    char *cfg = tu_slurp(tu_join(from, "config.json"), &len);
    tu_spit(tu_path("%s/config.json", name), cfg, len);
    free(cfg);
    sbp_err err = {0};
    require(sbp_st_write(tu_path("%s/model.safetensors", name), e, n, NULL, &err) == SBP_OK, "%s",
            err.msg);
    return dir;
}

static void load_ok(sbp_model *m, const char *dir, sbp_precision prec) {
    sbp_err err = {0};
    require(sbp_model_load(m, dir, prec, NULL, &err) == SBP_OK, "%s: %s", dir, err.msg);
}

static void assert_same_weights(const sbp_model *a, const sbp_model *b, const char *what) {
    ck_assert_int_eq(a->params.total, b->params.total);
    int i = tu_first_diff(a, a->w, b->w);
    require(i < 0, "%s: tensor %s differs", what, i < 0 ? "" : a->params.p[i].name);
}

/* Two shard files and model.safetensors.index.json load bit-identically to the single file. */
START_TEST(model_sharded) {
    const char *src = tu_model(families[_i], 5);
    tu_tensors ts;
    tu_tensors_load(&ts, tu_join(src, "model.safetensors"));
    char name[64];
    snprintf(name, sizeof name, "sharded-%s", families[_i]);
    const char *dir = tu_new_dir(name);
    size_t len;
    char *cfg = tu_slurp(tu_join(src, "config.json"), &len);
    tu_spit(tu_path("%s/config.json", name), cfg, len);
    free(cfg);
    /* the second shard takes the later tensors, in reverse order, to show order is free */
    const int half = ts.n / 2;
    sbp_st_entry second[80];
    for (int i = half; i < ts.n; i++) second[ts.n - 1 - i] = ts.e[i];
    static const char *shard[2] = {"model-00001-of-00002.safetensors",
                                   "model-00002-of-00002.safetensors"};
    sbp_err err = {0};
    ck_assert_int_eq(sbp_st_write(tu_path("%s/%s", name, shard[0]), ts.e, half, NULL, &err),
                     SBP_OK);
    ck_assert_int_eq(
        sbp_st_write(tu_path("%s/%s", name, shard[1]), second, ts.n - half, NULL, &err), SBP_OK);
    cJSON *idx = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(idx, "metadata"),
          *map = cJSON_AddObjectToObject(idx, "weight_map");
    int64_t total = 0;
    for (int i = 0; i < ts.n; i++) total += entry_numel(&ts.e[i]) * 4;
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    for (int i = 0; i < ts.n; i++) cJSON_AddStringToObject(map, ts.names[i], shard[i >= half]);
    char *text = cJSON_Print(idx);
    tu_spit(tu_path("%s/model.safetensors.index.json", name), text, strlen(text));
    free(text);
    cJSON_Delete(idx);
    tu_tensors_free(&ts);

    for (int p = 0; p < 2; p++) {
        sbp_model one, two;
        load_ok(&one, src, p ? SBP_FP64 : SBP_FP32);
        load_ok(&two, dir, p ? SBP_FP64 : SBP_FP32);
        assert_same_weights(&one, &two, p ? "sharded vs single file (fp64)" : "sharded (fp32)");
        sbp_model_free(&one, NULL);
        sbp_model_free(&two, NULL);
    }
}
END_TEST

/* BF16 and F16 weights load exactly: the values written are representable in the dtype (the
 * F32 model's values rounded once here), and the load must reproduce them bit for bit in fp32
 * and fp64. _i: 0 = BF16, 1 = F16. */
START_TEST(model_half_weights) {
    const int bf = _i == 0;
    const char *src = tu_model("llama3-tiny", 6);
    tu_tensors ts;
    tu_tensors_load(&ts, tu_join(src, "model.safetensors"));
    for (int i = 0; i < ts.n; i++) {
        const float *f = ts.data[i];
        int64_t n = entry_numel(&ts.e[i]);
        uint16_t *h = malloc(sizeof *h * (size_t)(n ? n : 1));
        for (int64_t j = 0; j < n; j++) h[j] = bf ? sbp_f32_to_bf16(f[j]) : sbp_f32_to_f16(f[j]);
        free(ts.data[i]);
        ts.data[i] = h;
        ts.e[i].data = h;
        ts.e[i].dtype = bf ? SBP_DT_BF16 : SBP_DT_F16;
    }
    const char *dir = write_model(bf ? "model-bf16" : "model-f16", src, ts.e, ts.n);
    for (int p = 0; p < 2; p++) {
        sbp_model m;
        load_ok(&m, dir, p ? SBP_FP64 : SBP_FP32);
        for (int i = 0; i < m.params.n; i++) {
            const sbp_param *pr = &m.params.p[i];
            const uint16_t *h = ts.data[tu_tensors_index(&ts, pr->name)];
            for (int64_t j = 0; j < pr->numel; j++) {
                double want = bf ? sbp_bf16_to_f32(h[j]) : sbp_f16_to_f32(h[j]);
                double got = tu_at(&m, m.w, pr->offset + j);
                require(got == want, "%s weights, %s [%lld]: loaded %a, want %a (0x%04x)",
                        bf ? "BF16" : "F16", pr->name, (long long)j, got, want, h[j]);
            }
        }
        sbp_model_free(&m, NULL);
    }
    tu_tensors_free(&ts);
}
END_TEST

static void expect_load_fail(const char *dir, sbp_status want, const char *msg, const char *what) {
    sbp_model m;
    sbp_err err = {0};
    sbp_status st = sbp_model_load(&m, dir, SBP_FP32, NULL, &err);
    if (st == SBP_OK) sbp_model_free(&m, NULL);
    assert_err(st, &err, want, msg, what);
}

START_TEST(model_bad_tensors) {
    const char *src = tu_model("qwen2-tiny", 7);
    tu_tensors ts;
    /* a missing tensor */
    tu_tensors_load(&ts, tu_join(src, "model.safetensors"));
    int k = tu_tensors_index(&ts, "model.layers.1.self_attn.k_proj.bias");
    sbp_st_entry e[80];
    int n = 0;
    for (int i = 0; i < ts.n; i++)
        if (i != k) e[n++] = ts.e[i];
    expect_load_fail(write_model("bad-missing", src, e, n), SBP_EINPUT,
                     "no tensor \"model.layers.1.self_attn.k_proj.bias\"", "missing tensor");
    /* the wrong shape: [C, F] for down_proj's [C, F] transposed, same element count */
    memcpy(e, ts.e, sizeof *e * (size_t)ts.n);
    k = tu_tensors_index(&ts, "model.layers.0.mlp.down_proj.weight");
    int64_t t0 = e[k].shape[0];
    e[k].shape[0] = e[k].shape[1], e[k].shape[1] = t0;
    expect_load_fail(write_model("bad-shape", src, e, ts.n), SBP_EINPUT,
                     "tensor \"model.layers.0.mlp.down_proj.weight\" has shape [112, 64]",
                     "transposed tensor");
    /* a 1-d tensor given as [1, C] */
    memcpy(e, ts.e, sizeof *e * (size_t)ts.n);
    k = tu_tensors_index(&ts, "model.norm.weight");
    e[k].ndim = 2, e[k].shape[1] = e[k].shape[0], e[k].shape[0] = 1;
    expect_load_fail(write_model("bad-ndim", src, e, ts.n), SBP_EINPUT, "\"model.norm.weight\"",
                     "extra dimension");
    /* non-finite weights: NaN, +inf */
    const float bad[2] = {NAN, INFINITY};
    for (int b = 0; b < 2; b++) {
        memcpy(e, ts.e, sizeof *e * (size_t)ts.n);
        k = tu_tensors_index(&ts, "model.layers.1.mlp.up_proj.weight");
        float *w = ts.data[k], keep = w[17];
        w[17] = bad[b];
        expect_load_fail(write_model(b ? "bad-inf" : "bad-nan", src, e, ts.n), SBP_EINPUT,
                         "\"model.layers.1.mlp.up_proj.weight\" element 17 is not finite",
                         b ? "inf weight" : "NaN weight");
        w[17] = keep;
    }
    tu_tensors_free(&ts);
    /* no model directory; a directory without weights */
    expect_load_fail(tu_path("no-such-model"), SBP_EIO, "no-such-model", "missing directory");
    const char *empty = tu_new_dir("no-weights");
    size_t len;
    char *cfg = tu_slurp(tu_join(src, "config.json"), &len);
    tu_spit(tu_path("no-weights/config.json"), cfg, len);
    free(cfg);
    expect_load_fail(empty, SBP_EIO, "no model.safetensors", "no weights");
}
END_TEST

/* Tensors the model does not use are ignored: a rotary buffer, and lm_head.weight beside tied
 * embeddings. */
START_TEST(model_extra_tensors) {
    const char *src = tu_model("qwen3-tiny", 8);
    tu_tensors ts;
    tu_tensors_load(&ts, tu_join(src, "model.safetensors"));
    float inv_freq[16] = {1}, head[200 * 64];
    for (int i = 0; i < 200 * 64; i++) head[i] = (float)i;
    sbp_st_entry e[TU_MAX_TENSORS + 3];
    memcpy(e, ts.e, sizeof *e * (size_t)ts.n);
    e[ts.n] = (sbp_st_entry){"model.rotary_emb.inv_freq", SBP_DT_F32, 1, {16}, inv_freq};
    e[ts.n + 1] = (sbp_st_entry){"lm_head.weight", SBP_DT_F32, 2, {200, 64}, head};
    e[ts.n + 2] = (sbp_st_entry){"step", SBP_DT_I64, 0, {0}, &(int64_t){3}};
    const char *dir = write_model("extra-tensors", src, e, ts.n + 3);
    sbp_model a, b;
    load_ok(&a, src, SBP_FP32);
    load_ok(&b, dir, SBP_FP32);
    assert_same_weights(&a, &b, "with extra tensors");
    sbp_model_free(&a, NULL);
    sbp_model_free(&b, NULL);
    tu_tensors_free(&ts);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("io");
    TCase *st = tcase_create("safetensors");
    tcase_set_timeout(st, 60);
    tcase_add_test(st, st_roundtrip);
    tcase_add_test(st, st_empty_file);
    tcase_add_test(st, st_write_atomic);
    tcase_add_loop_test(st, grads_out_pieces, 0, 2);
    tcase_add_test(st, grads_out_refusals);
    tcase_add_test(st, half_exhaustive);
    tcase_add_test(st, half_rounding);
    tcase_add_loop_test(st, st_bad_header, 0, (int)(sizeof bad_headers / sizeof bad_headers[0]));
    tcase_add_test(st, st_good_raw_header);
    tcase_add_test(st, st_bad_framing);
    suite_add_tcase(s, st);
    TCase *cf = tcase_create("config");
    tcase_add_test(cf, config_bundled);
    tcase_add_test(cf, config_rope_forms);
    tcase_add_test(cf, config_qwen3_default_head_dim);
    tcase_add_loop_test(cf, config_errors, 0, (int)(sizeof bad_configs / sizeof bad_configs[0]));
    tcase_add_test(cf, config_save_roundtrip);
    tcase_add_loop_test(cf, params_table, 0, 3);
    suite_add_tcase(s, cf);
    TCase *md = tcase_create("model");
    tcase_set_timeout(md, 60);
    tcase_add_loop_test(md, model_sharded, 0, 3);
    tcase_add_loop_test(md, model_half_weights, 0, 2);
    tcase_add_test(md, model_bad_tensors);
    tcase_add_test(md, model_extra_tensors);
    suite_add_tcase(s, md);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
