/* test_plant.c — the verifier against planted bugs (issue 11, "blind spots of the verifier").
 *
 * Each binary under $BUILD/plant/ is streambp with one bug planted by tests/plant.sh (a source
 * file recompiled with -DSBP_PLANT_*, or with a header forced in); make test builds them. For
 * each class of bug that used to pass `streambp verify` and `verify --suite`, this runs the
 * planted binary's verifier, by itself, and checks that it exits 1 and names the right tensors
 * (and, for reading bugs, says what the library and the oracle read differently):
 *   loading bugs (the oracle used to read through the library's code): a normaliser counting
 *     the unshifted label, DPO padding labelled 0, a biased std in group-normalised advantages,
 *     per-token log-probs left unshifted, a wrong default head_dim;
 *   gradient accumulation: per-micro-batch normalisers (SFT, bnpo) and dr_grpo's
 *     max_completion_length taken per micro-batch;
 *   a reference model that ignores the GRPO temperature; clip bounds that use epsilon_low on
 *     both sides (epsilon_low != epsilon_high at temperature 1);
 *   a float32 slip that float32 full BP shares: the RoPE angle rounded to float, at positions
 *     near 20000. */
#include "testutil.h"
#include "../verify/micro.h"
#include "../verify/suite.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *plant;      /* $BUILD/plant/<plant>/streambp */
    const char *args;       /* of `streambp verify`, with --json */
    int suite;              /* args run a suite case */
    const char *group;      /* the verifier's group that must fail */
    const char *tensors[7]; /* among its failed tensors (NULL-terminated) */
    const char *clean[3];   /* groups that must pass: the bug is of that kind only */
    const char *note;       /* in the loading notes, or NULL */
} plant_case;

/* The default run's matrix and groups, without the steps after it (golden digests, reach, the
 * self-test): those check other things, took most of the run's time, and the groups below are
 * the matrix's. test_verify runs the whole default. */
#define MATRIX "--no-golden --no-reach --no-self-test"

#define L0 "model.layers.0."
#define L1 "model.layers.1."

static const plant_case cases[] = {
    {"unshifted-normaliser",
     MATRIX,
     0,
     "fp64 vs truth",
     {"model.embed_tokens.weight", L0 "mlp.down_proj.weight", "model.norm.weight"},
     {"schedules", "threads"},
     "number of targets"},
    {"dpo-pad-label-zero",
     "--suite --case dpo-sigmoid",
     1,
     "fp64 vs truth",
     {"model.embed_tokens.weight", L1 "self_attn.q_proj.weight"},
     {"schedules"},
     "labels"},
    {"biased-std",
     "--suite --case grpo-temperature",
     1,
     "fp64 vs truth",
     {"model.embed_tokens.weight", L0 "mlp.up_proj.weight"},
     {"schedules"},
     "advantages"},
    {"unshifted-token-logps",
     "--suite --case grpo-bnpo",
     1,
     "fp64 vs truth",
     {"lm_head.weight", L1 "mlp.gate_proj.weight"},
     {"schedules"},
     "old_logps"},
    {"head-dim-default",
     "--suite --case qwen3-default-head-dim",
     1,
     "loading",
     {L0 "self_attn.q_proj.weight", L0 "self_attn.k_proj.weight", L0 "self_attn.o_proj.weight",
      L0 "self_attn.q_norm.weight", L1 "self_attn.k_norm.weight"},
     {NULL},
     "shape config.json implies"},
    {"micro-sft-normaliser",
     MATRIX,
     0,
     "micro-batches",
     {"model.embed_tokens.weight", L0 "self_attn.v_proj.weight"},
     {"fp64 vs truth", "fp32 vs truth", "loading"},
     NULL},
    {"micro-bnpo",
     "--suite --case grpo-bnpo-clip",
     1,
     "micro-batches",
     {"lm_head.weight", L0 "self_attn.k_proj.weight"},
     {"fp64 vs truth", "fp32 vs truth"},
     NULL},
    {"micro-dr-grpo-lmax",
     "--suite --case grpo-dr-ragged",
     1,
     "micro-batches",
     {"lm_head.weight", L1 "self_attn.q_proj.bias"},
     {"fp64 vs truth", "fp32 vs truth"},
     NULL},
    {"clip-one-epsilon",
     "--suite --case grpo-clip-asym",
     1,
     "fp64 vs truth",
     {"model.embed_tokens.weight", L0 "self_attn.q_proj.weight"},
     {"schedules", "loading"},
     NULL},
    {"ref-ignores-temperature",
     "--suite --case grpo-ref-temperature",
     1,
     "fp64 vs truth",
     {"lm_head.weight", L0 "self_attn.v_proj.bias"},
     {"schedules"},
     "ref_logps"},
    {"f32-rope-angle",
     "--suite --case long-positions",
     1,
     "fp32 vs truth",
     {L0 "self_attn.q_proj.weight", L0 "self_attn.k_proj.weight"},
     {"loading"},
     NULL},
};

