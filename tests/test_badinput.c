/* test_badinput.c — docs/commands.md#limits-and-bad-input: bad input gets a clear message naming
 * the problem, exit status 2 and no output file left behind; exit 1 only for a non-finite loss or
 * gradient.
 *
 * Every bad file is made in tu_tmpdir() from a good seeded qwen3-tiny model: well-formed but
 * wrong content through sbp_st_write, malformed files as raw bytes. The command-line cases run
 * `streambp grad` / `streambp init` with --out in a fresh directory and check the exit status,
 * that stderr names the problem, that stdout stays empty, that neither the output nor a
 * temporary file is left, and that no sanitizer spoke. The library cases check the sbp_status. */
#include "testutil.h"
#include "../src/io/safetensors.h"

#include <cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MODEL "qwen3-tiny"
#define V     200 /* vocab_size of data/models/qwen3-tiny.json */
#define SB    2   /* rows of the test batches */
#define ST    8   /* tokens per row */

/* ---------------------------------------------------------------------------------------------
 * Paths and files */

static void spit_text(const char *path, const char *text) {
    tu_spit(path, text, strlen(text));
}

static void copy_file(const char *from, const char *to) {
    size_t n;
    char *b = tu_slurp(from, &n);
    tu_spit(to, b, n);
    free(b);
}

/* A fresh empty directory for one command's output. */
static const char *fresh_dir(void) {
    static int n;
    char name[32];
    snprintf(name, sizeof name, "out-%d", n++);
    return tu_new_dir(name);
}

static const char *good_model(void) {
    return tu_model(MODEL, 1);
}

static const char *good_st(void) {
    return tu_path("model-%s-1/model.safetensors", MODEL);
}

/* A copy of the good model (config.json + model.safetensors) under tu_tmpdir()/name. */
static const char *copy_model(const char *name) {
    const char *d = tu_new_dir(name);
    copy_file(tu_path("model-%s-1/config.json", MODEL), tu_path("%s/config.json", name));
    copy_file(good_st(), tu_path("%s/model.safetensors", name));
    return d;
}

/* Sets field `key` of a config.json to v (removes it when v is NULL). */
static void edit_config(const char *path, const char *key, cJSON *v) {
    char *text = tu_slurp(path, NULL);
    cJSON *o = cJSON_Parse(text);
    free(text);
    ck_assert_ptr_nonnull(o);
    if (!v)
        cJSON_DeleteItemFromObjectCaseSensitive(o, key);
    else if (!cJSON_ReplaceItemInObjectCaseSensitive(o, key, v))
        cJSON_AddItemToObject(o, key, v);
    text = cJSON_Print(o);
    spit_text(path, text);
    free(text);
    cJSON_Delete(o);
}

/* A copy of the good model with config.json field `key` set to v (removed when v is NULL). */
static const char *model_with_field(const char *name, const char *key, cJSON *v) {
    const char *d = copy_model(name);
    edit_config(tu_path("%s/config.json", name), key, v);
    return d;
}

/* ---------------------------------------------------------------------------------------------
 * Safetensors, two ways: the header as JSON with the data bytes untouched (for malformed
 * files), or every tensor as an sbp_st_entry to rewrite with sbp_st_write (for wrong content). */

typedef struct {
    cJSON *hdr;
    char *data;
    size_t ndata;
} st_raw;

static st_raw raw_load(const char *path) {
    size_t n;
    char *b = tu_slurp(path, &n);
    uint64_t h;
    memcpy(&h, b, 8);
    ck_assert_uint_le(8 + h, n);
    st_raw r = {.ndata = n - 8 - h};
    r.hdr = cJSON_ParseWithLength(b + 8, h);
    ck_assert_ptr_nonnull(r.hdr);
    r.data = malloc(r.ndata + 1);
    memcpy(r.data, b + 8 + h, r.ndata);
    free(b);
    return r;
}

/* Writes the header and the first ndata data bytes; frees r. */
static void raw_save(const char *path, st_raw *r, size_t ndata) {
    char *text = cJSON_PrintUnformatted(r->hdr);
    uint64_t h = strlen(text);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fwrite(&h, 8, 1, f);
    fwrite(text, 1, h, f);
    fwrite(r->data, 1, ndata, f);
    ck_assert_int_eq(fclose(f), 0);
    free(text);
    free(r->data);
    cJSON_Delete(r->hdr);
}

static cJSON *raw_tensor(st_raw *r, const char *name) {
    cJSON *t = cJSON_GetObjectItemCaseSensitive(r->hdr, name);
    ck_assert_msg(t != NULL, "no tensor %s in the good model", name);
    return t;
}

static void raw_offsets(st_raw *r, const char *name, double *b, double *e) {
    cJSON *o = cJSON_GetObjectItemCaseSensitive(raw_tensor(r, name), "data_offsets");
    *b = cJSON_GetNumberValue(cJSON_GetArrayItem(o, 0));
    *e = cJSON_GetNumberValue(cJSON_GetArrayItem(o, 1));
}

static void raw_set_offsets(st_raw *r, const char *name, double b, double e) {
    const double v[2] = {b, e};
    cJSON_ReplaceItemInObjectCaseSensitive(raw_tensor(r, name), "data_offsets",
                                           cJSON_CreateDoubleArray(v, 2));
}

/* A model directory: the good config.json and a header-edited copy of the good weights. */
static const char *model_dir_for_raw(const char *name, st_raw *r, size_t ndata) {
    const char *d = copy_model(name);
    raw_save(tu_path("%s/model.safetensors", name), r, ndata);
    return d;
}

/* Writes the tensors as name/model.safetensors beside the good config.json; frees ts. */
static const char *tensors_model(const char *name, tu_tensors *ts) {
    const char *d = copy_model(name);
    sbp_err err = {0};
    ck_assert_msg(sbp_st_write(tu_path("%s/model.safetensors", name), ts->e, ts->n, NULL, &err) ==
                      SBP_OK,
                  "%s", err.msg);
    tu_tensors_free(ts);
    return d;
}

/* The good model with every element of one F32 tensor set to v. */
static const char *model_with_const(const char *name, const char *tensor, float v) {
    tu_tensors ts;
    tu_tensors_load(&ts, good_st());
    int i = tu_tensors_index(&ts, tensor);
    ck_assert_int_eq(ts.e[i].dtype, SBP_DT_F32);
    float *w = ts.data[i];
    int64_t n = ts.e[i].ndim == 2 ? ts.e[i].shape[0] * ts.e[i].shape[1] : ts.e[i].shape[0];
    for (int64_t j = 0; j < n; j++) w[j] = v;
    return tensors_model(name, &ts);
}

/* ---------------------------------------------------------------------------------------------
 * Batches: I64 [SB, ST] tensors built from a good SFT batch. */

