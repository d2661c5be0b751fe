/* test_options.c — the options several commands share (src/cli/options.c): each command that takes
 * one refuses a bad value with exit 2 and the message naming that command and option, as each
 * command printed it before the parsing moved into one place; and the values reach the command
 * (a plan's heading shows the block and chunks given, --json gives JSON). Every case runs the
 * binary under `timeout`. Also what issue 56 found a user tripping on: a budget no step fits, the
 * option a command misses or does not know, one range for a LoRA rank, the thread count's one
 * rule and passive waiting, and the note when chunks give up the fast numerics' bitwise promise
 * (the last three on a tiny model). */
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
    /* one range for the rank, whichever side it is broken on (it said [1, 2^30] below and
     * [1, 65536] above) */
    {"lora init --model m --out o --r 0",
     "streambp lora init: --r must be a positive integer at most 65536, got \"0\""},
    {"lora init --model m --out o --r 100000",
     "streambp lora init: --r must be a positive integer at most 65536, got \"100000\""},
    {"plan --config data/models/qwen3-tiny.json --seq 8 --lora-r 65537",
     "streambp plan: --lora-r must be a positive integer at most 65536"},
    /* the option at fault is named, not only the usage printed */
    {"verify optim --bogus",
     "streambp verify optim: takes no options (but --help), got \"--bogus\""},
    {"verify digest --bogus", "streambp verify digest: unknown option \"--bogus\""},
    {"verify digest", "streambp verify digest: no FILE given"},
    {"verify digest a b", "streambp verify digest: one FILE only (2 arguments given)"},
    {"train --model m --jsonl data/train/counting.jsonl --seq 8 --out o",
     "streambp train: missing --steps N ("},
    {"train --jsonl data/train/counting.jsonl --seq 8 --steps 2",
     "streambp train: missing --model DIR, --out DIR ("},
    /* a budget the weights alone exceed: no table of zeros with exit 0 */
    {"plan --config data/configs/qwen3-8b.json --budget 1G",
     "streambp plan: the weights alone take 30.51 GiB (fp32 storage), more than the budget of "
     "1.00 GiB"},
    {"plan --config data/configs/qwen3-8b.json --storage bf16 --budget 17G --json",
     "the shortest step (T = 1) needs 30.52 GiB with ckpt"},
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

/* A budget some schedules fit and others do not: the table, and a note for those at T = 0. */
START_TEST(test_budget_some_schedules_fit) {
    /* T = 1: full 32769001571 bytes, the others 32765826083 */
    int rc = tu_sh("timeout 60 %s plan --config data/configs/qwen3-8b.json --storage bf16 "
                   "--budget 31249M",
                   tu_bin());
    const char *out = tu_last_output();
    ck_assert_msg(rc == 0, "%s", out);
    ck_assert_msg(strstr(out, "note: full does not fit 30.52 GiB even at T = 1"), "%s", out);
    ck_assert_msg(!strstr(out, "note: stream"), "%s", out);
}
END_TEST

/* OpenMP threads spin briefly, then sleep, unless the user chose a policy: the runtime's spin
 * count, as libgomp reports it (OMP_DISPLAY_ENV=verbose, the last report: the process's own after
 * it ran itself again), is 1000. Spinning 300,000 rounds made a loaded machine 10-100x slower
 * (issue 56); sleeping at once made a Zen 3 VM's tiny runs 3-7x slower (src/cli/main.c). */
START_TEST(test_brief_waiting_by_default) {
    const char *env = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u KMP_BLOCKTIME "
                      "OMP_DISPLAY_ENV=verbose";
    int rc = tu_sh("%s %s version 2>&1 | grep GOMP_SPINCOUNT | tail -1", env, tu_bin());
    if (rc != 0 || !strstr(tu_last_output(), "GOMP_SPINCOUNT")) {
        printf("test_brief_waiting_by_default: not GCC's libgomp; skipped\n");
        return;
    }
    ck_assert_msg(strstr(tu_last_output(), "GOMP_SPINCOUNT = '1000'"), "%s", tu_last_output());
    /* the user's choice stands */
    tu_sh("%s OMP_WAIT_POLICY=passive %s version 2>&1 | grep GOMP_SPINCOUNT | tail -1", env,
          tu_bin());
    ck_assert_msg(strstr(tu_last_output(), "'0'"), "%s", tu_last_output());
    tu_sh("%s OMP_WAIT_POLICY=active %s version 2>&1 | grep GOMP_SPINCOUNT | tail -1", env,
          tu_bin());
    ck_assert_msg(!strstr(tu_last_output(), "'1000'") && !strstr(tu_last_output(), "'0'"), "%s",
                  tu_last_output());
    tu_sh("%s GOMP_SPINCOUNT=1234 %s version 2>&1 | grep GOMP_SPINCOUNT | tail -1", env, tu_bin());
    ck_assert_msg(strstr(tu_last_output(), "'1234'"), "%s", tu_last_output());
    /* a libomp user's choice stands too: nothing is set for libgomp then either */
    tu_sh("%s KMP_BLOCKTIME=0 %s version 2>&1 | grep GOMP_SPINCOUNT | tail -1", env, tu_bin());
    ck_assert_msg(!strstr(tu_last_output(), "'1000'"), "%s", tu_last_output());
}
END_TEST

