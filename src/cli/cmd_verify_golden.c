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
#include "verify/golden.h"
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
    "GRPO in fp32 and fp64 on the tiny batches; and the long cases of data/golden/long/cases:\n"
    "T = 300 over three token blocks, V over two vocabulary blocks, a Gemma-3 window across\n"
    "chunks and blocks, bf16 storage, LoRA adapters; portable numerics) on this machine and\n"
    "compares each gradient's fingerprint (SHA-256 per tensor, the loss's bits) with the\n"
    "committed one, built into this binary. A FAIL names the first tensor that differs: the\n"
    "portable arithmetic does not give the same bits here (a compiler, CPU or GPU that breaks\n"
    "the contract, or a changed kernel). The default `streambp verify` runs this step too.\n"
    "\n"
    "  --devices LIST   cpu and devices to run the cases on: cuda, cuda-emu (default cpu); bf16\n"
    "                   storage runs on the CPU only, so its case is skipped on the devices\n"
    "  --all            each case in the three run configurations of tests/test_golden.c (full on\n"
    "                   1 thread; stream with ragged chunks on 2; ckpt with chunked logits and\n"
    "                   another block); default: the stream one only\n"
    "  --golden-dir DIR compare with DIR/<family>-<objective>-<precision>.txt and\n"
    "                   DIR/long/<case>.txt instead of the built-in digests (e.g. a checkout's\n"
    "                   data/golden)\n"
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

/* The last line of a command's log, into why. */
static void log_tail(char *why, size_t why_n, const char *log, const char *cmd, int rc) {
    char *text = NULL;
    size_t n = 0;
    sbp_err err = {0};
    if (sbp_read_text(&text, &n, log, 1 << 16, &err) == SBP_OK) {
        char *nl = strrchr(text, '\n');
        if (nl && nl == text + n - 1) *nl = '\0';
        nl = strrchr(text, '\n');
        snprintf(why, why_n, "%s exited %d: %.300s", cmd, rc, nl ? nl + 1 : text);
    } else {
        snprintf(why, why_n, "%s exited %d", cmd, rc);
    }
    free(text);
}

/* What one case runs: tmp/<config>.json initialised with seed 1 (once per config), an adapter
 * from `lora init <adapter>` (NULL: none), tmp/<batch>.safetensors, and `grad <options>`. */
typedef struct {
    const char *tag; /* names the case's files */
    const char *config, *batch, *adapter, *options;
} case_spec;

