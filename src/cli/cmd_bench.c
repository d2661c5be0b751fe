/* cmd_bench.c — `streambp bench`: step time, FLOP rate and memory of each schedule, against the
 * machine's sgemm rate measured in the same run.
 *
 * Every measurement (the sgemm rate too) runs in a child process of its own, so that the peak
 * RSS the kernel reports belongs to that run alone, and so that the parent never starts an
 * OpenMP thread pool before it forks. The child sends its numbers back through a pipe. */
#include "../../verify/defaults.h"
#include "cli.h"
#include "cmd_plan.h"

#include <cblas.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

char *openblas_get_corename(void); /* from OpenBLAS; not in every cblas.h */
char *openblas_get_config(void);

static const char usage[] =
    "usage: streambp bench [--model DIR | --config FILE] [--seq T ...] [options]\n"
    "\n"
    "Times full forward + backward steps (float32, B = 1, random tokens, every label valid) of\n"
    "each schedule and reports the median time, the FLOPs executed (recomputation included), the\n"
    "achieved GFLOP/s beside the sgemm rate measured in the same run, tokens/s, the ledger's peak\n"
    "beside the planner's and the process's peak RSS. Without --model/--config it benchmarks\n"
    "data/models/bench.json (hidden 512, 8/4 heads, head_dim 64, F 1408, 4 layers, V 32000).\n"
    "\n"
    "  --seq T            a sequence length (repeatable; default 512 1024 2048 4096 8192 16384)\n"
    "  --schedules LIST   of full, ckpt, ckpt-chunked, stream (default full,ckpt,stream)\n"
    "  --numerics LIST    of fast, portable (default: both up to T = 4096, fast above); the\n"
    "                     portable product's rate is measured beside sgemm's at the same shapes\n"
    "  --threads N        default 2\n"
    "  --reps N           timed rounds per T (default 3 up to T = 4096, then 1); a round runs\n"
    "                     every schedule once, in one process, after the warm-up rounds;\n"
    "                     memory is measured by one step per schedule, each in a process of\n"
    "                     its own (one schedule and a warm-up: by the timing process itself)\n"
    "  --warmup N         untimed rounds before the timed ones (default 1 up to T = 4096, then\n"
    "                     0: a step at T > 4096 is then the process's first, its buffers\n"
    "                     faulted in; give --warmup 1 to compare warm steps at any T)\n"
    "  --block N, --chunk N, --logit-chunk N   as for grad (defaults 512, 2 blocks, 1 block)\n"
    "  --largest SIZE     instead: the largest T of each schedule under SIZE (e.g. 512M), found\n"
    "                     with the planner and confirmed by a real step\n"
    "  --device D         cpu | cuda | cuda-emu (default cpu); on a CUDA device the portable\n"
    "                     numerics run, and the ledger and the plan columns show device memory\n"
    "  --no-train         leave out the training-step rows: train-stream (a stream step, the\n"
    "                     gradient clipped and an AdamW update of every weight, its memory\n"
    "                     with the optimizer's two moments, timed like the schedules) and, up\n"
    "                     to T = 4096, train-stream-lora (the same for a LoRA adapter, r 32,\n"
    "                     alpha 128, all-linear, as the StreamBP paper's scripts; the base\n"
    "                     frozen)\n"
    "  --csv | --json     machine-readable output\n";

typedef struct {
    int ok;
    char err[800];
    double times[2 * PLAN_N_SCHEDULES][16]; /* step times per configuration and round */
    double sgemm[16];                       /* the sgemm rate timed in each round (0: not) */
    int n_times;                            /* rounds timed */
    double loss;
    sbp_ledger lg;
    long long rss;
} child_result;

#define kinds plan_schedules

