/* file.h — small file helpers: whole-file reads and atomic writes (temporary name + rename).
 * Internal to the library. */
#ifndef SBP_FILE_H
#define SBP_FILE_H

#include "../streambp.h"

#include <stdio.h>

/* Reads a whole text file (at most max_bytes) into a NUL-terminated malloc'd buffer. */
sbp_status sbp_read_text(char **out, const char *path, size_t max_bytes, sbp_err *err);

/* An output file that appears under its final name only when committed: data goes to
 * "<path>.tmp.<pid>" in the same directory, and commit renames it. Abort removes it. */
typedef struct {
    FILE *f;
    char path[4096];
    char tmp[4200];
} sbp_outfile;

sbp_status sbp_outfile_open(sbp_outfile *o, const char *path, sbp_err *err);
sbp_status sbp_outfile_write(sbp_outfile *o, const void *data, size_t n, sbp_err *err);
sbp_status sbp_outfile_commit(sbp_outfile *o, sbp_err *err);
void sbp_outfile_abort(sbp_outfile *o);

sbp_status sbp_write_atomic(const char *path, const void *data, size_t n, sbp_err *err);

/* mkdir -p: dir and its missing parents. */
sbp_status sbp_make_dirs(const char *dir, sbp_err *err);

#endif
