/* test_verifygolden.c — `streambp verify golden` (issue 35 item 16): the committed golden cases,
 * built into the binary, recomputed on this machine and compared with their digests; from any
 * directory; a changed digest (standing for a changed portable arithmetic: the comparison cannot
 * tell the two apart) fails naming the case and the tensor; the default `verify` runs the step. */
#include "testutil.h"

#include <cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

/* The digests in dir (data/golden, or data/golden/long: one per case of its manifest). */
static int count_txt(const char *dir) {
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strstr(e->d_name, ".txt") != NULL;
    closedir(d);
    return n;
}

static int golden_files(void) {
    return count_txt("data/golden") + count_txt("data/golden/long");
}

START_TEST(every_case_passes_anywhere) {
    char bin[4096];
    ck_assert_ptr_nonnull(realpath(tu_bin(), bin));
    int rc = tu_sh("cd / && timeout 300 '%s' verify golden", bin);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, tu_last_output());
    char want[96];
    snprintf(want, sizeof want, "golden: %d case runs on 1 device, %d pass, 0 differ",
             golden_files(), golden_files());
    ck_assert_msg(strstr(tu_last_output(), want), "no \"%s\" in: %s", want, tu_last_output());
    ck_assert_msg(strstr(tu_last_output(), "qwen3-hd72") &&
                      strstr(tu_last_output(), "llama3-tiny") &&
                      strstr(tu_last_output(), "long-gemma3-lora-fp64") &&
                      strstr(tu_last_output(), "long-qwen3-sft-bf16"),
                  "%s", tu_last_output());
}
END_TEST

START_TEST(a_changed_digest_fails) {
    const char *dir = tu_keep(tu_new_dir("golden-copy"));
    ck_assert_int_eq(tu_sh("cp -r data/golden/*.txt data/golden/long '%s'/", dir), 0);
    /* one hex digit of one tensor's digest, in a family case and in a long one */
    ck_assert_int_eq(tu_sh("sed -i '/model.layers.1.mlp.down_proj.weight/ s/ \\([0-9a-f]\\)/ X/' "
                           "'%s/qwen2-hd24-dpo-fp32.txt'",
                           dir),
                     0);
    ck_assert_int_eq(
        tu_sh("sed -i '/model.layers.0.self_attn.k_proj.weight/ s/ \\([0-9a-f]\\)/ X/' "
              "'%s/long/long-gemma3-sft-fp64.txt'",
              dir),
        0);
    int rc = tu_sh("timeout 300 '%s' verify golden --golden-dir '%s'", tu_bin(), dir);
    const char *out = tu_last_output();
    ck_assert_msg(rc == 1, "exit %d: %s", rc, out);
    ck_assert_msg(strstr(out, "qwen2-hd24   dpo  fp32  cpu       FAIL") &&
                      strstr(out, "model.layers.1.mlp.down_proj.weight"),
                  "%s", out);
    ck_assert_msg(strstr(out, "long-gemma3-sft-fp64    cpu       FAIL  line 4 "
                              "(model.layers.0.self_attn.k_proj.weight)"),
                  "%s", out);
    ck_assert_msg(strstr(out, "2 differ"), "%s", out);
    /* a missing golden file is an input error, not a pass */
    ck_assert_int_eq(tu_sh("rm '%s/qwen3-tiny-sft-fp64.txt'", dir), 0);
    rc = tu_sh("timeout 300 '%s' verify golden --golden-dir '%s'", tu_bin(), dir);
    ck_assert_msg(rc == 2 && strstr(tu_last_output(), "qwen3-tiny-sft-fp64"), "exit %d: %s", rc,
                  tu_last_output());
}
END_TEST

START_TEST(default_verify_runs_it) {
    /* the default run goes on with the golden step, the reach step (test_reach.c), the optimizer
     * check and the self-test (test_selftest.c) */
    int rc = tu_sh("timeout 600 '%s' verify", tu_bin());
    ck_assert_msg(rc == 0 && strstr(tu_last_output(), "case runs on 1 device") &&
                      strstr(tu_last_output(), "self-test: 11 of 11 planted faults"),
                  "exit %d: %s", rc, tu_last_output());
    rc = tu_sh("timeout 600 '%s' verify --no-golden --json", tu_bin());
    cJSON *doc = cJSON_Parse(tu_last_output());
    ck_assert_msg(rc == 0 && doc && !cJSON_GetObjectItem(doc, "golden"), "exit %d: %.2000s", rc,
                  tu_last_output());
    const cJSON *rc_ = cJSON_GetObjectItem(doc, "reach"); /* test_reach.c */
    ck_assert_msg(rc_ && cJSON_IsTrue(cJSON_GetObjectItem(rc_, "pass")) &&
                      cJSON_GetArraySize(cJSON_GetObjectItem(rc_, "cases")) == 6,
                  "%.2000s", tu_last_output());
    const cJSON *st = cJSON_GetObjectItem(doc, "self_test");
    ck_assert_msg(st && cJSON_IsTrue(cJSON_GetObjectItem(st, "pass")) &&
                      cJSON_GetArraySize(cJSON_GetObjectItem(st, "faults")) == 11,
                  "%.2000s", tu_last_output());
    cJSON_Delete(doc);
    rc = tu_sh("timeout 300 '%s' verify --no-golden --no-reach --no-self-test --schedules full "
               "--precisions fp64 --numerics fast --threads 1",
               tu_bin());
    ck_assert_msg(rc == 0 && !strstr(tu_last_output(), "case runs on") &&
                      !strstr(tu_last_output(), "self-test") && !strstr(tu_last_output(), "reach"),
                  "exit %d: %s", rc, tu_last_output());
    tu_expect_usage("gpu0", "verify golden --devices gpu0");
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("verifygolden");
    TCase *tc = tcase_create("verifygolden");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, every_case_passes_anywhere);
    tcase_add_test(tc, a_changed_digest_fails);
    tcase_add_test(tc, default_verify_runs_it);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
