/* accuracy.c — `make accuracy`: the per-tensor error of float32 fast and portable against a
 * float64 truth, for each family's measuring model at several sequence lengths (accuracy.h).
 *
 *   build/accuracy [--seq T,T,...] [--family f,f,...] [--threads N] [--all] [--wide]
 *                  [--seed S] [--torch FILE]
 *   build/accuracy --write-models DIR [--wide] [--seed S]   DIR/<family>: the measuring models,
 *                                                             for torch
 *
 * --wide measures the models at a real model's widths (accuracy.h: hidden 1024, F 3072,
 * head_dim 128), where the products' sums over K are as long as a user's. --seed S (default 1,
 * the table's) draws the weights and the tokens with seed S: python/tests/accuracy_seeds.py runs
 * several, to tell a tensor's systematic excess from one draw's spread.
 *
 * Prints, per family and T, the worst ten tensors (by the larger of the two errors) with both
 * errors; --all prints every tensor. --torch FILE adds the column of torch float32's errors
 * written by python/tests/accuracy_torch.py (lines "family T name error") and the ratios
 * ours / torch. Exit 0, or 2 on a usage or run error. */
#include "accuracy.h"
#include "../src/io/file.h"

#include <errno.h>
#include <sys/stat.h>
#include <time.h>

typedef struct {
    char family[16], name[80];
    int T;
    double err;
} torch_row;

/* torch's error of (family, T, name), or −1 when the file has none */
static double torch_err(const torch_row *tr, int ntr, const char *family, int T, const char *name) {
    for (int i = 0; i < ntr; i++)
        if (tr[i].T == T && !strcmp(tr[i].family, family) && !strcmp(tr[i].name, name))
            return tr[i].err;
    return -1;
}

static int load_torch(torch_row **tr, int *ntr, const char *path) {
    FILE *f; /* a regular file only: a FIFO or device named here is refused, never waited on */
    uint64_t size;
    sbp_err err = {0};
    if (sbp_open_regular(&f, &size, path, &err))
        return fprintf(stderr, "accuracy: %s\n", err.msg), -1;
    int cap = 0;
    torch_row r;
    while (fscanf(f, "%15s %d %79s %lf", r.family, &r.T, r.name, &r.err) == 4) {
        if (*ntr == cap) {
            cap = cap ? 2 * cap : 256;
            torch_row *p = realloc(*tr, sizeof *p * (size_t)cap);
            if (!p) return fclose(f), -1;
            *tr = p;
        }
        (*tr)[(*ntr)++] = r;
    }
    fclose(f);
    return 0;
}

static double worst(const acc_row *r) {
    return r->err[ACC_FAST] > r->err[ACC_PORTABLE] ? r->err[ACC_FAST] : r->err[ACC_PORTABLE];
}

static int by_worst(const void *a, const void *b) {
    const double x = worst(a), y = worst(b);
    return x < y ? 1 : x > y ? -1 : 0;
}

static void print_rows(acc_row *rows, int n, int all, const char *family, int T,
                       const torch_row *tr, int ntr) {
    qsort(rows, (size_t)n, sizeof *rows, by_worst);
    printf("%-8s %6s  %-44s %10s %10s", "family", "T", "tensor", "fast", "portable");
    if (ntr) printf(" %10s %10s %10s", "torch", "fast/t", "port/t");
    printf("\n");
    for (int i = 0; i < n && (all || i < 10); i++) {
        printf("%-8s %6d  %-44s %10.3e %10.3e", family, T, rows[i].name, rows[i].err[ACC_FAST],
               rows[i].err[ACC_PORTABLE]);
        const double t = ntr ? torch_err(tr, ntr, family, T, rows[i].name) : -1;
        if (t > 0)
            printf(" %10.3e %10.2f %10.2f", t, rows[i].err[ACC_FAST] / t,
                   rows[i].err[ACC_PORTABLE] / t);
        else if (ntr)
            printf(" %10s", "-");
        printf("\n");
    }
    fflush(stdout);
}

