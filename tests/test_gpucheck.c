/* test_gpucheck.c — `make gpu-check` without a GPU: cuda/gpu-check.sh run against stubs of
 * nvidia-smi, compute-sanitizer, the binary and the golden test, each of which can be told to
 * fail. A failing stage must fail the check even where its output goes through a pipe (the bench
 * through tee once hid a crash), the time estimate must come before the first stage, and the
 * SBP_CUDA_SYNC mode of the CUDA tables must keep the bits and refuse values it does not know. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A directory of stubs; $STUB_FAIL names the command word (verify, bench, golden, sanitizer)
 * that exits 1 after printing its output. */
static const char *stubs(void) {
    static const char *dir;
    if (dir) return dir;
    dir = tu_keep(tu_new_dir("gpu-stubs"));
    static const char smi[] = "#!/bin/sh\n"
                              "case \"$*\" in *-L*) echo 'GPU 0: Stub H200';;\n"
                              "*memory.free*) echo 143000;; esac\n";
    static const char bin[] = "#!/bin/sh\n"
                              "case \"$1\" in\n"
                              "plan) echo '  \"parameters\":\t596049920,';;\n"
                              "init) while [ $# -gt 1 ]; do [ \"$1\" = --out ] && mkdir -p \"$2\";"
                              " shift; done;;\n"
                              "*) echo \"stub $1 ran\";"
                              " [ \"${STUB_FAIL:-}\" = \"$1\" ] && exit 1;;\n"
                              "esac\nexit 0\n";
    static const char golden[] = "#!/bin/sh\necho 'golden stub ran'\n"
                                 "[ \"${STUB_FAIL:-}\" = golden ] && exit 1\nexit 0\n";
    static const char san[] = "#!/bin/sh\n[ \"${STUB_FAIL:-}\" = sanitizer ] && exit 3\n"
                              "shift 4\nexec \"$@\"\n";
    const char *names[] = {"nvidia-smi", "streambp", "test_golden", "compute-sanitizer"};
    const char *texts[] = {smi, bin, golden, san};
    for (int i = 0; i < 4; i++) {
        const char *p = tu_join(dir, names[i]);
        tu_spit(p, texts[i], strlen(texts[i]));
        ck_assert_int_eq(chmod(p, 0755), 0);
    }
    return dir;
}

static int gpu_check(const char *fail, const char *mode) {
    const char *d = stubs();
    return tu_sh(
        "PATH='%s':\"$PATH\" STUB_FAIL=%s STREAMBP='%s/streambp' GOLDEN_TEST='%s/test_golden' "
        "OUT='%s' timeout 60 cuda/gpu-check.sh %s",
        d, fail, d, d, tu_path("gpu-out-%s-%s", fail, mode), mode);
}

START_TEST(passes_and_estimates_first) {
    for (int long_run = 0; long_run < 2; long_run++) {
        const char *mode = long_run ? "long" : "short";
        ck_assert_msg(gpu_check("none", mode) == 0, "%s: %s", mode, tu_last_output());
        const char *out = tu_last_output();
        const char *est = strstr(out, "estimate"), *first = strstr(out, "\n==");
        ck_assert_msg(est && first && est < first, "%s: no estimate before the stages: %s", mode,
                      out);
        ck_assert_msg(strstr(out, "stub bench ran") && strstr(out, "passed"), "%s: %s", mode, out);
        ck_assert_msg(!long_run == !strstr(out, "85% of the free"), "%s: %s", mode, out);
    }
}
END_TEST

/* _i: the stage that fails; every one must fail the check, bench through its tee included. */
START_TEST(every_failure_counts) {
    static const char *fail[] = {"golden", "verify", "sanitizer", "bench", "grad"};
    ck_assert_msg(gpu_check(fail[_i], "short") != 0, "a failing %s stage passed: %s", fail[_i],
                  tu_last_output());
    ck_assert_msg(!strstr(tu_last_output(), "passed"), "%s: %s", fail[_i], tu_last_output());
}
END_TEST

START_TEST(sync_mode) {
    const char *m = tu_model("qwen3-hd72", 1);
    const char *opt = "--batch data/batches/sft-tiny.safetensors --device cuda-emu --numerics "
                      "portable --schedule stream --chunk 7 --block 4 --threads 1";
    const char *a = tu_path("sync0.safetensors"), *b = tu_path("sync1.safetensors");
    ck_assert_msg(tu_sh("'%s' grad --model '%s' %s --out '%s'", tu_bin(), m, opt, a) == 0, "%s",
                  tu_last_output());
    ck_assert_msg(
        tu_sh("SBP_CUDA_SYNC=1 '%s' grad --model '%s' %s --out '%s'", tu_bin(), m, opt, b) == 0,
        "%s", tu_last_output());
    ck_assert_msg(tu_sh("cmp -s '%s' '%s'", a, b) == 0, "SBP_CUDA_SYNC=1 changed the gradient");
    int rc = tu_sh("SBP_CUDA_SYNC=yes '%s' grad --model '%s' %s --out '%s'", tu_bin(), m, opt,
                   tu_path("sync2.safetensors"));
    ck_assert_msg(rc == 2 && strstr(tu_last_output(), "SBP_CUDA_SYNC"),
                  "an unknown SBP_CUDA_SYNC value was not refused (exit %d): %s", rc,
                  tu_last_output());
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("gpucheck");
    TCase *tc = tcase_create("gpucheck");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, passes_and_estimates_first);
    tcase_add_loop_test(tc, every_failure_counts, 0, 5);
    tcase_add_test(tc, sync_mode);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