typedef struct {
    int64_t ids[SB * ST], labels[SB * ST], mask[SB * ST];
} sft;

static sft good_sft(void) {
    sft s;
    for (int i = 0; i < SB * ST; i++) {
        s.ids[i] = (i * 37 + 11) % V;
        s.labels[i] = s.ids[i];
        s.mask[i] = 1;
    }
    return s;
}

static sbp_st_entry bt_entry(const char *name, const int64_t *data) {
    return (sbp_st_entry){
        .name = name, .dtype = SBP_DT_I64, .ndim = 2, .shape = {SB, ST}, .data = data};
}

static const char *write_entries(const char *file, const sbp_st_entry *e, int n) {
    const char *p = tu_path("%s", file);
    sbp_err err = {0};
    ck_assert_msg(sbp_st_write(p, e, n, NULL, &err) == SBP_OK, "%s", err.msg);
    return p;
}

static const char *write_sft(const char *file, const sft *s) {
    const sbp_st_entry e[] = {bt_entry("input_ids", s->ids), bt_entry("labels", s->labels),
                              bt_entry("attention_mask", s->mask)};
    return write_entries(file, e, 3);
}

static const char *good_batch(void) {
    sft s = good_sft();
    return write_sft("good-batch.safetensors", &s);
}

/* ---------------------------------------------------------------------------------------------
 * Running the command line */

static char last_cmd[4096];
static char last_stdout[1 << 16];

