/* util.c — option parsing, error reporting, timing and memory reports for the subcommands. */
#include "cli.h"
#include "../core/err.h"
#include "../io/file.h"
#include "verify/text.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* Options with a limit of their own (streambp.h says why); every other one stops at 2^30. */
static long max_of(const char *opt) {
    if (strcmp(opt, "block") == 0) return SBP_MAX_BLOCK;
    if (strcmp(opt, "threads") == 0) return SBP_MAX_THREADS;
    if (strcmp(opt, "r") == 0 || strcmp(opt, "lora-r") == 0) return SBP_MAX_LORA_R;
    return 1L << 30;
}

/* Decimal digits with an optional leading '-': no space, sign '+', exponent, fraction or trailing
 * text, so "1e30" or "12abc" is never read as 1 or 12. *neg tells the sign; *mag the magnitude,
 * or UINT64_MAX when it does not fit in 64 bits. */
static int decimal(const char *text, int *neg, uint64_t *mag) {
    *neg = text[0] == '-';
    const char *p = text + *neg;
    if (!*p) return 0;
    uint64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return 0;
        unsigned d = (unsigned)(*p - '0');
        v = v > (UINT64_MAX - d) / 10 ? UINT64_MAX : v * 10 + d;
    }
    *mag = v;
    return 1;
}

static int bad_int(const char *cmd, const char *opt, const char *text, int64_t lo, int64_t hi) {
    if (lo == 1 || lo == 0)
        fprintf(stderr, "streambp %s: --%s must be a %s integer at most %lld, got \"%s\"\n", cmd,
                opt, lo ? "positive" : "non-negative", (long long)hi, text);
    else
        fprintf(stderr, "streambp %s: --%s must be an integer in [%lld, %lld], got \"%s\"\n", cmd,
                opt, (long long)lo, (long long)hi, text);
    return 0;
}

int parse_int_opt(const char *cmd, const char *opt, const char *text, int64_t lo, int64_t hi,
                  int64_t *out) {
    int neg;
    uint64_t mag;
    if (!decimal(text, &neg, &mag)) return bad_int(cmd, opt, text, lo, hi);
    /* compared as magnitudes: nothing is converted while it may lie outside int64's range */
    uint64_t below = lo < 0 ? (uint64_t)(-(lo + 1)) + 1 : 0; /* |lo| when lo < 0 */
    if (neg ? mag > below : (hi < 0 || mag > (uint64_t)hi)) return bad_int(cmd, opt, text, lo, hi);
    int64_t v = neg ? (mag == below && lo == INT64_MIN ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    if (v < lo || v > hi) return bad_int(cmd, opt, text, lo, hi);
    *out = v;
    return 1;
}

int parse_seed_opt(const char *cmd, const char *opt, const char *text, unsigned long long *out) {
    int neg;
    uint64_t mag;
    if (!decimal(text, &neg, &mag) || neg ||
        (mag == UINT64_MAX && strcmp(text, "18446744073709551615"))) {
        fprintf(stderr, "streambp %s: --%s must be an integer in [0, 2^64), got \"%s\"\n", cmd, opt,
                text);
        return 0;
    }
    *out = mag;
    return 1;
}

int parse_pos_int(const char *cmd, const char *opt, const char *text, int *out) {
    int64_t v;
    if (!parse_int_opt(cmd, opt, text, 1, max_of(opt), &v)) return 0;
    *out = (int)v;
    return 1;
}

int parse_number(const char *cmd, const char *opt, const char *text, double min, double *out) {
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || !isfinite(v) || !(v >= min)) {
        fprintf(stderr, "streambp %s: --%s must be a finite number >= %g, got \"%s\"\n", cmd, opt,
                min, text);
        return 0;
    }
    *out = v;
    return 1;
}

int parse_numerics(const char *cmd, const char *text, sbp_numerics *out) {
    if (sbp_numerics_parse(text, out)) return 1;
    fprintf(stderr, "streambp %s: --numerics must be fast or portable, got \"%s\"\n", cmd, text);
    return 0;
}

int parse_device(const char *cmd, const char *text, sbp_device *out) {
    if (sbp_device_parse(text, out)) return 1;
    fprintf(stderr, "streambp %s: --device must be cpu, cuda or cuda-emu, got \"%s\"\n", cmd, text);
    return 0;
}

int parse_unattended(const char *cmd, const char *text, sbp_unattended *out) {
    if (sbp_unattended_parse(text, out)) return 1;
    fprintf(stderr, "streambp %s: --unattended must be zero, hf-eager or hf-sdpa, got \"%s\"\n",
            cmd, text);
    return 0;
}