/* Runs fn in a child process; its result comes back through a pipe. */
static int in_child(child_result *r, void (*fn)(child_result *, const void *), const void *arg) {
    int fd[2];
    memset(r, 0, sizeof *r);
    if (pipe(fd) != 0) return 0;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        close(fd[0]);
        child_result c = {0};
        fn(&c, arg);
        c.rss = peak_rss_bytes();
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
    double t0 = now_seconds();
    if (portable)
        sbp_portable_gemm_f32(g->C, g->A, g->B, M, N, K);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, g->A, K, g->B, K, 0, g->C,
                    N);
    return 2.0 * M * N * K / (now_seconds() - t0) / 1e9;
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
            for (int i = 0; i < 7; i++) /* median of 7 */
                for (int j = i + 1; j < 7; j++)
                    if (best[j] < best[i]) {
                        double t = best[i];
                        best[i] = best[j], best[j] = t;
                    }
            r->times[portable][s] = best[3];
        }
        r->n_times++;
    }
    sgemm_set_free(&g);
    r->ok = 1;
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
    sbp_lora_config lora; /* r > 0: the training step trains an adapter of this config */
    sbp_grad_opts g[2 * PLAN_N_SCHEDULES];
} step_arg;

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
    /* one row of T random tokens, every label a target */
    sbp_batch b = {.B = 1, .T = a->T, .kind = SBP_OBJ_SFT};
    b.ids = malloc(sizeof *b.ids * a->T), b.labels = malloc(sizeof *b.labels * a->T);
    b.mask = malloc(a->T);
    uint32_t s = 12345;
    for (int t = 0; t < a->T; t++) {
        s = s * 1664525u + 1013904223u;
        b.ids[t] = b.labels[t] = 1 + (int)((s >> 8) % (uint32_t)(m.cfg.vocab - 1));
        b.mask[t] = 1;
    }
    b.n_targets = a->T - 1;
    /* a training step: HF's defaults (lr 5e-5, max_grad_norm 1) on the model's weights, or on a
     * new adapter (peft's initialisation) */
    const sbp_adamw_opts ao = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    sbp_adamw opt = {0};
    sbp_lora ad = {0};
    int ok = 1;
    if (a->lora.r) {
        ok = sbp_lora_init(&ad, &m.cfg, &a->lora, 1, 0, m.prec, &err) == 0;
        /* into the ledger, where a loaded adapter is (sbp_lora_init allocates outside it) */
        const size_t bytes = sizeof(float) * (size_t)ad.params.total;
        void *w = ok ? sbp_ledger_alloc(host_lg, SBP_MEM_WEIGHTS, bytes) : NULL;
        if (ok && !w) snprintf(err.msg, sizeof err.msg, "out of memory for the adapter");
        if ((ok = ok && w)) {
            memcpy(w, ad.w, bytes);
            sbp_ledger_free(NULL, ad.w);
            ad.w = w;
        }
    }
    const int64_t n_trained = a->lora.r ? ad.params.total : m.params.total;
    ok = ok && (!a->train || sbp_adamw_init(&opt, &ao, m.prec, n_trained, &r->lg, &err) == 0);
    sgemm_set sg = {0};
    const int with_sgemm =
        a->sgemm && sgemm_set_init(&sg, 2048, m.cfg.hidden, m.cfg.ffn, m.cfg.vocab);
    if (with_sgemm) sgemm_round(&sg); /* warm-up */
    for (int i = 0; ok && i < a->warmup + a->reps; i++) {
        for (int k = 0; ok && k < a->n; k++) {
            sbp_grad_result res;
            sbp_step_result sr;
            double t0 = now_seconds();
            if (a->train)
                ok = sbp_train_step(&sr, &m, a->lora.r ? &ad : NULL, &opt, &b, 1, &a->g[k], 5e-5,
                                    1.0, &r->lg, &err) == 0;
            else
                ok = sbp_grad(&res, &m, &b, &a->g[k], &r->lg, &err) == 0;
            if (!ok) break;
            if (i >= a->warmup) r->times[k][i - a->warmup] = now_seconds() - t0;
            r->loss = a->train ? sr.loss : res.loss;
            if (!a->train) sbp_grad_result_free(&res, &r->lg);
        }
        if (ok && i >= a->warmup && with_sgemm) r->sgemm[i - a->warmup] = sgemm_round(&sg);
        if (ok && i >= a->warmup) r->n_times++;
    }
    sgemm_set_free(&sg);
    if (!ok) snprintf(r->err, sizeof r->err, "%s", err.msg);
    sbp_adamw_free(&opt, &r->lg);
    if (ad.w) sbp_lora_free(&ad, host_lg);
    sbp_batch_free(&b);
    sbp_model_free(&m, host_lg);
    sbp_ledger_drop_blocks(&r->lg);
    r->ok = ok;
}

