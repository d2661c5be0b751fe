/* train.c — `streambp train`: AdamW training of a HF decoder's full weights, or of a LoRA
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
 *   loss.png                          with --plot, when gnuplot is installed */
#include "../core/err.h"
#include "../io/file.h"
#include "../io/json.h"
#include "../io/train_state.h"
#include "cli.h"
#include "objopts.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    "  --chunk N, --logit-chunk N, --chunked-logits   as for grad\n"
    "  --block N            token block (default 512); the gradient's bits depend on it\n"
    "  --threads N          OpenMP/OpenBLAS threads (default: all cores)\n"
    "output\n"
    "  --out DIR            run directory (created; must not hold another run)\n"
    "  --save-every N       write OUT/checkpoint-N every N steps (default 0: none)\n"
    "  --resume PATH        continue from a checkpoint directory, or from the newest\n"
    "                       checkpoint-N in a run directory, with the same settings\n"
    "  --stop-at N          stop after step N with a checkpoint (the schedule still spans\n"
    "                       --steps); resume later with --resume\n"
    "  --log-every N        progress line on stderr every N steps (default 1)\n"
    "  --plot               draw OUT/loss.png with gnuplot (skipped when it is not installed)\n"
    "  --json               print the summary as JSON\n"
    "\n";

/* snprintf for paths. Every path option is at most PATH_OPT_MAX characters (checked when
 * parsing) and every buffer leaves room for what is appended, so nothing is cut; going through
 * vsnprintf keeps the compiler from warning about lengths it cannot see. */
