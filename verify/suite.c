/* suite.c — the edge-case fixtures (see suite.h). Batches are written by data/make_batches.py. */
#include "suite.h"
#include "../src/core/err.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const sbp_suite_case cases[] = {
    {"t-not-divisible",
     "T = 22 is not a multiple of the chunks 8 and 12: a short last chunk",
     "qwen3-tiny",
     "suite-t22",
     4,
     {8, 12, 5},
     3},
    {"chunk-1", "chunk = 1: every token its own chunk", "qwen3-tiny", "sft-tiny", 4, {1}, 1},
    {"chunk-T", "chunk = T: one chunk per layer", "qwen3-tiny", "sft-tiny", 4, {24}, 1},
    {"chunk-over-T", "chunk = T + 5: clamped to T", "qwen3-tiny", "sft-tiny", 4, {29}, 1},
    {"chunk-starts-on-ignored",
     "chunks start on a -100 label with valid targets right after (prompt masking)",
     "qwen3-tiny",
     "suite-chunk-starts-on-ignored",
     4,
     {8, 7},
     2},
    {"left-padding",
     "left-padded rows: queries with no visible key",
     "llama3-tiny",
     "suite-left-padding",
     4,
     {8, 7},
     2},
    {"right-padding", "right-padded rows", "qwen2-tiny", "suite-right-padding", 4, {8, 7}, 2},
    {"unequal-rows",
     "B = 3: one row with no target, two with very unequal target counts",
     "qwen3-tiny",
     "suite-unequal-rows",
     4,
     {8, 7},
     2},
    {"single-target",
     "exactly one valid target in the batch",
     "llama3-tiny",
     "suite-single-target",
     4,
     {8, 7},
     2},
    {"target-from-padding",
     "a valid target predicted from a padded position, and a hole in the attention mask",
     "qwen3-tiny",
     "suite-target-from-padding",
     4,
     {8, 7},
     2},
    {"gqa-1",
     "GQA 1:1 (Qwen2-tiny: 4 query heads, 4 key/value heads)",
     "qwen2-tiny",
     "sft-demo",
     16,
     {16, 32, 7},
     3},
    {"gqa-2",
     "GQA 2:1 (Qwen3-tiny: 4 query heads, 2 key/value heads)",
     "qwen3-tiny",
     "sft-demo",
     16,
     {16, 32, 7},
     3},
    {"gqa-4",
     "GQA 4:1 (Llama3-tiny: 4 query heads, 1 key/value head)",
     "llama3-tiny",
     "sft-demo",
     16,
     {16, 32, 7},
     3},
    {"tied-embeddings",
     "tied embeddings: one tensor for the embedding and head gradients",
     "qwen3-tiny",
     "sft-tiny",
     4,
     {8, 7},
     2},
    {"qwen3-head-dim",
     "Qwen3: head_dim 32 != hidden/heads 16, per-head q/k norm",
     "qwen3-tiny",
     "suite-left-padding",
     4,
     {8, 7},
     2},
    {"qwen2-bias", "Qwen2.5: q/k/v biases, untied head", "qwen2-tiny", "sft-tiny", 4, {8, 7}, 2},
    {"llama3-rope",
     "Llama-3 RoPE scaling: frequencies in all three llama3 bands",
     "llama3-tiny",
     "sft-tiny",
     4,
     {8, 7},
     2},
};

int sbp_suite_count(void) {
    return (int)(sizeof cases / sizeof cases[0]);
}

const sbp_suite_case *sbp_suite_case_at(int i) {
    return i >= 0 && i < sbp_suite_count() ? &cases[i] : NULL;
}

int sbp_suite_find(const char *name) {
    for (int i = 0; i < sbp_suite_count(); i++)
        if (strcmp(cases[i].name, name) == 0) return i;
    return -1;
}

sbp_status sbp_suite_run(sbp_verify_report *rep, int i, const char *data_dir, const char *workdir,
                         sbp_err *err) {
    const sbp_suite_case *c = sbp_suite_case_at(i);
    if (!c) return sbp_fail(err, SBP_EUSAGE, "no suite case %d", i);
    char model[1024], batch[1024], cfgpath[1024];
    snprintf(model, sizeof model, "%s/%s-seed1", workdir, c->model);
    snprintf(batch, sizeof batch, "%s/batches/%s.safetensors", data_dir, c->batch);
    struct stat sb;
    if (stat(model, &sb) != 0) {
        sbp_config cfg;
        snprintf(cfgpath, sizeof cfgpath, "%s/models/%s.json", data_dir, c->model);
        sbp_status st = sbp_config_load(&cfg, cfgpath, err);
        if (st || (st = sbp_model_init(&cfg, 1, model, err))) return st;
    }
    sbp_verify_opts o = {
        .model = model, .batch = batch, .block = c->block, .n_chunks = c->n_chunks};
    memcpy(o.chunks, c->chunks, sizeof c->chunks);
    return sbp_verify_run(rep, &o, err);
}
