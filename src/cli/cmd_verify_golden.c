/* cmd_verify_golden.c — `streambp verify golden`: the committed golden cases recomputed on this
 * machine, compiler and device, against the committed digests. The portable numerics promise
 * the same bits everywhere (docs/numerics.md §12); this is the one command that
 * tells a user on a new CPU, compiler or GPU whether the promise holds there.
 *
 * The cases, their models' configs, batches and digests are built into the binary
 * (golden_data.h), so it needs no checkout. Each case runs this very binary as tests/test_golden.c
 * does (`init --seed 1`, then `grad --numerics portable`) in a private temporary directory, and
 * compares the fingerprint of the gradient file (`verify digest`) line by line. */
#include "verify/digest.h"
#include "../core/err.h"
#include "../io/file.h"
#include "verify/text.h"
#include "cli.h"
#include "golden_data.h"
#include "cmd_verify.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static const char usage[] =
    "usage: streambp verify golden [--devices LIST] [--all] [--golden-dir DIR]\n"
    "\n"
    "Recomputes the committed golden cases (every bundled family with golden digests: SFT, DPO "
    "and\n"
    "GRPO in fp32 and fp64, portable numerics) on this machine and compares each gradient's\n"
    "fingerprint (SHA-256 per tensor, the loss's bits) with the committed one, built into this\n"
    "binary. A FAIL names the first tensor that differs: the portable arithmetic does not give\n"
    "the same bits here (a compiler, CPU or GPU that breaks the contract, or a changed kernel).\n"
    "The default `streambp verify` runs this step too.\n"
    "\n"
    "  --devices LIST   cpu and devices to run the cases on: cuda, cuda-emu (default cpu)\n"
    "  --all            each case in the three run configurations of tests/test_golden.c (full on\n"
    "                   1 thread; stream with ragged chunks on 2; ckpt with chunked logits and\n"
    "                   another block); default: the stream one only\n"
    "  --golden-dir DIR compare with DIR/<family>-<objective>-<precision>.txt instead of the\n"
    "                   built-in digests (e.g. a checkout's data/golden)\n"
    "Exit status: 0 every case matches, 1 one differs, 2 usage or input error.\n";

static const char *const runs[] = {
    "--schedule stream --chunk 7 --logit-chunk 5 --block 4 --threads 2",
    "--schedule full --threads 1",
    "--schedule ckpt --chunked-logits --logit-chunk 3 --block 16 --threads 2",
};

/* The objective options of each golden objective (as tests/test_golden.c gives them). */
static const char *objective_options(const char *obj) {
    if (strcmp(obj, "dpo") == 0) return "--objective dpo --beta 0.1";
    if (strcmp(obj, "grpo") == 0)
        return "--objective grpo --loss-type bnpo --beta 0.04 --temperature 0.7 "
               "--epsilon-high 0.28";
    return strcmp(obj, "sft") == 0 ? "" : NULL;
}

static const golden_file *find(const char *path) {
    for (int i = 0; i < golden_n_files; i++)
        if (strcmp(golden_files[i].path, path) == 0) return &golden_files[i];
    return NULL;
}

/* Writes a built-in file into our private directory (created by mkdtemp: nothing else is in it,
 * and O_EXCL | O_NOFOLLOW would refuse a name planted there anyway). */
static int put(int dirfd, const char *name, const golden_file *g) {
    int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    size_t at = 0;
    while (at < g->size) {
        ssize_t w = write(fd, g->data + at, g->size - at);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        at += (size_t)w;
    }
    return close(fd);
}

/* Runs this binary with the words of `args` (split at spaces; no word holds one), output to
 * log. Returns its exit status, or -1. */
