/* bench.c — the measurements behind `streambp bench` (see bench.h): the sgemm rate, then per T
 * each schedule's memory (one step in a process of its own) and time (every schedule in one
 * process, interleaved round by round), then whole training steps.
 *
 * A measuring child ends with _exit after writing its result: it is a forked copy of the caller,
 * and nothing of the caller's process (its stdio buffers, its atexit handlers) may run twice. */
#include "bench.h"

#include "../core/clock.h"
#include "../core/err.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N_CFG = 2 * SBP_BENCH_MAX_SCHEDULES }; /* schedules × numerics (fast, portable) */

/* What a measuring process sends back. */
typedef struct {
    int ok;
    char err[800];
    double times[N_CFG][16]; /* step times per configuration and round */
    double sgemm[16];        /* the sgemm rate timed in each round (0: not) */
    double peak[16];         /* the vector FMA peak timed in each round (0 or NaN: not) */
    double fma_peak;         /* the vector FMA peak (sgemm_child), GFLOP/s */
    int n_times;             /* rounds timed */
    double loss;
    sbp_ledger lg;
    long long rss;
    sbp_profile prof[N_CFG]; /* with a profile: each configuration's, over the timed rounds */
} child_result;

/* Runs fn in a child process; its result comes back through a pipe. */
static int in_child(child_result *r, void (*fn)(child_result *, const void *), const void *arg) {
    int fd[2];
    memset(r, 0, sizeof *r);
    if (pipe(fd) != 0) return 0;
    fflush(NULL); /* the caller's buffered output is not the child's to write */
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        close(fd[0]);
        child_result c = {0};
        fn(&c, arg);
        c.rss = sbp_peak_rss_bytes();
        ssize_t w = write(fd[1], &c, sizeof c);
        _exit(w == (ssize_t)sizeof c ? 0 : 1);
    }
    close(fd[1]);
    ssize_t got = 0, n;
    while (got < (ssize_t)sizeof *r && (n = read(fd[0], (char *)r + got, sizeof *r - got)) > 0)
        got += n;
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    if (got != (ssize_t)sizeof *r) {
        snprintf(r->err, sizeof r->err, "the measuring process died (%s)",
                 WIFSIGNALED(status) ? "killed by a signal; out of memory?" : "no result");
        r->ok = 0;
    }
    return 1;
}

/* the median of v (n ≥ 1), sorting v */
static double median(double *v, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (v[j] < v[i]) {
                double t = v[i];
                v[i] = v[j], v[j] = t;
            }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- the sgemm rate ------------------------------------------------------------------------ */

/* The step's three characteristic products at M rows — projections in (C → F) and out (F → C),
 * and the LM head (C → V) — as C(M, N) = A(M, K)·B(N, K)ᵀ; the operands are sized for the
 * largest and filled once. */
typedef struct {
    float *A, *B, *C;
    int M, K[3], N[3];
} sgemm_set;

static size_t max2(size_t a, size_t b) {
    return a > b ? a : b;
}

static int sgemm_set_init(sgemm_set *g, int M, int C, int F, int V) {
    *g = (sgemm_set){.M = M, .K = {C, F, C}, .N = {F, C, V}};
    const size_t na = (size_t)M * max2((size_t)C, (size_t)F);
    const size_t nb = (size_t)C * max2((size_t)F, (size_t)V);
    const size_t nc = (size_t)M * max2((size_t)F, (size_t)V);
    g->A = malloc(sizeof(float) * na), g->B = malloc(sizeof(float) * nb);
    g->C = malloc(sizeof(float) * nc);
    if (!g->A || !g->B || !g->C) return 0;
    for (size_t i = 0; i < na; i++) g->A[i] = (float)((i * 7 % 13) - 6) * 0.01f;
    for (size_t i = 0; i < nb; i++) g->B[i] = (float)((i * 5 % 11) - 5) * 0.01f;
    return 1;
}

static void sgemm_set_free(sgemm_set *g) {
    free(g->A), free(g->B), free(g->C);
}

/* GFLOP/s of one product s, on OpenBLAS or on our portable product */
static double sgemm_once(const sgemm_set *g, int s, int portable) {
    const int M = g->M, K = g->K[s], N = g->N[s];
    double t0 = sbp_now_seconds();
    if (portable)
        sbp_portable_gemm_f32(g->C, g->A, g->B, M, N, K);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, g->A, K, g->B, K, 0, g->C,
                    N);
    return 2.0 * M * N * K / (sbp_now_seconds() - t0) / 1e9;
}

