/* suite.c — the edge-case fixtures (see suite.h). Batches are written by data/make_batches.py. */
#include "suite.h"
#include "../src/core/err.h"
#include "../src/io/file.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* clang-format off */
#define CASE(name_, what_, model_, batch_, block_, ...)                                           \
    {.name = name_, .what = what_, .model = model_, .batch = batch_, .block = block_, __VA_ARGS__}
#define CHUNKS(...) .chunks = {__VA_ARGS__}, .n_chunks = sizeof((int[]){__VA_ARGS__}) / sizeof(int)
#define DPO(...) {.kind = SBP_OBJ_DPO, .beta = 0.1, __VA_ARGS__}
/* GRPO with clip range [1 - lo, 1 + hi] and temperature tau */
#define GRPO(lo, hi, tau, ...)                                                                    \
    {.kind = SBP_OBJ_GRPO, .epsilon_low = lo, .epsilon_high = hi, .temperature = tau, __VA_ARGS__}

static const sbp_suite_case cases[] = {
    /* chunk boundaries */
    CASE("t-not-divisible", "T = 22 is not a multiple of the chunks 8 and 12: a short last chunk",
         "qwen3-tiny", "suite-t22", 4, CHUNKS(8, 12, 5)),
    CASE("chunk-1", "chunk = 1: every token its own chunk", "qwen3-tiny", "sft-tiny", 4,
         CHUNKS(1)),
    CASE("chunk-T", "chunk = T: one chunk per layer", "qwen3-tiny", "sft-tiny", 4, CHUNKS(24)),
    CASE("chunk-over-T", "chunk = T + 5: clamped to T", "qwen3-tiny", "sft-tiny", 4, CHUNKS(29)),
    CASE("chunk-starts-on-ignored",
         "chunks start on a -100 label with valid targets right after (prompt masking)",
         "qwen3-tiny", "suite-chunk-starts-on-ignored", 4, CHUNKS(8, 7)),
    /* padding and batch shapes */
    CASE("left-padding", "left-padded rows: queries with no visible key", "llama3-tiny",
         "suite-left-padding", 4, CHUNKS(8, 7)),
    CASE("right-padding", "right-padded rows", "qwen2-tiny", "suite-right-padding", 4,
         CHUNKS(8, 7)),
    CASE("unequal-rows", "B = 3: one row with no target, two with very unequal target counts",
         "qwen3-tiny", "suite-unequal-rows", 4, CHUNKS(8, 7)),
    CASE("single-target", "exactly one valid target in the batch", "llama3-tiny",
         "suite-single-target", 4, CHUNKS(8, 7)),
    CASE("target-from-padding",
         "a valid target predicted from a padded position, and a hole in the attention mask",
         "qwen3-tiny", "suite-target-from-padding", 4, CHUNKS(8, 7)),
    /* architectures */
    CASE("gqa-1", "GQA 1:1 (Qwen2-tiny: 4 query heads, 4 key/value heads)", "qwen2-tiny",
         "sft-demo", 16, CHUNKS(16, 32, 7)),
    CASE("gqa-2", "GQA 2:1 (Qwen3-tiny: 4 query heads, 2 key/value heads)", "qwen3-tiny",
         "sft-demo", 16, CHUNKS(16, 32, 7)),
    CASE("gqa-4", "GQA 4:1 (Llama3-tiny: 4 query heads, 1 key/value head)", "llama3-tiny",
         "sft-demo", 16, CHUNKS(16, 32, 7)),
    CASE("tied-embeddings", "tied embeddings: one tensor for the embedding and head gradients",
         "qwen3-tiny", "sft-tiny", 4, CHUNKS(8, 7)),
    CASE("qwen3-head-dim", "Qwen3: head_dim 32 != hidden/heads 16, per-head q/k norm",
         "qwen3-tiny", "suite-left-padding", 4, CHUNKS(8, 7)),
    CASE("qwen2-bias", "Qwen2.5: q/k/v biases, untied head", "qwen2-tiny", "sft-tiny", 4,
         CHUNKS(8, 7)),
    CASE("llama3-rope", "Llama-3 RoPE scaling: frequencies in all three llama3 bands",
         "llama3-tiny", "sft-tiny", 4, CHUNKS(8, 7)),
    /* objectives */
    CASE("dpo-sigmoid",
         "DPO sigmoid, label smoothing 0.1: chosen and rejected of different lengths, padded",
         "qwen3-tiny", "dpo-tiny", 4, CHUNKS(8, 7), .obj = DPO(.label_smoothing = 0.1)),
    CASE("dpo-ipo", "DPO ipo: per-token mean log-probs", "qwen2-tiny", "dpo-tiny", 4,
         CHUNKS(8, 7), .obj = DPO(.dpo_loss = SBP_DPO_IPO)),
    CASE("dpo-single-token",
         "DPO, reference model: a pair whose chosen completion is a single token",
         "llama3-tiny", "dpo-noref", 4, CHUNKS(8, 7), .obj = DPO(), .ref_seed = 2),
    CASE("grpo-temperature",
         "GRPO grpo, KL 0.04, temperature 0.7: completion masks starting mid-chunk",
         "qwen3-tiny", "grpo-tiny", 4, CHUNKS(8, 7),
         .obj = GRPO(0.2, 0.2, 0.7, .beta = 0.04)),
    CASE("grpo-clipped", "GRPO dr_grpo, narrow clip range: both branches of the min",
         "llama3-tiny", "grpo-tiny", 4, CHUNKS(8, 7),
         .obj = GRPO(0.05, 0.05, 1, .grpo_loss = SBP_GRPO_DR_GRPO, .max_completion_length = 16)),
    CASE("grpo-bnpo", "GRPO bnpo: one normaliser for all completion tokens", "qwen2-tiny",
         "grpo-tiny", 4, CHUNKS(8, 7), .obj = GRPO(0.2, 0.2, 1, .grpo_loss = SBP_GRPO_BNPO, .beta = 0.04)),
    CASE("grpo-dapo", "GRPO dapo, reference model for the KL term (beta 0.1)", "qwen3-tiny",
         "grpo-tiny", 4, CHUNKS(8, 7), .obj = GRPO(0.2, 0.28, 1, .grpo_loss = SBP_GRPO_DAPO, .beta = 0.1),
         .ref_seed = 2),
    CASE("grpo-equal-rewards", "GRPO: a group with equal rewards, so zero advantages",
         "llama3-tiny", "grpo-equal-rewards", 4, CHUNKS(8, 7), .obj = GRPO(0.2, 0.2, 1, .beta = 0.04)),
    CASE("grpo-no-old-logps", "GRPO, advantages given and no old log-probs: ratio 1",
         "qwen3-tiny", "grpo-adv", 4, CHUNKS(8, 7), .obj = GRPO(0.2, 0.2, 1)),
    /* issue 11: each feature on a second fixture of another shape, and the blind spots */
    CASE("qwen3-default-head-dim",
         "Qwen3 config without head_dim: HF's default 128, not hidden/heads = 32",
         "qwen3-nohd", "suite-left-padding", 4, CHUNKS(8, 7)),
    CASE("target-from-padding-2",
         "B = 3, T = 30: targets predicted from pads after left padding and across a hole",
         "llama3-tiny", "suite-target-from-padding-2", 4, CHUNKS(8, 7)),
    CASE("dpo-ipo-ref", "DPO ipo, reference model (means of its log-probs), unequal lengths",
         "llama3-tiny", "dpo-noref", 4, CHUNKS(8, 7), .obj = DPO(.dpo_loss = SBP_DPO_IPO),
         .ref_seed = 2),
    CASE("grpo-clip-asym",
         "GRPO grpo, clip range [0.9, 1.4] at temperature 1, ratios on both sides of it",
         "qwen3-tiny", "grpo-clip", 4, CHUNKS(8, 7), .obj = GRPO(0.1, 0.4, 1, .beta = 0.04)),
    CASE("grpo-bnpo-clip", "GRPO bnpo, clip range [0.95, 1.3] at temperature 1", "llama3-tiny",
         "grpo-clip", 4, CHUNKS(8, 7),
         .obj = GRPO(0.05, 0.3, 1, .grpo_loss = SBP_GRPO_BNPO, .beta = 0.04)),
    CASE("grpo-dr-ragged",
         "GRPO dr_grpo, default max_completion_length: micro-batches of T 32, 26, 19",
         "qwen2-tiny", "grpo-ragged", 4, CHUNKS(8, 7),
         .obj = GRPO(0.2, 0.2, 1, .grpo_loss = SBP_GRPO_DR_GRPO)),
    CASE("grpo-dapo-ragged", "GRPO dapo over rows of very different lengths", "llama3-tiny",
         "grpo-ragged", 4, CHUNKS(8, 7), .obj = GRPO(0.2, 0.28, 1, .grpo_loss = SBP_GRPO_DAPO)),
    CASE("grpo-ref-temperature",
         "GRPO, reference model at temperature 0.7 (KL 0.1): its log-probs at the temperature",
         "qwen2-tiny", "grpo-clip", 4, CHUNKS(8, 7), .obj = GRPO(0.2, 0.2, 0.7, .beta = 0.1),
         .ref_seed = 2),
    CASE("long-positions",
         "float32 at positions 19904..19999 (T = 20000, left-padded): RoPE angles of 2e4 rad",
         "long-tiny", "sft-long-positions", 256, CHUNKS(1024),
         .precisions = 1 << SBP_FP32, .schedules = 1 << SBP_FULL, .threads = 1),
    /* issue 34: Gemma-3's sliding windows (gemma3-tiny W = 8, layer 2 global; gemma3-w64 W = 64,
     * the portable attention's key tile) */
    CASE("gemma3-window-lt-chunk",
         "Gemma-3, W = 8, T = 40: chunks of 12 and 20 hold whole windows, chunks of 5 straddle",
         "gemma3-tiny", "suite-gemma3-long", 4, CHUNKS(12, 20, 5)),
    CASE("gemma3-left-pad-window",
         "Gemma-3, W = 8: left padding inside and beyond the window, targets from pads, a hole",
         "gemma3-tiny", "suite-gemma3-left-pad-window", 4, CHUNKS(8, 7, 3)),
    CASE("gemma3-window-over-T", "Gemma-3, W = 64 > T = 40: sliding layers see every key",
         "gemma3-w64", "suite-gemma3-short", 4, CHUNKS(8, 7)),
    CASE("gemma3-window-is-tile",
         "Gemma-3, W = 64 = the key tile and the block, T = 150: windows on and across tiles",
         "gemma3-w64", "suite-gemma3-tile", 64, CHUNKS(64, 50, 150)),
    CASE("gemma3-dpo", "Gemma-3 DPO sigmoid, reference model: rows of 20 and 24 > W = 8",
         "gemma3-tiny", "dpo-noref", 4, CHUNKS(8, 5), .obj = DPO(), .ref_seed = 2),
    CASE("gemma3-grpo", "Gemma-3 GRPO dapo, KL 0.04: completions past the window of the prompt",
         "gemma3-tiny", "grpo-tiny", 4, CHUNKS(8, 5),
         .obj = GRPO(0.2, 0.28, 1, .grpo_loss = SBP_GRPO_DAPO, .beta = 0.04)),
};