static int run_self(const char *log, const char *args) {
    char buf[16384], *argv[64];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", args);
    argv[n++] = "streambp";
    for (char *save = NULL, *w = strtok_r(buf, " ", &save); w && n < 63;
         w = strtok_r(NULL, " ", &save))
        argv[n++] = w;
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa)) return -1;
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) return -1;
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The fingerprint of a gradient file as `verify digest` prints it (malloc'd), or NULL. */
static char *fingerprint(const char *path, sbp_err *err) {
    sbp_file_digest d;
    if (sbp_digest_file(&d, path, err)) return NULL;
    char *s = sbp_digest_text(&d);
    sbp_file_digest_free(&d);
    if (!s) sbp_fail(err, SBP_ENOMEM, "out of memory");
    return s;
}

typedef struct {
    const char *devices[4];
    int n_devices, all;
    const char *golden_dir;
} golden_opts;

/* One case on one device in one run configuration: 0 match, 1 differ, 2 could not run. */
static int one_case(char *why, size_t why_n, const char *tmp, const char *family, const char *obj,
                    const char *prec, const char *device, int run, const char *want) {
    char model[4400], out[4600], log[4200], args[16384];
    snprintf(model, sizeof model, "%s/model-%s", tmp, family);
    snprintf(log, sizeof log, "%s/log.txt", tmp);
    snprintf(out, sizeof out, "%s/grad-%s-%s-%s-%s-%d.safetensors", tmp, family, obj, prec, device,
             run);
    struct stat sb;
    if (lstat(model, &sb) != 0) {
        snprintf(args, sizeof args, "init --config %s/%s.json --seed 1 --out %s", tmp, family,
                 model);
        if (run_self(log, args) != 0) {
            snprintf(why, why_n, "streambp init failed (is the bundled config readable?)");
            return 2;
        }
    }
    snprintf(args, sizeof args,
             "grad --model %s --batch %s/%s-tiny.safetensors %s --precision %s --numerics "
             "portable %s --device %s --out %s",
             model, tmp, obj, objective_options(obj), prec, runs[run], device, out);
    int rc = run_self(log, args);
    if (rc != 0) {
        char *text = NULL;
        size_t n = 0;
        sbp_err err = {0};
        if (sbp_read_text(&text, &n, log, 1 << 16, &err) == SBP_OK) {
            char *nl = strrchr(text, '\n');
            if (nl && nl == text + n - 1) *nl = '\0';
            nl = strrchr(text, '\n');
            snprintf(why, why_n, "grad exited %d: %.300s", rc, nl ? nl + 1 : text);
        } else {
            snprintf(why, why_n, "grad exited %d", rc);
        }
        free(text);
        return 2;
    }
    sbp_err err = {0};
    char *got = fingerprint(out, &err);
    unlink(out);
    if (!got) {
        snprintf(why, why_n, "%.400s", err.msg);
        return 2;
    }
    char diff[256];
    sbp_digest_first_difference(diff, sizeof diff, got, want);
    free(got);
    if (!diff[0]) return 0;
    snprintf(why, why_n, "%s differs from the golden digest", diff);
    return 1;
}

int golden_check(FILE *f, const char *const *devices, int n_devices, int all,
                 const char *golden_dir) {
    /* the paths go to the child as words split at spaces: a TMPDIR with one is not used */
    const char *base = getenv("TMPDIR") && getenv("TMPDIR")[0] && !strchr(getenv("TMPDIR"), ' ')
                           ? getenv("TMPDIR")
                           : "/tmp";
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s/streambp-golden-XXXXXX", base);
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "streambp verify golden: cannot create a directory under %s: %s\n", base,
                strerror(errno));
        return EXIT_USAGE;
    }
    int dirfd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int cases = 0, failed = 0, broken = 0;
    for (int i = 0; dirfd >= 0 && i < golden_n_files; i++) {
        const char *p = golden_files[i].path;
        if (strncmp(p, "data/golden/", 12) != 0) continue;
        /* <family>-<objective>-<precision>.txt; the family may hold '-' */
        char name[128], family[128], obj[16], prec[16];
        snprintf(name, sizeof name, "%s", p + 12);
        char *dot = strrchr(name, '.'), *d2 = dot ? (*dot = '\0', strrchr(name, '-')) : NULL;
        char *d1 = d2 ? (*d2 = '\0', strrchr(name, '-')) : NULL;
        if (!d1) continue;
        *d1 = '\0';
        snprintf(family, sizeof family, "%s", name);
        snprintf(obj, sizeof obj, "%s", d1 + 1);
        snprintf(prec, sizeof prec, "%s", d2 + 1);
        char cfg[160], batch[64], leaf[200];
        snprintf(cfg, sizeof cfg, "data/models/%s.json", family);
        snprintf(batch, sizeof batch, "data/batches/%s-tiny.safetensors", obj);
        const golden_file *gc = find(cfg), *gb = find(batch);
        if (!gc || !gb || !objective_options(obj)) continue;
        snprintf(leaf, sizeof leaf, "%s.json", family);
        struct stat sb;
        if (fstatat(dirfd, leaf, &sb, AT_SYMLINK_NOFOLLOW) != 0) put(dirfd, leaf, gc);
        snprintf(leaf, sizeof leaf, "%s-tiny.safetensors", obj);
        if (fstatat(dirfd, leaf, &sb, AT_SYMLINK_NOFOLLOW) != 0) put(dirfd, leaf, gb);
        char *want = NULL;
        if (golden_dir) {
            char path[4200];
            size_t n;
            sbp_err err = {0};
            snprintf(path, sizeof path, "%s/%s", golden_dir, p + 12);
            if (sbp_read_text(&want, &n, path, 1 << 20, &err)) {
                if (f)
                    fprintf(f, "golden  %-12s %-4s %-4s  %-8s  ERROR  %s\n", family, obj, prec, "-",
                            err.msg);
                broken++, cases++;
                continue;
            }
        } else if ((want = malloc(golden_files[i].size + 1))) {
            memcpy(want, golden_files[i].data, golden_files[i].size);
            want[golden_files[i].size] = '\0';
        }
        for (int dv = 0; want && dv < n_devices; dv++)
            for (int r = 0; r < (all ? 3 : 1); r++) {
                char why[512] = "";
                int v = one_case(why, sizeof why, tmp, family, obj, prec, devices[dv], r, want);
                cases++, failed += v == 1, broken += v == 2;
                if (f)
                    fprintf(f, "golden  %-12s %-4s %-4s  %-8s  %s%s%s%s%s\n", family, obj, prec,
                            devices[dv],
                            v == 0   ? "PASS"
                            : v == 1 ? "FAIL"
                                     : "ERROR",
                            v ? "  " : "", why, v && all ? " — run " : "", v && all ? runs[r] : "");
            }
        free(want);
    }
    if (dirfd >= 0) close(dirfd);
    sbp_remove_tree(tmp); /* ours (mkdtemp), walked without following a link */
    if (f)
        fprintf(f, "golden: %d case runs on %d device%s, %d pass, %d differ, %d could not run\n",
                cases, n_devices, n_devices == 1 ? "" : "s", cases - failed - broken, failed,
                broken);
    if (cases == 0) {
        fprintf(stderr, "streambp verify golden: no golden case is built into this binary\n");
        return EXIT_USAGE;
    }
    return broken ? EXIT_USAGE : failed ? EXIT_MISMATCH : 0;
}

int verify_golden(int argc, char **argv) {
    static const struct option opts[] = {{"devices", required_argument, 0, 'd'},
                                         {"all", no_argument, 0, 'a'},
                                         {"golden-dir", required_argument, 0, 'g'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *devices[4] = {"cpu"}, *golden_dir = NULL;
    char list[256] = "";
    int n_devices = 1, all = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'd': {
            snprintf(list, sizeof list, "%s", optarg);
            n_devices = 0;
            for (char *save = NULL, *w = strtok_r(list, ",", &save); w;
                 w = strtok_r(NULL, ",", &save)) {
                sbp_device dev;
                if (n_devices == 4 || !parse_device("verify golden", w, &dev)) return EXIT_USAGE;
                devices[n_devices++] = w;
            }
            if (!n_devices) {
                fprintf(stderr, "streambp verify golden: --devices is empty\n");
                return EXIT_USAGE;
            }
            break;
        }
        case 'a': all = 1; break;
        case 'g': golden_dir = optarg; break;
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fputs(usage, stderr);
        return EXIT_USAGE;
    }
    return golden_check(stdout, devices, n_devices, all, golden_dir);
}
