/* cmd_train.c — `streambp train`: AdamW training of a HF decoder's full weights, or of a LoRA
 * adapter on the frozen model, with any schedule and objective, checkpoints that resume bit for
 * bit, a loss log and a plot.
 *
 * What makes a run reproducible to the bit: the gradient of a step does not depend on the
 * schedule (fast mode, chunks that are multiples of the block) nor on the thread count; the
 * optimizer and the clipping do the same arithmetic for every thread count; the data order is a
 * function of the seed and the position; and a checkpoint holds everything else exactly (the
 * trained weights or adapter and the moments as their bits, the step, the data position and the
 * generator state). The loss log
 * (loss.csv) holds only such values; wall-clock times and memory peaks, which differ between
 * machines and schedules, go to timing.csv.
 *
 * The output directory:
 *   loss.csv, timing.csv              one row per optimizer step
 *   checkpoint-N/                     config.json, model.safetensors, optimizer.safetensors,
 *                                     trainer_state.json, loss.csv, timing.csv (up to step N);
 *                                     with --lora adapter_config.json and
 *                                     adapter_model.safetensors (peft's layout) instead of the
 *                                     model's two files, the moments under the adapter's names
 *   config.json, model.safetensors    the final weights (after the last step); with --lora
 *                                     adapter_config.json, adapter_model.safetensors
 *   loss.png                          with --plot, when gnuplot is installed
 *
 * This file parses the options, prints and picks the exit codes; the run itself (its settings,
 * checkpoints, run directory and loading) is the library's: src/train/run.h. */
#include "../core/err.h"
#include "../dist/dist.h"
#include "../train/run.h"
#include "cli.h"
#include "objopts.h"
#include "options.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: streambp train --model DIR (--data PATH ... | --jsonl FILE --seq T) --out DIR\n"
    "                      --steps N [options]\n"
    "\n"
    "Trains every weight of the model, or a LoRA adapter on the frozen model (--lora), with\n"
    "AdamW (torch.optim.AdamW), gradient clipping and a warm-up + cosine learning rate, any\n"
    "objective and any schedule. full, ckpt and stream give byte-identical weights (adapters)\n"
    "and loss logs (chunks that are multiples of --block), and a run resumed from a checkpoint\n"
    "is byte-identical to one that never stopped.\n"
    "\n"
    "data\n"
    "  --data PATH          a batch file (README \"Objectives\") or a directory of them\n"
    "                       (*.safetensors, name order); repeatable; one file a micro-batch\n"
    "  --jsonl FILE         instead: records {\"input_ids\": [...], \"labels\": [...]} one a line\n"
    "                       (labels optional: = input_ids; -100 ignored), SFT only; each record\n"
    "                       a row of --seq tokens: truncated, or padded on the right (label -100)\n"
    "  --seq T              tokens per row of --jsonl data\n"
    "  --batch-size B       records per micro-batch of --jsonl data (default 1)\n"
    "  --shuffle            a new seeded random order every epoch (default: the given order)\n"
    "  --seed N             seed of the shuffle (default 42, as HF)\n"
    "what is trained\n"
    "  --lora DIR           a LoRA adapter in peft's layout (`streambp lora init`, or peft's\n"
    "                       save_pretrained) to train, the model frozen; checkpoints and the\n"
    "                       result are adapter directories peft loads (default: every weight)\n"
    "optimization (defaults of HF TrainingArguments)\n"
    "  --steps N            optimizer steps of the run (required)\n"
    "  --grad-accum N       micro-batches per optimizer step (default 1)\n"
    "  --lr X               peak learning rate (default 5e-5)\n"
    "  --lr-scheduler S     cosine | linear | constant (default cosine), after the warm-up\n"
    "  --warmup-steps N     linear warm-up from 0 (default 0; step 0 then runs at lr 0, as HF)\n"
    "  --beta1 X, --beta2 X AdamW betas (defaults 0.9, 0.999)\n"
    "  --eps X              AdamW epsilon (default 1e-8)\n"
    "  --weight-decay X     decoupled weight decay (default 0), on every weight unless:\n"
    "  --no-decay-norms-biases   no decay of norm weights and biases (HF Trainer's groups;\n"
    "                       an adapter has neither: all of it is decayed)\n"
    "  --max-grad-norm X    clip the gradient to this global L2 norm (default 1; 0: no clipping)\n"
    "  --precision P        fp32 | fp64: weights (and adapter), gradients and moments (default\n"
    "                       fp32)\n"
    "engine (these may change when resuming)\n"
    "  --schedule S         full | ckpt | stream (default stream)\n"
    "  --block N            token block (default 512); the gradient's bits depend on it\n"
    "  --chunk N, --logit-chunk N, --chunked-logits   as for grad\n" THREADS_USAGE "output\n"
    "  --out DIR            run directory (created; must not hold another run)\n"
    "  --save-every N       write OUT/checkpoint-N every N steps (default 0: none)\n"
    "  --resume PATH        continue from a checkpoint directory, or from the newest\n"
    "                       checkpoint-N in a run directory, with the same settings\n"
    "  --stop-at N          stop after step N with a checkpoint (the schedule still spans\n"
    "                       --steps); resume later with --resume\n"
    "  --log-every N        progress line on stderr every N steps (default 1)\n"
    "  --plot               draw OUT/loss.png with gnuplot (skipped when it is not installed)\n"
    "  --json               print the summary as JSON\n"
    "processes (`mpirun -np N streambp train ...`, docs/distributed.md)\n"
    "  --comm-timeout S     end the run (exit 3) when a peer is silent for S seconds (default\n"
    "                       600). Micro-batch k of a step runs on rank k mod N (N must divide\n"
    "                       --grad-accum); the weights, checkpoints and logs are the bytes of\n"
    "                       one process, written by rank 0\n"
    "  --seq-ranks S        groups of S processes (S divides N) share every sequence, each\n"
    "                       holding whole blocks of its tokens, the N / S groups sharing the\n"
    "                       micro-batches (sequence parallel, docs/distributed.md §8); a run\n"
    "                       may resume on another S or N\n"
    "  --seq-overlap        with --seq-ranks: a rank runs each layer's backward without waiting "
    "for\n"
    "                       the previous rank's part of its gradient, keeping the operands of its\n"
    "                       weight products until that arrives (faster, more memory; the same "
    "bits)\n"
    "\n";