/* The reach cases (suite.h): each names the code it is there for. */
static const sbp_suite_case reach[] = {
    CASE("fast-ragged-tiles",
         "fast numerics at the default block 512: key tiles of 128 with a last one of 44 keys (a "
         "tail shorter than a float vector), one kv head (the two-pass backward at 2 threads), a "
         "chunk of 7 starting inside the block (the first dW block folded apart); T = 300 over "
         "three token blocks of the portable sums, V = 1100 over three vocabulary blocks",
         "qwen3-long", "sft-long", 512, CHUNKS(300, 7), .schedules = 1 << SBP_FULL | 1 << SBP_STREAM),
    CASE("fast-window-tiles",
         "Gemma-3 W = 20 across key tiles of 16 and chunks of 48 and 7, T = 300",
         "gemma3-long", "sft-long", 16, CHUNKS(48, 7), .schedules = 1 << SBP_FULL | 1 << SBP_STREAM),
    CASE("unattended-hf-sdpa", "rows that see no key, HF sdpa's softmax over all T keys",
         "qwen3-tiny", "suite-unattended-left-pad", 4, CHUNKS(8, 7),
         .schedules = 1 << SBP_FULL | 1 << SBP_STREAM, .unattended = SBP_UNATTENDED_HF_SDPA),
    CASE("unattended-hf-eager-window",
         "Gemma-3, rows that see no key in HF eager's mode (uniform over T keys): left padding "
         "longer than the window",
         "gemma3-tiny", "suite-gemma3-left-pad-window", 4, CHUNKS(8, 7),
         .schedules = 1 << SBP_FULL | 1 << SBP_STREAM, .unattended = SBP_UNATTENDED_HF_EAGER),
    CASE("reference-model", "DPO sigmoid, a reference model's log-probs (a streamed forward)",
         "qwen3-tiny", "dpo-noref", 4, CHUNKS(8, 7), .obj = DPO(),
         .schedules = 1 << SBP_FULL | 1 << SBP_STREAM, .ref_seed = 2),
    CASE("lora", "a LoRA adapter of rank 4 on every linear layer, the base frozen", "qwen3-tiny",
         "sft-tiny", 4, CHUNKS(8, 7), .schedules = 1 << SBP_FULL | 1 << SBP_STREAM, .lora_r = 4),
};
/* clang-format on */

