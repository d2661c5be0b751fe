/* test_audit.c — `verify audit` for every objective, and the diagnosis of failures.
 *
 *  1. objectives: gradient files written by our own engine (`grad`, float64 and float32) for
 *     DPO (sigmoid, ipo, a reference model) and GRPO (all four loss types, a KL term against a
 *     reference model) pass `audit --objective ...` with the same options; files with a planted
 *     objective bug fail on the tensors it touches: DPO with beta applied twice (beta 0.01 audited
 *     as 0.1) and the pair loss averaged per row instead of per pair (a factor 1/2); GRPO bnpo
 *     normalised by every real token instead of the completion tokens, and dapo audited as grpo;
 *  2. diagnosis: each kind of error, planted in a correct file, gets its words: one scale factor
 *     written as a fraction (19/21), several factors, float32-level error in a float64 file
 *     (rounded through float32, or with float32-sized noise), bfloat16-level error in a float32
 *     file, one layer, the bottom layers and the embedding, the K/V projections only, NaN in
 *     backward order, wrapped names, a tied model's separate head, their metadata; in `audit`,
 *     in `audit --json` and in `diff`;
 *  3. the helpers: continued fractions and HF name classification. */
#include "../src/io/safetensors.h"
#include "../verify/diagnose.h"
#include "testutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SFT_BATCH "data/batches/suite-chunk-starts-on-ignored.safetensors"
#define DPO_TINY  "data/batches/dpo-tiny.safetensors"
#define DPO_NOREF "data/batches/dpo-noref.safetensors"
#define GRPO_TINY "data/batches/grpo-tiny.safetensors"
#define GRPO_ADV  "data/batches/grpo-adv.safetensors"

/* printf into one of a ring of buffers (option strings, expected words) */
static const char *str(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *str(const char *fmt, ...) {
    static char ring[8][1024];
    static int next;
    char *buf = ring[next++ % 8];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof ring[0], fmt, ap);
    va_end(ap);
    return buf;
}

/* the end of the last command's output (Check's messages are limited in length) */
static const char *tail(void) {
    const char *out = tu_last_output();
    size_t n = strlen(out);
    return n > 3000 ? out + n - 3000 : out;
}

static const char *model(void) {
    return tu_model("qwen3-tiny", 1);
}
static const char *ref_model(void) {
    return tu_model("qwen3-tiny", 2);
}

/* `streambp grad` with extra options into a file under the scratch directory; returns its path. */
static const char *grad(const char *batch, const char *opts, const char *name) {
    const char *out = tu_path("%s.safetensors", name);
    int rc = tu_sh("%s grad --model %s --batch %s --block 4 --chunk 8 %s --out %s", tu_bin(),
                   model(), batch, opts, out);
    ck_assert_msg(rc == 0, "grad %s failed:\n%s", opts, tail());
    return out;
}

/* `streambp verify audit`; returns the exit status (output in tu_last_output()). */
static int audit(const char *batch, const char *grads, const char *opts) {
    return tu_sh("%s verify audit --model %s --batch %s --grads %s %s", tu_bin(), model(), batch,
                 grads, opts);
}

static void expect(const char *what) {
    ck_assert_msg(strstr(tu_last_output(), what) != NULL, "expected \"%s\" in:\n%s", what, tail());
}

static void expect_not(const char *what) {
    ck_assert_msg(strstr(tu_last_output(), what) == NULL, "did not expect \"%s\" in:\n%s", what,
                  tail());
}

/* The verdict on the row of `name` in the audit's table. */
static int row_fails(const char *name) {
    const char *out = tu_last_output(), *row = out;
    size_t len = strlen(name);
    while ((row = strstr(row, name)) && row[len] != ' ') row += len;
    ck_assert_msg(row != NULL, "no row for %s in:\n%s", name, out);
    const char *nl = strchr(row, '\n');
    const char *bad = strstr(row, "OVER BUDGET");
    return bad && (!nl || bad < nl);
}