/* The median of three readings, each the mean of the three products' rates timed once: the
 * steps' timing rounds call it after every round, so that the fraction of sgemm compares two
 * things timed seconds apart on a machine whose speed drifts. One reading alone is not the
 * round's rate: on a shared 2-vCPU VM consecutive readings (0.6 s each, 1 thread) have ranged
 * 76-143 GFLOP/s within ten seconds. */
static double sgemm_round(const sgemm_set *g) {
    double r[3];
    for (int i = 0; i < 3; i++) {
        r[i] = 0;
        for (int s = 0; s < 3; s++) r[i] += sgemm_once(g, s, 0) / 3;
    }
    const double lo = fmin(r[0], fmin(r[1], r[2])), hi = fmax(r[0], fmax(r[1], r[2]));
    return r[0] + r[1] + r[2] - lo - hi;
}

typedef struct {
    int threads;
    int M, C, F, V;
    int portable; /* time the portable product too */
} sgemm_arg;

/* A run-level sgemm reading from sgemm_child: the mean of the three products' medians (NaN if
 * the child failed). */
static double sgemm_reading(const child_result *r, int portable) {
    return r->ok ? (r->times[portable][0] + r->times[portable][1] + r->times[portable][2]) / 3
                 : NAN;
}

/* The vector FMA peak, GFLOP/s: sbp_bench_fma_chains on every thread at once (a timing: 0.06 s
 * at two 512-bit fma ports and 3.5 GHz, 0.03 s with AVX2), the median of 7 timings after a
 * warm-up one; NaN when the build has no vector fma. */
static double measure_fma_peak(void) {
    enum { FMA_STEPS = 1 << 24 };
    double rate[8];
    for (int rep = 0; rep < 8; rep++) {
        int64_t flops = 0;
        const double t0 = sbp_now_seconds();
#pragma omp parallel reduction(+ : flops)
        flops += sbp_bench_fma_chains(FMA_STEPS);
        if (flops == 0) return NAN;
        rate[rep] = (double)flops / (sbp_now_seconds() - t0) / 1e9;
    }
    return median(rate + 1, 7);
}

/* The run's sgemm rate and (if asked) the portable product's: per product the median of 7 calls
 * after a warm-up call. */
static void sgemm_child(child_result *r, const void *p) {
    const sgemm_arg *a = p;
    sbp_set_threads(a->threads);
    sgemm_set g;
    if (!sgemm_set_init(&g, a->M, a->C, a->F, a->V)) {
        sgemm_set_free(&g);
        snprintf(r->err, sizeof r->err, "out of memory");
        return;
    }
    for (int s = 0; s < 3; s++) {
        for (int portable = 0; portable <= a->portable; portable++) {
            double best[7];
            for (int rep = 0; rep < 8; rep++) { /* interleaved with nothing: one product each */
                const double rate = sgemm_once(&g, s, portable);
                if (rep) best[rep - 1] = rate; /* the first call warms up */
            }
            r->times[portable][s] = median(best, 7);
        }
        r->n_times++;
    }
    sgemm_set_free(&g);
    r->fma_peak = measure_fma_peak();
    r->ok = 1;
}

static sgemm_arg sgemm_args(const sbp_config *cfg, int threads, int portable) {
    return (sgemm_arg){.threads = threads,
                       .M = 2048,
                       .C = cfg->hidden,
                       .F = cfg->ffn,
                       .V = cfg->vocab,
                       .portable = portable};
}

