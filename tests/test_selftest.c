/* test_selftest.c — `streambp verify --self-test` (issue 54 item 4): the verifier plants faults
 * in its own inputs and each comparison must flag its fault; the default `verify` runs the step.
 *
 * The bugs this guards against pass every other check of `verify` (the planted binaries of
 * tests/plant.sh, each with one SBP_PLANT_* block of verify/ compiled in):
 *   loose-fp32-budget   the fp32 slack ten times the documented 4;
 *   loose-fp64-budget   the fp64 budget 1e-6 instead of 1e-10 (float32-level);
 *   bitwise-as-close    the bitwise groups comparing relative L2 <= 1e-15 instead of the bits;
 *   golden-line-prefix  `verify golden` comparing 8 bytes of each digest line.
 * For each, the planted binary's ordinary check passes (shown here: the bug is invisible to it)
 * and its self-test fails naming the fault that got through. That the default `verify` runs the
 * step (text and JSON) is tested with its golden step in test_verifygolden.c. */
#include "testutil.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The self-test of binary bin as JSON: exit status into *rc; the document (free it). */
static cJSON *self_test(const char *bin, int *rc) {
    *rc = tu_sh("timeout 300 '%s' verify --self-test --json", bin);
    cJSON *doc = cJSON_Parse(tu_last_output());
    ck_assert_msg(doc, "%s: not JSON (exit %d):\n%.2000s", bin, *rc, tu_last_output());
    return doc;
}

/* The row of the fault whose text starts with `prefix`, or NULL. */
static const cJSON *fault_row(const cJSON *doc, const char *prefix) {
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(doc, "faults")) {
        const char *f = cJSON_GetStringValue(cJSON_GetObjectItem(r, "fault"));
        if (f && strncmp(f, prefix, strlen(prefix)) == 0) return r;
    }
    return NULL;
}

static const char *faults[] = {
    "none:",       "fp64 element:", "fp32 element:",       "one ULP:",          "ragged:",
    "swapped:",    "fp32 as fp64:", "missing: a gradient", "missing: the same", "digest byte:",
    "golden line:"};
enum { N_FAULTS = sizeof faults / sizeof faults[0] };

START_TEST(every_fault_is_flagged) {
    int rc;
    cJSON *doc = self_test(tu_bin(), &rc);
    ck_assert_msg(rc == 0, "exit %d:\n%.3000s", rc, tu_last_output());
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "faults")), N_FAULTS);
    for (int i = 0; i < N_FAULTS; i++) {
        const cJSON *r = fault_row(doc, faults[i]);
        ck_assert_msg(r && cJSON_IsTrue(cJSON_GetObjectItem(r, "ok")), "%s: %s", faults[i],
                      r ? cJSON_PrintUnformatted(r) : "no row");
    }
    /* the golden row covers every committed digest, 6 comparisons each */
    const char *seen =
        cJSON_GetStringValue(cJSON_GetObjectItem(fault_row(doc, "golden line:"), "seen"));
    ck_assert_msg(seen && strstr(seen, " of ") && !strstr(seen, "wrong"), "%s", seen);
    cJSON_Delete(doc);
    /* text: one line per fault and the verdict */
    rc = tu_sh("timeout 300 '%s' verify --self-test", tu_bin());
    ck_assert_msg(rc == 0 && strstr(tu_last_output(), "self-test: 11 of 11 planted faults") &&
                      strstr(tu_last_output(), "\nPASS"),
                  "exit %d:\n%s", rc, tu_last_output());
    tu_expect_usage("unexpected argument", "verify --self-test --bogus");
}
END_TEST

/* Each planted verifier bug: its self-test fails on the fault it lets through, and only there. */
static const struct {
    const char *plant;
    const char *missed[3]; /* the faults that must be reported not flagged */
} plants[] = {
    {"loose-fp32-budget", {"fp32 element:"}},
    {"loose-fp64-budget", {"fp64 element:", "fp32 as fp64:"}},
    {"bitwise-as-close", {"one ULP:"}},
    {"golden-line-prefix", {"digest byte:", "golden line:"}},
};

START_TEST(planted_verifier_bugs_fail_the_self_test) {
    const char *bin = tu_plant_bin(plants[_i].plant);
    ck_assert_msg(tu_exists(bin), "%s is missing: make plants builds it", bin);
    int rc;
    cJSON *doc = self_test(bin, &rc);
    ck_assert_msg(rc == 1, "%s: exit %d:\n%.3000s", plants[_i].plant, rc, tu_last_output());
    for (int i = 0; i < N_FAULTS; i++) {
        int must_miss = 0;
        for (int k = 0; k < 3 && plants[_i].missed[k]; k++)
            must_miss |= strcmp(plants[_i].missed[k], faults[i]) == 0;
        const cJSON *r = fault_row(doc, faults[i]);
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(cJSON_IsTrue(cJSON_GetObjectItem(r, "ok")) == !must_miss, "%s: %s: %s",
                      plants[_i].plant, faults[i], cJSON_PrintUnformatted(r));
    }
    cJSON_Delete(doc);
}
END_TEST

/* What the self-test is for: each planted bug passes the check it weakens. */
START_TEST(planted_verifier_bugs_pass_the_ordinary_check) {
    const char *model = tu_path("selftest-model");
    if (!tu_exists(model))
        ck_assert_int_eq(tu_sh("'%s' init --config data/models/qwen3-tiny.json --seed 1 --out '%s'",
                               tu_bin(), model),
                         0);
    for (int i = 0; i < 3; i++) { /* the matrix plants, on the self-test's model and batch */
        int rc = tu_sh("timeout 300 '%s' verify --model '%s' --batch "
                       "data/batches/sft-tiny.safetensors --block 4 --chunks 8,7",
                       tu_plant_bin(plants[i].plant), model);
        ck_assert_msg(rc == 0, "%s: exit %d:\n%.3000s", plants[i].plant, rc, tu_last_output());
    }
    /* the golden plant: a committed digest with one changed hex digit still "matches" */
    const char *dir = tu_keep(tu_new_dir("golden-prefix"));
    ck_assert_int_eq(tu_sh("cp -r data/golden/*.txt data/golden/long '%s'/", dir), 0);
    ck_assert_int_eq(tu_sh("sed -i '/model.layers.1.mlp.down_proj.weight/ s/.$/X/' "
                           "'%s/qwen3-tiny-sft-fp32.txt'",
                           dir),
                     0);
    int rc = tu_sh("timeout 300 '%s' verify golden --golden-dir '%s'",
                   tu_plant_bin("golden-line-prefix"), dir);
    ck_assert_msg(rc == 0, "golden-line-prefix: exit %d:\n%.3000s", rc, tu_last_output());
    rc = tu_sh("timeout 300 '%s' verify golden --golden-dir '%s'", tu_bin(), dir);
    ck_assert_msg(rc == 1 && strstr(tu_last_output(), "model.layers.1.mlp.down_proj.weight"),
                  "the real binary: exit %d:\n%.3000s", rc, tu_last_output());
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("selftest");
    TCase *tc = tcase_create("selftest");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, every_fault_is_flagged);
    tcase_add_loop_test(tc, planted_verifier_bugs_fail_the_self_test, 0,
                        sizeof plants / sizeof plants[0]);
    tcase_add_test(tc, planted_verifier_bugs_pass_the_ordinary_check);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
