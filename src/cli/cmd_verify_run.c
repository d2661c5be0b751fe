/* cmd_verify_run.c — `streambp verify [options]`: the full comparison matrix on one model and
 * batch, by default the bundled one. */
#include "cli.h"
#include "objopts.h"
#include "options.h"
#include "verify/defaults.h"
#include "verify/matrix.h"
#include "cmd_verify.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: streambp verify [--model DIR --batch FILE] [options]\n"
    "       streambp verify diff A B | fd | --suite      (see `streambp verify help`)\n"
    "\n"
    "Runs every schedule (full, ckpt, stream) at several chunk sizes, in float32 and float64, at\n"
    "1 and 2 threads, in fast and portable numerics, and the ref/ float64 oracle (which reads the\n"
    "files with its own readers), and compares every parameter gradient in nine groups: loading\n"
    "(the library's reading of config, weights and batch against the oracle's), fp64 vs the\n"
    "float64 truth (<= 1e-10), fp32 vs the truth (within slack x the error of the oracle's own\n"
    "loops run in float32), schedules (fast: bitwise at block-multiple chunks), threads (fast:\n"
    "bitwise), ragged chunks (fast: within the measured tolerance), portable (every portable run\n"
    "bitwise), devices (the CUDA backends' runs against the portable CPU run, bitwise, with\n"
    "--devices), micro-batches (the batch split into micro-batches of different T, one step, vs\n"
    "the truth of the whole batch). One row per\n"
    "tensor and group: bitwise runs, max ULP, max abs, relative L2, cosine and the norm ratio\n"
    "(cosine alone misses a scale error), the budget and the verdict. Without --model/--batch it\n"
    "runs on the bundled default (Qwen3-tiny, seed 1, data/batches/sft-demo.safetensors).\n"
    "\n"
    "  --schedules LIST   subset of full,ckpt,stream (default all)\n"
    "  --chunks LIST      stream chunks, e.g. 16,32,7 (default B,2B,4B,T and 1,7,T-1,T+5)\n"
    "  --precisions LIST  subset of fp32,fp64 (default both)\n"
    "  --numerics LIST    subset of fast,portable (default both)\n"
    "  --devices LIST     cpu and the devices whose runs must equal the portable CPU run\n"
    "                     bitwise: cuda (a GPU), cuda-emu (the CUDA kernels in the SIMT\n"
    "                     emulator); default cpu\n"
    "  --threads LIST     thread counts, e.g. 1,2 (default 1,2; the first is the reference)\n"
    "  --block N          token block (default 16 when T < 1024, else 256)\n"
    "  --unattended MODE  rows that see no key: zero (default), hf-eager, hf-sdpa (grad --help)\n"
    "  --lora DIR         check a LoRA adapter's gradients (peft's names; the base model frozen)\n"
    "                     in every group, the oracle reading the adapter with its own reader\n"
    "  --no-ref           take float64 full BP as the truth (ref/ is naive: use for large models)\n"
    "  --slack X          fp32 budget factor (default 4)\n"
    "  --failures-only    print only rows that fail\n"
    "  --json             JSON instead of the tables\n"
    "  --no-golden        leave out the golden step (the default run, without --model, ends with\n"
    "                     `verify golden` on cpu and the --devices: the portable bits of the\n"
    "                     committed cases recomputed on this machine)\n"
    "  --no-reach         leave out the reach step (the default run goes on with `verify reach`:\n"
    "                     small models and batches that take the paths the bundled ones do not,\n"
    "                     against the oracle)\n"
    "  --no-self-test     leave out the self-test (the default run ends with `verify\n"
    "                     --self-test`: faults planted into the verifier's inputs, each of which\n"
    "                     a comparison must flag)\n"
    "Exit status: 0 every promise holds, 1 one is broken, 2 usage or input error.\n"
    "\n";

/* Parses "a,b,c" with each item given to item(); returns 0 on error. */
static int parse_list(const char *text, const char *opt, int (*item)(const char *, int *), int *out,
                      int max, int *n) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (*n == max || !item(tok, &out[*n])) {
            fprintf(stderr, "streambp verify: bad --%s \"%s\"\n", opt, text);
            return 0;
        }
        (*n)++;
    }
    if (*n == 0) fprintf(stderr, "streambp verify: --%s is empty\n", opt);
    return *n > 0;
}

