/* testutil.h — shared helpers for the Check suites. Tests run from the repository root. */
#ifndef SBP_TESTUTIL_H
#define SBP_TESTUTIL_H

#include "../src/io/safetensors.h"
#include "../src/streambp.h"

#include <check.h>
#include <stdint.h>
#include <string.h>

/* A float's bit pattern and back (the bitwise tests of the vectorized functions and of the
 * 16-bit formats). */
static inline uint32_t tu_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float tu_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A per-process scratch directory under $TMPDIR (removed at exit). */
const char *tu_tmpdir(void);
/* Path of a seeded random model for data/models/<name>.json, created on first use. */
const char *tu_model(const char *name, uint64_t seed);
/* Loads model + batch; fails the test on error. */
void tu_load(sbp_model *m, sbp_batch *b, const char *model_dir, const char *batch_path,
             sbp_precision prec);
/* Runs sbp_grad (fast numerics) and fails the test on error. */
void tu_grad(sbp_grad_result *r, const sbp_model *m, const sbp_batch *b, sbp_schedule s, int block,
             int chunk, int logit_chunk, int chunked_logits);
/* The same with the numerics given. */
void tu_grad_n(sbp_grad_result *r, const sbp_model *m, const sbp_batch *b, sbp_numerics n,
               sbp_schedule s, int block, int chunk, int logit_chunk, int chunked_logits);
/* Bytes of the gradient slab. */
size_t tu_grad_bytes(const sbp_model *m);
/* Gradient element i as a double. */
double tu_at(const sbp_model *m, const void *g, int64_t i);
/* Relative L2 distance ||a − b|| / ||b|| over one parameter (b the reference). */
double tu_rel_l2(const sbp_model *ma, const void *a, const sbp_model *mb, const void *b,
                 const sbp_param *p);
/* Index of the first parameter whose bytes differ, or -1. */
int tu_first_diff(const sbp_model *m, const void *a, const void *b);
/* An SFT batch of 2 rows of T tokens over a vocabulary of V: row 0 full, row 1 left-padded by pad;
 * each row's first prompt real tokens have no label. Ids 3..V-1 from a 64-bit LCG seeded with
 * seed (the same batch on every machine). */
void tu_lcg_batch(sbp_batch *b, int T, int V, int pad, int prompt, uint64_t seed);
/* sbp_grad with options o and no ledger; fails the test, naming the schedule and chunks, on error.
 */
void tu_grad_opts(sbp_grad_result *r, const sbp_model *m, const sbp_batch *b, sbp_grad_opts o);

/* Runs a shell command (printf-style); returns its exit status, or -1. Output goes to the
 * file tu_tmpdir()/last.out, readable with tu_last_output(). Fails the test when the output holds
 * a sanitizer report (ASan, LSan, UBSan). */
int tu_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *tu_last_output(void);
/* Whether `python` finds every module of `modules` (names separated by spaces) on its path,
 * without importing them (importlib's find_spec: milliseconds, where importing torch takes
 * seconds). A module found but broken then fails the test that imports it, not skips it. */
int tu_python_has(const char *python, const char *modules);
/* Runs `PREFIX timeout SECS streambp ARGS` (ARGS printf-style) through tu_sh: stdout and stderr
 * together in tu_last_output(), 124 when it hung. tu_last_cmd() is the command line, for messages.
 */