static int run_cli(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run_cli(const char *fmt, ...) {
    char args[3500];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(last_cmd, sizeof last_cmd, "%s %s", tu_bin(), args);
    const char *so = tu_path("stdout.txt");
    int rc = tu_sh("%s >'%s'", last_cmd, so);
    FILE *f = fopen(so, "r");
    size_t n = f ? fread(last_stdout, 1, sizeof last_stdout - 1, f) : 0;
    last_stdout[n] = '\0';
    if (f) fclose(f);
    return rc;
}

/* The exit status, the substrings of want (NULL-terminated) on stderr, a silent stdout on
 * failure, and no sanitizer report. */
static void check_run(int rc, int want_rc, const char *const *want) {
    const char *err = tu_last_output();
    ck_assert_msg(rc == want_rc, "`%s` exited %d, expected %d; stderr:\n%s", last_cmd, rc, want_rc,
                  err);
    for (int i = 0; want[i]; i++)
        ck_assert_msg(strstr(err, want[i]) != NULL, "`%s`: stderr does not mention \"%s\":\n%s",
                      last_cmd, want[i], err);
    static const char *const san[] = {"runtime error", "AddressSanitizer", "LeakSanitizer"};
    for (int i = 0; i < 3; i++)
        ck_assert_msg(!strstr(err, san[i]), "`%s`: sanitizer report:\n%s", last_cmd, err);
    if (want_rc != 0)
        ck_assert_msg(last_stdout[0] == '\0', "`%s` failed but printed on stdout:\n%s", last_cmd,
                      last_stdout);
}

/* Runs `streambp grad` (omitting --model or --batch when NULL) with --out in a fresh directory,
 * then checks as check_run does and that neither the output nor a temporary file is left. */
static void expect_grad_(const char *model, const char *batch, const char *extra, int want_rc,
                         const char *const *want) {
    const char *dir = fresh_dir();
    const char *out = tu_join(dir, "grad.safetensors");
    char m[800] = "", b[800] = "";
    if (model) snprintf(m, sizeof m, "--model '%s'", model);
    if (batch) snprintf(b, sizeof b, "--batch '%s'", batch);
    int rc = run_cli("grad %s %s --out '%s' %s", m, b, out, extra);
    check_run(rc, want_rc, want);
    if (want_rc != 0)
        ck_assert_msg(!tu_exists(out), "`%s` failed but left %s behind", last_cmd, out);
    else
        ck_assert_msg(tu_exists(out), "`%s` succeeded but wrote no %s", last_cmd, out);
    tu_assert_no_tmp(dir);
}
#define expect_grad(model, batch, extra, rc, ...)                                                  \
    expect_grad_(model, batch, extra, rc, (const char *const[]){__VA_ARGS__, NULL})

/* A bad model with the good batch. */
#define expect_bad_model(model, ...) expect_grad(model, good_batch(), "", 2, __VA_ARGS__)
/* A bad batch with the good model. */
#define expect_bad_batch(batch, ...) expect_grad(good_model(), batch, "", 2, __VA_ARGS__)

static void expect_init_(const char *args, int want_rc, const char *const *want) {
    check_run(run_cli("init %s", args), want_rc, want);
}
#define expect_init(args, rc, ...) expect_init_(args, rc, (const char *const[]){__VA_ARGS__, NULL})

/* ---------------------------------------------------------------------------------------------
 * Control: the fixtures themselves are good, so every failure below is the corruption's. */

START_TEST(control_good_model_and_batch) {
    sbp_config cfg;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_config_load(&cfg, tu_path("model-%s-1/config.json", MODEL), &err), SBP_OK);
    ck_assert_int_eq(cfg.vocab, V);
    expect_grad(good_model(), good_batch(), "", 0, NULL);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * Model directory and config.json */

START_TEST(model_dir_missing) {
    const char *d = tu_path("no-such-model");
    expect_bad_model(d, d, "does not exist");
}
END_TEST

START_TEST(model_dir_is_a_file) {
    const char *d = tu_path("model-is-a-file");
    spit_text(d, "not a directory\n");
    expect_bad_model(d, d, "not a directory");
}
END_TEST

START_TEST(model_without_config) {
    const char *d = copy_model("no-config");
    remove(tu_path("no-config/config.json"));
    expect_bad_model(d, tu_path("no-config/config.json"));
}
END_TEST

/* Tests run as root, so an unreadable config is a directory named config.json. */
START_TEST(model_config_unreadable) {
    const char *d = copy_model("config-is-dir");
    const char *cfg = tu_path("config-is-dir/config.json");
    remove(cfg);
    ck_assert_int_eq(mkdir(cfg, 0755), 0);
    expect_bad_model(d, cfg);
}
END_TEST

START_TEST(model_without_weights) {
    const char *d = copy_model("no-weights");
    remove(tu_path("no-weights/model.safetensors"));
    expect_bad_model(d, "model.safetensors");
}
END_TEST

START_TEST(config_missing_field) {
    expect_bad_model(model_with_field("cfg-no-hidden", "hidden_size", NULL), "config.json",
                     "\"hidden_size\"");
}
END_TEST

START_TEST(config_field_wrong_type) {
    expect_bad_model(model_with_field("cfg-hidden-str", "hidden_size", cJSON_CreateString("64")),
                     "\"hidden_size\"");
}
END_TEST

START_TEST(config_heads_not_dividing) {
    expect_bad_model(model_with_field("cfg-heads", "num_key_value_heads", cJSON_CreateNumber(3)),
                     "num_attention_heads (4)", "num_key_value_heads (3)");
}
END_TEST

START_TEST(config_odd_head_dim) {
    expect_bad_model(model_with_field("cfg-hd", "head_dim", cJSON_CreateNumber(33)), "head_dim 33",
                     "odd");
}
END_TEST

/* An explicit head_dim of 0 is a bad value, not an absent field. */
START_TEST(config_head_dim_zero) {
    expect_bad_model(model_with_field("cfg-hd0", "head_dim", cJSON_CreateNumber(0)), "head_dim 0");
}
END_TEST

START_TEST(config_zero_layers) {
    expect_bad_model(model_with_field("cfg-l0", "num_hidden_layers", cJSON_CreateNumber(0)),
                     "num_hidden_layers");
}
END_TEST

START_TEST(config_unknown_model_type) {
    expect_bad_model(model_with_field("cfg-mistral", "model_type", cJSON_CreateString("mistral")),
                     "\"mistral\"");
}
END_TEST

START_TEST(config_malformed_json) {
    const char *d = copy_model("cfg-json");
    spit_text(tu_path("cfg-json/config.json"), "{\"model_type\": \"qwen3\", \"vocab_size\": 200,");
    expect_bad_model(d, "cfg-json/config.json", "JSON");
}
END_TEST

START_TEST(config_not_an_object) {
    const char *d = copy_model("cfg-array");
    spit_text(tu_path("cfg-array/config.json"), "[1, 2, 3]\n");
    expect_bad_model(d, "cfg-array/config.json", "JSON object");
}
END_TEST

/* The config promises a larger vocabulary than the weights hold. */
START_TEST(config_disagrees_with_weights) {
    expect_bad_model(model_with_field("cfg-vocab", "vocab_size", cJSON_CreateNumber(300)),
                     "model.embed_tokens.weight", "[300, 64]");
}
END_TEST

/* Sizes that no machine can hold (8 TiB of weights, within every per-field limit) while the
 * file holds the tiny model: the mismatch is known from the header, before any weight is
 * allocated and before the memory check. */
START_TEST(config_huge_disagrees_with_weights) {
    const char *d = model_with_field("cfg-huge", "vocab_size", cJSON_CreateNumber(1 << 24));
    edit_config(tu_path("cfg-huge/config.json"), "hidden_size", cJSON_CreateNumber(1 << 17));
    expect_bad_model(d, "model.embed_tokens.weight");
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * model.safetensors: malformed */

START_TEST(weights_truncated) {
    st_raw r = raw_load(good_st());
    const char *d = model_dir_for_raw("st-trunc", &r, r.ndata / 2);
    expect_bad_model(d, "st-trunc/model.safetensors", "data buffer");
}
END_TEST

START_TEST(weights_trailing_bytes) {
    st_raw r = raw_load(good_st());
    const char *d = copy_model("st-trail");
    const char *p = tu_path("st-trail/model.safetensors");
    raw_save(p, &r, r.ndata);
    FILE *f = fopen(p, "ab");
    fputs("trailing garbage", f);
    fclose(f);
    expect_bad_model(d, "st-trail/model.safetensors", "data buffer");
}
END_TEST

START_TEST(weights_garbage) {
    const char *d = copy_model("st-garbage");
    unsigned char junk[4096];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof junk; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        junk[i] = (unsigned char)(x >> 24);
    }
    tu_spit(tu_path("st-garbage/model.safetensors"), junk, sizeof junk);
    expect_bad_model(d, "st-garbage/model.safetensors", "header");
}
END_TEST

START_TEST(weights_header_not_json) {
    const char *d = copy_model("st-notjson");
    const char text[] = "{this is not json}";
    unsigned char b[8 + sizeof text - 1];
    uint64_t h = sizeof text - 1;
    memcpy(b, &h, 8);
    memcpy(b + 8, text, h);
    tu_spit(tu_path("st-notjson/model.safetensors"), b, sizeof b);
    expect_bad_model(d, "st-notjson/model.safetensors", "JSON");
}
END_TEST

START_TEST(weights_header_longer_than_file) {
    const char *d = copy_model("st-hlen");
    unsigned char b[10] = {0, 0, 0x10, 0, 0, 0, 0, 0, '{', '}'}; /* 1 MiB of header promised */
    tu_spit(tu_path("st-hlen/model.safetensors"), b, sizeof b);
    expect_bad_model(d, "st-hlen/model.safetensors", "header length 1048576");
}
END_TEST

START_TEST(weights_empty_file) {
    const char *d = copy_model("st-empty");
    tu_spit(tu_path("st-empty/model.safetensors"), "", 0);
    expect_bad_model(d, "st-empty/model.safetensors", "0 bytes");
}
END_TEST

START_TEST(weights_offsets_out_of_range) {
    st_raw r = raw_load(good_st());
    raw_set_offsets(&r, "model.norm.weight", (double)r.ndata, (double)r.ndata + 256);
    const char *d = model_dir_for_raw("st-range", &r, r.ndata);
    expect_bad_model(d, "\"model.norm.weight\"", "outside");
}
END_TEST

START_TEST(weights_offsets_reversed) {
    st_raw r = raw_load(good_st());
    double b, e;
    raw_offsets(&r, "model.norm.weight", &b, &e);
    raw_set_offsets(&r, "model.norm.weight", e, b);
    const char *d = model_dir_for_raw("st-reversed", &r, r.ndata);
    expect_bad_model(d, "\"model.norm.weight\"", "data_offsets");
}
END_TEST

/* Two [64] norms: the second points at the first one's bytes. */
START_TEST(weights_offsets_overlap) {
    st_raw r = raw_load(good_st());
    double b, e;
    raw_offsets(&r, "model.layers.0.input_layernorm.weight", &b, &e);
    raw_set_offsets(&r, "model.layers.0.post_attention_layernorm.weight", b, e);
    const char *d = model_dir_for_raw("st-overlap", &r, r.ndata);
    expect_bad_model(d, "overlaps", "layernorm.weight");
}
END_TEST

START_TEST(weights_duplicate_name) {
    st_raw r = raw_load(good_st());
    cJSON_AddItemToObject(r.hdr, "model.norm.weight",
                          cJSON_Duplicate(raw_tensor(&r, "model.norm.weight"), 1));
    const char *d = model_dir_for_raw("st-dup", &r, r.ndata);
    expect_bad_model(d, "\"model.norm.weight\"", "twice");
}
END_TEST

START_TEST(weights_unknown_dtype) {
    st_raw r = raw_load(good_st());
    cJSON_ReplaceItemInObjectCaseSensitive(raw_tensor(&r, "model.norm.weight"), "dtype",
                                           cJSON_CreateString("F33"));
    const char *d = model_dir_for_raw("st-dtype", &r, r.ndata);
    expect_bad_model(d, "\"model.norm.weight\"", "\"F33\"");
}
END_TEST

/* A known dtype of the right size that is not a float. */
START_TEST(weights_integer_dtype) {
    st_raw r = raw_load(good_st());
    cJSON_ReplaceItemInObjectCaseSensitive(raw_tensor(&r, "model.norm.weight"), "dtype",
                                           cJSON_CreateString("I32"));
    const char *d = model_dir_for_raw("st-int", &r, r.ndata);
    expect_bad_model(d, "\"model.norm.weight\"", "I32");
}
END_TEST

START_TEST(weights_missing_index_shard) {
    const char *d = copy_model("st-shards");
    remove(tu_path("st-shards/model.safetensors"));
    spit_text(tu_path("st-shards/model.safetensors.index.json"),
              "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}");
    expect_bad_model(d, "model-00001-of-00002.safetensors");
}
END_TEST

START_TEST(weights_index_escapes_dir) {
    const char *d = copy_model("st-escape");
    remove(tu_path("st-escape/model.safetensors"));
    spit_text(tu_path("st-escape/model.safetensors.index.json"),
              "{\"weight_map\": {\"model.norm.weight\": \"../good-batch.safetensors\"}}");
    expect_bad_model(d, "weight_map", "model.norm.weight");
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * model.safetensors: well-formed but wrong */

START_TEST(weights_missing_tensor) {
    tu_tensors ts;
    tu_tensors_load(&ts, good_st());
    int i = tu_tensors_index(&ts, "model.layers.1.mlp.up_proj.weight");
    free(ts.data[i]);
    for (int j = i; j + 1 < ts.n; j++) {
        ts.e[j] = ts.e[j + 1];
        ts.data[j] = ts.data[j + 1];
    }
    ts.n--;
    expect_bad_model(tensors_model("w-missing", &ts), "\"model.layers.1.mlp.up_proj.weight\"");
}
END_TEST

/* q_proj [128, 64] stored transposed: the element count matches, the shape does not. */
START_TEST(weights_wrong_shape) {
    tu_tensors ts;
    tu_tensors_load(&ts, good_st());
    sbp_st_entry *e = &ts.e[tu_tensors_index(&ts, "model.layers.0.self_attn.q_proj.weight")];
    int64_t t = e->shape[0];
    e->shape[0] = e->shape[1];
    e->shape[1] = t;
    expect_bad_model(tensors_model("w-shape", &ts), "\"model.layers.0.self_attn.q_proj.weight\"",
                     "[64, 128]", "[128, 64]");
}
END_TEST

START_TEST(weights_nan) {
    tu_tensors ts;
    tu_tensors_load(&ts, good_st());
    ((float *)ts.data[tu_tensors_index(&ts, "model.layers.1.mlp.down_proj.weight")])[7] = NAN;
    expect_bad_model(tensors_model("w-nan", &ts), "\"model.layers.1.mlp.down_proj.weight\"",
                     "not finite");
}
END_TEST

/* An F64 weight beyond float's range is finite on disk but not after conversion to fp32. */
START_TEST(weights_f64_overflows_fp32) {
    tu_tensors ts;
    tu_tensors_load(&ts, good_st());
    int i = tu_tensors_index(&ts, "model.norm.weight");
    double *w = malloc(sizeof *w * (size_t)ts.e[i].shape[0]);
    for (int64_t j = 0; j < ts.e[i].shape[0]; j++) w[j] = ((float *)ts.data[i])[j];
    w[3] = 1e300;
    free(ts.data[i]);
    ts.data[i] = w;
    ts.e[i].data = w;
    ts.e[i].dtype = SBP_DT_F64;
    expect_bad_model(tensors_model("w-f64", &ts), "\"model.norm.weight\"", "not finite");
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * Batch files */

START_TEST(batch_missing) {
    const char *p = tu_path("no-such-batch.safetensors");
    expect_bad_batch(p, p);
}
END_TEST

START_TEST(batch_is_a_directory) {
    const char *p = tu_new_dir("batch-dir.safetensors");
    expect_bad_batch(p, p);
}
END_TEST

START_TEST(batch_not_safetensors) {
    const char *p = tu_path("batch.txt");
    spit_text(p, "input_ids,labels\n1,2\n3,4\n");
    expect_bad_batch(p, p, "safetensors");
}
END_TEST

START_TEST(batch_labels_shape) {
    sft s = good_sft();
    sbp_st_entry e[] = {bt_entry("input_ids", s.ids), bt_entry("labels", s.labels)};
    e[1].shape[1] = ST - 1;
    expect_bad_batch(write_entries("b-lshape.safetensors", e, 2), "\"labels\"", "[2, 7]", "[2, 8]");
}
END_TEST

START_TEST(batch_mask_shape) {
    sft s = good_sft();
    sbp_st_entry e[] = {bt_entry("input_ids", s.ids), bt_entry("labels", s.labels),
                        bt_entry("attention_mask", s.mask)};
    e[2].shape[0] = 1;
    expect_bad_batch(write_entries("b-mshape.safetensors", e, 3), "\"attention_mask\"", "[1, 8]");
}
END_TEST

START_TEST(batch_labels_missing) {
    sft s = good_sft();
    const sbp_st_entry e[] = {bt_entry("input_ids", s.ids), bt_entry("attention_mask", s.mask)};
    expect_bad_batch(write_entries("b-nolabels.safetensors", e, 2), "\"labels\"");
}
END_TEST

START_TEST(batch_input_ids_missing) {
    sft s = good_sft();
    const sbp_st_entry e[] = {bt_entry("labels", s.labels)};
    expect_bad_batch(write_entries("b-noids.safetensors", e, 1), "\"input_ids\"");
}
END_TEST

START_TEST(batch_token_too_large) {
    sft s = good_sft();
    s.ids[ST + 3] = V;
    expect_bad_batch(write_sft("b-idV.safetensors", &s), "input_ids[1][3] = 200");
}
END_TEST

START_TEST(batch_token_negative) {
    sft s = good_sft();
    s.ids[2] = -1;
    expect_bad_batch(write_sft("b-idneg.safetensors", &s), "input_ids[0][2] = -1");
}
END_TEST

/* 2^32 + 5 would pass as token 5 if the id were narrowed to 32 bits before the check. */
START_TEST(batch_token_beyond_int32) {
    sft s = good_sft();
    s.ids[4] = (INT64_C(1) << 32) + 5;
    expect_bad_batch(write_sft("b-id2p32.safetensors", &s), "input_ids[0][4] = 4294967301");
}
END_TEST

START_TEST(batch_label_minus_one) {
    sft s = good_sft();
    s.labels[5] = -1;
    expect_bad_batch(write_sft("b-lneg.safetensors", &s), "labels[0][5] = -1");
}
END_TEST

START_TEST(batch_label_vocab) {
    sft s = good_sft();
    s.labels[ST + 6] = V;
    expect_bad_batch(write_sft("b-lV.safetensors", &s), "labels[1][6] = 200");
}
END_TEST

START_TEST(batch_mask_two) {
    sft s = good_sft();
    s.mask[ST + 1] = 2;
    expect_bad_batch(write_sft("b-mask2.safetensors", &s), "attention_mask[1][1] = 2");
}
END_TEST

START_TEST(batch_one_dimensional) {
    sft s = good_sft();
    sbp_st_entry e[] = {bt_entry("input_ids", s.ids), bt_entry("labels", s.labels)};
    e[0].ndim = 1;
    e[0].shape[0] = SB * ST;
    expect_bad_batch(write_entries("b-1d.safetensors", e, 2), "\"input_ids\"", "2-D");
}
END_TEST

START_TEST(batch_float_ids) {
    sft s = good_sft();
    double f[SB * ST];
    for (int i = 0; i < SB * ST; i++) f[i] = (double)s.ids[i];
    sbp_st_entry e[] = {bt_entry("input_ids", NULL), bt_entry("labels", s.labels)};
    e[0].dtype = SBP_DT_F64;
    e[0].data = f;
    expect_bad_batch(write_entries("b-float.safetensors", e, 2), "\"input_ids\"", "F64");
}
END_TEST

START_TEST(batch_t_zero) {
    sbp_st_entry e[] = {bt_entry("input_ids", NULL), bt_entry("labels", NULL)};
    e[0].shape[1] = e[1].shape[1] = 0;
    expect_bad_batch(write_entries("b-t0.safetensors", e, 2), "[2, 0]");
}
END_TEST

START_TEST(batch_b_zero) {
    sbp_st_entry e[] = {bt_entry("input_ids", NULL), bt_entry("labels", NULL)};
    e[0].shape[0] = e[1].shape[0] = 0;
    expect_bad_batch(write_entries("b-b0.safetensors", e, 2), "[0, 8]");
}
END_TEST

/* A header whose shape multiplies past 64 bits must not wrap around to a small size. */
START_TEST(batch_shape_overflow) {
    st_raw r = raw_load(good_batch());
    const double shape[2] = {4294967296.0, 4294967296.0};
    cJSON_ReplaceItemInObjectCaseSensitive(raw_tensor(&r, "input_ids"), "shape",
                                           cJSON_CreateDoubleArray(shape, 2));
    const char *p = tu_path("b-overflow.safetensors");
    raw_save(p, &r, r.ndata);
    expect_bad_batch(p, "\"input_ids\"");
}
END_TEST

/* The mean loss over zero targets is 0/0; it must be an error, never a printed NaN. */
START_TEST(batch_no_target_all_ignored) {
    sft s = good_sft();
    for (int i = 0; i < SB * ST; i++) s.labels[i] = SBP_IGNORE;
    expect_bad_batch(write_sft("b-none.safetensors", &s), "no valid target");
}
END_TEST

/* labels[:, 0] is never a target (the shift drops it), so this batch has none either. */
START_TEST(batch_no_target_only_first) {
    sft s = good_sft();
    for (int i = 0; i < SB * ST; i++)
        if (i % ST != 0) s.labels[i] = SBP_IGNORE;
    expect_bad_batch(write_sft("b-first.safetensors", &s), "no valid target");
}
END_TEST

START_TEST(batch_no_target_single_token) {
    int64_t ids[SB] = {3, 4}, labels[SB] = {3, 4};
    sbp_st_entry e[] = {bt_entry("input_ids", ids), bt_entry("labels", labels)};
    e[0].shape[1] = e[1].shape[1] = 1;
    expect_bad_batch(write_entries("b-t1.safetensors", e, 2), "no valid target");
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * Options */

static const struct {
    const char *args, *want1, *want2;
} bad_opts[] = {
    {"--chunk 0", "--chunk", "\"0\""},
    {"--chunk -3", "--chunk", "\"-3\""},
    {"--chunk abc", "--chunk", "\"abc\""},
    {"--chunk ''", "--chunk", "\"\""},
    {"--chunk 4x", "--chunk", "\"4x\""},
    {"--chunk 99999999999", "--chunk", "\"99999999999\""},
    {"--block 0", "--block", "\"0\""},
    {"--logit-chunk 0", "--logit-chunk", "\"0\""},
    {"--threads 0", "--threads", "\"0\""},
    {"--schedule foo", "--schedule", "\"foo\""},
    {"--precision fp16", "--precision", "\"fp16\""},
    {"--frobnicate", "--frobnicate", NULL},
    {"--chunk", "'--chunk'", "argument"},
    {"stray.bin", "\"stray.bin\"", NULL},
};

START_TEST(option_rejected) {
    expect_grad(good_model(), good_batch(), bad_opts[_i].args, 2, bad_opts[_i].want1,
                bad_opts[_i].want2);
}
END_TEST

START_TEST(option_missing_model) {
    expect_grad(NULL, good_batch(), "", 2, "--model", "required");
}
END_TEST

START_TEST(option_missing_batch) {
    expect_grad(good_model(), NULL, "", 2, "--batch", "required");
}
END_TEST

START_TEST(option_help) {
    check_run(run_cli("grad --help"), 0, (const char *const[]){NULL});
    ck_assert_msg(strstr(last_stdout, "usage: streambp grad"), "%s", last_stdout);
    check_run(run_cli("init --help"), 0, (const char *const[]){NULL});
    ck_assert_msg(strstr(last_stdout, "usage: streambp init"), "%s", last_stdout);
}
END_TEST

/* bench --warmup: 0..15, else a usage error naming it. With one schedule and a warm-up, one
 * process times the steps and reports their memory: one CSV row of one timed run, its ledger
 * peak the planner's, its RSS above that, its fraction of sgemm over the sgemm rates timed
 * before and after that process, and of the vector FMA peak where the build has one. */
START_TEST(option_bench_warmup) {
    static const char *const bad[] = {"-1", "16", "x", "1x", ""};
    for (int i = 0; i < 5; i++)
        check_run(run_cli("bench --model '%s' --seq 16 --warmup '%s'", good_model(), bad[i]), 2,
                  (const char *const[]){"--warmup", "0..15", NULL});
    check_run(run_cli("bench --model '%s' --seq 16 --warmup 1 --reps 1 --schedules full "
                      "--numerics fast --no-train --csv",
                      good_model()),
              0,
              (const char *const[]){"1 warm-up and 1 timed round of 1 schedule, and its memory",
                                    "sgemm rate", " before, ", " after", NULL});
    char sched[16], num[16], peak[160];
    int T = 0, runs = 0;
    double pct = 0;
    long long ledger = 0, plan = 0, rss = 0;
    const char *row = strchr(last_stdout, '\n');
    /* pct_fma_peak: a number, or empty where the build has no vector fma */
    ck_assert_msg(row && sscanf(row + 1, "%d,%15[^,],%15[^,],%d,%*f,%*f,%*f,%lf,%159[^\n]", &T,
                                sched, num, &runs, &pct, peak) == 6,
                  "%s", last_stdout);
    const char *rest = peak;
    if (*rest != ',') {
        double of_peak = 0;
        ck_assert_msg(sscanf(rest, "%lf", &of_peak) == 1 && of_peak > 0, "%s", last_stdout);
        rest = strchr(rest, ',');
    }
    ck_assert_msg(rest && sscanf(rest, ",%*f,%lld,%lld,%lld", &ledger, &plan, &rss) == 3, "%s",
                  last_stdout);
    ck_assert_msg(isfinite(pct) && pct > 0, "%s", last_stdout);
    ck_assert_int_eq(T, 16);
    ck_assert_str_eq(sched, "full");
    ck_assert_int_eq(runs, 1);
    ck_assert_msg(ledger > 0 && ledger == plan && rss > ledger, "%s", last_stdout);
    ck_assert_msg(!strchr(strchr(row + 1, '\n') + 1, '\n'), "more than one row:\n%s", last_stdout);
}
END_TEST

/* A chunk beyond T is clamped to T, in the report and in the file's metadata. */
START_TEST(option_chunk_clamped) {
    const char *dir = fresh_dir();
    const char *out = tu_join(dir, "grad.safetensors");
    check_run(run_cli("grad --model '%s' --batch '%s' --chunk 100000 --logit-chunk 100000 --json "
                      "--out '%s'",
                      good_model(), good_batch(), out),
              0, (const char *const[]){NULL});
    cJSON *o = cJSON_Parse(last_stdout);
    ck_assert_msg(o != NULL, "not JSON:\n%s", last_stdout);
    ck_assert_int_eq(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "T")), ST);
    ck_assert_int_eq(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "chunk")), ST);
    ck_assert_int_eq(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "logit_chunk")), ST);
    cJSON_Delete(o);
    sbp_st_file sf;
    sbp_err err = {0};
    ck_assert_msg(sbp_st_open(&sf, out, &err) == SBP_OK, "%s", err.msg);
    ck_assert_str_eq(sbp_st_meta(&sf, "chunk"), "8");
    sbp_st_close(&sf);
    tu_assert_no_tmp(dir);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * Unwritable output: exit 2, naming the path, before the step runs. */

