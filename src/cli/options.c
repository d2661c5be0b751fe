/* options.c — the parsing of the options several commands share (options.h). */
#include "options.h"
#include "cli.h"

#include <omp.h>
#include <stdio.h>
#include <string.h>

int common_opt_code(int c) {
    return c >= COMMON_OPT_MODEL && c < COMMON_OPT_END_;
}

/* The option's name for the table mistake's message. */
static const char *name_of(int c) {
    static const char *const names[] = {"model",      "block",    "chunk",    "logit-chunk",
                                        "threads",    "schedule", "numerics", "device",
                                        "unattended", "seed",     "json"};
    return names[c - COMMON_OPT_MODEL];
}

/* dst is NULL: the command listed an option it has no field for. */
static int missing(const common_opts *o, int c) {
    fprintf(stderr, "streambp %s: --%s is not an option of this command\n", o->cmd, name_of(c));
    return 0;
}

int common_opt(common_opts *o, int c, const char *arg) {
    const char *cmd = o->cmd;
    switch (c) {
    case COMMON_OPT_MODEL:
        if (!o->model) return missing(o, c);
        *o->model = arg;
        return 1;
    case COMMON_OPT_BLOCK:
        return o->block ? parse_pos_int(cmd, "block", arg, o->block) : missing(o, c);
    case COMMON_OPT_CHUNK:
        return o->chunk ? parse_pos_int(cmd, "chunk", arg, o->chunk) : missing(o, c);
    case COMMON_OPT_LOGIT_CHUNK:
        return o->logit_chunk ? parse_pos_int(cmd, "logit-chunk", arg, o->logit_chunk)
                              : missing(o, c);
    case COMMON_OPT_THREADS:
        return o->threads ? parse_pos_int(cmd, "threads", arg, o->threads) : missing(o, c);
    case COMMON_OPT_SCHEDULE:
        if (!o->schedule) return missing(o, c);
        if (sbp_schedule_parse(arg, o->schedule)) return 1;
        fprintf(stderr, "streambp %s: --schedule must be full, ckpt or stream, got \"%s\"\n", cmd,
                arg);
        return 0;
    case COMMON_OPT_NUMERICS:
        if (!o->numerics) return missing(o, c);
        o->numerics_given = 1;
        return parse_numerics(cmd, arg, o->numerics);
    case COMMON_OPT_DEVICE: return o->device ? parse_device(cmd, arg, o->device) : missing(o, c);
    case COMMON_OPT_UNATTENDED:
        return o->unattended ? parse_unattended(cmd, arg, o->unattended) : missing(o, c);
    case COMMON_OPT_SEED:
        return o->seed ? parse_seed_opt(cmd, "seed", arg, o->seed) : missing(o, c);
    case COMMON_OPT_JSON:
        if (!o->json) return missing(o, c);
        *o->json = 1;
        return 1;
    }
    fprintf(stderr, "streambp %s: option code %d is not a shared option\n", cmd, c);
    return 0;
}

int default_threads(void) {
    int n = omp_get_max_threads(); /* before any omp_set_num_threads of this process */
    return n < 1 ? 1 : n > SBP_MAX_THREADS ? SBP_MAX_THREADS : n;
}

/* A chunk of n tokens (0: the default, default_n) that splits a token block of a T-token row. */
static int splits_blocks(int n, int default_n, int block, int T) {
    n = n ? n : default_n;
    return n % block && (T <= 0 || n < T);
}

int note_fast_chunks(const char *cmd, const sbp_grad_opts *g, int T) {
    if (g->numerics != SBP_NUMERICS_FAST || g->device != SBP_DEVICE_CPU) return 0;
    const int block = g->block ? g->block : SBP_DEFAULT_BLOCK;
    const int layer =
        g->schedule == SBP_STREAM && splits_blocks(g->chunk, SBP_DEFAULT_CHUNK(block), block, T);
    const int logits = (g->schedule == SBP_STREAM || g->chunked_logits) &&
                       splits_blocks(g->logit_chunk, block, block, T);
    if (!layer && !logits) return 0;
    char what[96];
    const int chunk = g->chunk ? g->chunk : SBP_DEFAULT_CHUNK(block),
              logit = g->logit_chunk ? g->logit_chunk : block;
    if (layer && logits)
        snprintf(what, sizeof what, "--chunk %d and --logit-chunk %d are not multiples", chunk,
                 logit);
    else
        snprintf(what, sizeof what, "--%s %d is not a multiple", layer ? "chunk" : "logit-chunk",
                 layer ? chunk : logit);
    fprintf(stderr,
            "streambp %s: note: %s of --block %d: in the fast numerics full, ckpt and stream "
            "then agree to rounding, not bit for bit (docs/numerics.md section 1); give "
            "multiples of the block%s for the bitwise promise\n",
            cmd, what, block, strcmp(cmd, "train") ? ", or --numerics portable," : "");
    return 1;
}