/* The failed tensors of a group (a JSON array of names), from verify's or the suite's JSON. */
static const cJSON *failed_in(const cJSON *doc, int suite, const char *group, const char **notes) {
    if (suite) {
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "cases"), 0);
        *notes = cJSON_GetStringValue(cJSON_GetObjectItem(c, "loading_notes"));
        return cJSON_GetObjectItem(cJSON_GetObjectItem(c, "failed_tensors"), group);
    }
    *notes = cJSON_GetStringValue(cJSON_GetObjectItem(doc, "loading_notes"));
    static cJSON *names; /* rebuilt from the group's rows */
    cJSON_Delete(names);
    names = NULL;
    const cJSON *g;
    cJSON_ArrayForEach(g, cJSON_GetObjectItem(doc, "groups")) {
        if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(g, "group")), group) != 0) continue;
        names = cJSON_CreateArray();
        const cJSON *r;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(g, "rows")) {
            if (cJSON_IsTrue(cJSON_GetObjectItem(r, "ok"))) continue;
            const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(r, "tensor"));
            cJSON_AddItemToArray(names, cJSON_CreateString(t));
        }
    }
    return names && cJSON_GetArraySize(names) ? names : NULL;
}

static int has_name(const cJSON *names, const char *name) {
    const cJSON *n;
    cJSON_ArrayForEach(n, names) if (strcmp(cJSON_GetStringValue(n), name) == 0) return 1;
    return 0;
}

START_TEST(planted) {
    const plant_case *c = &cases[_i];
    const char *bin = tu_plant_bin(c->plant);
    ck_assert_msg(tu_exists(bin), "%s is missing: make plants builds it", bin);
    int rc = tu_sh("%s verify %s --json", bin, c->args);
    const char *out = tu_last_output();
    ck_assert_msg(rc == 1, "plant %s: `verify %s` exited %d, not 1:\n%.3000s", c->plant, c->args,
                  rc, out);
    const char *json = strchr(out, '{');
    cJSON *doc = json ? cJSON_Parse(json) : NULL;
    ck_assert_msg(doc != NULL, "plant %s: no JSON in:\n%.2000s", c->plant, out);
    const char *notes = NULL;
    const cJSON *names = failed_in(doc, c->suite, c->group, &notes);
    ck_assert_msg(names != NULL, "plant %s: group \"%s\" did not fail:\n%.3000s", c->plant,
                  c->group, json);
    const int n_failed = cJSON_GetArraySize(names);
    for (int k = 0; c->tensors[k]; k++)
        ck_assert_msg(has_name(names, c->tensors[k]),
                      "plant %s: %s is not among the failed tensors of \"%s\":\n%.3000s", c->plant,
                      c->tensors[k], c->group, json);
    for (int k = 0; k < 3 && c->clean[k]; k++)
        ck_assert_msg(!failed_in(doc, c->suite, c->clean[k], &notes),
                      "plant %s: group \"%s\" failed too, so the bug was not the one planted",
                      c->plant, c->clean[k]);
    failed_in(doc, c->suite, c->group, &notes);
    if (c->note)
        ck_assert_msg(notes && strstr(notes, c->note),
                      "plant %s: the loading notes do not mention \"%s\": %s", c->plant, c->note,
                      notes ? notes : "(none)");
    printf("plant %-24s caught: %-14s %d tensors%s%.120s\n", c->plant, c->group, n_failed,
           notes ? "; notes: " : "", notes ? notes : "");
    fflush(stdout);
    cJSON_Delete(doc);
}
END_TEST

