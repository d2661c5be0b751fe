/* testutil.c — shared helpers for the Check suites. */
#include "testutil.h"
#include "../src/core/rng.h"

#include <errno.h>
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[512];
/* a command's output: the default verify's JSON (matrix, golden, reach, self-test) is ~90 KB */
static char last_out[1 << 18];

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

void tu_grad_n(sbp_grad_result *r, const sbp_model *m, const sbp_batch *b, sbp_numerics n,
               sbp_schedule s, int block, int chunk, int logit_chunk, int chunked_logits) {
    sbp_grad_opts o = {.schedule = s,
                       .block = block,
                       .chunk = chunk,
                       .logit_chunk = logit_chunk,
                       .chunked_logits = chunked_logits,
                       .numerics = n};
    sbp_err err = {0};
    if (sbp_grad(r, m, b, &o, NULL, &err))
        ck_abort_msg("sbp_grad (%s, %s, block %d, chunk %d): %s", sbp_numerics_name(n),
                     sbp_schedule_name(s), block, chunk, err.msg);
}

void tu_grad(sbp_grad_result *r, const sbp_model *m, const sbp_batch *b, sbp_schedule s, int block,
             int chunk, int logit_chunk, int chunked_logits) {
    tu_grad_n(r, m, b, SBP_NUMERICS_FAST, s, block, chunk, logit_chunk, chunked_logits);
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

void tu_assert_same_grads(const sbp_model *m, const sbp_params *ps, const sbp_grad_result *ref,
                          const sbp_grad_result *r, const char *what) {
    if (!ps) ps = &m->params;
    const size_t esz = m->prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    for (int i = 0; i < ps->n; i++) {
        const sbp_param *p = &ps->p[i];
        const size_t off = esz * (size_t)p->offset, n = esz * (size_t)p->numel;
        ck_assert_msg(!memcmp((const char *)ref->grads + off, (const char *)r->grads + off, n),
                      "%s: gradient of %s differs from the reference run's", what, p->name);
    }
    ck_assert_msg(memcmp(&ref->loss, &r->loss, sizeof r->loss) == 0,
                  "%s: loss %.17g differs from the reference run's %.17g", what, r->loss,
                  ref->loss);
}

const char *tu_bin(void) {
    return getenv("STREAMBP") ? getenv("STREAMBP") : "build/streambp";
}

const char *tu_plant_bin(const char *name) {
    static char path[1024];
    const char *bin = tu_bin(), *slash = strrchr(bin, '/');
    snprintf(path, sizeof path, "%.*s/plant/%s/streambp", slash ? (int)(slash - bin) : 1,
             slash ? bin : ".", name);
    return path;
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
    /* No command a test runs may trip a sanitizer, whatever status the test expects of it:
     * under make test SAN=1 this checks every run of the binary for ASan, UBSan and LSan. */
    static const char *const san[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                      "runtime error:"};
    for (int i = 0; i < 3; i++)
        ck_assert_msg(!strstr(last_out, san[i]), "`%s`: sanitizer report:\n%s", cmd, last_out);
    return rc == -1 || !WIFEXITED(rc) ? -1 : WEXITSTATUS(rc);
}

const char *tu_last_output(void) {
    return last_out;
}

int tu_python_has(const char *python, const char *modules) {
    return tu_sh("'%s' -c 'import importlib.util as u, sys; "
                 "sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' %s",
                 python, modules) == 0;
}

static char last_cmd[4096];

int tu_cli(const char *prefix, int timeout_s, const char *fmt, ...) {
    char args[3500];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(last_cmd, sizeof last_cmd, "%stimeout %d %s %s", prefix, timeout_s, tu_bin(), args);
    return tu_sh("%s", last_cmd);
}

const char *tu_last_cmd(void) {
    return last_cmd;
}

void tu_check_run_(int rc, int want_rc, const char *const *want) {
    const char *out = tu_last_output();
    ck_assert_msg(rc == want_rc, "`%s` exited %d, expected %d%s; output:\n%s", last_cmd, rc,
                  want_rc, rc == 124 ? " (timed out: it hung)" : "", out);
    for (int i = 0; want[i]; i++)
        ck_assert_msg(strstr(out, want[i]) != NULL, "`%s`: the output does not mention \"%s\":\n%s",
                      last_cmd, want[i], out);
}

int tu_run_suite_with_model(Suite *s, const char *model, const char *name) {
    char path[600];
    snprintf(path, sizeof path, "data/models/%s.json", model);
    sbp_config cfg;
    sbp_err err = {0};
    if (sbp_config_load(&cfg, path, &err) ||
        sbp_model_init(&cfg, 1, tu_path("model-%s-1", model), &err)) {
        fprintf(stderr, "%s: cannot create the test model: %s\n", name, err.msg);
        return EXIT_FAILURE;
    }
    return tu_run_suite(s);
}

int tu_run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

void tu_tensors_load(tu_tensors *ts, const char *path) {
    sbp_st_file sf;
    sbp_err err = {0};
    memset(ts, 0, sizeof *ts);
    ck_assert_msg(sbp_st_open(&sf, path, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_le(sf.n, TU_MAX_TENSORS);
    for (int i = 0; i < sf.n; i++) {
        const sbp_st_tensor *t = &sf.t[i];
        snprintf(ts->names[i], sizeof ts->names[i], "%s", t->name);
        ts->data[i] = malloc(t->end - t->begin + 8);
        ck_assert_int_eq(sbp_st_read_raw(&sf, t, ts->data[i], &err), SBP_OK);
        ts->e[i] = (sbp_st_entry){.name = ts->names[i], .dtype = t->dtype, .ndim = t->ndim};
        for (int d = 0; d < t->ndim; d++) ts->e[i].shape[d] = t->shape[d];
        ts->e[i].data = ts->data[i];
    }
    ts->n = sf.n;
    sbp_st_close(&sf);
}

void tu_tensors_free(tu_tensors *ts) {
    for (int i = 0; i < ts->n; i++) free(ts->data[i]);
    ts->n = 0;
}

int tu_tensors_index(const tu_tensors *ts, const char *name) {
    for (int i = 0; i < ts->n; i++)
        if (strcmp(ts->names[i], name) == 0) return i;
    ck_abort_msg("no tensor %s", name);
    return -1;
}

void tu_fd_check(const sbp_params *ps, const double *w0, const double *g, tu_loss_fn f, void *ctx,
                 double h, double atol, double rtol, int k, uint64_t seed, const char *what) {
    double *w = malloc(sizeof *w * (size_t)ps->total);
    ck_assert_ptr_nonnull(w);
    memcpy(w, w0, sizeof *w * (size_t)ps->total);
    sbp_rng rng;
    sbp_rng_seed(&rng, seed);
    double worst_abs = 0, worst_rel = 0, g_abs = 0;
    char where_abs[160] = "", where_rel[160] = "";
    int n = 0;
    for (int i = 0; i < ps->n; i++) {
        const sbp_param *p = &ps->p[i];
        int64_t amax = 0;
        for (int64_t j = 1; j < p->numel; j++)
            if (fabs(g[p->offset + j]) > fabs(g[p->offset + amax])) amax = j;
        for (int e = 0; e <= k; e++) {
            int64_t j = e == k ? amax : (int64_t)(sbp_rng_uniform(&rng) * (double)p->numel);
            double *wj = &w[p->offset + j], wj0 = *wj;
            *wj = wj0 + h;
            double up = f(w, ctx);
            *wj = wj0 - h;
            double down = f(w, ctx);
            *wj = wj0;
            double fd = (up - down) / (2 * h), an = g[p->offset + j], err = fabs(fd - an);
            ck_assert_msg(err <= atol + rtol * fabs(an),
                          "%s: %s[%lld]: analytic %.12g, central difference %.12g (|diff| %.3g)",
                          what, p->name, (long long)j, an, fd, err);
            n++;
            if (err > worst_abs) {
                worst_abs = err;
                g_abs = an;
                snprintf(where_abs, sizeof where_abs, "%s[%lld]", p->name, (long long)j);
            }
            if (fabs(an) >= 1e-4 && err / fabs(an) > worst_rel) {
                worst_rel = err / fabs(an);
                snprintf(where_rel, sizeof where_rel, "%s[%lld]", p->name, (long long)j);
            }
        }
    }
    printf("fd %-44s %2d entries: worst |fd-g| %.2e (%s, g %.2e); worst rel. (|g|>=1e-4) %.2e "
           "(%s)\n",
           what, n, worst_abs, where_abs, g_abs, worst_rel, where_rel);
    fflush(stdout);
    free(w);
}

/* Not a Check assertion: paths are also built before the suite runs. */
static void path_too_long(const char *leaf) {
    fprintf(stderr, "testutil: path too long (... %s)\n", leaf);
    abort();
}

static char *ring_slot(void) {
    static char ring[32][700];
    static int next;
    return ring[next++ % 32];
}

const char *tu_path(const char *fmt, ...) {
    char *p = ring_slot(), name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (snprintf(p, 700, "%s/%s", tu_tmpdir(), name) >= 700) path_too_long(name);
    return p;
}

const char *tu_join(const char *dir, const char *leaf) {
    char *p = ring_slot();
    if (snprintf(p, 700, "%s/%s", dir, leaf) >= 700) path_too_long(leaf);
    return p;
}

void tu_assert_clean_output(void) {
    const char *o = tu_last_output();
    ck_assert_msg(!strstr(o, "runtime error") && !strstr(o, "Sanitizer"), "sanitizer: %s", o);
}

char *tu_snapshot(const char *dir) {
    ck_assert_int_eq(tu_sh("cd '%s' && find . -type f | sort | xargs -r sha256sum", dir), 0);
    return strdup(tu_last_output());
}

void tu_expect_usage(const char *expect, const char *fmt, ...) {
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    const char *stdout_path = tu_path("bad.stdout");
    int rc = tu_sh("%s %s > '%s'", tu_bin(), args, stdout_path);
    ck_assert_msg(rc == 2, "exit %d, expected 2, for: %s\n%s", rc, args, tu_last_output());
    ck_assert_msg(strstr(tu_last_output(), expect), "the message lacks \"%s\": %s", expect,
                  tu_last_output());
    tu_assert_clean_output();
    size_t n;
    free(tu_slurp(stdout_path, &n));
    ck_assert_msg(n == 0, "stdout not empty for: %s", args);
}

int tu_kill_after(const char *cmd, const char *marker) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char *line = malloc(strlen(cmd) + 32);
        if (!line) _exit(127);
        sprintf(line, "exec %s >/dev/null 2>&1", cmd);
        execl("/bin/sh", "sh", "-c", line, (char *)NULL);
        _exit(127);
    }
    int status = 0, exited = 0;
    for (int i = 0; i < 120000 && !tu_exists(marker); i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            exited = 1;
            break;
        }
        usleep(500);
    }
    if (!exited) {
        kill(pid, SIGKILL);
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    }
    ck_assert_msg(tu_exists(marker), "%s never appeared", marker);
    const int killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    ck_assert_msg(killed || (WIFEXITED(status) && WEXITSTATUS(status) == 0),
                  "the run failed on its own (status %d)", status);
    return killed;
}

