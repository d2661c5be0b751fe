/* file.c — opening inputs without blocking, whole-file reads, and atomic writes (see file.h). */
#define _GNU_SOURCE /* O_TMPFILE, linkat's AT_EMPTY_PATH */
#include "file.h"
#include "../core/err.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *kind_of(mode_t m) {
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
           : S_ISLNK(m)  ? "a symbolic link"
                         : "not a regular file";
}

sbp_status sbp_open_regular(FILE **f, uint64_t *size, const char *path, sbp_err *err) {
    *f = NULL;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return sbp_fail(err, SBP_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb = {0};
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int e = errno;
        close(fd);
        return sbp_fail(err, SBP_EIO, "%s: not a regular file (%s)", path,
                        sb.st_mode ? kind_of(sb.st_mode) : strerror(e));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl == -1 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == -1 || !(*f = fdopen(fd, "rb"))) {
        int e = errno;
        close(fd);
        return sbp_fail(err, SBP_EIO, "%s: cannot open: %s", path, strerror(e));
    }
    *size = (uint64_t)sb.st_size;
    return SBP_OK;
}

sbp_status sbp_read_text(char **out, size_t *n_out, const char *path, size_t max_bytes,
                         sbp_err *err) {
    FILE *f;
    uint64_t size;
    sbp_status st = sbp_open_regular(&f, &size, path, err);
    if (st) return st;
    if (size > max_bytes) {
        fclose(f);
        return sbp_fail(err, SBP_EFORMAT, "%s: larger than %zu bytes", path, max_bytes);
    }
    char *buf = malloc((size_t)size + 1);
    if (!buf) {
        fclose(f);
        return sbp_fail(err, SBP_ENOMEM, "%s: out of memory reading the file", path);
    }
    /* the file may have changed since fstat: read what is there, up to the limit */
    size_t n = fread(buf, 1, (size_t)size, f);
    int bad = ferror(f) || (n == size && fgetc(f) != EOF);
    fclose(f);
    if (bad) {
        free(buf);
        return sbp_fail(err, SBP_EIO, "%s: read error (or the file grew while being read)", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (n_out) *n_out = n;
    return SBP_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Atomic output */

static uint64_t random64(void) {
    uint64_t r;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r) return r;
    struct timespec ts; /* no entropy yet (early boot): still distinct per call and process */
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40) ^
           (uint64_t)(uintptr_t)&r;
}

/* dir and base name of path: "a/b/c" -> "a/b", "c"; "c" -> ".", "c"; "/c" -> "/", "c". */
static void split_path(char *dir, size_t n, const char **base, const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, n, ".");
        *base = path;
    } else {
        snprintf(dir, n, "%.*s", slash == path ? 1 : (int)(slash - path), path);
        *base = slash + 1;
    }
}

/* Removes "<base>.tmp.<pid>" and "<base>.tmp.<pid>.<hex>" files in dir whose process is gone:
 * what an earlier run killed between creating and renaming its temporary left behind. */
static void remove_stale(const char *dir, const char *base) {
    DIR *d = opendir(dir);
    if (!d) return;
    size_t nb = strlen(base);
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *s = de->d_name;
        if (strncmp(s, base, nb) != 0 || strncmp(s + nb, ".tmp.", 5) != 0) continue;
        char *end;
        errno = 0;
        long pid = strtol(s + nb + 5, &end, 10);
        if (errno || end == s + nb + 5 || pid <= 0 || pid == (long)getpid()) continue;
        if (*end == '.') {
            const char *h = end + 1;
            if (strspn(h, "0123456789abcdef") != 16 || h[16]) continue;
        } else if (*end) {
            continue;
        }
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to know */
        struct stat sb;
        if (fstatat(dirfd(d), s, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
            (S_ISREG(sb.st_mode) || S_ISLNK(sb.st_mode)))
            unlinkat(dirfd(d), s, 0);
    }
    closedir(d);
}

static void tmp_name(sbp_outfile *o) {
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld.%016llx", o->path, (long)getpid(),
             (unsigned long long)random64());
}

