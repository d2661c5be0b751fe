/* cmd_verify.h — the `streambp verify` subcommands. */
#ifndef SBP_CMD_VERIFY_H
#define SBP_CMD_VERIFY_H

#include <cJSON.h>
#include <stdio.h>

int verify_main(int argc, char **argv); /* dispatches on argv[1] */
int verify_diff(int argc, char **argv);
int verify_fd(int argc, char **argv);
int verify_run(int argc, char **argv); /* no subcommand: the full matrix */
int verify_audit(int argc, char **argv);
int verify_suite(int argc, char **argv);
int verify_digest(int argc, char **argv);
int verify_golden(int argc, char **argv);
int verify_optim(int argc, char **argv);
int verify_selftest(int argc, char **argv); /* --self-test */
int verify_reach(int argc, char **argv);
int verify_ranks(int argc, char **argv); /* --ranks N, under mpirun */
/* The suite's cases (reach 0) or the reach cases (cmd_verify_suite.c), all or case `only`: a
 * table to f and/or JSON fields of j (each may be NULL); returns 0, EXIT_MISMATCH or EXIT_USAGE.
 */
int cases_check(FILE *f, cJSON *j, int reach, int only);
/* The optimizer check (cmd_verify_optim.c) printed to f; returns 0, EXIT_MISMATCH or EXIT_USAGE. */
int optim_check(FILE *f);
/* The golden step (cmd_verify_golden.c) on the devices given ("cpu", "cuda", "cuda-emu"): prints
 * one line per case run and a summary to f (NULL: nothing); returns 0, EXIT_MISMATCH or EXIT_USAGE.
 */
int golden_check(FILE *f, const char *const *devices, int n_devices, int all,
                 const char *golden_dir);

/* The self-test (cmd_verify_selftest.c): its report as text to f and/or as JSON fields of j (each
 * may be NULL); returns 0, EXIT_MISMATCH or EXIT_USAGE. */
int selftest_check(FILE *f, cJSON *j);

#endif
