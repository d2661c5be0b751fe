/* cli.h — helpers shared by the `streambp` subcommands: option parsing, exit codes, reports.
 * Exit codes: 0 success, 1 a check found a mismatch or a non-finite value, 2 usage or input
 * error (bad options, unreadable or malformed files, inconsistent input, out of memory). */
#ifndef SBP_CLI_H
#define SBP_CLI_H

#include "../core/clock.h" /* sbp_now_seconds, sbp_peak_rss_bytes: the reports' times */
#include "../streambp.h"

#include <cJSON.h>
#include <stdint.h>
#include <stdio.h>

enum { EXIT_MISMATCH = 1, EXIT_USAGE = 2, EXIT_PEER = 3 /* a peer failed or timed out */ };

int cmd_grad(int argc, char **argv);
int cmd_init(int argc, char **argv);
int cmd_lora(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_train(int argc, char **argv);

/* The one parser of integer option values: decimal digits with an optional '-', in [lo, hi]
 * (checked before any conversion); otherwise prints "streambp CMD: --OPT must be an integer in
 * [lo, hi], got ..." and returns 0. */
int parse_int_opt(const char *cmd, const char *opt, const char *text, int64_t lo, int64_t hi,
                  int64_t *out);
/* A seed: any integer in [0, 2^64). */
int parse_seed_opt(const char *cmd, const char *opt, const char *text, unsigned long long *out);
/* parse_int_opt in [1, 2^30] (--block, --threads and a LoRA rank: their own limits in
 * streambp.h). */
int parse_pos_int(const char *cmd, const char *opt, const char *text, int *out);
int parse_precision(const char *cmd, const char *text, sbp_precision *out);
int parse_numerics(const char *cmd, const char *text, sbp_numerics *out);
int parse_device(const char *cmd, const char *text, sbp_device *out);
int parse_unattended(const char *cmd, const char *text, sbp_unattended *out);
/* The --help text of --unattended, shared by grad, verify and audit. */
#define UNATTENDED_USAGE                                                                           \
    "  --unattended MODE    attention rows that see no key (queries before the first real token\n" \
    "                       of a left-padded row): zero (output 0, the default), hf-eager (HF\n"   \
    "                       eager attention: uniform over all T keys), hf-sdpa (HF sdpa: the\n"    \
    "                       row unmasked, every key with its real score)\n"
/* A finite number >= min for option opt; prints an error naming cmd and returns 0 if bad. */
int parse_number(const char *cmd, const char *opt, const char *text, double min, double *out);
/* Prints "streambp CMD: <message>" to stderr and returns the exit code for st. */
int report_error(const char *cmd, const sbp_err *err);
/* The end of a failed command of a distributed run (dist_cli.c): the error, then with several
 * processes every one ends: a numeric error (every rank has the same) returns 1 after MPI is
 * finished; any other ends the job with MPI_Abort (2, or 3 for SBP_EPEER). One process: as
 * report_error. */
struct sbp_comm;
int dist_exit(struct sbp_comm *c, const char *cmd, const sbp_err *err);
/* A rank > 0 of a distributed train: run (rn bytes) becomes the run directory run/ inside a
 * private directory made in scratch (n bytes) by mkdtemp (the caller removes it), and stdout
 * goes to /dev/null: rank 0 writes. */
int dist_follower(char *scratch, size_t n, char *run, size_t rn, sbp_err *err);
/* With several processes: every one was given the same settings (argv's options but those that
 * change no bit, and the contents of the data, model configuration and adapter files named);
 * 0 when so, else the exit status after naming the first differing setting and ranks (every
 * rank ends with 2). */
int dist_check_args(struct sbp_comm *c, const char *cmd, int argc, char **argv, sbp_err *err);
/* With several processes, rank 0 prints each rank's bytes and messages sent, seconds waited,
 * and the largest ledger peak (peak: this rank's) on stderr. */
void dist_report(struct sbp_comm *c, const char *cmd, int64_t peak);
/* --comm-timeout: seconds > 0 */
int parse_comm_timeout(const char *cmd, const char *s, double *out);
/* plan's network model (dist_cli.c): --bandwidth NUMBER[k|M|G|T][bit] (bytes per second, decimal
 * prefixes; "bit": bits per second), --latency S (seconds, >= 0), --flops G (GFLOP/s). 0 (and a
 * message) when malformed. */
int parse_net_option(const char *cmd, const char *opt, const char *s, double *out);

/* Bytes a new allocation can still get: the least of MemAvailable, RLIMIT_AS and RLIMIT_DATA
 * less what the process holds, and the cgroup limits less their usage; why names the one that
 * binds. -1 when none is known. */
int64_t available_memory(char *why, size_t n);
/* "512 B", "3.4 MiB", "80.00 GiB", "15.21 TiB" */
void format_bytes(char *buf, size_t n, int64_t bytes);

/* Whether a command that writes the files `ours` (NULL-terminated) as one directory may write
 * dir: it does not exist, or it is a real directory (not a symbolic link) holding only regular
 * files of those names — and when it holds any of them, force is set. Otherwise prints why
 * (naming the file found) and returns 0; the directory is then left as it was. */
int out_dir_ready(const char *cmd, const char *dir, const char *const *ours, int force);
/* sbp_outdir_open on dir (trailing slashes dropped) after creating its missing parents: the
 * files go to d->tmp, and sbp_outdir_commit renames the finished directory into place. */
sbp_status out_dir_open(sbp_outdir *d, const char *dir, sbp_err *err);

void print_ledger(FILE *f, const sbp_ledger *lg, const char *indent);
cJSON *ledger_json(const sbp_ledger *lg);
/* Prints o as indented JSON on stdout and deletes it. */
void print_json(cJSON *o);

#endif
