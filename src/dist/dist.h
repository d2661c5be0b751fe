/* dist.h — data parallel over processes (docs/distributed.md): the interface src/dist gives the
 * layers above it (src/api's distributed step, src/train's ZeRO-2 optimizer and checkpoints,
 * the command line's launcher handling). Not part of the public API (src/streambp.h); the engine
 * sees only buckets.h and seqlink.h.
 *
 *   buckets.c   the gradient slab cut into buckets, in the order the backward completes them
 *               (buckets.h: shared with src/engine/fold.c, which forms a bucket at a time);
 *   owners.c    which rank owns which 4096-element block of the slab (the grid the clip norm and
 *               AdamW already use), and the pieces a bucket is cut into;
 *   exchange.c  one step: the buckets' pieces sent to their owners as the backward completes
 *               them, and the ordered fold of the micro-batches' gradients (sbp_dist_grad);
 *   gather.c    a sharded slab gathered to rank 0 a tensor at a time, for the files;
 *   netmodel.c  the network model: the bytes, messages and exposed time of a step;
 *   slices.c    sequence parallel: the rows each rank of a group holds (seqlink.h: the link the
 *               engine reaches the group's other ranks through, src/engine/relay.c; src/api's
 *               seqpar.c provides it over the transport);
 *   mpi.c       the transport over Open MPI, linked when the build found mpicc; none.c otherwise
 *               (one process, every collective the identity), so no #ifdef reaches the engine.
 * Floating-point sums never go through an MPI reduction: collectives carry exact data only
 * (integers, copies), and every float sum is folded here in a fixed order. */
#ifndef SBP_DIST_H
#define SBP_DIST_H

#include "../streambp.h"
#include "buckets.h"

#include <stddef.h>
#include <stdint.h>

typedef struct sbp_comm sbp_comm; /* the transport (below) */

/* ---- owners (owners.c) ------------------------------------------------------------------------
 */

enum { SBP_DIST_BLOCK = 4096 }; /* the ownership grid: sbp_grad_norm's and AdamW's blocks */

typedef struct {
    int64_t off, n; /* elements [off, off + n) of the slab */
    int owner;      /* the rank that folds them */
    int bucket;     /* index into the bucket list (completion order) */
} sbp_piece;

/* The pieces of every bucket (b: nb buckets in completion order) for N ranks, in that order and
 * ascending within a bucket. Returns their count (at most nb·(N + 1)), −1 beyond cap or out of
 * memory. */
int sbp_dist_pieces(sbp_piece *out /* (cap) */, int cap, const sbp_bucket *b, int nb, int N);

/* The ascending, merged ranges of the slab that rank r of N owns (whole 4096-element blocks, the
 * slab's last block possibly short) into *out (malloc'd; free it); returns their count, −1 when
 * out of memory. *owned: their elements. */
int sbp_dist_owned(sbp_range **out, int64_t *owned, const sbp_params *ps, int N, int r);

/* The network model of one step of n micro-batches over N ranks (N divides n): what the rank that
 * sends the most sends — its micro-batches' pieces that others own (a message each), its losses
 * to each of the N − 1 others (an all-gather), and then for grad its share to rank 0, which
 * writes the file (sbp_dist_gather_cost), or with optimizer set (train's ZeRO-2 step) its blocks'
 * sums of squares for the clip norm (an all-gather of 8 bytes a block) and its updated weights to
 * each of the others (a message per piece and peer) — in bytes and messages; esz bytes per
 * element. The transport's counters of a run equal it, plus the start-up check. */
sbp_status sbp_dist_traffic(int64_t *bytes, int64_t *messages, const sbp_params *ps, int esz, int N,
                            int n, int optimizer, sbp_err *err);

/* What rank r of N sends in such a step of the given rounds (m = n / N above): with produces,
 * a round's pieces that others own (sequence parallel: only a group's last rank produces them,
 * one micro-batch a round, src/api/seqpar.c); the losses' all-gather and what follows the
 * rounds as above. */
