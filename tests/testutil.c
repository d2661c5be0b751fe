/* testutil.c — shared helpers for the Check suites. */
#include "testutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[512];
static char last_out[1 << 16];

static void cleanup(void) {
    if (tmpdir[0] && getpid() == (pid_t)atol(strrchr(tmpdir, '-') + 1)) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpdir);
    }
}

const char *tu_tmpdir(void) {
    if (!tmpdir[0]) {
        const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(tmpdir, sizeof tmpdir, "%s/streambp-test-%ld", base, (long)getpid());
        mkdir(tmpdir, 0755);
        atexit(cleanup);
    }
    return tmpdir;
}

int tu_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

const char *tu_model(const char *name, uint64_t seed) {
    static char paths[16][600];
    static int n;
    char path[600];
    snprintf(path, sizeof path, "%s/model-%s-%llu", tu_tmpdir(), name, (unsigned long long)seed);
    for (int i = 0; i < n; i++)
        if (strcmp(paths[i], path) == 0) return paths[i];
    char cfgpath[600];
    snprintf(cfgpath, sizeof cfgpath, "data/models/%s.json", name);
    if (!tu_exists(path)) {
        sbp_config cfg;
        sbp_err err = {0};
        if (sbp_config_load(&cfg, cfgpath, &err) || sbp_model_init(&cfg, seed, path, &err))
            ck_abort_msg("cannot create test model %s: %s", name, err.msg);
    }
    ck_assert_int_lt(n, 16);
    snprintf(paths[n], sizeof paths[n], "%s", path);
    return paths[n++];
}

void tu_load(sbp_model *m, sbp_batch *b, const char *model_dir, const char *batch_path,
             sbp_precision prec) {
    sbp_err err = {0};
    if (sbp_model_load(m, model_dir, prec, NULL, &err)) ck_abort_msg("model: %s", err.msg);
    if (b && sbp_batch_load(b, batch_path, &m->cfg, &err)) ck_abort_msg("batch: %s", err.msg);
}

void tu_grad(sbp_grad_result *r, const sbp_model *m, const sbp_batch *b, sbp_schedule s, int block,
             int chunk, int logit_chunk, int chunked_logits) {
    sbp_grad_opts o = {.schedule = s,
                       .block = block,
                       .chunk = chunk,
                       .logit_chunk = logit_chunk,
                       .chunked_logits = chunked_logits};
    sbp_err err = {0};
    if (sbp_grad(r, m, b, &o, NULL, &err))
        ck_abort_msg("sbp_grad (%s, block %d, chunk %d): %s", sbp_schedule_name(s), block, chunk,
                     err.msg);
}

size_t tu_grad_bytes(const sbp_model *m) {
    return (size_t)m->params.total * (m->prec == SBP_FP64 ? sizeof(double) : sizeof(float));
}

double tu_at(const sbp_model *m, const void *g, int64_t i) {
    return m->prec == SBP_FP64 ? ((const double *)g)[i] : ((const float *)g)[i];
}

double tu_rel_l2(const sbp_model *ma, const void *a, const sbp_model *mb, const void *b,
                 const sbp_param *p) {
    double num = 0, den = 0;
    for (int64_t j = 0; j < p->numel; j++) {
        double x = tu_at(ma, a, p->offset + j), y = tu_at(mb, b, p->offset + j);
        num += (x - y) * (x - y);
        den += y * y;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

int tu_first_diff(const sbp_model *m, const void *a, const void *b) {
    size_t esz = m->prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    for (int i = 0; i < m->params.n; i++) {
        const sbp_param *p = &m->params.p[i];
        if (memcmp((const char *)a + esz * p->offset, (const char *)b + esz * p->offset,
                   esz * (size_t)p->numel) != 0)
            return i;
    }
    return -1;
}

const char *tu_bin(void) {
    return getenv("STREAMBP") ? getenv("STREAMBP") : "build/streambp";
}

int tu_sh(const char *fmt, ...) {
    char cmd[4096], full[4800], outpath[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(outpath, sizeof outpath, "%s/last.out", tu_tmpdir());
    snprintf(full, sizeof full, "(%s) > '%s' 2>&1", cmd, outpath);
    int rc = system(full);
    last_out[0] = '\0';
    FILE *f = fopen(outpath, "r");
    if (f) {
        size_t n = fread(last_out, 1, sizeof last_out - 1, f);
        last_out[n] = '\0';
        fclose(f);
    }
    return rc == -1 || !WIFEXITED(rc) ? -1 : WEXITSTATUS(rc);
}

const char *tu_last_output(void) {
    return last_out;
}

int tu_run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
