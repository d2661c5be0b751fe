/* test_adapter.c — issue 35 items 6, 7 and the adapter parts of 10: `init` and `lora init`
 * never replace an existing model or adapter by surprise and write their directory as a unit;
 * adapter_config.json is typed exactly (booleans are JSON booleans, numbers range-checked, peft
 * features that change the math refused by name); no adapter with non-finite weights is written
 * or loaded. Each test failed before its fix. */
#include "testutil.h"
#include "../src/io/lora.h"

#include <cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL "qwen3-tiny"

/* A directory outside the one under test holding a canary; returns its snapshot. */
static char *canary(const char *dir) {
    tu_new_dir(dir);
    tu_spit(tu_path("%s/canary.txt", dir), "keep me\n", 8);
    return tu_snapshot(tu_path("%s", dir));
}

static void assert_unchanged(const char *dir, char *before) {
    char *after = tu_snapshot(dir);
    ck_assert_msg(strcmp(before, after) == 0, "%s changed:\nbefore\n%s\nafter\n%s", dir, before,
                  after);
    free(before), free(after);
}

START_TEST(init_refuses_existing_model) {
    const char *out = tu_keep(tu_path("init-out"));
    const char *cfg = "data/models/" MODEL ".json";
    ck_assert_msg(tu_sh("'%s' init --config %s --seed 1 --out '%s'", tu_bin(), cfg, out) == 0, "%s",
                  tu_last_output());
    char *before = tu_snapshot(out);
    tu_expect_usage("--force", "init --config %s --seed 2 --out '%s'", cfg, out);
    assert_unchanged(out, before);
    /* with --force the model is replaced, and nothing is left beside it */
    before = tu_snapshot(out);
    ck_assert_msg(tu_sh("'%s' init --config %s --seed 2 --out '%s/' --force", tu_bin(), cfg, out) ==
                      0,
                  "%s", tu_last_output());
    char *after = tu_snapshot(out);
    ck_assert_msg(strcmp(before, after) != 0, "--force did not replace the model");
    free(before), free(after);
    tu_assert_no_tmp(tu_tmpdir());
    /* a directory with other files is not ours to replace, even with --force */
    const char *mixed = tu_keep(tu_new_dir("init-mixed"));
    tu_spit(tu_join(mixed, "notes.txt"), "mine\n", 5);
    before = tu_snapshot(mixed);
    tu_expect_usage("notes.txt", "init --config %s --out '%s' --force", cfg, mixed);
    assert_unchanged(mixed, before);
    /* a symbolic link at --out is refused, never followed */
    char *outside = canary("init-outside");
    const char *link = tu_keep(tu_path("init-link"));
    ck_assert_int_eq(symlink(tu_path("init-outside"), link), 0);
    tu_expect_usage("symbolic link", "init --config %s --out '%s' --force", cfg, link);
    assert_unchanged(tu_path("init-outside"), outside);
}
END_TEST

