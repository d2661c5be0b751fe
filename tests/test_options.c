/* test_options.c — the options several commands share (src/cli/options.c): each command that takes
 * one refuses a bad value with exit 2 and the message naming that command and option, as each
 * command printed it before the parsing moved into one place; and the values reach the command
 * (a plan's heading shows the block and chunks given, --json gives JSON). Every case runs the
 * binary under `timeout`; none needs a model. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *args, *message;
} bad[] = {
    {"grad --block 0",
     "streambp grad: --block must be a positive integer at most 1048576, got \"0\""},
    {"grad --chunk a",
     "streambp grad: --chunk must be a positive integer at most 1073741824, got \"a\""},
    {"grad --logit-chunk 0", "streambp grad: --logit-chunk must be a positive integer at most"},
    {"grad --threads -1",
     "streambp grad: --threads must be a positive integer at most 4096, got \"-1\""},
    {"grad --schedule x", "streambp grad: --schedule must be full, ckpt or stream, got \"x\""},
    {"grad --numerics y", "streambp grad: --numerics must be fast or portable, got \"y\""},
    {"grad --device z", "streambp grad: --device must be cpu, cuda or cuda-emu, got \"z\""},
    {"grad --unattended q",
     "streambp grad: --unattended must be zero, hf-eager or hf-sdpa, got \"q\""},
    {"grad --json=1", "option '--json' doesn't allow an argument"},
    {"plan --block 0", "streambp plan: --block must be a positive integer at most 1048576"},
    {"plan --chunk 0", "streambp plan: --chunk must be a positive integer"},
    {"plan --logit-chunk x", "streambp plan: --logit-chunk must be a positive integer"},
    {"plan --paper --block 3", "streambp plan: --paper takes only --budget and --json"},
    {"verify --block 0", "streambp verify: --block must be a positive integer at most 1048576"},
    {"verify --unattended x", "streambp verify: --unattended must be zero, hf-eager or hf-sdpa"},
    {"verify audit --block 0", "streambp verify audit: --block must be a positive integer"},
    {"verify audit --numerics x", "streambp verify audit: --numerics must be fast or portable"},
    {"verify audit --unattended x", "streambp verify audit: --unattended must be zero"},
    {"verify fd --block 0", "streambp verify fd: --block must be a positive integer"},
    {"verify fd --chunk 0", "streambp verify fd: --chunk must be a positive integer"},
    {"verify fd --schedule q", "streambp verify fd: unknown schedule \"q\""},
    {"verify diff --json=3", "option '--json' doesn't allow an argument"},
    {"verify --suite --json=1", "option '--json' doesn't allow an argument"},
    {"init --seed -1", "streambp init: --seed must be an integer in [0, 2^64), got \"-1\""},
    {"lora init --seed x", "streambp lora init: --seed must be an integer in [0, 2^64), got \"x\""},
};

START_TEST(test_bad_values_name_command_and_option) {
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = tu_sh("timeout 60 %s %s", tu_bin(), bad[i].args);
        const char *out = tu_last_output();
        ck_assert_msg(rc == 2, "`streambp %s` exited %d, expected 2:\n%s", bad[i].args, rc, out);
        ck_assert_msg(strstr(out, bad[i].message), "`streambp %s` does not say \"%s\":\n%s",
                      bad[i].args, bad[i].message, out);
        ck_assert_msg(!strstr(out, "is not an option of this command"), "%s", out);
    }
}
END_TEST

/* The values reach the command: a plan's heading and its JSON. */
START_TEST(test_values_reach_the_command) {
    int rc = tu_sh("timeout 60 %s plan --config data/models/qwen3-tiny.json --seq 64 --block 8 "
                   "--chunk 16 --logit-chunk 4",
                   tu_bin());
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    ck_assert_msg(strstr(tu_last_output(), "block 8, stream chunk 16, logit chunk 4"), "%s",
                  tu_last_output());
    rc = tu_sh("timeout 60 %s plan --model data/models --config data/models/qwen3-tiny.json "
               "--seq 64",
               tu_bin());
    ck_assert_msg(rc == 2 && strstr(tu_last_output(), "give --config or --model"), "%s",
                  tu_last_output());
    rc = tu_sh("timeout 60 %s plan --config data/models/qwen3-tiny.json --seq 64 --json", tu_bin());
    ck_assert_msg(rc == 0 && tu_last_output()[0] == '{', "%s", tu_last_output());
    ck_assert_msg(strstr(tu_last_output(), "\"schedules\""), "%s", tu_last_output());
}
END_TEST

int main(void) {
    Suite *s = suite_create("options");
    TCase *tc = tcase_create("options");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_bad_values_name_command_and_option);
    tcase_add_test(tc, test_values_reach_the_command);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