static int item_int(const char *s, int *v) {
    char *end;
    long x = strtol(s, &end, 10);
    *v = (int)x;
    return end != s && !*end && x >= 1 && x < (1 << 30);
}
static int item_threads(const char *s, int *v) {
    return item_int(s, v) && *v <= SBP_MAX_THREADS;
}
static int item_sched(const char *s, int *v) {
    sbp_schedule sc;
    if (!sbp_schedule_parse(s, &sc)) return 0;
    *v = 1 << sc;
    return 1;
}
static int item_prec(const char *s, int *v) {
    if (strcmp(s, "fp32") == 0)
        *v = 1 << SBP_FP32;
    else if (strcmp(s, "fp64") == 0)
        *v = 1 << SBP_FP64;
    else
        return 0;
    return 1;
}

static int item_numerics(const char *s, int *v) {
    sbp_numerics num;
    if (!sbp_numerics_parse(s, &num)) return 0;
    *v = 1 << num;
    return 1;
}

static int item_device(const char *s, int *v) {
    sbp_device d;
    if (!sbp_device_parse(s, &d)) return 0;
    *v = d == SBP_DEVICE_CPU ? 0 : 1 << d;
    return 1;
}

static int bits(const int *v, int n) {
    int b = 0;
    for (int i = 0; i < n; i++) b |= v[i];
    return b;
}

static void print_group(const sbp_verify_group *g, int failures_only) {
    printf("\n[%s] %s (%d comparisons)\n", g->title, g->promise, g->runs);
    if (!g->runs) {
        printf("  (no runs in this group)\n");
        return;
    }
    printf("%-50s %8s %9s %9s %9s %9s %9s %9s  %s\n", "tensor", "bitwise", "max ULP", "max abs",
           "rel L2", "budget", "1-cos", "ratio-1", "verdict");
    for (int i = 0; i < g->n_rows; i++) {
        const sbp_verify_row *r = &g->rows[i];
        if (failures_only && !r->failed) continue;
        char bw[24], budget[16];
        snprintf(bw, sizeof bw, "%d/%d", r->bitwise_runs, r->runs);
        if (r->budget > 0)
            snprintf(budget, sizeof budget, "%9.2g", r->budget);
        else
            snprintf(budget, sizeof budget, "%9s", "bitwise");
        printf("%-50s %8s %9.3g %9.3g %9.3g %s %9.2g %+9.2g  %s\n", r->name, bw, r->max_ulp,
               r->max_abs, r->rel_l2, budget, 1 - r->min_cosine, r->norm_ratio - 1,
               r->failed ? "FAIL" : "ok");
    }
    for (int i = 0; i < g->n_rows; i++)
        if (g->rows[i].failed)
            printf("  %s: %d run%s broke the promise, the first: %s\n", g->rows[i].name,
                   g->rows[i].failed, g->rows[i].failed > 1 ? "s" : "", g->rows[i].first_failure);
}

static cJSON *group_json(const sbp_verify_group *g) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "group", g->title);
    cJSON_AddStringToObject(o, "promise", g->promise);
    cJSON_AddNumberToObject(o, "comparisons", g->runs);
    cJSON_AddNumberToObject(o, "failed_tensors", g->failed);
    cJSON *rows = cJSON_AddArrayToObject(o, "rows");
    for (int i = 0; i < g->n_rows && g->runs; i++) {
        const sbp_verify_row *r = &g->rows[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "tensor", r->name);
        cJSON_AddNumberToObject(x, "runs", r->runs);
        cJSON_AddNumberToObject(x, "bitwise_runs", r->bitwise_runs);
        cJSON_AddNumberToObject(x, "max_ulp", r->max_ulp);
        cJSON_AddNumberToObject(x, "max_abs", isfinite(r->max_abs) ? r->max_abs : -1);
        cJSON_AddNumberToObject(x, "rel_l2", isfinite(r->rel_l2) ? r->rel_l2 : -1);
        cJSON_AddNumberToObject(x, "budget", r->budget);
        cJSON_AddNumberToObject(x, "min_cosine", isfinite(r->min_cosine) ? r->min_cosine : -1);
        cJSON_AddNumberToObject(x, "norm_ratio", isfinite(r->norm_ratio) ? r->norm_ratio : -1);
        cJSON_AddBoolToObject(x, "ok", !r->failed);
        if (r->failed) cJSON_AddStringToObject(x, "first_failure", r->first_failure);
        cJSON_AddItemToArray(rows, x);
    }
    return o;
}

