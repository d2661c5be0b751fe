/* plan.c — `streambp plan`: the peak memory of a step at any size, and the largest sequence
 * that fits a budget, by walking the real schedule code with allocation only (sbp_plan). */
#include "cli.h"
#include "plan.h"
#include "../../verify/defaults.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: streambp plan (--config FILE | --model DIR) (--seq T | --budget SIZE) [options]\n"
    "       streambp plan --paper [--budget SIZE]\n"
    "\n"
    "Walks the schedules' own code with a planning ledger: every buffer is charged as the real "
    "run\n"
    "would allocate it, nothing is computed and no memory is taken, so any model and T plan in\n"
    "milliseconds. --seq T prints the peak by category for each schedule; --budget finds the\n"
    "largest T of each schedule by bisection. --paper reproduces the StreamBP paper's setting\n"
    "(Qwen3-4B/8B/14B, full gradients, bf16 storage, optimizer excluded, 80 GiB) next to its\n"
    "figures.\n"
    "\n"
    "  --config FILE      a HF config.json (data/configs/ has Qwen3 0.6B-14B, Llama-3.x)\n"
    "  --model DIR        a model directory (its config.json)\n"
    "  --seq T            tokens per sequence\n"
    "  --budget SIZE      e.g. 80G, 4G, 512M (binary units: G = 2^30)\n"
    "  --batch-size B     sequences per step (default 1)\n"
    "  --schedules LIST   of full, ckpt, ckpt-chunked, stream (default all four); ckpt keeps\n"
    "                     B*T*V logits as the HF baseline does, ckpt-chunked does not\n"
    "  --storage S        bf16 | fp32: bytes per stored element (default fp32)\n"
    "  --optimizer        also count AdamW's two fp32 moments per parameter\n"
    "  --block N          token block (default 256)\n"
    "  --chunk N          stream chunk (default 1024)\n"
    "  --logit-chunk N    rows per logits pass (default 256)\n"
    "  --json             JSON instead of the table\n"
    "  --csv              CSV rows (schedule, T, bytes per category at the peak, total)\n";

typedef plan_schedule sched_row;

const plan_schedule plan_schedules[PLAN_N_SCHEDULES] = {{"full", SBP_FULL, 0},
                                                        {"ckpt", SBP_CKPT, 0},
                                                        {"ckpt-chunked", SBP_CKPT, 1},
                                                        {"stream", SBP_STREAM, 0}};
#define all_rows plan_schedules

int plan_parse_schedules(const char *cmd, const char *list, int use[PLAN_N_SCHEDULES]) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    memset(use, 0, sizeof(int) * PLAN_N_SCHEDULES);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int k = 0; k < PLAN_N_SCHEDULES; k++)
            if (strcmp(tok, plan_schedules[k].name) == 0) use[k] = found = 1;
        if (!found) {
            fprintf(stderr,
                    "streambp %s: unknown schedule \"%s\" (full, ckpt, ckpt-chunked, "
                    "stream)\n",
                    cmd, tok);
            return 0;
        }
    }
    return 1;
}

typedef struct {
    sbp_config cfg;
    const char *name;
    int B, storage, optimizer, block, chunk, logit_chunk;
} plan_setup;

static sbp_status plan_at(sbp_ledger *lg, const sbp_config *cfg, int B, int storage, int optimizer,
                          const sbp_grad_opts *g, int T, sbp_err *err) {
    sbp_plan_opts o = {
        .grad = *g, .B = B, .T = T, .storage_bytes = storage, .optimizer = optimizer};
    return sbp_plan(lg, cfg, &o, err);
}

int plan_largest_T(const sbp_config *cfg, int B, int storage, int optimizer, const sbp_grad_opts *g,
                   int64_t budget, sbp_ledger *at) {
    sbp_ledger lg;
    sbp_err err;
    int lo = 0, hi = 1;
    while (hi <= (1 << 26) && plan_at(&lg, cfg, B, storage, optimizer, g, hi, &err) == SBP_OK &&
           lg.peak_total <= budget)
        lo = hi, hi *= 2;
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (plan_at(&lg, cfg, B, storage, optimizer, g, mid, &err) == SBP_OK &&
            lg.peak_total <= budget)
            lo = mid;
        else
            hi = mid;
    }
    if (lo)
        plan_at(at, cfg, B, storage, optimizer, g, lo, &err);
    else
        memset(at, 0, sizeof *at);
    return lo;
}