/* One case on one device in one run configuration: 0 match, 1 differ, 2 could not run. */
static int one_case(char *why, size_t why_n, const char *tmp, const case_spec *c,
                    const char *device, int run, const char *want) {
    char model[4400], adapter[4400], out[4600], log[4200], args[16384];
    snprintf(model, sizeof model, "%s/model-%s", tmp, c->config);
    snprintf(adapter, sizeof adapter, "%s/adapter-%s", tmp, c->tag);
    snprintf(log, sizeof log, "%s/log.txt", tmp);
    snprintf(out, sizeof out, "%s/grad-%s-%s-%d.safetensors", tmp, c->tag, device, run);
    struct stat sb;
    int rc;
    if (lstat(model, &sb) != 0) {
        snprintf(args, sizeof args, "init --config %s/%s.json --seed 1 --out %s", tmp, c->config,
                 model);
        if ((rc = run_self(log, args)) != 0) {
            log_tail(why, why_n, log, "init", rc);
            return 2;
        }
    }
    if (c->adapter && lstat(adapter, &sb) != 0) {
        snprintf(args, sizeof args, "lora init --model %s %s --seed 1 --out %s", model, c->adapter,
                 adapter);
        if ((rc = run_self(log, args)) != 0) {
            log_tail(why, why_n, log, "lora init", rc);
            return 2;
        }
    }
    snprintf(args, sizeof args,
             "grad --model %s%s%s --batch %s/%s.safetensors %s --numerics portable %s --device %s "
             "--out %s",
             model, c->adapter ? " --lora " : "", c->adapter ? adapter : "", tmp, c->batch,
             c->options, runs[run], device, out);
    if ((rc = run_self(log, args)) != 0) {
        log_tail(why, why_n, log, "grad", rc);
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

/* Writes the built-in file `path` into dirfd as `leaf` unless it is there: 0, or -1 when the
 * binary has no such file or it cannot be written. */
static int put_once(int dirfd, const char *leaf, const char *path) {
    const golden_file *g = find(path);
    struct stat sb;
    if (!g) return -1;
    if (fstatat(dirfd, leaf, &sb, AT_SYMLINK_NOFOLLOW) == 0) return 0;
    return put(dirfd, leaf, g);
}

/* The golden text of `rel` (a path under data/golden/): from golden_dir when given, else built
 * in (malloc'd, NUL-terminated); NULL with the reason in why. */
static char *golden_text(char *why, size_t why_n, const golden_file *builtin, const char *rel,
                         const char *golden_dir) {
    char *want = NULL;
    if (golden_dir) {
        char path[4200];
        size_t n;
        sbp_err err = {0};
        snprintf(path, sizeof path, "%s/%s", golden_dir, rel);
        if (sbp_read_text(&want, &n, path, 1 << 20, &err)) {
            snprintf(why, why_n, "%.400s", err.msg);
            return NULL;
        }
    } else if ((want = malloc(builtin->size + 1))) {
        memcpy(want, builtin->data, builtin->size);
        want[builtin->size] = '\0';
    } else {
        snprintf(why, why_n, "out of memory");
    }
    return want;
}

typedef struct {
    FILE *f;
    const char *const *devices;
    int n_devices, all;
    const char *golden_dir, *tmp;
    int dirfd;
    int cases, failed, broken, skipped;
} golden_run;

/* Runs one case (label: its columns in the report) on every device and run configuration. */
static void run_case(golden_run *g, const char *label, const case_spec *c, int cpu_only,
                     const golden_file *builtin, const char *rel) {
    char why[512] = "";
    char *want = golden_text(why, sizeof why, builtin, rel, g->golden_dir);
    if (!want) {
        if (g->f) fprintf(g->f, "golden  %-22s  %-8s  ERROR  %s\n", label, "-", why);
        g->broken++, g->cases++;
        return;
    }
    for (int dv = 0; dv < g->n_devices; dv++) {
        if (cpu_only && strcmp(g->devices[dv], "cpu") != 0) {
            if (g->f)
                fprintf(g->f, "golden  %-22s  %-8s  skipped (CPU only)\n", label, g->devices[dv]);
            g->skipped++;
            continue;
        }
        for (int r = 0; r < (g->all ? 3 : 1); r++) {
            why[0] = '\0';
            int v = one_case(why, sizeof why, g->tmp, c, g->devices[dv], r, want);
            g->cases++, g->failed += v == 1, g->broken += v == 2;
            if (g->f)
                fprintf(g->f, "golden  %-22s  %-8s  %s%s%s%s%s\n", label, g->devices[dv],
                        v == 0   ? "PASS"
                        : v == 1 ? "FAIL"
                                 : "ERROR",
                        v ? "  " : "", why, v && g->all ? " — run " : "",
                        v && g->all ? runs[r] : "");
        }
    }
    free(want);
}

/* The family cases: data/golden/<family>-<objective>-<precision>.txt on the tiny batches. */
static void family_cases(golden_run *g) {
    for (int i = 0; i < golden_n_files; i++) {
        const char *p = golden_files[i].path;
        if (strncmp(p, "data/golden/", 12) != 0 || strchr(p + 12, '/')) continue;
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
        char cfg[160], batch[64], leaf[200], tag[200], options[256], label[160], bname[64];
        snprintf(cfg, sizeof cfg, "data/models/%s.json", family);
        snprintf(batch, sizeof batch, "data/batches/%s-tiny.safetensors", obj);
        if (!objective_options(obj)) continue;
        snprintf(leaf, sizeof leaf, "%s.json", family);
        if (put_once(g->dirfd, leaf, cfg)) continue;
        snprintf(leaf, sizeof leaf, "%s-tiny.safetensors", obj);
        if (put_once(g->dirfd, leaf, batch)) continue;
        snprintf(tag, sizeof tag, "%s-%s-%s", family, obj, prec);
        snprintf(bname, sizeof bname, "%s-tiny", obj);
        snprintf(options, sizeof options, "%s --precision %s", objective_options(obj), prec);
        snprintf(label, sizeof label, "%-12s %-4s %-4s", family, obj, prec);
        const case_spec c = {.tag = tag, .config = family, .batch = bname, .options = options};
        run_case(g, label, &c, 0, &golden_files[i], p + 12);
    }
}

/* The long cases of the manifest data/golden/long/cases (verify/golden.h). */
static void long_cases(golden_run *g) {
    const golden_file *m = find("data/golden/long/cases");
    if (!m) return;
    char *text = malloc(m->size + 1);
    sbp_golden_case cs[SBP_GOLDEN_MAX_CASES];
    int n = 0;
    sbp_err err = {0};
    if (text) {
        memcpy(text, m->data, m->size);
        text[m->size] = '\0';
    }
    if (!text || sbp_golden_cases_parse(cs, SBP_GOLDEN_MAX_CASES, &n, text,
                                        "data/golden/long/cases", &err)) {
        if (g->f)
            fprintf(g->f, "golden  %-22s  %-8s  ERROR  %s\n", "long cases", "-",
                    text ? err.msg : "out of memory");
        g->broken++, g->cases++;
        free(text);
        return;
    }
    free(text);
    for (int i = 0; i < n; i++) {
        const sbp_golden_case *k = &cs[i];
        char path[256], leaf[200], rel[200];
        snprintf(path, sizeof path, "data/models/%s.json", k->config);
        snprintf(leaf, sizeof leaf, "%s.json", k->config);
        int bad = put_once(g->dirfd, leaf, path);
        snprintf(path, sizeof path, "data/batches/%s.safetensors", k->batch);
        snprintf(leaf, sizeof leaf, "%s.safetensors", k->batch);
        bad |= put_once(g->dirfd, leaf, path);
        snprintf(rel, sizeof rel, "long/%s.txt", k->name);
        snprintf(path, sizeof path, "data/golden/%s", rel);
        const golden_file *digest = find(path);
        if (bad || !digest) {
            if (g->f)
                fprintf(g->f, "golden  %-22s  %-8s  ERROR  %s is not built into this binary\n",
                        k->name, "-", bad ? "its config or batch" : path);
            g->broken++, g->cases++;
            continue;
        }
        const case_spec c = {.tag = k->name,
                             .config = k->config,
                             .batch = k->batch,
                             .adapter = k->adapter[0] ? k->adapter : NULL,
                             .options = k->options};
        run_case(g, k->name, &c, k->cpu_only, digest, rel);
    }
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
    golden_run g = {.f = f,
                    .devices = devices,
                    .n_devices = n_devices,
                    .all = all,
                    .golden_dir = golden_dir,
                    .tmp = tmp,
                    .dirfd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
    if (g.dirfd >= 0) {
        family_cases(&g);
        long_cases(&g);
        close(g.dirfd);
    }
    sbp_remove_tree(tmp); /* ours (mkdtemp), walked without following a link */
    if (f)
        fprintf(f, "golden: %d case runs on %d device%s, %d pass, %d differ, %d could not run%s\n",
                g.cases, n_devices, n_devices == 1 ? "" : "s", g.cases - g.failed - g.broken,
                g.failed, g.broken, g.skipped ? " (CPU-only cases skipped on the devices)" : "");
    if (g.cases == 0) {
        fprintf(stderr, "streambp verify golden: no golden case is built into this binary\n");
        return EXIT_USAGE;
    }
    return g.broken ? EXIT_USAGE : g.failed ? EXIT_MISMATCH : 0;
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