/* The command line of `verify`. */
typedef struct {
    sbp_verify_opts o;
    int json, failures_only, no_golden, no_selftest, no_reach;
} run_args;

/* The options into a: -1 to go on, else the exit status (0 after --help). */
static int parse_args(run_args *a, int argc, char **argv) {
    static const struct option opts[] = {OPTION_MODEL,
                                         {"batch", required_argument, 0, 'b'},
                                         {"schedules", required_argument, 0, 's'},
                                         {"chunks", required_argument, 0, 'c'},
                                         {"precisions", required_argument, 0, 'p'},
                                         {"numerics", required_argument, 0, 'N'},
                                         {"devices", required_argument, 0, 'D'},
                                         OPTION_UNATTENDED,
                                         {"lora", required_argument, 0, 'L'},
                                         {"threads", required_argument, 0, 't'},
                                         OPTION_BLOCK,
                                         {"no-ref", no_argument, 0, 'n'},
                                         {"slack", required_argument, 0, 'S'},
                                         {"failures-only", no_argument, 0, 'f'},
                                         OPTION_JSON,
                                         {"no-golden", no_argument, 0, 'G'},
                                         {"no-self-test", no_argument, 0, 'T'},
                                         {"no-reach", no_argument, 0, 'R'},
                                         {"help", no_argument, 0, 'h'},
                                         OBJ_LONG_OPTIONS,
                                         {0, 0, 0, 0}};
    *a = (run_args){0};
    sbp_verify_opts *o = &a->o;
    obj_args oa;
    obj_args_init(&oa);
    int c, list[8], n;
    common_opts co = {.cmd = "verify",
                      .model = &o->model,
                      .unattended = &o->unattended,
                      .block = &o->block,
                      .json = &a->json};
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b': o->batch = optarg; break;
        case 's':
            if (!parse_list(optarg, "schedules", item_sched, list, 3, &n)) return EXIT_USAGE;
            o->schedules = bits(list, n);
            break;
        case 'c':
            if (!parse_list(optarg, "chunks", item_int, o->chunks, SBP_VERIFY_MAX_CHUNKS,
                            &o->n_chunks))
                return EXIT_USAGE;
            break;
        case 'p':
            if (!parse_list(optarg, "precisions", item_prec, list, 2, &n)) return EXIT_USAGE;
            o->precisions = bits(list, n);
            break;
        case 'N':
            if (!parse_list(optarg, "numerics", item_numerics, list, 2, &n)) {
                fprintf(stderr, "streambp verify: --numerics takes fast, portable or both "
                                "(fast,portable)\n");
                return EXIT_USAGE;
            }
            o->numerics = bits(list, n);
            break;
        case 'L': o->lora = optarg; break;
        case 'D':
            if (!parse_list(optarg, "devices", item_device, list, 3, &n)) {
                fprintf(stderr, "streambp verify: --devices takes cpu, cuda, cuda-emu\n");
                return EXIT_USAGE;
            }
            o->devices = bits(list, n);
            break;
        case 't':
            if (!parse_list(optarg, "threads", item_threads, o->threads, 4, &o->n_threads))
                return EXIT_USAGE;
            break;
        case 'n': o->no_ref = 1; break;
        case 'S':
            if (!parse_number("verify", "slack", optarg, 1, &o->slack)) return EXIT_USAGE;
            break;
        case 'f': a->failures_only = 1; break;
        case 'G': a->no_golden = 1; break;
        case 'T': a->no_selftest = 1; break;
        case 'R': a->no_reach = 1; break;
        case 'h': printf("%s%s", usage, obj_usage); return 0;
        default:
            if (common_opt_code(c)) {
                if (!common_opt(&co, c, optarg)) return EXIT_USAGE;
                break;
            }
            if (c >= OBJ_OPT_OBJECTIVE && c <= OBJ_OPT_REF_MODEL) {
                if (!obj_args_option(&oa, "verify", c, optarg)) return EXIT_USAGE;
                break;
            }
            fputs(usage, stderr);
            return EXIT_USAGE;
        }
    }
    if (!obj_args_finish(&oa, "verify")) return EXIT_USAGE;
    o->objective = oa.obj, o->scale_rewards = oa.scale_rewards, o->ref_model = oa.ref_model;
    if (optind < argc || !o->model != !o->batch) {
        fprintf(stderr, "streambp verify: give both --model and --batch, or neither\n%s", usage);
        return EXIT_USAGE;
    }
    return -1;
}

