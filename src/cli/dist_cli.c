/* dist_cli.c — how a command of a distributed run ends on an error (docs/distributed.md). */
#include "../core/err.h"
#include "../dist/dist.h"
#include "cli.h"
#include "verify/text.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int dist_exit(sbp_comm *c, const char *cmd, const sbp_err *err) {
    if (sbp_comm_size(c) <= 1) {
        const int code = report_error(cmd, err);
        sbp_comm_finish(c);
        return code;
    }
    char msg[SBP_TEXT_ESCAPED];
    fprintf(stderr, "streambp %s: rank %d: %s\n", cmd, sbp_comm_rank(c),
            sbp_text_escape(msg, sizeof msg, err->msg));
    if (err->status == SBP_ENUMERIC) { /* every rank holds the same gradient and says the same */
        sbp_comm_finish(c);
        return EXIT_MISMATCH;
    }
    sbp_comm_abort(c, err->status == SBP_EPEER ? EXIT_PEER : EXIT_USAGE);
    return EXIT_USAGE; /* not reached */
}

int parse_comm_timeout(const char *cmd, const char *s, double *out) {
    char *end;
    const double v = strtod(s, &end);
    if (end == s || *end || !(v > 0) || !isfinite(v) || v > 1e7) {
        fprintf(stderr, "streambp %s: --comm-timeout must be seconds > 0, not \"%s\"\n", cmd, s);
        return 0;
    }
    *out = v;
    return 1;
}

int dist_follower(char *scratch, size_t n, char *run, size_t rn, sbp_err *err) {
    const char *tmp = getenv("TMPDIR");
    if (snprintf(scratch, n, "%s/streambp-rank-XXXXXX", tmp && *tmp ? tmp : "/tmp") >= (int)n ||
        !mkdtemp(scratch)) {
        scratch[0] = 0;
        return sbp_fail(err, SBP_EIO, "cannot create a private directory for this rank"), 0;
    }
    if (snprintf(run, rn, "%s/run", scratch) >= (int)rn)
        return sbp_fail(err, SBP_EIO, "the private directory's path is too long"), 0;
    if (!freopen("/dev/null", "w", stdout)) return sbp_fail(err, SBP_EIO, "/dev/null"), 0;
    return 1;
}

/* ---- the start-up check: every process was given the same settings ----------------------------
 */

enum { MAX_KEYS = 96, KEY_LEN = 48 };

typedef struct {
    char key[KEY_LEN]; /* "--lr", or "--jsonl (contents)" */
    uint64_t h;        /* the value's hash */
} setting;

/* Options that change no bit (README "Exactness", docs/distributed.md): they may differ. */
static int may_differ(const char *opt) {
    static const char *const free_opts[] = {"--schedule",  "--chunk",        "--logit-chunk",
                                            "--threads",   "--comm-timeout", "--chunked-logits",
                                            "--json",      "--log-every",    "--plot",
                                            "--mem-limit", "--force"};
    for (size_t i = 0; i < sizeof free_opts / sizeof *free_opts; i++)
        if (strcmp(opt, free_opts[i]) == 0) return 1;
    return 0;
}

/* The hash of a regular file's bytes (0 when it cannot be read: a difference still shows). */
static uint64_t file_hash(const char *path) {
    FILE *f = fopen(path, "rb");
    uint64_t h = 0x5bd1e995;
    char buf[1 << 16];
    size_t n;
    if (!f) return 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) h = sbp_hash64(buf, n, h);
    fclose(f);
    return h;
}

static int add(setting *s, int n, const char *key, const char *suffix, uint64_t h) {
    if (n == MAX_KEYS) return n;
    size_t k = strlen(key), x = strlen(suffix);
    if (k > KEY_LEN - 1) k = KEY_LEN - 1;
    if (k + x > KEY_LEN - 1) x = KEY_LEN - 1 - k;
    memcpy(s[n].key, key, k), memcpy(s[n].key + k, suffix, x);
    s[n].key[k + x] = 0;
    s[n].h = h;
    return n + 1;
}

/* The settings of argv: each option and its value, and the contents of the files that hold the
 * step's data and model configuration. */
static int settings_of(setting *s, int argc, char **argv, int size) {
    int n = add(s, 0, "processes", "", (uint64_t)size);
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i],
                   *val = i + 1 < argc && strncmp(argv[i + 1], "--", 2) ? argv[i + 1] : "";
        if (strncmp(opt, "--", 2)) continue;
        if (*val) i++;
        if (may_differ(opt)) continue;
        int seen = 0; /* a repeated option (--batch, --data) is one setting per occurrence */
        const size_t len = strlen(opt);
        for (int j = 0; j < n; j++)
            seen += !strcmp(s[j].key, opt) ||
                    (!strncmp(s[j].key, opt, len) && !strncmp(s[j].key + len, " #", 2));
        char key[KEY_LEN];
        snprintf(key, sizeof key, seen ? "%.32s #%d" : "%.32s", opt, seen + 1);
        opt = key;
        n = add(s, n, opt, "", sbp_hash64(val, strlen(val), 1));
        if (!strncmp(opt, "--jsonl", 7) || !strncmp(opt, "--data", 6) ||
            !strncmp(opt, "--batch", 7))
            n = add(s, n, opt, " (the data's contents)", file_hash(val));
        if (!strcmp(opt, "--model") || !strcmp(opt, "--lora") || !strcmp(opt, "--ref-model")) {
            char p[4200];
            snprintf(p, sizeof p, "%s/%s", val,
                     strcmp(opt, "--lora") ? "config.json" : "adapter_config.json");
            n = add(s, n, opt, " (its configuration)", file_hash(p));
        }
    }
    return n;
}

