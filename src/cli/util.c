/* util.c — option parsing, error reporting, timing and memory reports for the subcommands. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

int parse_pos_int(const char *cmd, const char *opt, const char *text, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < 1 || v > 1 << 30) {
        fprintf(stderr, "streambp %s: --%s must be a positive integer, got \"%s\"\n", cmd, opt,
                text);
        return 0;
    }
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
        fprintf(stderr, "streambp %s: --precision must be fp32 or fp64, got \"%s\"\n", cmd, text);
        return 0;
    }
    return 1;
}

int report_error(const char *cmd, const sbp_err *err) {
    fprintf(stderr, "streambp %s: %s\n", cmd, err->msg);
    return err->status == SBP_ENUMERIC ? EXIT_MISMATCH : EXIT_USAGE;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

long long peak_rss_bytes(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (long long)ru.ru_maxrss * 1024;
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