/* The commands above pass on the unplanted binary (the suite cases are run by test_verify). */
START_TEST(control) {
    int rc = tu_sh("%s verify " MATRIX " --json", tu_bin());
    ck_assert_msg(rc == 0, "`verify` exited %d:\n%.2000s", rc, tu_last_output());
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * "Many catches hang on one fixture": each semantic feature must be exercised by at least two
 * suite cases of different shapes (model and batch dimensions). The features are read from the
 * cases' own files and options, not from a list kept by hand. */

enum {
    F_LEFT_PAD,
    F_RIGHT_PAD,
    F_TARGET_FROM_PAD,
    F_DPO_SIGMOID,
    F_DPO_IPO,
    F_GRPO_GRPO,
    F_GRPO_BNPO,
    F_GRPO_DR_GRPO,
    F_GRPO_DAPO,
    F_TEMPERATURE,
    F_CLIP_ASYM,
    F_REF_MODEL,
    F_BIAS,
    F_QK_NORM,
    F_ROPE_SCALING,
    F_MICRO_RAGGED,
    F_N
};
static const char *feature_names[F_N] = {"left padding",
                                         "right padding",
                                         "target predicted from a pad",
                                         "DPO sigmoid",
                                         "DPO ipo",
                                         "GRPO grpo",
                                         "GRPO bnpo",
                                         "GRPO dr_grpo",
                                         "GRPO dapo",
                                         "temperature != 1",
                                         "epsilon_low != epsilon_high",
                                         "reference model",
                                         "q/k/v bias",
                                         "q/k norm",
                                         "rope scaling",
                                         "micro-batches of different T"};

START_TEST(suite_coverage) {
    char shapes[F_N][16][64];
    int n[F_N] = {0};
    for (int i = 0; i < sbp_suite_count(); i++) {
        const sbp_suite_case *k = sbp_suite_case_at(i);
        sbp_config cfg;
        sbp_batch b;
        sbp_err err = {0};
        char path[256];
        snprintf(path, sizeof path, "data/models/%s.json", k->model);
        ck_assert_msg(sbp_config_load(&cfg, path, &err) == SBP_OK, "%s", err.msg);
        snprintf(path, sizeof path, "data/batches/%s.safetensors", k->batch);
        ck_assert_msg(sbp_batch_load_as(&b, path, &cfg, k->obj.kind, 1, &err) == SBP_OK, "%s: %s",
                      k->name, err.msg);
        int f[F_N] = {0};
        for (int r = 0; r < b.B; r++) {
            const uint8_t *m = b.mask + (size_t)r * b.T;
            int first = -1, last = -1;
            for (int t = 0; t < b.T; t++)
                if (m[t]) last = t, first = first < 0 ? t : first;
            f[F_LEFT_PAD] |= first > 0;
            f[F_RIGHT_PAD] |= last >= 0 && last < b.T - 1 && b.kind != SBP_OBJ_DPO;
        }
        f[F_RIGHT_PAD] |= b.kind == SBP_OBJ_DPO; /* the loader pads the shorter side */
        f[F_TARGET_FROM_PAD] = b.n_pad_targets > 0;
        const sbp_objective *o = &k->obj;
        f[F_DPO_SIGMOID] = o->kind == SBP_OBJ_DPO && o->dpo_loss == SBP_DPO_SIGMOID;
        f[F_DPO_IPO] = o->kind == SBP_OBJ_DPO && o->dpo_loss == SBP_DPO_IPO;
        f[F_GRPO_GRPO] = o->kind == SBP_OBJ_GRPO && o->grpo_loss == SBP_GRPO_GRPO;
        f[F_GRPO_BNPO] = o->kind == SBP_OBJ_GRPO && o->grpo_loss == SBP_GRPO_BNPO;
        f[F_GRPO_DR_GRPO] = o->kind == SBP_OBJ_GRPO && o->grpo_loss == SBP_GRPO_DR_GRPO;
        f[F_GRPO_DAPO] = o->kind == SBP_OBJ_GRPO && o->grpo_loss == SBP_GRPO_DAPO;
        f[F_TEMPERATURE] = o->temperature != 0 && o->temperature != 1;
        f[F_CLIP_ASYM] =
            o->kind == SBP_OBJ_GRPO && o->epsilon_low != o->epsilon_high && b.old_logps != NULL;
        f[F_REF_MODEL] = k->ref_seed != 0;
        f[F_BIAS] = cfg.qkv_bias, f[F_QK_NORM] = cfg.qk_norm, f[F_ROPE_SCALING] = cfg.rope_llama3;
        sbp_batch mb[SBP_VERIFY_MAX_MICRO];
        int nm = 0;
        ck_assert_int_eq(sbp_verify_split(mb, &nm, &b, &err), SBP_OK);
        for (int j = 1; j < nm; j++) f[F_MICRO_RAGGED] |= mb[j].T != mb[0].T;
        for (int j = 0; j < nm; j++) sbp_batch_free(&mb[j]);
        char shape[64];
        snprintf(shape, sizeof shape, "%d/%d/%d/%d B%d T%d", cfg.hidden, cfg.heads, cfg.head_dim,
                 cfg.vocab, b.B, b.T);
        for (int q = 0; q < F_N; q++) {
            int seen = 0;
            for (int j = 0; j < n[q]; j++) seen |= strcmp(shapes[q][j], shape) == 0;
            if (f[q] && !seen && n[q] < 16) snprintf(shapes[q][n[q]++], 64, "%s", shape);
        }
        sbp_batch_free(&b);
    }
    for (int q = 0; q < F_N; q++) {
        printf("suite coverage: %-30s %d shapes\n", feature_names[q], n[q]);
        ck_assert_msg(n[q] >= 2, "the suite exercises \"%s\" on %d shape(s), fewer than two",
                      feature_names[q], n[q]);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("plant");
    TCase *tc = tcase_create("plant");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, planted, 0, (int)(sizeof cases / sizeof cases[0]));
    tcase_add_test(tc, control);
    tcase_add_test(tc, suite_coverage);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
