/* cmd_bench.c — `streambp bench`: step time, FLOP rate and memory of each schedule, against the
 * machine's sgemm rate measured in the same run. This file parses the options and formats the
 * rows; the measurements (the model, the child processes, the timing rounds, the schedule
 * comparisons, the memory) are the bench module's: src/bench/bench.h. */
#include "../bench/bench.h"
#include "cli.h"
#include "cmd_plan.h"
#include "options.h"
#include "verify/defaults.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    "  --threads N        default: OMP_NUM_THREADS, else every core this process may use\n"
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
    "  --grads-out        each schedule's gradient leaves piece by piece as the backward\n"
    "                     completes it, as grad --out writes it to its file (here dropped):\n"
    "                     the memory of that step (CPU only; the train rows hold theirs)\n"
    "  --profile          under each row, where its timed steps spent their time: each\n"
    "                     operation of the engine's table (the products by shape, with their\n"
    "                     GFLOP/s), its calls and milliseconds per step, and the time between\n"
    "                     the operations (CPU only; two clock reads a call, no bit changes)\n"
    "  --csv | --json     machine-readable output (--profile: text and JSON)\n";

/* The command's options: what the bench module measures (o) and how it is shown. */
typedef struct {
    sbp_bench_opts o;
    const char *model, *config, *sched;
    int seqs[SBP_BENCH_MAX_SEQS];
    sbp_bench_schedule schedules[PLAN_N_SCHEDULES];
    int csv, json;
} bench_args;

/* A count of rounds, 0..15 */
static int parse_rounds(const char *text, int *out) {
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || *end || v < 0 || v > SBP_BENCH_MAX_ROUNDS) return 0;
    *out = (int)v;
    return 1;
}

/* One of bench's own options (getopt code c, its argument arg) into a; 0 on a bad value
 * (reported), -1 for an unknown code. */
static int parse_option(bench_args *a, int c, const char *arg) {
    sbp_bench_opts *o = &a->o;
    switch (c) {
    case 'c': a->config = arg; return 1;
    case 'T':
        if (o->n_seqs == SBP_BENCH_MAX_SEQS ||
            !parse_pos_int("bench", "seq", arg, &a->seqs[o->n_seqs]))
            return 0;
        o->n_seqs++;
        return 1;
    case 's': a->sched = arg; return 1;
    case 'r':
        if (!parse_pos_int("bench", "reps", arg, &o->reps) || o->reps > SBP_BENCH_MAX_ROUNDS) {
            fprintf(stderr, "streambp bench: --reps must be 1..15\n");
            return 0;
        }
        return 1;
    case 'w':
        if (!parse_rounds(arg, &o->warmup)) {
            fprintf(stderr, "streambp bench: --warmup must be 0..15, got \"%s\"\n", arg);
            return 0;
        }
        return 1;
    case 'L': return plan_parse_size("bench", arg, &o->largest);
    case 'N': {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", arg);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save)) {
            sbp_numerics nm;
            if (!parse_numerics("bench", tok, &nm)) return 0;
            o->numerics |= 1 << nm;
        }
        return 1;
    }
    case 'X': o->train = 0; return 1;
    case 'P': o->profile = 1; return 1;
    case 'G': o->grads_out = 1; return 1;
    case 'v': a->csv = 1; return 1;
    }
    return -1;
}