/* The report as one JSON document; with golden, the golden step runs quietly and reports as its
 * "golden" field (a failure counts in rep->failed). */
static void print_report_json(sbp_verify_report *rep, const sbp_verify_opts *o, const char *model,
                              int golden, const char *const *gdev, int n_gdev, int reach,
                              int selftest) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", model);
    cJSON_AddStringToObject(j, "model_type", rep->model_type);
    cJSON_AddStringToObject(j, "batch", o->batch);
    cJSON_AddNumberToObject(j, "B", rep->B);
    cJSON_AddNumberToObject(j, "T", rep->T);
    cJSON_AddNumberToObject(j, "block", rep->block);
    cJSON_AddItemToObject(j, "chunks", cJSON_CreateIntArray(rep->chunks, rep->n_chunks));
    cJSON_AddStringToObject(j, "truth", rep->truth);
    cJSON_AddNumberToObject(j, "truth_loss", rep->truth_loss);
    cJSON_AddNumberToObject(j, "runs", rep->n_runs);
    cJSON_AddNumberToObject(j, "max_loss_rel_dev_fp64", rep->max_loss_dev64);
    cJSON_AddNumberToObject(j, "max_loss_rel_dev_fp32", rep->max_loss_dev32);
    if (rep->budget32) cJSON_AddStringToObject(j, "fp32_budget_from", rep->budget32);
    cJSON_AddItemToObject(j, "micro_batch_T", cJSON_CreateIntArray(rep->micro_T, rep->n_micro));
    if (rep->load_notes[0]) cJSON_AddStringToObject(j, "loading_notes", rep->load_notes);
    cJSON *gs = cJSON_AddArrayToObject(j, "groups");
    for (int gi = 0; gi < SBP_VG_N; gi++) cJSON_AddItemToArray(gs, group_json(&rep->g[gi]));
    if (golden) { /* quietly: the document is the whole output */
        int g = golden_check(NULL, gdev, n_gdev, 0, NULL);
        cJSON_AddStringToObject(j, "golden",
                                g == 0               ? "pass"
                                : g == EXIT_MISMATCH ? "fail"
                                                     : "error");
        rep->failed += g != 0;
    }
    if (reach) { /* as its "reach" object: the cases and their verdicts */
        cJSON *r = cJSON_CreateObject();
        int g = cases_check(NULL, r, 1, -1);
        if (g == EXIT_USAGE) cJSON_AddStringToObject(r, "error", "could not run");
        cJSON_AddItemToObject(j, "reach", r);
        rep->failed += g != 0;
    }
    if (selftest) { /* as its "self_test" object: the faults and whether each was flagged */
        cJSON *s = cJSON_CreateObject();
        int g = selftest_check(NULL, s);
        if (g == EXIT_USAGE) cJSON_AddStringToObject(s, "error", "could not run");
        cJSON_AddItemToObject(j, "self_test", s);
        rep->failed += g != 0;
    }
    cJSON_AddBoolToObject(j, "pass", rep->failed == 0);
    print_json(j);
}