static double median(double *v, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (v[j] < v[i]) {
                double t = v[i];
                v[i] = v[j], v[j] = t;
            }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double mib(int64_t b) {
    return (double)b / 1048576.0;
}

/* Where rows go: text, CSV, or JSON objects collected in rows. */
typedef struct {
    int csv, json;
    double sgemm;
    cJSON *rows;
} row_out;

/* One row of the table: a step of T tokens that took t seconds (median of nt runs); of_sgemm: the
 * median over the rounds of the step's rate over the sgemm rate timed in the same round (NaN:
 * against the run's sgemm rate instead). */
static void emit(row_out *o, const sbp_config *cfg, const char *name, int T, const sbp_grad_opts *g,
                 double t, int nt, double of_sgemm, const child_result *r, const sbp_ledger *plan) {
    double flop = sbp_step_flops(cfg, 1, T, g), gfs = flop / t / 1e9;
    if (isnan(of_sgemm)) of_sgemm = gfs / o->sgemm;
    double peak = (double)r->lg.peak_total;
    const char *num = sbp_numerics_name(g->numerics);
    if (o->csv) {
        printf("%d,%s,%s,%d,%.6f,%.3f,%.3f,%.2f,%.1f,%lld,%lld,%lld,%.17g\n", T, name, num, nt, t,
               flop / 1e9, gfs, 100 * of_sgemm, T / t, (long long)r->lg.peak_total,
               (long long)plan->peak_total, r->rss, r->loss);
    } else if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "T", T);
        cJSON_AddStringToObject(j, "schedule", name);
        cJSON_AddStringToObject(j, "numerics", num);
        cJSON_AddNumberToObject(j, "runs", nt);
        cJSON_AddNumberToObject(j, "median_seconds", t);
        cJSON_AddNumberToObject(j, "gflop", flop / 1e9);
        cJSON_AddNumberToObject(j, "gflops", gfs);
        cJSON_AddNumberToObject(j, "fraction_of_sgemm", of_sgemm);
        cJSON_AddNumberToObject(j, "tokens_per_second", T / t);
        cJSON_AddItemToObject(j, "memory", ledger_json(&r->lg));
        cJSON_AddNumberToObject(j, "planned_peak_bytes", (double)plan->peak_total);
        cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)r->rss);
        cJSON_AddItemToArray(o->rows, j);
    } else {
        char label[48];
        snprintf(label, sizeof label, "%s%s", name,
                 g->numerics == SBP_NUMERICS_PORTABLE ? " (portable)" : "");
        printf("%7d %-22s %4d %9.3f %9.1f %8.1f %6.1f%% %9.0f %10.1f %10.1f %9.1f %8.2f\n", T,
               label, nt, t, flop / 1e9, gfs, 100 * of_sgemm, T / t, mib(r->lg.peak_total),
               mib(plan->peak_total), mib(r->rss), r->rss / peak);
    }
}

/* A count of rounds, 0..15 */
static int parse_rounds(const char *text, int *out) {
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || *end || v < 0 || v > 15) return 0;
    *out = (int)v;
    return 1;
}

