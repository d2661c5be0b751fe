/* pool.c — the ledger's pool (sbp_ledger_keep_blocks): huge-page regions that blocks are carved
 * from and returned to, for a ledger that runs many steps.
 *
 * A region is one mapping, 2 MiB aligned and marked for transparent huge pages, cut into free
 * extents and blocks; a returned block merges with its free neighbours. A block goes where it
 * touches the fewest huge pages that are not resident (the start or the end of a free extent),
 * then preferably into an extent it fills to within a huge page, then where it touches the
 * fewest non-resident bytes, then into the smallest extent; only when no extent holds it is a
 * region mapped for it. (Scoring by bytes alone sent small blocks whose own region had a few
 * small pages given back into the freed logits, which then no longer fitted there: 250 MB
 * given back and faulted in again every step of full BP.)
 * So a step's blocks settle into the regions the first step mapped: full BP's 250 MB logits,
 * freed after the head, hold the layers' backward buffers, and the next step's activations and
 * logits find them resident again — no new mapping, no page faults, no pages for the kernel to
 * clear (on the VMs we measure on, faulting the logits in cost 0.1-2 s of a 2-4 s step).
 *
 * Residency is tracked per 2 MiB unit of a region (the last one may be shorter): a unit is
 * resident from the time a block covers it until pool_trim gives it back (madvise
 * MADV_DONTNEED: the pages go back to the system and read as zeros when touched again), which
 * the ledger does whenever blocks in use plus resident unused bytes would exceed its recorded
 * peak by more than the regions' rounding to pages (pool_slack). A unit counts as resident once any
 * block has covered it, touched or not: the figures are an upper bound on what the process holds.
 */
#include "pool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define UNIT  ((size_t)2 << 20) /* a huge page */
#define PAGE  ((size_t)4096)
#define ALIGN ((size_t)64)

typedef struct {
    size_t off, len;
} extent;

struct region {
    char *base;  /* 2 MiB aligned */
    size_t size; /* bytes usable at base, a multiple of PAGE */
    void *raw;   /* the mapping, and its length */
    size_t mapped;
    int units;          /* ceil(size / UNIT) */
    unsigned char *res; /* per unit: covered by a block since mapped or last given back */
    int *users;         /* per unit: blocks in use that overlap it */
    extent *free;       /* free extents, ascending, none adjacent */
    int n_free, cap_free;
};

struct pool {
    region **r;
    int n, cap;
    int64_t cached; /* Σ unit sizes over units resident and unused */
    int closing;
};

static size_t unit_size(const region *g, int u) {
    const size_t o = (size_t)u * UNIT;
    return g->size - o < UNIT ? g->size - o : UNIT;
}

/* the units that bytes [off, off + len) overlap: [*u0, *u1) */
static void units_of(size_t off, size_t len, int *u0, int *u1) {
    *u0 = (int)(off / UNIT);
    *u1 = (int)((off + len + UNIT - 1) / UNIT);
}