/* Every tensor of the model fails (want 1) or passes (want 0) exactly when pred says. */
static void expect_rows(int (*pred)(const sbp_param *p)) {
    sbp_model m;
    tu_load(&m, NULL, model(), NULL, SBP_FP64);
    for (int i = 0; i < m.params.n; i++)
        ck_assert_msg(row_fails(m.params.p[i].name) == pred(&m.params.p[i]), "%s %s:\n%s",
                      m.params.p[i].name, row_fails(m.params.p[i].name) ? "fails" : "passes",
                      tail());
    sbp_model_free(&m, NULL);
}

static int every(const sbp_param *p) {
    (void)p;
    return 1;
}

/* ---------------------------------------------------------------------------------------------
 * Files with planted errors: a correct gradient file, each tensor edited as doubles */

typedef void (*edit_fn)(const char *name, double *x, int64_t n, void *ctx);

typedef struct {
    sbp_dtype dtype;        /* of the copy: F64 or F32 */
    const char *prefix;     /* prepended to every name, or NULL */
    const char *extra_name; /* a copy of the embedding under this name too, or NULL */
    double loss_factor;     /* keep the "loss" metadata times this factor (0: no metadata) */
} copy_opts;

static void transform(const char *src, const char *dst, edit_fn edit, void *ctx, copy_opts o) {
    sbp_st_file sf;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_st_open(&sf, src, &err), SBP_OK);
    sbp_st_entry *e = calloc((size_t)sf.n + 1, sizeof *e);
    void **data = calloc((size_t)sf.n + 1, sizeof *data);
    char **names = calloc((size_t)sf.n + 1, sizeof *names);
    int n = 0;
    for (int i = 0; i < sf.n; i++) {
        const sbp_st_tensor *t = &sf.t[i];
        double *x = malloc(sizeof(double) * (size_t)t->numel);
        ck_assert_int_eq(sbp_st_read(&sf, t, x, SBP_DT_F64, &err), SBP_OK);
        if (edit) edit(t->name, x, t->numel, ctx);
        if (o.dtype == SBP_DT_F32) {
            float *f = malloc(sizeof(float) * (size_t)t->numel);
            for (int64_t k = 0; k < t->numel; k++) f[k] = (float)x[k];
            free(x);
            data[i] = f;
        } else {
            data[i] = x;
        }
        names[i] = malloc(strlen(t->name) + 64);
        sprintf(names[i], "%s%s", o.prefix ? o.prefix : "", t->name);
        e[n] = (sbp_st_entry){.name = names[i], .dtype = o.dtype, .ndim = t->ndim, .data = data[i]};
        memcpy(e[n].shape, t->shape, sizeof t->shape);
        n++;
        if (o.extra_name && strcmp(t->name, "model.embed_tokens.weight") == 0) {
            e[n] = e[n - 1];
            e[n++].name = o.extra_name;
        }
    }
    char loss[64];
    const char *meta[] = {"loss", loss, NULL};
    const char *src_loss = sbp_st_meta(&sf, "loss");
    if (o.loss_factor != 0) {
        ck_assert_ptr_nonnull(src_loss);
        snprintf(loss, sizeof loss, "%.17g", strtod(src_loss, NULL) * o.loss_factor);
    }
    ck_assert_int_eq(sbp_st_write(dst, e, n, o.loss_factor != 0 ? meta : NULL, &err), SBP_OK);
    for (int i = 0; i < sf.n; i++) free(data[i]), free(names[i]);
    free(data), free(names), free(e);
    sbp_st_close(&sf);
}

static void scale_all(const char *name, double *x, int64_t n, void *ctx) {
    for (int64_t i = 0; i < n; i++) x[i] *= *(const double *)ctx;
}

static void through_float(const char *name, double *x, int64_t n, void *ctx) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)x[i];
}

static void through_bf16(const char *name, double *x, int64_t n, void *ctx) {
    for (int64_t i = 0; i < n; i++) x[i] = sbp_bf16_to_f32(sbp_f32_to_bf16((float)x[i]));
}

/* x·(1 + size·u), u uniform in [−1, 1] from a fixed generator, on the tensors `which` accepts */
typedef struct {
    double size;
    int (*which)(const char *name);
    uint64_t state;
} noise_ctx;