void sbp_bench_gemm_rates(sbp_bench_rates *r, const sbp_config *cfg, int threads, int portable) {
    child_result c;
    sgemm_arg sa = sgemm_args(cfg, threads, portable);
    sbp_set_threads(threads); /* the steps run in children; the FLOP count reads it here */
    in_child(&c, sgemm_child, &sa);
    r->sgemm = sgemm_reading(&c, 0);
    r->portable = portable ? sgemm_reading(&c, 1) : NAN;
    r->fma_peak = c.ok ? c.fma_peak : NAN;
    for (int k = 0; k < 2; k++)
        for (int s = 0; s < 3; s++) r->parts[k][s] = c.times[k][s];
}

/* ---- one step measurement ------------------------------------------------------------------ */

/* The schedules g[0..n) at one T: a warm-up round (if asked), then `reps` rounds that run each
 * schedule once in turn, so that a drift in the machine's speed touches all of them alike. The
 * ledger and RSS are meaningful when n = 1. */
typedef struct {
    const char *model;
    int T, reps, warmup, threads, n;
    int train;            /* whole training steps: gradient, clipping, AdamW (n = 1) */
    int sgemm;            /* time the sgemm products after every round (fast numerics, CPU) */
    int profile;          /* add each timed step's operations to the result's profiles */
    sbp_lora_config lora; /* r > 0: the training step trains an adapter of this config */
    sbp_grad_opts g[N_CFG];
} step_arg;

/* --grads-out's sink: each piece of the gradient leaves and is dropped, as grad --out's leaves
 * for its file (whose writes go to the page cache, not to the process). */
static int drop_piece(void *ctx, int64_t off, int64_t n, const void *g) {
    (void)ctx, (void)off, (void)n, (void)g;
    return 1;
}

/* One row of T random tokens, every label a target. */
static void random_batch(sbp_batch *b, int T, int vocab) {
    *b = (sbp_batch){.B = 1, .T = T, .kind = SBP_OBJ_SFT};
    b->ids = malloc(sizeof *b->ids * T), b->labels = malloc(sizeof *b->labels * T);
    b->mask = malloc(T);
    uint32_t s = 12345;
    for (int t = 0; t < T; t++) {
        s = s * 1664525u + 1013904223u;
        b->ids[t] = b->labels[t] = 1 + (int)((s >> 8) % (uint32_t)(vocab - 1));
        b->mask[t] = 1;
    }
    b->n_targets = T - 1;
}

/* A new adapter of config c (peft's initialisation) moved into the ledger, where a loaded adapter
 * is (sbp_lora_init allocates outside it); 0 with err->msg set on failure. */
static int new_adapter(sbp_lora *ad, const sbp_model *m, const sbp_lora_config *c,
                       sbp_ledger *host_lg, sbp_err *err) {
    int ok = sbp_lora_init(ad, &m->cfg, c, 1, 0, m->prec, err) == 0;
    const size_t bytes = sizeof(float) * (size_t)ad->params.total;
    void *w = ok ? sbp_ledger_alloc(host_lg, SBP_MEM_WEIGHTS, bytes) : NULL;
    if (ok && !w) snprintf(err->msg, sizeof err->msg, "out of memory for the adapter");
    if ((ok = ok && w)) {
        memcpy(w, ad->w, bytes);
        sbp_ledger_free(NULL, ad->w);
        ad->w = w;
    }
    return ok;
}

/* The rounds of step_child: each schedule (or the training step) once per round. */
static int step_rounds(child_result *r, const step_arg *a, sbp_model *m, sbp_lora *ad,
                       sbp_adamw *opt, const sbp_batch *b, const sgemm_set *sg, int with_sgemm,
                       sbp_err *err) {
    int ok = 1;
    for (int i = 0; ok && i < a->warmup + a->reps; i++) {
        for (int k = 0; ok && k < a->n; k++) {
            sbp_grad_result res;
            sbp_step_result sr;
            sbp_grad_opts g = a->g[k];
            if (a->profile && i >= a->warmup) g.profile = &r->prof[k];
            double t0 = sbp_now_seconds();
            if (a->train)
                ok = sbp_train_step(&sr, m, a->lora.r ? ad : NULL, opt, b, 1, &g, 5e-5, 1.0, &r->lg,
                                    err) == 0;
            else
                ok = sbp_grad(&res, m, b, &g, &r->lg, err) == 0;
            if (!ok) break;
            if (i >= a->warmup) r->times[k][i - a->warmup] = sbp_now_seconds() - t0;
            r->loss = a->train ? sr.loss : res.loss;
            if (!a->train) sbp_grad_result_free(&res, &r->lg);
        }
        if (ok && i >= a->warmup && with_sgemm) {
            r->sgemm[i - a->warmup] = sgemm_round(sg);
            r->peak[i - a->warmup] = measure_fma_peak();
        }
        if (ok && i >= a->warmup) r->n_times++;
    }
    return ok;
}

