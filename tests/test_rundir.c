/* test_rundir.c — issue 35 item 4's number checks: trainer_state.json is read by one parser
 * (sbp_train_state_parse) that range-checks every number before it becomes an integer and names
 * the field; a huge, negative or fractional step, token count, epoch or item is an error, never
 * a wrapped or truncated value, and `train --resume` refuses such a checkpoint with exit 2.
 * Before the parser, read_checkpoint converted the doubles unchecked (1e300 is undefined
 * behaviour, 4.5 resumed at item 4). The symlink, hash, moment and rerun cases of items 1, 4
 * and 5 are in test_cleanup.c and test_resume.c. */
#include "testutil.h"
#include "../src/io/train_state.h"

#include <cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A minimal valid state with the numbers given as JSON text. */
static const char *state(const char *step, const char *tokens, const char *epoch,
                         const char *item) {
    char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"format\": \"streambp-train-1\", \"step\": %s, \"tokens\": %s, "
             "\"data_position\": {\"epoch\": %s, \"item\": %s, \"rng_at_epoch_start\": "
             "[\"1\", \"2\", \"3\", \"ffffffffffffffff\"]}, \"settings\": {\"seq\": \"32\"}}",
             step, tokens, epoch, item);
    return tu_keep(buf);
}

static sbp_status parse(sbp_train_state *s, const char *text, sbp_err *err) {
    memset(err, 0, sizeof *err);
    return sbp_train_state_parse(s, text, strlen(text), "st.json", err);
}

START_TEST(a_valid_state_reads_exactly) {
    sbp_train_state s;
    sbp_err err;
    ck_assert_msg(parse(&s, state("2", "9007199254740992", "0", "4"), &err) == SBP_OK, "%s",
                  err.msg);
    ck_assert_int_eq(s.step, 2);
    ck_assert_int_eq(s.tokens, (int64_t)1 << 53);
    ck_assert_int_eq(s.item, 4);
    ck_assert(s.rng[3] == UINT64_MAX);
    ck_assert_ptr_null(s.files);
    sbp_train_state_free(&s);
}
END_TEST

START_TEST(every_count_range_checked_and_named) {
    static const char *const bad[] = {"1e300", "-1", "4.5", "9007199254740994", "\"3\"", "null"};
    static const char *const field[] = {"\"step\"", "\"tokens\"", "\"data_position.epoch\"",
                                        "\"data_position.item\""};
    for (int f = 0; f < 4; f++)
        for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
            const char *v[4] = {"2", "128", "0", "4"};
            v[f] = bad[b];
            sbp_train_state s;
            sbp_err err;
            ck_assert_msg(parse(&s, state(v[0], v[1], v[2], v[3]), &err) == SBP_EFORMAT,
                          "%s = %s accepted", field[f], bad[b]);
            ck_assert_msg(strstr(err.msg, field[f]) && strstr(err.msg, "st.json"),
                          "%s = %s: the message does not name the field: %s", field[f], bad[b],
                          err.msg);
            ck_assert_ptr_null(s.root);
        }
}
END_TEST

START_TEST(file_names_stay_in_the_checkpoint) {
    static const char *const names[] = {"../model.safetensors", "..", "a/b", "trainer_state.json",
                                        ""};
    const char *hex = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        cJSON *o = cJSON_Parse(state("2", "128", "0", "4"));
        cJSON *files = cJSON_AddObjectToObject(o, "files");
        cJSON_AddStringToObject(files, names[i], hex);
        char *text = cJSON_PrintUnformatted(o);
        sbp_train_state s;
        sbp_err err;
        ck_assert_msg(parse(&s, text, &err) == SBP_EFORMAT, "file name \"%s\" accepted", names[i]);
        free(text), cJSON_Delete(o);
    }
    /* a hash that is not 64 lowercase hex digits */
    cJSON *o = cJSON_Parse(state("2", "128", "0", "4"));
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "files"), "loss.csv", "ABCD");
    char *text = cJSON_PrintUnformatted(o);
    sbp_train_state s;
    sbp_err err;
    ck_assert_int_eq(parse(&s, text, &err), SBP_EFORMAT);
    ck_assert_msg(strstr(err.msg, "loss.csv"), "%s", err.msg);
    free(text), cJSON_Delete(o);
}
END_TEST

START_TEST(rng_words_are_hex_of_16_digits_at_most) {
    const char *long_word = "{\"step\": 1, \"tokens\": 1, \"data_position\": {\"epoch\": 0, "
                            "\"item\": 0, \"rng_at_epoch_start\": [\"11111111111111111\", \"2\", "
                            "\"3\", \"4\"]}, \"settings\": {}}";
    sbp_train_state s;
    sbp_err err;
    ck_assert_int_eq(parse(&s, long_word, &err), SBP_EFORMAT);
    ck_assert_msg(strstr(err.msg, "rng_at_epoch_start[0]"), "%s", err.msg);
}
END_TEST

/* A real checkpoint whose trainer_state.json (not itself hashed) has a field edited: resume
 * refuses it with exit 2 and names the field. */