int parse_precision(const char *cmd, const char *text, sbp_precision *out) {
    if (strcmp(text, "fp32") == 0)
        *out = SBP_FP32;
    else if (strcmp(text, "fp64") == 0)
        *out = SBP_FP64;
    else {
        fprintf(stderr, "streambp %s: --precision must be fp32, fp64 or bf16, got \"%s\"\n", cmd,
                text);
        return 0;
    }
    return 1;
}

int report_error(const char *cmd, const sbp_err *err) {
    /* the message may quote a file's tensor names or fields: printed inert (sbp_text_escape) */
    char msg[SBP_TEXT_ESCAPED];
    fprintf(stderr, "streambp %s: %s\n", cmd, sbp_text_escape(msg, sizeof msg, err->msg));
    return err->status == SBP_ENUMERIC ? EXIT_MISMATCH
           : err->status == SBP_EPEER  ? EXIT_PEER
                                       : EXIT_USAGE;
}

static void human(char *buf, size_t n, long long bytes) {
    if (bytes < 10 * 1024)
        snprintf(buf, n, "%lld B", bytes);
    else if (bytes < 10LL << 20)
        snprintf(buf, n, "%.1f KiB", bytes / 1024.0);
    else if (bytes < 10LL << 30)
        snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
    else
        snprintf(buf, n, "%.2f GiB", bytes / 1073741824.0);
}

void print_ledger(FILE *f, const sbp_ledger *lg, const char *indent) {
    char a[32], b[32];
    fprintf(f, "%s%-12s %14s %14s\n", indent, "memory", "peak", "at total peak");
    for (int c = 0; c < SBP_MEM_NCATS; c++) {
        if (!lg->peak[c]) continue;
        human(a, sizeof a, lg->peak[c]);
        human(b, sizeof b, lg->at_peak[c]);
        fprintf(f, "%s%-12s %14s %14s\n", indent, sbp_mem_cat_name(c), a, b);
    }
    human(b, sizeof b, lg->peak_total);
    fprintf(f, "%s%-12s %14s %14s\n", indent, "total", "", b);
}

cJSON *ledger_json(const sbp_ledger *lg) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "peak_total_bytes", (double)lg->peak_total);
    cJSON *cats = cJSON_AddObjectToObject(o, "categories");
    for (int c = 0; c < SBP_MEM_NCATS; c++) {
        cJSON *x = cJSON_AddObjectToObject(cats, sbp_mem_cat_name(c));
        cJSON_AddNumberToObject(x, "peak_bytes", (double)lg->peak[c]);
        cJSON_AddNumberToObject(x, "at_total_peak_bytes", (double)lg->at_peak[c]);
        cJSON_AddNumberToObject(x, "current_bytes", (double)lg->cur[c]);
    }
    return o;
}

void print_json(cJSON *o) {
    char *text = cJSON_Print(o);
    if (text)
        puts(text);
    else
        fputs("streambp: out of memory printing JSON\n", stderr);
    free(text);
    cJSON_Delete(o);
}

/* ---------------------------------------------------------------------------------------------
 * Memory a new allocation can still get */

/* The first number after `key` in a text file (e.g. "MemAvailable:" in /proc/meminfo), or -1. */
static long long number_after(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    long long v = -1;
    size_t n = strlen(key);
    while (v < 0 && fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0) v = strtoll(line + n, NULL, 10);
    fclose(f);
    return v;
}

/* A cgroup v2 or v1 memory file holding one number, or -1 ("max", absent, unreadable). */
static long long cgroup_number(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[64] = "";
    long long v = -1;
    if (fgets(buf, sizeof buf, f) && buf[0] >= '0' && buf[0] <= '9') v = strtoll(buf, NULL, 10);
    fclose(f);
    return v;
}

static void lower(int64_t *avail, char *why, size_t n, long long v, const char *what) {
    if (v >= 0 && v < *avail) {
        *avail = v;
        snprintf(why, n, "%s", what);
    }
}

/* The limits of the cgroup v2 hierarchy of this process: memory.max - memory.current of its
 * cgroup and of every parent (each one caps its children). */
static void cgroup_v2(int64_t *avail, char *why, size_t n) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return;
    char line[1024], group[1024] = "";
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "0::", 3) == 0) {
            snprintf(group, sizeof group, "%s", line + 3);
            group[strcspn(group, "\n")] = '\0';
        }
    fclose(f);
    if (!group[0]) return;
    for (;;) {
        char p[1200], what[1300];
        snprintf(p, sizeof p, "/sys/fs/cgroup%s/memory.max", strcmp(group, "/") ? group : "");
        long long max = cgroup_number(p);
        snprintf(p, sizeof p, "/sys/fs/cgroup%s/memory.current", strcmp(group, "/") ? group : "");
        long long cur = cgroup_number(p);
        if (max >= 0) {
            snprintf(what, sizeof what, "memory.max - memory.current of cgroup %s", group);
            lower(avail, why, n, cur >= 0 && cur < max ? max - cur : 0, what);
        }
        char *slash = strrchr(group, '/');
        if (!slash || slash == group) break;
        *slash = '\0';
    }
}