int sbp_reach_count(void) {
    return (int)(sizeof reach / sizeof reach[0]);
}

const sbp_suite_case *sbp_reach_case_at(int i) {
    return i >= 0 && i < sbp_reach_count() ? &reach[i] : NULL;
}

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

/* Copies the file from to `to`, byte for byte. */
static sbp_status copy_file(const char *to, const char *from, sbp_err *err) {
    FILE *in, *out = NULL;
    uint64_t size;
    sbp_err open_err = {0}; /* the copy's own message below says what failed */
    if (sbp_open_regular(&in, &size, from, &open_err)) in = NULL; /* a FIFO must not block */
    if (in) out = fopen(to, "wb");
    char buf[8192];
    size_t n;
    int bad = !in || !out;
    while (!bad && (n = fread(buf, 1, sizeof buf, in)) > 0) bad = fwrite(buf, 1, n, out) != n;
    bad |= in && ferror(in);
    if (in) fclose(in);
    if (out) bad |= fclose(out) != 0;
    return bad ? sbp_fail(err, SBP_EIO, "cannot copy %s to %s", from, to) : SBP_OK;
}

/* workdir/<model>-seed<seed>, written on first use: the weights by sbp_model_init, config.json
 * the bundled file itself (see suite.h). */
static sbp_status model_dir(char *out, size_t n, const char *data_dir, const char *workdir,
                            const char *model, int seed, sbp_err *err) {
    snprintf(out, n, "%s/%s-seed%d", workdir, model, seed);
    struct stat sb;
    if (stat(out, &sb) == 0) return SBP_OK;
    char cfgpath[1024], dst[1100];
    sbp_config cfg;
    snprintf(cfgpath, sizeof cfgpath, "%s/models/%s.json", data_dir, model);
    snprintf(dst, sizeof dst, "%s/config.json", out);
    sbp_status st = sbp_config_load(&cfg, cfgpath, err);
    if (!st) st = sbp_model_init(&cfg, (uint64_t)seed, out, err);
    return st ? st : copy_file(dst, cfgpath, err);
}

