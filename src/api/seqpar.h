/* seqpar.h — one gradient step with the processes of the transport sharing every sequence
 * (sequence parallel, docs/distributed.md §8). Internal to src/api. */
#ifndef SBP_API_SEQPAR_H
#define SBP_API_SEQPAR_H

#include "../core/objective.h"
#include "../dist/dist.h"
#include "../streambp.h"

/* The step of n micro-batches over opts->comm's N = opts->seq_ranks processes, each running
 * every micro-batch on its rows through a link over the transport: *out (numel elements,
 * allocated here, charged to SBP_MEM_GRADS; NULL on failure) is this process's share (sharded:
 * its owned blocks packed, as sbp_dist_grad's) or the whole gradient, the same bits as one
 * process; *loss on every process. so: the step's normalisers. With more than one micro-batch a
 * rank also holds a column of its share's size while the step runs. */
sbp_status sbp_seq_grad(void **out, int64_t numel, double *loss, const sbp_model *m,
                        const sbp_batch *batches, int n, const sbp_grad_opts *opts,
                        const sbp_objective *so, sbp_ledger *lg, sbp_err *err);

#endif