/* Every path option is at most SBP_RUN_PATH_MAX characters (checked when parsing): the library's
 * buffers leave room for what it appends, so nothing is cut. */
#define MAX_DATA 64

typedef struct {
    sbp_train_opts o; /* what the run is (src/train/run.h) */
    const char *out, *resume;
    const char *data[MAX_DATA]; /* o.data */
    int stop_at, save_every, log_every;
    int plot, json;
    obj_args obj;
    double comm_timeout; /* --comm-timeout (docs/distributed.md) */
} train_args;

/* getopt codes of train's own options (the shared ones are options.h's, the objective's
 * objopts.h's) */
enum {
    OPT_DATA = 2000,
    OPT_JSONL,
    OPT_SEQ,
    OPT_BATCH_SIZE,
    OPT_SHUFFLE,
    OPT_STEPS,
    OPT_GRAD_ACCUM,
    OPT_LR,
    OPT_LR_SCHED,
    OPT_WARMUP,
    OPT_BETA1,
    OPT_BETA2,
    OPT_EPS,
    OPT_WD,
    OPT_NO_DECAY,
    OPT_MAX_NORM,
    OPT_PRECISION,
    OPT_CHUNKED_LOGITS,
    OPT_OUT,
    OPT_SAVE_EVERY,
    OPT_RESUME,
    OPT_STOP_AT,
    OPT_LOG_EVERY,
    OPT_PLOT,
    OPT_LORA,
    OPT_COMM_TIMEOUT,
    OPT_SEQ_RANKS,
    OPT_SEQ_OVERLAP,
    OPT_HELP
};

static int nonneg_int(const char *opt, const char *text, int *out) {
    if (strcmp(text, "0") == 0) {
        *out = 0;
        return 1;
    }
    return parse_pos_int("train", opt, text, out);
}

/* One of train's own options (getopt code c, its argument arg) into a; 0 on a bad value
 * (reported), -1 for an unknown code. */
