/* test_cuda_emu.c — the CUDA op tables in the SIMT emulator (--device cuda-emu) against the
 * portable CPU numerics, bitwise: `streambp verify --devices cpu,cuda-emu` on every bundled
 * family and every objective, every schedule with a block-multiple and a ragged chunk, both
 * precisions. (The golden digests under cuda-emu, in a shuffled thread order, run from
 * `make test` too: tests/test_golden.c with SBP_GOLDEN_DEVICE=cuda-emu.) */
#include "testutil.h"

#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

/* the last two: head sizes 24 and 72, not powers of two nor multiples of the warp (the attention
 * scale is inexact there, and the dK/dV kernel takes another head_dim bucket) */
static const char *families[] = {"qwen3-tiny", "qwen2-tiny", "llama3-tiny", "qwen2-hd24",
                                 "qwen3-hd72"};

static const struct {
    const char *batch, *options;
} objectives[] = {
    {"data/batches/sft-tiny.safetensors", ""},
    {"data/batches/dpo-tiny.safetensors", "--objective dpo --beta 0.1"},
    {"data/batches/grpo-tiny.safetensors",
     "--objective grpo --loss-type dr_grpo --beta 0.04 --temperature 0.7"},
};

/* Under the sanitizers the emulator runs every thread of every kernel instrumented, about ten
 * times slower: one family and objective there (every kernel still runs under ASan), all of
 * them in the plain build. */
#if defined(__SANITIZE_ADDRESS__)
enum { N_CASES = 1 };
#define PRECISIONS "fp32"
#define RUNS       6
#else
enum {
    N_CASES = 11
}; /* the first three families with every objective, the last two with SFT
    * (their other objectives run in the golden digests under cuda-emu) */
#define PRECISIONS "fp32,fp64"
#define RUNS       12
#endif

/* _i < 9: family (_i / 3), objective (_i % 3); then the other families with SFT */
START_TEST(devices_group) {
    const char *family = families[_i < 9 ? _i / 3 : 3 + (_i - 9)];
    const int k = _i < 9 ? _i % 3 : 0;
    int rc = tu_sh("'%s' verify --model '%s' --batch %s %s --devices cpu,cuda-emu --numerics "
                   "portable --threads 1 --chunks 8,7 --block 4 --precisions " PRECISIONS " --json",
                   tu_bin(), tu_model(family, 3), objectives[k].batch, objectives[k].options);
    const char *out = tu_last_output();
    cJSON *j = cJSON_Parse(out);
    ck_assert_msg(j != NULL, "%s %s: no JSON from verify (exit %d): %.600s", family,
                  objectives[k].batch, rc, out);
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(j, "groups"), *g;
    int comparisons = -1, failed = -1;
    cJSON_ArrayForEach(g, groups) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(g, "group");
        if (cJSON_IsString(t) && strcmp(t->valuestring, "devices") == 0) {
            comparisons = cJSON_GetObjectItemCaseSensitive(g, "comparisons")->valueint;
            failed = cJSON_GetObjectItemCaseSensitive(g, "failed_tensors")->valueint;
        }
    }
    /* full, ckpt at chunks 8 and 7 (chunked logits), stream at 8 and 7, ckpt: 6 runs a precision */
    ck_assert_msg(comparisons == RUNS, "%s: %d device comparisons, want %d", family, comparisons,
                  RUNS);
    ck_assert_msg(failed == 0 && rc == 0, "%s %s: %d tensors differ on cuda-emu (exit %d)", family,
                  objectives[k].batch, failed, rc);
    cJSON_Delete(j);
}
END_TEST

/* Without a GPU, --device cuda is a clear usage error that writes nothing. */
START_TEST(no_gpu_is_a_clear_error) {
    const char *out = tu_path("no-gpu.safetensors");
    int rc = tu_sh("'%s' grad --model '%s' --batch data/batches/sft-tiny.safetensors --device "
                   "cuda --out '%s'",
                   tu_bin(), tu_model("qwen3-tiny", 3), out);
    if (rc == 0) { /* a GPU is here after all: then the run must equal the portable CPU run */
        printf("a CUDA device is present: --device cuda ran\n");
        return;
    }
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(tu_last_output(), "cuda") != NULL, "message: %s", tu_last_output());
    ck_assert(!tu_exists(out));
    rc = tu_sh("'%s' grad --model '%s' --batch data/batches/sft-tiny.safetensors --device "
               "cuda-emu --numerics fast",
               tu_bin(), tu_model("qwen3-tiny", 3));
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(tu_last_output(), "portable") != NULL, "message: %s", tu_last_output());
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("cuda-emu");
    TCase *tc = tcase_create("devices");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, devices_group, 0, N_CASES);
    tcase_add_test(tc, no_gpu_is_a_clear_error);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
