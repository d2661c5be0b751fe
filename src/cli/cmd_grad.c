/* cmd_grad.c — `streambp grad`: one forward + backward step, the gradient written under HF names.
 */
#include "../dist/dist.h"
#include "../dist/seqlink.h"
#include "cli.h"
#include "objopts.h"
#include "options.h"
#include "cmd_plan.h"
#include "../core/err.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: streambp grad --model DIR --batch FILE [--batch FILE ...] [options]\n"
    "\n"
    "Computes the loss of the batch and the gradient of every parameter, prints the loss and the\n"
    "memory ledger, and writes the gradient (safetensors, HF names, F32 or F64). Several --batch\n"
    "files are the micro-batches of one step (gradient accumulation), normalised as the\n"
    "concatenated batch would be.\n"
    "\n"
    "  --model DIR          HF model directory (config.json + model.safetensors or shards)\n"
    "  --batch FILE         batch (safetensors); formats in README \"Objectives\"\n"
    "  --out FILE           gradient file to write (nothing is written without it); with one\n"
    "                       --batch in one process on the CPU each layer's gradient goes to\n"
    "                       the file as the backward completes it, so the whole gradient is\n"
    "                       never held (the same bits)\n"
    "  --hold-grads         hold the whole gradient and write it after the step instead\n"
    "  --schedule S         full | ckpt | stream (default stream)\n"
    "  --chunk N            stream: tokens per layer chunk (default 2 blocks; clamped to T)\n"
    "  --logit-chunk N      rows per logits pass (default one block; stream, or with\n"
    "                       --chunked-logits)\n"
    "  --chunked-logits     full/ckpt: chunk the logits too instead of materialising B*T*V\n"
    "  --block N            token block of every reduction over tokens (default 512); full,\n"
    "                       ckpt and stream agree bit for bit when chunks are multiples of it\n"
    "  --precision P        fp32 | fp64 | bf16 (default fp32; bf16: the float32 engine rounding\n"
    "                       weights, every stored tensor and the gradients to bfloat16, as pure-\n"
    "                       bf16 training does; the file holds those bf16 values as F32)\n"
    "  --numerics N         fast | portable (default fast). fast: the products the build's\n"
    "                       instruction set picks, bits depend on the machine; portable:\n"
    "                       the same bits on every machine, schedule, chunk and thread count\n"
    "                       (README \"Exactness\")\n"
    "  --device D           cpu | cuda | cuda-emu (default cpu): the CUDA kernels on a GPU, or on\n"
    "                       the CPU through the SIMT emulator (exact, slow: tiny models); both\n"
    "                       compute the portable numerics, bit for bit the CPU's\n"
    "  --lora DIR           a LoRA adapter (peft's layout: `streambp lora init`, or peft's\n"
    "                       save_pretrained): the base model frozen, the gradient is the\n"
    "                       adapter's, written under peft's names\n" UNATTENDED_USAGE THREADS_USAGE
    "  --json               print a JSON object instead of the text report\n"
    "  --mem-limit SIZE     memory the step may use, e.g. 8G (default: what is available: the\n"
    "                       least of MemAvailable, ulimit -v/-d and the cgroup's memory.max)\n"
    "  --force              run even when the planned peak exceeds that\n"
    "  --comm-timeout S     under mpirun: end the run (exit 3) when a peer is silent for S\n"
    "                       seconds (default 600; docs/distributed.md)\n"
    "  --seq-ranks S        under mpirun -np N (S divides N): groups of S processes share every\n"
    "                       sequence, each holding whole blocks of its tokens and their layer\n"
    "                       inputs; the N / S groups share the micro-batches (sequence\n"
    "                       parallel, docs/distributed.md §8; memory falls with S)\n"
    "  --seq-overlap        with --seq-ranks: a rank runs each layer's backward without waiting "
    "for\n"
    "                       the previous rank's part of its gradient, keeping the operands of its\n"
    "                       weight products until that arrives (faster, more memory; the same "
    "bits)\n"
    "\n"
    "Under `mpirun -np N`, every process runs micro-batches k = rank (mod N) (N must divide the\n"
    "--batch count) and rank 0 writes: the same bits as one process (docs/distributed.md).\n"
    "\n"
    "Before loading the weights the step is planned (streambp plan): when its peak is larger\n"
    "than the memory available, grad stops with exit status 2, naming both.\n"
    "\n";