/* DIR/<family> for every family: the measuring models (python/tests/accuracy_torch.py) */
static int write_models(const char *dir, int wide, uint64_t seed) {
    char path[4096];
    if (mkdir(dir, 0755) && errno != EEXIST)
        return fprintf(stderr, "accuracy: cannot create %s\n", dir), 2;
    for (int f = 0; f < ACC_NFAMILIES; f++) {
        sbp_err err = {0};
        snprintf(path, sizeof path, "%s/%s", dir, acc_families[f]);
        if (acc_make_model(acc_families[f], wide, seed, path, &err))
            return fprintf(stderr, "accuracy: %s\n", err.msg), 2;
    }
    return 0;
}

/* Parses "a,b,c" of ints into out (at most cap); the count, or −1. */
static int parse_ints(int *out, int cap, const char *s) {
    int n = 0;
    for (const char *p = s; *p && n < cap;) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1 << 20) return -1;
        out[n++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

int main(int argc, char **argv) {
    int Ts[16] = {512, 2048, 8192}, nT = 3, threads = 2, all = 0, ntr = 0, wide = 0;
    const char *fams = "qwen3,qwen2,llama3,gemma3", *models = NULL;
    uint64_t seed = 1;
    torch_row *tr = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seq") && i + 1 < argc) {
            if ((nT = parse_ints(Ts, 16, argv[++i])) < 1)
                return fprintf(stderr, "accuracy: bad --seq\n"), 2;
        } else if (!strcmp(argv[i], "--family") && i + 1 < argc) {
            fams = argv[++i];
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--write-models") && i + 1 < argc) {
            models = argv[++i];
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            char *end;
            errno = 0;
            const unsigned long long v = strtoull(argv[++i], &end, 10);
            if (errno || *end || end == argv[i] || argv[i][0] == '-' || v > UINT32_MAX)
                return fprintf(stderr, "accuracy: bad --seed '%s' (0 .. 2^32-1)\n", argv[i]), 2;
            seed = (uint64_t)v;
        } else if (!strcmp(argv[i], "--wide")) {
            wide = 1;
        } else if (!strcmp(argv[i], "--all")) {
            all = 1;
        } else if (!strcmp(argv[i], "--torch") && i + 1 < argc) {
            if (load_torch(&tr, &ntr, argv[++i])) return 2;
        } else {
            fprintf(stderr, "usage: accuracy [--seq T,T,...] [--family f,...] [--threads N] "
                            "[--all] [--wide] [--seed S] [--torch FILE]\n"
                            "       accuracy --write-models DIR [--wide] [--seed S]\n");
            return 2;
        }
    }
    if (models) return write_models(models, wide, seed);
    sbp_set_threads(threads);
    char list[256];
    snprintf(list, sizeof list, "%s", fams);
    for (char *save = NULL, *f = strtok_r(list, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        char dir[] = "/tmp/streambp-accuracy-XXXXXX";
        sbp_err err = {0};
        if (!mkdtemp(dir)) return fprintf(stderr, "accuracy: mkdtemp failed\n"), 2;
        sbp_status st = acc_make_model(f, wide, seed, dir, &err);
        for (int k = 0; !st && k < nT; k++) {
            acc_row *rows = NULL;
            int n = 0;
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            st = acc_measure(&rows, &n, dir, Ts[k], 0, seed, &err);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if (!st) {
                print_rows(rows, n, all, f, Ts[k], tr, ntr);
                printf("# %s T = %d: %.1f s for the three runs\n\n", f, Ts[k],
                       (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
            }
            free(rows);
        }
        if (sbp_remove_tree(dir)) /* ours (mkdtemp), walked without following a link */
            fprintf(stderr, "accuracy: could not remove %s\n", dir);
        if (st) return fprintf(stderr, "accuracy: %s: %s\n", f, err.msg), 2;
    }
    free(tr);
    return 0;
}