static void noise(const char *name, double *x, int64_t n, void *ctx) {
    noise_ctx *c = ctx;
    if (c->which && !c->which(name)) return;
    for (int64_t i = 0; i < n; i++) {
        c->state = c->state * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(c->state >> 11) / 9007199254740992.0 * 2 - 1;
        x[i] *= 1 + c->size * u;
    }
}

/* the first half of every tensor times 0.9, the second times 0.85 */
static void two_factors(const char *name, double *x, int64_t n, void *ctx) {
    for (int64_t i = 0; i < n; i++) x[i] *= i < n / 2 ? 0.9 : 0.85;
}

static int not_final_norm(const char *name) {
    return strcmp(name, "model.norm.weight") != 0;
}

static int in_layer1(const char *name) {
    return strncmp(name, "model.layers.1.", 15) == 0;
}
static int kv_proj(const char *name) {
    return strstr(name, "k_proj") || strstr(name, "v_proj");
}
static int layer0_or_embedding(const char *name) {
    return strncmp(name, "model.layers.0.", 15) == 0 || strstr(name, "embed_tokens");
}

static void nan_two(const char *name, double *x, int64_t n, void *ctx) {
    if (strcmp(name, "model.layers.0.self_attn.q_proj.weight") == 0 ||
        strcmp(name, "model.layers.1.mlp.down_proj.weight") == 0)
        x[n / 3] = NAN;
}

static void per_layer_scale(const char *name, double *x, int64_t n, void *ctx) {
    double k = strncmp(name, "model.layers.0.", 15) == 0   ? 0.5
               : strncmp(name, "model.layers.1.", 15) == 0 ? 2
                                                           : 1;
    for (int64_t i = 0; i < n; i++) x[i] *= k;
}

/* correct SFT gradient files of qwen3-tiny, float64 and float32 */
static const char *sft64(void) {
    static const char *p;
    if (!p || !tu_exists(p)) p = grad(SFT_BATCH, "--precision fp64", "sft64");
    return p;
}
static const char *sft32(void) {
    static const char *p;
    if (!p || !tu_exists(p)) p = grad(SFT_BATCH, "", "sft32");
    return p;
}

/* ---------------------------------------------------------------------------------------------
 * 1. Objectives */

START_TEST(dpo_correct_files_pass) {
    static const char *cases[][2] = {
        {"--objective dpo", DPO_TINY},
        {"--objective dpo --loss-type ipo --beta 0.5", DPO_TINY},
        {"--objective dpo --label-smoothing 0.1", DPO_TINY},
    };
    for (int i = 0; i < 3; i++) {
        const char *g64 = grad(cases[i][1], str("%s --precision fp64", cases[i][0]), "dpo64");
        int rc = audit(cases[i][1], g64, str("%s --precision-of-theirs fp64", cases[i][0]));
        ck_assert_msg(rc == 0, "%s, fp64: exit %d\n%s", cases[i][0], rc, tail());
        expect("objective: dpo");
        const char *g32 = grad(cases[i][1], cases[i][0], "dpo32");
        rc = audit(cases[i][1], g32, cases[i][0]);
        ck_assert_msg(rc == 0, "%s, fp32: exit %d\n%s", cases[i][0], rc, tail());
    }
    /* reference log-probs from a reference model, at each precision */
    const char *opts = str("--objective dpo --ref-model %s", ref_model());
    const char *g64 = grad(DPO_NOREF, str("%s --precision fp64", opts), "dpo-ref64");
    int rc = audit(DPO_NOREF, g64, str("%s --precision-of-theirs fp64", opts));
    ck_assert_msg(rc == 0, "--ref-model, fp64: exit %d\n%s", rc, tail());
    expect("reference model");
    const char *g32 = grad(DPO_NOREF, opts, "dpo-ref32");
    rc = audit(DPO_NOREF, g32, opts);
    ck_assert_msg(rc == 0, "--ref-model, fp32: exit %d\n%s", rc, tail());
}
END_TEST

