/* cmd_plan.c — `streambp plan`: the peak memory of a step at any size, and the largest sequence
 * that fits a budget, by walking the real schedule code with allocation only (sbp_plan); and
 * the StreamBP paper's Table 3 computed that way, beside the paper's numbers. */
#include "../core/err.h"
#include "../api/seqpar.h"
#include "../dist/dist.h"
#include "cli.h"
#include "objopts.h"
#include "options.h"
#include "cmd_plan.h"
#include "verify/defaults.h"

#include <getopt.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: streambp plan (--config FILE | --model DIR) (--seq T | --budget SIZE) [options]\n"
    "       streambp plan --paper [--family qwen3|gemma3] [--budget SIZE] [--json]\n"
    "\n"
    "Walks the schedules' own code with a planning ledger: every buffer is charged as the real "
    "run\n"
    "would allocate it, nothing is computed and no memory is taken, so any model and T plan in\n"
    "milliseconds. --seq T prints the peak by category for each schedule; --budget finds the\n"
    "largest T of each schedule by bisection. --paper computes the StreamBP paper's Table 3\n"
    "(Qwen3-4B/8B/14B/32B, full gradients and LoRA, SFT, DPO and GRPO, bf16 storage, optimizer\n"
    "excluded, 80 GiB) beside the paper's numbers; with --family gemma3, the same table for\n"
    "Gemma-3 1B and 4B (every schedule; the paper has no Gemma-3 numbers).\n"
    "\n"
    "  --config FILE      a HF config.json (data/configs/ has Qwen3 0.6B-32B, Llama-3.x)\n"
    "  --model DIR        a model directory (its config.json)\n"
    "  --seq T            tokens per sequence\n"
    "  --budget SIZE      e.g. 80G, 4G, 512M (binary units: G = 2^30)\n"
    "  --objective O      sft | dpo | grpo (default sft): the batch's shape and the objective's\n"
    "                     own buffers (DPO: a first pass over the head and its log-probs)\n"
    "  --batch-size B     sft: sequences; dpo: pairs (2B sequences, chosen and rejected, with\n"
    "                     their reference statistics); grpo: the group of G sequences, with\n"
    "                     advantages and per-token old and reference log-probs (default 1)\n"
    "  --lora-r N         train a LoRA adapter of rank N: the base frozen (weights only, no\n"
    "                     gradients), the adapter's weights and gradients\n"
    "  --lora-targets L   its modules: q_proj,...,down_proj or all-linear (default all-linear)\n"
    "  --schedules LIST   of full, ckpt, ckpt-chunked, stream (default all four); ckpt keeps\n"
    "                     B*T*V logits as the HF baseline does, ckpt-chunked does not\n"
    "  --storage S        bf16 | fp32: bytes per stored element (default fp32)\n"
    "  --optimizer        also count AdamW's two fp32 moments per trained parameter\n"
    "  --grad-accum N     N micro-batches a step: the fold's bucket scratch (N > 1) and N batches\n"
    "  --grads-out        the gradient written to its file as the backward completes each layer's\n"
    "                     (grad --out does so with one --batch in one process): not held whole,\n"
    "                     the largest layer's (and a tied embedding's) scratch instead\n"
    "  --ranks N          one of N processes (mpirun) running the step, the one holding the most:\n"
    "                     its share of the gradient (and of the moments), the ring of two buckets\n"
    "                     and the column of its blocks of one (docs/distributed.md)\n"
    "  --seq-ranks S      one of S processes sharing every sequence (grad --seq-ranks: sequence\n"
    "                     parallel, docs/distributed.md §8), the one holding the most: its rows'\n"
    "                     layer inputs and working set, its share and columns; with --ranks N\n"
    "                     (S divides N) one of N / S such groups\n"
    "  --seq-overlap      with --seq-ranks: as grad's (the operands of a layer's weight products\n"
    "                     kept on every rank after the first; with one sequence the head's\n"
    "                     round and a top layer's K/V too)\n"
    "  --bandwidth B      with --ranks or --seq-ranks, and --flops: the exposed communication\n"
    "                     time a step for a link of B bytes/s (10G; 100Gbit: bits/s), --latency\n"
    "                     S seconds a message (default 0), --flops G GFLOP/s a process\n"
    "                     (docs/distributed.md; --seq-ranks: a bound, §8)\n"
    "  --block N          token block (default 512)\n"
    "  --chunk N          stream chunk (default 2 blocks)\n"
    "  --logit-chunk N    rows per logits pass (default one block)\n"
    "  --json             JSON instead of the table\n"
    "  --csv              CSV rows (schedule, T, bytes per category at the peak, total)\n"
    "  --family F         with --paper: qwen3 (the paper's table, the default) or gemma3\n";

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

/* What a plan is asked about, but for the schedule and T. */
typedef struct {
    sbp_config cfg;
    int B, storage, optimizer, block, chunk, logit_chunk;
    int micro_batches, ranks; /* --grad-accum, --ranks (docs/distributed.md) */
    int seq_ranks;            /* --seq-ranks (docs/distributed.md §8) */
    int seq_overlap;          /* --seq-overlap */
    int grads_out;            /* --grads-out: the gradient to its file piece by piece */
    sbp_objective obj;
    sbp_lora_config lora; /* r 0: full gradients */
} plan_setup;

