/* fuzz_config.c — libFuzzer target: a config.json, parsed by sbp_config_parse; a config that
 * passes must give a parameter table whose total agrees with sbp_config_param_count, and must
 * survive a save and a reload unchanged. */
#include "fuzz.h"
#include "../../src/streambp.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    char *text = malloc(n + 1);
    if (!text) return 0;
    memcpy(text, data, n);
    text[n] = '\0';
    sbp_config cfg;
    sbp_err err = {0};
    if (sbp_config_parse(&cfg, text, "fuzz", &err) == SBP_OK) {
        int64_t count = sbp_config_param_count(&cfg);
        if (count < 1) abort();
        if (cfg.layers <= 64) { /* the table of a larger config is only larger */
            sbp_params ps;
            if (sbp_params_build(&ps, &cfg, &err) == SBP_OK) {
                if (ps.total != count) abort();
                sbp_params_free(&ps);
            }
        }
        char path[64];
        snprintf(path, sizeof path, "/dev/shm/sbp-fuzz-config-%ld.json", (long)getpid());
        sbp_config back;
        if (sbp_config_save(&cfg, path, &err) == SBP_OK) {
            if (sbp_config_load(&back, path, &err) != SBP_OK || back.vocab != cfg.vocab ||
                back.head_dim != cfg.head_dim || back.eps != cfg.eps ||
                back.rope_theta != cfg.rope_theta || back.rope_factor != cfg.rope_factor)
                abort(); /* what we write must read back as it was */
            unlink(path);
        }
    }
    free(text);
    return 0;
}