START_TEST(grpo_correct_files_pass) {
    static const char *types[] = {"grpo", "bnpo", "dr_grpo", "dapo"};
    for (int i = 0; i < 4; i++) {
        const char *opts = str("--objective grpo --loss-type %s", types[i]);
        const char *g64 = grad(GRPO_TINY, str("%s --precision fp64", opts), "grpo64");
        int rc = audit(GRPO_TINY, g64, str("%s --precision-of-theirs fp64", opts));
        ck_assert_msg(rc == 0, "%s, fp64: exit %d\n%s", types[i], rc, tail());
        const char *g32 = grad(GRPO_TINY, opts, "grpo32");
        rc = audit(GRPO_TINY, g32, opts);
        ck_assert_msg(rc == 0, "%s, fp32: exit %d\n%s", types[i], rc, tail());
    }
    /* a KL term against a reference model, temperature and clipping options */
    const char *opts = str("--objective grpo --beta 0.04 --temperature 0.7 --epsilon-high 0.28 "
                           "--ref-model %s",
                           ref_model());
    const char *g64 = grad(GRPO_ADV, str("%s --precision fp64", opts), "grpo-kl64");
    int rc = audit(GRPO_ADV, g64, str("%s --precision-of-theirs fp64", opts));
    ck_assert_msg(rc == 0, "KL, fp64: exit %d\n%s", rc, tail());
    const char *g32 = grad(GRPO_ADV, opts, "grpo-kl32");
    rc = audit(GRPO_ADV, g32, opts);
    ck_assert_msg(rc == 0, "KL, fp32: exit %d\n%s", rc, tail());
}
END_TEST

START_TEST(dpo_planted_bugs_fail) {
    /* beta applied twice: the run used beta² = 0.01 where the configuration says 0.1 */
    const char *twice = grad(DPO_TINY, "--objective dpo --beta 0.01", "dpo-beta-twice");
    int rc = audit(DPO_TINY, twice, "--objective dpo --beta 0.1");
    ck_assert_msg(rc == 1, "beta twice passed:\n%s", tail());
    expect_rows(every); /* the per-pair factor reaches every parameter */
    expect("their file's metadata says beta 0.01; the audit used beta 0.1");
    /* the pair loss averaged over the 2B rows instead of the B pairs: everything times 1/2 */
    const char *good = grad(DPO_TINY, "--objective dpo", "dpo-good");
    const char *bad = tu_path("dpo-per-row.safetensors");
    double half = 0.5;
    transform(good, bad, scale_all, &half, (copy_opts){.dtype = SBP_DT_F32});
    rc = audit(DPO_TINY, bad, "--objective dpo");
    ck_assert_msg(rc == 1, "per-row average passed:\n%s", tail());
    expect_rows(every);
    expect("all 24 failing tensors are the truth times one factor, 1/2 = 0.5 ");
    expect("wrong normaliser");
}
END_TEST