#define PATH_OPT_MAX 3000
static void pathf(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void pathf(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

#define MAX_DATA 64

typedef struct {
    const char *model, *out, *resume, *jsonl, *lora;
    const char *data[MAX_DATA];
    int n_data;
    int T, B, shuffle;
    unsigned long long seed;
    int steps, grad_accum, warmup, stop_at, save_every, log_every;
    sbp_lr_sched sched;
    sbp_adamw_opts adam;
    int no_decay_nb;
    double max_grad_norm;
    sbp_precision prec;
    sbp_grad_opts g;
    int threads, plot, json;
    obj_args obj;
} train_args;

enum {
    OPT_DATA = 2000,
    OPT_JSONL,
    OPT_SEQ,
    OPT_BATCH_SIZE,
    OPT_SHUFFLE,
    OPT_SEED,
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
    OPT_SCHEDULE,
    OPT_CHUNK,
    OPT_LOGIT_CHUNK,
    OPT_CHUNKED_LOGITS,
    OPT_BLOCK,
    OPT_THREADS,
    OPT_MODEL,
    OPT_OUT,
    OPT_SAVE_EVERY,
    OPT_RESUME,
    OPT_STOP_AT,
    OPT_LOG_EVERY,
    OPT_PLOT,
    OPT_JSON,
    OPT_LORA,
    OPT_HELP
};

static int nonneg_int(const char *opt, const char *text, int *out) {
    if (strcmp(text, "0") == 0) {
        *out = 0;
        return 1;
    }
    return parse_pos_int("train", opt, text, out);
}

static int parse(train_args *a, int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, OPT_MODEL},
                                         {"data", required_argument, 0, OPT_DATA},
                                         {"jsonl", required_argument, 0, OPT_JSONL},
                                         {"seq", required_argument, 0, OPT_SEQ},
                                         {"batch-size", required_argument, 0, OPT_BATCH_SIZE},
                                         {"shuffle", no_argument, 0, OPT_SHUFFLE},
                                         {"seed", required_argument, 0, OPT_SEED},
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
                                         {"schedule", required_argument, 0, OPT_SCHEDULE},
                                         {"chunk", required_argument, 0, OPT_CHUNK},
                                         {"logit-chunk", required_argument, 0, OPT_LOGIT_CHUNK},
                                         {"chunked-logits", no_argument, 0, OPT_CHUNKED_LOGITS},
                                         {"block", required_argument, 0, OPT_BLOCK},
                                         {"threads", required_argument, 0, OPT_THREADS},
                                         {"out", required_argument, 0, OPT_OUT},
                                         {"save-every", required_argument, 0, OPT_SAVE_EVERY},
                                         {"resume", required_argument, 0, OPT_RESUME},
                                         {"stop-at", required_argument, 0, OPT_STOP_AT},
                                         {"log-every", required_argument, 0, OPT_LOG_EVERY},
                                         {"plot", no_argument, 0, OPT_PLOT},
                                         {"json", no_argument, 0, OPT_JSON},
                                         {"lora", required_argument, 0, OPT_LORA},
                                         {"help", no_argument, 0, OPT_HELP},
                                         OBJ_LONG_OPTIONS,
                                         {0, 0, 0, 0}};
    memset(a, 0, sizeof *a);
    obj_args_init(&a->obj);
    a->B = 1, a->seed = 42, a->grad_accum = 1, a->log_every = 1;
    a->sched = (sbp_lr_sched){.kind = SBP_LR_COSINE, .lr = 5e-5};
    a->adam = (sbp_adamw_opts){.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0};
    a->max_grad_norm = 1.0;
    a->g.schedule = SBP_STREAM;
    a->threads = omp_get_num_procs();
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int ok = 1;
        switch (c) {
        case OPT_MODEL: a->model = optarg; break;
        case OPT_DATA:
            if (a->n_data == MAX_DATA) {
                fprintf(stderr, "streambp train: at most %d --data paths\n", MAX_DATA);
                return EXIT_USAGE;
            }
            a->data[a->n_data++] = optarg;
            break;
        case OPT_JSONL: a->jsonl = optarg; break;
        case OPT_SEQ: ok = parse_pos_int("train", "seq", optarg, &a->T); break;
        case OPT_BATCH_SIZE: ok = parse_pos_int("train", "batch-size", optarg, &a->B); break;
        case OPT_SHUFFLE: a->shuffle = 1; break;
        case OPT_SEED:
            if (!parse_seed_opt("train", "seed", optarg, &a->seed)) return EXIT_USAGE;
            break;
        case OPT_STEPS: ok = parse_pos_int("train", "steps", optarg, &a->steps); break;
        case OPT_GRAD_ACCUM:
            ok = parse_pos_int("train", "grad-accum", optarg, &a->grad_accum);
            break;
        case OPT_LR: ok = parse_number("train", "lr", optarg, 0, &a->sched.lr); break;
        case OPT_LR_SCHED:
            if (!sbp_lr_kind_parse(optarg, &a->sched.kind)) {
                fprintf(stderr,
                        "streambp train: --lr-scheduler must be cosine, linear or constant, got "
                        "\"%s\"\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        case OPT_WARMUP: ok = nonneg_int("warmup-steps", optarg, &a->warmup); break;
        case OPT_BETA1: ok = parse_number("train", "beta1", optarg, 0, &a->adam.beta1); break;
        case OPT_BETA2: ok = parse_number("train", "beta2", optarg, 0, &a->adam.beta2); break;
        case OPT_EPS: ok = parse_number("train", "eps", optarg, 0, &a->adam.eps); break;
        case OPT_WD:
            ok = parse_number("train", "weight-decay", optarg, 0, &a->adam.weight_decay);
            break;
        case OPT_NO_DECAY: a->no_decay_nb = 1; break;
        case OPT_MAX_NORM:
            ok = parse_number("train", "max-grad-norm", optarg, 0, &a->max_grad_norm);
            break;
        case OPT_PRECISION:
            if (strcmp(optarg, "bf16") == 0) {
                fprintf(stderr, "streambp train: --precision bf16 is not a training precision here "
                                "(fp32 or fp64)\n");
                return EXIT_USAGE;
            }
            ok = parse_precision("train", optarg, &a->prec);
            break;
        case OPT_SCHEDULE:
            if (!sbp_schedule_parse(optarg, &a->g.schedule)) {
                fprintf(stderr,
                        "streambp train: --schedule must be full, ckpt or stream, got \"%s\"\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        case OPT_CHUNK: ok = parse_pos_int("train", "chunk", optarg, &a->g.chunk); break;
        case OPT_LOGIT_CHUNK:
            ok = parse_pos_int("train", "logit-chunk", optarg, &a->g.logit_chunk);
            break;
        case OPT_CHUNKED_LOGITS: a->g.chunked_logits = 1; break;
        case OPT_BLOCK: ok = parse_pos_int("train", "block", optarg, &a->g.block); break;
        case OPT_THREADS: ok = parse_pos_int("train", "threads", optarg, &a->threads); break;
        case OPT_OUT: a->out = optarg; break;
        case OPT_SAVE_EVERY: ok = nonneg_int("save-every", optarg, &a->save_every); break;
        case OPT_RESUME: a->resume = optarg; break;
        case OPT_STOP_AT: ok = parse_pos_int("train", "stop-at", optarg, &a->stop_at); break;
        case OPT_LOG_EVERY: ok = parse_pos_int("train", "log-every", optarg, &a->log_every); break;
        case OPT_PLOT: a->plot = 1; break;
        case OPT_JSON: a->json = 1; break;
        case OPT_LORA: a->lora = optarg; break;
        case OPT_HELP: printf("%s%s", usage, obj_usage); return -1;
        default:
            if (c >= OBJ_OPT_OBJECTIVE && c <= OBJ_OPT_REF_MODEL) {
                ok = obj_args_option(&a->obj, "train", c, optarg);
                break;
            }
            fputs(usage, stderr);
            return EXIT_USAGE;
        }
        if (!ok) return EXIT_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, "streambp train: unexpected argument \"%s\"\n", argv[optind]);
        return EXIT_USAGE;
    }
    if (!a->model || !a->out || !a->steps || (!a->n_data && !a->jsonl)) {
        fprintf(stderr,
                "streambp train: --model, --data or --jsonl, --out and --steps are "
                "required\n%s",
                usage);
        return EXIT_USAGE;
    }
    const char *paths[MAX_DATA + 6] = {a->model,         a->out,  a->resume,
                                       a->obj.ref_model, a->lora, a->jsonl};
    for (int i = 0; i < a->n_data; i++) paths[6 + i] = a->data[i];
    for (int i = 0; i < 6 + a->n_data; i++)
        if (paths[i] && strlen(paths[i]) > PATH_OPT_MAX) {
            fprintf(stderr, "streambp train: a path longer than %d characters: %.60s...\n",
                    PATH_OPT_MAX, paths[i]);
            return EXIT_USAGE;
        }
    if (a->n_data && a->jsonl) {
        fprintf(stderr, "streambp train: give --data or --jsonl, not both\n");
        return EXIT_USAGE;
    }
    if (a->jsonl && !a->T) {
        fprintf(stderr, "streambp train: --jsonl needs --seq T (tokens per row)\n");
        return EXIT_USAGE;
    }
    if (!a->jsonl && (a->T || a->B != 1)) {
        fprintf(stderr, "streambp train: --seq and --batch-size apply to --jsonl data (a batch "
                        "file has its own shape)\n");
        return EXIT_USAGE;
    }
    if (a->stop_at > a->steps) {
        fprintf(stderr, "streambp train: --stop-at %d is after the last step (--steps %d)\n",
                a->stop_at, a->steps);
        return EXIT_USAGE;
    }
    if (!obj_args_finish(&a->obj, "train")) return EXIT_USAGE;
    sbp_err err = {0};
    if (sbp_adamw_check(&a->adam, &err)) {
        fprintf(stderr, "streambp train: %s (--beta1, --beta2, --eps, --weight-decay)\n", err.msg);
        return EXIT_USAGE;
    }
    a->sched.warmup = a->warmup, a->sched.total = a->steps;
    a->g.objective = a->obj.obj;
    return 0;
}

/* ---- the run's settings: what a resumed run must share with the run it continues ---------- */

enum { MAX_SETTINGS = 48 };
typedef struct {
    const char *key[MAX_SETTINGS];
    char val[MAX_SETTINGS][160];
    int n;
} settings;

static void set_str(settings *s, const char *key, const char *v) {
    s->key[s->n] = key;
    snprintf(s->val[s->n++], sizeof s->val[0], "%s", v);
}
static void set_num(settings *s, const char *key, double v) {
    char t[40];
    snprintf(t, sizeof t, "%.17g", v);
    set_str(s, key, t);
}
static void set_hash(settings *s, const char *key, uint64_t h) {
    char t[20];
    snprintf(t, sizeof t, "%016" PRIx64, h);
    set_str(s, key, t);
}

static void describe_model(char *buf, size_t n, const sbp_config *c) {
    snprintf(buf, n, "%s L=%d C=%d F=%d heads %d/%d head_dim %d V=%d%s%s%s", c->model_type,
             c->layers, c->hidden, c->ffn, c->heads, c->kv_heads, c->head_dim, c->vocab,
             c->tied ? " tied" : "", c->qkv_bias ? " qkv-bias" : "", c->qk_norm ? " qk-norm" : "");
}

/* An adapter's configuration as a setting: what makes two adapters interchangeable. */
static void describe_lora(char *buf, size_t n, const sbp_lora_config *c) {
    static const char *const names[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                        "gate_proj", "up_proj", "down_proj"};
    int k = snprintf(buf, n, "r %d, alpha %.17g, use_rslora %d, targets", c->r, c->alpha,
                     c->use_rslora);
    for (int i = 0; i < 7 && k > 0 && (size_t)k < n; i++)
        if (c->targets & (1u << i)) k += snprintf(buf + k, n - (size_t)k, " %s", names[i]);
}

/* The settings of a run; a LoRA run (lora non-NULL) adds the adapter's configuration and a hash
 * of its initial tensors after the model's (a full-weight run writes exactly the settings it
 * wrote before adapters existed, so its older checkpoints still resume). */
static void build_settings(settings *s, const train_args *a, const sbp_model *m, uint64_t w_hash,
                           const sbp_lora *lora, uint64_t lora_hash, const sbp_data *d,
                           uint64_t ref_hash) {
    char desc[160];
    const sbp_objective *o = &a->g.objective;
    s->n = 0;
    describe_model(desc, sizeof desc, &m->cfg);
    set_str(s, "model", desc);
    set_str(s, "precision", a->prec == SBP_FP64 ? "fp64" : "fp32");
    set_hash(s, "initial_weights", w_hash);
    if (lora) {
        describe_lora(desc, sizeof desc, &lora->cfg);
        set_str(s, "lora", desc);
        set_hash(s, "initial_adapter", lora_hash);
    }
    set_str(s, "objective", obj_kind_name(o->kind));
    set_str(s, "loss_type", obj_loss_name(o));
    set_num(s, "beta", o->beta);
    set_num(s, "label_smoothing", o->label_smoothing);
    set_num(s, "epsilon_low", o->epsilon_low);
    set_num(s, "epsilon_high", o->epsilon_high);
    set_num(s, "temperature", o->temperature);
    set_num(s, "max_completion_length", o->max_completion_length);
    set_num(s, "scale_rewards", a->obj.scale_rewards);
    if (a->obj.ref_model)
        set_hash(s, "reference_model", ref_hash);
    else
        set_str(s, "reference_model", "none");
    set_str(s, "data", a->jsonl ? "jsonl" : "batch files");
    set_hash(s, "data_contents", sbp_data_hash(d));
    set_num(s, "data_items", (double)sbp_data_items(d));
    set_num(s, "seq", a->T);
    set_num(s, "batch_size", a->jsonl ? a->B : 1);
    set_num(s, "shuffle", a->shuffle);
    set_num(s, "seed", (double)a->seed);
    set_num(s, "steps", a->steps);
    set_num(s, "grad_accum", a->grad_accum);
    set_num(s, "lr", a->sched.lr);
    set_str(s, "lr_scheduler", sbp_lr_kind_name(a->sched.kind));
    set_num(s, "warmup_steps", a->warmup);
    set_num(s, "beta1", a->adam.beta1);
    set_num(s, "beta2", a->adam.beta2);
    set_num(s, "eps", a->adam.eps);
    set_num(s, "weight_decay", a->adam.weight_decay);
    set_num(s, "no_decay_norms_biases", a->no_decay_nb);
    set_num(s, "max_grad_norm", a->max_grad_norm);
    set_num(s, "block", a->g.block ? a->g.block : SBP_DEFAULT_BLOCK);
}

/* How a setting is named in messages: the option that sets it, or what it is. */
static const char *setting_label(const char *key) {
    static const char *const labels[][2] = {
        {"model", "the model (config.json)"},
        {"precision", "--precision"},
        {"initial_weights", "initial weights (hash of --model's weights)"},
        {"lora", "the LoRA adapter (--lora: its adapter_config.json)"},
        {"initial_adapter", "initial adapter (hash of --lora's tensors)"},
        {"objective", "--objective"},
        {"loss_type", "--loss-type"},
        {"beta", "--beta"},
        {"label_smoothing", "--label-smoothing"},
        {"epsilon_low", "--epsilon-low"},
        {"epsilon_high", "--epsilon-high"},
        {"temperature", "--temperature"},
        {"max_completion_length", "--max-completion-length"},
        {"scale_rewards", "reward scaling (--no-scale-rewards)"},
        {"reference_model", "reference model (hash of --ref-model's weights)"},
        {"data", "the kind of data (--data or --jsonl)"},
        {"data_contents", "data contents (hash of the files, in order)"},
        {"data_items", "data items (batch files or records)"},
        {"seq", "--seq"},
        {"batch_size", "--batch-size"},
        {"shuffle", "--shuffle"},
        {"seed", "--seed"},
        {"steps", "--steps"},
        {"grad_accum", "--grad-accum"},
        {"lr", "--lr"},
        {"lr_scheduler", "--lr-scheduler"},
        {"warmup_steps", "--warmup-steps"},
        {"beta1", "--beta1"},
        {"beta2", "--beta2"},
        {"eps", "--eps"},
        {"weight_decay", "--weight-decay"},
        {"no_decay_norms_biases", "--no-decay-norms-biases"},
        {"max_grad_norm", "--max-grad-norm"},
        {"block", "--block"}};
    for (size_t i = 0; i < sizeof labels / sizeof labels[0]; i++)
        if (strcmp(labels[i][0], key) == 0) return labels[i][1];
    return key;
}

static uint64_t settings_hash(const settings *s) {
    uint64_t h = 0;
    for (int i = 0; i < s->n; i++) {
        h = sbp_hash64(s->key[i], strlen(s->key[i]) + 1, h);
        h = sbp_hash64(s->val[i], strlen(s->val[i]) + 1, h);
    }
    return h;
}

/* ---- the state of a run between steps -------------------------------------------------------- */

typedef struct {
    int64_t step, tokens;
    sbp_sampler sampler;
    char *loss_csv, *timing_csv; /* the logs so far, as written */
    size_t loss_len, loss_cap, timing_len, timing_cap;
} run_state;

static int append(char **buf, size_t *len, size_t *cap, const char *text) {
    size_t n = strlen(text);
    if (*len + n + 1 > *cap) {
        size_t nc = (*cap ? *cap * 2 : 4096) + n;
        char *nb = realloc(*buf, nc);
        if (!nb) return 0;
        *buf = nb, *cap = nc;
    }
    memcpy(*buf + *len, text, n + 1);
    *len += n;
    return 1;
}

static const char loss_header[] = "step,epoch,loss,lr,grad_norm,targets,tokens\n";
static const char timing_header[] =
    "step,seconds,tokens_per_second,ledger_peak_bytes,rss_peak_bytes\n";

/* ---- the output directory -------------------------------------------------------------------- */

static int is_dir(const char *p) {
    struct stat sb;
    return lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}
static int is_file(const char *p) {
    struct stat sb;
    return lstat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Whether dir holds a training run (anything a run writes). */
static const char *holds_run(const char *dir) {
    /* the logs alone are not a run to keep: a run that died before its first checkpoint leaves
     * only them, and a fresh run starts over (prepare says so) */
    static const char *const files[] = {"model.safetensors", "trainer_state.json",
                                        "adapter_model.safetensors"};
    char p[4200];
    for (int i = 0; i < 3; i++) {
        pathf(p, sizeof p, "%s/%s", dir, files[i]);
        if (is_file(p)) return files[i];
    }
    DIR *dp = opendir(dir);
    const char *found = NULL;
    if (dp) {
        struct dirent *e;
        while ((e = readdir(dp)) && !found)
            if (sbp_checkpoint_number(e->d_name) >= 0) found = "checkpoint directories";
        closedir(dp);
    }
    return found;
}

/* The checkpoint of --resume, verified (sbp_checkpoint_resume_point). */
static sbp_status resume_point(char *ckpt, size_t n, const char *path, sbp_err *err) {
    int recorded;
    sbp_status st = sbp_checkpoint_resume_point(ckpt, n, path, &recorded, err);
    if (!st && !recorded)
        fprintf(stderr,
                "streambp train: note: %s lists no file hashes (written before "
                "checkpoints recorded them); its files are not verified\n",
                ckpt);
    return st;
}

static int mkdir_p(const char *dir) {
    char p[4096];
    pathf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
            *s = '/';
        }
    return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* ---- checkpoints ----------------------------------------------------------------------------- */

static cJSON *state_json(const train_args *a, const run_state *rs, const settings *s,
                         cJSON *files) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "streambp-train-1");
    cJSON_AddNumberToObject(o, "step", (double)rs->step);
    cJSON_AddNumberToObject(o, "tokens", (double)rs->tokens);
    cJSON *data = cJSON_AddObjectToObject(o, "data_position");
    cJSON_AddNumberToObject(data, "epoch", (double)rs->sampler.epoch);
    cJSON_AddNumberToObject(data, "item", (double)rs->sampler.pos);
    cJSON *rng = cJSON_AddArrayToObject(data, "rng_at_epoch_start");
    for (int i = 0; i < 4; i++) {
        char h[20];
        snprintf(h, sizeof h, "%016" PRIx64, rs->sampler.rng[i]);
        cJSON_AddItemToArray(rng, cJSON_CreateString(h));
    }
    cJSON *set = cJSON_AddObjectToObject(o, "settings");
    for (int i = 0; i < s->n; i++) cJSON_AddStringToObject(set, s->key[i], s->val[i]);
    char h[20];
    snprintf(h, sizeof h, "%016" PRIx64, settings_hash(s));
    cJSON_AddStringToObject(o, "settings_hash", h);
    /* how this part of the run was made; free to differ on resume */
    cJSON *run = cJSON_AddObjectToObject(o, "run");
    cJSON_AddStringToObject(run, "model", a->model);
    if (a->lora) cJSON_AddStringToObject(run, "lora", a->lora);
    if (a->jsonl)
        cJSON_AddStringToObject(run, "jsonl", a->jsonl);
    else
        cJSON_AddItemToObject(run, "data", cJSON_CreateStringArray(a->data, a->n_data));
    cJSON_AddStringToObject(run, "schedule", sbp_schedule_name(a->g.schedule));
    cJSON_AddNumberToObject(run, "chunk", a->g.chunk);
    cJSON_AddNumberToObject(run, "logit_chunk", a->g.logit_chunk);
    cJSON_AddBoolToObject(run, "chunked_logits", a->g.chunked_logits);
    cJSON_AddNumberToObject(run, "threads", a->threads);
    cJSON_AddStringToObject(run, "implementation", "streambp " SBP_VERSION);
    /* the SHA-256 of every other file of the checkpoint: resume checks them
     * (sbp_checkpoint_verify) */
    cJSON_AddItemToObject(o, "files", files);
    return o;
}

/* The SHA-256 of every file in the directory being written (ours, from mkdtemp), as a JSON
 * object name -> hex; NULL with err set on failure. */
static cJSON *hash_files(const sbp_outdir *d, sbp_err *err) {
    static const char *const names[] = {"config.json",
                                        "model.safetensors",
                                        "adapter_config.json",
                                        "adapter_model.safetensors",
                                        "optimizer.safetensors",
                                        "loss.csv",
                                        "timing.csv"};
    cJSON *files = cJSON_CreateObject();
    char p[4300], hex[65];
    for (size_t i = 0; files && i < sizeof names / sizeof *names; i++) {
        struct stat sb;
        if (lstat(sbp_outdir_file(d, names[i], p, sizeof p), &sb) != 0) continue;
        if (sbp_file_sha256(hex, p, err)) {
            cJSON_Delete(files);
            return NULL;
        }
        cJSON_AddStringToObject(files, names[i], hex);
    }
    if (!files) sbp_fail(err, SBP_ENOMEM, "out of memory");
    return files;
}

/* What the run trains, as a checkpoint writes it: the model's files (config.json,
 * model.safetensors), or with an adapter its directory in peft's layout. */
static sbp_status save_trained(const char *dir, const train_args *a, const sbp_model *m,
                               const sbp_lora *lora, const char *config_json, int64_t step,
                               sbp_err *err) {
    if (lora) return sbp_lora_save(dir, lora, a->model, err); /* refuses non-finite tensors */
    /* a step that left a non-finite weight fails here instead of writing it */
    for (int i = 0; i < m->params.n; i++) {
        const sbp_param *p = &m->params.p[i];
        for (int64_t j = 0; j < p->numel; j++) {
            const double v = m->prec == SBP_FP64 ? ((const double *)m->w)[p->offset + j]
                                                 : ((const float *)m->w)[p->offset + j];
            if (!isfinite(v))
                return sbp_fail(err, SBP_ENUMERIC,
                                "step %lld: weight \"%s\" element %lld is %g; not saved",
                                (long long)step, p->name, (long long)j, v);
        }
    }
    char stepv[32];
    snprintf(stepv, sizeof stepv, "%lld", (long long)step);
    const char *meta[] = {"format", "pt", "generator", "streambp train", "step", stepv, NULL};
    return sbp_model_save_files(dir, m, config_json, meta, err);
}

static sbp_status save_checkpoint(const train_args *a, const run_state *rs, const settings *s,
                                  const sbp_model *m, const sbp_lora *lora, const char *config_json,
                                  const sbp_adamw *opt, char *where, size_t where_n, sbp_err *err) {
    pathf(where, where_n, "%s/checkpoint-%lld", a->out, (long long)rs->step);
    sbp_outdir d;
    sbp_status st = sbp_outdir_open(&d, where, err);
    if (st) return st;
    char p[4300];
    st = save_trained(d.tmp, a, m, lora, config_json, rs->step, err);
    if (!st)
        st = sbp_adamw_save(sbp_outdir_file(&d, "optimizer.safetensors", p, sizeof p), opt,
                            lora ? &lora->params : &m->params, err);
    if (!st)
        st = sbp_write_atomic(sbp_outdir_file(&d, "loss.csv", p, sizeof p), rs->loss_csv,
                              rs->loss_len, err);
    if (!st)
        st = sbp_write_atomic(sbp_outdir_file(&d, "timing.csv", p, sizeof p), rs->timing_csv,
                              rs->timing_len, err);
    cJSON *files = st ? NULL : hash_files(&d, err);
    if (!st && !files) st = err->status ? err->status : SBP_ENOMEM;
    if (!st) {
        cJSON *o = state_json(a, rs, s, files);
        char *text = cJSON_Print(o);
        cJSON_Delete(o);
        if (!text)
            st = sbp_fail(err, SBP_ENOMEM, "out of memory");
        else {
            st = sbp_write_atomic(sbp_outdir_file(&d, "trainer_state.json", p, sizeof p), text,
                                  strlen(text), err);
            free(text);
        }
    }
    if (st) {
        sbp_outdir_abort(&d);
        return st;
    }
    return sbp_outdir_commit(&d, err);
}

/* Reads a checkpoint's state and checks it belongs to this run; fills rs (logs, step, data
 * position). Nothing is written. */
static sbp_status read_checkpoint(run_state *rs, const char *ckpt, const settings *s,
                                  sbp_err *err) {
    char p[4300], *text = NULL;
    size_t n = 0;
    sbp_train_state ts;
    pathf(p, sizeof p, "%s/trainer_state.json", ckpt);
    sbp_status st = sbp_read_text(&text, &n, p, 16u << 20, err);
    if (!st) st = sbp_train_state_parse(&ts, text, n, p, err);
    free(text);
    if (st) return st;
    const cJSON *set = ts.settings;
    /* a full-weight run and an adapter's are told apart first: their settings differ in kind */
    const char *their_lora = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(set, "lora"));
    int ours_lora = 0;
    for (int i = 0; i < s->n; i++) ours_lora |= strcmp(s->key[i], "lora") == 0;
    if (their_lora && !ours_lora)
        st = sbp_fail(err, SBP_EINPUT,
                      "--resume %s: the checkpoint's run trains a LoRA adapter (%s); this run "
                      "trains the full weights. Give --lora with the adapter that run started from",
                      ckpt, their_lora);
    else if (!their_lora && ours_lora)
        st = sbp_fail(err, SBP_EINPUT,
                      "--resume %s: the checkpoint's run trains the full weights; this run a LoRA "
                      "adapter (--lora). Resume it without --lora",
                      ckpt);
    /* every setting must be the same; name the first that is not */
    for (int i = 0; i < s->n && !st; i++) {
        const char *theirs = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(set, s->key[i]));
        if (!theirs || strcmp(theirs, s->val[i]) != 0)
            st = sbp_fail(err, SBP_EINPUT,
                          "--resume %s: the checkpoint's run has %s = %s, this run %s. A run "
                          "resumes with the settings it started with; only --schedule, --chunk, "
                          "--logit-chunk, --chunked-logits, --threads, --save-every, --stop-at, "
                          "--log-every, --plot and --json may change",
                          ckpt, setting_label(s->key[i]), theirs ? theirs : "(missing)", s->val[i]);
    }
    if (!st && cJSON_GetArraySize(set) != s->n)
        st = sbp_fail(err, SBP_EINPUT,
                      "--resume %s: the checkpoint's settings hold %d entries, "
                      "this version writes %d",
                      ckpt, cJSON_GetArraySize(set), s->n);
    if (!st) {
        rs->step = ts.step;
        rs->tokens = ts.tokens;
        st = sbp_sampler_restore(&rs->sampler, ts.epoch, ts.item, ts.rng, err);
        if (st) sbp_fail_prefix(err, "%s: ", p);
    }
    sbp_train_state_free(&ts);
    /* the logs up to this step */
    char *csv = NULL;
    if (!st) {
        pathf(p, sizeof p, "%s/loss.csv", ckpt);
        if (!(st = sbp_read_text(&csv, NULL, p, 1u << 30, err))) {
            rs->loss_len = rs->loss_cap = 0;
            free(rs->loss_csv);
            rs->loss_csv = NULL;
            if (!append(&rs->loss_csv, &rs->loss_len, &rs->loss_cap, csv))
                st = sbp_fail(err, SBP_ENOMEM, "out of memory");
            free(csv);
        }
    }
    if (!st) {
        pathf(p, sizeof p, "%s/timing.csv", ckpt);
        if (!(st = sbp_read_text(&csv, NULL, p, 1u << 30, err))) {
            rs->timing_len = rs->timing_cap = 0;
            free(rs->timing_csv);
            rs->timing_csv = NULL;
            if (!append(&rs->timing_csv, &rs->timing_len, &rs->timing_cap, csv))
                st = sbp_fail(err, SBP_ENOMEM, "out of memory");
            free(csv);
        }
    }
    return st;
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