START_TEST(resume_refuses_an_edited_count) {
    const char *model = tu_model("qwen3-tiny", 1);
    static const char *const edits[][3] = {{"step", NULL, "1e300"},
                                           {"tokens", NULL, "-5"},
                                           {"data_position", "item", "2.5"},
                                           {"data_position", "epoch", "1e19"}};
    for (int i = 0; i < 4; i++) {
        const char *run = tu_keep(tu_path("rundir-edit-%d", i));
        int rc = tu_sh("timeout 120 '%s' train --model '%s' --jsonl data/train/counting.jsonl "
                       "--seq 32 --batch-size 2 --block 16 --threads 1 --lr 1e-2 --steps 4 "
                       "--save-every 2 --stop-at 2 --out '%s'",
                       tu_bin(), model, run);
        ck_assert_msg(rc == 0, "%s", tu_last_output());
        const char *sp = tu_keep(tu_path("rundir-edit-%d/checkpoint-2/trainer_state.json", i));
        char *text = tu_slurp(sp, NULL);
        cJSON *o = cJSON_Parse(text);
        free(text);
        cJSON *parent = edits[i][1] ? cJSON_GetObjectItemCaseSensitive(o, edits[i][0]) : o;
        const char *key = edits[i][1] ? edits[i][1] : edits[i][0];
        ck_assert(
            cJSON_ReplaceItemInObjectCaseSensitive(parent, key, cJSON_CreateRaw(edits[i][2])));
        char *out = cJSON_Print(o);
        tu_spit(sp, out, strlen(out));
        free(out), cJSON_Delete(o);
        char *snap = tu_snapshot(run);
        rc = tu_sh("timeout 120 '%s' train --model '%s' --jsonl data/train/counting.jsonl "
                   "--seq 32 --batch-size 2 --block 16 --threads 1 --lr 1e-2 --steps 4 "
                   "--save-every 2 --out '%s' --resume '%s'",
                   tu_bin(), model, run, run);
        ck_assert_msg(rc == 2, "%s = %s: exit %d, expected 2: %s", key, edits[i][2], rc,
                      tu_last_output());
        ck_assert_msg(strstr(tu_last_output(), key), "%s = %s: not named: %s", key, edits[i][2],
                      tu_last_output());
        char *now = tu_snapshot(run);
        ck_assert_msg(strcmp(snap, now) == 0, "a refused resume changed the run directory");
        free(snap), free(now);
    }
}
END_TEST

/* The library picks the newest checkpoint that is a real directory with a regular state (a link
 * planted as checkpoint-9 is not it), reads only decimal names, and resume names a damaged
 * newest checkpoint with the newest that verifies. */
START_TEST(newest_checkpoint_and_resume_point) {
    ck_assert_int_eq(sbp_checkpoint_number("checkpoint-12"), 12);
    static const char *const bad[] = {"checkpoint-",
                                      "checkpoint-+5",
                                      "checkpoint- 5",
                                      "checkpoint-5x",
                                      "checkpoint-99999999999999999999",
                                      "checkpoint-5.tmp.123.AbCdEf"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ck_assert_msg(sbp_checkpoint_number(bad[i]) == -1, "%s read as a checkpoint", bad[i]);
    const char *model = tu_model("qwen3-tiny", 1);
    const char *run = tu_keep(tu_path("rundir-newest"));
    int rc = tu_sh("timeout 120 '%s' train --model '%s' --jsonl data/train/counting.jsonl "
                   "--seq 32 --batch-size 2 --block 16 --threads 1 --lr 1e-2 --steps 6 "
                   "--save-every 2 --stop-at 4 --out '%s'",
                   tu_bin(), model, run);
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    /* a link to a copy of checkpoint-4 outside, under a newer name */
    const char *elsewhere = tu_keep(tu_new_dir("rundir-elsewhere"));
    ck_assert_int_eq(tu_sh("cp -r '%s/checkpoint-4' '%s/ck'", run, elsewhere), 0);
    ck_assert_int_eq(symlink(tu_join(elsewhere, "ck"), tu_join(run, "checkpoint-9")), 0);
    char out[4300];
    ck_assert_int_eq(sbp_checkpoint_newest(out, sizeof out, run, LONG_MAX), 4);
    ck_assert_str_eq(out, tu_join(run, "checkpoint-4"));
    ck_assert_int_eq(sbp_checkpoint_newest(out, sizeof out, run, 4), 2);
    ck_assert_int_eq(sbp_checkpoint_newest(out, sizeof out, run, 2), -1);
    int recorded = 0;
    sbp_err err = {0};
    ck_assert_msg(sbp_checkpoint_resume_point(out, sizeof out, run, &recorded, &err) == SBP_OK,
                  "%s", err.msg);
    ck_assert(recorded);
    /* damage checkpoint-4's optimizer file: resume names it and offers checkpoint-2 */
    const char *opt = tu_join(run, "checkpoint-4/optimizer.safetensors");
    size_t n;
    char *bytes = tu_slurp(opt, &n);
    bytes[n - 1] ^= 1;
    tu_spit(opt, bytes, n);
    free(bytes);
    ck_assert_int_eq(sbp_checkpoint_resume_point(out, sizeof out, run, &recorded, &err),
                     SBP_EINPUT);
    ck_assert_msg(strstr(err.msg, "checkpoint-4") && strstr(err.msg, "optimizer.safetensors") &&
                      strstr(err.msg, "checkpoint-2: resume from it"),
                  "%s", err.msg);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("rundir");
    TCase *tc = tcase_create("rundir");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, a_valid_state_reads_exactly);
    tcase_add_test(tc, every_count_range_checked_and_named);
    tcase_add_test(tc, file_names_stay_in_the_checkpoint);
    tcase_add_test(tc, rng_words_are_hex_of_16_digits_at_most);
    tcase_add_test(tc, resume_refuses_an_edited_count);
    tcase_add_test(tc, newest_checkpoint_and_resume_point);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