/* workdir/<model>-lora<r>: an adapter of rank r on every linear layer of the model in dir. */
static sbp_status lora_dir(char *out, size_t n, const char *workdir, const char *model_name,
                           const char *model, int r, sbp_err *err) {
    snprintf(out, n, "%s/%s-lora%d", workdir, model_name, r);
    struct stat sb;
    if (stat(out, &sb) == 0) return SBP_OK;
    char cfgpath[1100];
    snprintf(cfgpath, sizeof cfgpath, "%s/config.json", model);
    sbp_config cfg;
    sbp_lora a = {0};
    const sbp_lora_config lc = {.r = r, .alpha = 2.0 * r, .targets = SBP_LORA_ALL};
    sbp_status st = sbp_config_load(&cfg, cfgpath, err);
    if (!st) st = sbp_lora_init(&a, &cfg, &lc, 1, 0.02, SBP_FP64, err);
    if (!st) st = sbp_lora_save(out, &a, model, err);
    sbp_lora_free(&a, NULL);
    return st;
}

sbp_status sbp_suite_run_case(sbp_verify_report *rep, const sbp_suite_case *c, const char *data_dir,
                              const char *workdir, sbp_err *err) {
    char model[1024], refm[1024], batch[1024], lora[1200];
    snprintf(batch, sizeof batch, "%s/batches/%s.safetensors", data_dir, c->batch);
    sbp_status st = model_dir(model, sizeof model, data_dir, workdir, c->model, 1, err);
    if (!st && c->ref_seed)
        st = model_dir(refm, sizeof refm, data_dir, workdir, c->model, c->ref_seed, err);
    if (!st && c->lora_r)
        st = lora_dir(lora, sizeof lora, workdir, c->model, model, c->lora_r, err);
    if (st) return st;
    sbp_verify_opts o = {.model = model,
                         .batch = batch,
                         .block = c->block,
                         .n_chunks = c->n_chunks,
                         .objective = c->obj,
                         .scale_rewards = 1,
                         .ref_model = c->ref_seed ? refm : NULL,
                         .precisions = c->precisions,
                         .schedules = c->schedules,
                         .numerics = c->numerics,
                         .unattended = c->unattended,
                         .lora = c->lora_r ? lora : NULL};
    if (c->threads == 1) o.n_threads = 1, o.threads[0] = 1;
    memcpy(o.chunks, c->chunks, sizeof c->chunks);
    return sbp_verify_run(rep, &o, err);
}

sbp_status sbp_suite_run(sbp_verify_report *rep, int i, const char *data_dir, const char *workdir,
                         sbp_err *err) {
    const sbp_suite_case *c = sbp_suite_case_at(i);
    if (!c) return sbp_fail(err, SBP_EUSAGE, "no suite case %d", i);
    return sbp_suite_run_case(rep, c, data_dir, workdir, err);
}
