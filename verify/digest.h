/* digest.h — the fingerprint of a gradient file: the SHA-256 of every tensor's stored bytes and
 * the loss's bits. Portable runs (--numerics portable) must give the same fingerprint on every
 * machine, compiler and backend; data/golden/ holds the committed ones (docs/numerics.md §12). */
#ifndef SBP_DIGEST_H
#define SBP_DIGEST_H

#include "../src/streambp.h"

#include <stdio.h>

typedef struct {
    char name[96];
    char dtype[8];
    char sha256[65]; /* hex of the tensor's raw little-endian bytes, as stored */
} sbp_tensor_digest;

typedef struct {
    sbp_tensor_digest *t; /* (n), in the file's order */
    int n;
    char loss[32]; /* the loss of __metadata__ as exact hex (%a), or "" when absent */
} sbp_file_digest;

sbp_status sbp_digest_file(sbp_file_digest *d, const char *path, sbp_err *err);
void sbp_file_digest_free(sbp_file_digest *d);

/* Writes d as text: "loss <hex>" then one "<name> <dtype> <sha256>" line per tensor. */
void sbp_digest_print(FILE *f, const sbp_file_digest *d);

/* The same text as a string (malloc'd; names escaped as verify/text.h does), or NULL when out of
 * memory: what `verify golden` compares with a committed digest. */
char *sbp_digest_text(const sbp_file_digest *d);

/* Where two digest texts part: "" when they are the same, else "line N (<first word of want's
 * line>)", or "line N (end of the golden file)" when got is longer. The comparison of `verify
 * golden` (and of its self-test, which changes a line and expects this to name it). */
void sbp_digest_first_difference(char *out, size_t n, const char *got, const char *want);

#endif