static void step_child(child_result *r, const void *p) {
    const step_arg *a = p;
    sbp_set_threads(a->threads);
    sbp_err err = {0};
    sbp_model m;
    /* on a device the ledger records the device's memory only */
    sbp_ledger *host_lg = a->g[0].device == SBP_DEVICE_CPU ? &r->lg : NULL;
    sbp_ledger_keep_blocks(&r->lg); /* steps after the first reuse the first one's buffers */
    if (sbp_model_load(&m, a->model, SBP_FP32, host_lg, &err)) {
        snprintf(r->err, sizeof r->err, "%s", err.msg);
        return;
    }
    sbp_batch b;
    random_batch(&b, a->T, m.cfg.vocab);
    /* a training step: HF's defaults (lr 5e-5, max_grad_norm 1) on the model's weights, or on a
     * new adapter (peft's initialisation) */
    const sbp_adamw_opts ao = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    sbp_adamw opt = {0};
    sbp_lora ad = {0};
    int ok = !a->lora.r || new_adapter(&ad, &m, &a->lora, host_lg, &err);
    const int64_t n_trained = a->lora.r ? ad.params.total : m.params.total;
    ok = ok && (!a->train || sbp_adamw_init(&opt, &ao, m.prec, n_trained, &r->lg, &err) == 0);
    sgemm_set sg = {0};
    const int with_sgemm =
        a->sgemm && sgemm_set_init(&sg, 2048, m.cfg.hidden, m.cfg.ffn, m.cfg.vocab);
    if (with_sgemm) sgemm_round(&sg); /* warm-up */
    ok = ok && step_rounds(r, a, &m, &ad, &opt, &b, &sg, with_sgemm, &err);
    sgemm_set_free(&sg);
    if (!ok) snprintf(r->err, sizeof r->err, "%s", err.msg);
    sbp_adamw_free(&opt, &r->lg);
    if (ad.w) sbp_lora_free(&ad, host_lg);
    sbp_batch_free(&b);
    sbp_model_free(&m, host_lg);
    sbp_ledger_drop_blocks(&r->lg);
    r->ok = ok;
}

/* ---- a run: the model, the options, the rows ------------------------------------------------ */

sbp_status sbp_bench_model_open(sbp_bench_model *bm, const char *model, const char *config,
                                sbp_err *err) {
    memset(bm, 0, sizeof *bm);
    if (model && config)
        return sbp_fail(err, SBP_EUSAGE, "give at most one of --model and --config");
    const char *given = model ? model : config;
    if (!given || strlen(given) > 1000)
        return sbp_fail(err, SBP_EUSAGE, "a model directory or a config file is needed");
    if (model) {
        snprintf(bm->cfgpath, sizeof bm->cfgpath, "%s/config.json", model);
        snprintf(bm->dir, sizeof bm->dir, "%s", model);
    } else {
        snprintf(bm->cfgpath, sizeof bm->cfgpath, "%s", config);
        const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        if (snprintf(bm->tmp, sizeof bm->tmp, "%s/streambp-bench-XXXXXX", tmp) >=
                (int)sizeof bm->tmp ||
            !mkdtemp(bm->tmp)) {
            bm->tmp[0] = '\0';
            return sbp_fail(err, SBP_EUSAGE, "cannot create a temporary directory");
        }
        snprintf(bm->dir, sizeof bm->dir, "%s", bm->tmp);
    }
    sbp_status st = sbp_config_load(&bm->cfg, bm->cfgpath, err);
    if (!st && !model) st = sbp_model_init(&bm->cfg, 1, bm->dir, err);
    sbp_params ps;
    if (!st) st = sbp_params_build(&ps, &bm->cfg, err);
    if (st) {
        sbp_bench_model_close(bm);
        return st;
    }
    bm->n_params = ps.total;
    sbp_params_free(&ps);
    return SBP_OK;
}

