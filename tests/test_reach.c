/* test_reach.c — `streambp verify reach` (issue 54 items 2 and 3): small models and batches that
 * take the paths the bundled model does not, each through the matrix against the ref/ oracle,
 * as a step of the default `streambp verify`.
 *
 * Planted (tests/plant.sh; the float32 engine rebuilt with one SBP_PLANT_* block of
 * src/kernels/fast/attention.c):
 *   fast-window-mask  the fast attention's window mask one key too wide (c < last − win instead
 *                     of c <= last − win): every query of a sliding-window layer sees the key
 *                     just before its window;
 *   fast-tile-tail    the key-tile transpose leaves out the last dimension of the head past the
 *                     last whole 16 (head_dim 24: dimension 23 of Kᵀ and Vᵀ stale), whether
 *                     AVX-512's element tail, AVX2's 8 × 8 blocks or plain C would write it.
 * Both pass the default matrix (the bundled Qwen3-tiny has no window and head_dim 32), so they
 * passed `streambp verify` before this step; each fails its reach case here, in "fp32 vs truth"
 * (a budget of 4 x the oracle's own float32 error: the one wrong key, or one dimension of the
 * tile's tail, exceeds it on every tensor). */
#include "testutil.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *cases[] = {"fast-ragged-tiles",  "fast-window-tiles",
                              "unattended-hf-sdpa", "unattended-hf-eager-window",
                              "reference-model",    "lora"};
enum { N_CASES = sizeof cases / sizeof cases[0] };

/* The reach step as JSON (args: more options): exit status into *rc. */
static cJSON *reach(const char *bin, const char *args, int *rc) {
    *rc = tu_sh("timeout 600 '%s' verify reach --json %s", bin, args);
    cJSON *doc = cJSON_Parse(tu_last_output());
    ck_assert_msg(doc, "%s: not JSON (exit %d):\n%.2000s", bin, *rc, tu_last_output());
    return doc;
}

START_TEST(every_case_passes) {
    int rc;
    cJSON *doc = reach(tu_bin(), "", &rc);
    ck_assert_msg(rc == 0 && cJSON_IsTrue(cJSON_GetObjectItem(doc, "pass")), "exit %d: %.3000s", rc,
                  tu_last_output());
    const cJSON *cs = cJSON_GetObjectItem(doc, "cases");
    ck_assert_int_eq(cJSON_GetArraySize(cs), N_CASES);
    for (int i = 0; i < N_CASES; i++) {
        const cJSON *c = cJSON_GetArrayItem(cs, i);
        ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(c, "case")), cases[i]);
        ck_assert_msg(cJSON_GetObjectItem(c, "runs")->valueint >= 20, "%s: few runs", cases[i]);
    }
    cJSON_Delete(doc);
    ck_assert_int_eq(tu_sh("'%s' verify reach --list", tu_bin()), 0);
    for (int i = 0; i < N_CASES; i++) ck_assert_ptr_nonnull(strstr(tu_last_output(), cases[i]));
    tu_expect_usage("no case", "verify reach --case nothing");
}
END_TEST

static const struct {
    const char *plant, *reach_case;
    const char *tensors[3]; /* among the failed tensors of "fp32 vs truth" */
} plants[] = {
    {"fast-window-mask",
     "fast-window-tiles",
     {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
      "model.embed_tokens.weight"}},
    {"fast-tile-tail",
     "fast-ragged-tiles",
     {"model.layers.0.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight",
      "lm_head.weight"}},
};

static int names(const cJSON *arr, const char *name) {
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) if (strcmp(cJSON_GetStringValue(x), name) == 0) return 1;
    return 0;
}

START_TEST(planted_fast_bugs_fail_their_case) {
    const char *bin = tu_plant_bin(plants[_i].plant);
    ck_assert_msg(tu_exists(bin), "%s is missing: make plants builds it", bin);
    char args[128];
    snprintf(args, sizeof args, "--case %s", plants[_i].reach_case);
    int rc;
    cJSON *doc = reach(bin, args, &rc);
    ck_assert_msg(rc == 1, "%s: exit %d:\n%.3000s", plants[_i].plant, rc, tu_last_output());
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "cases"), 0);
    const cJSON *f32 =
        cJSON_GetObjectItem(cJSON_GetObjectItem(c, "failed_tensors"), "fp32 vs truth");
    for (int k = 0; k < 3; k++)
        ck_assert_msg(names(f32, plants[_i].tensors[k]), "%s: %s not failed in fp32 vs truth: %s",
                      plants[_i].plant, plants[_i].tensors[k], tu_last_output());
    cJSON_Delete(doc);
    /* invisible to the bundled model's matrix: the default verify passed it before this step */
    rc = tu_sh("timeout 600 '%s' verify --no-golden --no-reach --no-self-test", bin);
    ck_assert_msg(rc == 0, "%s: the bundled model's matrix: exit %d:\n%.3000s", plants[_i].plant,
                  rc, tu_last_output());
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("reach");
    TCase *tc = tcase_create("reach");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, every_case_passes);
    tcase_add_loop_test(tc, planted_fast_bugs_fail_their_case, 0, sizeof plants / sizeof plants[0]);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
