/* testutil.h — shared helpers for the Check suites. Tests run from the repository root. */
#ifndef SBP_TESTUTIL_H
#define SBP_TESTUTIL_H

#include "../src/streambp.h"

#include <check.h>
#include <stdint.h>

/* A per-process scratch directory under $TMPDIR (removed at exit). */
const char *tu_tmpdir(void);
/* Path of a seeded random model for data/models/<name>.json, created on first use. */
const char *tu_model(const char *name, uint64_t seed);
/* Loads model + batch; fails the test on error. */
void tu_load(sbp_model *m, sbp_batch *b, const char *model_dir, const char *batch_path,
             sbp_precision prec);
/* Runs sbp_grad and fails the test on error. */
void tu_grad(sbp_grad_result *r, const sbp_model *m, const sbp_batch *b, sbp_schedule s, int block,
             int chunk, int logit_chunk, int chunked_logits);
/* Bytes of the gradient slab. */
size_t tu_grad_bytes(const sbp_model *m);
/* Gradient element i as a double. */
double tu_at(const sbp_model *m, const void *g, int64_t i);
/* Relative L2 distance ||a − b|| / ||b|| over one parameter (b the reference). */
double tu_rel_l2(const sbp_model *ma, const void *a, const sbp_model *mb, const void *b,
                 const sbp_param *p);
/* Index of the first parameter whose bytes differ, or -1. */
int tu_first_diff(const sbp_model *m, const void *a, const void *b);

/* Runs a shell command (printf-style); returns its exit status, or -1. Output goes to the
 * file tu_tmpdir()/last.out, readable with tu_last_output(). */
int tu_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *tu_last_output(void);
/* The streambp binary ($STREAMBP, default build/streambp). */
const char *tu_bin(void);
int tu_exists(const char *path);

/* Runs the suite with Check's default runner; returns the process exit status. */
int tu_run_suite(Suite *s);

#endif