static int parse_option(train_args *a, int c, const char *arg) {
    sbp_train_opts *o = &a->o;
    switch (c) {
    case OPT_DATA:
        if (o->n_data == MAX_DATA) {
            fprintf(stderr, "streambp train: at most %d --data paths\n", MAX_DATA);
            return 0;
        }
        a->data[o->n_data++] = arg;
        return 1;
    case OPT_JSONL: o->jsonl = arg; return 1;
    case OPT_SEQ: return parse_pos_int("train", "seq", arg, &o->T);
    case OPT_BATCH_SIZE: return parse_pos_int("train", "batch-size", arg, &o->B);
    case OPT_SHUFFLE: o->shuffle = 1; return 1;
    case OPT_STEPS: return parse_pos_int("train", "steps", arg, &o->steps);
    case OPT_GRAD_ACCUM: return parse_pos_int("train", "grad-accum", arg, &o->grad_accum);
    case OPT_LR: return parse_number("train", "lr", arg, 0, &o->sched.lr);
    case OPT_LR_SCHED:
        if (sbp_lr_kind_parse(arg, &o->sched.kind)) return 1;
        fprintf(stderr,
                "streambp train: --lr-scheduler must be cosine, linear or constant, got \"%s\"\n",
                arg);
        return 0;
    case OPT_WARMUP: return nonneg_int("warmup-steps", arg, &o->warmup);
    case OPT_BETA1: return parse_number("train", "beta1", arg, 0, &o->adam.beta1);
    case OPT_BETA2: return parse_number("train", "beta2", arg, 0, &o->adam.beta2);
    case OPT_EPS: return parse_number("train", "eps", arg, 0, &o->adam.eps);
    case OPT_WD: return parse_number("train", "weight-decay", arg, 0, &o->adam.weight_decay);
    case OPT_NO_DECAY: o->no_decay_nb = 1; return 1;
    case OPT_MAX_NORM: return parse_number("train", "max-grad-norm", arg, 0, &o->max_grad_norm);
    case OPT_PRECISION:
        if (strcmp(arg, "bf16") == 0) {
            fprintf(stderr, "streambp train: --precision bf16 is not a training precision here "
                            "(fp32 or fp64)\n");
            return 0;
        }
        return parse_precision("train", arg, &o->prec);
    case OPT_CHUNKED_LOGITS: o->g.chunked_logits = 1; return 1;
    case OPT_OUT: a->out = arg; return 1;
    case OPT_SAVE_EVERY: return nonneg_int("save-every", arg, &a->save_every);
    case OPT_RESUME: a->resume = arg; return 1;
    case OPT_STOP_AT: return parse_pos_int("train", "stop-at", arg, &a->stop_at);
    case OPT_LOG_EVERY: return parse_pos_int("train", "log-every", arg, &a->log_every);
    case OPT_PLOT: a->plot = 1; return 1;
    case OPT_LORA: o->lora = arg; return 1;
    case OPT_COMM_TIMEOUT: return parse_comm_timeout("train", arg, &a->comm_timeout);
    case OPT_SEQ_RANKS: return parse_pos_int("train", "seq-ranks", arg, &o->g.seq_ranks);
    case OPT_SEQ_OVERLAP: o->g.seq_overlap = 1; return 1;
    }
    if (c >= OBJ_OPT_OBJECTIVE && c <= OBJ_OPT_REF_MODEL)
        return obj_args_option(&a->obj, "train", c, arg);
    return -1;
}

/* What the options say together: the required ones, path lengths, the data's shape, the stop,
 * the objective and AdamW; then the library's view of them (a->o). 0, or the exit code. */
