/* test_verifyranks.c — `mpirun -np N streambp verify --ranks N` (issue 54 item 5): the
 * data-parallel step of this build's MPI layer against one process, bit for bit, on the bundled
 * model, as an auditor runs it. Skipped (passing) where mpirun or the build's MPI is missing.
 *
 * Planted by hand (src/dist/exchange.c, reverted; the lead owns the file): the fold of
 * sbp_dist_fold without its bf16 rounding made "portable bf16 ckpt, sharded" differ on rank 0 at
 * model.embed_tokens.weight element 0; the fold leaving out the last element of each piece made
 * both fp64 configurations differ at element 4095 (a block's end); each exits 1. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MPIRUN                                                                                     \
    "ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 timeout 300 mpirun --oversubscribe "            \
    "--allow-run-as-root --mca btl self,vader"

static int have_mpi(void) {
    if (tu_sh("command -v mpirun") != 0) return 0;
    tu_sh("'%s' verify --ranks 2", tu_bin()); /* alone: says whether the build has MPI */
    return !strstr(tu_last_output(), "this build has no MPI");
}

START_TEST(ranks_equal_one_process) {
    if (!have_mpi()) {
        printf("verify --ranks: skipped (no mpirun, or a build without MPI)\n");
        return;
    }
    for (int n = 2; n <= 3; n++) {
        int rc = tu_sh(MPIRUN " -np %d '%s' verify --ranks %d", n, tu_bin(), n);
        ck_assert_msg(rc == 0 && strstr(tu_last_output(), "5 of 5 configurations bitwise equal"),
                      "N = %d: exit %d:\n%s", n, rc, tu_last_output());
        ck_assert_msg(strstr(tu_last_output(), "portable bf16 ckpt, sharded") &&
                          strstr(tu_last_output(), "fast fp64 stream chunk 8, sharded"),
                      "%s", tu_last_output());
    }
    /* a job of another size: every rank says so, exit 2 */
    int rc = tu_sh(MPIRUN " -np 3 '%s' verify --ranks 2", tu_bin());
    ck_assert_msg(rc == 2 && strstr(tu_last_output(), "this job has 3 processes"), "exit %d:\n%s",
                  rc, tu_last_output());
}
END_TEST

START_TEST(usage) {
    int rc = tu_sh("'%s' verify --ranks 2", tu_bin()); /* no launcher: one process */
    ck_assert_msg(rc == 2 && strstr(tu_last_output(), "mpirun -np 2 streambp verify --ranks 2"),
                  "exit %d: %s", rc, tu_last_output());
    tu_expect_usage("must divide 12", "verify --ranks 5");
    tu_expect_usage("must divide 12", "verify --ranks 0");
    tu_expect_usage("unexpected argument", "verify --ranks 2 --model x");
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("verifyranks");
    TCase *tc = tcase_create("verifyranks");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, usage);
    tcase_add_test(tc, ranks_equal_one_process);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