int64_t available_memory(char *why, size_t n) {
    int64_t avail = INT64_MAX;
    snprintf(why, n, "no limit found");
    long long kb = number_after("/proc/meminfo", "MemAvailable:");
    if (kb >= 0) lower(&avail, why, n, kb * 1024, "MemAvailable in /proc/meminfo");
    /* the address-space and data limits count what the process holds already */
    long page = sysconf(_SC_PAGESIZE);
    long long vsz = -1, data = -1;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        long long v[6];
        if (fscanf(f, "%lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) ==
            6)
            vsz = v[0] * page, data = v[5] * page;
        fclose(f);
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && vsz >= 0)
        lower(&avail, why, n, (long long)rl.rlim_cur > vsz ? (long long)rl.rlim_cur - vsz : 0,
              "RLIMIT_AS (ulimit -v) less the address space in use");
    if (getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && data >= 0)
        lower(&avail, why, n, (long long)rl.rlim_cur > data ? (long long)rl.rlim_cur - data : 0,
              "RLIMIT_DATA (ulimit -d) less the data in use");
    cgroup_v2(&avail, why, n);
    long long v1 = cgroup_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    long long u1 = cgroup_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    if (v1 >= 0 && v1 < (1LL << 60))
        lower(&avail, why, n, u1 >= 0 && u1 < v1 ? v1 - u1 : 0,
              "the cgroup v1 memory limit less its usage");
    return avail == INT64_MAX ? -1 : avail;
}

void format_bytes(char *buf, size_t n, int64_t bytes) {
    if (bytes < 1024)
        snprintf(buf, n, "%lld B", (long long)bytes);
    else if (bytes < 1048576)
        snprintf(buf, n, "%.1f KiB", bytes / 1024.0);
    else if (bytes < (1LL << 30))
        snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
    else if (bytes < (1LL << 40))
        snprintf(buf, n, "%.2f GiB", bytes / 1073741824.0);
    else
        snprintf(buf, n, "%.2f TiB", bytes / 1099511627776.0);
}

/* The policy of `init --out` and `lora init --out` (cli.h). */
int out_dir_ready(const char *cmd, const char *dir, const char *const *ours, int force) {
    struct stat sb;
    if (lstat(dir, &sb) != 0) {
        if (errno == ENOENT) return 1;
        fprintf(stderr, "streambp %s: --out %s: %s\n", cmd, dir, strerror(errno));
        return 0;
    }
    if (S_ISLNK(sb.st_mode) || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "streambp %s: --out %s exists and is %s; give a new or empty directory\n",
                cmd, dir, S_ISLNK(sb.st_mode) ? "a symbolic link" : "not a directory");
        return 0;
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *dp = fd < 0 ? NULL : fdopendir(fd);
    if (!dp) {
        if (fd >= 0) close(fd);
        fprintf(stderr, "streambp %s: --out %s: cannot read the directory: %s\n", cmd, dir,
                strerror(errno));
        return 0;
    }
    char found[256] = "", other[256] = "";
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        int mine = 0;
        for (int i = 0; ours[i] && !mine; i++) mine = strcmp(e->d_name, ours[i]) == 0;
        struct stat fb;
        if (mine && (fstatat(fd, e->d_name, &fb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(fb.st_mode)))
            mine = 0; /* our name, but not a regular file: not ours to replace */
        if (mine && !found[0]) snprintf(found, sizeof found, "%s", e->d_name);
        if (!mine && !other[0]) snprintf(other, sizeof other, "%s", e->d_name);
    }
    closedir(dp);
    if (other[0]) {
        fprintf(stderr,
                "streambp %s: --out %s holds \"%s\", which this command does not write; give a "
                "new or empty directory (nothing was changed)\n",
                cmd, dir, other);
        return 0;
    }
    if (found[0] && !force) {
        fprintf(stderr,
                "streambp %s: --out %s already holds %s; pass --force to replace it (nothing was "
                "changed)\n",
                cmd, dir, found);
        return 0;
    }
    return 1;
}

sbp_status out_dir_open(sbp_outdir *d, const char *dir, sbp_err *err) {
    char path[4096];
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--; /* "out/" names "out" */
    if (n >= sizeof path) return sbp_fail(err, SBP_EUSAGE, "--out: name too long: %.80s...", dir);
    memcpy(path, dir, n);
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    if (slash && slash != path) { /* the parents, as mkdir -p */
        *slash = '\0';
        sbp_status st = sbp_make_dirs(path, err);
        *slash = '/';
        if (st) return st;
    }
    return sbp_outdir_open(d, path, err);
}
