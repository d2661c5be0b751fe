/* test_verifylora.c — the verifier for LoRA adapters (issue 35 item 15): `verify --lora DIR`
 * checks an adapter's gradients (peft's names) in every group against the oracle, which reads the
 * adapter with its own reader (its LoRA gradient is checked by finite differences in
 * tests/test_ref.c); `verify audit --lora DIR` judges another implementation's adapter gradients
 * and fails on planted bugs: a lora_B gradient scaled by 2, one layer's lora_A zeroed, a missing
 * tensor. */
#include "testutil.h"

#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

#define BATCH "data/batches/sft-tiny.safetensors"

static const char *adapter(const char *model) {
    static const char *dir;
    if (dir) return dir;
    dir = tu_keep(tu_path("adapter"));
    ck_assert_msg(tu_sh("'%s' lora init --model '%s' --out '%s' --r 4 --alpha 8 --targets "
                        "all-linear --rslora --b-std 0.05 --seed 3",
                        tu_bin(), model, dir) == 0,
                  "%s", tu_last_output());
    return dir;
}

START_TEST(verify_lora_every_group) {
    const char *m = tu_model("qwen2-tiny", 1), *a = adapter(m);
    const char *out = tu_path("verify-lora.json");
    int rc = tu_sh("timeout 300 '%s' verify --model '%s' --batch " BATCH " --lora '%s' --block 4 "
                   "--chunks 8,7 --threads 1,2 --devices cpu,cuda-emu --json > '%s'",
                   tu_bin(), m, a, out);
    char *text = tu_slurp(out, NULL);
    cJSON *j = cJSON_Parse(text);
    ck_assert_msg(rc == 0 && j, "exit %d: %.2000s %.500s", rc, text, tu_last_output());
    free(text);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "pass")));
    const cJSON *g;
    int groups = 0;
    cJSON_ArrayForEach(g, cJSON_GetObjectItemCaseSensitive(j, "groups")) {
        const cJSON *rows = cJSON_GetObjectItemCaseSensitive(g, "rows");
        const char *title = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(g, "group"));
        ck_assert_msg(cJSON_GetArraySize(rows) == 2 * 7 * 2, "%s: %d rows", title,
                      cJSON_GetArraySize(rows));
        const char *name = cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(rows, 0), "tensor"));
        ck_assert_msg(name && strstr(name, "base_model.model.") && strstr(name, ".lora_"),
                      "%s: row %s", title, name ? name : "(none)");
        groups++;
    }
    ck_assert_int_eq(groups, 9);
    cJSON_Delete(j);
}
END_TEST

/* Their file: our fp32 adapter gradient with one planted bug (_i), or none (_i = 0). */
START_TEST(audit_lora) {
    const char *m = tu_model("qwen2-tiny", 1), *a = adapter(m);
    const char *g = tu_path("theirs-%d.safetensors", (int)_i);
    ck_assert_msg(tu_sh("'%s' grad --model '%s' --batch " BATCH " --lora '%s' --block 4 --out '%s'",
                        tu_bin(), m, a, g) == 0,
                  "%s", tu_last_output());
    const char *b2 = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight";
    const char *a0 = "base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight";
    if (_i) {
        tu_tensors ts;
        tu_tensors_load(&ts, g);
        const char *name = _i == 1 ? b2 : a0;
        int k = tu_tensors_index(&ts, name);
        float *v = ts.data[k];
        for (int64_t e = 0; e < ts.e[k].shape[0] * ts.e[k].shape[1]; e++)
            v[e] = _i == 1 ? 2 * v[e] : 0;
        if (_i == 3) ts.e[k] = ts.e[--ts.n]; /* missing altogether */
        sbp_err err = {0};
        ck_assert_msg(sbp_st_write(g, ts.e, ts.n, NULL, &err) == SBP_OK, "%s", err.msg);
        tu_tensors_free(&ts);
    }
    int rc = tu_sh("timeout 300 '%s' verify audit --model '%s' --batch " BATCH " --lora '%s' "
                   "--grads '%s' --block 4",
                   tu_bin(), m, a, g);
    const char *out = tu_last_output();
    if (_i == 0) {
        ck_assert_msg(rc == 0 && strstr(out, "28 of 28 tensors pass"), "exit %d: %s", rc, out);
    } else {
        ck_assert_msg(rc == 1, "planted bug %d passed (exit %d): %s", (int)_i, rc, out);
        ck_assert_msg(strstr(out, _i == 1 ? b2 : a0), "%s", out);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("verifylora");
    TCase *tc = tcase_create("verifylora");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, verify_lora_every_group);
    tcase_add_loop_test(tc, audit_lora, 0, 4);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