START_TEST(out_dir_missing) {
    const char *dir = fresh_dir();
    const char *out = tu_join(dir, "no-such-dir/grad.safetensors");
    check_run(run_cli("grad --model '%s' --batch '%s' --out '%s'", good_model(), good_batch(), out),
              2, (const char *const[]){out, NULL});
    ck_assert(!tu_exists(out));
    tu_assert_no_tmp(dir);
}
END_TEST

START_TEST(out_parent_is_a_file) {
    const char *dir = fresh_dir();
    const char *file = tu_join(dir, "plain");
    spit_text(file, "x");
    const char *out = tu_join(dir, "plain/grad.safetensors");
    check_run(run_cli("grad --model '%s' --batch '%s' --out '%s'", good_model(), good_batch(), out),
              2, (const char *const[]){out, NULL});
    tu_assert_no_tmp(dir);
}
END_TEST

START_TEST(out_is_a_directory) {
    const char *dir = fresh_dir();
    const char *out = tu_join(dir, "grad.safetensors");
    ck_assert_int_eq(mkdir(out, 0755), 0);
    check_run(run_cli("grad --model '%s' --batch '%s' --out '%s'", good_model(), good_batch(), out),
              2, (const char *const[]){out, NULL});
    struct stat sb;
    ck_assert(stat(out, &sb) == 0 && S_ISDIR(sb.st_mode));
    tu_assert_no_tmp(dir);
    tu_assert_no_tmp(out);
}
END_TEST

