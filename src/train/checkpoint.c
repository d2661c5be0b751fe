/* checkpoint.c — the pieces of a checkpoint that are not the optimizer's: a directory written
 * atomically, a model directory's files, and a hash to recognise a run's model and data.
 *
 * Atomic directory: everything is written into "<path>.tmp.<pid>.XXXXXX" (mkdtemp) beside the
 * final name; commit fsyncs each file and the directory, then renames it into place and fsyncs
 * the parent, so after a crash at any moment the final name holds either nothing, the previous
 * complete directory, or the new complete one. A directory of the same name (a run resumed from
 * an earlier checkpoint writes the same step again) is swapped with the new one in one
 * renameat2(RENAME_EXCHANGE) and then removed; nothing is ever followed through a symbolic link
 * (sbp_remove_tree). */
#define _GNU_SOURCE /* renameat2, RENAME_EXCHANGE */
#include "../core/err.h"
#include "../io/file.h"
#include "../io/json.h"
#include "../io/train_state.h"
#include "../streambp.h"

#include <cJSON.h>
#include <dirent.h>
#include <openssl/evp.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

uint64_t sbp_hash64(const void *data, size_t n, uint64_t h) {
    /* FNV-1a over 8-byte words with a final-style mix per word: fast enough for a 30 GB slab,
     * and every byte and its position matter */
    const unsigned char *p = data;
    h ^= 0xcbf29ce484222325ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 32;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h ^ (uint64_t)n;
}

/* Removes everything under the directory open as dirfd, never following a symbolic link: each
 * entry is examined with fstatat(AT_SYMLINK_NOFOLLOW), a link or file is unlinked as what it is,
 * and a real directory is entered through its own descriptor (O_DIRECTORY | O_NOFOLLOW), so a
 * link planted inside cannot lead the removal out of the tree. depth bounds the recursion. */
