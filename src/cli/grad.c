/* grad.c — `streambp grad`: one forward + backward step, the gradient written under HF names. */
#include "cli.h"

#include <getopt.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: streambp grad --model DIR --batch FILE [options]\n"
    "\n"
    "Computes the SFT loss of the batch and the gradient of every parameter, prints the loss and\n"
    "the memory ledger, and writes the gradient (safetensors, HF names, F32 or F64).\n"
    "\n"
    "  --model DIR          HF model directory (config.json + model.safetensors or shards)\n"
    "  --batch FILE         batch (safetensors): input_ids, labels, optional attention_mask\n"
    "  --out FILE           gradient file to write (nothing is written without it)\n"
    "  --schedule S         full | ckpt | stream (default stream)\n"
    "  --chunk N            stream: tokens per layer chunk (default 4 blocks; clamped to T)\n"
    "  --logit-chunk N      rows per logits pass (default one block; stream, or with\n"
    "                       --chunked-logits)\n"
    "  --chunked-logits     full/ckpt: chunk the logits too instead of materialising B*T*V\n"
    "  --block N            token block of every reduction over tokens (default 256); full,\n"
    "                       ckpt and stream agree bit for bit when chunks are multiples of it\n"
    "  --precision P        fp32 | fp64 (default fp32)\n"
    "  --threads N          OpenMP/OpenBLAS threads (default: all cores)\n"
    "  --json               print a JSON object instead of the text report\n";

typedef struct {
    const char *model, *batch, *out;
    sbp_grad_opts g;
    sbp_precision prec;
    int threads, json;
} grad_args;

static int parse(grad_args *a, int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"batch", required_argument, 0, 'b'},
                                         {"out", required_argument, 0, 'o'},
                                         {"schedule", required_argument, 0, 's'},
                                         {"chunk", required_argument, 0, 'c'},
                                         {"logit-chunk", required_argument, 0, 'l'},
                                         {"chunked-logits", no_argument, 0, 'L'},
                                         {"block", required_argument, 0, 'B'},
                                         {"precision", required_argument, 0, 'p'},
                                         {"threads", required_argument, 0, 't'},
                                         {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    memset(a, 0, sizeof *a);
    a->g.schedule = SBP_STREAM;
    a->threads = omp_get_num_procs();
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'b': a->batch = optarg; break;
        case 'o': a->out = optarg; break;
        case 's':
            if (!sbp_schedule_parse(optarg, &a->g.schedule)) {
                fprintf(stderr,
                        "streambp grad: --schedule must be full, ckpt or stream, got "
                        "\"%s\"\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        case 'c':
            if (!parse_pos_int("grad", "chunk", optarg, &a->g.chunk)) return EXIT_USAGE;
            break;
        case 'l':
            if (!parse_pos_int("grad", "logit-chunk", optarg, &a->g.logit_chunk)) return EXIT_USAGE;
            break;
        case 'L': a->g.chunked_logits = 1; break;
        case 'B':
            if (!parse_pos_int("grad", "block", optarg, &a->g.block)) return EXIT_USAGE;
            break;
        case 'p':
            if (!parse_precision("grad", optarg, &a->prec)) return EXIT_USAGE;
            break;
        case 't':
            if (!parse_pos_int("grad", "threads", optarg, &a->threads)) return EXIT_USAGE;
            break;
        case 'j': a->json = 1; break;
        case 'h': fputs(usage, stdout); return -1;
        default: fputs(usage, stderr); return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "streambp grad: unexpected argument \"%s\"\n", argv[optind]);
        return EXIT_USAGE;
    }
    if (!a->model || !a->batch) {
        fprintf(stderr, "streambp grad: --model and --batch are required\n%s", usage);
        return EXIT_USAGE;
    }
    return 0;
}

static void print_text(const grad_args *a, const sbp_model *m, const sbp_batch *b,
                       const sbp_grad_result *r, const sbp_ledger *lg, double secs) {
    const sbp_config *c = &m->cfg;
    printf("model     %s: %s, L=%d C=%d heads %d/%d head_dim %d F=%d V=%d%s\n", a->model,
           c->model_type, c->layers, c->hidden, c->heads, c->kv_heads, c->head_dim, c->ffn,
           c->vocab, c->tied ? ", tied embeddings" : "");
    printf("batch     %s: B=%d T=%d, %lld targets", a->batch, b->B, b->T, (long long)b->n_targets);
    if (b->n_pad_targets)
        printf(" (%lld predicted from padded positions; see ref/SEMANTICS.md)",
               (long long)b->n_pad_targets);
    printf("\nschedule  %s, %s, block %d, chunk %d, logit chunk %d%s, %d threads\n",
           sbp_schedule_name(a->g.schedule), a->prec == SBP_FP64 ? "fp64" : "fp32", r->block,
           a->g.schedule == SBP_STREAM ? r->chunk : b->T, r->logit_chunk,
           a->g.schedule != SBP_STREAM && !a->g.chunked_logits ? " (materialised B*T*V)" : "",
           a->threads);
    printf("loss      %.17g\n", r->loss);
    printf("time      %.3f s\n", secs);
    print_ledger(stdout, lg, "  ");
    printf("  peak RSS %.1f MiB (the whole process: binary, libraries, batch, buffers)\n",
           peak_rss_bytes() / 1048576.0);
    if (a->out) printf("wrote     %s (%d tensors)\n", a->out, m->params.n);
}

