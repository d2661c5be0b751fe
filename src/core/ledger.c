/* ledger.c — the memory ledger: one allocator that charges every buffer to a category.
 *
 * Each block carries a 64-byte header in front of it holding its size and category, so that
 * sbp_ledger_free needs only the pointer. The header keeps the user pointer 64-byte aligned. */
#include "../streambp.h"

#include <stdlib.h>
#include <string.h>

#define HEADER 64

typedef struct {
    size_t bytes;
    int cat;
} block_header;

const char *sbp_mem_cat_name(sbp_mem_cat c) {
    static const char *names[SBP_MEM_NCATS] = {
        "weights", "grads", "optimizer", "checkpoints", "activations", "layer", "logits",
    };
    return (unsigned)c < SBP_MEM_NCATS ? names[c] : "?";
}

void *sbp_ledger_alloc(sbp_ledger *lg, sbp_mem_cat cat, size_t bytes) {
    size_t rounded = (bytes + HEADER - 1) / HEADER * HEADER;
    if (rounded < bytes || rounded > SIZE_MAX - HEADER) return NULL;
    char *base = aligned_alloc(HEADER, HEADER + rounded);
    if (!base) return NULL;
    memset(base + HEADER, 0, bytes);
    block_header *h = (block_header *)base;
    h->bytes = bytes;
    h->cat = (int)cat;
    if (lg) {
        lg->cur[cat] += (int64_t)bytes;
        lg->cur_total += (int64_t)bytes;
        lg->n_allocs++;
        if (lg->cur[cat] > lg->peak[cat]) lg->peak[cat] = lg->cur[cat];
        if (lg->cur_total > lg->peak_total) {
            lg->peak_total = lg->cur_total;
            memcpy(lg->at_peak, lg->cur, sizeof lg->cur);
        }
    }
    return base + HEADER;
}

void sbp_ledger_free(sbp_ledger *lg, void *p) {
    if (!p) return;
    char *base = (char *)p - HEADER;
    block_header *h = (block_header *)base;
    if (lg) {
        lg->cur[h->cat] -= (int64_t)h->bytes;
        lg->cur_total -= (int64_t)h->bytes;
    }
    free(base);
}
