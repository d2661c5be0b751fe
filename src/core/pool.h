/* pool.h — the ledger's pool of huge-page regions (pool.c); used by ledger.c only. */
#ifndef SBP_POOL_H
#define SBP_POOL_H

#include <stddef.h>
#include <stdint.h>

#define POOL_HEADER 64 /* bytes in front of every block, for the ledger's block header */

typedef struct pool pool;
typedef struct region region;

pool *pool_new(void);
/* A 64-byte aligned block of `bytes`, POOL_HEADER bytes in front of it left to the caller, carved
 * from the free space of a region where it touches the fewest pages that are not resident, or
 * from a new region. *dirty: some of it may hold what an earlier block wrote. NULL when out of
 * memory or address space. */
char *pool_take(pool *bp, size_t bytes, region **r, int *dirty);
/* Returns a block to its region. 1 when the pool was closing and this was its last block: the
 * pool is then freed. */
int pool_give(pool *bp, region *r, char *p, size_t bytes);
/* Hands resident pages that no block uses back to the system, at least `bytes` of them where
 * there are so many; regions left empty are unmapped. */
int64_t pool_trim(pool *bp, int64_t bytes); /* the bytes given back */
int64_t pool_cached(const pool *bp);        /* resident bytes that no block uses */
/* What the regions hold beyond the bytes of their blocks, at most: each region's size is its
 * first block's, rounded up to a small page, with a header and alignment (two pages a region). */
int64_t pool_slack(const pool *bp);
/* Hands every page not in use back; 1 if the pool is freed (no block in use), else it closes:
 * pool_take must not be called again, and the last pool_give frees it. */
int pool_close(pool *bp);
int pool_closing(const pool *bp);

#endif