#define MAX_BATCHES 64

typedef struct {
    const char *model, *out, *lora;
    const char *batch[MAX_BATCHES];
    int n_batches;
    sbp_grad_opts g;
    sbp_precision prec;
    int bf16; /* --precision bf16 */
    int threads, json;
    int force;         /* --force: no memory check */
    int hold;          /* --hold-grads: the whole gradient held, written after the step */
    int64_t mem_limit; /* --mem-limit; 0: detect */
    obj_args obj;
    double comm_timeout; /* --comm-timeout: seconds a distributed run waits on a silent peer */
} grad_args;

static int parse(grad_args *a, int argc, char **argv) {
    static const struct option opts[] = {OPTION_MODEL,
                                         {"batch", required_argument, 0, 'b'},
                                         {"out", required_argument, 0, 'o'},
                                         OPTION_SCHEDULE,
                                         OPTION_CHUNK,
                                         OPTION_LOGIT_CHUNK,
                                         {"chunked-logits", no_argument, 0, 'L'},
                                         OPTION_BLOCK,
                                         {"precision", required_argument, 0, 'p'},
                                         OPTION_THREADS,
                                         OPTION_NUMERICS,
                                         OPTION_DEVICE,
                                         OPTION_UNATTENDED,
                                         {"lora", required_argument, 0, 'A'},
                                         OPTION_JSON,
                                         {"mem-limit", required_argument, 0, 'M'},
                                         {"force", no_argument, 0, 'F'},
                                         {"comm-timeout", required_argument, 0, 'W'},
                                         {"seq-ranks", required_argument, 0, 'S'},
                                         {"seq-overlap", no_argument, 0, 'V'},
                                         {"hold-grads", no_argument, 0, 'H'},
                                         {"help", no_argument, 0, 'h'},
                                         OBJ_LONG_OPTIONS,
                                         {0, 0, 0, 0}};
    memset(a, 0, sizeof *a);
    common_opts co = {.cmd = "grad",
                      .model = &a->model,
                      .schedule = &a->g.schedule,
                      .chunk = &a->g.chunk,
                      .logit_chunk = &a->g.logit_chunk,
                      .block = &a->g.block,
                      .threads = &a->threads,
                      .numerics = &a->g.numerics,
                      .device = &a->g.device,
                      .unattended = &a->g.unattended,
                      .json = &a->json};
    obj_args_init(&a->obj);
    a->g.schedule = SBP_STREAM;
    a->threads = default_threads();
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b':
            if (a->n_batches == MAX_BATCHES) {
                fprintf(stderr, "streambp grad: at most %d --batch files\n", MAX_BATCHES);
                return EXIT_USAGE;
            }
            a->batch[a->n_batches++] = optarg;
            break;
        case 'o': a->out = optarg; break;
        case 'L': a->g.chunked_logits = 1; break;
        case 'p': /* bf16 runs on the float32 engine (sbp_grad_opts.emulate_bf16) */
            a->bf16 = strcmp(optarg, "bf16") == 0;
            if (a->bf16)
                a->prec = SBP_FP32;
            else if (!parse_precision("grad", optarg, &a->prec))
                return EXIT_USAGE;
            break;
        case 'A': a->lora = optarg; break;
        case 'M':
            if (!plan_parse_size("grad", optarg, &a->mem_limit)) return EXIT_USAGE;
            break;
        case 'F': a->force = 1; break;
        case 'W':
            if (!parse_comm_timeout("grad", optarg, &a->comm_timeout)) return EXIT_USAGE;
            break;
        case 'S': {
            int64_t v;
            if (!parse_int_opt("grad", "--seq-ranks", optarg, 1, SBP_SEQ_MAX, &v))
                return EXIT_USAGE;
            a->g.seq_ranks = (int)v;
            break;
        }
        case 'V': a->g.seq_overlap = 1; break;
        case 'H': a->hold = 1; break;
        case 'h': printf("%s%s", usage, obj_usage); return -1;
        default:
            if (common_opt_code(c)) {
                if (!common_opt(&co, c, optarg)) return EXIT_USAGE;
                break;
            }
            if (c >= OBJ_OPT_OBJECTIVE && c <= OBJ_OPT_REF_MODEL) {
                if (!obj_args_option(&a->obj, "grad", c, optarg)) return EXIT_USAGE;
                break;
            }
            fputs(usage, stderr);
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "streambp grad: unexpected argument \"%s\"\n", argv[optind]);
        return EXIT_USAGE;
    }
    if (!a->model || !a->n_batches) {
        fprintf(stderr, "streambp grad: --model and --batch are required\n%s", usage);
        return EXIT_USAGE;
    }
    if (a->out && !a->out[0]) { /* caught here, before the step, not when writing after it */
        fprintf(stderr, "streambp grad: --out is empty; give a file name\n");
        return EXIT_USAGE;
    }
    if (!obj_args_finish(&a->obj, "grad")) return EXIT_USAGE;
    /* the CUDA backends compute the portable numerics: that is the default there */
    if (a->g.device != SBP_DEVICE_CPU && !co.numerics_given) a->g.numerics = SBP_NUMERICS_PORTABLE;
    a->g.objective = a->obj.obj;
    a->g.emulate_bf16 = a->bf16;
    return 0;
}