sbp_status sbp_dist_traffic_rank(int64_t *bytes, int64_t *messages, const sbp_params *ps, int esz,
                                 int N, int r, int rounds, int produces, int optimizer,
                                 sbp_err *err);

/* What rank r sends to rank 0 when a sharded slab is gathered there a tensor at a time
 * (sbp_dist_gather over every tensor of ps): its elements and messages; rank 0 sends none. */
sbp_status sbp_dist_gather_cost(int64_t *elements, int64_t *messages, const sbp_params *ps, int N,
                                int r, sbp_err *err);

/* ---- the network model's time (netmodel.c) ------------------------------------------------- */

typedef struct {
    double bandwidth; /* bytes per second a rank's link sends */
    double latency;   /* seconds a message costs besides its bytes */
    double flops;     /* floating-point operations per second of a rank */
} sbp_net;

typedef struct {
    double compute;   /* seconds of a rank's m micro-batches' work (sbp_step_flops / flops) */
    double exposed;   /* seconds a step waits on the network beyond it: m·per_round + after */
    double per_round; /* a round's transfers left when its backward ends */
    double after;     /* the exchanges after the backward: losses, block sums, the rank's blocks */
} sbp_net_time;

/* The link as a FIFO over one round: bucket i done at Σ_{j<=i} b[j] (b: backward seconds), its
 * transfer d[i] seconds; returns how long the last transfer ends after the backward. */
double sbp_dist_exposed_round(const double *b /* (nb) */, const double *d /* (nb) */, int nb);
/* The exposed communication of one step of n micro-batches of B × T tokens (g: the schedule,
 * objective, adapter) over N ranks, trained: the gradient's table (the model's or the adapter's),
 * esz bytes an element; optimizer: train's step (block sums, the weights after). For the rank
 * exposing the most (netmodel.c gives the model). */
sbp_status sbp_dist_net(sbp_net_time *out, const sbp_config *cfg, const sbp_params *trained,
                        const sbp_grad_opts *g, int B, int T, int esz, int N, int n, int optimizer,
                        const sbp_net *net, sbp_err *err);

/* ---- the step (exchange.c) ------------------------------------------------------------------ */

/* S ← S + g over n elements of esz bytes (4: float, 8: double), one IEEE add each; with bf16 each
 * result rounded to bfloat16 (as the engine's add under bf16 storage). */
void sbp_dist_fold(void *s, const void *g, int64_t n, int esz, int bf16);

/* Runs micro-batch k of the step, handing each completed bucket to hook(hook_ctx, ...) instead
 * of folding it; *loss_k = its loss from zero. */
typedef sbp_status (*sbp_dist_run_fn)(void *ctx, int k, sbp_bucket_hook hook, void *hook_ctx,
                                      double *loss_k, sbp_err *err);

/* One step of n micro-batches over the processes of c: this rank runs micro-batches k ≡ rank
 * (mod N) through run (which hands each completed bucket to the hook and keeps no gradient of its
 * own); *loss is the folded loss on every rank. out: with sharded, this rank's share of the
 * folded gradient, its owned blocks (sbp_dist_owned's ranges) packed in ascending order; else the
 * whole folded gradient (ps->total elements of esz bytes), on every rank. Bit-identical to the
 * 1-process step. N must divide n. Besides out a rank holds two buffers for the step, charged to
 * SBP_MEM_GRADS (docs/distributed.md §7): the ring, the copies of its last two completed buckets
 * while their pieces travel and its own wait for their turn in the fold, and the column, one
 * micro-batch's pieces of its blocks of the bucket being folded. */
sbp_status sbp_dist_grad(void *out, int sharded, double *loss, sbp_comm *c, const sbp_params *ps,
                         int esz, int bf16, int n, sbp_dist_run_fn run, void *ctx, sbp_ledger *lg,
                         sbp_err *err);
/* Every rank's blocks of slab (ps->total elements of esz bytes) to every other rank, in place:
 * rank r sends each piece it owns to the N − 1 others and receives the others' (exact copies).
 * The all-gather of a ZeRO-2 step's updated weights, and of an unsharded step's gradient. */