/* The output must be absent, or a regular file to be replaced. */
static sbp_status check_target(const char *path, sbp_err *err) {
    struct stat sb;
    if (lstat(path, &sb) != 0 || S_ISREG(sb.st_mode)) return SBP_OK;
    if (S_ISDIR(sb.st_mode))
        return sbp_fail(err, SBP_EIO, "%s: is a directory; give a file name for the output", path);
    return sbp_fail(err, SBP_EIO,
                    "%s: exists and is %s, not a regular file; refusing to replace it with the "
                    "output",
                    path, kind_of(sb.st_mode));
}

sbp_status sbp_outfile_open(sbp_outfile *o, const char *path, sbp_err *err) {
    memset(o, 0, sizeof *o);
    if (!path[0]) return sbp_fail(err, SBP_EUSAGE, "the output file name is empty");
    if (strlen(path) >= sizeof o->path)
        return sbp_fail(err, SBP_EUSAGE, "output path too long: %.80s...", path);
    sbp_status st = check_target(path, err);
    if (st) return st;
    snprintf(o->path, sizeof o->path, "%s", path);
    char dir[4096];
    const char *base;
    split_path(dir, sizeof dir, &base, path);
    remove_stale(dir, base);
    int fd = -1;
    /* Unnamed until committed; linking it later goes through /proc/self/fd, so use it only
     * where that exists. */
    if (access("/proc/self/fd", X_OK) == 0) {
        fd = open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
        o->unnamed = fd >= 0;
    }
    for (int tries = 0; fd < 0 && tries < 8; tries++) {
        tmp_name(o);
        fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0 || !(o->f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0) close(fd);
        if (!o->unnamed && o->tmp[0] && fd >= 0) remove(o->tmp);
        memset(o, 0, sizeof *o);
        return sbp_fail(err, SBP_EIO, "%s: cannot create output file: %s", path, strerror(e));
    }
    if (o->unnamed) o->tmp[0] = '\0';
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

sbp_status sbp_outfile_pwrite(sbp_outfile *o, uint64_t off, const void *data, size_t n,
                              sbp_err *err) {
    const char *p = data;
    int e = 0;
    if (off > (uint64_t)INT64_MAX - n) e = EFBIG;
    while (n && !e) {
        const ssize_t w = pwrite(fileno(o->f), p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            e = w < 0 ? errno : ENOSPC; /* pwrite writing nothing: the device is full */
            break;
        }
        p += w, n -= (size_t)w, off += (uint64_t)w;
    }
    if (!e) return SBP_OK;
    sbp_outfile_abort(o);
    return sbp_fail(err, SBP_EIO, "%s: write failed: %s", o->path, strerror(e));
}

/* Gives the unnamed file a random temporary name in the output's directory. */
static int link_unnamed(sbp_outfile *o) {
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fileno(o->f));
    for (int tries = 0; tries < 8; tries++) {
        tmp_name(o);
        if (linkat(AT_FDCWD, proc, AT_FDCWD, o->tmp, AT_SYMLINK_FOLLOW) == 0) return 0;
        if (errno != EEXIST) break;
    }
    o->tmp[0] = '\0';
    return -1;
}

sbp_status sbp_outfile_commit(sbp_outfile *o, sbp_err *err) {
    int bad = fflush(o->f) != 0 || ferror(o->f);
    int e = errno;
    if (!bad && o->unnamed && link_unnamed(o) != 0) bad = 1, e = errno;
    bad |= fclose(o->f) != 0;
    o->f = NULL;
    if (bad) {
        if (o->tmp[0]) remove(o->tmp);
        return sbp_fail(err, SBP_EIO, "%s: write failed: %s", o->path, strerror(e));
    }
    sbp_status st = check_target(o->path, err); /* it may have appeared while we computed */
    if (!st && rename(o->tmp, o->path) != 0) {
        e = errno;
        st = sbp_fail(err, SBP_EIO, "%s: cannot rename the finished file into place: %s", o->path,
                      strerror(e));
    }
    if (st) remove(o->tmp);
    return st;
}

void sbp_outfile_abort(sbp_outfile *o) {
    if (o->f) fclose(o->f);
    o->f = NULL;
    if (o->tmp[0]) remove(o->tmp);
    o->tmp[0] = '\0';
}

sbp_status sbp_check_writable(const char *path, sbp_err *err) {
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
    if (!dir[0]) return sbp_fail(err, SBP_EUSAGE, "the output directory name is empty");
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