/* One default thread count for grad, train and bench: OMP_NUM_THREADS when set (grad and train
 * took every core whatever it said, bench 2), --threads over it. */
START_TEST(test_one_thread_rule) {
    const char *m = tu_model("qwen3-tiny", 1);
    const char *grad = "grad --batch data/batches/sft-tiny.safetensors --json --model";
    char with_two[700];
    snprintf(with_two, sizeof with_two, "%s --threads 2", m);
    const char *bench = "bench --config data/models/qwen3-tiny.json --seq 16 --schedules stream "
                        "--numerics fast --no-train --reps 1 --warmup 0 --json";
    struct {
        const char *env, *args, *arg2, *want;
    } runs[] = {
        {"OMP_NUM_THREADS=1", grad, m, "\"threads\":\t1,"},
        {"OMP_NUM_THREADS=3", grad, m, "\"threads\":\t3,"},
        {"OMP_NUM_THREADS=1", grad, with_two, "\"threads\":\t2,"},
        {"OMP_NUM_THREADS=1", bench, "", "\"threads\":\t1,"},
        {"OMP_NUM_THREADS=3", bench, "", "\"threads\":\t3,"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        int rc = tu_sh("%s timeout 120 %s %s %s 2>/dev/null", runs[i].env, tu_bin(), runs[i].args,
                       runs[i].arg2);
        ck_assert_msg(rc == 0 && strstr(tu_last_output(), runs[i].want),
                      "`%s streambp %s %s` exited %d, not %s:\n%s", runs[i].env, runs[i].args,
                      runs[i].arg2, rc, runs[i].want, tu_last_output());
    }
    /* train records it in trainer_state.json's "run" */
    const char *run = tu_path("run-threads");
    int rc = tu_sh("OMP_NUM_THREADS=1 timeout 120 %s train --model %s --jsonl "
                   "data/train/counting.jsonl --seq 16 --steps 1 --save-every 1 --out %s",
                   tu_bin(), m, run);
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    rc = tu_sh("grep -h '\"threads\"' %s/checkpoint-1/trainer_state.json", run);
    ck_assert_msg(rc == 0 && strstr(tu_last_output(), "\"threads\":\t1,"), "%s", tu_last_output());
}
END_TEST

/* The fast numerics' bitwise promise needs chunks that are block multiples: giving it up is said
 * on stderr (it was silent), and only then. */
START_TEST(test_chunk_note) {
    const char *m = tu_model("qwen3-tiny", 1);
    struct {
        const char *opts;
        int note;
    } runs[] = {
        {"--chunk 6 --block 4", 1},
        {"--logit-chunk 6 --block 4", 1},
        {"--schedule full --chunked-logits --logit-chunk 6 --block 4", 1},
        {"--chunk 8 --logit-chunk 4 --block 4", 0},
        {"--chunk 6 --block 4 --numerics portable", 0},
        {"--schedule full --chunk 6 --block 4", 0},   /* full does not chunk the layers */
        {"--chunk 6 --block 4 --device cuda-emu", 0}, /* the portable numerics there */
        {"--chunk 100000 --block 512", 0},            /* the chunk holds the whole row */
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        int rc = tu_sh("timeout 120 %s grad --model %s --batch data/batches/sft-tiny.safetensors "
                       "--threads 1 %s 2>&1 >/dev/null",
                       tu_bin(), m, runs[i].opts);
        const char *out = tu_last_output();
        ck_assert_msg(rc == 0, "%s: %s", runs[i].opts, out);
        ck_assert_msg(!!strstr(out, "not bit for bit") == runs[i].note, "%s: %s", runs[i].opts,
                      out[0] ? out : "(nothing on stderr)");
    }
    ck_assert(tu_sh("timeout 120 %s grad --model %s --batch data/batches/sft-tiny.safetensors "
                    "--threads 1 --chunk 6 --block 4 2>&1 >/dev/null",
                    tu_bin(), m) == 0);
    ck_assert_msg(strstr(tu_last_output(), "--chunk 6 is not a multiple of --block 4"), "%s",
                  tu_last_output());
    int rc = tu_sh("timeout 120 %s train --model %s --jsonl data/train/counting.jsonl --seq 16 "
                   "--steps 1 --threads 1 --chunk 6 --block 4 --out %s 2>&1 >/dev/null",
                   tu_bin(), m, tu_path("run-chunk"));
    ck_assert_msg(rc == 0 && strstr(tu_last_output(), "streambp train: note: --chunk 6 is not"),
                  "%s", tu_last_output());
}
END_TEST

int main(void) {
    Suite *s = suite_create("options");
    TCase *tc = tcase_create("options");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_bad_values_name_command_and_option);
    tcase_add_test(tc, test_values_reach_the_command);
    tcase_add_test(tc, test_budget_some_schedules_fit);
    tcase_add_test(tc, test_brief_waiting_by_default);
    tcase_add_test(tc, test_one_thread_rule);
    tcase_add_test(tc, test_chunk_note);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
