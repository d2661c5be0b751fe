/* dist.h — data parallel over processes (docs/distributed.md), internal.
 *
 * Three parts:
 *   buckets.c  the gradient slab cut into buckets, in the order the backward completes them;
 *   owners.c   which rank owns which 4096-element block of the slab (the grid the clip norm and
 *              AdamW already use), and the ordered fold of micro-batch gradients;
 *   mpi.c      the transport over Open MPI, linked when the build found mpicc; none.c otherwise
 *              (one process, every collective the identity), so no #ifdef reaches the engine.
 * Floating-point sums never go through an MPI reduction: collectives carry exact data only
 * (integers, copies), and every float sum is folded here in a fixed order. */
#ifndef SBP_DIST_H
#define SBP_DIST_H

#include "../streambp.h"

#include <stddef.h>
#include <stdint.h>

/* ---- buckets (buckets.c) ----------------------------------------------------------------------
 */

enum { SBP_BUCKET_HEAD = -1, SBP_BUCKET_EMBED = -2 }; /* else a layer index */

typedef struct {
    int id;         /* a layer, SBP_BUCKET_HEAD or SBP_BUCKET_EMBED */
    int64_t off, n; /* elements [off, off + n) of the gradient slab */
} sbp_bucket;

/* The buckets of a gradient slab (model or adapter table) in completion order: the head, layers
 * L−1 … 0, the embedding (those that have tensors). Returns their count, or −1 when there are
 * more than cap or a bucket's tensors are not contiguous. */
int sbp_grad_buckets(sbp_bucket *out /* (cap) */, int cap, const sbp_params *ps);
const sbp_bucket *sbp_bucket_find(const sbp_bucket *b, int n, int id);

/* ---- the transport (mpi.c, or none.c without MPI) ------------------------------------------- */

typedef struct sbp_comm sbp_comm;

/* 1 when this build has MPI (mpi.c), 0 (none.c). */
int sbp_comm_built(void);
/* Under a launcher (OMPI_COMM_WORLD_SIZE or PMIX_RANK set) starts MPI, else one process; no
 * launcher costs nothing (a singleton MPI_Init takes 0.36 s). A build without MPI launched with
 * more than one process fails (SBP_EUSAGE). timeout_s: how long any wait may go without progress
 * before the peer is declared lost (SBP_EPEER). */
sbp_status sbp_comm_start(sbp_comm **c, double timeout_s, sbp_err *err);
void sbp_comm_finish(sbp_comm *c); /* NULL is fine */
int sbp_comm_rank(const sbp_comm *c);
int sbp_comm_size(const sbp_comm *c);
/* Ends every process of the job with this exit status (MPI_Abort; exit without MPI). For errors
 * that break the protocol only: the CLI calls it, never the library. */
void sbp_comm_abort(sbp_comm *c, int code);

/* Point to point, non-blocking; buf stays untouched until the request is waited for. Returns a
 * request handle >= 0, or −1 (err filled). */
int sbp_comm_isend(sbp_comm *c, const void *buf, size_t bytes, int to, int tag, sbp_err *err);
int sbp_comm_irecv(sbp_comm *c, void *buf, size_t bytes, int from, int tag, sbp_err *err);
/* Waits for request r with the deadline (SBP_EPEER naming the peer and what on expiry). */
sbp_status sbp_comm_wait(sbp_comm *c, int r, const char *what, sbp_err *err);
/* Every outstanding request. */
sbp_status sbp_comm_waitall(sbp_comm *c, const char *what, sbp_err *err);

/* Collectives of exact data. out: size·bytes, rank r's block at r·bytes. */
sbp_status sbp_comm_allgather(sbp_comm *c, void *out, const void *in, size_t bytes,
                              const char *what, sbp_err *err);
/* out: rank r's counts[r] bytes at displs[r] */
sbp_status sbp_comm_allgatherv(sbp_comm *c, void *out, const void *in, const size_t *counts,
                               const size_t *displs, const char *what, sbp_err *err);
/* v[i] = the maximum of v[i] over the ranks */
sbp_status sbp_comm_max_u64(sbp_comm *c, uint64_t *v, int n, const char *what, sbp_err *err);
/* Bytes and messages this process has sent (the network model's counters). */
void sbp_comm_counters(const sbp_comm *c, int64_t *bytes, int64_t *messages);

#endif