static int64_t real_tokens(const sbp_batch *b) {
    int64_t n = 0;
    for (size_t i = 0; i < (size_t)b->B * b->T; i++) n += b->mask[i] != 0;
    return n;
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

typedef struct {
    sbp_model m, ref;
    sbp_lora lora; /* with --lora: the adapter being trained */
    int has_ref, has_lora;
    sbp_data *data;
    sbp_adamw opt;
    run_state rs;
    char *config_json;
    FILE *loss_f, *timing_f;
    sbp_batch *mb;
    int64_t *items;
} train_run;

static void run_free(train_run *r, int accum, sbp_ledger *lg) {
    if (r->loss_f) fclose(r->loss_f);
    if (r->timing_f) fclose(r->timing_f);
    if (r->mb)
        for (int i = 0; i < accum; i++) sbp_batch_free(&r->mb[i]);
    free(r->mb), free(r->items);
    sbp_adamw_free(&r->opt, lg);
    sbp_sampler_free(&r->rs.sampler);
    free(r->rs.loss_csv), free(r->rs.timing_csv);
    sbp_data_free(r->data);
    if (r->has_ref) sbp_model_free(&r->ref, lg);
    if (r->has_lora) sbp_lora_free(&r->lora, lg);
    if (r->m.w) sbp_model_free(&r->m, lg);
    free(r->config_json);
}

/* Everything that can be checked before anything is written: options against the output
 * directory, the model, the reference model, the data, and a checkpoint to resume from. */
static sbp_status prepare(train_run *r, const train_args *a, settings *s, char *ckpt, size_t ckpt_n,
                          sbp_ledger *lg, sbp_err *err) {
    struct stat sb;
    if (stat(a->out, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return sbp_fail(err, SBP_EIO, "--out %s: exists and is not a directory", a->out);
    sbp_status st;
    if (a->resume && (st = resume_point(ckpt, ckpt_n, a->resume, err))) return st;
    const char *found = is_dir(a->out) ? holds_run(a->out) : NULL;
    if (found && !a->resume)
        return sbp_fail(err, SBP_EINPUT,
                        "--out %s already holds a training run (%s); continue it with --resume "
                        "%s, or give another --out",
                        a->out, found, a->out);
    if (found) { /* only the checkpoint's own run directory may be continued in place */
        char parent[4200], rp_out[PATH_MAX], rp_parent[PATH_MAX];
        pathf(parent, sizeof parent, "%s/..", ckpt);
        if (!realpath(a->out, rp_out) || !realpath(parent, rp_parent) ||
            strcmp(rp_out, rp_parent) != 0)
            return sbp_fail(err, SBP_EINPUT,
                            "--out %s holds another training run (%s) than the checkpoint %s; "
                            "resume into the checkpoint's run directory or an empty one",
                            a->out, found, ckpt);
    }
    char p[4200];
    pathf(p, sizeof p, "%s/loss.csv", a->out);
    if (!found && !a->resume && is_file(p))
        fprintf(stderr,
                "streambp train: note: %s holds the logs of a run that ended before its "
                "first checkpoint; starting afresh (they are replaced)\n",
                a->out);
    pathf(p, sizeof p, "%s/config.json", a->model);
    st = sbp_model_load(&r->m, a->model, a->prec, lg, err);
    if (!st) st = sbp_read_text(&r->config_json, NULL, p, 16u << 20, err);
    if (st) return st;
    size_t esz = a->prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    uint64_t w_hash = sbp_hash64(r->m.w, esz * (size_t)r->m.params.total, 0), ref_hash = 0;
    uint64_t lora_hash = 0;
    if (a->lora) { /* checked against the model: targets, rank and every shape */
        if ((st = sbp_lora_load(&r->lora, a->lora, &r->m.cfg, a->prec, lg, err))) return st;
        r->has_lora = 1;
        lora_hash = sbp_hash64(r->lora.w, esz * (size_t)r->lora.params.total, 0);
    }
    if (a->obj.ref_model) {
        if ((st = sbp_model_load(&r->ref, a->obj.ref_model, a->prec, lg, err))) return st;
        r->has_ref = 1;
        if (r->ref.cfg.vocab != r->m.cfg.vocab)
            return sbp_fail(err, SBP_EINPUT,
                            "%s: the reference model's vocabulary (%d) differs from the "
                            "policy's (%d)",
                            a->obj.ref_model, r->ref.cfg.vocab, r->m.cfg.vocab);
        ref_hash = sbp_hash64(r->ref.w, esz * (size_t)r->ref.params.total, 0);
    }
    sbp_data_opts dopt = {.paths = a->data,
                          .n_paths = a->n_data,
                          .jsonl = a->jsonl,
                          .T = a->T,
                          .B = a->B,
                          .objective = a->g.objective,
                          .scale_rewards = a->obj.scale_rewards,
                          .reference_model = a->obj.ref_model != NULL};
    if ((st = sbp_data_open(&r->data, &dopt, &r->m.cfg, err))) return st;
    build_settings(s, a, &r->m, w_hash, r->has_lora ? &r->lora : NULL, lora_hash, r->data,
                   ref_hash);
    int per = sbp_data_items_per_batch(r->data);
    r->mb = calloc((size_t)a->grad_accum, sizeof *r->mb);
    r->items = calloc((size_t)per, sizeof *r->items);
    if (!r->mb || !r->items) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    if ((st = sbp_sampler_init(&r->rs.sampler, sbp_data_items(r->data), per, a->shuffle, a->seed,
                               err)))
        return st;
    /* the trainable slab: the weights, or the adapter's tensors */
    const sbp_params *tps = r->has_lora ? &r->lora.params : &r->m.params;
    if ((st = sbp_adamw_init(&r->opt, &a->adam, a->prec, tps->total, lg, err))) return st;
    if (a->no_decay_nb) {
        sbp_range *nd;
        int nn;
        if ((st = sbp_params_no_decay(&nd, &nn, tps, err))) return st;
        st = sbp_adamw_exclude_decay(&r->opt, nd, nn, err);
        free(nd);
        if (st) return st;
    }
    if (!a->resume) {
        if (!append(&r->rs.loss_csv, &r->rs.loss_len, &r->rs.loss_cap, loss_header) ||
            !append(&r->rs.timing_csv, &r->rs.timing_len, &r->rs.timing_cap, timing_header))
            return sbp_fail(err, SBP_ENOMEM, "out of memory");
        return SBP_OK;
    }
    /* resume: the settings, the logs and the data position, then the weights and moments */
    if ((st = read_checkpoint(&r->rs, ckpt, s, err))) return st;
    if (r->rs.step > a->steps)
        return sbp_fail(err, SBP_EINPUT,
                        "--resume %s: the checkpoint is at step %lld, after --steps %d", ckpt,
                        (long long)r->rs.step, a->steps);
    if (r->has_lora) { /* the frozen model is --model's (its hash matched); the adapter the
                        * checkpoint's */
        const sbp_lora_config c0 = r->lora.cfg;
        sbp_lora_free(&r->lora, lg);
        r->has_lora = 0;
        if ((st = sbp_lora_load(&r->lora, ckpt, &r->m.cfg, a->prec, lg, err))) return st;
        r->has_lora = 1;
        const sbp_lora_config *c1 = &r->lora.cfg;
        if (c1->r != c0.r || c1->alpha != c0.alpha || c1->use_rslora != c0.use_rslora ||
            c1->targets != c0.targets)
            return sbp_fail(err, SBP_EINPUT,
                            "%s/adapter_config.json: the adapter is not the one the run trains "
                            "(r, lora_alpha, use_rslora or target_modules differ from --lora %s)",
                            ckpt, a->lora);
        tps = &r->lora.params;
    } else {
        sbp_model_free(&r->m, lg);
        if ((st = sbp_model_load(&r->m, ckpt, a->prec, lg, err))) return st;
        tps = &r->m.params;
    }
    if (tps->total != r->opt.n)
        return sbp_fail(
            err, SBP_EINPUT, "%s: the checkpoint's %s has %lld parameters, this run's %lld", ckpt,
            r->has_lora ? "adapter" : "model", (long long)tps->total, (long long)r->opt.n);
    pathf(p, sizeof p, "%s/optimizer.safetensors", ckpt);
    if ((st = sbp_adamw_load(&r->opt, p, tps, err))) return st;
    if (r->opt.step != r->rs.step)
        return sbp_fail(err, SBP_EINPUT,
                        "%s: the optimizer is at step %lld, the trainer state at %lld", ckpt,
                        (long long)r->opt.step, (long long)r->rs.step);
    return SBP_OK;
}

/* A log just written in place, opened for appending: never through a symbolic link (one planted
 * there after the write is refused, not followed), a regular file only. */
static FILE *open_append(const char *path) {
    int fd = open(path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (fd >= 0) close(fd), errno = EINVAL;
        return NULL;
    }
    FILE *f = fdopen(fd, "ab");
    if (!f) close(fd);
    return f;
}

/* Creates the output directory and the two logs (fresh, or as the checkpoint had them). */
static sbp_status open_logs(train_run *r, const train_args *a, sbp_err *err) {
    if (mkdir_p(a->out) != 0)
        return sbp_fail(err, SBP_EIO, "--out %s: cannot create the directory: %s", a->out,
                        strerror(errno));
    sbp_remove_stale(a->out);
    char p[4200];
    pathf(p, sizeof p, "%s/loss.csv", a->out);
    sbp_status st = sbp_write_atomic(p, r->rs.loss_csv, r->rs.loss_len, err);
    if (!st && !(r->loss_f = open_append(p)))
        st = sbp_fail(err, SBP_EIO, "%s: cannot open for appending: %s", p, strerror(errno));
    pathf(p, sizeof p, "%s/timing.csv", a->out);
    if (!st) st = sbp_write_atomic(p, r->rs.timing_csv, r->rs.timing_len, err);
    if (!st && !(r->timing_f = open_append(p)))
        st = sbp_fail(err, SBP_EIO, "%s: cannot open for appending: %s", p, strerror(errno));
    return st;
}

static sbp_status log_row(FILE *f, char **buf, size_t *len, size_t *cap, const char *row,
                          const char *name, const char *out, sbp_err *err) {
    if (!append(buf, len, cap, row)) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    if (fputs(row, f) < 0 || fflush(f) != 0)
        return sbp_fail(err, SBP_EIO, "%s/%s: write failed: %s", out, name, strerror(errno));
    return SBP_OK;
}

int cmd_train(int argc, char **argv) {
    train_args a;
    int rc = parse(&a, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    sbp_set_threads(a.threads);
    sbp_err err = {0};
    sbp_ledger lg = {0};
    train_run r;
    memset(&r, 0, sizeof r);
    settings s;
    char ckpt[4200] = "", where[4300];
    sbp_status st = prepare(&r, &a, &s, ckpt, sizeof ckpt, &lg, &err);
    if (st) {
        run_free(&r, a.grad_accum, &lg);
        return report_error("train", &err);
    }
    /* from here on the run writes */
    if ((st = open_logs(&r, &a, &err))) {
        run_free(&r, a.grad_accum, &lg);
        return report_error("train", &err);
    }
    sbp_ledger_keep_blocks(&lg); /* every step after the first reuses the first one's buffers */
    const int64_t start = r.rs.step, stop = a.stop_at ? a.stop_at : a.steps;
    sbp_lora *lora = r.has_lora ? &r.lora : NULL;
    char mdesc[160], b1[32];
    describe_model(mdesc, sizeof mdesc, &r.m.cfg);
    fmt_bytes(b1, sizeof b1, (double)lg.cur[SBP_MEM_OPTIMIZER]);
    if (lora) {
        char ldesc[160];
        describe_lora(ldesc, sizeof ldesc, &lora->cfg);
        fprintf(stderr,
                "streambp train: LoRA adapter %s (%s, scaling %g): %d tensors, %lld parameters "
                "trained, the model frozen\n",
                a.lora, ldesc, sbp_lora_scaling(&lora->cfg), lora->params.n,
                (long long)lora->params.total);
    }
    fprintf(stderr,
            "streambp train: %s, %lld parameters, %s; %lld data items, %d a micro-batch, %d "
            "micro-batches a step; %s, block %d; AdamW moments %s\n",
            mdesc, (long long)r.m.params.total, a.prec == SBP_FP64 ? "fp64" : "fp32",
            (long long)sbp_data_items(r.data), sbp_data_items_per_batch(r.data), a.grad_accum,
            sbp_schedule_name(a.g.schedule), a.g.block ? a.g.block : SBP_DEFAULT_BLOCK, b1);
    if (sbp_data_truncated(r.data) || sbp_data_skipped(r.data))
        fprintf(stderr,
                "streambp train: %lld records truncated to %d tokens; %lld records without a "
                "target in their first %d tokens skipped\n",
                (long long)sbp_data_truncated(r.data), a.T, (long long)sbp_data_skipped(r.data),
                a.T);
    if (start)
        fprintf(stderr, "streambp train: resuming from %s at step %lld\n", ckpt, (long long)start);
    const double t_start = now_seconds();
    double last_loss = NAN;
    for (int64_t step = start; step < stop && !st; step++) {
        int64_t step_tokens = 0;
        for (int k = 0; k < a.grad_accum && !st; k++) {
            sbp_batch_free(&r.mb[k]);
            int n = sbp_sampler_next(&r.rs.sampler, r.items);
            st = sbp_data_batch(&r.mb[k], r.data, r.items, n, &err);
            if (!st && r.has_ref)
                st = sbp_batch_set_reference(&r.mb[k], &r.ref, &a.g.objective, &a.g, &lg, &err);
            if (!st) step_tokens += real_tokens(&r.mb[k]);
        }
        if (st) break;
        const double lr = sbp_lr_at(&a.sched, step), t0 = now_seconds();
        sbp_step_result res;
        st = sbp_train_step(&res, &r.m, lora, &r.opt, r.mb, a.grad_accum, &a.g, lr, a.max_grad_norm,
                            &lg, &err);
        if (st) {
            sbp_fail_prefix(&err, "step %lld: ", (long long)step + 1);
            break;
        }
        const double secs = now_seconds() - t0;
        r.rs.step = step + 1;
        r.rs.tokens += step_tokens;
        last_loss = res.loss;
        char row[512];
        double epoch =
            (double)r.rs.sampler.epoch + (double)r.rs.sampler.pos / (double)r.rs.sampler.n;
        snprintf(row, sizeof row, "%lld,%.4f,%.17g,%.17g,%.17g,%lld,%lld\n", (long long)r.rs.step,
                 epoch, res.loss, res.lr, res.grad_norm, (long long)res.n_targets,
                 (long long)r.rs.tokens);
        st = log_row(r.loss_f, &r.rs.loss_csv, &r.rs.loss_len, &r.rs.loss_cap, row, "loss.csv",
                     a.out, &err);
        snprintf(row, sizeof row, "%lld,%.6f,%.1f,%lld,%lld\n", (long long)r.rs.step, secs,
                 step_tokens / secs, (long long)lg.peak_total, peak_rss_bytes());
        if (!st)
            st = log_row(r.timing_f, &r.rs.timing_csv, &r.rs.timing_len, &r.rs.timing_cap, row,
                         "timing.csv", a.out, &err);
        if (st) break;
        if (r.rs.step % a.log_every == 0 || r.rs.step == stop) {
            double elapsed = now_seconds() - t_start;
            double eta = elapsed / (double)(r.rs.step - start) * (double)(stop - r.rs.step);
            char peak[32], rss[32], et[32];
            fmt_bytes(peak, sizeof peak, (double)lg.peak_total);
            fmt_bytes(rss, sizeof rss, (double)peak_rss_bytes());
            fmt_duration(et, sizeof et, eta);
            fprintf(stderr,
                    "step %lld/%d  loss %.6f  lr %.3e  grad_norm %.4f  %.0f tokens/s  peak %s "
                    "(RSS %s)  ETA %s\n",
                    (long long)r.rs.step, a.steps, res.loss, res.lr, res.grad_norm,
                    step_tokens / secs, peak, rss, et);
        }
        int due = (a.save_every && r.rs.step % a.save_every == 0) ||
                  (a.stop_at && r.rs.step == a.stop_at && a.stop_at < a.steps);
        if (due) {
            st = save_checkpoint(&a, &r.rs, &s, &r.m, lora, r.config_json, &r.opt, where,
                                 sizeof where, &err);
            if (!st) fprintf(stderr, "streambp train: saved %s\n", where);
        }
    }
    const double secs = now_seconds() - t_start;
    const int finished = !st && r.rs.step == a.steps;
    if (finished) /* the final weights or adapter, in the run directory, as HF's save_model */
        st = save_trained(a.out, &a, &r.m, lora, r.config_json, r.rs.step, &err);
    if (!st && a.plot) draw_plot(a.out);
    if (!st) {
        double l0 = logged_loss(r.rs.loss_csv, 0);
        if (!isfinite(last_loss)) last_loss = logged_loss(r.rs.loss_csv, 1); /* no step now */
        if (a.json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "out", a.out);
            cJSON_AddNumberToObject(o, "steps_done", (double)r.rs.step);
            cJSON_AddNumberToObject(o, "steps", a.steps);
            cJSON_AddNumberToObject(o, "resumed_from_step", (double)start);
            cJSON_AddBoolToObject(o, "finished", finished);
            char t[40];
            snprintf(t, sizeof t, "%.17g", l0);
            cJSON_AddRawToObject(o, "first_loss", isfinite(l0) ? t : "null");
            snprintf(t, sizeof t, "%.17g", last_loss);
            cJSON_AddRawToObject(o, "last_loss", isfinite(last_loss) ? t : "null");
            cJSON_AddNumberToObject(o, "seconds", secs);
            cJSON_AddNumberToObject(o, "tokens", (double)r.rs.tokens);
            cJSON_AddItemToObject(o, "memory", ledger_json(&lg));
            cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)peak_rss_bytes());
            print_json(o);
        } else {
            printf("run       %s: step %lld of %d%s (%lld this session, %.2f s)\n", a.out,
                   (long long)r.rs.step, a.steps, finished ? "" : ", stopped",
                   (long long)(r.rs.step - start), secs);
            printf("loss      %.6f at step 1, %.6f at step %lld\n", l0, last_loss,
                   (long long)r.rs.step);
            print_ledger(stdout, &lg, "  ");
            printf("  peak RSS %.1f MiB\n", peak_rss_bytes() / 1048576.0);
            if (finished)
                printf("wrote     %s/%s, %s/loss.csv\n", a.out,
                       lora ? "adapter_model.safetensors" : "model.safetensors", a.out);
            else
                printf("resume    with --resume %s/checkpoint-%lld\n", a.out, (long long)r.rs.step);
        }
    }
    run_free(&r, a.grad_accum, &lg);
    sbp_ledger_drop_blocks(&lg);
    return st ? report_error("train", &err) : 0;
}