int dist_check_args(sbp_comm *c, const char *cmd, int argc, char **argv, sbp_err *err) {
    const int N = sbp_comm_size(c);
    if (N <= 1) return 0;
    setting mine[MAX_KEYS];
    memset(mine, 0, sizeof mine);
    const int n = settings_of(mine, argc, argv, N);
    setting *all = calloc((size_t)N * MAX_KEYS, sizeof *all);
    if (!all) {
        sbp_fail(err, SBP_ENOMEM, "out of memory");
        return dist_exit(c, cmd, err);
    }
    if (sbp_comm_allgather(c, all, mine, sizeof mine, "the start-up check", err)) {
        free(all);
        return dist_exit(c, cmd, err);
    }
    /* the first setting, in rank 0's order and then rank r's, that some rank r has otherwise */
    const char *what = NULL;
    int rank = -1;
    for (int r = 1; r < N && !what; r++)
        for (int pass = 0; pass < 2 && !what; pass++) {
            const setting *a = pass ? &all[r * MAX_KEYS] : all,
                          *b = pass ? all : &all[r * MAX_KEYS];
            for (int i = 0; i < MAX_KEYS && a[i].key[0] && !what; i++) {
                int j = 0;
                while (j < MAX_KEYS && b[j].key[0] && strcmp(a[i].key, b[j].key)) j++;
                if (j == MAX_KEYS || !b[j].key[0] || b[j].h != a[i].h) what = a[i].key, rank = r;
            }
        }
    (void)n;
    if (what) {
        char w[KEY_LEN];
        snprintf(w, sizeof w, "%s", what);
        free(all);
        sbp_fail(err, SBP_EUSAGE,
                 "the processes were not given the same settings: ranks 0 and %d differ in %s "
                 "(every process must run the same command; only --schedule, --chunk, "
                 "--logit-chunk, --chunked-logits and --threads may differ)",
                 rank, w);
        if (sbp_comm_rank(c) == 0) report_error(cmd, err);
        sbp_comm_finish(c); /* every rank found the same difference: all end with 2 */
        return EXIT_USAGE;
    }
    free(all);
    return 0;
}

void dist_report(sbp_comm *c, const char *cmd, int64_t peak) {
    const int N = sbp_comm_size(c);
    if (N <= 1) return;
    int64_t mine[4], *all = calloc((size_t)N * 4, sizeof *all);
    sbp_err err = {0};
    sbp_comm_counters(c, &mine[0], &mine[1]);
    mine[2] = (int64_t)(sbp_comm_waited(c) * 1e6); /* microseconds: exact data only */
    mine[3] = peak;
    if (all && !sbp_comm_allgather(c, all, mine, sizeof mine, "the counters", &err) &&
        sbp_comm_rank(c) == 0) {
        /* the report in one write: stderr is unbuffered, so written piece by piece the line
         * could be split by another rank's output in between (tests/mpi_ranks.sh parses it,
         * and once, under load, found it without its entries) */
        const size_t cap = 256 + strlen(cmd) * 2 + (size_t)N * 64;
        char *line = malloc(cap);
        size_t len = line ? (size_t)snprintf(line, cap,
                                             "streambp %s: %d processes; sent per rank "
                                             "(bytes/messages, s waited):",
                                             cmd, N)
                          : cap;
        int64_t most = 0;
        for (int r = 0; r < N; r++) {
            if (len < cap)
                len += (size_t)snprintf(line + len, cap - len, " %lld/%lld %.3f",
                                        (long long)all[4 * r], (long long)all[4 * r + 1],
                                        all[4 * r + 2] * 1e-6);
            if (all[4 * r + 3] > most) most = all[4 * r + 3];
        }
        if (len < cap)
            snprintf(line + len, cap - len,
                     "\nstreambp %s: ledger peak of the rank holding the most: %lld bytes\n", cmd,
                     (long long)most);
        if (line) fputs(line, stderr);
        free(line);
    }
    free(all);
}

int parse_net_option(const char *cmd, const char *opt, const char *s, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (!strcmp(opt, "bandwidth")) {
        static const char pre[] = "kMGT";
        const char *p = *end ? strchr(pre, *end) : NULL;
        if (p) v *= pow(1e3, (double)(p - pre + 1)), end++;
        if (!strcmp(end, "bit")) v /= 8, end += 3;
    } else if (!strcmp(opt, "flops")) {
        v *= 1e9; /* GFLOP/s */
    }
    const int zero_ok = !strcmp(opt, "latency");
    if (end == s || *end || !isfinite(v) || !(zero_ok ? v >= 0 : v > 0)) {
        fprintf(stderr, "streambp %s: --%s takes %s, not \"%s\"\n", cmd, opt,
                !strcmp(opt, "bandwidth") ? "bytes per second > 0: a number with an optional k, M, "
                                            "G or T (10^3 ... 10^12) and an optional \"bit\" "
                                            "(bits per second), e.g. 10G or 100Gbit"
                : zero_ok                 ? "seconds >= 0, e.g. 5e-6"
                                          : "GFLOP/s > 0 of one process, e.g. 500",
                s);
        return 0;
    }
    *out = v;
    return 1;
}