static sbp_plan_opts plan_opts(const plan_setup *s, const sched_row *r) {
    sbp_plan_opts o = {.grad = {.schedule = r->schedule,
                                .block = s->block,
                                .chunk = s->chunk,
                                .logit_chunk = s->logit_chunk,
                                .chunked_logits = r->chunked_logits,
                                .seq_overlap = s->seq_overlap,
                                .objective = s->obj,
                                /* planned as its being set: the writer of grad --out */
                                .grad_sink = s->grads_out ? sbp_grads_out_put : NULL},
                       .B = s->B,
                       .storage_bytes = s->storage,
                       .optimizer = s->optimizer,
                       .micro_batches = s->micro_batches,
                       .ranks = s->ranks,
                       .seq_ranks = s->seq_ranks,
                       .lora = s->lora};
    return o;
}

static int largest_T(const plan_setup *s, const sched_row *r, int64_t budget, sbp_ledger *at) {
    sbp_plan_opts o = plan_opts(s, r);
    return sbp_plan_largest_T(&s->cfg, &o, budget, at);
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

/* ---- the paper's Table 3 ------------------------------------------------------------------- */

/* The StreamBP paper's Table 3 (arXiv 2506.03077; docs/memory.md#the-papers-table-3): the maximum
 * sequence length in thousands of tokens on one 80 GB A800, of Qwen3 models trained with full
 * gradients or LoRA (r 32, alpha 128, all-linear), by objective and method; 0 where the paper has
 * no entry. */
enum { N_COLS = 6, N_OBJ = 3, N_METHODS = 3 };

static const struct {
    const char *config, *label;
    int lora;
} columns[N_COLS] = {{"qwen3-4b", "4B Full", 0},   {"qwen3-4b", "4B LoRA", 1},
                     {"qwen3-8b", "8B Full", 0},   {"qwen3-8b", "8B LoRA", 1},
                     {"qwen3-14b", "14B LoRA", 1}, {"qwen3-32b", "32B LoRA", 1}};

static const sbp_objective_kind table_objectives[N_OBJ] = {SBP_OBJ_SFT, SBP_OBJ_DPO, SBP_OBJ_GRPO};
/* the paper's base without checkpointing, base with HF checkpointing, StreamBP; and ours */
static const char *const method_names[N_METHODS] = {"no ckpt", "ckpt", "StreamBP"};
static const int method_schedule[N_METHODS] = {0, 1, 3}; /* full, ckpt (B·T·V logits), stream */

static const double table3[N_OBJ][N_METHODS][N_COLS] = {
    {{7.0, 7.1, 3.4, 5.1, 2.9, 0.4},
     {28.5, 36.5, 15.7, 30.6, 23.0, 5.9},
     {200.0, 247.0, 72.0, 142.4, 84.6, 16.3}},
    {{3.1, 3.5, 0, 2.5, 1.4, 0.2},
     {18.7, 32.2, 0, 25.5, 18.5, 4.4},
     {57.2, 100.2, 0, 60.9, 36.9, 7.8}},
    {{0.9, 1.0, 0, 0.7, 0.4, 0}, {8.5, 12.1, 0, 9.5, 6.9, 0}, {18.2, 27.5, 0, 16.5, 10.1, 0}},
};

/* The paper's peak-memory figure (SFT, 80 GB): Qwen3-8B and 14B with full gradients, 32B with
 * LoRA; thousands of tokens for no ckpt, ckpt, StreamBP. */
static const struct {
    const char *config, *label;
    int lora;
    double k[3];
} figure[] = {{"qwen3-8b", "8B Full", 0, {4.7, 20.0, 110.0}},
              {"qwen3-14b", "14B Full", 0, {1.7, 9.0, 40.0}},
              {"qwen3-32b", "32B LoRA", 1, {0.44, 5.7, 16.0}}};

/* The authors' scripts' setting: B = 1 for SFT, one pair for DPO, a group of 8 for GRPO; pure
 * bf16 (weights and gradients); the optimizer never allocated (they stop before its first
 * step); LoRA r 32, alpha 128 on every linear layer. */
static plan_setup paper_setup(const sbp_config *cfg, sbp_objective_kind kind, int lora) {
    obj_args oa;
    obj_args_init(&oa);
    oa.obj.kind = kind;
    obj_args_finish(&oa, "plan");
    plan_setup s = {.cfg = *cfg,
                    .B = kind == SBP_OBJ_GRPO ? 8 : 1,
                    .storage = 2,
                    .block = 256,
                    .chunk = 1024,
                    .logit_chunk = 256,
                    .obj = oa.obj};
    if (lora) s.lora = (sbp_lora_config){.r = 32, .alpha = 128, .targets = SBP_LORA_ALL};
    return s;
}

static void cell(char *buf, size_t n, int T, double paper) {
    char theirs[16] = "-";
    if (paper) snprintf(theirs, sizeof theirs, "%.1f", paper);
    snprintf(buf, n, "%.1f (%s)", T / 1e3, theirs);
}

static int run_paper(int64_t budget, const char *data, int json) {
    sbp_config cfgs[N_COLS];
    sbp_err err = {0};
    for (int c = 0; c < N_COLS; c++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/configs/%s.json", data, columns[c].config);
        if (sbp_config_load(&cfgs[c], path, &err)) return report_error("plan", &err);
    }
    int T[N_OBJ][N_METHODS][N_COLS];
    cJSON *jt = cJSON_CreateArray();
    for (int ob = 0; ob < N_OBJ; ob++)
        for (int c = 0; c < N_COLS; c++) {
            plan_setup s = paper_setup(&cfgs[c], table_objectives[ob], columns[c].lora);
            for (int mt = 0; mt < N_METHODS; mt++) {
                sbp_ledger lg;
                T[ob][mt][c] = largest_T(&s, &all_rows[method_schedule[mt]], budget, &lg);
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "objective", obj_kind_name(table_objectives[ob]));
                cJSON_AddStringToObject(o, "method", method_names[mt]);
                cJSON_AddStringToObject(o, "schedule", all_rows[method_schedule[mt]].name);
                cJSON_AddStringToObject(o, "column", columns[c].label);
                cJSON_AddNumberToObject(o, "T", T[ob][mt][c]);
                if (table3[ob][mt][c])
                    cJSON_AddNumberToObject(o, "paper_k", table3[ob][mt][c]);
                else
                    cJSON_AddNullToObject(o, "paper_k");
                cJSON_AddItemToObject(o, "bytes_at_peak", ledger_cats(&lg));
                cJSON_AddItemToArray(jt, o);
            }
        }
    /* the figure's rows: SFT, 8B and 14B full, 32B LoRA */
    enum { N_FIG = sizeof figure / sizeof figure[0] };
    int F[N_FIG][N_METHODS];
    cJSON *jf = cJSON_CreateArray();
    for (int i = 0; i < N_FIG; i++) {
        sbp_config cfg;
        char path[1100];
        snprintf(path, sizeof path, "%s/configs/%s.json", data, figure[i].config);
        if (sbp_config_load(&cfg, path, &err)) {
            cJSON_Delete(jt), cJSON_Delete(jf);
            return report_error("plan", &err);
        }
        plan_setup s = paper_setup(&cfg, SBP_OBJ_SFT, figure[i].lora);
        for (int mt = 0; mt < N_METHODS; mt++) {
            sbp_ledger lg;
            F[i][mt] = largest_T(&s, &all_rows[method_schedule[mt]], budget, &lg);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "model", figure[i].label);
            cJSON_AddStringToObject(o, "method", method_names[mt]);
            cJSON_AddNumberToObject(o, "T", F[i][mt]);
            cJSON_AddNumberToObject(o, "paper_k", figure[i].k[mt]);
            cJSON_AddItemToArray(jf, o);
        }
    }
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "budget_bytes", (double)budget);
        cJSON_AddStringToObject(o, "setting",
                                "bf16 storage, optimizer excluded; SFT B = 1, DPO one pair, GRPO a "
                                "group of 8; LoRA r 32, alpha 128, all-linear");
        cJSON_AddItemToObject(o, "table3", jt);
        cJSON_AddItemToObject(o, "figure", jf);
        print_json(o);
        return 0;
    }
    cJSON_Delete(jt), cJSON_Delete(jf);
    printf("The StreamBP paper's Table 3: the largest sequence (thousands of tokens) under %.1f "
           "GiB.\n"
           "Ours: streambp's own schedules, planned (full for \"no ckpt\", ckpt with B*T*V logits, "
           "stream),\nin the authors' setting: bf16 weights and gradients, optimizer excluded; "
           "SFT one sequence,\nDPO one pair (chosen + rejected), GRPO a group of 8; LoRA r 32, "
           "alpha 128, all-linear.\nEach cell: ours (paper's); '-': no entry in the paper.\n\n",
           gib(budget));
    printf("%-4s %-9s", "", "method");
    for (int c = 0; c < N_COLS; c++) printf(" %15s", columns[c].label);
    printf("\n");
    for (int ob = 0; ob < N_OBJ; ob++) {
        for (int mt = 0; mt < N_METHODS; mt++) {
            printf("%-4s %-9s", mt ? "" : obj_kind_name(table_objectives[ob]), method_names[mt]);
            for (int c = 0; c < N_COLS; c++) {
                char b[40];
                cell(b, sizeof b, T[ob][mt][c], table3[ob][mt][c]);
                printf(" %15s", b);
            }
            printf("\n");
        }
        printf("%-4s %-9s", "", "SBP/ckpt");
        for (int c = 0; c < N_COLS; c++) {
            char b[40], theirs[16] = "-";
            if (table3[ob][1][c])
                snprintf(theirs, sizeof theirs, "%.1f", table3[ob][2][c] / table3[ob][1][c]);
            snprintf(b, sizeof b, "%.1fx (%s)", (double)T[ob][2][c] / T[ob][1][c], theirs);
            printf(" %15s", b);
        }
        printf("\n");
    }
    printf("\nThe paper's peak-memory figure (SFT), same setting: no ckpt / ckpt / StreamBP, ours "
           "(paper's)\n");
    for (int i = 0; i < N_FIG; i++) {
        printf("%-9s", figure[i].label);
        for (int mt = 0; mt < N_METHODS; mt++) {
            char b[40];
            cell(b, sizeof b, F[i][mt], figure[i].k[mt]);
            printf(" %15s", b);
        }
        printf("   StreamBP/ckpt %.1fx (%.1fx)\n", (double)F[i][2] / F[i][1],
               figure[i].k[2] / figure[i].k[1]);
    }
    return 0;
}

