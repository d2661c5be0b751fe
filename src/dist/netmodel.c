/* netmodel.c — the exposed communication time of a distributed step (docs/distributed.md §7):
 * how long a rank waits on the network beyond its compute, for a link of a given bandwidth and
 * latency and a rank of a given FLOP rate.
 *
 * One round (a micro-batch on every rank): the backward completes the buckets in order (the head,
 * layers L−1 … 0, the embedding); bucket i is done at t_i = Σ_{j<=i} b_j, b_j its backward time.
 * As it completes, the rank sends its pieces of bucket i that others own: d_i = bytes_i/bandwidth
 * + messages_i·latency. The link sends one transfer after another (FIFO): s_i = max(t_i, e_{i−1}),
 * e_i = s_i + d_i; the owner folds after the round, so what is left after the backward is waited
 * for: exposed per round = max(0, e_last − t_last). After the m rounds come, not overlapped, the
 * losses' all-gather, then for grad the rank's share to rank 0 (which writes the file), for
 * train the clip norm's block sums and the rank's updated weights to the N − 1 others: their
 * bytes/bandwidth + messages·latency. The step's exposed time is m·(exposed per round) + that, for
 * the rank exposing the most; traffic as sbp_dist_traffic counts it.
 *
 * Backward times from src/core/flops.c: a micro-batch's work W = sbp_step_flops (its schedule's
 * recompute included), its forward a third of the full schedule's products (exact for the
 * projections and the head: one product forward, two backward; attention's forward is 4 of its
 * 14 (or 10) units, so slightly less), its backward B = W − forward, shared among the buckets in
 * proportion to their weight products' elements (the head V·C, a layer its parameters, the
 * embedding's lookup none). Computation seconds are FLOPs / flops. */
#include "../core/err.h"
#include "dist.h"

#include <stdlib.h>
#include <string.h>

double sbp_dist_exposed_round(const double *b, const double *d, int nb) {
    double t = 0, e = 0;
    for (int i = 0; i < nb; i++) {
        t += b[i];
        const double s = t > e ? t : e;
        e = s + d[i];
    }
    return e > t ? e - t : 0;
}

/* Each bucket's share of the backward's products (buckets of the model's table, in completion
 * order): the head V·C, a layer its elements, the embedding 0. */
static void compute_shares(double *w, const sbp_bucket *b, int nb, const sbp_config *c) {
    double sum = 0;
    for (int i = 0; i < nb; i++) {
        w[i] = b[i].id == SBP_BUCKET_HEAD    ? (double)c->vocab * c->hidden
               : b[i].id == SBP_BUCKET_EMBED ? 0
                                             : (double)b[i].n;
        sum += w[i];
    }
    for (int i = 0; i < nb; i++) w[i] = sum > 0 ? w[i] / sum : 0;
}

sbp_status sbp_dist_net(sbp_net_time *out, const sbp_config *cfg, const sbp_params *trained,
                        const sbp_grad_opts *g, int B, int T, int esz, int N, int n, int optimizer,
                        const sbp_net *net, sbp_err *err) {
    memset(out, 0, sizeof *out);
    if (!(net->bandwidth > 0) || !(net->latency >= 0) || !(net->flops > 0))
        return sbp_fail(err, SBP_EUSAGE,
                        "the network model needs bandwidth > 0, latency >= 0 "
                        "and a FLOP rate > 0");
    if (N < 1 || n % N) return sbp_fail(err, SBP_EUSAGE, "N must divide the micro-batches");
    sbp_params mp;
    sbp_status st = sbp_params_build(&mp, cfg, err);
    if (st) return st;
    const int cap = (mp.n > trained->n ? mp.n : trained->n) + 2;
    sbp_bucket *mb = malloc(sizeof *mb * (size_t)cap), *tb = malloc(sizeof *tb * (size_t)cap);
    sbp_piece *pc = malloc(sizeof *pc * (size_t)cap * (N + 1));
    double *w = malloc(sizeof *w * (size_t)cap), *bt = malloc(sizeof *bt * (size_t)cap),
           *d = malloc(sizeof *d * (size_t)cap);
    int nmb = -1, ntb = -1, np = -1;
    if (mb && tb && pc && w && bt && d && (nmb = sbp_grad_buckets(mb, cap, &mp)) >= 0 &&
        (ntb = sbp_grad_buckets(tb, cap, trained)) >= 0)
        np = sbp_dist_pieces(pc, cap * (N + 1), tb, ntb, N);
    if (np < 0) st = sbp_fail(err, SBP_ENOMEM, "out of memory");
    sbp_grad_opts full = *g;
    full.schedule = SBP_FULL, full.lora = NULL;
    const double work = sbp_step_flops(cfg, B, T, g), fwd = sbp_step_flops(cfg, B, T, &full) / 3;
    const double m = n / N;
    if (!st) compute_shares(w, mb, nmb, cfg);
    out->compute = m * work / net->flops;
    for (int r = 0; !st && r < N; r++) {
        int64_t own = 0, owned_pieces = 0;
        for (int i = 0; i < nmb; i++) { /* the model's buckets: the backward's timeline */
            bt[i] = w[i] * (work - fwd) / net->flops, d[i] = 0;
            const sbp_bucket *t = sbp_bucket_find(tb, ntb, mb[i].id);
            for (int k = 0; t && k < np; k++) { /* this rank's pieces of it that others own */
                if (pc[k].bucket != t - tb) continue;
                if (pc[k].owner == r)
                    own += pc[k].n, owned_pieces++;
                else
                    d[i] += (double)pc[k].n * esz / net->bandwidth + net->latency;
            }
        }
        const double peers = N - 1;
        double after = peers * (m * 8 / net->bandwidth + net->latency);
        if (optimizer)
            after +=
                peers *
                ((double)((own + SBP_DIST_BLOCK - 1) / SBP_DIST_BLOCK) * 8 / net->bandwidth +
                 net->latency + (double)own * esz / net->bandwidth + owned_pieces * net->latency);
        int64_t gathered = 0, gm = 0; /* grad: the share to rank 0's file */
        if (!optimizer && !(st = sbp_dist_gather_cost(&gathered, &gm, trained, N, r, err)))
            after += (double)gathered * esz / net->bandwidth + gm * net->latency;
        const double per_round = sbp_dist_exposed_round(bt, d, nmb);
        if (m * per_round + after > out->exposed)
            out->exposed = m * per_round + after, out->per_round = per_round, out->after = after;
    }
    free(mb), free(tb), free(pc), free(w), free(bt), free(d);
    sbp_params_free(&mp);
    return st;
}