START_TEST(lora_init_refuses_existing_adapter) {
    const char *m = tu_model(MODEL, 1), *out = tu_keep(tu_path("adapter-out"));
    ck_assert_msg(tu_sh("'%s' lora init --model '%s' --out '%s' --r 2", tu_bin(), m, out) == 0,
                  "%s", tu_last_output());
    char *before = tu_snapshot(out);
    tu_expect_usage("--force", "lora init --model '%s' --out '%s' --r 4", m, out);
    assert_unchanged(out, before);
    ck_assert_msg(tu_sh("'%s' lora init --model '%s' --out '%s' --r 4 --force", tu_bin(), m, out) ==
                      0,
                  "%s", tu_last_output());
    sbp_config cfg;
    sbp_err err = {0};
    sbp_lora a;
    ck_assert(sbp_config_load(&cfg, tu_join(m, "config.json"), &err) == SBP_OK);
    ck_assert_msg(sbp_lora_load(&a, out, &cfg, SBP_FP32, NULL, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(a.cfg.r, 4); /* config and weights of the new adapter, together */
    sbp_lora_free(&a, NULL);
    tu_assert_no_tmp(tu_tmpdir());
    char *outside = canary("adapter-outside");
    const char *link = tu_keep(tu_path("adapter-link"));
    ck_assert_int_eq(symlink(tu_path("adapter-outside"), link), 0);
    tu_expect_usage("symbolic link", "lora init --model '%s' --out '%s' --force", m, link);
    assert_unchanged(tu_path("adapter-outside"), outside);
}
END_TEST

/* An adapter_config.json object from text, parsed by the library. */
static sbp_status parse_config(const char *text, sbp_err *err) {
    cJSON *j = cJSON_Parse(text);
    ck_assert_msg(j != NULL, "bad test JSON: %s", text);
    sbp_lora_config c;
    sbp_status st = sbp_lora_config_from_json(&c, j, "adapter_config.json", err);
    cJSON_Delete(j);
    return st;
}

#define BASE                                                                                       \
    "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]"

START_TEST(config_types_exact) {
    sbp_err err = {0};
    ck_assert_msg(parse_config(BASE "}", &err) == SBP_OK, "%s", err.msg);
    ck_assert_msg(parse_config(BASE
                               ", \"use_rslora\": false, \"use_dora\": null, \"lora_dropout\": "
                               "0.05, \"exclude_modules\": null, \"layers_pattern\": \"\"}",
                               &err) == SBP_OK,
                  "%s", err.msg);
    static const struct {
        const char *extra, *named;
    } bad[] = {
        {"\"use_rslora\": \"true\"", "use_rslora"},
        {"\"use_rslora\": 1", "use_rslora"},
        {"\"use_dora\": \"false\"", "use_dora"},
        {"\"fan_in_fan_out\": 0", "fan_in_fan_out"},
        {"\"inference_mode\": \"yes\"", "inference_mode"},
        {"\"use_dora\": true", "use_dora"},
        {"\"use_qalora\": true", "use_qalora"},
        {"\"lora_bias\": true", "lora_bias"},
        {"\"exclude_modules\": [\"k_proj\"]", "exclude_modules"},
        {"\"target_parameters\": [\"mlp.experts\"]", "target_parameters"},
        {"\"layers_pattern\": \"layers\"", "layers_pattern"},
        {"\"layers_to_transform\": [0]", "layers_to_transform"},
        {"\"rank_pattern\": {\"q_proj\": 8}", "rank_pattern"},
        {"\"layer_replication\": [[0, 1]]", "layer_replication"},
        {"\"trainable_token_indices\": [1, 2]", "trainable_token_indices"},
        {"\"modules_to_save\": [\"lm_head\"]", "modules_to_save"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char text[512];
        snprintf(text, sizeof text, BASE ", %s}", bad[i].extra);
        err.msg[0] = '\0';
        ck_assert_msg(parse_config(text, &err) != SBP_OK, "accepted: %s", text);
        ck_assert_msg(strstr(err.msg, bad[i].named), "%s: the error does not name %s: %s", text,
                      bad[i].named, err.msg);
    }
    /* numbers: checked before any conversion (r = 1e30 was a float->int overflow) */
    static const char *const numbers[] = {
        "{\"peft_type\": \"LORA\", \"r\": 1e30, \"lora_alpha\": 8, \"target_modules\": "
        "[\"q_proj\"]}",
        "{\"peft_type\": \"LORA\", \"r\": -3, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}",
        "{\"peft_type\": \"LORA\", \"r\": 2.5, \"lora_alpha\": 8, \"target_modules\": "
        "[\"q_proj\"]}",
        "{\"peft_type\": \"LORA\", \"r\": \"4\", \"lora_alpha\": 8, \"target_modules\": "
        "[\"q_proj\"]}",
        "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": \"8\", \"target_modules\": "
        "[\"q_proj\"]}",
        "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 1e999, \"target_modules\": "
        "[\"q_proj\"]}",
    };
    for (size_t i = 0; i < sizeof numbers / sizeof *numbers; i++) {
        cJSON *j = cJSON_Parse(numbers[i]);
        if (!j) continue; /* 1e999: cJSON's own reading is inf or a parse error, either is fine */
        cJSON_Delete(j);
        ck_assert_msg(parse_config(numbers[i], &err) != SBP_OK, "accepted: %s", numbers[i]);
        ck_assert_msg(strstr(err.msg, "\"r\"") || strstr(err.msg, "rank r") ||
                          strstr(err.msg, "lora_alpha"),
                      "%s: %s", numbers[i], err.msg);
    }
}
END_TEST

START_TEST(b_std_out_of_range) {
    const char *m = tu_model(MODEL, 1);
    static const char *const stds[] = {"1e308", "1e40", "nan", "inf", "-1"};
    for (int i = 0; i < 5; i++) {
        const char *out = tu_path("bstd-%d", i);
        int rc =
            tu_sh("'%s' lora init --model '%s' --out '%s' --b-std %s", tu_bin(), m, out, stds[i]);
        ck_assert_msg(rc == 2, "--b-std %s: exit %d: %s", stds[i], rc, tu_last_output());
        ck_assert_msg(!tu_exists(out), "--b-std %s: %s was written", stds[i], out);
    }
    tu_expect_usage("--seed", "lora init --model '%s' --out '%s' --seed 1e30", m, tu_path("bseed"));
    tu_expect_usage("--seed", "lora init --model '%s' --out '%s' --seed -1", m, tu_path("bseed"));
}
END_TEST

START_TEST(nan_adapter_weight_refused) {
    const char *m = tu_model(MODEL, 1), *dir = tu_keep(tu_path("nan-adapter"));
    ck_assert_msg(
        tu_sh("'%s' lora init --model '%s' --out '%s' --r 2 --b-std 0.1", tu_bin(), m, dir) == 0,
        "%s", tu_last_output());
    const char *file = tu_join(dir, "adapter_model.safetensors");
    tu_tensors ts;
    tu_tensors_load(&ts, file);
    const int k =
        tu_tensors_index(&ts, "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
    ck_assert_int_eq(ts.e[k].dtype, SBP_DT_F32);
    ((float *)ts.data[k])[5] = NAN;
    sbp_err err = {0};
    ck_assert_msg(sbp_st_write(file, ts.e, ts.n, NULL, &err) == SBP_OK, "%s", err.msg);
    tu_tensors_free(&ts);
    sbp_config cfg;
    sbp_lora a;
    ck_assert(sbp_config_load(&cfg, tu_join(m, "config.json"), &err) == SBP_OK);
    ck_assert_msg(sbp_lora_load(&a, dir, &cfg, SBP_FP32, NULL, &err) != SBP_OK,
                  "an adapter with a NaN weight was loaded");
    ck_assert_msg(strstr(err.msg, "layers.1.self_attn.v_proj.lora_B") &&
                      strstr(err.msg, "element 5"),
                  "%s", err.msg);
    /* the same through the command line: exit 2, nothing written */
    const char *out = tu_path("nan-grad.safetensors");
    int rc = tu_sh("'%s' grad --model '%s' --lora '%s' --batch data/batches/sft-tiny.safetensors "
                   "--block 4 --out '%s'",
                   tu_bin(), m, dir, out);
    ck_assert_msg(rc == 2 && !tu_exists(out), "exit %d: %s", rc, tu_last_output());
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("adapter");
    TCase *tc = tcase_create("adapter");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, init_refuses_existing_model);
    tcase_add_test(tc, lora_init_refuses_existing_adapter);
    tcase_add_test(tc, config_types_exact);
    tcase_add_test(tc, b_std_out_of_range);
    tcase_add_test(tc, nan_adapter_weight_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