/* The options into a; 0 to run, else the exit code (-1: --help printed). */
static int parse(bench_args *a, int argc, char **argv) {
    static const struct option opts[] = {OPTION_MODEL,
                                         {"config", required_argument, 0, 'c'},
                                         {"seq", required_argument, 0, 'T'},
                                         {"schedules", required_argument, 0, 's'},
                                         OPTION_THREADS,
                                         {"reps", required_argument, 0, 'r'},
                                         {"warmup", required_argument, 0, 'w'},
                                         OPTION_BLOCK,
                                         OPTION_CHUNK,
                                         OPTION_LOGIT_CHUNK,
                                         {"largest", required_argument, 0, 'L'},
                                         {"numerics", required_argument, 0, 'N'},
                                         {"no-train", no_argument, 0, 'X'},
                                         {"profile", no_argument, 0, 'P'},
                                         {"grads-out", no_argument, 0, 'G'},
                                         OPTION_DEVICE,
                                         {"csv", no_argument, 0, 'v'},
                                         OPTION_JSON,
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    memset(a, 0, sizeof *a);
    a->sched = "full,ckpt,stream";
    /* chunk, logit_chunk 0: the engine's defaults for the block, set after the options; reps 0
     * and warmup -1: the defaults by T; numerics 0: the default */
    a->o = (sbp_bench_opts){.threads = default_threads(),
                            .warmup = -1,
                            .block = SBP_DEFAULT_BLOCK,
                            .device = SBP_DEVICE_CPU,
                            .train = 1,
                            .largest_T = sbp_plan_largest_T};
    common_opts co = {.cmd = "bench",
                      .model = &a->model,
                      .block = &a->o.block,
                      .chunk = &a->o.chunk,
                      .logit_chunk = &a->o.logit_chunk,
                      .threads = &a->o.threads,
                      .device = &a->o.device,
                      .json = &a->json};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'h') {
            fputs(usage, stdout);
            return -1;
        }
        const int ok = common_opt_code(c) ? common_opt(&co, c, optarg) : parse_option(a, c, optarg);
        if (ok < 0) fputs(usage, stderr);
        if (ok <= 0) return EXIT_USAGE;
    }
    if (a->o.grads_out && a->o.device != SBP_DEVICE_CPU) {
        fprintf(stderr, "streambp bench: --grads-out measures a CPU step (grad --out's)\n");
        return EXIT_USAGE;
    }
    if (a->o.profile && a->csv) {
        fprintf(stderr, "streambp bench: --profile prints in the text and JSON forms, not CSV\n");
        return EXIT_USAGE;
    }
    if (optind < argc || (a->model && a->config)) {
        fprintf(stderr, "streambp bench: give at most one of --model and --config\n%s", usage);
        return EXIT_USAGE;
    }
    sbp_bench_opts *o = &a->o;
    if (!o->chunk) o->chunk = SBP_DEFAULT_CHUNK(o->block);
    if (!o->logit_chunk) o->logit_chunk = o->block;
    int use[PLAN_N_SCHEDULES];
    if (!plan_parse_schedules("bench", a->sched, use)) return EXIT_USAGE;
    for (int k = 0; k < PLAN_N_SCHEDULES; k++)
        if (use[k])
            a->schedules[o->n_schedules++] =
                (sbp_bench_schedule){plan_schedules[k].name, plan_schedules[k].schedule,
                                     plan_schedules[k].chunked_logits};
    o->schedules = a->schedules;
    if (!o->n_seqs) {
        static const int dflt[] = {512, 1024, 2048, 4096, 8192, 16384};
        memcpy(a->seqs, dflt, sizeof dflt);
        o->n_seqs = 6;
    }
    o->seqs = a->seqs;
    return 0;
}

static double mib(int64_t b) {
    return (double)b / 1048576.0;
}

/* Where rows go: text, CSV, or JSON objects collected in rows. */
typedef struct {
    int csv, json;
    int on_device; /* the step ran on a GPU: the CPU's sgemm rate is no yardstick for it */
    cJSON *rows;
} row_out;

/* p's rows by time, the longest first: idx (p->n_rows) */
static void by_time(int *idx, const sbp_profile *p) {
    for (int i = 0; i < p->n_rows; i++) {
        int j = i;
        for (; j > 0 && p->rows[idx[j - 1]].seconds < p->rows[i].seconds; j--) idx[j] = idx[j - 1];
        idx[j] = i;
    }
}