/* ---- the same table for Gemma-3 (--paper --family gemma3) ----------------------------------- */

/* Gemma-3 1B and 4B (the text model) in the paper's setting (paper_setup), every schedule: the
 * paper has no Gemma-3 column, so there is nothing to print beside ours (docs/gemma3.md). */
enum { N_GCOLS = 4 };

static const struct {
    const char *config, *label;
    int lora;
} gcolumns[N_GCOLS] = {{"gemma3-1b", "1B Full", 0},
                       {"gemma3-1b", "1B LoRA", 1},
                       {"gemma3-4b", "4B Full", 0},
                       {"gemma3-4b", "4B LoRA", 1}};

static int run_paper_gemma3(int64_t budget, const char *data, int json) {
    sbp_config cfgs[N_GCOLS];
    sbp_err err = {0};
    for (int c = 0; c < N_GCOLS; c++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/configs/%s.json", data, gcolumns[c].config);
        if (sbp_config_load(&cfgs[c], path, &err)) return report_error("plan", &err);
    }
    int T[N_OBJ][PLAN_N_SCHEDULES][N_GCOLS];
    cJSON *jt = cJSON_CreateArray();
    for (int ob = 0; ob < N_OBJ; ob++)
        for (int c = 0; c < N_GCOLS; c++) {
            plan_setup s = paper_setup(&cfgs[c], table_objectives[ob], gcolumns[c].lora);
            for (int k = 0; k < PLAN_N_SCHEDULES; k++) {
                sbp_ledger lg;
                T[ob][k][c] = largest_T(&s, &all_rows[k], budget, &lg);
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "objective", obj_kind_name(table_objectives[ob]));
                cJSON_AddStringToObject(o, "schedule", all_rows[k].name);
                cJSON_AddStringToObject(o, "column", gcolumns[c].label);
                cJSON_AddNumberToObject(o, "T", T[ob][k][c]);
                cJSON_AddItemToObject(o, "bytes_at_peak", ledger_cats(&lg));
                cJSON_AddItemToArray(jt, o);
            }
        }
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "budget_bytes", (double)budget);
        cJSON_AddStringToObject(o, "family", "gemma3");
        cJSON_AddStringToObject(o, "setting",
                                "bf16 storage, optimizer excluded; SFT B = 1, DPO one pair, GRPO a "
                                "group of 8; LoRA r 32, alpha 128, all-linear");
        cJSON_AddItemToObject(o, "table", jt);
        print_json(o);
        return 0;
    }
    cJSON_Delete(jt);
    printf(
        "Gemma-3 in the setting of the StreamBP paper's Table 3: the largest sequence (thousands "
        "of tokens)\nunder %.1f GiB, planned: bf16 weights and gradients, optimizer excluded; "
        "SFT one sequence,\nDPO one pair (chosen + rejected), GRPO a group of 8; LoRA r 32, "
        "alpha 128, all-linear;\nblock 256, stream chunk 1024. ckpt keeps B*T*V logits, "
        "ckpt-chunked does not.\n\n",
        gib(budget));
    printf("%-4s %-12s", "", "schedule");
    for (int c = 0; c < N_GCOLS; c++) printf(" %9s", gcolumns[c].label);
    printf("\n");
    for (int ob = 0; ob < N_OBJ; ob++) {
        for (int k = 0; k < PLAN_N_SCHEDULES; k++) {
            printf("%-4s %-12s", k ? "" : obj_kind_name(table_objectives[ob]), all_rows[k].name);
            for (int c = 0; c < N_GCOLS; c++) printf(" %9.1f", T[ob][k][c] / 1e3);
            printf("\n");
        }
        printf("%-4s %-12s", "", "stream/ckpt");
        for (int c = 0; c < N_GCOLS; c++)
            printf(" %8.1fx", T[ob][1][c] ? (double)T[ob][3][c] / T[ob][1][c] : 0.0);
        printf("\n");
    }
    return 0;
}