static const char *prec_name(const grad_args *a) {
    return a->bf16 ? "bf16 (emulated)" : a->prec == SBP_FP64 ? "fp64" : "fp32";
}

/* The batches taken together: what the report shows. */
typedef struct {
    int rows, T; /* rows of all micro-batches; the longest T */
    int64_t targets, pad_targets;
    int64_t unattended_rows, unattended_targets; /* rows that see no key, targets from them */
} batch_totals;

static batch_totals totals(const sbp_batch *b, int n) {
    batch_totals t = {0};
    for (int i = 0; i < n; i++) {
        t.rows += b[i].B;
        t.T = b[i].T > t.T ? b[i].T : t.T;
        t.targets += b[i].n_targets, t.pad_targets += b[i].n_pad_targets;
        int64_t ur, ut;
        sbp_batch_count_unattended(&b[i], &ur, &ut);
        t.unattended_rows += ur, t.unattended_targets += ut;
    }
    return t;
}

static void print_text(const grad_args *a, const sbp_model *m, const sbp_batch *b,
                       const sbp_grad_result *r, const sbp_ledger *lg, double secs) {
    const sbp_config *c = &m->cfg;
    const batch_totals bt = totals(b, a->n_batches);
    const sbp_objective *o = &a->g.objective;
    printf("model     %s: %s, L=%d C=%d heads %d/%d head_dim %d F=%d V=%d%s\n", a->model,
           c->model_type, c->layers, c->hidden, c->heads, c->kv_heads, c->head_dim, c->ffn,
           c->vocab, c->tied ? ", tied embeddings" : "");
    if (a->g.lora)
        printf("adapter   %s: LoRA r %d, alpha %g%s (scaling %g), %d tensors, %lld parameters; "
               "the base model frozen\n",
               a->lora, a->g.lora->cfg.r, a->g.lora->cfg.alpha,
               a->g.lora->cfg.use_rslora ? ", rslora" : "", sbp_lora_scaling(&a->g.lora->cfg),
               a->g.lora->params.n, (long long)a->g.lora->params.total);
    for (int i = 0; i < a->n_batches; i++)
        printf("batch     %s: %d rows, T=%d, %lld targets\n", a->batch[i], b[i].B, b[i].T,
               (long long)b[i].n_targets);
    if (bt.pad_targets)
        printf("          (%lld targets predicted from padded positions; see ref/SEMANTICS.md)\n",
               (long long)bt.pad_targets);
    if (bt.unattended_targets)
        printf("          (%lld attention rows see no key (left padding) and %lld targets are "
               "predicted from them: their values follow --unattended %s; HF's depend on its "
               "attention backend)\n",
               (long long)bt.unattended_rows, (long long)bt.unattended_targets,
               sbp_unattended_name(a->g.unattended));
    printf("objective %s", obj_kind_name(o->kind));
    if (o->kind == SBP_OBJ_DPO)
        printf(", loss %s, beta %g, label smoothing %g", obj_loss_name(o), o->beta,
               o->label_smoothing);
    if (o->kind == SBP_OBJ_GRPO)
        printf(", loss %s, beta %g, epsilon [%g, %g], temperature %g", obj_loss_name(o), o->beta,
               o->epsilon_low, o->epsilon_high, o->temperature);
    if (a->obj.ref_model) printf(", reference model %s", a->obj.ref_model);
    printf("\nschedule  %s, %s, %s numerics on %s, block %d, chunk %d, logit chunk %d%s, %d "
           "threads\n",
           sbp_schedule_name(a->g.schedule), prec_name(a), sbp_numerics_name(a->g.numerics),
           sbp_device_name(a->g.device), r->block, a->g.schedule == SBP_STREAM ? r->chunk : bt.T,
           r->logit_chunk,
           a->g.schedule != SBP_STREAM && !a->g.chunked_logits ? " (materialised B*T*V)" : "",
           a->threads);
    printf("loss      %.17g\n", r->loss);
    printf("time      %.3f s\n", secs);
    print_ledger(stdout, lg, "  ");
    printf("  peak RSS %.1f MiB (the whole process: binary, libraries, batch, buffers)\n",
           sbp_peak_rss_bytes() / 1048576.0);
    const char *thp;
    if (a->g.device == SBP_DEVICE_CPU && sbp_huge_pages(&thp) == 0)
        printf("note      transparent huge pages are off (%s): every buffer is faulted in 4 KiB "
               "pages (docs/performance.md, \"Huge pages\")\n",
               thp);
    if (a->out)
        printf("wrote     %s (%d tensors%s)\n", a->out,
               a->g.lora ? a->g.lora->params.n : m->params.n,
               a->g.grad_sink ? ", each layer's as the backward completed it" : "");
}

