/* file.c — whole-file reads and atomic writes. */
#include "file.h"
#include "../core/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

sbp_status sbp_read_text(char **out, const char *path, size_t max_bytes, sbp_err *err) {
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return sbp_fail(err, SBP_EIO, "%s: not a regular file", path);
    FILE *f = fopen(path, "rb");
    if (!f) return sbp_fail(err, SBP_EIO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            if (cap > max_bytes) {
                free(buf);
                fclose(f);
                return sbp_fail(err, SBP_EFORMAT, "%s: larger than %zu bytes", path, max_bytes);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) break;
    }
    if (!buf) {
        fclose(f);
        return sbp_fail(err, SBP_ENOMEM, "%s: out of memory reading the file", path);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return sbp_fail(err, SBP_EIO, "%s: read error", path);
    }
    buf[n] = '\0';
    *out = buf;
    return SBP_OK;
}

sbp_status sbp_outfile_open(sbp_outfile *o, const char *path, sbp_err *err) {
    memset(o, 0, sizeof *o);
    if (strlen(path) >= sizeof o->path)
        return sbp_fail(err, SBP_EUSAGE, "output path too long: %.80s...", path);
    snprintf(o->path, sizeof o->path, "%s", path);
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", path, (long)getpid());
    o->f = fopen(o->tmp, "wb");
    if (!o->f)
        return sbp_fail(err, SBP_EIO, "%s: cannot create output file: %s", path, strerror(errno));
    return SBP_OK;
}

sbp_status sbp_outfile_write(sbp_outfile *o, const void *data, size_t n, sbp_err *err) {
    if (n && fwrite(data, 1, n, o->f) != n) {
        int e = errno;
        sbp_outfile_abort(o);
        return sbp_fail(err, SBP_EIO, "%s: write failed: %s", o->path, strerror(e));
    }
    return SBP_OK;
}

sbp_status sbp_outfile_commit(sbp_outfile *o, sbp_err *err) {
    int bad = fflush(o->f) != 0 || ferror(o->f);
    int e = errno;
    bad |= fclose(o->f) != 0;
    o->f = NULL;
    if (bad) {
        remove(o->tmp);
        return sbp_fail(err, SBP_EIO, "%s: write failed: %s", o->path, strerror(e));
    }
    if (rename(o->tmp, o->path) != 0) {
        e = errno;
        remove(o->tmp);
        return sbp_fail(err, SBP_EIO, "%s: cannot rename the finished file into place: %s", o->path,
                        strerror(e));
    }
    return SBP_OK;
}

void sbp_outfile_abort(sbp_outfile *o) {
    if (o->f) fclose(o->f);
    o->f = NULL;
    if (o->tmp[0]) remove(o->tmp);
}

sbp_status sbp_check_writable(const char *path, sbp_err *err) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return sbp_fail(err, SBP_EIO, "%s: is a directory; give a file name for the output", path);
    sbp_outfile o;
    sbp_status st = sbp_outfile_open(&o, path, err);
    if (st) return st;
    sbp_outfile_abort(&o);
    return SBP_OK;
}

sbp_status sbp_write_atomic(const char *path, const void *data, size_t n, sbp_err *err) {
    sbp_outfile o;
    sbp_status st = sbp_outfile_open(&o, path, err);
    if (st) return st;
    if ((st = sbp_outfile_write(&o, data, n, err))) return st;
    return sbp_outfile_commit(&o, err);
}

/* mkdir -p */
sbp_status sbp_make_dirs(const char *dir, sbp_err *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return sbp_fail(err, SBP_EUSAGE, "directory name too long");
    for (char *p = path + 1;; p++) {
        int last = *p == '\0';
        if (*p != '/' && !last) continue;
        *p = '\0';
        struct stat sb;
        if (stat(path, &sb) != 0) {
            if (mkdir(path, 0755) != 0 && errno != EEXIST)
                return sbp_fail(err, SBP_EIO, "%s: cannot create directory: %s", path,
                                strerror(errno));
        } else if (!S_ISDIR(sb.st_mode)) {
            return sbp_fail(err, SBP_EIO, "%s: exists and is not a directory", path);
        }
        if (last) return SBP_OK;
        *p = '/';
    }
}