static int check_args(train_args *a) {
    sbp_train_opts *o = &a->o;
    const char *need[4] = {!o->model ? "--model DIR" : NULL,
                           !o->n_data && !o->jsonl ? "--data PATH or --jsonl FILE" : NULL,
                           !a->out ? "--out DIR" : NULL, !o->steps ? "--steps N" : NULL};
    char missing[128] = "";
    for (int i = 0; i < 4; i++)
        if (need[i])
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s",
                     missing[0] ? ", " : "", need[i]);
    if (missing[0]) {
        fprintf(stderr,
                "streambp train: missing %s (--model, --data or --jsonl, --out and --steps are "
                "required; `streambp train --help` lists the options)\n",
                missing);
        return EXIT_USAGE;
    }
    const char *paths[MAX_DATA + 6] = {o->model,         a->out,  a->resume,
                                       a->obj.ref_model, o->lora, o->jsonl};
    for (int i = 0; i < o->n_data; i++) paths[6 + i] = a->data[i];
    for (int i = 0; i < 6 + o->n_data; i++)
        if (paths[i] && strlen(paths[i]) > SBP_RUN_PATH_MAX) {
            fprintf(stderr, "streambp train: a path longer than %d characters: %.60s...\n",
                    SBP_RUN_PATH_MAX, paths[i]);
            return EXIT_USAGE;
        }
    if (o->n_data && o->jsonl) {
        fprintf(stderr, "streambp train: give --data or --jsonl, not both\n");
        return EXIT_USAGE;
    }
    if (o->jsonl && !o->T) {
        fprintf(stderr, "streambp train: --jsonl needs --seq T (tokens per row)\n");
        return EXIT_USAGE;
    }
    if (!o->jsonl && (o->T || o->B != 1)) {
        fprintf(stderr, "streambp train: --seq and --batch-size apply to --jsonl data (a batch "
                        "file has its own shape)\n");
        return EXIT_USAGE;
    }
    if (a->stop_at > o->steps) {
        fprintf(stderr, "streambp train: --stop-at %d is after the last step (--steps %d)\n",
                a->stop_at, o->steps);
        return EXIT_USAGE;
    }
    if (!obj_args_finish(&a->obj, "train")) return EXIT_USAGE;
    sbp_err err = {0};
    if (sbp_adamw_check(&o->adam, &err)) {
        fprintf(stderr, "streambp train: %s (--beta1, --beta2, --eps, --weight-decay)\n", err.msg);
        return EXIT_USAGE;
    }
    o->sched.warmup = o->warmup, o->sched.total = o->steps;
    o->g.objective = a->obj.obj;
    o->ref_model = a->obj.ref_model, o->scale_rewards = a->obj.scale_rewards;
    o->data = a->data;
    return 0;
}