static void print_result_json(const grad_args *a, const sbp_model *m, const sbp_batch *b,
                              const sbp_grad_result *r, const sbp_ledger *lg, double secs) {
    const batch_totals bt = totals(b, a->n_batches);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", a->model);
    cJSON_AddStringToObject(o, "model_type", m->cfg.model_type);
    cJSON_AddItemToObject(o, "batches", cJSON_CreateStringArray(a->batch, a->n_batches));
    cJSON_AddNumberToObject(o, "rows", bt.rows);
    cJSON_AddNumberToObject(o, "T", bt.T);
    cJSON_AddNumberToObject(o, "n_targets", (double)bt.targets);
    cJSON_AddNumberToObject(o, "n_pad_targets", (double)bt.pad_targets);
    cJSON_AddNumberToObject(o, "unattended_rows", (double)bt.unattended_rows);
    cJSON_AddNumberToObject(o, "unattended_targets", (double)bt.unattended_targets);
    cJSON_AddStringToObject(o, "unattended", sbp_unattended_name(a->g.unattended));
    cJSON_AddStringToObject(o, "objective", obj_kind_name(a->g.objective.kind));
    cJSON_AddStringToObject(o, "loss_type", obj_loss_name(&a->g.objective));
    cJSON_AddStringToObject(o, "schedule", sbp_schedule_name(a->g.schedule));
    cJSON_AddStringToObject(o, "precision", prec_name(a));
    cJSON_AddStringToObject(o, "numerics", sbp_numerics_name(a->g.numerics));
    cJSON_AddStringToObject(o, "device", sbp_device_name(a->g.device));
    cJSON_AddNumberToObject(o, "block", r->block);
    cJSON_AddNumberToObject(o, "chunk", a->g.schedule == SBP_STREAM ? r->chunk : bt.T);
    cJSON_AddNumberToObject(o, "logit_chunk", r->logit_chunk);
    cJSON_AddBoolToObject(o, "materialised_logits",
                          a->g.schedule != SBP_STREAM && !a->g.chunked_logits);
    cJSON_AddNumberToObject(o, "threads", a->threads);
    char loss[40];
    snprintf(loss, sizeof loss, "%.17g", r->loss);
    cJSON_AddRawToObject(o, "loss", loss);
    cJSON_AddNumberToObject(o, "seconds", secs);
    cJSON_AddItemToObject(o, "memory", ledger_json(lg));
    cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)sbp_peak_rss_bytes());
    const char *thp;
    sbp_huge_pages(&thp);
    cJSON_AddStringToObject(o, "huge_pages", thp);
    if (a->out) cJSON_AddStringToObject(o, "out", a->out);
    cJSON_AddBoolToObject(o, "gradient_held", !a->g.grad_sink);
    print_json(o);
}