sbp_status sbp_dist_spread(sbp_comm *c, void *slab, const sbp_params *ps, int esz, const char *what,
                           sbp_err *err);
/* The rank of N whose step holds the most besides the engine's own buffers: per_owned bytes for
 * each element it owns (the share, the moments) plus the ring and the column (esz bytes an
 * element). *owned: its elements. −1 when out of memory. */
int sbp_dist_plan_rank(const sbp_params *ps, int esz, int N, int64_t per_owned, int64_t *owned);
/* The step's own buffers on rank r of N (a planning ledger: reserved, never touched), then run
 * once with no hook (the planning table folds nothing). */
sbp_status sbp_dist_plan(sbp_ledger *lg, const sbp_params *ps, int esz, int N, int r,
                         sbp_dist_run_fn run, void *ctx, sbp_err *err);

/* ---- the share's gather (gather.c) ----------------------------------------------------------- */

/* Every rank's owned ranges (sbp_dist_owned) and where each starts in its packed share. */
typedef struct {
    int N;
    sbp_range **rj; /* (N) rank j's ranges, ascending (nj[j]) */
    int *nj;        /* (N) */
    int64_t **pk; /* (N) rank j's range q starts at pk[j][q] of its share; pk[j][nj[j]]: its size */
} sbp_dist_shares;

sbp_status sbp_dist_shares_of(sbp_dist_shares *sh, const sbp_params *ps, int N, sbp_err *err);
void sbp_dist_shares_free(sbp_dist_shares *sh);
/* Elements [lo, hi) of a slab held in shares gathered to rank 0: its own parts copied from share,
 * the others' received, into buf (hi − lo elements of esz bytes, rank 0's only); a rank r > 0
 * sends its parts of the range from share, a message per range it holds there. Collective. */
sbp_status sbp_dist_gather(sbp_comm *c, void *buf, const void *share, const sbp_dist_shares *sh,
                           int64_t lo, int64_t hi, int esz, const char *what, sbp_err *err);
/* The gradient file of sbp_grads_save from a sharded step's shares (sbp_dist_grad's out on every
 * rank): gathered to rank 0 one tensor at a time (a buffer of the largest, charged to lg's
 * SBP_MEM_GRADS), written by rank 0 alone, the same bytes. Collective. */
sbp_status sbp_dist_save_grads(const char *path, sbp_comm *c, const sbp_params *ps,
                               sbp_precision prec, const void *share, const char *const *meta,
                               sbp_ledger *lg, sbp_err *err);

/* ---- the transport (mpi.c, or none.c without MPI) ------------------------------------------- */

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
/* 1 when request r is done (or no request), without waiting: the fold's progress between
 * buckets. */
int sbp_comm_test(sbp_comm *c, int r);
/* Every outstanding request tested once, without waiting: lets the transport move what others
 * wait on (a large message is matched only while its receiver is inside the transport) during a
 * long computation. */
void sbp_comm_progress(sbp_comm *c);
/* Waits for request r with the deadline (SBP_EPEER naming the peer and what on expiry). Done,
 * r is forgotten: the handle may name a later request (the last one added gives its place back,
 * so that a run of send-and-wait messages does not grow the list). */
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
/* Waits while poll(ctx) returns 1: poll runs the caller's own tests and the work they allow (the
 * fold), sets *progress when something moved and *peer to the rank it waits on; 0 when nothing is
 * left, −1 failed (err filled). The deadline runs from the last progress (SBP_EPEER naming the
 * peer). */
typedef int (*sbp_comm_poll)(void *ctx, int *progress, int *peer);
sbp_status sbp_comm_wait_poll(sbp_comm *c, sbp_comm_poll poll, void *ctx, const char *what,
                              sbp_err *err);
/* Seconds this process has spent waiting on the others (requests and collectives). */
double sbp_comm_waited(const sbp_comm *c);
/* Bytes and messages this process has sent (the network model's counters). */
void sbp_comm_counters(const sbp_comm *c, int64_t *bytes, int64_t *messages);

#endif
