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
 * Pool (sbp_ledger_keep_blocks, pool.c): a ledger that runs many steps (bench, train) carves its
 * large blocks from huge-page regions that stay mapped, so the second step neither maps nor
 * faults nor has the kernel zero its buffers. The ledger's figures stay those of the buffers in
 * use; the pool hands pages back whenever buffers in use plus the pool's resident unused pages
 * would exceed the peak the ledger has recorded, so the process's RSS follows that peak.
 * sbp_ledger_alloc_raw skips zeroing where the caller overwrites the block anyway (the engine's
 * buffers); in a sanitizer build it fills the block with 0xff bytes (NaN in float and double)
 * so that a read of a value nothing wrote shows up in the tests.
 * A planning ledger reserves address space instead (mmap, PROT_NONE, no swap reserved) behind a
 * one-page readable header: sizes up to hundreds of GB cost nothing, pointer arithmetic on the
 * buffers stays valid, and any read or write of one faults. */
#include "../streambp.h"
#include "pool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HEADER    64
#define HUGE_PAGE ((size_t)2 << 20)
#define HUGE_MIN  ((size_t)4 << 20)
#define POOL_MIN  ((size_t)128 << 10) /* with the pool: glibc mmaps blocks this large afresh */
#define MAP_SLACK (2 * HUGE_PAGE)     /* map_huge maps this much beyond a request, for alignment */

typedef struct {
    size_t bytes;
    int cat;
    int how;       /* how the block was obtained: calloc, a huge-page mapping, the pool, a
                    * reservation */
    void *raw;     /* what calloc or mmap returned, or the pool's region */
    size_t mapped; /* bytes mapped at raw */
    pool *owner;   /* the pool of a pooled block */
} block_header;

_Static_assert(sizeof(block_header) <= HEADER && HEADER == POOL_HEADER, "the block header");

enum { BY_CALLOC, BY_MMAP, BY_POOL, BY_PLAN };

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

void sbp_ledger_keep_blocks(sbp_ledger *lg) {
    if (!lg || lg->plan || lg->pool) return;
    lg->pool = pool_new(); /* without it, blocks are mapped and unmapped one by one as before */
}

void sbp_ledger_drop_blocks(sbp_ledger *lg) {
    if (!lg || !lg->pool) return;
    if (pool_close(lg->pool)) lg->pool = NULL; /* else the last block in use frees it */
    lg->cached = 0, lg->slack = 0;
}

/* Buffers in use plus the pool's resident unused pages within the recorded peak, give or take
 * the regions' rounding to pages (pool_slack): without it, every step ended a few KB over the
 * peak, and the pages given back to meet it (a whole short unit, up to 2 MiB) were faulted in
 * again by the next step. */
static void bound_pool(sbp_ledger *lg) {
    pool *bp = lg->pool;
    lg->slack = pool_slack(bp);
    const int64_t over = lg->cur_total + pool_cached(bp) - lg->peak_total - lg->slack;
    if (over > 0) lg->returned += pool_trim(bp, over);
    lg->cached = pool_cached(bp);
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
    } else if (bytes >= POOL_MIN && lg && lg->pool && !pool_closing(lg->pool)) {
        region *g;
        int dirty;
        if (!(p = pool_take(lg->pool, bytes, &g, &dirty))) return NULL;
        if (zero && dirty) zero_parallel(p, bytes);
        raw = g;
        how = BY_POOL;
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
    h->owner = how == BY_POOL ? lg->pool : NULL;
    charge(lg, cat, (int64_t)bytes);
    if (how == BY_POOL) bound_pool(lg);
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
        munmap(h->raw, h->mapped);
    } else if (h->how == BY_POOL) {
        pool *owner = h->owner; /* the header goes with the region when the pool closes */
        const int freed = pool_give(owner, h->raw, p, bytes);
        if (lg && lg->pool == owner) {
            if (freed)
                lg->pool = NULL; /* closed, and this was its last block */
            else if (!pool_closing(lg->pool))
                bound_pool(lg);
        }
    } else {
        free(h->raw);
    }
}