/* The options into a: 0 to run, else the exit code (-1: --help printed). */
static int parse(train_args *a, int argc, char **argv) {
    static const struct option opts[] = {OPTION_MODEL,
                                         {"data", required_argument, 0, OPT_DATA},
                                         {"jsonl", required_argument, 0, OPT_JSONL},
                                         {"seq", required_argument, 0, OPT_SEQ},
                                         {"batch-size", required_argument, 0, OPT_BATCH_SIZE},
                                         {"shuffle", no_argument, 0, OPT_SHUFFLE},
                                         OPTION_SEED,
                                         {"steps", required_argument, 0, OPT_STEPS},
                                         {"grad-accum", required_argument, 0, OPT_GRAD_ACCUM},
                                         {"lr", required_argument, 0, OPT_LR},
                                         {"lr-scheduler", required_argument, 0, OPT_LR_SCHED},
                                         {"warmup-steps", required_argument, 0, OPT_WARMUP},
                                         {"beta1", required_argument, 0, OPT_BETA1},
                                         {"beta2", required_argument, 0, OPT_BETA2},
                                         {"eps", required_argument, 0, OPT_EPS},
                                         {"weight-decay", required_argument, 0, OPT_WD},
                                         {"no-decay-norms-biases", no_argument, 0, OPT_NO_DECAY},
                                         {"max-grad-norm", required_argument, 0, OPT_MAX_NORM},
                                         {"precision", required_argument, 0, OPT_PRECISION},
                                         OPTION_SCHEDULE,
                                         OPTION_CHUNK,
                                         OPTION_LOGIT_CHUNK,
                                         {"chunked-logits", no_argument, 0, OPT_CHUNKED_LOGITS},
                                         OPTION_BLOCK,
                                         OPTION_THREADS,
                                         {"out", required_argument, 0, OPT_OUT},
                                         {"save-every", required_argument, 0, OPT_SAVE_EVERY},
                                         {"resume", required_argument, 0, OPT_RESUME},
                                         {"stop-at", required_argument, 0, OPT_STOP_AT},
                                         {"log-every", required_argument, 0, OPT_LOG_EVERY},
                                         {"plot", no_argument, 0, OPT_PLOT},
                                         OPTION_JSON,
                                         {"lora", required_argument, 0, OPT_LORA},
                                         {"comm-timeout", required_argument, 0, OPT_COMM_TIMEOUT},
                                         {"seq-ranks", required_argument, 0, OPT_SEQ_RANKS},
                                         {"seq-overlap", no_argument, 0, OPT_SEQ_OVERLAP},
                                         {"help", no_argument, 0, OPT_HELP},
                                         OBJ_LONG_OPTIONS,
                                         {0, 0, 0, 0}};
    memset(a, 0, sizeof *a);
    obj_args_init(&a->obj);
    sbp_train_opts *o = &a->o;
    o->B = 1, o->seed = 42, o->grad_accum = 1, a->log_every = 1;
    o->sched = (sbp_lr_sched){.kind = SBP_LR_COSINE, .lr = 5e-5};
    o->adam = (sbp_adamw_opts){.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0};
    o->max_grad_norm = 1.0;
    o->g.schedule = SBP_STREAM;
    o->threads = default_threads();
    common_opts co = {.cmd = "train",
                      .model = &o->model,
                      .block = &o->g.block,
                      .chunk = &o->g.chunk,
                      .logit_chunk = &o->g.logit_chunk,
                      .threads = &o->threads,
                      .schedule = &o->g.schedule,
                      .seed = &o->seed,
                      .json = &a->json};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == OPT_HELP) {
            printf("%s%s", usage, obj_usage);
            return -1;
        }
        const int ok = common_opt_code(c) ? common_opt(&co, c, optarg) : parse_option(a, c, optarg);
        if (ok < 0) fputs(usage, stderr);
        if (ok <= 0) return EXIT_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, "streambp train: unexpected argument \"%s\"\n", argv[optind]);
        return EXIT_USAGE;
    }
    return check_args(a);
}

/* ---- progress, plot, summary ----------------------------------------------------------------- */

static void fmt_bytes(char *buf, size_t n, double b) {
    if (b < 10 * 1024.0)
        snprintf(buf, n, "%.0f B", b);
    else if (b < 10 * 1048576.0)
        snprintf(buf, n, "%.1f KiB", b / 1024);
    else if (b < 10 * 1073741824.0)
        snprintf(buf, n, "%.1f MiB", b / 1048576);
    else
        snprintf(buf, n, "%.2f GiB", b / 1073741824);
}

static void fmt_duration(char *buf, size_t n, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

/* OUT/loss.png from OUT/loss.csv with gnuplot, if it is installed. */
static void draw_plot(const char *out) {
    if (strchr(out, '\'') || strchr(out, '\n')) {
        fprintf(stderr, "streambp train: --plot skipped: the --out path has a quote or newline\n");
        return;
    }
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "streambp train: --plot skipped: gnuplot is not installed (apt-get "
                        "install gnuplot-nox)\n");
        return;
    }
    FILE *g = popen("gnuplot", "w");
    if (!g) {
        fprintf(stderr, "streambp train: --plot skipped: cannot start gnuplot\n");
        return;
    }
    fprintf(g,
            "set datafile separator ','\n"
            "set terminal pngcairo size 900,560 font 'sans,11'\n"
            "set output '%s/loss.png'\n"
            "set title 'streambp train: training loss'\n"
            "set xlabel 'optimizer step'\n"
            "set ylabel 'loss'\n"
            "set y2label 'learning rate'\n"
            "set ytics nomirror\n"
            "set y2tics\n"
            "set grid\n"
            "set key top right\n"
            "plot '%s/loss.csv' every ::1 using 1:3 with lines lw 2 title 'loss', \\\n"
            "     '%s/loss.csv' every ::1 using 1:4 axes x1y2 with lines dt 2 lc rgb 'gray40' "
            "title 'learning rate'\n",
            out, out, out);
    int rc = pclose(g);
    if (rc != 0)
        fprintf(stderr, "streambp train: gnuplot failed (status %d); no plot\n", rc);
    else
        fprintf(stderr, "streambp train: wrote %s/loss.png\n", out);
}

