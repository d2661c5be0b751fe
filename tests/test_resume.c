/* test_resume.c — issue 35 items 4 and 5: checkpoints prove their contents (every file's SHA-256
 * in trainer_state.json, checked on resume; moments' shapes, finiteness and sign checked on
 * load; a damaged newest checkpoint named, never silently replaced by an older one), and a run
 * that failed can be rerun (logs of a run that died before its first checkpoint do not block a
 * fresh run; a final save on a full disk never leaves a config without its weights). */
#include "testutil.h"

#include <cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TRAIN                                                                                      \
    "timeout 120 '%s' train --model '%s' --jsonl data/train/counting.jsonl --seq 32 "              \
    "--batch-size 2 --block 16 --threads 1 --lr 1e-2"

static const char *model(void) {
    return tu_model("qwen3-tiny", 1);
}

/* A run of 4 steps with checkpoints 2 and 4 (stopped at 4 of 6). */
static const char *run_with_checkpoints(const char *name) {
    const char *out = tu_keep(tu_path("%s", name));
    int rc =
        tu_sh(TRAIN " --steps 6 --save-every 2 --stop-at 4 --out '%s'", tu_bin(), model(), out);
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    return out;
}

/* Rewrites checkpoint file `file`'s recorded hash in trainer_state.json to its current one, so
 * that a test reaches the checks behind the hash. */
static void rehash(const char *ck, const char *file) {
    char hex[65];
    sbp_err err = {0};
    ck_assert_msg(sbp_file_sha256(hex, tu_join(ck, file), &err) == SBP_OK, "%s", err.msg);
    const char *sp = tu_join(ck, "trainer_state.json");
    char *text = tu_slurp(sp, NULL);
    cJSON *o = cJSON_Parse(text);
    free(text);
    cJSON *files = cJSON_GetObjectItemCaseSensitive(o, "files");
    ck_assert_msg(cJSON_IsObject(files), "trainer_state.json lists no files");
    cJSON_ReplaceItemInObjectCaseSensitive(files, file, cJSON_CreateString(hex));
    char *out = cJSON_Print(o);
    tu_spit(sp, out, strlen(out));
    free(out), cJSON_Delete(o);
}

START_TEST(a_tampered_checkpoint_is_named) {
    const char *run = run_with_checkpoints("tamper");
    char *state = tu_slurp(tu_path("tamper/checkpoint-4/trainer_state.json"), NULL);
    ck_assert_msg(strstr(state, "\"files\"") && strstr(state, "optimizer.safetensors") &&
                      strstr(state, "model.safetensors") && strstr(state, "loss.csv"),
                  "%s", state);
    free(state);
    /* one byte of the moments changed after the checkpoint was written */
    ck_assert_int_eq(tu_sh("f='%s/checkpoint-4/optimizer.safetensors'; "
                           "printf '\\001' | dd of=\"$f\" bs=1 seek=$(($(stat -c %%s \"$f\") - 3)) "
                           "conv=notrunc 2>/dev/null",
                           run),
                     0);
    char *before = tu_snapshot(run);
    int rc = tu_sh(TRAIN " --steps 6 --save-every 2 --out '%s' --resume '%s'", tu_bin(), model(),
                   run, run);
    const char *o = tu_last_output();
    ck_assert_msg(rc == 2, "exit %d: %s", rc, o);
    ck_assert_msg(strstr(o, "checkpoint-4") && strstr(o, "optimizer.safetensors") &&
                      strstr(o, "SHA-256") && strstr(o, "checkpoint-2"),
                  "the error does not name the damaged file and the one that verifies: %s", o);
    char *after = tu_snapshot(run);
    ck_assert_msg(strcmp(before, after) == 0, "a refused resume changed the run directory");
    free(before), free(after);
    /* the checkpoint it names resumes */
    rc = tu_sh(TRAIN " --steps 6 --save-every 2 --out '%s' --resume '%s/checkpoint-2'", tu_bin(),
               model(), run, run);
    ck_assert_msg(rc == 0, "%s", tu_last_output());
}
END_TEST