int tu_cli(const char *prefix, int timeout_s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *tu_last_cmd(void);
/* Fails unless the last command exited want_rc and its output holds each string of want (a
 * NULL-terminated list; tu_check_run takes them as arguments). */
void tu_check_run_(int rc, int want_rc, const char *const *want);
#define tu_check_run(rc, want_rc, ...)                                                             \
    tu_check_run_(rc, want_rc, (const char *const[]){__VA_ARGS__, NULL})
/* The streambp binary ($STREAMBP, default build/streambp). */
const char *tu_bin(void);
/* The binary of planted bug `name` (make plants): <tu_bin()'s directory>/plant/<name>/streambp,
 * in a static buffer. */
const char *tu_plant_bin(const char *name);
int tu_exists(const char *path);

/* A path under tu_tmpdir(), printf-style, and dir/leaf; both return one of a ring of 32
 * buffers, so a test can hold several at once. */
const char *tu_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *tu_join(const char *dir, const char *leaf);
/* Fails the test if the last command printed a sanitizer report. */
void tu_assert_clean_output(void);
/* A listing of every file under dir with its checksum (free it): "nothing overwritten" is this
 * unchanged. */
char *tu_snapshot(const char *dir);
/* Runs `streambp ARGS` (printf-style): it must exit 2, name `expect` on stderr and print nothing
 * on stdout. */
void tu_expect_usage(const char *expect, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Runs `sh -c "exec CMD"` (its output discarded) in a child and SIGKILLs it as soon as the file
 * `marker` exists; fails the test if the marker never appears or the run fails on its own.
 * Returns 1 if the run was killed, 0 if it had finished first. */
int tu_kill_after(const char *cmd, const char *marker);
/* A copy of s that lives until the process exits (freed then, so LeakSanitizer stays quiet): for
 * paths and outputs a test holds longer than the ring of tu_path lasts. */
const char *tu_keep(const char *s);
/* A whole file, NUL-terminated (its length in *n unless n is NULL); fails the test if unreadable.
 */
char *tu_slurp(const char *path, size_t *n);
/* Writes n bytes to path; fails the test if it cannot. */
void tu_spit(const char *path, const void *data, size_t n);
/* Writes text to root/rel, creating the folders of rel; fails the test if it cannot. */
void tu_put(const char *root, const char *rel, const char *text);
/* An empty directory tu_tmpdir()/name. */
const char *tu_new_dir(const char *name);
/* Fails if a name under dir contains ".tmp": an interrupted atomic write leaves one. */
void tu_assert_no_tmp(const char *dir);

/* Every tensor of a safetensors file, raw, as entries to edit and write back. */
enum { TU_MAX_TENSORS = 80 };
typedef struct {
    sbp_st_entry e[TU_MAX_TENSORS];
    char names[TU_MAX_TENSORS][96];
    void *data[TU_MAX_TENSORS];
    int n;
} tu_tensors;
void tu_tensors_load(tu_tensors *ts, const char *path);
void tu_tensors_free(tu_tensors *ts);
/* Index of the tensor called name; fails the test if there is none. */
int tu_tensors_index(const tu_tensors *ts, const char *name);

/* A loss as a function of every parameter, w (params.total doubles). */
typedef double (*tu_loss_fn)(const double *w, void *ctx);
/* Central differences (step h) of f at w against the analytic gradient g, on k random entries of
 * every tensor and on its largest-|g| entry; fails on the first entry outside atol + rtol·|g|.
 * Prints the worst absolute error and the worst relative one among entries with |g| ≥ 1e-4. */
void tu_fd_check(const sbp_params *ps, const double *w /* (total) */, const double *g /* (total) */,
                 tu_loss_fn f, void *ctx, double h, double atol, double rtol, int k, uint64_t seed,
                 const char *what);

/* Fails unless the planner's ledger equals the measured one to the byte: the peak, each category's
 * peak and its share at the total peak, and the number of allocations; what names the case. */
void tu_assert_same_ledger(const sbp_ledger *plan, const sbp_ledger *real, const char *what);
/* Fails unless r's gradient (over the tensors of ps: an adapter's, or NULL for the model's) and
 * loss have ref's bits, naming the first tensor that differs; what names the case. */
void tu_assert_same_grads(const sbp_model *m, const sbp_params *ps, const sbp_grad_result *ref,
                          const sbp_grad_result *r, const char *what);

/* Runs the suite with Check's default runner; returns the process exit status. */
int tu_run_suite(Suite *s);
/* The same, after making data/models/<model>.json's seed-1 model (tu_model(model, 1)) before Check
 * forks, so that every test finds it made; name is the suite's, for the error message. */
int tu_run_suite_with_model(Suite *s, const char *model, const char *name);

#endif