void sbp_bench_model_close(sbp_bench_model *bm) {
    if (bm->tmp[0]) sbp_remove_tree(bm->tmp); /* ours (mkdtemp), walked without following a link */
    bm->tmp[0] = '\0';
}

sbp_status sbp_bench_check(const sbp_bench_opts *o, sbp_err *err) {
    if (!o->model) return sbp_fail(err, SBP_EUSAGE, "no model (sbp_bench_model_open)");
    if (o->n_seqs < 1 || o->n_seqs > SBP_BENCH_MAX_SEQS)
        return sbp_fail(err, SBP_EUSAGE, "1 to %d sequence lengths (--seq), got %d",
                        SBP_BENCH_MAX_SEQS, o->n_seqs);
    for (int i = 0; i < o->n_seqs; i++)
        if (o->seqs[i] < 1)
            return sbp_fail(err, SBP_EUSAGE, "--seq must be positive, got %d", o->seqs[i]);
    if (o->n_schedules < 1 || o->n_schedules > SBP_BENCH_MAX_SCHEDULES)
        return sbp_fail(err, SBP_EUSAGE, "1 to %d schedules (--schedules), got %d",
                        SBP_BENCH_MAX_SCHEDULES, o->n_schedules);
    if (o->numerics & ~((1 << SBP_NUMERICS_FAST) | (1 << SBP_NUMERICS_PORTABLE)))
        return sbp_fail(err, SBP_EUSAGE, "--numerics: fast and portable only");
    if (o->threads < 1)
        return sbp_fail(err, SBP_EUSAGE, "--threads must be positive, got %d", o->threads);
    if (o->reps < 0 || o->reps > SBP_BENCH_MAX_ROUNDS)
        return sbp_fail(err, SBP_EUSAGE, "--reps must be 1..%d", SBP_BENCH_MAX_ROUNDS);
    if (o->warmup < -1 || o->warmup > SBP_BENCH_MAX_ROUNDS)
        return sbp_fail(err, SBP_EUSAGE, "--warmup must be 0..%d, got %d", SBP_BENCH_MAX_ROUNDS,
                        o->warmup);
    if (o->block < 1 || o->chunk < 1 || o->logit_chunk < 1)
        return sbp_fail(err, SBP_EUSAGE, "--block, --chunk and --logit-chunk must be positive");
    if (o->profile && o->device != SBP_DEVICE_CPU)
        return sbp_fail(err, SBP_EUSAGE, "--profile times the CPU backend only");
    if (o->largest < 0 || (o->largest && !o->largest_T))
        return sbp_fail(err, SBP_EUSAGE, "--largest needs a budget and the planner's search");
    return SBP_OK;
}

/* The state of a run across its rows. */
typedef struct {
    const sbp_bench_opts *o;
    const sbp_bench_rates *rates;
    const sbp_bench_sink *sink;
    double before; /* the latest run-level sgemm reading */
    int failures;
} run_ctx;