static void print_json(const grad_args *a, const sbp_model *m, const sbp_batch *b,
                       const sbp_grad_result *r, const sbp_ledger *lg, double secs) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", a->model);
    cJSON_AddStringToObject(o, "model_type", m->cfg.model_type);
    cJSON_AddStringToObject(o, "batch", a->batch);
    cJSON_AddNumberToObject(o, "B", b->B);
    cJSON_AddNumberToObject(o, "T", b->T);
    cJSON_AddNumberToObject(o, "n_targets", (double)b->n_targets);
    cJSON_AddNumberToObject(o, "n_pad_targets", (double)b->n_pad_targets);
    cJSON_AddStringToObject(o, "schedule", sbp_schedule_name(a->g.schedule));
    cJSON_AddStringToObject(o, "precision", a->prec == SBP_FP64 ? "fp64" : "fp32");
    cJSON_AddNumberToObject(o, "block", r->block);
    cJSON_AddNumberToObject(o, "chunk", a->g.schedule == SBP_STREAM ? r->chunk : b->T);
    cJSON_AddNumberToObject(o, "logit_chunk", r->logit_chunk);
    cJSON_AddBoolToObject(o, "materialised_logits",
                          a->g.schedule != SBP_STREAM && !a->g.chunked_logits);
    cJSON_AddNumberToObject(o, "threads", a->threads);
    char loss[40];
    snprintf(loss, sizeof loss, "%.17g", r->loss);
    cJSON_AddRawToObject(o, "loss", loss);
    cJSON_AddNumberToObject(o, "seconds", secs);
    cJSON_AddItemToObject(o, "memory", ledger_json(lg));
    cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)peak_rss_bytes());
    if (a->out) cJSON_AddStringToObject(o, "out", a->out);
    char *text = cJSON_Print(o);
    puts(text);
    free(text);
    cJSON_Delete(o);
}

int cmd_grad(int argc, char **argv) {
    grad_args a;
    int rc = parse(&a, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    sbp_set_threads(a.threads);
    sbp_err err = {0};
    sbp_ledger lg = {0};
    sbp_model m;
    sbp_batch b;
    sbp_grad_result r = {0};
    if (a.out && sbp_check_writable(a.out, &err)) return report_error("grad", &err);
    if (sbp_model_load(&m, a.model, a.prec, &lg, &err)) return report_error("grad", &err);
    if (sbp_batch_load(&b, a.batch, &m.cfg, &err)) {
        sbp_model_free(&m, &lg);
        return report_error("grad", &err);
    }
    double t0 = now_seconds();
    sbp_status st = sbp_grad(&r, &m, &b, &a.g, &lg, &err);
    double secs = now_seconds() - t0;
    if (!st && a.out) {
        char loss[40], n[24], block[16], chunk[16], lchunk[16], threads[16];
        snprintf(loss, sizeof loss, "%.17g", r.loss);
        snprintf(n, sizeof n, "%lld", (long long)r.n_targets);
        snprintf(block, sizeof block, "%d", r.block);
        snprintf(chunk, sizeof chunk, "%d", a.g.schedule == SBP_STREAM ? r.chunk : b.T);
        snprintf(lchunk, sizeof lchunk, "%d", r.logit_chunk);
        snprintf(threads, sizeof threads, "%d", a.threads);
        const char *meta[] = {"loss",
                              loss,
                              "n_targets",
                              n,
                              "objective",
                              "sft",
                              "schedule",
                              sbp_schedule_name(a.g.schedule),
                              "precision",
                              a.prec == SBP_FP64 ? "fp64" : "fp32",
                              "block",
                              block,
                              "chunk",
                              chunk,
                              "logit_chunk",
                              lchunk,
                              "threads",
                              threads,
                              "model",
                              a.model,
                              "batch",
                              a.batch,
                              "implementation",
                              "streambp " SBP_VERSION,
                              NULL};
        st = sbp_grads_save(a.out, &m.params, a.prec, r.grads, meta, &err);
    }
    if (!st) {
        if (a.json)
            print_json(&a, &m, &b, &r, &lg, secs);
        else
            print_text(&a, &m, &b, &r, &lg, secs);
        sbp_grad_result_free(&r, &lg);
    }
    sbp_batch_free(&b);
    sbp_model_free(&m, &lg);
    return st ? report_error("grad", &err) : 0;
}