/* ---- the command ------------------------------------------------------------------------------
 */

enum { OPT_LORA_R = 3000, OPT_LORA_TARGETS, OPT_FAMILY, OPT_BANDWIDTH, OPT_LATENCY, OPT_FLOPS };

/* The command line of `plan`. */
typedef struct {
    plan_setup s;
    const char *config, *model, *sched, *targets, *family; /* family: --paper's table */
    int T, json, csv, paper_mode;
    int other; /* an option --paper does not take */
    int64_t budget;
    obj_args oa;
    int64_t net_bytes, net_messages; /* --ranks: the network model a step (sbp_dist_traffic);
                                      * --seq-ranks: sbp_plan_seq_traffic's, at one --seq */
    const char *seq_net_schedule;    /* --seq-ranks: the schedule it was planned for */
    sbp_net net; /* --bandwidth, --latency, --flops: the exposed time (sbp_dist_net) */
    sbp_net_time net_t;
    const char *net_schedule; /* the schedule whose backward it assumes */
} plan_args;

/* The options into a: -1 to go on, else the exit status (0 after --help). */
static int parse_args(plan_args *a, int argc, char **argv) {
    static const struct option opts[] = {{"config", required_argument, 0, 'c'},
                                         OPTION_MODEL,
                                         {"seq", required_argument, 0, 'T'},
                                         {"budget", required_argument, 0, 'b'},
                                         {"batch-size", required_argument, 0, 'B'},
                                         {"schedules", required_argument, 0, 's'},
                                         {"storage", required_argument, 0, 'S'},
                                         {"optimizer", no_argument, 0, 'o'},
                                         {"grad-accum", required_argument, 0, 'G'},
                                         {"ranks", required_argument, 0, 'R'},
                                         {"seq-ranks", required_argument, 0, 'Q'},
                                         {"seq-overlap", no_argument, 0, 'V'},
                                         {"grads-out", no_argument, 0, 'g'},
                                         {"bandwidth", required_argument, 0, OPT_BANDWIDTH},
                                         {"latency", required_argument, 0, OPT_LATENCY},
                                         {"flops", required_argument, 0, OPT_FLOPS},
                                         OPTION_BLOCK,
                                         OPTION_CHUNK,
                                         OPTION_LOGIT_CHUNK,
                                         {"objective", required_argument, 0, OBJ_OPT_OBJECTIVE},
                                         {"lora-r", required_argument, 0, OPT_LORA_R},
                                         {"lora-targets", required_argument, 0, OPT_LORA_TARGETS},
                                         {"paper", no_argument, 0, 'p'},
                                         {"family", required_argument, 0, OPT_FAMILY},
                                         OPTION_JSON,
                                         {"csv", no_argument, 0, 'v'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    /* chunk, logit chunk 0: the engine's defaults for the block, set after the options */
    *a = (plan_args){.s = {.B = 1, .storage = 4, .block = SBP_DEFAULT_BLOCK}};
    plan_setup *s = &a->s;
    common_opts co = {.cmd = "plan",
                      .model = &a->model,
                      .block = &s->block,
                      .chunk = &s->chunk,
                      .logit_chunk = &s->logit_chunk,
                      .json = &a->json};
    obj_args_init(&a->oa);
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        a->other |= c != 'b' && c != COMMON_OPT_JSON && c != 'p' && c != OPT_FAMILY;
        switch (c) {
        case 'c': a->config = optarg; break;
        case 'T':
            if (!parse_pos_int("plan", "seq", optarg, &a->T) || a->T > SBP_PLAN_MAX_TOKENS) {
                if (a->T > SBP_PLAN_MAX_TOKENS)
                    fprintf(stderr,
                            "streambp plan: --seq %s is past planning's limit of %d tokens a step "
                            "(2^26: the walk visits every token)\n",
                            optarg, SBP_PLAN_MAX_TOKENS);
                return EXIT_USAGE;
            }
            break;
        case 'b':
            if (!plan_parse_size("plan", optarg, &a->budget)) return EXIT_USAGE;
            break;
        case 'B':
            if (!parse_pos_int("plan", "batch-size", optarg, &s->B)) return EXIT_USAGE;
            break;
        case 's': a->sched = optarg; break;
        case 'S':
            if (strcmp(optarg, "bf16") == 0)
                s->storage = 2;
            else if (strcmp(optarg, "fp32") == 0)
                s->storage = 4;
            else {
                fprintf(stderr, "streambp plan: --storage must be bf16 or fp32\n");
                return EXIT_USAGE;
            }
            break;
        case 'o': s->optimizer = 1; break;
        case 'G':
            if (!parse_pos_int("plan", "grad-accum", optarg, &s->micro_batches)) return EXIT_USAGE;
            break;
        case 'R':
            if (!parse_pos_int("plan", "ranks", optarg, &s->ranks)) return EXIT_USAGE;
            break;
        case 'V': s->seq_overlap = 1; break;
        case 'g': s->grads_out = 1; break;
        case 'Q':
            if (!parse_pos_int("plan", "seq-ranks", optarg, &s->seq_ranks)) return EXIT_USAGE;
            break;
        case OBJ_OPT_OBJECTIVE:
            if (!obj_args_option(&a->oa, "plan", c, optarg)) return EXIT_USAGE;
            break;
        case OPT_LORA_R:
            if (!parse_pos_int("plan", "lora-r", optarg, &s->lora.r)) return EXIT_USAGE;
            break;
        case OPT_LORA_TARGETS: a->targets = optarg; break;
        case 'p': a->paper_mode = 1; break;
        case OPT_FAMILY: a->family = optarg; break;
        case OPT_BANDWIDTH: /* the network model's time (docs/distributed.md §7) */
            if (!parse_net_option("plan", "bandwidth", optarg, &a->net.bandwidth))
                return EXIT_USAGE;
            break;
        case OPT_LATENCY:
            if (!parse_net_option("plan", "latency", optarg, &a->net.latency)) return EXIT_USAGE;
            break;
        case OPT_FLOPS:
            if (!parse_net_option("plan", "flops", optarg, &a->net.flops)) return EXIT_USAGE;
            break;
        case 'v': a->csv = 1; break;
        case 'h': fputs(usage, stdout); return 0;
        default:
            if (common_opt_code(c)) {
                if (!common_opt(&co, c, optarg)) return EXIT_USAGE;
                break;
            }
            fputs(usage, stderr);
            return EXIT_USAGE;
        }
    }
    if (!s->chunk) s->chunk = SBP_DEFAULT_CHUNK(s->block);
    if (!s->logit_chunk) s->logit_chunk = s->block;
    return -1;
}

/* The checks of a plan's options that need them all (not --paper's): 0, or EXIT_USAGE with the
 * message printed. */
static int check_args(plan_args *a, int argc) {
    plan_setup *s = &a->s;
    if (a->family) {
        fprintf(stderr, "streambp plan: --family chooses --paper's table; it needs --paper\n");
        return EXIT_USAGE;
    }
    if (optind < argc || !a->config == !a->model || !a->T == !a->budget) {
        fprintf(stderr, "streambp plan: give --config or --model, and --seq or --budget\n%s",
                usage);
        return EXIT_USAGE;
    }
    if (!obj_args_finish(&a->oa, "plan")) return EXIT_USAGE;
    s->obj = a->oa.obj;
    if (a->targets && !s->lora.r) {
        fprintf(stderr, "streambp plan: --lora-targets needs --lora-r\n");
        return EXIT_USAGE;
    }
    if (s->lora.r) {
        s->lora.alpha = 2.0 * s->lora.r; /* never read by the planner */
        s->lora.targets = SBP_LORA_ALL;
        if (a->targets && !sbp_lora_targets_parse(a->targets, &s->lora.targets)) {
            fprintf(stderr,
                    "streambp plan: --lora-targets \"%s\": a comma-separated list of q_proj, "
                    "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or all-linear\n",
                    a->targets);
            return EXIT_USAGE;
        }
    }
    return 0;
}

/* The text table's heading: the setting, then the column names. */
static void print_heading(const plan_args *a, const char *path, int64_t nparam, int64_t nadapter,
                          int rows) {
    const plan_setup *s = &a->s;
    printf("%s: %s, %.3fB parameters, %s, %s, %d sequence%s of T tokens, storage %s, optimizer "
           "%s",
           path, s->cfg.model_type, nparam / 1e9, obj_kind_name(s->obj.kind),
           s->obj.kind == SBP_OBJ_DPO    ? "pairs of chosen and rejected"
           : s->obj.kind == SBP_OBJ_GRPO ? "a group"
                                         : "a batch",
           rows, rows > 1 ? "s" : "", s->storage == 2 ? "bf16" : "fp32",
           s->optimizer ? "included" : "excluded");
    if (s->grads_out) printf(", the gradient written out as it forms");
    if (s->lora.r)
        printf(", LoRA r %d on %s (%.2fM adapter parameters, the base frozen)", s->lora.r,
               a->targets ? a->targets : "all-linear", nadapter / 1e6);
    if (a->budget)
        printf(", budget %.2f GiB", gib(a->budget));
    else
        printf(", T = %d", a->T);
    if (s->seq_ranks > 1) /* docs/distributed.md §8 */
        printf("\n%d processes, %d sharing every sequence, %d micro-batches a step: memory of the "
               "rank holding the most",
               s->ranks > 1 ? s->ranks : s->seq_ranks, s->seq_ranks,
               s->micro_batches ? s->micro_batches
                                : (s->ranks > 1 ? s->ranks : s->seq_ranks) / s->seq_ranks);
    if (a->seq_net_schedule)
        printf("; the rank sending the most sends %lld bytes in %lld messages a step (%s)",
               (long long)a->net_bytes, (long long)a->net_messages, a->seq_net_schedule);
    else if (s->ranks > 1 && s->seq_ranks <= 1) /* docs/distributed.md §4 */
        printf("\n%d processes, %d micro-batches a step: the rank sending the most sends %lld "
               "bytes in %lld messages a step; memory: the rank holding the most",
               s->ranks, s->micro_batches ? s->micro_batches : s->ranks, (long long)a->net_bytes,
               (long long)a->net_messages);
    if (a->net_schedule && s->seq_ranks > 1) /* docs/distributed.md §8 */
        printf("\nat %.4g bytes/s, %.3g s a message, %.4g GFLOP/s a process (%s): %.4g s of "
               "compute a step (the rank computing the most), at least %.4g s of communication "
               "exposed (%.4g s a round beyond the rank's compute, %.4g s after the last; the "
               "waits on the other ranks' compute not included)",
               a->net.bandwidth, a->net.latency, a->net.flops / 1e9, a->net_schedule,
               a->net_t.compute, a->net_t.exposed, a->net_t.per_round, a->net_t.after);
    else if (a->net_schedule) /* docs/distributed.md §7 */
        printf("\nat %.4g bytes/s, %.3g s a message, %.4g GFLOP/s a process (%s's backward): %.4g "
               "s of compute a step, %.4g s of communication exposed (%.4g s a round after its "
               "backward, %.4g s after the last)",
               a->net.bandwidth, a->net.latency, a->net.flops / 1e9, a->net_schedule,
               a->net_t.compute, a->net_t.exposed, a->net_t.per_round, a->net_t.after);
    printf("\nblock %d, stream chunk %d, logit chunk %d; GiB at the moment of the peak:\n",
           s->block, s->chunk, s->logit_chunk);
    header(a->budget ? "largest T" : "T");
}

/* The --json document around the schedules' rows (taken over). */
static void print_plan_json(const plan_args *a, const char *path, int64_t nparam, int64_t nadapter,
                            int rows, cJSON *jrows) {
    const plan_setup *s = &a->s;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "config", path);
    cJSON_AddNumberToObject(o, "parameters", (double)nparam);
    cJSON_AddStringToObject(o, "objective", obj_kind_name(s->obj.kind));
    cJSON_AddNumberToObject(o, "B", s->B);
    cJSON_AddNumberToObject(o, "rows", rows);
    cJSON_AddNumberToObject(o, "storage_bytes", s->storage);
    cJSON_AddBoolToObject(o, "optimizer", s->optimizer);
    cJSON_AddBoolToObject(o, "gradient_held", !s->grads_out);
    if (s->lora.r) {
        cJSON_AddNumberToObject(o, "lora_r", s->lora.r);
        cJSON_AddNumberToObject(o, "adapter_parameters", (double)nadapter);
    }
    if (a->budget) cJSON_AddNumberToObject(o, "budget_bytes", (double)a->budget);
    if (s->seq_ranks > 1) cJSON_AddNumberToObject(o, "seq_ranks", s->seq_ranks);
    if (s->ranks > 1) cJSON_AddNumberToObject(o, "ranks", s->ranks);
    if (a->seq_net_schedule) cJSON_AddStringToObject(o, "sent_schedule", a->seq_net_schedule);
    if ((s->ranks > 1 && s->seq_ranks <= 1) || a->seq_net_schedule) {
        cJSON_AddNumberToObject(o, "sent_bytes_per_step", (double)a->net_bytes);
        cJSON_AddNumberToObject(o, "sent_messages_per_step", (double)a->net_messages);
    }
    if (a->net_schedule) {
        cJSON *n = cJSON_AddObjectToObject(o, "network_time");
        cJSON_AddNumberToObject(n, "bandwidth_bytes_per_s", a->net.bandwidth);
        cJSON_AddNumberToObject(n, "latency_s", a->net.latency);
        cJSON_AddNumberToObject(n, "flops_per_s", a->net.flops);
        cJSON_AddStringToObject(n, "schedule", a->net_schedule);
        cJSON_AddNumberToObject(n, "compute_s", a->net_t.compute);
        cJSON_AddNumberToObject(n, "exposed_s", a->net_t.exposed);
        cJSON_AddNumberToObject(n, "exposed_per_round_s", a->net_t.per_round);
        cJSON_AddNumberToObject(n, "after_backward_s", a->net_t.after);
    }
    cJSON_AddItemToObject(o, "schedules", jrows);
    print_json(o);
}