static region *region_new(size_t size) {
    region *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->size = size;
    g->units = (int)((size + UNIT - 1) / UNIT);
    g->res = calloc((size_t)g->units, 1);
    g->users = calloc((size_t)g->units, sizeof *g->users);
    g->free = malloc(sizeof *g->free * 4);
    g->cap_free = 4;
    g->mapped = size + UNIT; /* room to align the base */
    void *raw =
        g->res && g->users && g->free && size <= SIZE_MAX - UNIT
            ? mmap(NULL, g->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
            : MAP_FAILED;
    if (raw == MAP_FAILED) {
        free(g->res), free(g->users), free(g->free), free(g);
        return NULL;
    }
    g->raw = raw;
    g->base = (char *)(((uintptr_t)raw + UNIT - 1) / UNIT * UNIT);
    /* a hint; the last unit, when shorter, gets small pages */
    madvise(g->base, size, MADV_HUGEPAGE);
    g->free[0] = (extent){0, size};
    g->n_free = 1;
    return g;
}

static void region_free(region *g) {
    munmap(g->raw, g->mapped);
    free(g->res), free(g->users), free(g->free), free(g);
}

pool *pool_new(void) {
    return calloc(1, sizeof(pool));
}

int64_t pool_cached(const pool *bp) {
    return bp->cached;
}

int64_t pool_slack(const pool *bp) {
    return (int64_t)bp->n * 2 * (int64_t)PAGE;
}

int pool_closing(const pool *bp) {
    return bp->closing;
}

/* Huge pages and bytes in [off, off + len) that are not resident. */
static void fresh(const region *g, size_t off, size_t len, int *units, size_t *bytes) {
    int u0, u1;
    units_of(off, len, &u0, &u1);
    *units = 0, *bytes = 0;
    for (int u = u0; u < u1; u++)
        if (!g->res[u]) *units += unit_size(g, u) == UNIT, *bytes += unit_size(g, u);
}

/* Takes [off, off + len) out of free extent i, which holds it. */
static void carve(region *g, int i, size_t off, size_t len) {
    const extent e = g->free[i];
    const int before = off > e.off, after = off + len < e.off + e.len;
    if (before && after) { /* the extent splits in two */
        memmove(g->free + i + 2, g->free + i + 1, sizeof *g->free * (size_t)(g->n_free - i - 1));
        g->n_free++;
        g->free[i] = (extent){e.off, off - e.off};
        g->free[i + 1] = (extent){off + len, e.off + e.len - off - len};
    } else if (before) {
        g->free[i].len = off - e.off;
    } else if (after) {
        g->free[i] = (extent){off + len, e.off + e.len - off - len};
    } else {
        memmove(g->free + i, g->free + i + 1, sizeof *g->free * (size_t)(g->n_free - i - 1));
        g->n_free--;
    }
}

/* Puts [off, off + len) back among the free extents, merged with its neighbours; 0 when out of
 * memory for the list (the bytes are then lost to the region until it is unmapped). */
static int uncarve(region *g, size_t off, size_t len) {
    int i = 0;
    while (i < g->n_free && g->free[i].off < off) i++;
    const int join_prev = i > 0 && g->free[i - 1].off + g->free[i - 1].len == off;
    const int join_next = i < g->n_free && off + len == g->free[i].off;
    if (join_prev && join_next) {
        g->free[i - 1].len += len + g->free[i].len;
        memmove(g->free + i, g->free + i + 1, sizeof *g->free * (size_t)(g->n_free - i - 1));
        g->n_free--;
    } else if (join_prev) {
        g->free[i - 1].len += len;
    } else if (join_next) {
        g->free[i] = (extent){off, len + g->free[i].len};
    } else {
        if (g->n_free == g->cap_free) {
            extent *nf = realloc(g->free, sizeof *nf * (size_t)(2 * g->cap_free));
            if (!nf) return 0;
            g->free = nf, g->cap_free *= 2;
        }
        memmove(g->free + i + 1, g->free + i, sizeof *g->free * (size_t)(g->n_free - i));
        g->free[i] = (extent){off, len};
        g->n_free++;
    }
    return 1;
}

static int region_unused(const region *g) {
    for (int u = 0; u < g->units; u++)
        if (g->res[u] || g->users[u]) return 0;
    return 1;
}

/* Unmaps the regions that hold nothing: no block, no resident unit. */
static void drop_empty(pool *bp) {
    int k = 0;
    for (int i = 0; i < bp->n; i++)
        if (region_unused(bp->r[i]))
            region_free(bp->r[i]);
        else
            bp->r[k++] = bp->r[i];
    bp->n = k;
}

char *pool_take(pool *bp, size_t bytes, region **out, int *dirty) {
    if (bytes > SIZE_MAX / 2) return NULL;
    const size_t len = (bytes + ALIGN - 1) / ALIGN * ALIGN + POOL_HEADER;
    region *g = NULL;
    int gi = -1;
    size_t off = 0;
    /* the best so far: (huge pages to fault in, not snug, bytes to fault in, extent length) */
    size_t best[4] = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX};
    for (int k = 0; k < bp->n; k++) {
        region *h = bp->r[k];
        for (int i = 0; i < h->n_free; i++) {
            const extent e = h->free[i];
            if (e.len < len) continue;
            const size_t at[2] = {e.off, e.off + e.len - len};
            for (int s = 0; s < (at[1] != at[0] ? 2 : 1); s++) {
                int fu;
                size_t fb;
                fresh(h, at[s], len, &fu, &fb);
                const size_t key[4] = {(size_t)fu, e.len - len >= UNIT, fb, e.len};
                int better = 0;
                for (int j = 0; j < 4; j++)
                    if (key[j] != best[j]) {
                        better = key[j] < best[j];
                        break;
                    }
                if (better) g = h, gi = i, off = at[s], memcpy(best, key, sizeof best);
            }
        }
    }
    if (!g) {
        if (bp->n == bp->cap) {
            const int cap = bp->cap ? 2 * bp->cap : 16;
            region **nr = realloc(bp->r, sizeof *nr * (size_t)cap);
            if (!nr) return NULL;
            bp->r = nr, bp->cap = cap;
        }
        if (!(g = region_new((len + PAGE - 1) / PAGE * PAGE))) return NULL;
        bp->r[bp->n++] = g;
        gi = 0, off = 0;
    }
    carve(g, gi, off, len);
    int u0, u1;
    units_of(off, len, &u0, &u1);
    *dirty = 0;
    for (int u = u0; u < u1; u++) {
        if (g->res[u]) {
            *dirty = 1;
            if (!g->users[u]) bp->cached -= (int64_t)unit_size(g, u);
        }
        g->res[u] = 1;
        g->users[u]++;
    }
    *out = g;
    return g->base + off + POOL_HEADER;
}