/* The loss of the first (last = 0) or last row of a loss log, or NaN. */
static double logged_loss(const char *csv, int last) {
    const char *row = csv ? strchr(csv, '\n') : NULL;
    double found = NAN;
    long long step;
    double epoch, loss;
    for (; row && row[1]; row = strchr(row + 1, '\n')) {
        if (sscanf(row + 1, "%lld,%lf,%lf", &step, &epoch, &loss) != 3) break;
        found = loss;
        if (!last) break;
    }
    return found;
}

/* ---- the command ----------------------------------------------------------------------------- */

/* What the run is, on stderr: the adapter, the model, the data, the engine, where it resumes. */
static void print_start(const train_args *a, const sbp_train_run *r, const sbp_ledger *lg,
                        const char *ckpt) {
    char mdesc[160], b1[32];
    sbp_describe_model(mdesc, sizeof mdesc, &r->m.cfg);
    fmt_bytes(b1, sizeof b1, (double)lg->cur[SBP_MEM_OPTIMIZER]);
    if (r->has_lora) {
        char ldesc[160];
        const sbp_lora *lora = &r->lora;
        sbp_describe_lora(ldesc, sizeof ldesc, &lora->cfg);
        fprintf(stderr,
                "streambp train: LoRA adapter %s (%s, scaling %g): %d tensors, %lld parameters "
                "trained, the model frozen\n",
                a->o.lora, ldesc, sbp_lora_scaling(&lora->cfg), lora->params.n,
                (long long)lora->params.total);
    }
    fprintf(stderr,
            "streambp train: %s, %lld parameters, %s; %lld data items, %d a micro-batch, %d "
            "micro-batches a step; %s, block %d; AdamW moments %s\n",
            mdesc, (long long)r->m.params.total, a->o.prec == SBP_FP64 ? "fp64" : "fp32",
            (long long)sbp_data_items(r->data), sbp_data_items_per_batch(r->data), a->o.grad_accum,
            sbp_schedule_name(a->o.g.schedule), a->o.g.block ? a->o.g.block : SBP_DEFAULT_BLOCK,
            b1);
    if (sbp_data_truncated(r->data) || sbp_data_skipped(r->data))
        fprintf(stderr,
                "streambp train: %lld records truncated to %d tokens; %lld records without a "
                "target in their first %d tokens skipped\n",
                (long long)sbp_data_truncated(r->data), a->o.T,
                (long long)sbp_data_skipped(r->data), a->o.T);
    if (r->rs.step)
        fprintf(stderr, "streambp train: resuming from %s at step %lld\n", ckpt,
                (long long)r->rs.step);
}

/* The optimizer steps from r->rs.step up to stop: each logged (loss.csv, timing.csv), its
 * progress line every --log-every steps, a checkpoint when one is due. *last_loss: the loss of
 * the last step taken. */