static void remove_under(int dirfd, int depth) {
    int fd = dup(dirfd);
    DIR *dp = fd < 0 ? NULL : fdopendir(fd);
    if (!dp) {
        if (fd >= 0) close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        struct stat sb;
        if (fstatat(dirfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (S_ISDIR(sb.st_mode)) {
            int sub = depth > 0 ? openat(dirfd, e->d_name,
                                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                                : -1;
            if (sub >= 0) {
                remove_under(sub, depth - 1);
                close(sub);
            }
            unlinkat(dirfd, e->d_name, AT_REMOVEDIR);
        } else {
            unlinkat(dirfd, e->d_name, 0);
        }
    }
    closedir(dp);
}

int sbp_remove_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(sb.st_mode)) return unlink(path); /* a link is removed as a link */
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    remove_under(fd, 8);
    close(fd);
    return rmdir(path);
}

/* "<path>.<what>.<pid>.XXXXXX" made unique by mkdtemp: a name nobody can predict or plant, whose
 * pid part still tells a later run whether its writer is alive (sbp_remove_stale). */
static int make_temp_dir(char *out, size_t n, const char *path, const char *what) {
    if ((size_t)snprintf(out, n, "%s.%s.%ld.XXXXXX", path, what, (long)getpid()) >= n) return -1;
    return mkdtemp(out) ? 0 : -1;
}

sbp_status sbp_outdir_open(sbp_outdir *d, const char *path, sbp_err *err) {
    memset(d, 0, sizeof *d);
    if (strlen(path) >= sizeof d->path)
        return sbp_fail(err, SBP_EUSAGE, "directory name too long: %.80s...", path);
    snprintf(d->path, sizeof d->path, "%s", path);
    if (make_temp_dir(d->tmp, sizeof d->tmp, path, "tmp") != 0) {
        int e = errno;
        d->tmp[0] = '\0';
        return sbp_fail(err, SBP_EIO, "%s: cannot create the directory: %s", path, strerror(e));
    }
    return SBP_OK;
}

const char *sbp_outdir_file(const sbp_outdir *d, const char *name, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", d->tmp, name);
    return buf;
}

static int fsync_path(const char *path, int dir) {
    int fd = open(path, (dir ? O_DIRECTORY : 0) | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    int r = fsync(fd);
    close(fd);
    return r;
}

sbp_status sbp_outdir_commit(sbp_outdir *d, sbp_err *err) {
    int dfd = open(d->tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *dp = dfd < 0 ? NULL : fdopendir(dup(dfd));
    if (!dp) {
        if (dfd >= 0) close(dfd);
        sbp_outdir_abort(d);
        return sbp_fail(err, SBP_EIO, "%s: the directory being written is gone", d->path);
    }
    int bad = 0;
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        int fd = openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        bad |= fd < 0 || fsync(fd) != 0;
        if (fd >= 0) close(fd);
    }
    closedir(dp);
    bad |= fsync(dfd) != 0;
    close(dfd);
    if (bad) {
        int e2 = errno;
        sbp_outdir_abort(d);
        return sbp_fail(err, SBP_EIO, "%s: cannot flush the files to disk: %s", d->path,
                        strerror(e2));
    }
    struct stat sb;
    const int exists = lstat(d->path, &sb) == 0;
    if (exists && !S_ISDIR(sb.st_mode)) { /* a file, or a link (never followed, never replaced) */
        sbp_outdir_abort(d);
        return sbp_fail(err, SBP_EIO, "%s: exists and is %s; not replaced", d->path,
                        S_ISLNK(sb.st_mode) ? "a symbolic link" : "not a directory");
    }
    if (!exists) {
        if (rename(d->tmp, d->path) != 0) {
            int e2 = errno;
            sbp_outdir_abort(d);
            return sbp_fail(err, SBP_EIO, "%s: cannot rename the finished directory into place: %s",
                            d->path, strerror(e2));
        }
    } else if (renameat2(AT_FDCWD, d->tmp, AT_FDCWD, d->path, RENAME_EXCHANGE) != 0) {
        /* one atomic swap where the file system has it; elsewhere the old directory is moved
         * aside to an unpredictable name first, and a run that dies between the two renames
         * leaves it complete under that name: sbp_remove_stale puts it back */
        char old[4300];
        int e2 = errno;
        if ((e2 != EINVAL && e2 != ENOSYS) || make_temp_dir(old, sizeof old, d->path, "old") != 0 ||
            rename(d->path, old) != 0) {
            e2 = errno;
            sbp_outdir_abort(d);
            return sbp_fail(err, SBP_EIO, "%s: cannot move the older directory aside: %s", d->path,
                            strerror(e2));
        }
        if (rename(d->tmp, d->path) != 0) {
            e2 = errno;
            rename(old, d->path);
            sbp_outdir_abort(d);
            return sbp_fail(err, SBP_EIO, "%s: cannot rename the finished directory into place: %s",
                            d->path, strerror(e2));
        }
        sbp_remove_tree(old);
    } else {
        sbp_remove_tree(d->tmp); /* after the swap: the older directory */
    }
    d->tmp[0] = '\0';
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", d->path);
    char *slash = strrchr(parent, '/');
    if (slash == parent)
        parent[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(parent, sizeof parent, ".");
    fsync_path(parent, 1); /* the rename itself; best effort (some file systems refuse) */
    return SBP_OK;
}

/* "<base>.tmp.<pid>[.<suffix>]" or "<base>.old.<pid>[.<suffix>]" with base one of a run's names:
 * *kind 't' or 'o', the pid, and the length of base. 0 when name is not such a leftover. */
static int leftover(const char *name, char *kind, long *pid, size_t *base) {
    static const char *const ours[] = {"checkpoint-",         "loss.csv",
                                       "timing.csv",          "model.safetensors",
                                       "config.json",         "adapter_model.safetensors",
                                       "adapter_config.json", "optimizer.safetensors",
                                       "trainer_state.json"};
    int mine = 0;
    for (size_t i = 0; i < sizeof ours / sizeof *ours && !mine; i++)
        mine = strncmp(name, ours[i], strlen(ours[i])) == 0;
    const char *t = strstr(name, ".tmp.");
    if (!t) t = strstr(name, ".old.");
    if (!mine || !t) return 0;
    char *end;
    errno = 0;
    *pid = strtol(t + 5, &end, 10);
    if (errno || end == t + 5 || *pid <= 0) return 0;
    if (*end == '.') /* the random part: letters and digits only */
        for (end++; *end && ((*end >= 'a' && *end <= 'z') || (*end >= 'A' && *end <= 'Z') ||
                             (*end >= '0' && *end <= '9'));
             end++)
            ;
    if (*end) return 0;
    *kind = t[1], *base = (size_t)(t - name);
    return 1;
}

void sbp_remove_stale(const char *dir) {
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *dp = dfd < 0 ? NULL : fdopendir(dup(dfd));
    if (!dp) {
        if (dfd >= 0) close(dfd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(dp))) {
        char kind, base[256];
        long pid;
        size_t nb;
        if (!leftover(e->d_name, &kind, &pid, &nb) || nb >= sizeof base) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to tell */
        memcpy(base, e->d_name, nb);
        base[nb] = '\0';
        struct stat sb, bb;
        if (fstatat(dfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue;
        /* an older directory moved aside by a writer that died before the new one was in place:
         * it is the complete copy, so it goes back under its name */
        if (kind == 'o' && S_ISDIR(sb.st_mode) &&
            fstatat(dfd, base, &bb, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT &&
            renameat(dfd, e->d_name, dfd, base) == 0)
            continue;
        if (S_ISDIR(sb.st_mode)) {
            int sub = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                remove_under(sub, 8);
                close(sub);
            }
            unlinkat(dfd, e->d_name, AT_REMOVEDIR);
        } else {
            unlinkat(dfd, e->d_name, 0); /* a file, or a link removed as a link */
        }
    }
    closedir(dp);
    close(dfd);
}

void sbp_outdir_abort(sbp_outdir *d) {
    if (d->tmp[0]) sbp_remove_tree(d->tmp);
    d->tmp[0] = '\0';
}

sbp_status sbp_model_save_files(const char *dir, const sbp_model *m, const char *config_json,
                                const char *const *meta, sbp_err *err) {
    /* weights first, each file atomically: a config.json never stands beside missing or older
     * weights (a full disk stops the save after the weights at worst, with the error) */
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    /* a gradient file and a weight file are the same thing: one tensor per parameter, HF names */
    sbp_status st = sbp_grads_save(path, &m->params, m->prec, m->w, meta, err);
    if (st) return st;
    snprintf(path, sizeof path, "%s/config.json", dir);
    return sbp_write_atomic(path, config_json, strlen(config_json), err);
}

sbp_status sbp_file_sha256(char out[65], const char *path, sbp_err *err) {
    FILE *f;
    uint64_t size;
    sbp_status st = sbp_open_regular(&f, &size, path, err);
    if (st) return st;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char buf[1 << 16], md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0) ok = EVP_DigestUpdate(ctx, buf, n);
    ok = ok && !ferror(f) && EVP_DigestFinal_ex(ctx, md, &len) && len == 32;
    EVP_MD_CTX_free(ctx);
    fclose(f);
    if (!ok) return sbp_fail(err, SBP_EIO, "%s: cannot read it to hash it", path);
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
    return SBP_OK;
}

sbp_status sbp_checkpoint_verify(const char *ckpt, int *recorded, sbp_err *err) {
    char p[4300], *text = NULL;
    size_t n = 0;
    sbp_train_state ts;
    *recorded = 0;
    if (snprintf(p, sizeof p, "%s/trainer_state.json", ckpt) >= (int)sizeof p)
        return sbp_fail(err, SBP_EUSAGE, "%s: path too long", ckpt);
    sbp_status st = sbp_read_text(&text, &n, p, 16u << 20, err);
    if (!st) st = sbp_train_state_parse(&ts, text, n, p, err);
    free(text);
    if (st) return st;
    *recorded = ts.files != NULL;
    const cJSON *f;
    /* the parser checked each name is one component of the checkpoint and each hash's form */
    cJSON_ArrayForEach(f, ts.files) {
        char got[65];
        if (snprintf(p, sizeof p, "%s/%s", ckpt, f->string) >= (int)sizeof p)
            st = sbp_fail(err, SBP_EUSAGE, "%s: path too long", ckpt);
        else if ((st = sbp_file_sha256(got, p, err)))
            ;
        else if (strcmp(got, f->valuestring) != 0)
            st = sbp_fail(err, SBP_EINPUT,
                          "%s does not match the SHA-256 its trainer_state.json recorded (the "
                          "file was changed or damaged after the checkpoint was written)",
                          f->string);
        if (st) break;
    }
    sbp_train_state_free(&ts);
    return st;
}

long sbp_checkpoint_number(const char *name) {
    if (strncmp(name, "checkpoint-", 11) != 0 || !name[11] || strlen(name + 11) > 9) return -1;
    long v = 0;
    for (const char *c = name + 11; *c; c++) {
        if (*c < '0' || *c > '9') return -1;
        v = v * 10 + (*c - '0');
    }
    return v;
}

/* Whether name, in the directory open as fd, is a directory (not a link to one) holding a
 * regular trainer_state.json (not a link to one). */
static int holds_state(int fd, const char *name) {
    struct stat sb;
    if (fstatat(fd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode)) return 0;
    int d = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d < 0) return 0;
    int ok = fstatat(d, "trainer_state.json", &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode);
    close(d);
    return ok;
}

long sbp_checkpoint_newest(char *out, size_t n, const char *dir, long below) {
    DIR *dp = opendir(dir);
    if (!dp) return -1;
    long best = -1;
    struct dirent *e;
    while ((e = readdir(dp))) {
        long k = sbp_checkpoint_number(e->d_name);
        if (k > best && k < below && holds_state(dirfd(dp), e->d_name)) best = k;
    }
    closedir(dp);
    if (best < 0 || snprintf(out, n, "%s/checkpoint-%ld", dir, best) >= (int)n) return -1;
    return best;
}

sbp_status sbp_checkpoint_resume_point(char *ckpt, size_t n, const char *path, int *recorded,
                                       sbp_err *err) {
    struct stat sb;
    char p[4300];
    long k = -1;
    *recorded = 0;
    if (snprintf(p, sizeof p, "%s/trainer_state.json", path) < (int)sizeof p &&
        lstat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
        if (snprintf(ckpt, n, "%s", path) >= (int)n)
            return sbp_fail(err, SBP_EUSAGE, "--resume %s: path too long", path);
        k = 0;
    } else
        k = sbp_checkpoint_newest(ckpt, n, path, LONG_MAX);
    if (k < 0)
        return sbp_fail(err, SBP_EIO,
                        "--resume %s: no checkpoint there (no trainer_state.json, and no "
                        "checkpoint-N directory holding one); a run that ended before its first "
                        "checkpoint starts again without --resume",
                        path);
    sbp_status st = sbp_checkpoint_verify(ckpt, recorded, err);
    if (!st) return SBP_OK;
    /* one that fails is never replaced silently by an older one: it is named, with why, and
     * the newest that verifies */
    char why[700], other[4300] = "";
    snprintf(why, sizeof why, "%.600s", err->msg);
    for (long below = k;
         k > 0 && (below = sbp_checkpoint_newest(other, sizeof other, path, below)) >= 0;) {
        sbp_err e2 = {0};
        int r2;
        if (sbp_checkpoint_verify(other, &r2, &e2) == SBP_OK) break;
        other[0] = '\0';
    }
    if (k > 0 && other[0])
        return sbp_fail(err, SBP_EINPUT,
                        "--resume %s: the newest checkpoint, %s, fails verification: %s. The "
                        "newest that verifies is %s: resume from it with --resume %s",
                        path, ckpt, why, other, other);
    return sbp_fail(err, SBP_EINPUT, "--resume %s: %s fails verification: %s%s", path, ckpt, why,
                    k > 0 ? "; no older checkpoint verifies either" : "");
}
