/* fuzz_adapter_config.c — libFuzzer target: an adapter_config.json through the library's strict
 * JSON reader and sbp_lora_config_from_json; a config that passes must have a rank and alpha in
 * range and give a parameter table for a small model whose counts agree with its rank. */
#include "fuzz.h"
#include "../../src/io/json.h"
#include "../../src/io/lora.h"

#include <math.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    cJSON *j = NULL;
    sbp_err err = {0};
    if (sbp_json_parse(&j, (const char *)data, n, "fuzz", &err) != SBP_OK) return 0;
    sbp_lora_config c;
    if (sbp_lora_config_from_json(&c, j, "fuzz", &err) == SBP_OK) {
        if (c.r < 1 || c.r > 1048576 || !(c.alpha > 0) || !isfinite(c.alpha) || !c.targets) abort();
        sbp_config cfg;
        static const char model[] =
            "{\"model_type\": \"qwen3\", \"vocab_size\": 32, \"hidden_size\": 16, "
            "\"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
            "\"num_key_value_heads\": 1, \"head_dim\": 8, \"rms_norm_eps\": 1e-6, "
            "\"rope_theta\": 10000.0, \"tie_word_embeddings\": true}";
        if (sbp_config_parse(&cfg, model, "fuzz-model", &err) != SBP_OK) abort();
        sbp_params ps;
        if (c.r <= 64 && sbp_lora_params_build(&ps, &cfg, &c, &err) == SBP_OK) {
            for (int i = 0; i < ps.n; i++)
                if (ps.p[i].shape[ps.p[i].lora == 1 ? 0 : 1] != c.r) abort();
            sbp_params_free(&ps);
        }
    }
    cJSON_Delete(j);
    return 0;
}
