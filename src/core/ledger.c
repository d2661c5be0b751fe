/* ledger.c — the memory ledger: one allocator that charges every buffer to a category.
 *
 * Each block carries a header in the 64 bytes in front of it holding its size and category, so
 * that sbp_ledger_free needs only the pointer; the user pointer is 64-byte aligned.
 * A planning ledger reserves address space instead (mmap, PROT_NONE, no swap reserved) behind a
 * one-page readable header: sizes up to hundreds of GB cost nothing, pointer arithmetic on the
 * buffers stays valid, and any read or write of one faults. */
#include "../streambp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HEADER 64

typedef struct {
    size_t bytes;
    int cat;
    int planned;
    void *raw; /* what calloc returned */
} block_header;

const char *sbp_mem_cat_name(sbp_mem_cat c) {
    static const char *names[SBP_MEM_NCATS] = {
        "weights", "grads", "optimizer", "checkpoints", "activations", "layer", "logits",
    };
    return (unsigned)c < SBP_MEM_NCATS ? names[c] : "?";
}

static void charge(sbp_ledger *lg, sbp_mem_cat cat, int64_t bytes) {
    if (!lg) return;
    lg->cur[cat] += bytes;
    lg->cur_total += bytes;
    if (bytes <= 0) return;
    lg->n_allocs++;
    if (lg->cur[cat] > lg->peak[cat]) lg->peak[cat] = lg->cur[cat];
    if (lg->cur_total > lg->peak_total) {
        lg->peak_total = lg->cur_total;
        memcpy(lg->at_peak, lg->cur, sizeof lg->cur);
    }
}

static void *reserve(size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytes > SIZE_MAX - 2 * page) return NULL;
    char *base =
        mmap(NULL, page + bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return NULL;
    if (mprotect(base, page, PROT_READ | PROT_WRITE) != 0) {
        munmap(base, page + bytes);
        return NULL;
    }
    return base + page;
}

void *sbp_ledger_alloc(sbp_ledger *lg, sbp_mem_cat cat, size_t bytes) {
    char *p;
    if (lg && lg->plan) {
        p = reserve(bytes);
        if (!p) return NULL;
    } else {
        /* calloc, not malloc + memset: glibc knows when the pages come fresh (and zeroed) from
         * mmap and skips the memset, so a large buffer is touched once, not twice */
        if (bytes > SIZE_MAX - 2 * HEADER) return NULL;
        char *raw = calloc(1, bytes + 2 * HEADER);
        if (!raw) return NULL;
        p = (char *)(((uintptr_t)raw + 2 * HEADER - 1) / HEADER * HEADER);
        ((block_header *)(p - HEADER))->raw = raw;
    }
    block_header *h = (block_header *)(p - HEADER);
    h->bytes = bytes;
    h->cat = (int)cat;
    h->planned = lg && lg->plan;
    charge(lg, cat, (int64_t)bytes);
    return p;
}

void sbp_ledger_free(sbp_ledger *lg, void *p) {
    if (!p) return;
    block_header *h = (block_header *)((char *)p - HEADER);
    size_t bytes = h->bytes;
    charge(lg, (sbp_mem_cat)h->cat, -(int64_t)bytes);
    if (h->planned) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        munmap((char *)p - page, page + bytes);
    } else {
        free(h->raw);
    }
}
