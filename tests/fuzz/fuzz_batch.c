/* fuzz_batch.c — libFuzzer target: a batch file for SFT, DPO or GRPO (the first byte picks the
 * objective and whether rewards are scaled; the rest is the safetensors file), loaded against
 * the Qwen3-tiny config (V = 200). A batch that loads must hold ids and labels in range. */
#include "fuzz.h"
#include "../../src/streambp.h"

static const char cfg_json[] =
    "{\"model_type\": \"qwen3\", \"vocab_size\": 200, \"hidden_size\": 64, "
    "\"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
    "\"num_key_value_heads\": 2, \"head_dim\": 32, \"rms_norm_eps\": 1e-6}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    static sbp_config cfg;
    static int ready;
    sbp_err err = {0};
    if (!ready && sbp_config_parse(&cfg, cfg_json, "fuzz config", &err) != SBP_OK) abort();
    ready = 1;
    sbp_objective_kind kind = (sbp_objective_kind)(data[0] % 3);
    char path[64];
    int fd = fuzz_file(path, data + 1, n - 1);
    if (fd < 0) return 0;
    sbp_batch b;
    if (sbp_batch_load_as(&b, path, &cfg, kind, (data[0] >> 2) & 1, &err) == SBP_OK) {
        for (size_t i = 0; i < (size_t)b.B * b.T; i++)
            if (b.ids[i] < 0 || b.ids[i] >= cfg.vocab ||
                (b.labels[i] != SBP_IGNORE && (b.labels[i] < 0 || b.labels[i] >= cfg.vocab)) ||
                b.mask[i] > 1)
                abort();
        sbp_batch_free(&b);
    }
    close(fd);
    return 0;
}