/* __metadata__ of a gradient file: NULL-terminated key, value pairs; numbers are formatted
   into the list's own storage so the pointers stay valid until the file is written. */
enum { META_MAX = 32 }; /* at most 22 entries today (a non-SFT objective with --lora) */
typedef struct {
    const char *kv[2 * META_MAX + 1];
    char num[META_MAX][48];
    char batches[1024]; /* the --batch files, comma-separated */
    int n;
} meta_list;

/* The list holds META_MAX pairs; a key past that would be a programming error (and a test of
 * every objective's metadata writes the fullest list). */
static void meta_str(meta_list *l, const char *key, const char *value) {
    if (l->n == META_MAX) return;
    l->kv[2 * l->n] = key;
    l->kv[2 * l->n + 1] = value;
    l->kv[2 * ++l->n] = NULL;
}

static void meta_num(meta_list *l, const char *key, double value) {
    if (l->n == META_MAX) return;
    snprintf(l->num[l->n], sizeof l->num[0], "%.17g", value);
    meta_str(l, key, l->num[l->n]);
}

/* The run's settings, so a gradient file says how it was made. */
static void meta_of(meta_list *l, const grad_args *a, const sbp_batch *b,
                    const sbp_grad_result *r) {
    const sbp_objective *o = &a->g.objective;
    *l = (meta_list){.n = 0}; /* its pointers point into *l itself */
    char *batches = l->batches;
    for (int i = 0; i < a->n_batches; i++)
        snprintf(batches + strlen(batches), sizeof l->batches - strlen(batches), "%s%s",
                 i ? "," : "", a->batch[i]);
    meta_num(l, "loss", r->loss);
    meta_num(l, "n_targets", (double)r->n_targets);
    meta_str(l, "objective", obj_kind_name(o->kind));
    meta_str(l, "loss_type", obj_loss_name(o));
    meta_str(l, "schedule", sbp_schedule_name(a->g.schedule));
    meta_str(l, "precision", prec_name(a));
    meta_str(l, "numerics", sbp_numerics_name(a->g.numerics));
    meta_str(l, "device", sbp_device_name(a->g.device));
    meta_str(l, "unattended", sbp_unattended_name(a->g.unattended));
    meta_num(l, "block", r->block);
    meta_num(l, "chunk", a->g.schedule == SBP_STREAM ? r->chunk : totals(b, a->n_batches).T);
    meta_num(l, "logit_chunk", r->logit_chunk);
    meta_num(l, "threads", a->threads);
    meta_str(l, "model", a->model);
    meta_str(l, "batch", batches);
    meta_str(l, "implementation", "streambp " SBP_VERSION);
    if (o->kind != SBP_OBJ_SFT) { /* SFT has no hyper-parameters */
        meta_num(l, "beta", o->beta);
        meta_num(l, "label_smoothing", o->label_smoothing);
        meta_num(l, "epsilon_low", o->epsilon_low);
        meta_num(l, "epsilon_high", o->epsilon_high);
        meta_num(l, "temperature", o->temperature);
    }
    if (a->lora) meta_str(l, "lora", a->lora);
}

static sbp_status save(const grad_args *a, const sbp_model *m, const sbp_batch *b,
                       const sbp_grad_result *r, sbp_ledger *lg, sbp_err *err) {
    meta_list l;
    meta_of(&l, a, b, r);
    const sbp_params *ps = a->g.lora ? &a->g.lora->params : &m->params;
    /* under mpirun each process holds its share: rank 0 gathers them */
    if (sbp_comm_size(a->g.comm) > 1)
        return sbp_dist_save_grads(a->out, a->g.comm, ps, a->prec, r->grads, l.kv, lg, err);
    return sbp_grads_save(a->out, ps, a->prec, r->grads, l.kv, err);
}

/* The gradient file written as the step runs (sbp_grads_out): its header, with the step's loss
 * and settings, fixed at the first piece, when the result holds them, so that the file's bytes
 * are those of a held gradient's. */
typedef struct {
    sbp_grads_out *w;
    const grad_args *a;
    const sbp_batch *b;
    const sbp_grad_result *r;
    meta_list ml;
} grads_out;

