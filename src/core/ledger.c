/* ledger.c — the memory ledger: one allocator that charges every buffer to a category.
 *
 * Each block carries a header in the 64 bytes in front of it holding its size and category, so
 * that sbp_ledger_free needs only the pointer; the user pointer is 64-byte aligned.
 * Blocks of HUGE_MIN bytes and more are mapped directly, aligned to 2 MiB and marked for
 * transparent huge pages: the kernel hands them over zeroed, a step touches them with ~500x
 * fewer page faults (a full-BP step of the bench model took 308k faults with 4 KiB pages), and
 * a freed block goes straight back to the system, so the process's RSS follows the ledger.
 * The price: the kernel zeroes every large block anew (clear_page: ~7% of perf's samples in a
 * full-BP bench step at T = 2048); a cache of freed blocks would save that and break the RSS
 * correspondence.
 * A planning ledger reserves address space instead (mmap, PROT_NONE, no swap reserved) behind a
 * one-page readable header: sizes up to hundreds of GB cost nothing, pointer arithmetic on the
 * buffers stays valid, and any read or write of one faults. */
#include "../streambp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HEADER    64
#define HUGE_PAGE ((size_t)2 << 20)
#define HUGE_MIN  ((size_t)4 << 20)

typedef struct {
    size_t bytes;
    int cat;
    int how;       /* how the block was obtained: calloc, a huge-page mapping, a reservation */
    void *raw;     /* what calloc or mmap returned */
    size_t mapped; /* bytes mapped at raw */
} block_header;

enum { BY_CALLOC, BY_MMAP, BY_PLAN };

const char *sbp_mem_cat_name(sbp_mem_cat c) {
    static const char *names[SBP_MEM_NCATS] = {
        "weights", "grads", "optimizer", "checkpoints", "activations", "layer", "logits", "batch",
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

/* A zeroed block of huge-page-aligned memory; the header sits just below it. */
static char *map_huge(size_t bytes, void **raw, size_t *mapped) {
    if (bytes > SIZE_MAX - 2 * HUGE_PAGE) return NULL;
    size_t len = bytes + 2 * HUGE_PAGE;
    char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)base + HEADER + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
    madvise(p, (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE); /* a hint */
    *raw = base, *mapped = len;
    return p;
}

void sbp_ledger_charge(sbp_ledger *lg, sbp_mem_cat cat, int64_t bytes) {
    if ((unsigned)cat < SBP_MEM_NCATS) charge(lg, cat, bytes);
}

void *sbp_ledger_alloc(sbp_ledger *lg, sbp_mem_cat cat, size_t bytes) {
    char *p;
    void *raw = NULL;
    size_t mapped = 0;
    int how;
    if (lg && lg->plan) {
        if (!(p = reserve(bytes))) return NULL;
        how = BY_PLAN;
    } else if (bytes >= HUGE_MIN) {
        if (!(p = map_huge(bytes, &raw, &mapped))) return NULL;
        how = BY_MMAP;
    } else {
        /* calloc, not malloc + memset: glibc knows when the pages come fresh (and zeroed) from
         * mmap and skips the memset */
        if (bytes > SIZE_MAX - 2 * HEADER) return NULL;
        if (!(raw = calloc(1, bytes + 2 * HEADER))) return NULL;
        p = (char *)(((uintptr_t)raw + 2 * HEADER - 1) / HEADER * HEADER);
        how = BY_CALLOC;
    }
    block_header *h = (block_header *)(p - HEADER);
    h->bytes = bytes;
    h->cat = (int)cat;
    h->how = how;
    h->raw = raw;
    h->mapped = mapped;
    charge(lg, cat, (int64_t)bytes);
    return p;
}

void sbp_ledger_free(sbp_ledger *lg, void *p) {
    if (!p) return;
    block_header *h = (block_header *)((char *)p - HEADER);
    size_t bytes = h->bytes;
    charge(lg, (sbp_mem_cat)h->cat, -(int64_t)bytes);
    if (h->how == BY_PLAN) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        munmap((char *)p - page, page + bytes);
    } else if (h->how == BY_MMAP) {
        munmap(h->raw, h->mapped);
    } else {
        free(h->raw);
    }
}