/* The report as text: the setting, each group's table, the summary and the verdict. */
static void print_report_text(const sbp_verify_report *rep, const sbp_verify_opts *o,
                              const char *model, double secs, int failures_only) {
    printf("streambp verify: %s (%s), batch %s (B=%d, T=%d), block %d\n", model, rep->model_type,
           o->batch, rep->B, rep->T, rep->block);
    printf("chunks:");
    for (int i = 0; i < rep->n_chunks; i++) printf(" %d", rep->chunks[i]);
    printf("; truth: %s, loss %.17g; %d runs in %.1f s\n", rep->truth, rep->truth_loss, rep->n_runs,
           secs);
    if (rep->budget32) printf("fp32 budget from %s\n", rep->budget32);
    if (rep->n_micro) {
        printf("micro-batches: %d, T", rep->n_micro);
        for (int k = 0; k < rep->n_micro; k++) printf("%s%d", k ? "/" : " ", rep->micro_T[k]);
        printf("\n");
    }
    for (int gi = 0; gi < SBP_VG_N; gi++) print_group(&rep->g[gi], failures_only);
    if (rep->load_notes[0])
        printf("\nthe library and the oracle read the inputs differently: %s\n", rep->load_notes);
    printf("\nsummary:");
    for (int gi = 0; gi < SBP_VG_N; gi++)
        printf(" %s %d/%d%s", rep->g[gi].title, rep->g[gi].n_rows - rep->g[gi].failed,
               rep->g[gi].n_rows, gi + 1 < SBP_VG_N ? "," : "");
    printf(" tensors ok\nloss: worst relative deviation from the truth: fp64 %.2g, fp32 "
           "%.2g\n%s\n",
           rep->max_loss_dev64, rep->max_loss_dev32, rep->failed ? "FAIL" : "PASS");
}

int verify_run(int argc, char **argv) {
    run_args a;
    int rc = parse_args(&a, argc, argv);
    if (rc >= 0) return rc;
    sbp_verify_opts o = a.o;
    const int json = a.json;
    const int golden = !o.model && !a.no_golden;
    const int selftest = !o.model && !a.no_selftest;
    const int reach = !o.model && !a.no_reach;
    const int optim =
        !o.model; /* the default run: the training arithmetic too (cmd_verify_optim.c) */
    sbp_err err = {0};
    sbp_default_inputs def = {0};
    if (!o.model) {
        if (sbp_default_inputs_make(&def, &err)) return report_error("verify", &err);
        o.model = def.model, o.batch = def.batch;
    }
    /* the full check on the bundled default also proves the portable contract on this machine
     * and on the devices named: the committed golden cases, recomputed (cmd_verify_golden.c) */
    const char *gdev[3] = {"cpu"};
    int n_gdev = 1;
    for (int d = SBP_DEVICE_CUDA; d <= SBP_DEVICE_CUDA_EMU; d++)
        if (o.devices & (1 << d)) gdev[n_gdev++] = sbp_device_name((sbp_device)d);
    sbp_verify_report rep;
    double t0 = sbp_now_seconds();
    sbp_status st = sbp_verify_run(&rep, &o, &err);
    double secs = sbp_now_seconds() - t0;
    const char *model = def.dir[0] ? "bundled Qwen3-tiny, seed 1" : o.model;
    sbp_default_inputs_free(&def);
    if (st) return report_error("verify", &err);
    if (json)
        print_report_json(&rep, &o, model, golden, gdev, n_gdev, reach, selftest);
    else
        print_report_text(&rep, &o, model, secs, a.failures_only);
    int failed = rep.failed;
    sbp_verify_report_free(&rep);
    if (golden && !json) {
        printf("\ngolden digests: the committed portable cases recomputed here\n");
        int g = golden_check(stdout, gdev, n_gdev, 0, NULL);
        if (g == EXIT_USAGE) return g;
        failed |= g != 0;
        printf("%s\n", failed ? "FAIL" : "PASS");
    }
    if (reach && !json) {
        printf("\nreach: the paths the bundled model does not take, each against the oracle\n");
        int g = cases_check(stdout, NULL, 1, -1);
        if (g == EXIT_USAGE) return g;
        failed |= g != 0;
    }
    if (optim && !json) {
        printf("\noptim: optimizer steps against the float64 oracle (ref/adamw.c)\n");
        int g = optim_check(stdout);
        if (g == EXIT_USAGE) return g;
        failed |= g != 0;
        printf("%s\n", failed ? "FAIL" : "PASS");
    }
    if (selftest && !json) {
        printf("\nself-test: faults planted into the verifier's inputs, each to be flagged\n");
        int g = selftest_check(stdout, NULL);
        if (g == EXIT_USAGE) return g;
        failed |= g != 0;
        printf("%s\n", failed ? "FAIL" : "PASS");
    }
    return failed ? EXIT_MISMATCH : 0;
}