static sbp_grad_opts grad_opts(const plan_setup *s, const sched_row *r) {
    return (sbp_grad_opts){.schedule = r->schedule,
                           .block = s->block,
                           .chunk = s->chunk,
                           .logit_chunk = s->logit_chunk,
                           .chunked_logits = r->chunked_logits};
}

static int largest_T(const plan_setup *s, const sched_row *r, int64_t budget, sbp_ledger *at) {
    sbp_grad_opts g = grad_opts(s, r);
    return plan_largest_T(&s->cfg, s->B, s->storage, s->optimizer, &g, budget, at);
}

int plan_parse_size(const char *cmd, const char *text, int64_t *out) {
    char *end;
    double v = strtod(text, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1048576.0, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1073741824.0, end++;
    else if (*end == 'T' || *end == 't')
        mul = 1099511627776.0, end++;
    if (*end == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B')
        end++;
    if (end == text || *end || !(v > 0) || !isfinite(v)) {
        fprintf(stderr, "streambp %s: a size such as 80G or 512M is needed, got \"%s\"\n", cmd,
                text);
        return 0;
    }
    if (v * mul >= 0x1p60 || v * mul < 1) { /* the conversion to int64 must not overflow */
        fprintf(stderr, "streambp %s: the size \"%s\" is outside [1 byte, 1 EiB)\n", cmd, text);
        return 0;
    }
    *out = (int64_t)(v * mul);
    return 1;
}

static double gib(int64_t b) {
    return (double)b / 1073741824.0;
}

static void print_categories(const sbp_ledger *lg) {
    for (int c = 0; c < SBP_MEM_NCATS; c++) printf(" %9.2f", gib(lg->at_peak[c]));
    printf(" %9.2f\n", gib(lg->peak_total));
}

static void header(const char *first) {
    printf("%-14s %10s", "schedule", first);
    for (int c = 0; c < SBP_MEM_NCATS; c++) printf(" %9.9s", sbp_mem_cat_name(c));
    printf(" %9s\n", "total");
}

static cJSON *ledger_cats(const sbp_ledger *lg) {
    cJSON *o = cJSON_CreateObject();
    for (int c = 0; c < SBP_MEM_NCATS; c++)
        cJSON_AddNumberToObject(o, sbp_mem_cat_name(c), (double)lg->at_peak[c]);
    cJSON_AddNumberToObject(o, "total", (double)lg->peak_total);
    return o;
}

/* The StreamBP paper's maximum sequence lengths (thousands of tokens), notes/paper.md §5 and
 * §9: its peak-memory figure (Qwen3-8B and 14B, pure bf16, 80 GB) and Table 3 (SFT, full
 * gradients). */
typedef struct {
    const char *config, *label;
    double figure[3]; /* no ckpt, ckpt, StreamBP; 0: not reported */
    double table3[3];
} paper_row;

static const paper_row paper[] = {
    {"qwen3-4b", "Qwen3-4B", {0, 0, 0}, {7.0, 28.5, 200.0}},
    {"qwen3-8b", "Qwen3-8B", {4.7, 20.0, 110.0}, {3.4, 15.7, 72.0}},
    {"qwen3-14b", "Qwen3-14B", {1.7, 9.0, 40.0}, {0, 0, 0}},
};

static int run_paper(int64_t budget, const char *data, int json) {
    cJSON *arr = cJSON_CreateArray();
    if (!json) {
        printf("The StreamBP paper's setting: B = 1, full gradients, bf16 storage, optimizer "
               "excluded, budget %.1f GiB.\nLargest T (thousands of tokens) planned for streambp's "
               "own schedules, beside the paper's figures for its PyTorch ones.\n\n",
               gib(budget));
        printf("%-10s %9s %9s %9s %9s | %-24s %-24s | %s\n", "model", "full", "ckpt", "ckpt-chnk",
               "stream", "paper figure: no/ckpt/SBP", "paper Table 3: no/ckpt/SBP",
               "stream/ckpt ours, paper");
    }
    for (size_t i = 0; i < sizeof paper / sizeof paper[0]; i++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/configs/%s.json", data, paper[i].config);
        plan_setup s = {.B = 1, .storage = 2, .block = 256, .chunk = 1024, .logit_chunk = 256};
        sbp_err err = {0};
        if (sbp_config_load(&s.cfg, path, &err)) return report_error("plan", &err);
        int T[4];
        sbp_ledger lg;
        for (int k = 0; k < 4; k++) T[k] = largest_T(&s, &all_rows[k], budget, &lg);
        const paper_row *p = &paper[i];
        double pr = p->figure[1] ? p->figure[2] / p->figure[1] : p->table3[2] / p->table3[1];
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "model", p->label);
            for (int k = 0; k < 4; k++) cJSON_AddNumberToObject(o, all_rows[k].name, T[k]);
            cJSON_AddItemToObject(o, "paper_figure_k", cJSON_CreateDoubleArray(p->figure, 3));
            cJSON_AddItemToObject(o, "paper_table3_k", cJSON_CreateDoubleArray(p->table3, 3));
            cJSON_AddItemToArray(arr, o);
            continue;
        }
        char fig[32] = "-", tab[32] = "-";
        if (p->figure[0])
            snprintf(fig, sizeof fig, "%.1f / %.1f / %.1f", p->figure[0], p->figure[1],
                     p->figure[2]);
        if (p->table3[0])
            snprintf(tab, sizeof tab, "%.1f / %.1f / %.1f", p->table3[0], p->table3[1],
                     p->table3[2]);
        printf("%-10s %9.1f %9.1f %9.1f %9.1f | %-24s %-24s | %.1fx, %.1fx\n", p->label, T[0] / 1e3,
               T[1] / 1e3, T[2] / 1e3, T[3] / 1e3, fig, tab, (double)T[3] / T[1], pr);
    }
    if (json)
        print_json(arr);
    else
        cJSON_Delete(arr);
    return 0;
}