/* Under a row: where its timed steps' time went, per step (sbp_profile). */
static void print_profile(const sbp_profile *p, double step_median) {
    if (!p->steps) return;
    int idx[SBP_PROFILE_ROWS];
    by_time(idx, p);
    const double per = 1.0 / (double)p->steps;
    double in_ops = 0;
    for (int i = 0; i < p->n_rows; i++) in_ops += p->rows[i].seconds;
    printf("        %-22s %12s %8s %9s %7s %8s\n", "operation", "N x K", "calls", "ms/step",
           "share", "GFLOP/s");
    for (int i = 0; i < p->n_rows; i++) {
        const sbp_profile_row *r = &p->rows[idx[i]];
        char shape[32] = "", rate[16] = "";
        if (r->n) snprintf(shape, sizeof shape, "%d x %d", r->n, r->k);
        if (r->flop > 0 && r->seconds > 0)
            snprintf(rate, sizeof rate, "%.1f", r->flop / r->seconds / 1e9);
        printf("        %-22s %12s %8.1f %9.2f %6.1f%% %8s\n", r->op, shape, (double)r->calls * per,
               1e3 * r->seconds * per, 100 * r->seconds / p->seconds, rate);
    }
    printf("        %-22s %12s %8s %9.2f %6.1f%%\n", "between the operations", "", "",
           1e3 * (p->seconds - in_ops) * per, 100 * (p->seconds - in_ops) / p->seconds);
    printf("        the engine's run: %.2f ms per step (mean of %lld), the step's median %.2f ms "
           "(the rest: the gradient slab's allocation and zeroing, the objective's setup)\n",
           1e3 * p->seconds * per, (long long)p->steps, 1e3 * step_median);
    if (p->lost)
        printf("        (%lld calls of kinds past the first %d not counted)\n", (long long)p->lost,
               SBP_PROFILE_ROWS);
}

/* p as JSON: totals over p->steps engine runs */
static cJSON *profile_json(const sbp_profile *p) {
    cJSON *j = cJSON_CreateObject(), *ops = cJSON_CreateArray();
    cJSON_AddNumberToObject(j, "engine_runs", (double)p->steps);
    cJSON_AddNumberToObject(j, "engine_seconds", p->seconds);
    cJSON_AddNumberToObject(j, "calls_not_counted", (double)p->lost);
    for (int i = 0; i < p->n_rows; i++) {
        const sbp_profile_row *r = &p->rows[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "op", r->op);
        if (r->n) cJSON_AddNumberToObject(o, "n", r->n), cJSON_AddNumberToObject(o, "k", r->k);
        cJSON_AddNumberToObject(o, "calls", (double)r->calls);
        cJSON_AddNumberToObject(o, "seconds", r->seconds);
        if (r->flop > 0) cJSON_AddNumberToObject(o, "flop", r->flop);
        cJSON_AddItemToArray(ops, o);
    }
    cJSON_AddItemToObject(j, "operations", ops);
    return j;
}

/* One row of the table (sbp_bench_sink.row). */
static void emit(void *ctx, const sbp_bench_row *r) {
    row_out *o = ctx;
    const double peak = (double)r->lg.peak_total;
    const char *num = sbp_numerics_name(r->numerics);
    if (o->csv) {
        char pct[16] = "", ppk[16] = "";
        if (!o->on_device) snprintf(pct, sizeof pct, "%.2f", 100 * r->of_sgemm);
        if (!o->on_device && isfinite(r->of_peak))
            snprintf(ppk, sizeof ppk, "%.2f", 100 * r->of_peak);
        printf("%d,%s,%s,%d,%.6f,%.3f,%.3f,%s,%s,%.1f,%lld,%lld,%lld,%.17g\n", r->T, r->name, num,
               r->runs, r->seconds, r->gflop, r->gflops, pct, ppk, r->tokens_per_s,
               (long long)r->lg.peak_total, (long long)r->planned_peak, r->rss, r->loss);
    } else if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "T", r->T);
        cJSON_AddStringToObject(j, "schedule", r->name);
        cJSON_AddStringToObject(j, "numerics", num);
        cJSON_AddNumberToObject(j, "runs", r->runs);
        cJSON_AddNumberToObject(j, "median_seconds", r->seconds);
        cJSON_AddNumberToObject(j, "gflop", r->gflop);
        cJSON_AddNumberToObject(j, "gflops", r->gflops);
        if (!o->on_device) cJSON_AddNumberToObject(j, "fraction_of_sgemm", r->of_sgemm);
        if (!o->on_device && isfinite(r->of_peak))
            cJSON_AddNumberToObject(j, "fraction_of_fma_peak", r->of_peak);
        cJSON_AddNumberToObject(j, "tokens_per_second", r->tokens_per_s);
        cJSON_AddItemToObject(j, "memory", ledger_json(&r->lg));
        cJSON_AddNumberToObject(j, "planned_peak_bytes", (double)r->planned_peak);
        cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)r->rss);
        if (r->profile) cJSON_AddItemToObject(j, "profile", profile_json(r->profile));
        cJSON_AddItemToArray(o->rows, j);
    } else {
        char label[48], pct[16] = "      -", ppk[16] = "     -";
        snprintf(label, sizeof label, "%s%s", r->name,
                 r->numerics == SBP_NUMERICS_PORTABLE ? " (portable)" : "");
        if (!o->on_device) snprintf(pct, sizeof pct, "%6.1f%%", 100 * r->of_sgemm);
        if (!o->on_device && isfinite(r->of_peak))
            snprintf(ppk, sizeof ppk, "%5.1f%%", 100 * r->of_peak);
        printf("%7d %-22s %4d %9.3f %9.1f %8.1f %s %s %9.0f %10.1f %10.1f %9.1f %8.2f\n", r->T,
               label, r->runs, r->seconds, r->gflop, r->gflops, pct, ppk, r->tokens_per_s,
               mib(r->lg.peak_total), mib(r->planned_peak), mib(r->rss), r->rss / peak);
        if (r->profile) print_profile(r->profile, r->seconds);
    }
    fflush(stdout);
}