START_TEST(grpo_planted_bugs_fail) {
    /* bnpo divided by every real token (attention_mask.sum()) instead of the completion tokens */
    sbp_model m;
    sbp_batch b;
    sbp_err err = {0};
    tu_load(&m, NULL, model(), NULL, SBP_FP64);
    ck_assert_int_eq(sbp_batch_load_as(&b, GRPO_TINY, &m.cfg, SBP_OBJ_GRPO, 1, &err), SBP_OK);
    int64_t real = 0;
    for (int64_t i = 0; i < (int64_t)b.B * b.T; i++) real += b.mask ? b.mask[i] : 1;
    double k = (double)b.n_targets / (double)real;
    ck_assert_double_lt(k, 1);
    const char *good = grad(GRPO_TINY, "--objective grpo --loss-type bnpo", "grpo-bnpo");
    const char *bad = tu_path("grpo-bnpo-all-tokens.safetensors");
    transform(good, bad, scale_all, &k, (copy_opts){.dtype = SBP_DT_F32});
    int rc = audit(GRPO_TINY, bad, "--objective grpo --loss-type bnpo");
    ck_assert_msg(rc == 1, "bnpo over all tokens passed:\n%s", tail());
    expect_rows(every);
    long p, q;
    char words[96];
    if (sbp_diag_fraction(k, 64, 1e-9, &p, &q))
        snprintf(words, sizeof words, "one factor, %ld/%ld = %.7g", p, q, (double)p / q);
    else
        snprintf(words, sizeof words, "one factor, %.7g", k);
    expect(words);
    /* dapo (one normaliser for the step) where the configuration says grpo (per row) */
    const char *dapo = grad(GRPO_TINY, "--objective grpo --loss-type dapo", "grpo-dapo");
    rc = audit(GRPO_TINY, dapo, "--objective grpo --loss-type grpo");
    ck_assert_msg(rc == 1, "dapo audited as grpo passed:\n%s", tail());
    expect_rows(every);
    expect("their file's metadata says loss_type dapo; the audit used loss_type grpo");
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

START_TEST(objective_usage_errors) {
    int rc = audit(SFT_BATCH, sft32(), "--objective ppo");
    ck_assert_int_eq(rc, 2);
    expect("--objective must be sft, dpo or grpo");
    rc = audit(SFT_BATCH, sft32(), "--loss-type ipo");
    ck_assert_int_eq(rc, 2);
    rc = audit(SFT_BATCH, sft32(), str("--ref-model %s", ref_model()));
    ck_assert_int_eq(rc, 2);
    expect("--ref-model applies to dpo and grpo");
    rc = audit(SFT_BATCH, sft32(), "--objective dpo"); /* an SFT batch is no DPO batch */
    ck_assert_int_eq(rc, 2);
    expect("chosen_input_ids");
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 2. Diagnosis */

START_TEST(diagnosis_one_factor) {
    const char *bad = tu_path("scaled-19-21.safetensors");
    double k = 19.0 / 21.0;
    transform(sft32(), bad, scale_all, &k, (copy_opts){.dtype = SBP_DT_F32, .loss_factor = k});
    ck_assert_int_eq(audit(SFT_BATCH, bad, ""), 1);
    expect("diagnosis:");
    expect("all 24 failing tensors are the truth times one factor, 19/21 = 0.9047619 ");
    expect("their loss is off by the same factor");
    expect_not("float32-level");
    /* the loss right, the gradients scaled */
    transform(sft32(), bad, scale_all, &k, (copy_opts){.dtype = SBP_DT_F32, .loss_factor = 1});
    ck_assert_int_eq(audit(SFT_BATCH, bad, ""), 1);
    expect("their loss equals the truth's, so the forward pass is right and the backward is not");
    /* the same in JSON */
    ck_assert_int_eq(audit(SFT_BATCH, bad, "--json"), 1);
    expect("\"rule\":\t\"scale\"");
    expect("19/21 = 0.9047619");
    expect("\"rel_l2_rescaled\"");
    /* and in diff, against our own file */
    int rc = tu_sh("%s verify diff %s %s", tu_bin(), bad, sft32());
    ck_assert_int_eq(rc, 1);
    expect("19/21");
    /* the sign flipped */
    double minus = -1;
    transform(sft32(), bad, scale_all, &minus, (copy_opts){.dtype = SBP_DT_F32});
    ck_assert_int_eq(audit(SFT_BATCH, bad, ""), 1);
    expect("one factor, -1 ");
    expect("the sign is flipped");
}
END_TEST

START_TEST(diagnosis_several_factors) {
    const char *bad = tu_path("per-layer-scale.safetensors");
    transform(sft32(), bad, per_layer_scale, NULL, (copy_opts){.dtype = SBP_DT_F32});
    ck_assert_int_eq(audit(SFT_BATCH, bad, ""), 1);
    expect("are the truth times a factor, but not one factor: 1/2 = 0.5 (");
    expect("2 (");
}
END_TEST

START_TEST(diagnosis_mostly_a_factor_and_top) {
    const char *bad = tu_path("two-factors.safetensors");
    transform(sft32(), bad, two_factors, NULL, (copy_opts){.dtype = SBP_DT_F32});
    ck_assert_int_eq(audit(SFT_BATCH, bad, ""), 1);
    expect("24 failing tensors are mostly a scale error: after the best factor (0.8");
    expect("parts of the gradient weighted by different factors");
    expect_not("no single factor explains it");
    /* errors everywhere, no factor: the top of the backward */
    noise_ctx c = {.size = 0.5, .state = 11}; /* beyond bf16 level */
    transform(sft32(), bad, noise, &c, (copy_opts){.dtype = SBP_DT_F32, .loss_factor = 1.01});
    ck_assert_int_eq(audit(SFT_BATCH, bad, ""), 1);
    expect("every layer, the embedding and the head fail and no single factor explains it: an "
           "error at the top of the backward");
    expect("their loss is 1.01 times the truth's");
    expect_not("scale error");
    /* everything but the final norm (the head of a tied model is the embedding) */
    noise_ctx c2 = {.size = 1e-2, .which = not_final_norm, .state = 13};
    transform(sft32(), bad, noise, &c2, (copy_opts){.dtype = SBP_DT_F32});
    ck_assert_int_eq(audit(SFT_BATCH, bad, ""), 1);
    expect("every layer and the embedding fail, the final norm and the head pass: the error "
           "enters the backward below the head");
}
END_TEST

START_TEST(diagnosis_float32_level) {
    /* a float64 file whose values went through float32 */
    const char *bad = tu_path("through-float.safetensors");
    transform(sft64(), bad, through_float, NULL, (copy_opts){.dtype = SBP_DT_F64});
    ck_assert_int_eq(audit(SFT_BATCH, bad, "--precision-of-theirs fp64"), 1);
    expect("your fp64 gradients have float32-level error");
    expect("within our float32 budget");
    expect("RoPE angles");
    expect("exactly a float32 number");
    expect_not("truth times one factor");
    /* float32-sized noise, values not float32 numbers */
    noise_ctx c = {.size = 3e-7, .state = 7};
    const char *noisy = tu_path("noisy64.safetensors");
    transform(sft64(), noisy, noise, &c, (copy_opts){.dtype = SBP_DT_F64});
    ck_assert_int_eq(audit(SFT_BATCH, noisy, "--precision-of-theirs fp64"), 1);
    expect("float32-level error");
    expect_not("exactly a float32 number");
    /* diff judges an F64 file against an F64 one at float64 */
    ck_assert_int_eq(tu_sh("%s verify diff --rel-l2 1e-12 %s %s", tu_bin(), bad, sft64()), 1);
    expect("float32-level error");
}
END_TEST

START_TEST(diagnosis_bf16_level) {
    const char *bad = tu_path("through-bf16.safetensors");
    transform(sft32(), bad, through_bf16, NULL, (copy_opts){.dtype = SBP_DT_F32});
    ck_assert_int_eq(audit(SFT_BATCH, bad, ""), 1);
    expect("your fp32 gradients went through bfloat16");
    expect("within our bfloat16 budget");
    expect("exactly a bfloat16 number");
    /* the same file passes as bf16 */
    ck_assert_int_eq(audit(SFT_BATCH, bad, "--precision-of-theirs bf16"), 0);
    expect_not("diagnosis:");
}
END_TEST

START_TEST(diagnosis_one_layer) {
    noise_ctx c = {.size = 1e-2, .which = in_layer1, .state = 3};
    const char *bad = tu_path("layer1.safetensors");
    transform(sft32(), bad, noise, &c, (copy_opts){.dtype = SBP_DT_F32});
    ck_assert_int_eq(audit(SFT_BATCH, bad, ""), 1);
    expect("only layer 1 fails (11 tensors); every other part passes: the embedding passes");
    expect_not("only k_proj");
    expect_not("scale error");
}
END_TEST

START_TEST(diagnosis_bottom_layers) {
    noise_ctx c = {.size = 1e-2, .which = layer0_or_embedding, .state = 5};
    const char *bad = tu_path("bottom.safetensors");
    transform(sft32(), bad, noise, &c, (copy_opts){.dtype = SBP_DT_F32});
    ck_assert_int_eq(audit(SFT_BATCH, bad, ""), 1);
    expect("layer 0 and the embedding fail, every layer above passes: the error enters the "
           "backward at layer 0");
}
END_TEST

START_TEST(diagnosis_kv_only) {
    noise_ctx c = {.size = 1e-3, .which = kv_proj, .state = 9};
    const char *bad = tu_path("kv.safetensors");
    transform(sft32(), bad, noise, &c, (copy_opts){.dtype = SBP_DT_F32});
    ck_assert_int_eq(audit(SFT_BATCH, bad, ""), 1);
    expect("only k_proj and v_proj fail in every layer");
    expect("the K/V path");
    expect_not("only layer");
    /* diff sees the same, classifying the names itself */
    ck_assert_int_eq(tu_sh("%s verify diff %s %s", tu_bin(), bad, sft32()), 1);
    expect("only k_proj and v_proj fail in every layer");
}
END_TEST

START_TEST(diagnosis_nonfinite_and_names) {
    const char *bad = tu_path("nan.safetensors");
    transform(sft32(), bad, nan_two, NULL, (copy_opts){.dtype = SBP_DT_F32});
    ck_assert_int_eq(audit(SFT_BATCH, bad, ""), 1);
    expect("NaN/Inf in 2 tensors; the first in backward order (head first, embedding last) is "
           "model.layers.1.mlp.down_proj.weight");
    /* names behind DDP's wrapper */
    const char *wrapped = tu_path("wrapped.safetensors");
    transform(sft32(), wrapped, NULL, NULL, (copy_opts){.dtype = SBP_DT_F32, .prefix = "module."});
    ck_assert_int_eq(audit(SFT_BATCH, wrapped, ""), 1);
    expect("24 of the 24 missing tensors are in the file under the prefix \"module.\"");
    /* a tied model's head written separately */
    const char *head = tu_path("head.safetensors");
    transform(sft32(), head, NULL, NULL,
              (copy_opts){.dtype = SBP_DT_F32, .extra_name = "lm_head.weight"});
    ck_assert_int_eq(audit(SFT_BATCH, head, ""), 0);      /* extra tensors are ignored... */
    expect("ties the head to model.embed_tokens.weight"); /* ...but said */
}
END_TEST

/* The StreamBP authors' per-chunk count in one layer (as tests/test_verify.c plants it, with one
 * logits chunk over the whole sequence: one factor for that layer) */
START_TEST(diagnosis_authors_count_in_one_layer) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, model(), SFT_BATCH, SBP_FP32);
    /* one chunk [0, T): the authors weight it by #(labels != -100) − B, against the true count */
    int64_t code = -b.B;
    for (int64_t i = 0; i < (int64_t)b.B * b.T; i++) code += b.labels[i] != SBP_IGNORE;
    double f = (double)code / (double)b.n_targets;
    ck_assert_double_ne(f, 1);
    sbp_grad_result good;
    sbp_grad_opts o = {.schedule = SBP_FULL, .block = 4};
    sbp_err err = {0};
    ck_assert_int_eq(sbp_grad(&good, &m, &b, &o, NULL, &err), SBP_OK);
    for (int i = 0; i < m.params.n; i++)
        if (m.params.p[i].layer == 1)
            for (int64_t k = 0; k < m.params.p[i].numel; k++)
                ((float *)good.grads)[m.params.p[i].offset + k] *= (float)f;
    const char *bad = tu_path("authors.safetensors");
    ck_assert_int_eq(sbp_grads_save(bad, &m.params, SBP_FP32, good.grads, NULL, &err), SBP_OK);
    ck_assert_int_eq(audit(SFT_BATCH, bad, ""), 1);
    long p, q;
    ck_assert(sbp_diag_fraction(f, 64, 1e-9, &p, &q));
    expect(
        str("failing tensors are the truth times one factor, %ld/%ld = %.7g", p, q, (double)p / q));
    expect("only layer 1 fails (11 tensors)");
    sbp_grad_result_free(&good, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 3. Helpers */

START_TEST(fractions) {
    long p, q;
    ck_assert(sbp_diag_fraction(19.0 / 21.0, 64, 1e-9, &p, &q));
    ck_assert(p == 19 && q == 21);
    ck_assert(sbp_diag_fraction(-0.5, 64, 1e-9, &p, &q));
    ck_assert(p == -1 && q == 2);
    ck_assert(sbp_diag_fraction(2, 64, 1e-9, &p, &q));
    ck_assert(p == 2 && q == 1);
    ck_assert(sbp_diag_fraction(63.0 / 64.0, 64, 1e-9, &p, &q));
    ck_assert(p == 63 && q == 64);
    ck_assert(!sbp_diag_fraction(M_PI, 64, 1e-6, &p, &q)); /* 22/7 is 4e-4 away */
    ck_assert(!sbp_diag_fraction(0.9047619 + 1e-4, 64, 1e-6, &p, &q));
    ck_assert(!sbp_diag_fraction(0, 64, 1e-6, &p, &q));
    ck_assert(!sbp_diag_fraction(NAN, 64, 1e-6, &p, &q));
}
END_TEST

START_TEST(classify_names) {
    int k, l;
    sbp_diag_classify("model.layers.12.self_attn.k_proj.bias", &k, &l);
    ck_assert(k == SBP_P_KB && l == 12);
    sbp_diag_classify("model.layers.0.post_attention_layernorm.weight", &k, &l);
    ck_assert(k == SBP_P_POST_NORM && l == 0);
    sbp_diag_classify("lm_head.weight", &k, &l);
    ck_assert(k == SBP_P_LM_HEAD && l == -1);
    sbp_diag_classify("module.model.norm.weight", &k, &l);
    ck_assert(k == -1 && l == -1);
    sbp_diag_classify("model.layers.3.mlp.fc1.weight", &k, &l);
    ck_assert(k == -1 && l == -1);
}
END_TEST

/* Rows built by hand: a scale error within a float64 budget is told apart from float32 noise
 * (the residual after the factor, not 1 − cosine, which cannot resolve below ~1e-8). */
START_TEST(fp64_scale_resolution) {
    sbp_diag_row r[2] = {
        {.name = "model.layers.0.mlp.up_proj.weight",
         .kind = SBP_P_UP,
         .layer = 0,
         .judged = 1,
         .failed = 1,
         .budget = 1e-13},
        {.name = "model.layers.0.mlp.down_proj.weight",
         .kind = SBP_P_DOWN,
         .layer = 0,
         .judged = 1,
         .failed = 1,
         .budget = 1e-13},
    };
    for (int i = 0; i < 2; i++)
        r[i].cmp = (sbp_tensor_cmp){.rel_l2 = 1e-9,
                                    .cosine = 1,
                                    .norm_ratio = 1 + 1e-9,
                                    .scale = 1 + 1e-9,
                                    .rel_l2_rescaled = 1e-15};
    sbp_diagnosis d;
    sbp_diag_input in = {.claimed = SBP_DIAG_FP64, .tied = -1};
    sbp_diagnose(&d, r, 2, &in);
    ck_assert_int_ge(d.n, 1);
    ck_assert_str_eq(d.rule[0], "scale");
    ck_assert_ptr_nonnull(strstr(d.text[0], "one factor, 1.000000001"));
    for (int i = 0; i < 2; i++) r[i].cmp.rel_l2_rescaled = 1e-9; /* not a factor */
    sbp_diagnose(&d, r, 2, &in);
    ck_assert_int_ge(d.n, 1);
    ck_assert_str_eq(d.rule[0], "precision");
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("audit");
    TCase *tc = tcase_create("objectives");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, dpo_correct_files_pass);
    tcase_add_test(tc, grpo_correct_files_pass);
    tcase_add_test(tc, dpo_planted_bugs_fail);
    tcase_add_test(tc, grpo_planted_bugs_fail);
    tcase_add_test(tc, objective_usage_errors);
    suite_add_tcase(s, tc);
    TCase *dc = tcase_create("diagnosis");
    tcase_set_timeout(dc, 120);
    tcase_add_test(dc, diagnosis_one_factor);
    tcase_add_test(dc, diagnosis_several_factors);
    tcase_add_test(dc, diagnosis_mostly_a_factor_and_top);
    tcase_add_test(dc, diagnosis_float32_level);
    tcase_add_test(dc, diagnosis_bf16_level);
    tcase_add_test(dc, diagnosis_one_layer);
    tcase_add_test(dc, diagnosis_bottom_layers);
    tcase_add_test(dc, diagnosis_kv_only);
    tcase_add_test(dc, diagnosis_nonfinite_and_names);
    tcase_add_test(dc, diagnosis_authors_count_in_one_layer);
    suite_add_tcase(s, dc);
    TCase *hc = tcase_create("helpers");
    tcase_add_test(hc, fractions);
    tcase_add_test(hc, classify_names);
    tcase_add_test(hc, fp64_scale_resolution);
    suite_add_tcase(s, hc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
