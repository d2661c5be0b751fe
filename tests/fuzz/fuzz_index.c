/* fuzz_index.c — libFuzzer target: model.safetensors.index.json of a model directory whose
 * config.json and two shard files are real (a one-layer Qwen3, written once per process), loaded
 * with sbp_model_check and sbp_model_load. */
#include "fuzz.h"
#include "../../src/io/safetensors.h"
#include "../../src/streambp.h"

#include <string.h>
#include <sys/stat.h>

static char dir[128];

static void setup(void) {
    static const char cfg_json[] =
        "{\"model_type\": \"qwen3\", \"vocab_size\": 16, \"hidden_size\": 8, "
        "\"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, \"head_dim\": 4, \"rms_norm_eps\": 1e-6}";
    snprintf(dir, sizeof dir, "/dev/shm/sbp-fuzz-index-%ld", (long)getpid());
    mkdir(dir, 0700);
    char p[256];
    sbp_config cfg;
    sbp_params ps;
    sbp_err err = {0};
    if (sbp_config_parse(&cfg, cfg_json, "fuzz", &err) || sbp_params_build(&ps, &cfg, &err))
        abort();
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fputs(cfg_json, f);
    fclose(f);
    /* tensors 0..k-1 in the first shard, the rest in the second */
    float *w = calloc((size_t)ps.total, sizeof *w);
    sbp_st_entry e[32];
    for (int i = 0; i < ps.n; i++)
        e[i] = (sbp_st_entry){ps.p[i].name,
                              SBP_DT_F32,
                              ps.p[i].ndim,
                              {ps.p[i].shape[0], ps.p[i].shape[1]},
                              w + ps.p[i].offset};
    int k = ps.n / 2;
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    if (sbp_st_write(p, e, k, NULL, &err)) abort();
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    if (sbp_st_write(p, e + k, ps.n - k, NULL, &err)) abort();
    free(w);
    sbp_params_free(&ps);
}

static void cleanup(void) {
    char p[256];
    const char *files[] = {"config.json", "model.safetensors.index.json",
                           "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (!dir[0]) {
        setup();
        atexit(cleanup);
    }
    char p[256];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(p, "wb");
    if (!f) return 0;
    fwrite(data, 1, n, f);
    fclose(f);
    sbp_config cfg;
    sbp_model m;
    sbp_err err = {0};
    if (sbp_model_check(&cfg, dir, &err) == SBP_OK &&
        sbp_model_load(&m, dir, SBP_FP32, NULL, &err) == SBP_OK)
        sbp_model_free(&m, NULL);
    return 0;
}