static int put_piece(void *ctx, int64_t off, int64_t n, const void *g) {
    grads_out *go = ctx;
    if (go->w && sbp_grads_out_error(go->w, NULL) == SBP_OK && go->ml.n == 0) {
        meta_of(&go->ml, go->a, go->b, go->r);
        if (sbp_grads_out_begin(go->w, go->ml.kv, NULL)) return 0;
    }
    return sbp_grads_out_put(go->w, off, n, g);
}

/* The step's planned peak (sbp_plan) against the memory available, before the weights are
 * loaded: a step that cannot fit is refused with both numbers instead of being killed halfway
 * (or, with overcommit, taking the machine down). Micro-batches run one after the other, so the
 * largest of their plans counts; a reference model is loaded next to the policy for a forward
 * pass, freed before the step. */
static sbp_status check_memory(const grad_args *a, const sbp_config *cfg, const sbp_lora *ad,
                               const sbp_batch *b, sbp_err *err) {
    char why[1400] = "--mem-limit", need_s[32], have_s[32];
    int64_t have = a->mem_limit ? a->mem_limit : available_memory(why, sizeof why);
    if (have < 0) return SBP_OK; /* nothing known to compare with */
    const int eb = a->prec == SBP_FP64 ? 8 : 4;
    int64_t params = sbp_config_param_count(cfg), need = 0;
    /* the gradient: every weight's, or with an adapter only the adapter's (the base frozen; it
     * was planned as every weight's, refusing LoRA steps that fit) */
    const int64_t gparams = a->g.grad_sink ? 0 : ad ? ad->params.total : params;
    sbp_ledger lg = {0};
    /* weights and gradients alone: settles absurd sizes without reserving address space */
    if (params < 0 || params > INT64_MAX / 2 / eb || eb * (params + gparams) > have) {
        need = params < 0 || params > INT64_MAX / 2 / eb ? INT64_MAX : eb * (params + gparams);
    } else {
        for (int i = 0; i < a->n_batches && need <= have; i++) {
            sbp_plan_opts po = {.grad = a->g, .B = b[i].B, .T = b[i].T, .storage_bytes = eb};
            po.grad.lora = NULL; /* the planner takes the adapter's configuration */
            if (ad) po.lora = ad->cfg;
            sbp_status st = sbp_plan(&lg, cfg, &po, err);
            if (st == SBP_ENOMEM)
                need = INT64_MAX; /* not even the address space */
            else if (st)
                return st;
            else if (lg.peak_total > need)
                need = lg.peak_total;
        }
    }
    if (need <= have && a->obj.ref_model) {
        char path[4200];
        sbp_config rc;
        snprintf(path, sizeof path, "%s/config.json", a->obj.ref_model);
        sbp_status st = sbp_config_load(&rc, path, err);
        if (st) return st;
        int64_t rp = sbp_config_param_count(&rc);
        if (rp < 0 || rp > (have - eb * params) / eb) need = INT64_MAX;
        for (int i = 0; i < a->n_batches && need <= have; i++) {
            sbp_plan_opts po = {.grad = a->g, .B = b[i].B, .T = b[i].T, .storage_bytes = eb};
            po.grad.schedule = SBP_STREAM; /* how the reference pass runs */
            po.grad.grad_sink = NULL;      /* its plan's slab is taken off below */
            if ((st = sbp_plan(&lg, &rc, &po, err)) == SBP_ENOMEM)
                need = INT64_MAX;
            else if (st)
                return st;
            int64_t r = eb * params + lg.peak_total - lg.peak[SBP_MEM_GRADS];
            if (r > need) need = r;
        }
    }
    if (need <= have) return SBP_OK;
    format_bytes(have_s, sizeof have_s, have);
    if (need == INT64_MAX)
        snprintf(need_s, sizeof need_s, "more than the address space");
    else
        format_bytes(need_s, sizeof need_s, need);
    return sbp_fail(err, SBP_EINPUT,
                    "the step needs %s at its planned peak (%s, %s, %lld parameters), but only "
                    "%s %s (%s); give a smaller batch, --schedule stream, or --force to run "
                    "anyway",
                    need_s, sbp_schedule_name(a->g.schedule), prec_name(a), (long long)params,
                    have_s, a->mem_limit ? "may be used" : "are available", why);
}

