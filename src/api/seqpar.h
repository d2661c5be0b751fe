/* seqpar.h — one gradient step with the processes of the transport sharing every sequence
 * (sequence parallel, docs/distributed.md §8). Internal to src/api. */
#ifndef SBP_API_SEQPAR_H
#define SBP_API_SEQPAR_H

#include "../core/objective.h"
#include "../dist/dist.h"
#include "../streambp.h"

/* The step of n micro-batches over opts->comm's N processes in D = N / S groups of
 * S = opts->seq_ranks (D divides n), group g running micro-batches k ≡ g (mod D), each of its
 * ranks on its rows through a link over the transport: *out (numel elements, allocated here,
 * charged to SBP_MEM_GRADS; NULL on failure) is this process's share (sharded: its owned blocks
 * of N ranks packed, as sbp_dist_grad's) or the whole gradient, the same bits as one process;
 * *loss on every process. so: the step's normalisers. While the step runs a rank also holds
 * sbp_seq_columns columns of its share's size. A failed step leaves the transport unusable: the
 * receives it had posted (the pieces', the head's round under --seq-overlap; and posted
 * hand-overs, query sides, K/V and first-round hand-overs)
 * may still be in flight into buffers it freed, so the caller ends the job (the command line calls
 * sbp_comm_abort), as after any failed distributed step. */
sbp_status sbp_seq_grad(void **out, int64_t numel, double *loss, const sbp_model *m,
                        const sbp_batch *batches, int n, const sbp_grad_opts *opts,
                        const sbp_objective *so, sbp_ledger *lg, sbp_err *err);

enum { SBP_SEQ_PART = 1 << 30 }; /* bytes a message of the link at most (the transport's ints) */

/* The columns a rank of a step of n micro-batches over N processes in groups of S holds beside
 * its share (the planner charges them); −1 when N / S groups do not divide n. */
int sbp_seq_columns(int N, int S, int n);

/* The exposed communication of a step of o (o->seq_ranks S > 1; docs/distributed.md §8) on the
 * network nw, a bound: each rank's link runs beside its whole compute, so a round exposes only
 * what its sends (sbp_plan_seq_traffic's count: its engine's K/V, query sides, hand-overs and
 * gathers, a last rank's pieces) take beyond its compute (its rows' share of sbp_step_flops,
 * sbp_seq_work_share, at nw->flops); the exchanges after the rounds are exposed whole. out: the
 * rank exposing the most (compute: the most a rank computes). The waits on another rank's
 * compute are not in it (make bench-seq measures them). */
sbp_status sbp_plan_seq_net(sbp_net_time *out, const sbp_config *cfg, const sbp_plan_opts *o,
                            const sbp_net *nw, sbp_err *err);

#endif