START_TEST(moments_checked_on_load) {
    const char *run = run_with_checkpoints("moments");
    const char *ck = tu_keep(tu_join(run, "checkpoint-4"));
    const char *opt = tu_keep(tu_join(ck, "optimizer.safetensors"));
    static const struct {
        const char *tensor, *expect;
        float value;
        int transpose;
    } cases[] = {
        {"model.layers.0.mlp.up_proj.weight.exp_avg_sq", "never negative", -1.0f, 0},
        {"model.layers.1.self_attn.q_proj.weight.exp_avg", "element 3 is nan", NAN, 0},
        {"model.layers.0.self_attn.o_proj.weight.exp_avg_sq", "inf", INFINITY, 0},
        {"model.layers.0.mlp.down_proj.weight.exp_avg", "shape", 0, 1},
    };
    char *orig = tu_slurp(opt, NULL);
    size_t n;
    free(orig);
    orig = tu_slurp(opt, &n);
    for (int c = 0; c < 4; c++) {
        tu_spit(opt, orig, n);
        tu_tensors ts;
        tu_tensors_load(&ts, opt);
        const int k = tu_tensors_index(&ts, cases[c].tensor);
        if (cases[c].transpose) { /* the same count of elements, another shape */
            const int64_t r = ts.e[k].shape[0];
            ts.e[k].shape[0] = ts.e[k].shape[1], ts.e[k].shape[1] = r;
        } else {
            ((float *)ts.data[k])[3] = cases[c].value;
        }
        sbp_err err = {0};
        const char *meta[] = {"optimizer", "AdamW", "step", "4", NULL};
        ck_assert_msg(sbp_st_write(opt, ts.e, ts.n, meta, &err) == SBP_OK, "%s", err.msg);
        tu_tensors_free(&ts);
        rehash(ck, "optimizer.safetensors");
        int rc = tu_sh(TRAIN " --steps 6 --save-every 2 --out '%s' --resume '%s'", tu_bin(),
                       model(), run, ck);
        ck_assert_msg(rc == 2 && strstr(tu_last_output(), cases[c].tensor) &&
                          strstr(tu_last_output(), cases[c].expect),
                      "%s: exit %d: %s", cases[c].tensor, rc, tu_last_output());
    }
    free(orig);
}
END_TEST

START_TEST(a_run_that_died_early_can_be_rerun) {
    /* what a run killed (or out of memory) before its first checkpoint leaves: the logs */
    const char *out = tu_keep(tu_new_dir("early"));
    tu_spit(tu_join(out, "loss.csv"), "step,epoch,loss,lr,grad_norm,targets,tokens\n", 44);
    tu_spit(tu_join(out, "timing.csv"), "x\n", 2);
    int rc = tu_sh(TRAIN " --steps 2 --out '%s' --resume '%s'", tu_bin(), model(), out, out);
    ck_assert_msg(rc == 2 && strstr(tu_last_output(), "without --resume"), "exit %d: %s", rc,
                  tu_last_output());
    rc = tu_sh(TRAIN " --steps 2 --out '%s'", tu_bin(), model(), out);
    ck_assert_msg(rc == 0, "a fresh run refused the directory: %s", tu_last_output());
    ck_assert_msg(strstr(tu_last_output(), "before its first checkpoint"), "%s", tu_last_output());
    ck_assert(tu_exists(tu_join(out, "model.safetensors")));
    /* a directory holding a real run is still refused */
    rc = tu_sh(TRAIN " --steps 2 --out '%s'", tu_bin(), model(), out);
    ck_assert_msg(rc == 2 && strstr(tu_last_output(), "already holds"), "exit %d: %s", rc,
                  tu_last_output());
}
END_TEST

START_TEST(full_disk_final_save) {
    /* writes past RLIMIT_FSIZE fail with EFBIG (SIGXFSZ ignored): the final model.safetensors
     * (about 400 KB here) cannot be written, the logs can */
    const char *out = tu_keep(tu_path("fulldisk"));
    int rc = tu_sh("sh -c \"trap '' XFSZ; ulimit -f 200; exec " TRAIN " --steps 2 --out '%s'\"",
                   tu_bin(), model(), out);
    ck_assert_msg(rc == 2, "exit %d: %s", rc, tu_last_output());
    ck_assert_msg(!tu_exists(tu_join(out, "config.json")),
                  "a config.json was left without its weights");
    tu_assert_no_tmp(out);
}
END_TEST

START_TEST(non_finite_weights_not_saved) {
    /* a learning rate past the float range sends the weights to infinity in one step */
    const char *out = tu_keep(tu_path("inf-weights"));
    int rc =
        tu_sh(TRAIN " --steps 1 --warmup-steps 0 --out '%s' --lr 1e39", tu_bin(), model(), out);
    ck_assert_msg(rc != 0, "a run with infinite weights exited 0: %s", tu_last_output());
    ck_assert_msg(!tu_exists(tu_join(out, "model.safetensors")), "infinite weights were saved");
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("resume");
    TCase *tc = tcase_create("resume");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, a_tampered_checkpoint_is_named);
    tcase_add_test(tc, moments_checked_on_load);
    tcase_add_test(tc, a_run_that_died_early_can_be_rerun);
    tcase_add_test(tc, full_disk_final_save);
    tcase_add_test(tc, non_finite_weights_not_saved);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