int cmd_plan(int argc, char **argv) {
    static const struct option opts[] = {{"config", required_argument, 0, 'c'},
                                         {"model", required_argument, 0, 'm'},
                                         {"seq", required_argument, 0, 'T'},
                                         {"budget", required_argument, 0, 'b'},
                                         {"batch-size", required_argument, 0, 'B'},
                                         {"schedules", required_argument, 0, 's'},
                                         {"storage", required_argument, 0, 'S'},
                                         {"optimizer", no_argument, 0, 'o'},
                                         {"block", required_argument, 0, 'k'},
                                         {"chunk", required_argument, 0, 'C'},
                                         {"logit-chunk", required_argument, 0, 'l'},
                                         {"paper", no_argument, 0, 'p'},
                                         {"json", no_argument, 0, 'j'},
                                         {"csv", no_argument, 0, 'v'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    plan_setup s = {.B = 1, .storage = 4, .block = 256, .chunk = 1024, .logit_chunk = 256};
    const char *config = NULL, *model = NULL, *sched = NULL;
    int T = 0, json = 0, csv = 0, paper_mode = 0, c;
    int64_t budget = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config = optarg; break;
        case 'm': model = optarg; break;
        case 'T':
            if (!parse_pos_int("plan", "seq", optarg, &T)) return EXIT_USAGE;
            break;
        case 'b':
            if (!plan_parse_size("plan", optarg, &budget)) return EXIT_USAGE;
            break;
        case 'B':
            if (!parse_pos_int("plan", "batch-size", optarg, &s.B)) return EXIT_USAGE;
            break;
        case 's': sched = optarg; break;
        case 'S':
            if (strcmp(optarg, "bf16") == 0)
                s.storage = 2;
            else if (strcmp(optarg, "fp32") == 0)
                s.storage = 4;
            else {
                fprintf(stderr, "streambp plan: --storage must be bf16 or fp32\n");
                return EXIT_USAGE;
            }
            break;
        case 'o': s.optimizer = 1; break;
        case 'k':
            if (!parse_pos_int("plan", "block", optarg, &s.block)) return EXIT_USAGE;
            break;
        case 'C':
            if (!parse_pos_int("plan", "chunk", optarg, &s.chunk)) return EXIT_USAGE;
            break;
        case 'l':
            if (!parse_pos_int("plan", "logit-chunk", optarg, &s.logit_chunk)) return EXIT_USAGE;
            break;
        case 'p': paper_mode = 1; break;
        case 'j': json = 1; break;
        case 'v': csv = 1; break;
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return EXIT_USAGE;
        }
    }
    sbp_err err = {0};
    char data[512];
    if (paper_mode) {
        if (optind < argc || config || model || T) {
            fprintf(stderr, "streambp plan: --paper takes only --budget and --json\n");
            return EXIT_USAGE;
        }
        if (sbp_data_dir(data, sizeof data, &err)) return report_error("plan", &err);
        return run_paper(budget ? budget : 80LL << 30, data, json);
    }
    if (optind < argc || !config == !model || !T == !budget) {
        fprintf(stderr, "streambp plan: give --config or --model, and --seq or --budget\n%s",
                usage);
        return EXIT_USAGE;
    }
    char path[4200];
    if (model)
        snprintf(path, sizeof path, "%s/config.json", model);
    else
        snprintf(path, sizeof path, "%s", config);
    if (sbp_config_load(&s.cfg, path, &err)) return report_error("plan", &err);
    int use[PLAN_N_SCHEDULES] = {1, 1, 1, 1};
    if (sched && !plan_parse_schedules("plan", sched, use)) return EXIT_USAGE;
    sbp_params ps;
    if (sbp_params_build(&ps, &s.cfg, &err)) return report_error("plan", &err);
    int64_t nparam = ps.total;
    sbp_params_free(&ps);
    cJSON *jrows = cJSON_CreateArray();
    if (csv) {
        printf("schedule,T");
        for (int k = 0; k < SBP_MEM_NCATS; k++) printf(",%s", sbp_mem_cat_name(k));
        printf(",total\n");
    } else if (!json) {
        printf("%s: %s, %.3fB parameters, B = %d, storage %s, optimizer %s", path, s.cfg.model_type,
               nparam / 1e9, s.B, s.storage == 2 ? "bf16" : "fp32",
               s.optimizer ? "included" : "excluded");
        if (budget)
            printf(", budget %.2f GiB", gib(budget));
        else
            printf(", T = %d", T);
        printf("\nblock %d, stream chunk %d, logit chunk %d; GiB at the moment of the peak:\n",
               s.block, s.chunk, s.logit_chunk);
        header(budget ? "largest T" : "T");
    }
    for (int k = 0; k < 4; k++) {
        if (!use[k]) continue;
        sbp_ledger lg;
        int t = T;
        sbp_grad_opts g = grad_opts(&s, &all_rows[k]);
        if (budget)
            t = largest_T(&s, &all_rows[k], budget, &lg);
        else if (plan_at(&lg, &s.cfg, s.B, s.storage, s.optimizer, &g, T, &err)) {
            cJSON_Delete(jrows);
            return report_error("plan", &err);
        }
        if (csv) {
            printf("%s,%d", all_rows[k].name, t);
            for (int q = 0; q < SBP_MEM_NCATS; q++) printf(",%lld", (long long)lg.at_peak[q]);
            printf(",%lld\n", (long long)lg.peak_total);
        } else if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "schedule", all_rows[k].name);
            cJSON_AddNumberToObject(o, "T", t);
            cJSON_AddItemToObject(o, "bytes_at_peak", ledger_cats(&lg));
            cJSON_AddItemToArray(jrows, o);
        } else {
            printf("%-14s %10d", all_rows[k].name, t);
            print_categories(&lg);
        }
    }
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "config", path);
        cJSON_AddNumberToObject(o, "parameters", (double)nparam);
        cJSON_AddNumberToObject(o, "B", s.B);
        cJSON_AddNumberToObject(o, "storage_bytes", s.storage);
        cJSON_AddBoolToObject(o, "optimizer", s.optimizer);
        if (budget) cJSON_AddNumberToObject(o, "budget_bytes", (double)budget);
        cJSON_AddItemToObject(o, "schedules", jrows);
        print_json(o);
    } else {
        cJSON_Delete(jrows);
    }
    return 0;
}
