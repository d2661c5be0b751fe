/* options.h — the options several commands share (--model, --block, --chunk, --logit-chunk,
 * --threads, --schedule, --numerics, --device, --unattended, --seed, --json), spelled and parsed
 * in one place (options.c). A command lists the ones it takes in its getopt table with the
 * OPTION_* entries, points a common_opts at the fields the values go to, and hands every code
 * common_opt_code() recognises to common_opt():
 *
 *     static const struct option opts[] = {..., OPTION_BLOCK, OPTION_JSON, {0, 0, 0, 0}};
 *     common_opts co = {.cmd = "verify fd", .block = &g.block, .json = &json};
 *     ...
 *     default:
 *         if (common_opt_code(c)) {
 *             if (!common_opt(&co, c, optarg)) return EXIT_USAGE;
 *             break;
 *         }
 *
 * The messages are those the commands printed before (parse_pos_int and friends, util.c).
 * Options whose values mean something else in one command (verify's --threads and --numerics
 * take lists, `verify fd`'s --seed is an int) stay in that command. */
#ifndef SBP_CLI_OPTIONS_H
#define SBP_CLI_OPTIONS_H

#include "../streambp.h"

#include <getopt.h>

/* getopt codes of the shared options (above the objective options of objopts.h, 1000...) */
enum {
    COMMON_OPT_MODEL = 1100,
    COMMON_OPT_BLOCK,
    COMMON_OPT_CHUNK,
    COMMON_OPT_LOGIT_CHUNK,
    COMMON_OPT_THREADS,
    COMMON_OPT_SCHEDULE,
    COMMON_OPT_NUMERICS,
    COMMON_OPT_DEVICE,
    COMMON_OPT_UNATTENDED,
    COMMON_OPT_SEED,
    COMMON_OPT_JSON,
    COMMON_OPT_END_ /* one past the last */
};

/* The getopt table entries. */
#define OPTION_MODEL                                                                               \
    { "model", required_argument, 0, COMMON_OPT_MODEL }
#define OPTION_BLOCK                                                                               \
    { "block", required_argument, 0, COMMON_OPT_BLOCK }
#define OPTION_CHUNK                                                                               \
    { "chunk", required_argument, 0, COMMON_OPT_CHUNK }
#define OPTION_LOGIT_CHUNK                                                                         \
    { "logit-chunk", required_argument, 0, COMMON_OPT_LOGIT_CHUNK }
#define OPTION_THREADS                                                                             \
    { "threads", required_argument, 0, COMMON_OPT_THREADS }
#define OPTION_SCHEDULE                                                                            \
    { "schedule", required_argument, 0, COMMON_OPT_SCHEDULE }
#define OPTION_NUMERICS                                                                            \
    { "numerics", required_argument, 0, COMMON_OPT_NUMERICS }
#define OPTION_DEVICE                                                                              \
    { "device", required_argument, 0, COMMON_OPT_DEVICE }
#define OPTION_UNATTENDED                                                                          \
    { "unattended", required_argument, 0, COMMON_OPT_UNATTENDED }
#define OPTION_SEED                                                                                \
    { "seed", required_argument, 0, COMMON_OPT_SEED }
#define OPTION_JSON                                                                                \
    { "json", no_argument, 0, COMMON_OPT_JSON }

/* Where each shared option's value goes; NULL for the options a command does not take. */
typedef struct {
    const char *cmd;                  /* "grad", "verify audit": the messages' prefix */
    const char **model;               /* --model DIR (the argument itself) */
    int *block, *chunk, *logit_chunk; /* integers in [1, 2^30] (parse_pos_int) */
    int *threads;                     /* likewise */
    sbp_schedule *schedule;           /* full, ckpt or stream */
    sbp_numerics *numerics;           /* fast or portable */
    sbp_device *device;               /* cpu, cuda or cuda-emu */
    sbp_unattended *unattended;       /* zero, hf-eager or hf-sdpa */
    unsigned long long *seed;         /* any integer in [0, 2^64) */
    int *json;                        /* set to 1 */
    int numerics_given;               /* set by common_opt: --numerics was on the line */
} common_opts;

/* 1 when getopt's code c is a shared option's. */
int common_opt_code(int c);
/* Parses the value of shared option c into its field of o; prints "streambp CMD: ..." and
 * returns 0 when the value is bad (or, a mistake of the command's table, the option has no
 * field in o). */
int common_opt(common_opts *o, int c, const char *arg);

/* The thread count without --threads, one rule for grad, train and bench: OpenMP's own default
 * (OMP_NUM_THREADS's first value when set, else the cores this process may run on), at most
 * SBP_MAX_THREADS. */
int default_threads(void);
/* The fast numerics keep full = ckpt = stream bit for bit only when the layer chunk (stream) and
 * the logits chunk (stream, or --chunked-logits) are multiples of the block or hold all T tokens
 * (docs/numerics.md §1). When g's chunks give that up at T (T <= 0: a length not known yet, any)
 * this says so on stderr, naming the option, and returns 1. */
int note_fast_chunks(const char *cmd, const sbp_grad_opts *g, int T);
/* The --help line of --threads for the commands that use default_threads. */
#define THREADS_USAGE                                                                              \
    "  --threads N          OpenMP/OpenBLAS threads (default: OMP_NUM_THREADS, else every core\n"  \
    "                       this process may use; at most 4096)\n"

#endif