static sbp_status run_steps(const train_args *a, sbp_train_run *r, sbp_run_logs *logs, int64_t stop,
                            double *last_loss, sbp_ledger *lg, sbp_err *err) {
    const int64_t start = r->rs.step;
    const sbp_lora *lora = r->has_lora ? &r->lora : NULL;
    const double t_start = sbp_now_seconds();
    sbp_status st = SBP_OK;
    for (int64_t step = start; step < stop && !st; step++) {
        int64_t step_tokens = 0;
        if ((st = sbp_train_run_batches(r, &a->o, &step_tokens, lg, err))) break;
        const double lr = sbp_lr_at(&a->o.sched, step), t0 = sbp_now_seconds();
        sbp_step_result res;
        st = sbp_train_step(&res, &r->m, r->has_lora ? &r->lora : NULL, &r->opt, r->mb,
                            a->o.grad_accum, &a->o.g, lr, a->o.max_grad_norm, lg, err);
        if (st) {
            sbp_fail_prefix(err, "step %lld: ", (long long)step + 1);
            break;
        }
        const double secs = sbp_now_seconds() - t0;
        r->rs.step = step + 1;
        r->rs.tokens += step_tokens;
        *last_loss = res.loss;
        char row[512], trow[512];
        const sbp_sampler *sp = &r->rs.sampler;
        double epoch = (double)sp->epoch + (double)sp->pos / (double)sp->n;
        snprintf(row, sizeof row, "%lld,%.4f,%.17g,%.17g,%.17g,%lld,%lld\n", (long long)r->rs.step,
                 epoch, res.loss, res.lr, res.grad_norm, (long long)res.n_targets,
                 (long long)r->rs.tokens);
        snprintf(trow, sizeof trow, "%lld,%.6f,%.1f,%lld,%lld\n", (long long)r->rs.step, secs,
                 step_tokens / secs, (long long)lg->peak_total, sbp_peak_rss_bytes());
        if ((st = sbp_rundir_log(logs, &r->rs, row, trow, err))) break;
        const int talk = sbp_comm_rank(a->o.g.comm) == 0; /* rank 0 speaks for all */
        if (talk && (r->rs.step % a->log_every == 0 || r->rs.step == stop)) {
            double elapsed = sbp_now_seconds() - t_start;
            double eta = elapsed / (double)(r->rs.step - start) * (double)(stop - r->rs.step);
            char peak[32], rss[32], et[32];
            fmt_bytes(peak, sizeof peak, (double)lg->peak_total);
            fmt_bytes(rss, sizeof rss, (double)sbp_peak_rss_bytes());
            fmt_duration(et, sizeof et, eta);
            fprintf(stderr,
                    "step %lld/%d  loss %.6f  lr %.3e  grad_norm %.4f  %.0f tokens/s  peak %s "
                    "(RSS %s)  ETA %s\n",
                    (long long)r->rs.step, a->o.steps, res.loss, res.lr, res.grad_norm,
                    step_tokens / secs, peak, rss, et);
        }
        int due = (a->save_every && r->rs.step % a->save_every == 0) ||
                  (a->stop_at && r->rs.step == a->stop_at && a->stop_at < a->o.steps);
        if (due) {
            char where[4400];
            st = sbp_checkpoint_save(where, sizeof where, a->out, &a->o, &r->rs, &r->settings,
                                     &r->m, lora, r->config_json, &r->opt, err);
            if (!st) fprintf(stderr, "streambp train: saved %s\n", where);
        }
    }
    return st;
}

/* The summary of the session on stdout (text, or JSON with --json). */
static void print_summary(const train_args *a, const sbp_train_run *r, int64_t start, int finished,
                          double secs, double last_loss, const sbp_ledger *lg) {
    double l0 = logged_loss(r->rs.loss_csv, 0);
    if (!isfinite(last_loss)) last_loss = logged_loss(r->rs.loss_csv, 1); /* no step now */
    if (a->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "out", a->out);
        cJSON_AddNumberToObject(o, "steps_done", (double)r->rs.step);
        cJSON_AddNumberToObject(o, "steps", a->o.steps);
        cJSON_AddNumberToObject(o, "resumed_from_step", (double)start);
        cJSON_AddBoolToObject(o, "finished", finished);
        char t[40];
        snprintf(t, sizeof t, "%.17g", l0);
        cJSON_AddRawToObject(o, "first_loss", isfinite(l0) ? t : "null");
        snprintf(t, sizeof t, "%.17g", last_loss);
        cJSON_AddRawToObject(o, "last_loss", isfinite(last_loss) ? t : "null");
        cJSON_AddNumberToObject(o, "seconds", secs);
        cJSON_AddNumberToObject(o, "tokens", (double)r->rs.tokens);
        cJSON_AddItemToObject(o, "memory", ledger_json(lg));
        cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)sbp_peak_rss_bytes());
        print_json(o);
        return;
    }
    printf("run       %s: step %lld of %d%s (%lld this session, %.2f s)\n", a->out,
           (long long)r->rs.step, a->o.steps, finished ? "" : ", stopped",
           (long long)(r->rs.step - start), secs);
    printf("loss      %.6f at step 1, %.6f at step %lld\n", l0, last_loss, (long long)r->rs.step);
    print_ledger(stdout, lg, "  ");
    printf("  peak RSS %.1f MiB\n", sbp_peak_rss_bytes() / 1048576.0);
    if (finished)
        printf("wrote     %s/%s, %s/loss.csv\n", a->out,
               r->has_lora ? "adapter_model.safetensors" : "model.safetensors", a->out);
    else
        printf("resume    with --resume %s/checkpoint-%lld\n", a->out, (long long)r->rs.step);
}

