/* rundir.c — a training run's directory: whether it holds a run, where a run starts (fresh, or
 * from which checkpoint), and its two logs, written atomically and then appended to (see
 * run.h). Nothing here follows a symbolic link to a log or a checkpoint. */
#include "run.h"

#include "../core/err.h"
#include "../io/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int is_dir(const char *p) {
    struct stat sb;
    return lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}
static int is_file(const char *p) {
    struct stat sb;
    return lstat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

const char *sbp_rundir_holds_run(const char *dir) {
    /* the logs alone are not a run to keep: a run that died before its first checkpoint leaves
     * only them, and a fresh run starts over (sbp_rundir_start says so) */
    static const char *const files[] = {"model.safetensors", "trainer_state.json",
                                        "adapter_model.safetensors"};
    char p[4300];
    if (!is_dir(dir)) return NULL;
    for (int i = 0; i < 3; i++)
        if (snprintf(p, sizeof p, "%s/%s", dir, files[i]) < (int)sizeof p && is_file(p))
            return files[i];
    DIR *dp = opendir(dir);
    const char *found = NULL;
    if (dp) {
        struct dirent *e;
        while ((e = readdir(dp)) && !found)
            if (sbp_checkpoint_number(e->d_name) >= 0) found = "checkpoint directories";
        closedir(dp);
    }
    return found;
}

sbp_status sbp_rundir_start(sbp_run_start *s, const char *out, const char *resume, sbp_err *err) {
    struct stat sb;
    memset(s, 0, sizeof *s);
    if (strlen(out) > SBP_RUN_PATH_MAX)
        return sbp_fail(err, SBP_EUSAGE, "--out %.60s...: path too long", out);
    if (stat(out, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return sbp_fail(err, SBP_EIO, "--out %s: exists and is not a directory", out);
    sbp_status st;
    if (resume) {
        int recorded;
        if ((st = sbp_checkpoint_resume_point(s->ckpt, sizeof s->ckpt, resume, &recorded, err)))
            return st;
        s->unverified = !recorded;
    }
    const char *found = sbp_rundir_holds_run(out);
    if (found && !resume)
        return sbp_fail(err, SBP_EINPUT,
                        "--out %s already holds a training run (%s); continue it with --resume "
                        "%s, or give another --out",
                        out, found, out);
    if (found) { /* only the checkpoint's own run directory may be continued in place */
        char parent[4400], rp_out[PATH_MAX], rp_parent[PATH_MAX];
        snprintf(parent, sizeof parent, "%s/..", s->ckpt);
        if (!realpath(out, rp_out) || !realpath(parent, rp_parent) ||
            strcmp(rp_out, rp_parent) != 0)
            return sbp_fail(err, SBP_EINPUT,
                            "--out %s holds another training run (%s) than the checkpoint %s; "
                            "resume into the checkpoint's run directory or an empty one",
                            out, found, s->ckpt);
    }
    char p[4300];
    snprintf(p, sizeof p, "%s/loss.csv", out);
    s->stale_logs = !found && !resume && is_file(p);
    return SBP_OK;
}

/* mkdir -p: every missing parent of dir, then dir (0755). */
static int mkdir_p(const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return errno = ENAMETOOLONG, -1;
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
            *s = '/';
        }
    return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* A log just written in place, opened for appending: never through a symbolic link (one planted
 * there after the write is refused, not followed), a regular file only. */
static FILE *open_append(const char *path) {
    int fd = open(path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (fd >= 0) close(fd), errno = EINVAL;
        return NULL;
    }
    FILE *f = fdopen(fd, "ab");
    if (!f) close(fd);
    return f;
}

sbp_status sbp_rundir_open_logs(sbp_run_logs *l, const char *out, const sbp_run_state *rs,
                                sbp_err *err) {
    memset(l, 0, sizeof *l);
    if (mkdir_p(out) != 0)
        return sbp_fail(err, SBP_EIO, "--out %s: cannot create the directory: %s", out,
                        strerror(errno));
    sbp_remove_stale(out);
    char p[4300];
    snprintf(p, sizeof p, "%s/loss.csv", out);
    sbp_status st = sbp_write_atomic(p, rs->loss_csv, rs->loss_len, err);
    if (!st && !(l->loss = open_append(p)))
        st = sbp_fail(err, SBP_EIO, "%s: cannot open for appending: %s", p, strerror(errno));
    snprintf(p, sizeof p, "%s/timing.csv", out);
    if (!st) st = sbp_write_atomic(p, rs->timing_csv, rs->timing_len, err);
    if (!st && !(l->timing = open_append(p)))
        st = sbp_fail(err, SBP_EIO, "%s: cannot open for appending: %s", p, strerror(errno));
    if (!st) l->out = out;
    return st;
}

/* One row onto a log: into the run state's copy (for the next checkpoint) and the file. */
static sbp_status log_row(FILE *f, char **buf, size_t *len, size_t *cap, const char *row,
                          const char *name, const char *out, sbp_err *err) {
    if (!sbp_text_append(buf, len, cap, row)) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    if (fputs(row, f) < 0 || fflush(f) != 0)
        return sbp_fail(err, SBP_EIO, "%s/%s: write failed: %s", out, name, strerror(errno));
    return SBP_OK;
}

sbp_status sbp_rundir_log(sbp_run_logs *l, sbp_run_state *rs, const char *loss_row,
                          const char *timing_row, sbp_err *err) {
    sbp_status st = log_row(l->loss, &rs->loss_csv, &rs->loss_len, &rs->loss_cap, loss_row,
                            "loss.csv", l->out, err);
    if (!st)
        st = log_row(l->timing, &rs->timing_csv, &rs->timing_len, &rs->timing_cap, timing_row,
                     "timing.csv", l->out, err);
    return st;
}

void sbp_rundir_close_logs(sbp_run_logs *l) {
    if (l->loss) fclose(l->loss);
    if (l->timing) fclose(l->timing);
    l->loss = l->timing = NULL;
}