int cmd_bench(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},   {"config", required_argument, 0, 'c'},
        {"seq", required_argument, 0, 'T'},     {"schedules", required_argument, 0, 's'},
        {"threads", required_argument, 0, 't'}, {"reps", required_argument, 0, 'r'},
        {"warmup", required_argument, 0, 'w'},  {"block", required_argument, 0, 'B'},
        {"chunk", required_argument, 0, 'C'},   {"logit-chunk", required_argument, 0, 'l'},
        {"largest", required_argument, 0, 'L'}, {"numerics", required_argument, 0, 'N'},
        {"no-train", no_argument, 0, 'X'},      {"device", required_argument, 0, 'D'},
        {"csv", no_argument, 0, 'v'},           {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    const char *model = NULL, *config = NULL, *sched = "full,ckpt,stream";
    /* chunk, lchunk 0: the engine's defaults for the block, set after the options */
    int seqs[32], n_seqs = 0, threads = 2, reps = 0, block = SBP_DEFAULT_BLOCK, chunk = 0,
                  lchunk = 0;
    int warmup = -1; /* -1: the default, by T */
    int csv = 0, json = 0, train = 1, c;
    int numerics = 0; /* bit set of 1 << sbp_numerics; 0: the default */
    sbp_device device = SBP_DEVICE_CPU;
    int64_t largest = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'c': config = optarg; break;
        case 'T':
            if (n_seqs == 32 || !parse_pos_int("bench", "seq", optarg, &seqs[n_seqs]))
                return EXIT_USAGE;
            n_seqs++;
            break;
        case 's': sched = optarg; break;
        case 't':
            if (!parse_pos_int("bench", "threads", optarg, &threads)) return EXIT_USAGE;
            break;
        case 'r':
            if (!parse_pos_int("bench", "reps", optarg, &reps) || reps > 15) {
                fprintf(stderr, "streambp bench: --reps must be 1..15\n");
                return EXIT_USAGE;
            }
            break;
        case 'w':
            if (!parse_rounds(optarg, &warmup)) {
                fprintf(stderr, "streambp bench: --warmup must be 0..15, got \"%s\"\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case 'B':
            if (!parse_pos_int("bench", "block", optarg, &block)) return EXIT_USAGE;
            break;
        case 'C':
            if (!parse_pos_int("bench", "chunk", optarg, &chunk)) return EXIT_USAGE;
            break;
        case 'l':
            if (!parse_pos_int("bench", "logit-chunk", optarg, &lchunk)) return EXIT_USAGE;
            break;
        case 'L':
            if (!plan_parse_size("bench", optarg, &largest)) return EXIT_USAGE;
            break;
        case 'N': {
            char buf[64];
            snprintf(buf, sizeof buf, "%s", optarg);
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
                 tok = strtok_r(NULL, ",", &save)) {
                sbp_numerics nm;
                if (!parse_numerics("bench", tok, &nm)) return EXIT_USAGE;
                numerics |= 1 << nm;
            }
            break;
        }
        case 'X': train = 0; break;
        case 'D':
            if (!parse_device("bench", optarg, &device)) return EXIT_USAGE;
            break;
        case 'v': csv = 1; break;
        case 'j': json = 1; break;
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return EXIT_USAGE;
        }
    }
    if (optind < argc || (model && config)) {
        fprintf(stderr, "streambp bench: give at most one of --model and --config\n%s", usage);
        return EXIT_USAGE;
    }
    if (!chunk) chunk = SBP_DEFAULT_CHUNK(block);
    if (!lchunk) lchunk = block;
    int use[PLAN_N_SCHEDULES];
    if (!plan_parse_schedules("bench", sched, use)) return EXIT_USAGE;
    if (!n_seqs) {
        static const int dflt[] = {512, 1024, 2048, 4096, 8192, 16384};
        memcpy(seqs, dflt, sizeof dflt);
        n_seqs = 6;
    }
    /* the model directory: given, or a seeded random model of the config */
    sbp_err err = {0};
    sbp_config cfg;
    char dir[600] = "", cfgpath[1200];
    if (model) {
        snprintf(cfgpath, sizeof cfgpath, "%s/config.json", model);
    } else {
        char data[512];
        if (!config) {
            if (sbp_data_dir(data, sizeof data, &err)) return report_error("bench", &err);
            snprintf(cfgpath, sizeof cfgpath, "%s/models/bench.json", data);
        } else {
            snprintf(cfgpath, sizeof cfgpath, "%s", config);
        }
        snprintf(dir, sizeof dir, "%s/streambp-bench-XXXXXX",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (!mkdtemp(dir)) {
            fprintf(stderr, "streambp bench: cannot create a temporary directory\n");
            return EXIT_USAGE;
        }
    }
    if (sbp_config_load(&cfg, cfgpath, &err) || (!model && sbp_model_init(&cfg, 1, dir, &err))) {
        if (dir[0]) sbp_remove_tree(dir);
        return report_error("bench", &err);
    }
    const char *mdir = model ? model : dir;
    sbp_params ps;
    sbp_params_build(&ps, &cfg, &err);
    const double nparam = (double)ps.total;
    sbp_params_free(&ps);

    sbp_set_threads(threads); /* the steps run in children; the FLOP count reads it here */
    child_result sg;
    sgemm_arg sa = {.threads = threads,
                    .M = 2048,
                    .C = cfg.hidden,
                    .F = cfg.ffn,
                    .V = cfg.vocab,
                    .portable = 1};
    fprintf(stderr, "streambp bench: measuring the sgemm rate...\n");
    in_child(&sg, sgemm_child, &sa);
    const double sgemm = sgemm_reading(&sg, 0), pgemm = sgemm_reading(&sg, 1);
    double before = sgemm; /* the latest run-level sgemm reading */

    if (!json && !csv) {
        printf("streambp bench: %s (%s, C=%d, L=%d, heads %d/%d, F=%d, V=%d, %.1fM parameters), "
               "B = 1, fp32, %d threads, block %d, stream chunk %d, logit chunk %d\n",
               cfgpath, cfg.model_type, cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn,
               cfg.vocab, nparam / 1e6, threads, block, chunk, lchunk);
        printf("BLAS: %s, kernels %s\n", openblas_get_config(), openblas_get_corename());
        printf("sgemm rate in this run: %.1f GFLOP/s (mean of the medians of %dx%dx%d, %dx%dx%d, "
               "%dx%dx%d)\n",
               sgemm, 2048, cfg.hidden, cfg.ffn, 2048, cfg.ffn, cfg.hidden, 2048, cfg.hidden,
               cfg.vocab);
        printf("portable product at the same shapes: %.1f GFLOP/s, %.0f%% of sgemm (%.1f, %.1f, "
               "%.1f)\n",
               pgemm, 100 * pgemm / sgemm, sg.times[1][0], sg.times[1][1], sg.times[1][2]);
    }
    if (csv)
        printf("T,schedule,numerics,runs,median_s,gflop,gflops,pct_sgemm,tokens_per_s,ledger_peak_"
               "bytes,"
               "planned_peak_bytes,rss_bytes,loss\n");
    cJSON *jrows = cJSON_CreateArray();
    row_out out = {.csv = csv, .json = json, .sgemm = sgemm, .rows = jrows};
    int budget_rows = largest ? 1 : n_seqs;
    if (!json && !csv)
        printf("%7s %-22s %4s %9s %9s %8s %7s %9s %10s %10s %9s %8s\n", "T", "schedule", "runs",
               "median s", "GFLOP", "GFLOP/s", "%sgemm", "tokens/s", "peak MiB", "plan MiB",
               "RSS MiB", "RSS/peak");
    int failures = 0;
    for (int si = 0; si < budget_rows; si++) {
        /* memory: each schedule alone in a process (its own peak RSS), one step */
        child_result mem[2 * PLAN_N_SCHEDULES];
        sbp_ledger plan[2 * PLAN_N_SCHEDULES];
        step_arg timing = {.model = mdir,
                           .T = seqs[si],
                           .threads = threads,
                           .reps = reps               ? reps
                                   : seqs[si] <= 4096 ? 3
                                                      : 1,
                           .warmup = largest       ? 0
                                     : warmup >= 0 ? warmup
                                                   : seqs[si] <= 4096,
                           .sgemm = device == SBP_DEVICE_CPU};
        /* configuration q: schedule q % PLAN_N_SCHEDULES in numerics q / PLAN_N_SCHEDULES */
        const int nums = device != SBP_DEVICE_CPU       ? 1 << SBP_NUMERICS_PORTABLE
                         : numerics                     ? numerics
                         : seqs[si] <= 4096 && !largest ? 3
                                                        : 1;
        int kidx[2 * PLAN_N_SCHEDULES], Ts[2 * PLAN_N_SCHEDULES], n_cfg = 0;
        for (int q = 0; q < 2 * PLAN_N_SCHEDULES; q++)
            n_cfg += use[q % PLAN_N_SCHEDULES] && (nums & (1 << q / PLAN_N_SCHEDULES));
        /* one configuration with a warm-up: the timing process is that schedule alone, and its
         * memory is measured there, over warm steps (no separate cold step); it times no sgemm
         * between rounds (the products' operands would count in its RSS), so its fraction of
         * sgemm is of the run's rate */
        const int timed = !largest && n_cfg && (timing.reps > 1 || timing.warmup);
        const int solo = timed && n_cfg == 1;
        timing.sgemm = timing.sgemm && !solo;
        for (int q = 0; q < 2 * PLAN_N_SCHEDULES; q++) {
            const int k = q % PLAN_N_SCHEDULES, num = q / PLAN_N_SCHEDULES;
            mem[q].ok = 0;
            if (!use[k] || !(nums & (1 << num))) continue;
            sbp_grad_opts g = {.schedule = kinds[k].schedule,
                               .block = block,
                               .chunk = chunk,
                               .logit_chunk = lchunk,
                               .chunked_logits = kinds[k].chunked_logits,
                               .numerics = (sbp_numerics)num,
                               .device = device};
            int T = seqs[si];
            if (largest) {
                sbp_plan_opts po = {.grad = g, .B = 1, .storage_bytes = 4};
                T = plan_largest_T(&cfg, &po, largest, &plan[q]);
                if (T == 0) {
                    printf("%-13s does not fit in %.0f MiB at any T\n", kinds[k].name,
                           mib(largest));
                    continue;
                }
            } else {
                sbp_plan_opts po = {.grad = g, .B = 1, .T = T, .storage_bytes = 4};
                if (sbp_plan(&plan[q], &cfg, &po, &err)) memset(&plan[q], 0, sizeof plan[q]);
            }
            Ts[q] = T;
            step_arg a = {.model = mdir, .T = T, .threads = threads, .reps = 1, .n = 1, .g = {g}};
            if (!solo) {
                fprintf(stderr, "  T = %d, %s, %s numerics: memory...\n", T, kinds[k].name,
                        sbp_numerics_name(g.numerics));
                in_child(&mem[q], step_child, &a);
            }
            mem[q].ok |= solo;
            if (!mem[q].ok) {
                fprintf(stderr, "streambp bench: T = %d, %s: %s\n", T, kinds[k].name, mem[q].err);
                failures++;
                continue;
            }
            kidx[q] = timing.n;
            timing.g[timing.n++] = g;
        }
        /* time: every schedule in one process, interleaved (unless one step is all there is) */
        child_result tr = {0};
        if (timed && timing.n) {
            fprintf(stderr, "  T = %d: %d warm-up and %d timed round%s of %d schedule%s%s...\n",
                    seqs[si], timing.warmup, timing.reps, timing.reps > 1 ? "s" : "", timing.n,
                    timing.n > 1 ? "s" : "", solo ? ", and its memory" : "");
            in_child(&tr, step_child, &timing);
            if (!tr.ok) {
                fprintf(stderr, "streambp bench: T = %d: %s\n", seqs[si], tr.err);
                failures++;
                continue;
            }
        }
        for (int q = 0; solo && q < 2 * PLAN_N_SCHEDULES; q++)
            if (mem[q].ok) mem[q] = tr; /* its ledger, RSS and loss */
        /* a schedule timed alone: its fraction is over the mean of the sgemm rates timed just
         * before its process and just after (the run's own, or the previous T's after) */
        double solo_sgemm = NAN;
        if (solo && timing.n && device == SBP_DEVICE_CPU && isfinite(before)) {
            child_result after;
            sa.portable = 0;
            in_child(&after, sgemm_child, &sa);
            const double a = sgemm_reading(&after, 0);
            if (isfinite(a)) {
                fprintf(stderr, "  T = %d: sgemm rate %.1f GFLOP/s before, %.1f after\n", seqs[si],
                        before, a);
                solo_sgemm = (before + a) / 2, before = a;
            }
        }
        for (int q = 0; q < 2 * PLAN_N_SCHEDULES; q++) {
            const int k = q % PLAN_N_SCHEDULES;
            if (!use[k] || !mem[q].ok) continue;
            double *tv = timed ? tr.times[kidx[q]] : mem[q].times[0];
            int nt = timed ? tr.n_times : 1;
            sbp_grad_opts g = timing.g[kidx[q]];
            double of_sgemm = NAN, ratio[16];
            if (timed && (tr.sgemm[0] > 0 || isfinite(solo_sgemm))) {
                const double flop = sbp_step_flops(&cfg, 1, Ts[q], &g);
                for (int i = 0; i < nt; i++)
                    ratio[i] = flop / tv[i] / 1e9 / (solo ? solo_sgemm : tr.sgemm[i]);
                of_sgemm = median(ratio, nt);
            }
            emit(&out, &cfg, kinds[k].name, Ts[q], &g, median(tv, nt), nt, of_sgemm, &mem[q],
                 &plan[q]);
        }
        /* whole training steps, each alone: every weight, then (up to T = 4096) an adapter */
        for (int lo = 0; lo < 2 && train && !largest && device == SBP_DEVICE_CPU; lo++) {
            if (lo && seqs[si] > 4096) break;
            const sbp_lora_config lc = {.r = 32, .alpha = 128, .targets = SBP_LORA_ALL};
            sbp_grad_opts g = {
                .schedule = SBP_STREAM, .block = block, .chunk = chunk, .logit_chunk = lchunk};
            step_arg a = {.model = mdir,
                          .T = seqs[si],
                          .threads = threads,
                          .reps = timing.reps,
                          .warmup = timing.warmup,
                          .n = 1,
                          .train = 1,
                          .g = {g}};
            sbp_plan_opts po = {
                .grad = g, .B = 1, .T = seqs[si], .storage_bytes = 4, .optimizer = 1};
            if (lo) a.lora = po.lora = lc;
            sbp_ledger tplan;
            if (sbp_plan(&tplan, &cfg, &po, &err)) memset(&tplan, 0, sizeof tplan);
            child_result t;
            fprintf(stderr, "  T = %d: %d training step%s (stream + clipping + AdamW%s)...\n",
                    seqs[si], a.reps + a.warmup, a.reps + a.warmup > 1 ? "s" : "",
                    lo ? ", LoRA r 32" : "");
            in_child(&t, step_child, &a);
            if (!t.ok) {
                fprintf(stderr, "streambp bench: T = %d, training step%s: %s\n", seqs[si],
                        lo ? " (LoRA)" : "", t.err);
                failures++;
                continue;
            }
            sbp_lora flops_view = {.cfg = lc}; /* the FLOP count reads the adapter's config */
            if (lo) g.lora = &flops_view;
            emit(&out, &cfg, lo ? "train-stream-lora" : "train-stream", seqs[si], &g,
                 median(t.times[0], t.n_times), t.n_times, NAN, &t, &tplan);
        }
        fflush(stdout);
    }
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "config", cfgpath);
        cJSON_AddNumberToObject(o, "threads", threads);
        cJSON_AddNumberToObject(o, "sgemm_gflops", sgemm);
        cJSON_AddNumberToObject(o, "portable_gemm_gflops", pgemm);
        cJSON_AddStringToObject(o, "blas", openblas_get_config());
        cJSON_AddStringToObject(o, "blas_kernels", openblas_get_corename());
        if (largest) cJSON_AddNumberToObject(o, "budget_bytes", (double)largest);
        cJSON_AddItemToObject(o, "rows", jrows);
        print_json(o);
    } else {
        cJSON_Delete(jrows);
        if (!csv)
            printf(
                "(peak MiB: the ledger's peak; plan MiB: the planner's for the same step; RSS: "
                "the whole process, binary and libraries included; train-stream: a stream step, "
                "clipping and the AdamW update, the two moments in the ledger and the plan; "
                "train-stream-lora: the same for a LoRA adapter r 32 on every linear layer, the "
                "base frozen; GFLOP counts the step's matrix products; %%sgemm: the median over "
                "the rounds of the step's GFLOP/s over the sgemm rate timed in the same round "
                "(the median of three readings right after it; one schedule timed alone: over the "
                "mean of the rates timed just before and just after its process; the training "
                "rows: over the run's sgemm rate))\n");
    }
    if (dir[0]) sbp_remove_tree(dir); /* ours (mkdtemp), walked without following a link */
    return failures ? EXIT_USAGE : 0;
}