/* The copies of tu_keep: a list freed by atexit (which runs before LeakSanitizer's check, whose
 * handler was registered first). */
typedef struct kept {
    struct kept *next;
    char s[];
} kept;

static kept **kept_list(void) {
    static kept *head;
    return &head;
}

static void kept_free(void) {
    for (kept *k = *kept_list(), *next; k; k = next) next = k->next, free(k);
    *kept_list() = NULL;
}

const char *tu_keep(const char *s) {
    kept **head = kept_list();
    if (!*head) atexit(kept_free);
    kept *k = malloc(sizeof *k + strlen(s) + 1);
    ck_assert_ptr_nonnull(k);
    strcpy(k->s, s);
    k->next = *head;
    *head = k;
    return k->s;
}

char *tu_slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    buf[len] = '\0';
    if (n) *n = (size_t)len;
    return buf;
}

void tu_spit(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

void tu_put(const char *root, const char *rel, const char *text) {
    char path[1024];
    ck_assert_int_lt(snprintf(path, sizeof path, "%s/%s", root, rel), (int)sizeof path);
    for (char *s = path + strlen(root) + 1; (s = strchr(s, '/')); s++) {
        *s = 0;
        ck_assert_msg(mkdir(path, 0755) == 0 || errno == EEXIST, "mkdir %s", path);
        *s = '/';
    }
    tu_spit(path, text, strlen(text));
}

const char *tu_new_dir(const char *name) {
    const char *d = tu_path("%s", name);
    ck_assert_int_eq(tu_sh("rm -rf '%s' && mkdir -p '%s'", d, d), 0);
    return d;
}

void tu_assert_no_tmp(const char *dir) {
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "cannot list %s", dir);
    struct dirent *de;
    while ((de = readdir(d)))
        ck_assert_msg(!strstr(de->d_name, ".tmp"), "temporary file %s/%s left behind", dir,
                      de->d_name);
    closedir(d);
}