/* A batch without targets makes sbp_grad fail at its first check: if the output were only
 * checked when written, that message would come instead of the one about the output path. */
static void expect_out_checked_first(const char *out) {
    sft s = good_sft();
    for (int i = 0; i < SB * ST; i++) s.labels[i] = SBP_IGNORE;
    const char *batch = write_sft("b-none-out.safetensors", &s);
    check_run(run_cli("grad --model '%s' --batch '%s' --out '%s'", good_model(), batch, out), 2,
              (const char *const[]){out, NULL});
    ck_assert_msg(!strstr(tu_last_output(), "no valid target"),
                  "`%s`: the output was not checked before the step:\n%s", last_cmd,
                  tu_last_output());
}

START_TEST(out_dir_missing_checked_first) {
    const char *dir = fresh_dir();
    expect_out_checked_first(tu_join(dir, "no-such-dir/g.safetensors"));
    tu_assert_no_tmp(dir);
}
END_TEST

START_TEST(out_is_a_directory_checked_first) {
    const char *dir = fresh_dir();
    const char *out = tu_join(dir, "grad.safetensors");
    ck_assert_int_eq(mkdir(out, 0755), 0);
    expect_out_checked_first(out);
    tu_assert_no_tmp(dir);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * Non-finite results: exit 1, naming the loss or the first parameter, no output. */

/* Final norm weight 1e38: the logits overflow float, so the loss does too (1e30 still gives a
 * finite loss of about 2e30, which is correct, not an error). */
START_TEST(nonfinite_loss) {
    expect_grad(model_with_const("huge-norm", "model.norm.weight", 1e38f), good_batch(), "", 1,
                "not finite", "loss");
}
END_TEST

START_TEST(nonfinite_loss_full_schedule) {
    expect_grad(model_with_const("huge-norm", "model.norm.weight", 1e38f), good_batch(),
                "--schedule full --json", 1, "not finite", "loss");
}
END_TEST

/* Finite weights, finite loss, overflowing gradient: the embedding rows of the batch's tokens are
 * zero, so every activation is zero (logits too: the loss is ln V), and with rms_norm_eps 1e-30
 * each RMSNorm backward multiplies by 1/sqrt(eps) = 1e15, which overflows float by layer 0. */
START_TEST(nonfinite_gradient) {
    tu_tensors ts;
    tu_tensors_load(&ts, good_st());
    int e = tu_tensors_index(&ts, "model.embed_tokens.weight");
    int64_t C = ts.e[e].shape[1];
    sft s = good_sft();
    for (int i = 0; i < SB * ST; i++)
        memset((float *)ts.data[e] + s.ids[i] * C, 0, sizeof(float) * (size_t)C);
    const char *d = tensors_model("zero-rows", &ts);
    edit_config(tu_path("zero-rows/config.json"), "rms_norm_eps", cJSON_CreateNumber(1e-30));
    expect_grad(d, good_batch(), "", 1, "not finite", "gradient of \"model.embed_tokens.weight\"");
    /* the same check of a held gradient, after the step (the line above scans each piece as it
     * leaves for the file, and names the first element of the whole gradient all the same) */
    expect_grad(d, good_batch(), "--hold-grads", 1, "not finite",
                "gradient of \"model.embed_tokens.weight\"");
    /* 1e15 * 1e15 fits a double: the same model is fine in fp64. */
    expect_grad(d, good_batch(), "--precision fp64", 0, NULL);
    /* with rms_norm_eps 1e-300 each norm's backward multiplies by 1e150: three of them overflow a
     * double too (the scan of a float64 gradient is its own code path) */
    edit_config(tu_path("zero-rows/config.json"), "rms_norm_eps", cJSON_CreateNumber(1e-300));
    expect_grad(d, good_batch(), "--precision fp64", 1, "not finite",
                "gradient of \"model.embed_tokens.weight\"");
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * init */

START_TEST(init_missing_config) {
    const char *out = tu_path("init-noconfig");
    char args[800];
    snprintf(args, sizeof args, "--out '%s'", out);
    expect_init(args, 2, "--config");
    ck_assert(!tu_exists(out));
}
END_TEST

START_TEST(init_missing_out) {
    expect_init("--config data/models/qwen3-tiny.json", 2, "--out");
}
END_TEST

START_TEST(init_bad_config) {
    const char *cfg = tu_path("init-bad.json");
    const char *out = tu_path("init-bad-out");
    spit_text(cfg, "{\"model_type\": \"qwen3\",");
    char args[1600];
    snprintf(args, sizeof args, "--config '%s' --out '%s'", cfg, out);
    expect_init(args, 2, cfg);
    ck_assert_msg(!tu_exists(out), "init created %s from a bad config", out);
}
END_TEST

START_TEST(init_inconsistent_config) {
    const char *cfg = tu_path("init-heads.json");
    const char *out = tu_path("init-heads-out");
    copy_file("data/models/qwen3-tiny.json", cfg);
    edit_config(cfg, "num_key_value_heads", cJSON_CreateNumber(3));
    char args[1600];
    snprintf(args, sizeof args, "--config '%s' --out '%s'", cfg, out);
    expect_init(args, 2, "num_key_value_heads (3)");
    ck_assert_msg(!tu_exists(out), "init created %s from a bad config", out);
}
END_TEST

START_TEST(init_seed_negative) {
    const char *out = tu_path("init-seed");
    char args[800];
    snprintf(args, sizeof args, "--config data/models/qwen3-tiny.json --seed -1 --out '%s'", out);
    expect_init(args, 2, "--seed", "\"-1\"");
    ck_assert(!tu_exists(out));
}
END_TEST

START_TEST(init_seed_not_a_number) {
    const char *out = tu_path("init-seed-abc");
    char args[800];
    snprintf(args, sizeof args, "--config data/models/qwen3-tiny.json --seed 12abc --out '%s'",
             out);
    expect_init(args, 2, "--seed", "\"12abc\"");
    ck_assert(!tu_exists(out));
}
END_TEST

START_TEST(init_out_is_a_file) {
    const char *dir = fresh_dir();
    const char *out = tu_join(dir, "model");
    spit_text(out, "keep me\n");
    char args[800];
    snprintf(args, sizeof args, "--config data/models/qwen3-tiny.json --out '%s'", out);
    expect_init(args, 2, out);
    char *text = tu_slurp(out, NULL);
    ck_assert_str_eq(text, "keep me\n");
    free(text);
    tu_assert_no_tmp(dir);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * The same inputs through the C API: the status, and a message naming the problem. */

static void assert_err(sbp_status st, const sbp_err *err, sbp_status want, const char *what) {
    ck_assert_msg(st == want, "got %s (%s), expected %s", sbp_status_name(st), err->msg,
                  sbp_status_name(want));
    ck_assert_int_eq(err->status, st);
    ck_assert_msg(strstr(err->msg, what), "message does not mention \"%s\": %s", what, err->msg);
}

static void expect_model_load(const char *dir, sbp_status want, const char *what) {
    sbp_model m;
    sbp_err err = {0};
    sbp_status st = sbp_model_load(&m, dir, SBP_FP32, NULL, &err);
    assert_err(st, &err, want, what);
    sbp_model_free(&m, NULL); /* a failed load leaves nothing to free, and freeing is harmless */
}

START_TEST(api_model_load) {
    expect_model_load(tu_path("no-such-model"), SBP_EIO, "no-such-model");
    const char *d = copy_model("api-json");
    spit_text(tu_path("api-json/config.json"), "{\"model_type\":");
    expect_model_load(d, SBP_EFORMAT, "config.json");
    expect_model_load(model_with_field("api-heads", "num_key_value_heads", cJSON_CreateNumber(3)),
                      SBP_EINPUT, "num_key_value_heads");
    st_raw r = raw_load(good_st());
    cJSON_ReplaceItemInObjectCaseSensitive(raw_tensor(&r, "model.norm.weight"), "dtype",
                                           cJSON_CreateString("F33"));
    expect_model_load(model_dir_for_raw("api-dtype", &r, r.ndata), SBP_EFORMAT, "F33");
    r = raw_load(good_st());
    expect_model_load(model_dir_for_raw("api-trunc", &r, r.ndata / 3), SBP_EFORMAT,
                      "model.safetensors");
    tu_tensors ts;
    tu_tensors_load(&ts, good_st());
    ts.e[tu_tensors_index(&ts, "model.norm.weight")].shape[0] = 16;
    ts.e[tu_tensors_index(&ts, "model.norm.weight")].ndim = 2;
    ts.e[tu_tensors_index(&ts, "model.norm.weight")].shape[1] = 4;
    expect_model_load(tensors_model("api-shape", &ts), SBP_EINPUT, "model.norm.weight");
}
END_TEST

static void expect_batch_load(const char *path, sbp_status want, const char *what) {
    sbp_config cfg;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_config_load(&cfg, "data/models/qwen3-tiny.json", &err), SBP_OK);
    sbp_batch b;
    sbp_status st = sbp_batch_load(&b, path, &cfg, &err);
    assert_err(st, &err, want, what);
    sbp_batch_free(&b);
}

START_TEST(api_batch_load) {
    expect_batch_load(tu_path("no-such-batch.safetensors"), SBP_EIO, "no-such-batch");
    const char *txt = tu_path("api-batch.txt");
    spit_text(txt, "not a safetensors file at all");
    expect_batch_load(txt, SBP_EFORMAT, "api-batch.txt");
    sft s = good_sft();
    s.labels[3] = V;
    expect_batch_load(write_sft("api-label.safetensors", &s), SBP_EINPUT, "labels[0][3]");
    s = good_sft();
    sbp_st_entry e[] = {bt_entry("input_ids", s.ids), bt_entry("labels", s.labels)};
    e[0].dtype = SBP_DT_F64;
    expect_batch_load(write_entries("api-float.safetensors", e, 2), SBP_EINPUT, "input_ids");
}
END_TEST

START_TEST(api_grad) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, good_model(), good_batch(), SBP_FP32);
    sbp_grad_result r;
    sbp_err err = {0};
    sbp_grad_opts o = {.schedule = SBP_STREAM, .chunk = -1};
    assert_err(sbp_grad(&r, &m, &b, &o, NULL, &err), &err, SBP_EUSAGE, "-1");
    ck_assert_ptr_null(r.grads);

    /* A hand-made batch bypasses sbp_batch_load's checks; sbp_grad must still refuse it. */
    o.chunk = 0;
    sbp_batch empty = {.B = 1, .T = 0};
    assert_err(sbp_grad(&r, &m, &empty, &o, NULL, &err), &err, SBP_EINPUT, "T = 0");
    for (int i = 0; i < b.B * b.T; i++) b.labels[i] = SBP_IGNORE;
    b.n_targets = 0;
    assert_err(sbp_grad(&r, &m, &b, &o, NULL, &err), &err, SBP_EINPUT, "no valid target");
    ck_assert_ptr_null(r.grads);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);

    sbp_ledger lg = {0};
    tu_load(&m, &b, model_with_const("api-huge", "model.norm.weight", 1e38f), good_batch(),
            SBP_FP32);
    assert_err(sbp_grad(&r, &m, &b, &o, &lg, &err), &err, SBP_ENUMERIC, "loss");
    ck_assert_ptr_null(r.grads);
    ck_assert_int_eq(lg.cur_total, 0); /* the failed step gave back every buffer */
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * Suite */

