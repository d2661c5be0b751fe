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
 * Pool (sbp_ledger_keep_blocks): a ledger that runs many steps (bench, train) keeps freed large
 * blocks and hands them out again for allocations that fit, so the second step neither maps nor
 * faults nor has the kernel zero its buffers. The ledger's figures stay those of the buffers in
 * use; the pool is bounded so that buffers in use plus pooled blocks never exceed the peak the
 * ledger has already recorded — the process's RSS follows the ledger's peak as before.
 * sbp_ledger_alloc_raw skips zeroing where the caller overwrites the block anyway (the engine's
 * buffers); in a sanitizer build it fills the block with 0xff bytes (NaN in float and double)
 * so that a read of a value nothing wrote shows up in the tests.
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
#define MAP_SLACK (2 * HUGE_PAGE) /* map_huge maps this much beyond a request, for alignment */

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
    if (bytes > SIZE_MAX - MAP_SLACK) return NULL;
    size_t len = bytes + MAP_SLACK;
    char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)base + HEADER + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
    madvise(p, (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE); /* a hint */
    *raw = base, *mapped = len;
    return p;
}

/* Freed huge blocks kept for reuse: what the user asked for, and the mapping behind it. */
typedef struct {
    char *p;
    size_t cap;  /* the bytes the block was mapped for (its first request): a later user may
                  * have them all, and no more. Not the mapping's end, which lies up to two huge
                  * pages further: counting that slack let a 4 MiB block look 6-8 MiB large, fail
                  * the quarter-waste test for the next 4 MiB request and go unused — full BP's
                  * (T, C) activations then missed the pool and were mapped anew every step. */
    size_t used; /* bytes its last user had: what it can hold resident */
    void *raw;
    size_t mapped;
} pooled;

typedef struct {
    pooled *b;
    int n, cap;
} block_pool;

void sbp_ledger_keep_blocks(sbp_ledger *lg) {
    if (!lg || lg->plan || lg->pool) return;
    lg->pool = calloc(1, sizeof(block_pool)); /* without it, blocks go back as before */
}

void sbp_ledger_drop_blocks(sbp_ledger *lg) {
    block_pool *bp = lg ? lg->pool : NULL;
    if (!bp) return;
    for (int i = 0; i < bp->n; i++) munmap(bp->b[i].raw, bp->b[i].mapped);
    free(bp->b);
    free(bp);
    lg->pool = NULL;
    lg->cached = 0;
}

/* The smallest pooled block that holds bytes without wasting more than a quarter of it. */
static char *from_pool(sbp_ledger *lg, size_t bytes, void **raw, size_t *mapped) {
    block_pool *bp = lg ? lg->pool : NULL;
    int best = -1;
    for (int i = 0; bp && i < bp->n; i++)
        if (bp->b[i].cap >= bytes && bp->b[i].cap - bytes <= bp->b[i].cap / 4 &&
            (best < 0 || bp->b[i].cap < bp->b[best].cap))
            best = i;
    if (best < 0) return NULL;
    pooled k = bp->b[best];
    bp->b[best] = bp->b[--bp->n];
    lg->cached -= (int64_t)k.used;
    *raw = k.raw, *mapped = k.mapped;
    return k.p;
}

/* Keeps a freed huge block of `used` bytes when the pool is on and buffers in use plus pooled
 * blocks stay within the recorded peak; 1 if kept. */
static int to_pool(sbp_ledger *lg, char *p, size_t used, void *raw, size_t mapped) {
    block_pool *bp = lg ? lg->pool : NULL;
    if (!bp || lg->cur_total + lg->cached + (int64_t)used > lg->peak_total) return 0;
    if (bp->n == bp->cap) {
        int cap = bp->cap ? 2 * bp->cap : 32;
        pooled *nb = realloc(bp->b, sizeof *nb * (size_t)cap);
        if (!nb) return 0;
        bp->b = nb, bp->cap = cap;
    }
    bp->b[bp->n++] = (pooled){p, mapped - MAP_SLACK, used, raw, mapped};
    lg->cached += (int64_t)used;
    return 1;
}

void sbp_ledger_charge(sbp_ledger *lg, sbp_mem_cat cat, int64_t bytes) {
    if ((unsigned)cat < SBP_MEM_NCATS) charge(lg, cat, bytes);
}

/* A pooled block handed out zeroed (the gradient slab: 178 MB at the bench model) is cleared by
 * every thread, a huge page at a time: one thread's memset took ~1% of a full-BP step. */
static void zero_parallel(char *p, size_t bytes) {
    const long n = (long)((bytes + HUGE_PAGE - 1) / HUGE_PAGE);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        const size_t o = (size_t)i * HUGE_PAGE;
        memset(p + o, 0, bytes - o < HUGE_PAGE ? bytes - o : HUGE_PAGE);
    }
}

/* zero: the block must read as zeros (fresh mappings and calloc do; a pooled block is cleared) */
static void *alloc(sbp_ledger *lg, sbp_mem_cat cat, size_t bytes, int zero) {
    char *p;
    void *raw = NULL;
    size_t mapped = 0;
    int how;
    if (lg && lg->plan) {
        if (!(p = reserve(bytes))) return NULL;
        how = BY_PLAN;
    } else if (bytes >= HUGE_MIN) {
        if ((p = from_pool(lg, bytes, &raw, &mapped))) {
            if (zero) zero_parallel(p, bytes);
        } else if (!(p = map_huge(bytes, &raw, &mapped))) {
            return NULL;
        }
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
#if defined(__SANITIZE_ADDRESS__)
    if (!zero && how != BY_PLAN) memset(p, 0xff, bytes); /* NaN: a read of unwritten memory */
#endif
    return p;
}

void *sbp_ledger_alloc(sbp_ledger *lg, sbp_mem_cat cat, size_t bytes) {
    return alloc(lg, cat, bytes, 1);
}

void *sbp_ledger_alloc_raw(sbp_ledger *lg, sbp_mem_cat cat, size_t bytes) {
    return alloc(lg, cat, bytes, 0);
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
        if (!to_pool(lg, p, bytes, h->raw, h->mapped)) munmap(h->raw, h->mapped);
    } else {
        free(h->raw);
    }
}