/* Progress and failures on stderr; a schedule that fits at no T is a line of the table
 * (sbp_bench_sink.note). */
static void note(void *ctx, sbp_bench_note kind, const char *text) {
    if (kind == SBP_BENCH_NO_FIT) {
        printf("%s\n", text);
        fflush(stdout);
    } else {
        fprintf(stderr, "%s%s\n", kind == SBP_BENCH_FAILURE ? "streambp bench: " : "", text);
    }
}

/* The text table's heading: the model, the BLAS, the run's product rates, the columns. */
static void print_heading(const bench_args *a, const sbp_bench_model *bm,
                          const sbp_bench_rates *r) {
    const sbp_config *cfg = &bm->cfg;
    const sbp_bench_opts *o = &a->o;
    printf("streambp bench: %s (%s, C=%d, L=%d, heads %d/%d, F=%d, V=%d, %.1fM parameters), "
           "B = 1, fp32, %d threads, block %d, stream chunk %d, logit chunk %d\n",
           bm->cfgpath, cfg->model_type, cfg->hidden, cfg->layers, cfg->heads, cfg->kv_heads,
           cfg->ffn, cfg->vocab, (double)bm->n_params / 1e6, o->threads, o->block, o->chunk,
           o->logit_chunk);
    if (o->grads_out)
        printf("gradient: each piece leaves as the backward completes it (grad --out's step; "
               "dropped here), never held whole\n");
    printf("BLAS: %s, kernels %s\n", openblas_get_config(), openblas_get_corename());
    const char *thp;
    const int huge = sbp_huge_pages(&thp);
    printf("transparent huge pages: %s%s\n", thp,
           huge == 0 ? " (off: every buffer faulted in 4 KiB pages; docs/performance.md, "
                       "\"Huge pages\")"
                     : "");
    printf("sgemm rate in this run: %.1f GFLOP/s (mean of the medians of %dx%dx%d, %dx%dx%d, "
           "%dx%dx%d)\n",
           r->sgemm, 2048, cfg->hidden, cfg->ffn, 2048, cfg->ffn, cfg->hidden, 2048, cfg->hidden,
           cfg->vocab);
    printf("portable product at the same shapes: %.1f GFLOP/s, %.0f%% of sgemm (%.1f, %.1f, "
           "%.1f)\n",
           r->portable, 100 * r->portable / r->sgemm, r->parts[1][0], r->parts[1][1],
           r->parts[1][2]);
    if (isfinite(r->fma_peak))
        printf("vector FMA peak: %.1f GFLOP/s on %d threads (sgemm at %.0f%% of it, the portable "
               "product at %.0f%%)\n",
               r->fma_peak, o->threads, 100 * r->sgemm / r->fma_peak,
               100 * r->portable / r->fma_peak);
    else if (sbp_bench_fma_chains(1) == 0)
        printf("vector FMA peak: none (this build's products run a scalar tile)\n");
    else
        printf("vector FMA peak: not measured (the measuring process failed)\n");
    if (o->device != SBP_DEVICE_CPU)
        printf("the steps run on the %s device: the rates above are this host's CPU's, so the "
               "%%sgemm column is left out\n",
               o->device == SBP_DEVICE_CUDA ? "CUDA" : "emulated CUDA");
}