static void say(const run_ctx *b, sbp_bench_note kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(const run_ctx *b, sbp_bench_note kind, const char *fmt, ...) {
    if (!b->sink || !b->sink->note) return;
    char text[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    b->sink->note(b->sink->ctx, kind, text);
}

/* One row: a step of T tokens that took t seconds (median of nt runs); of_sgemm and of_peak: the
 * median over the rounds of the step's rate over the sgemm rate and the FMA peak timed in the
 * same round (NaN: against the run's rates instead). */
static void put_row(const run_ctx *b, const char *name, int T, const sbp_grad_opts *g, double t,
                    int nt, double of_sgemm, double of_peak, const child_result *r,
                    const sbp_ledger *plan, const sbp_profile *prof) {
    const double flop = sbp_step_flops(&b->o->model->cfg, 1, T, g), gfs = flop / t / 1e9;
    if (isnan(of_peak)) of_peak = b->rates->fma_peak > 0 ? gfs / b->rates->fma_peak : NAN;
    const sbp_bench_row row = {.T = T,
                               .name = name,
                               .numerics = g->numerics,
                               .runs = nt,
                               .seconds = t,
                               .gflop = flop / 1e9,
                               .gflops = gfs,
                               .of_sgemm = isnan(of_sgemm) ? gfs / b->rates->sgemm : of_sgemm,
                               .of_peak = of_peak,
                               .tokens_per_s = T / t,
                               .lg = r->lg,
                               .planned_peak = plan->peak_total,
                               .rss = r->rss,
                               .loss = r->loss,
                               .profile = b->o->profile ? prof : NULL};
    if (b->sink && b->sink->row) b->sink->row(b->sink->ctx, &row);
}

/* The measurements at one T. Configuration q is schedule q % n_schedules in numerics
 * q / n_schedules (fast, then portable). */
typedef struct {
    int T;
    int nums;                /* bit set of the numerics measured */
    child_result mem[N_CFG]; /* memory: each configuration alone in a process, one step */
    sbp_ledger plan[N_CFG];  /* the planner's ledger of each */
    int kidx[N_CFG], Ts[N_CFG];
    step_arg timing; /* time: every configuration in one process, interleaved */
    int timed, solo; /* timed in rounds; one configuration alone */
    child_result tr; /* the timing process's result */
} t_rows;

static void t_setup(const run_ctx *b, t_rows *t, int T) {
    const sbp_bench_opts *o = b->o;
    const int NS = o->n_schedules;
    t->T = T;
    t->timing = (step_arg){.model = o->model->dir,
                           .T = T,
                           .threads = o->threads,
                           .reps = o->reps     ? o->reps
                                   : T <= 4096 ? 3
                                               : 1,
                           .warmup = o->largest       ? 0
                                     : o->warmup >= 0 ? o->warmup
                                                      : T <= 4096,
                           .sgemm = o->device == SBP_DEVICE_CPU,
                           .profile = o->profile};
    t->nums = o->device != SBP_DEVICE_CPU ? 1 << SBP_NUMERICS_PORTABLE
              : o->numerics               ? o->numerics
              : T <= 4096 && !o->largest  ? 3
                                          : 1;
    int n_cfg = 0;
    for (int q = 0; q < 2 * NS; q++) n_cfg += (t->nums & (1 << q / NS)) != 0;
    /* one configuration with a warm-up: the timing process is that schedule alone, and its
     * memory is measured there, over warm steps (no separate cold step); it times no sgemm
     * between rounds (the products' operands would count in its RSS), so its fraction of sgemm
     * is of the run's rate */
    t->timed = !o->largest && n_cfg && (t->timing.reps > 1 || t->timing.warmup);
    t->solo = t->timed && n_cfg == 1;
    t->timing.sgemm = t->timing.sgemm && !t->solo;
}

/* Each configuration's plan (with largest: its largest T) and memory, each alone in a process
 * (unless it is timed alone: then its timing process measures it). */
static void t_memory(run_ctx *b, t_rows *t) {
    const sbp_bench_opts *o = b->o;
    const sbp_config *cfg = &o->model->cfg;
    const int NS = o->n_schedules;
    for (int q = 0; q < 2 * NS; q++) {
        const sbp_bench_schedule *sc = &o->schedules[q % NS];
        const int num = q / NS;
        t->mem[q].ok = 0;
        if (!(t->nums & (1 << num))) continue;
        sbp_grad_opts g = {.schedule = sc->schedule,
                           .block = o->block,
                           .chunk = o->chunk,
                           .logit_chunk = o->logit_chunk,
                           .chunked_logits = sc->chunked_logits,
                           .numerics = (sbp_numerics)num,
                           .device = o->device,
                           .grad_sink = o->grads_out ? drop_piece : NULL};
        int T = t->T;
        if (o->largest) {
            sbp_plan_opts po = {.grad = g, .B = 1, .storage_bytes = 4};
            T = o->largest_T(cfg, &po, o->largest, &t->plan[q]);
            if (T == 0) {
                say(b, SBP_BENCH_NO_FIT, "%-13s does not fit in %.0f MiB at any T", sc->name,
                    (double)o->largest / 1048576.0);
                continue;
            }
        } else {
            sbp_plan_opts po = {.grad = g, .B = 1, .T = T, .storage_bytes = 4};
            sbp_err err;
            if (sbp_plan(&t->plan[q], cfg, &po, &err)) memset(&t->plan[q], 0, sizeof t->plan[q]);
        }
        t->Ts[q] = T;
        step_arg a = {.model = o->model->dir,
                      .T = T,
                      .threads = o->threads,
                      .reps = 1,
                      .n = 1,
                      .profile = o->profile,
                      .g = {g}};
        if (!t->solo) {
            say(b, SBP_BENCH_PROGRESS, "  T = %d, %s, %s numerics: memory...", T, sc->name,
                sbp_numerics_name(g.numerics));
            in_child(&t->mem[q], step_child, &a);
        }
        t->mem[q].ok |= t->solo;
        if (!t->mem[q].ok) {
            say(b, SBP_BENCH_FAILURE, "T = %d, %s: %s", T, sc->name, t->mem[q].err);
            b->failures++;
            continue;
        }
        t->kidx[q] = t->timing.n;
        t->timing.g[t->timing.n++] = g;
    }
}

/* The timing process (every configuration interleaved, unless one step is all there is); 0 when
 * it failed. A configuration timed alone: its memory is the timing process's, and its fraction of
 * sgemm is over the mean of the sgemm rates timed just before its process and just after (the
 * run's own, or the previous T's after). *solo_sgemm: that mean, or NaN. */
static int t_time(run_ctx *b, t_rows *t, double *solo_sgemm) {
    const sbp_bench_opts *o = b->o;
    const step_arg *tm = &t->timing;
    *solo_sgemm = NAN;
    if (t->timed && tm->n) {
        say(b, SBP_BENCH_PROGRESS,
            "  T = %d: %d warm-up and %d timed round%s of %d schedule%s%s...", t->T, tm->warmup,
            tm->reps, tm->reps > 1 ? "s" : "", tm->n, tm->n > 1 ? "s" : "",
            t->solo ? ", and its memory" : "");
        in_child(&t->tr, step_child, tm);
        if (!t->tr.ok) {
            say(b, SBP_BENCH_FAILURE, "T = %d: %s", t->T, t->tr.err);
            b->failures++;
            return 0;
        }
    }
    for (int q = 0; t->solo && q < 2 * o->n_schedules; q++)
        if (t->mem[q].ok) t->mem[q] = t->tr; /* its ledger, RSS and loss */
    if (t->solo && tm->n && o->device == SBP_DEVICE_CPU && isfinite(b->before)) {
        child_result after;
        sgemm_arg sa = sgemm_args(&o->model->cfg, o->threads, 0);
        in_child(&after, sgemm_child, &sa);
        const double a = sgemm_reading(&after, 0);
        if (isfinite(a)) {
            say(b, SBP_BENCH_PROGRESS, "  T = %d: sgemm rate %.1f GFLOP/s before, %.1f after", t->T,
                b->before, a);
            *solo_sgemm = (b->before + a) / 2, b->before = a;
        }
    }
    return 1;
}

/* The schedules' rows at this T, in configuration order. */
static void t_rows_put(const run_ctx *b, t_rows *t, double solo_sgemm) {
    const int NS = b->o->n_schedules;
    for (int q = 0; q < 2 * NS; q++) {
        if (!t->mem[q].ok) continue;
        double *tv = t->timed ? t->tr.times[t->kidx[q]] : t->mem[q].times[0];
        int nt = t->timed ? t->tr.n_times : 1;
        sbp_grad_opts g = t->timing.g[t->kidx[q]];
        double of_sgemm = NAN, of_peak = NAN, ratio[16];
        const double flop = sbp_step_flops(&b->o->model->cfg, 1, t->Ts[q], &g);
        if (t->timed && (t->tr.sgemm[0] > 0 || isfinite(solo_sgemm))) {
            for (int i = 0; i < nt; i++)
                ratio[i] = flop / tv[i] / 1e9 / (t->solo ? solo_sgemm : t->tr.sgemm[i]);
            of_sgemm = median(ratio, nt);
        }
        if (t->timed && !t->solo && t->tr.peak[0] > 0) { /* NaN (no vector fma) is not > 0 */
            for (int i = 0; i < nt; i++) ratio[i] = flop / tv[i] / 1e9 / t->tr.peak[i];
            of_peak = median(ratio, nt);
        }
        put_row(b, b->o->schedules[q % NS].name, t->Ts[q], &g, median(tv, nt), nt, of_sgemm,
                of_peak, &t->mem[q], &t->plan[q],
                t->timed ? &t->tr.prof[t->kidx[q]] : &t->mem[q].prof[0]);
    }
}

/* Whole training steps, each alone: every weight, then (up to T = 4096) an adapter. */
static void t_train_rows(run_ctx *b, const t_rows *t) {
    const sbp_bench_opts *o = b->o;
    for (int lo = 0; lo < 2 && o->train && !o->largest && o->device == SBP_DEVICE_CPU; lo++) {
        if (lo && t->T > 4096) break;
        const sbp_lora_config lc = {.r = 32, .alpha = 128, .targets = SBP_LORA_ALL};
        sbp_grad_opts g = {.schedule = SBP_STREAM,
                           .block = o->block,
                           .chunk = o->chunk,
                           .logit_chunk = o->logit_chunk};
        step_arg a = {.model = o->model->dir,
                      .T = t->T,
                      .threads = o->threads,
                      .reps = t->timing.reps,
                      .warmup = t->timing.warmup,
                      .n = 1,
                      .train = 1,
                      .profile = o->profile,
                      .g = {g}};
        sbp_plan_opts po = {.grad = g, .B = 1, .T = t->T, .storage_bytes = 4, .optimizer = 1};
        if (lo) a.lora = po.lora = lc;
        sbp_ledger tplan;
        sbp_err err;
        if (sbp_plan(&tplan, &o->model->cfg, &po, &err)) memset(&tplan, 0, sizeof tplan);
        child_result r;
        say(b, SBP_BENCH_PROGRESS, "  T = %d: %d training step%s (stream + clipping + AdamW%s)...",
            t->T, a.reps + a.warmup, a.reps + a.warmup > 1 ? "s" : "", lo ? ", LoRA r 32" : "");
        in_child(&r, step_child, &a);
        if (!r.ok) {
            say(b, SBP_BENCH_FAILURE, "T = %d, training step%s: %s", t->T, lo ? " (LoRA)" : "",
                r.err);
            b->failures++;
            continue;
        }
        sbp_lora flops_view = {.cfg = lc}; /* the FLOP count reads the adapter's config */
        if (lo) g.lora = &flops_view;
        put_row(b, lo ? "train-stream-lora" : "train-stream", t->T, &g,
                median(r.times[0], r.n_times), r.n_times, NAN, NAN, &r, &tplan, &r.prof[0]);
    }
}

sbp_status sbp_bench_run(const sbp_bench_opts *o, const sbp_bench_rates *rates,
                         const sbp_bench_sink *sink, int *failures, sbp_err *err) {
    *failures = 0;
    sbp_status st = sbp_bench_check(o, err);
    if (st) return st;
    t_rows *t = malloc(sizeof *t);
    if (!t) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    run_ctx b = {.o = o, .rates = rates, .sink = sink, .before = rates->sgemm};
    sbp_set_threads(o->threads); /* the steps run in children; the FLOP count reads it here */
    for (int si = 0; si < (o->largest ? 1 : o->n_seqs); si++) {
        double solo_sgemm;
        memset(t, 0, sizeof *t);
        t_setup(&b, t, o->seqs[si]);
        t_memory(&b, t);
        if (!t_time(&b, t, &solo_sgemm)) continue;
        t_rows_put(&b, t, solo_sgemm);
        t_train_rows(&b, t);
    }
    free(t);
    *failures = b.failures;
    return SBP_OK;
}