/* --budget: whether the shortest step (T = 1, a DPO row 2) of some schedule in use[] fits. A
 * schedule that does not would show T = 0 and a row of zeros: with none fitting this says what
 * the budget cannot hold (the weights alone, or the step's least) and returns EXIT_USAGE; one
 * that does not beside others that do gets a note. 0 when some schedule fits. */
static int budget_holds_a_step(const plan_args *a, const int use[PLAN_N_SCHEDULES]) {
    const plan_setup *s = &a->s;
    const sbp_plan_opts p0 = plan_opts(s, &all_rows[0]);
    const int T_min = sbp_plan_min_T(&p0); /* the same for every schedule */
    int64_t need[PLAN_N_SCHEDULES] = {0};
    sbp_ledger least = {.peak_total = INT64_MAX};
    int fits = 0, best = -1;
    for (int k = 0; k < PLAN_N_SCHEDULES; k++) {
        if (!use[k]) continue;
        sbp_plan_opts po = plan_opts(s, &all_rows[k]);
        po.T = T_min;
        sbp_ledger lg;
        sbp_err err = {0};
        if (sbp_plan(&lg, &s->cfg, &po, &err) == SBP_ENOMEM) { /* no address space for it */
            need[k] = INT64_MAX;
            continue;
        }
        if (err.status) return report_error("plan", &err);
        need[k] = lg.peak_total;
        fits |= need[k] <= a->budget;
        if (need[k] < least.peak_total) least = lg, best = k;
    }
    if (fits) {
        for (int k = 0; k < PLAN_N_SCHEDULES; k++)
            if (use[k] && need[k] > a->budget)
                fprintf(stderr,
                        "streambp plan: note: %s does not fit %.2f GiB even at T = %d (%.2f GiB): "
                        "its row shows T = 0\n",
                        all_rows[k].name, gib(a->budget), T_min, gib(need[k]));
        return 0;
    }
    if (best < 0) {
        fprintf(stderr, "streambp plan: no schedule's shortest step can be planned in this "
                        "process's address space: no sequence fits the budget\n");
        return EXIT_USAGE;
    }
    const int64_t *at = least.at_peak;
    if (at[SBP_MEM_WEIGHTS] > a->budget)
        fprintf(stderr,
                "streambp plan: the weights alone take %.2f GiB (%s storage), more than the "
                "budget of %.2f GiB: no sequence fits\n",
                gib(at[SBP_MEM_WEIGHTS]), s->storage == 2 ? "bf16" : "fp32", gib(a->budget));
    else
        fprintf(stderr,
                "streambp plan: the shortest step (T = %d) needs %.2f GiB with %s, the least of "
                "the schedules (weights %.2f GiB, gradients %.2f GiB, optimizer %.2f GiB), more "
                "than the budget of %.2f GiB: no sequence fits\n",
                T_min, gib(least.peak_total), all_rows[best].name, gib(at[SBP_MEM_WEIGHTS]),
                gib(at[SBP_MEM_GRADS]), gib(at[SBP_MEM_OPTIMIZER]), gib(a->budget));
    return EXIT_USAGE;
}