/* The end: the JSON document, or the table's legend. */
static void print_end(const bench_args *a, const sbp_bench_model *bm, const sbp_bench_rates *r,
                      cJSON *jrows) {
    if (a->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "config", bm->cfgpath);
        cJSON_AddNumberToObject(o, "threads", a->o.threads);
        cJSON_AddNumberToObject(o, "sgemm_gflops", r->sgemm);
        cJSON_AddNumberToObject(o, "portable_gemm_gflops", r->portable);
        if (isfinite(r->fma_peak)) cJSON_AddNumberToObject(o, "fma_peak_gflops", r->fma_peak);
        cJSON_AddStringToObject(o, "blas", openblas_get_config());
        cJSON_AddStringToObject(o, "blas_kernels", openblas_get_corename());
        const char *thp;
        sbp_huge_pages(&thp);
        cJSON_AddStringToObject(o, "huge_pages", thp);
        if (a->o.largest) cJSON_AddNumberToObject(o, "budget_bytes", (double)a->o.largest);
        cJSON_AddBoolToObject(o, "gradient_held", !a->o.grads_out);
        cJSON_AddItemToObject(o, "rows", jrows);
        print_json(o);
        return;
    }
    cJSON_Delete(jrows);
    if (!a->csv)
        printf("(peak MiB: the ledger's peak; plan MiB: the planner's for the same step; RSS: "
               "the whole process, binary and libraries included; train-stream: a stream step, "
               "clipping and the AdamW update, the two moments in the ledger and the plan; "
               "train-stream-lora: the same for a LoRA adapter r 32 on every linear layer, the "
               "base frozen; GFLOP counts the step's matrix products; %%sgemm: the median over "
               "the rounds of the step's GFLOP/s over the sgemm rate timed in the same round "
               "(the median of three readings right after it; one schedule timed alone: over the "
               "mean of the rates timed just before and just after its process; the training "
               "rows: over the run's sgemm rate); %%peak: the same over the vector FMA peak, timed "
               "beside the sgemm rate)\n");
}

int cmd_bench(int argc, char **argv) {
    bench_args a;
    int rc = parse(&a, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    /* the model directory: given, or a seeded random model of the config (by default the
     * bundled data/models/bench.json) */
    sbp_err err = {0};
    char cfgpath[1200];
    if (!a.model && !a.config) {
        char data[512];
        if (sbp_data_dir(data, sizeof data, &err)) return report_error("bench", &err);
        snprintf(cfgpath, sizeof cfgpath, "%s/models/bench.json", data);
        a.config = cfgpath;
    }
    sbp_bench_model bm;
    if (sbp_bench_model_open(&bm, a.model, a.config, &err)) return report_error("bench", &err);
    a.o.model = &bm;
    fprintf(stderr, "streambp bench: measuring the sgemm rate...\n");
    sbp_bench_rates rates;
    sbp_bench_gemm_rates(&rates, &bm.cfg, a.o.threads, 1);
    if (!a.json && !a.csv) print_heading(&a, &bm, &rates);
    if (a.csv)
        printf("T,schedule,numerics,runs,median_s,gflop,gflops,pct_sgemm,pct_fma_peak,"
               "tokens_per_s,ledger_peak_bytes,planned_peak_bytes,rss_bytes,loss\n");
    cJSON *jrows = cJSON_CreateArray();
    row_out out = {
        .csv = a.csv, .json = a.json, .on_device = a.o.device != SBP_DEVICE_CPU, .rows = jrows};
    if (!a.json && !a.csv)
        printf("%7s %-22s %4s %9s %9s %8s %7s %6s %9s %10s %10s %9s %8s\n", "T", "schedule", "runs",
               "median s", "GFLOP", "GFLOP/s", "%sgemm", "%peak", "tokens/s", "peak MiB",
               "plan MiB", "RSS MiB", "RSS/peak");
    const sbp_bench_sink sink = {.ctx = &out, .row = emit, .note = note};
    int failures = 0;
    sbp_status st = sbp_bench_run(&a.o, &rates, &sink, &failures, &err);
    if (!st)
        print_end(&a, &bm, &rates, jrows);
    else
        cJSON_Delete(jrows);
    sbp_bench_model_close(&bm);
    if (st) return report_error("bench", &err);
    return failures ? EXIT_USAGE : 0;
}
