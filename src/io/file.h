/* file.h — small file helpers: opening inputs safely, whole-file reads and atomic writes.
 * Internal to the library. */
#ifndef SBP_FILE_H
#define SBP_FILE_H

#include "../streambp.h"

#include <stdint.h>
#include <stdio.h>

/* Opens path for reading only if it is a regular file: the open itself never blocks (a FIFO or
 * a device is refused by what fstat says about the opened file, not by a separate stat that
 * could see another file). *size is the file's size. */
sbp_status sbp_open_regular(FILE **f, uint64_t *size, const char *path, sbp_err *err);

/* Reads a whole text file (at most max_bytes) into a NUL-terminated malloc'd buffer; *n (if not
 * NULL) gets its length. */
sbp_status sbp_read_text(char **out, size_t *n, const char *path, size_t max_bytes, sbp_err *err);

/* An output file that appears under its final name only when committed, complete.
 *
 * Where the file system supports it the data goes to an unnamed file (O_TMPFILE) in the
 * output's directory, so a killed process leaves nothing behind; commit gives it a random
 * temporary name and renames that over the output. Elsewhere the data goes straight to
 * "<path>.tmp.<pid>.<random>", created with O_EXCL | O_NOFOLLOW (a planted file or symbolic
 * link under that name is never written through), and each open removes such files of its
 * output that processes no longer alive left behind. An existing output that is not a regular
 * file (a directory, FIFO, device or symbolic link) is refused, never replaced. */
typedef struct {
    FILE *f;
    char path[4096];
    char tmp[4200]; /* the named temporary, or "" while the file is unnamed */
    int unnamed;    /* O_TMPFILE */
} sbp_outfile;

sbp_status sbp_outfile_open(sbp_outfile *o, const char *path, sbp_err *err);
sbp_status sbp_outfile_write(sbp_outfile *o, const void *data, size_t n, sbp_err *err);
/* n bytes at byte offset off of the file, however far it now extends (the gaps read as zeros
 * until written); a file written this way takes no sbp_outfile_write. On failure o is aborted,
 * as by sbp_outfile_write. */
sbp_status sbp_outfile_pwrite(sbp_outfile *o, uint64_t off, const void *data, size_t n,
                              sbp_err *err);
sbp_status sbp_outfile_commit(sbp_outfile *o, sbp_err *err);
void sbp_outfile_abort(sbp_outfile *o);

sbp_status sbp_write_atomic(const char *path, const void *data, size_t n, sbp_err *err);

/* mkdir -p: dir and its missing parents. */
sbp_status sbp_make_dirs(const char *dir, sbp_err *err);

#endif