/* One row per schedule in use[]: its peak at T, or its largest T within the budget; as CSV, into
 * jrows (--json) or as a table row. 0, or the exit status of an error. */
static int plan_rows(const plan_args *a, const int use[PLAN_N_SCHEDULES], cJSON *jrows) {
    const plan_setup *s = &a->s;
    sbp_err err = {0};
    for (int k = 0; k < 4; k++) {
        if (!use[k]) continue;
        sbp_ledger lg;
        int t = a->T;
        sbp_plan_opts po = plan_opts(s, &all_rows[k]);
        po.T = a->T; /* read only without --budget */
        if (a->budget) {
            t = largest_T(s, &all_rows[k], a->budget, &lg);
            if (t == sbp_plan_max_T(&po))
                fprintf(stderr,
                        "streambp plan: note: %s fits at planning's limit of %d tokens a step; "
                        "the budget may hold a longer T\n",
                        all_rows[k].name, SBP_PLAN_MAX_TOKENS);
        } else if (sbp_plan(&lg, &s->cfg, &po, &err)) {
            return report_error("plan", &err);
        }
        if (a->csv) {
            printf("%s,%d", all_rows[k].name, t);
            for (int q = 0; q < SBP_MEM_NCATS; q++) printf(",%lld", (long long)lg.at_peak[q]);
            printf(",%lld\n", (long long)lg.peak_total);
        } else if (a->json) {
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
    return 0;
}

int cmd_plan(int argc, char **argv) {
    plan_args a;
    int rc = parse_args(&a, argc, argv);
    if (rc >= 0) return rc;
    plan_setup *s = &a.s;
    sbp_err err = {0};
    char data[512];
    if (a.paper_mode) {
        if (optind < argc || a.other) {
            fprintf(stderr,
                    "streambp plan: --paper takes only --budget and --json (and --family)\n");
            return EXIT_USAGE;
        }
        const int gemma = a.family && strcmp(a.family, "gemma3") == 0;
        if (a.family && !gemma && strcmp(a.family, "qwen3") != 0) {
            fprintf(stderr, "streambp plan: --family must be qwen3 (the paper's) or gemma3\n");
            return EXIT_USAGE;
        }
        if (sbp_data_dir(data, sizeof data, &err)) return report_error("plan", &err);
        if (gemma) return run_paper_gemma3(a.budget ? a.budget : 80LL << 30, data, a.json);
        return run_paper(a.budget ? a.budget : 80LL << 30, data, a.json);
    }
    if ((rc = check_args(&a, argc))) return rc;
    char path[4200];
    if (a.model)
        snprintf(path, sizeof path, "%s/config.json", a.model);
    else
        snprintf(path, sizeof path, "%s", a.config);
    if (sbp_config_load(&s->cfg, path, &err)) return report_error("plan", &err);
    if (s->obj.kind == SBP_OBJ_DPO && a.T == 1) {
        fprintf(stderr, "streambp plan: a DPO sequence needs T >= 2 (a completion token)\n");
        return EXIT_USAGE;
    }
    int use[PLAN_N_SCHEDULES] = {1, 1, 1, 1};
    if (a.sched && !plan_parse_schedules("plan", a.sched, use)) return EXIT_USAGE;
    sbp_params ps, lps = {0};
    if (sbp_params_build(&ps, &s->cfg, &err) ||
        (s->lora.r && sbp_lora_params_build(&lps, &s->cfg, &s->lora, &err)))
        return report_error("plan", &err);
    int64_t nparam = ps.total, nadapter = lps.total;
    /* data parallel's groups: N processes, or with --seq-ranks S N / S groups of S */
    const int S = s->seq_ranks > 1 ? s->seq_ranks : 1, groups = s->ranks > 1 ? s->ranks / S : 1;
    const int n_micro = s->micro_batches ? s->micro_batches : groups;
    if (S > 1 && s->ranks > 1 && s->ranks % S)
        sbp_fail(&err, SBP_EUSAGE,
                 "--seq-ranks %d must divide --ranks %d (N / S groups of S ranks, data parallel "
                 "between the groups)",
                 S, s->ranks);
    else if (s->ranks > 1 && n_micro % groups)
        sbp_fail(&err, SBP_EUSAGE, "%d micro-batches cannot be shared by %d %s", n_micro, groups,
                 S > 1 ? "groups" : "processes");
    else if (s->ranks > 1 && S == 1)
        sbp_dist_traffic(&a.net_bytes, &a.net_messages, s->lora.r ? &lps : &ps, s->storage,
                         s->ranks, n_micro, s->optimizer, &err);
    else if (S > 1 && !a.budget) { /* the K/V traffic depends on the schedule: the first asked */
        int k = 0;
        while (k + 1 < PLAN_N_SCHEDULES && !use[k]) k++;
        sbp_plan_opts po = plan_opts(s, &plan_schedules[k]);
        po.T = a.T;
        if (!sbp_plan_seq_traffic(&a.net_bytes, &a.net_messages, &s->cfg, &po, &err))
            a.seq_net_schedule = plan_schedules[k].name;
    }
    const int net_asked = a.net.bandwidth > 0 || a.net.flops > 0 || a.net.latency > 0;
    if (!err.status && net_asked &&
        ((s->ranks < 2 && S < 2) || !(a.net.bandwidth > 0) || !(a.net.flops > 0) || a.budget))
        sbp_fail(&err, SBP_EUSAGE,
                 "the network model's time needs --ranks N (N > 1) or --seq-ranks S, "
                 "--bandwidth and --flops, at one --seq (not --budget)");
    else if (!err.status && net_asked && S > 1) { /* the K/V traffic's schedule, as above */
        int k = 0;
        while (k + 1 < PLAN_N_SCHEDULES && !use[k]) k++;
        sbp_plan_opts po = plan_opts(s, &plan_schedules[k]);
        po.T = a.T;
        if (!sbp_plan_seq_net(&a.net_t, &s->cfg, &po, &a.net, &err))
            a.net_schedule = plan_schedules[k].name;
    } else if (!err.status && net_asked) { /* for the first schedule asked for */
        int k = 0;
        while (k + 1 < PLAN_N_SCHEDULES && !use[k]) k++;
        sbp_plan_opts po = plan_opts(s, &plan_schedules[k]);
        sbp_lora la = {.cfg = s->lora};
        if (s->lora.r) po.grad.lora = &la;
        sbp_dist_net(&a.net_t, &s->cfg, s->lora.r ? &lps : &ps, &po.grad, s->B, a.T, s->storage,
                     s->ranks, n_micro, s->optimizer, &a.net, &err);
        a.net_schedule = plan_schedules[k].name;
    }
    sbp_params_free(&ps), sbp_params_free(&lps);
    if (err.status) return report_error("plan", &err);
    const int rows = s->obj.kind == SBP_OBJ_DPO ? 2 * s->B : s->B;
    if (a.budget && (rc = budget_holds_a_step(&a, use))) return rc;
    if (a.csv) {
        printf("schedule,T");
        for (int k = 0; k < SBP_MEM_NCATS; k++) printf(",%s", sbp_mem_cat_name(k));
        printf(",total\n");
    } else if (!a.json) {
        print_heading(&a, path, nparam, nadapter, rows);
    }
    cJSON *jrows = cJSON_CreateArray();
    if ((rc = plan_rows(&a, use, jrows))) {
        cJSON_Delete(jrows);
        return rc;
    }
    if (a.json)
        print_plan_json(&a, path, nparam, nadapter, rows, jrows);
    else
        cJSON_Delete(jrows);
    return 0;
}
