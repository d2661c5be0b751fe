/* fuzz_trainer_state.c — libFuzzer target: a checkpoint's trainer_state.json through
 * sbp_train_state_parse. A state that parses must hold counts in [0, 2^53] (never a wrapped
 * value), settings that are all strings, and file names that stay inside the checkpoint with
 * SHA-256s of 64 lowercase hex digits. */
#include "fuzz.h"
#include "../../src/io/train_state.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    sbp_train_state s;
    sbp_err err = {0};
    if (sbp_train_state_parse(&s, (const char *)data, n, "fuzz", &err) != SBP_OK) {
        if (!err.msg[0] || s.root) abort(); /* a failure says why and leaves nothing to free */
        return 0;
    }
    const int64_t v[4] = {s.step, s.tokens, s.epoch, s.item};
    for (int i = 0; i < 4; i++)
        if (v[i] < 0 || v[i] > SBP_STATE_INT_MAX) abort();
    if (!cJSON_IsObject(s.settings)) abort();
    const cJSON *x;
    cJSON_ArrayForEach(x, s.settings) if (!cJSON_IsString(x)) abort();
    cJSON_ArrayForEach(x, s.files) {
        if (strchr(x->string, '/') || !strcmp(x->string, "..") || !strcmp(x->string, ".") ||
            !cJSON_IsString(x) || strlen(x->valuestring) != 64)
            abort();
    }
    sbp_train_state_free(&s);
    return 0;
}
