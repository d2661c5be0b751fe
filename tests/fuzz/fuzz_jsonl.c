/* fuzz_jsonl.c — libFuzzer target: the JSONL reader of train --jsonl (src/train/data.c), on the
 * bytes themselves (sbp_data_jsonl_bytes: the file reader's line splitting, line limit and record
 * checks). The first byte picks T (1..32) and B (1..4). Whatever is accepted must give at least
 * one record, and every micro-batch of it must build with ids inside the vocabulary, labels
 * inside it or -100, and exactly T tokens a row. */
#include "fuzz.h"
#include "../../src/streambp.h"
#include "../../src/train/data.h"

#include <string.h>

enum { VOCAB = 200 };

/* sbp_hash64 lives in src/train/checkpoint.c, outside the fuzz build; the reader only feeds it
 * (weak: the real one wins if it is ever linked in) */
__attribute__((weak)) uint64_t sbp_hash64(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    sbp_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab = VOCAB;
    sbp_data_opts o = {.jsonl = "fuzz.jsonl",
                       .T = 1 + data[0] % 32,
                       .B = 1 + (data[0] >> 5) % 4,
                       .scale_rewards = 1};
    sbp_data *d = NULL;
    sbp_err err = {0};
    if (sbp_data_jsonl_bytes(&d, (const char *)data + 1, n - 1, &o, &cfg, &err) != SBP_OK) {
        if (d || !err.msg[0]) abort(); /* a failure leaves nothing and says why */
        return 0;
    }
    int64_t items = sbp_data_items(d);
    if (items < 1) abort();
    for (int64_t i = 0; i < items; i += o.B) {
        int64_t idx[4];
        int k = 0;
        for (; k < o.B && i + k < items; k++) idx[k] = i + k;
        sbp_batch b;
        if (sbp_data_batch(&b, d, idx, k, &err) != SBP_OK) abort();
        if (b.B != k || b.T != o.T) abort();
        for (int64_t t = 0; t < (int64_t)b.B * b.T; t++) {
            if (b.ids[t] < 0 || b.ids[t] >= VOCAB) abort();
            if (b.labels[t] != SBP_IGNORE && (b.labels[t] < 0 || b.labels[t] >= VOCAB)) abort();
        }
        sbp_batch_free(&b);
    }
    sbp_data_free(d);
    return 0;
}