int cmd_grad(int argc, char **argv) {
    grad_args a;
    int rc = parse(&a, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    sbp_set_threads(a.threads);
    sbp_err err = {0};
    sbp_ledger lg = {0};
    sbp_model m = {0};
    sbp_config cfg;
    sbp_batch b[MAX_BATCHES] = {{0}};
    sbp_grad_result r = {0};
    /* under mpirun: one process of a distributed step (docs/distributed.md); rank 0 writes */
    sbp_comm *comm = NULL;
    if (sbp_comm_start(&comm, a.comm_timeout, &err)) return report_error("grad", &err);
    if ((rc = dist_check_args(comm, "grad", argc, argv, &err))) return rc;
    const int rank = sbp_comm_rank(comm);
    a.g.comm = comm, a.g.sharded = 1; /* ZeRO-2: no process holds the whole gradient */
    /* one step of one micro-batch here: the gradient goes to the file as it forms */
    if (a.out && !a.hold && a.n_batches == 1 && sbp_comm_size(comm) <= 1 &&
        a.g.device == SBP_DEVICE_CPU)
        a.g.grad_sink = put_piece; /* its context, the file, is opened after the plan */
    if (a.out && sbp_check_writable(a.out, &err)) return dist_exit(comm, "grad", &err);
    /* the model's config and headers and the batches first: they say how large the step is */
    sbp_status st = sbp_model_check(&cfg, a.model, &err);
    for (int i = 0; i < a.n_batches && !st; i++)
        st = sbp_batch_load_as(&b[i], a.batch[i], &cfg, a.g.objective.kind, a.obj.scale_rewards,
                               &err);
    for (int i = 0; i < a.n_batches && !st && rank == 0; i++)
        if (note_fast_chunks("grad", &a.g, b[i].T)) break;
    /* on a device the ledger records the device's memory only */
    sbp_ledger *host_lg = a.g.device == SBP_DEVICE_CPU ? &lg : NULL;
    /* the adapter (small) before the check: its configuration decides the gradient's size */
    sbp_lora adapter = {0};
    if (!st && a.lora && !(st = sbp_lora_load(&adapter, a.lora, &cfg, a.prec, host_lg, &err)))
        a.g.lora = &adapter;
    /* host memory: a GPU's own memory is the CUDA runtime's to refuse */
    if (!st && !a.force && a.g.device != SBP_DEVICE_CUDA)
        st = check_memory(&a, &cfg, a.g.lora, b, &err);
    if (!st) st = sbp_model_load(&m, a.model, a.prec, host_lg, &err);
    if (!st && a.bf16) sbp_model_round_bf16(&m);
    if (!st) st = obj_reference(&a.obj, b, a.n_batches, &m.cfg, a.prec, &a.g, &lg, &err);
    /* the gradient file opened before the step, each piece written as the backward completes
     * it (the header, with the loss, last) */
    grads_out go = {.a = &a, .b = b, .r = &r};
    if (!st && a.g.grad_sink) {
        st = sbp_grads_out_open(&go.w, a.out, a.g.lora ? &a.g.lora->params : &m.params, a.prec,
                                &err);
        a.g.grad_sink_ctx = &go;
    }
    double t0 = sbp_now_seconds();
    if (!st) st = sbp_grad_batches(&r, &m, b, a.n_batches, &a.g, &lg, &err);
    double secs = sbp_now_seconds() - t0;
    if (go.w && st) { /* a failed write says why in its own words */
        sbp_grads_out_error(go.w, &err);
        sbp_grads_out_abort(go.w);
    } else if (go.w) {
        meta_of(&go.ml, &a, b, &r);
        st = sbp_grads_out_commit(go.w, go.ml.kv, &err);
    }
    /* under mpirun every process takes part: each holds its share of the gradient */
    if (!st && a.out && !a.g.grad_sink && (rank == 0 || sbp_comm_size(comm) > 1))
        st = save(&a, &m, b, &r, &lg, &err);
    if (!st && rank == 0) {
        if (a.json)
            print_result_json(&a, &m, b, &r, &lg, secs);
        else
            print_text(&a, &m, b, &r, &lg, secs);
    }
    sbp_grad_result_free(&r, &lg);
    sbp_lora_free(&adapter, host_lg);
    for (int i = 0; i < a.n_batches; i++) sbp_batch_free(&b[i]);
    sbp_model_free(&m, host_lg);
    return st ? dist_exit(comm, "grad", &err)
              : (dist_report(comm, "grad", lg.peak_total), sbp_comm_finish(comm), 0);
}