/* Gives back the unused resident units of region g, up to `bytes` (all when bytes < 0); only
 * the short last unit when `tail`. */
static int64_t trim_region(pool *bp, region *g, int64_t bytes, int tail) {
    int64_t given = 0;
    for (int u = tail ? g->units - 1 : 0; u < g->units && (bytes < 0 || given < bytes);) {
        if (!g->res[u] || g->users[u] || (tail && unit_size(g, u) == UNIT)) {
            u++;
            continue;
        }
        int v = u; /* a run of such units, one call */
        size_t n = 0;
        for (; v < g->units && g->res[v] && !g->users[v] && (bytes < 0 || given < bytes); v++) {
            n += unit_size(g, v);
            given += (int64_t)unit_size(g, v);
            g->res[v] = 0;
        }
        madvise(g->base + (size_t)u * UNIT, n, MADV_DONTNEED);
        u = v;
    }
    bp->cached -= given;
    return given;
}

/* The short last units first: what exceeds the bound is mostly the bytes by which blocks
 * overhang whole huge pages, and those units hold small pages, cheap to fault in again. */
int64_t pool_trim(pool *bp, int64_t bytes) {
    int64_t given = 0;
    for (int tail = 1; tail >= 0; tail--)
        for (int k = 0; k < bp->n && bytes > given; k++)
            given += trim_region(bp, bp->r[k], bytes - given, tail);
    drop_empty(bp);
    return given;
}

static void pool_free(pool *bp) {
    for (int k = 0; k < bp->n; k++) region_free(bp->r[k]);
    free(bp->r);
    free(bp);
}

int pool_give(pool *bp, region *g, char *p, size_t bytes) {
    const size_t len = (bytes + ALIGN - 1) / ALIGN * ALIGN + POOL_HEADER;
    const size_t off = (size_t)(p - POOL_HEADER - g->base);
    uncarve(g, off, len);
    int u0, u1;
    units_of(off, len, &u0, &u1);
    for (int u = u0; u < u1; u++)
        if (--g->users[u] == 0) bp->cached += (int64_t)unit_size(g, u);
    if (!bp->closing) return 0;
    trim_region(bp, g, -1, 0);
    drop_empty(bp);
    if (bp->n) return 0;
    pool_free(bp);
    return 1;
}

int pool_close(pool *bp) {
    for (int k = 0; k < bp->n; k++) trim_region(bp, bp->r[k], -1, 0);
    drop_empty(bp);
    if (bp->n) {
        bp->closing = 1;
        return 0;
    }
    pool_free(bp);
    return 1;
}