void tu_assert_same_ledger(const sbp_ledger *plan, const sbp_ledger *real, const char *what) {
    ck_assert_msg(plan->peak_total == real->peak_total, "%s: planned peak %lld, measured %lld",
                  what, (long long)plan->peak_total, (long long)real->peak_total);
    for (int c = 0; c < SBP_MEM_NCATS; c++) {
        ck_assert_msg(plan->peak[c] == real->peak[c], "%s: %s peak planned %lld, measured %lld",
                      what, sbp_mem_cat_name(c), (long long)plan->peak[c],
                      (long long)real->peak[c]);
        ck_assert_msg(plan->at_peak[c] == real->at_peak[c],
                      "%s: %s at total peak planned %lld, measured %lld", what, sbp_mem_cat_name(c),
                      (long long)plan->at_peak[c], (long long)real->at_peak[c]);
    }
    ck_assert_msg(plan->n_allocs == real->n_allocs, "%s: %lld planned allocations, %lld real", what,
                  (long long)plan->n_allocs, (long long)real->n_allocs);
}

void tu_lcg_batch(sbp_batch *b, int T, int V, int pad, int prompt, uint64_t seed) {
    memset(b, 0, sizeof *b);
    b->B = 2, b->T = T, b->kind = SBP_OBJ_SFT;
    const size_t n = 2 * (size_t)T;
    b->ids = malloc(sizeof(int32_t) * n);
    b->labels = malloc(sizeof(int32_t) * n);
    b->mask = malloc(n);
    ck_assert(b->ids && b->labels && b->mask);
    uint64_t z = seed;
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < T; t++) {
            const size_t i = (size_t)r * T + t;
            const int p = r == 1 ? pad : 0;
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            b->ids[i] = t < p ? 0 : 3 + (int32_t)((z >> 33) % (uint64_t)(V - 3));
            b->mask[i] = t >= p;
            b->labels[i] = t < p + prompt ? SBP_IGNORE : b->ids[i];
        }
    sbp_batch_count_targets(b);
}

void tu_grad_opts(sbp_grad_result *r, const sbp_model *m, const sbp_batch *b, sbp_grad_opts o) {
    sbp_err err = {0};
    if (sbp_grad(r, m, b, &o, NULL, &err))
        ck_abort_msg("sbp_grad (%s, chunk %d, logit chunk %d): %s", sbp_schedule_name(o.schedule),
                     o.chunk, o.logit_chunk, err.msg);
}
