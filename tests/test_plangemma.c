/* test_plangemma.c — `plan --paper --family gemma3` (issue 34): the StreamBP paper's Table 3
 * setting for Gemma-3 1B and 4B, every schedule, computed by the planner. The CLI runs under
 * `timeout`, so a hang fails the test. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

static int64_t json_int(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    ck_assert_msg(cJSON_IsNumber(v), "no number \"%s\" in plan --json", key);
    return (int64_t)v->valuedouble;
}

static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    ck_assert_msg(cJSON_IsString(v), "no string \"%s\" in plan --json", key);
    return v->valuestring;
}

enum { N_COL = 4, N_OBJ = 3, N_SCHED = 4 };
static const char *cols[N_COL] = {"1B Full", "1B LoRA", "4B Full", "4B LoRA"};
static const char *configs[N_COL] = {"gemma3-1b", "gemma3-1b", "gemma3-4b", "gemma3-4b"};
static const char *objs[N_OBJ] = {"sft", "dpo", "grpo"};
static const char *scheds[N_SCHED] = {"full", "ckpt", "ckpt-chunked", "stream"};

static int index_of(const char *const *names, int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

/* Every cell (3 objectives x 4 schedules x 4 columns) once, each a T > 0 whose bytes at the peak
 * add up; the schedules ordered as they must be (full <= ckpt <= ckpt-chunked, ckpt < stream);
 * and one cell per column, the objective and the schedule turning round, checked against the
 * planner directly: T fits 80 GiB and T + 1 does not, in the paper's setting (bf16, B = 1 / one
 * pair / a group of 8, block 256, chunk 1024, logit chunk 256, LoRA r 32 all-linear). */
START_TEST(gemma3_table_complete) {
    ck_assert_int_eq(tu_cli("", 600, "plan --paper --family gemma3 --json"), 0);
    cJSON *root = cJSON_Parse(tu_last_output());
    ck_assert_msg(root, "plan --paper --family gemma3 --json did not print JSON: %s",
                  tu_last_output());
    ck_assert_str_eq(json_str(root, "family"), "gemma3");
    ck_assert_int_eq(json_int(root, "budget_bytes"), 80LL << 30);
    const cJSON *cells = cJSON_GetObjectItemCaseSensitive(root, "table"), *c;
    ck_assert_int_eq(cJSON_GetArraySize(cells), N_OBJ * N_SCHED * N_COL);
    int T[N_OBJ][N_SCHED][N_COL] = {{{0}}};
    cJSON_ArrayForEach(c, cells) {
        const int i = index_of(objs, N_OBJ, json_str(c, "objective"));
        const int j = index_of(scheds, N_SCHED, json_str(c, "schedule"));
        const int k = index_of(cols, N_COL, json_str(c, "column"));
        ck_assert_msg(i >= 0 && j >= 0 && k >= 0 && !T[i][j][k], "cell %s %s %s",
                      json_str(c, "objective"), json_str(c, "schedule"), json_str(c, "column"));
        T[i][j][k] = (int)json_int(c, "T");
        ck_assert_msg(T[i][j][k] > 0, "%s %s %s: nothing fits", objs[i], scheds[j], cols[k]);
        const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(c, "bytes_at_peak"), *b;
        int64_t sum = 0;
        cJSON_ArrayForEach(b, bytes) if (strcmp(b->string, "total")) sum += (int64_t)b->valuedouble;
        ck_assert_int_eq(sum, json_int(bytes, "total"));
        ck_assert(sum <= (80LL << 30));
    }
    for (int i = 0; i < N_OBJ; i++)
        for (int k = 0; k < N_COL; k++)
            ck_assert_msg(T[i][0][k] <= T[i][1][k] && T[i][1][k] <= T[i][2][k] &&
                              T[i][1][k] < T[i][3][k],
                          "%s %s: full %d, ckpt %d, ckpt-chunked %d, stream %d", objs[i], cols[k],
                          T[i][0][k], T[i][1][k], T[i][2][k], T[i][3][k]);
    for (int k = 0; k < N_COL; k++) {
        const int i = k % N_OBJ, j = (k + 1) % N_SCHED;
        sbp_config cfg;
        sbp_err err = {0};
        char path[128];
        snprintf(path, sizeof path, "data/configs/%s.json", configs[k]);
        if (sbp_config_load(&cfg, path, &err)) ck_abort_msg("%s", err.msg);
        ck_assert_int_eq(cfg.family, SBP_GEMMA3);
        static const sbp_schedule sched[N_SCHED] = {SBP_FULL, SBP_CKPT, SBP_CKPT, SBP_STREAM};
        sbp_plan_opts o = {.grad = {.schedule = sched[j],
                                    .block = 256,
                                    .chunk = 1024,
                                    .logit_chunk = 256,
                                    .chunked_logits = j == 2,
                                    .objective = {.kind = (sbp_objective_kind)i,
                                                  .beta = i == 1 ? 0.1 : 0,
                                                  .epsilon_low = 0.2,
                                                  .epsilon_high = 0.2}},
                           .B = i == 2 ? 8 : 1,
                           .storage_bytes = 2};
        if (strstr(cols[k], "LoRA"))
            o.lora = (sbp_lora_config){.r = 32, .alpha = 128, .targets = SBP_LORA_ALL};
        sbp_ledger at, above;
        o.T = T[i][j][k];
        if (sbp_plan(&at, &cfg, &o, &err)) ck_abort_msg("%s", err.msg);
        o.T++;
        if (sbp_plan(&above, &cfg, &o, &err)) ck_abort_msg("%s", err.msg);
        ck_assert_msg(at.peak_total <= (80LL << 30) && above.peak_total > (80LL << 30),
                      "%s %s %s: T = %d is not the boundary (%lld, %lld at T + 1)", objs[i],
                      scheds[j], cols[k], T[i][j][k], (long long)at.peak_total,
                      (long long)above.peak_total);
    }
    cJSON_Delete(root);
}
END_TEST

/* The text table names the columns and every schedule; a family other than qwen3 and gemma3,
 * and --family without --paper, are usage errors (exit 2) that say why. */
START_TEST(gemma3_table_text_and_usage) {
    int rc = tu_cli("", 600, "plan --paper --family gemma3 --budget 40G");
    tu_check_run(rc, 0, "40.0 GiB", "1B Full", "1B LoRA", "4B Full", "4B LoRA", "ckpt-chunked",
                 "stream/ckpt", "grpo");
    rc = tu_cli("", 60, "plan --paper --family llama3");
    tu_check_run(rc, 2, "--family must be qwen3");
    rc = tu_cli("", 60, "plan --config data/configs/gemma3-1b.json --seq 4096 --family gemma3");
    tu_check_run(rc, 2, "it needs --paper");
    rc = tu_cli("", 60, "plan --paper --family gemma3 --seq 4096");
    tu_check_run(rc, 2, "--paper takes only --budget and --json (and --family)");
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("plangemma");
    TCase *tc = tcase_create("plangemma"); /* some 700 plans of 1B-4B models */
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, gemma3_table_complete);
    tcase_add_test(tc, gemma3_table_text_and_usage);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