static Suite *suite(void) {
    Suite *s = suite_create("badinput");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, control_good_model_and_batch);

    tcase_add_test(tc, model_dir_missing);
    tcase_add_test(tc, model_dir_is_a_file);
    tcase_add_test(tc, model_without_config);
    tcase_add_test(tc, model_config_unreadable);
    tcase_add_test(tc, model_without_weights);
    tcase_add_test(tc, config_missing_field);
    tcase_add_test(tc, config_field_wrong_type);
    tcase_add_test(tc, config_heads_not_dividing);
    tcase_add_test(tc, config_odd_head_dim);
    tcase_add_test(tc, config_head_dim_zero);
    tcase_add_test(tc, config_zero_layers);
    tcase_add_test(tc, config_unknown_model_type);
    tcase_add_test(tc, config_malformed_json);
    tcase_add_test(tc, config_not_an_object);
    tcase_add_test(tc, config_disagrees_with_weights);
    tcase_add_test(tc, config_huge_disagrees_with_weights);

    tcase_add_test(tc, weights_truncated);
    tcase_add_test(tc, weights_trailing_bytes);
    tcase_add_test(tc, weights_garbage);
    tcase_add_test(tc, weights_header_not_json);
    tcase_add_test(tc, weights_header_longer_than_file);
    tcase_add_test(tc, weights_empty_file);
    tcase_add_test(tc, weights_offsets_out_of_range);
    tcase_add_test(tc, weights_offsets_reversed);
    tcase_add_test(tc, weights_offsets_overlap);
    tcase_add_test(tc, weights_duplicate_name);
    tcase_add_test(tc, weights_unknown_dtype);
    tcase_add_test(tc, weights_integer_dtype);
    tcase_add_test(tc, weights_missing_index_shard);
    tcase_add_test(tc, weights_index_escapes_dir);
    tcase_add_test(tc, weights_missing_tensor);
    tcase_add_test(tc, weights_wrong_shape);
    tcase_add_test(tc, weights_nan);
    tcase_add_test(tc, weights_f64_overflows_fp32);

    tcase_add_test(tc, batch_missing);
    tcase_add_test(tc, batch_is_a_directory);
    tcase_add_test(tc, batch_not_safetensors);
    tcase_add_test(tc, batch_labels_shape);
    tcase_add_test(tc, batch_mask_shape);
    tcase_add_test(tc, batch_labels_missing);
    tcase_add_test(tc, batch_input_ids_missing);
    tcase_add_test(tc, batch_token_too_large);
    tcase_add_test(tc, batch_token_negative);
    tcase_add_test(tc, batch_token_beyond_int32);
    tcase_add_test(tc, batch_label_minus_one);
    tcase_add_test(tc, batch_label_vocab);
    tcase_add_test(tc, batch_mask_two);
    tcase_add_test(tc, batch_one_dimensional);
    tcase_add_test(tc, batch_float_ids);
    tcase_add_test(tc, batch_t_zero);
    tcase_add_test(tc, batch_b_zero);
    tcase_add_test(tc, batch_shape_overflow);
    tcase_add_test(tc, batch_no_target_all_ignored);
    tcase_add_test(tc, batch_no_target_only_first);
    tcase_add_test(tc, batch_no_target_single_token);

    tcase_add_loop_test(tc, option_rejected, 0, (int)(sizeof bad_opts / sizeof bad_opts[0]));
    tcase_add_test(tc, option_missing_model);
    tcase_add_test(tc, option_missing_batch);
    tcase_add_test(tc, option_help);
    tcase_add_test(tc, option_bench_warmup);
    tcase_add_test(tc, option_chunk_clamped);

    tcase_add_test(tc, out_dir_missing);
    tcase_add_test(tc, out_parent_is_a_file);
    tcase_add_test(tc, out_is_a_directory);
    tcase_add_test(tc, out_dir_missing_checked_first);
    tcase_add_test(tc, out_is_a_directory_checked_first);

    tcase_add_test(tc, nonfinite_loss);
    tcase_add_test(tc, nonfinite_loss_full_schedule);
    tcase_add_test(tc, nonfinite_gradient);

    tcase_add_test(tc, init_missing_config);
    tcase_add_test(tc, init_missing_out);
    tcase_add_test(tc, init_bad_config);
    tcase_add_test(tc, init_inconsistent_config);
    tcase_add_test(tc, init_seed_negative);
    tcase_add_test(tc, init_seed_not_a_number);
    tcase_add_test(tc, init_out_is_a_file);
    suite_add_tcase(s, tc);

    TCase *api = tcase_create("api");
    tcase_set_timeout(api, 60);
    tcase_add_test(api, api_model_load);
    tcase_add_test(api, api_batch_load);
    tcase_add_test(api, api_grad);
    suite_add_tcase(s, api);
    return s;
}

int main(void) {
    return tu_run_suite_with_model(suite(), MODEL, "test_badinput");
}