int cmd_train(int argc, char **argv) {
    train_args a;
    int rc = parse(&a, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    sbp_set_threads(a.o.threads);
    sbp_err err = {0};
    sbp_ledger lg = {0};
    sbp_train_run r;
    sbp_run_logs logs = {0};
    sbp_run_start begin;
    memset(&r, 0, sizeof r);
    /* under mpirun: each process runs its share of every step's micro-batches and applies the
     * same folded gradient (docs/distributed.md); rank 0 writes the run directory, the others a
     * private one they remove at the end, and print nothing */
    sbp_comm *comm = NULL;
    char scratch[4200] = "", follower_run[4300];
    if (sbp_comm_start(&comm, a.comm_timeout, &err)) return report_error("train", &err);
    if ((rc = dist_check_args(comm, "train", argc, argv, &err))) return rc;
    a.o.g.comm = comm;
    if (sbp_comm_rank(comm) > 0) {
        if (!dist_follower(scratch, sizeof scratch, follower_run, sizeof follower_run, &err))
            return dist_exit(comm, "train", &err);
        a.out = follower_run;
    }
    /* everything that can be checked before anything is written: the options against the output
     * directory, the checkpoint to resume from, the model, the reference model, the data */
    sbp_status st = sbp_rundir_start(&begin, a.out, a.resume, &err);
    const int talk = sbp_comm_rank(comm) == 0; /* rank 0 alone prints the notes */
    if (talk && begin.unverified)
        fprintf(stderr,
                "streambp train: note: %s lists no file hashes (written before "
                "checkpoints recorded them); its files are not verified\n",
                begin.ckpt);
    if (talk && !st) note_fast_chunks("train", &a.o.g, a.o.jsonl ? a.o.T : 0);
    if (talk && !st && begin.stale_logs)
        fprintf(stderr,
                "streambp train: note: %s holds the logs of a run that ended before its "
                "first checkpoint; starting afresh (they are replaced)\n",
                a.out);
    if (!st) st = sbp_train_run_open(&r, &a.o, begin.ckpt, &lg, &err);
    if (!st) st = sbp_rundir_open_logs(&logs, a.out, &r.rs, &err); /* from here on it writes */
    if (st) {
        sbp_rundir_close_logs(&logs);
        sbp_train_run_free(&r, &lg);
        if (scratch[0]) sbp_remove_tree(scratch);
        return dist_exit(comm, "train", &err);
    }
    sbp_ledger_keep_blocks(&lg); /* every step after the first reuses the first one's buffers */
    const int64_t start = r.rs.step, stop = a.stop_at ? a.stop_at : a.o.steps;
    if (talk) print_start(&a, &r, &lg, begin.ckpt); /* the data loader's notes among them */
    const double t_start = sbp_now_seconds();
    double last_loss = NAN;
    st = run_steps(&a, &r, &logs, stop, &last_loss, &lg, &err);
    const double secs = sbp_now_seconds() - t_start;
    const int finished = !st && r.rs.step == a.o.steps;
    if (finished) /* the final weights or adapter, in the run directory, as HF's save_model */
        st = sbp_train_save_trained(a.out, a.o.model, &r.m, r.has_lora ? &r.lora : NULL,
                                    r.config_json, r.rs.step, &err);
    if (!st && a.plot) draw_plot(a.out);
    if (!st) print_summary(&a, &r, start, finished, secs, last_loss, &lg);
    sbp_rundir_close_logs(&logs);
    sbp_train_run_free(&r, &lg);
    sbp_ledger_drop_blocks(&lg);
    if (scratch[0]) sbp_remove_tree(scratch); /* ours (mkdtemp) */
    return st ? dist_exit(comm, "train", &err)
              : (dist_report(comm, "train", lg.peak_total), sbp_comm_finish(comm), 0);
}
