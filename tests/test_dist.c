/* test_dist.c — the distributed step's protocol without processes (src/dist): synthetic slabs of
 * ragged buckets (buckets under 4096 elements, more ranks than a bucket has blocks, blocks that
 * straddle bucket boundaries) cut into pieces for N = 1..6 ranks; the pieces tile every bucket,
 * every 4096-element block has one owner, and twelve synthetic micro-batch gradients "sent" as
 * pieces and folded by their owners in ascending micro-batch order give the 1-process fold's
 * bits, and the owners' block sums give sbp_grad_norm's bits. Also the transport of a build or a
 * run without MPI: one process, a launcher announcing two refused by a build without MPI; and
 * sequence parallel's slices (the rows each rank holds). */
#include "../src/api/seqpar.h"
#include "../src/dist/dist.h"
#include "../src/dist/seqlink.h"
#include "../src/train/zero2.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { BLK = SBP_DIST_BLOCK, N_MICRO = 12, MAX_B = 16 };

/* Slabs as bucket sizes in slab order: tiny buckets, a bucket of exactly one block, ragged ones,
 * the shapes a model's table gives (embedding, layers, head). */
static const int64_t slabs[][MAX_B] = {
    {5000, 100, 3, 9000, 4096, 12288, 1, 7000, 0},
    {4096, 4096, 4096, 0},
    {10, 20, 30, 0},
    {70000, 8191, 8193, 4095, 4097, 33, 0},
};
enum { N_SLABS = sizeof slabs / sizeof slabs[0] };

/* A params table whose buckets are the sizes given: the first is the embedding, the last the head,
 * the rest layers (sbp_grad_buckets orders them head, layers descending, embedding). */
static void table(sbp_params *ps, const int64_t *sizes) {
    int n = 0;
    while (sizes[n]) n++;
    memset(ps, 0, sizeof *ps);
    ps->p = calloc((size_t)n, sizeof *ps->p);
    for (int i = 0; i < n; i++) {
        sbp_param *p = &ps->p[ps->n++];
        p->kind = i == 0 ? SBP_P_EMBED : i == n - 1 ? SBP_P_FINAL_NORM : SBP_P_Q;
        p->layer = i == 0 || i == n - 1 ? -1 : i - 1;
        p->numel = sizes[i], p->offset = ps->total;
        ps->total += sizes[i];
    }
}

static float rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2 - 1) * 1e-3f;
}

START_TEST(pieces_fold_and_norm) {
    const int slab = _i % N_SLABS, N = _i / N_SLABS + 1;
    sbp_params ps;
    table(&ps, slabs[slab]);
    sbp_bucket b[MAX_B];
    const int nb = sbp_grad_buckets(b, MAX_B, &ps);
    ck_assert_int_gt(nb, 0);
    sbp_piece pc[MAX_B * 8];
    const int np = sbp_dist_pieces(pc, MAX_B * 8, b, nb, N);
    ck_assert_int_gt(np, 0);
    const int64_t P = ps.total, nblk = (P + BLK - 1) / BLK;
    /* the pieces tile each bucket in order; one owner per block */
    int *owner = malloc(sizeof *owner * (size_t)P), *bowner = malloc(sizeof *bowner * nblk);
    for (int64_t i = 0; i < nblk; i++) bowner[i] = -1;
    int64_t covered = 0;
    for (int i = 0; i < np; i++) {
        ck_assert(pc[i].owner >= 0 && pc[i].owner < N && pc[i].n > 0);
        if (i == 0 || pc[i].bucket != pc[i - 1].bucket)
            ck_assert_int_eq(pc[i].off, b[pc[i].bucket].off);
        else
            ck_assert_int_eq(pc[i].off, pc[i - 1].off + pc[i - 1].n);
        for (int64_t e = pc[i].off; e < pc[i].off + pc[i].n; e++) {
            owner[e] = pc[i].owner;
            const int64_t blk = e / BLK;
            if (bowner[blk] < 0) bowner[blk] = pc[i].owner;
            ck_assert_msg(bowner[blk] == pc[i].owner, "N=%d: block %lld has two owners", N,
                          (long long)blk);
        }
        covered += pc[i].n;
    }
    ck_assert_int_eq(covered, P);
    /* twelve micro-batch gradients: the 1-process fold, and the pieces folded by owners */
    float *g = malloc(sizeof *g * (size_t)P * N_MICRO), *one = malloc(sizeof *one * (size_t)P),
          *dist = calloc((size_t)P, sizeof *dist);
    uint64_t s = 42 + _i;
    for (int64_t i = 0; i < P * N_MICRO; i++) g[i] = rnd(&s);
    memcpy(one, g, sizeof *one * (size_t)P);
    for (int k = 1; k < N_MICRO; k++) sbp_dist_fold(one, g + (size_t)k * P, P, 4, 0);
    for (int r = 0; r < N; r++) { /* rank r's share: its pieces, k ascending, each from k's rank */
        for (int i = 0; i < np; i++) {
            if (pc[i].owner != r) continue;
            float *acc = dist + pc[i].off;
            memcpy(acc, g + pc[i].off, sizeof *acc * (size_t)pc[i].n);
            for (int k = 1; k < N_MICRO; k++)
                sbp_dist_fold(acc, g + (size_t)k * P + pc[i].off, pc[i].n, 4, 0);
        }
    }
    ck_assert_msg(memcmp(one, dist, sizeof *one * (size_t)P) == 0, "N=%d slab %d: the fold differs",
                  N, slab);
    /* the norm from the owners' block sums, added in block order */
    double *part = calloc((size_t)nblk, sizeof *part), sum = 0;
    for (int64_t blk = 0; blk < nblk; blk++)
        for (int64_t e = blk * BLK; e < P && e < (blk + 1) * BLK; e++)
            part[blk] += (double)dist[e] * dist[e];
    for (int64_t blk = 0; blk < nblk; blk++) sum += part[blk];
    const double want = sbp_grad_norm(one, P, SBP_FP32), got = sqrt(sum);
    ck_assert_msg(memcmp(&want, &got, sizeof got) == 0, "N=%d: norm %.17g, 1 process %.17g", N, got,
                  want);
    free(part), free(g), free(one), free(dist), free(owner), free(bowner);
    sbp_params_free(&ps);
}
END_TEST

/* Balanced: with as many blocks as ranks or more, every rank owns some of every large bucket. */
START_TEST(pieces_balanced) {
    sbp_params ps;
    table(&ps, slabs[3]);
    sbp_bucket b[MAX_B];
    const int nb = sbp_grad_buckets(b, MAX_B, &ps);
    sbp_piece pc[MAX_B * 8];
    const int np = sbp_dist_pieces(pc, MAX_B * 8, b, nb, 4);
    int64_t per[4] = {0};
    for (int i = 0; i < np; i++)
        if (b[pc[i].bucket].n == 70000) per[pc[i].owner] += pc[i].n;
    for (int r = 0; r < 4; r++) ck_assert_int_gt(per[r], 3 * BLK);
    sbp_params_free(&ps);
}
END_TEST

/* ZeRO-2 (src/train/zero2.h): each rank's owned ranges tile the slab in whole blocks, once over the
 * ranks; AdamW stepping only a rank's ranges with packed moments gives those elements the
 * one-process step's weights and moments (three steps, weight decay with no-decay ranges that cut
 * blocks), and clipping each rank's ranges with the global norm gives sbp_clip_grad_norm's bits. */
START_TEST(zero2_shards) {
    const int slab = _i % N_SLABS, N = _i / N_SLABS + 1;
    sbp_params ps;
    table(&ps, slabs[slab]);
    const int64_t P = ps.total;
    sbp_err err = {0};
    const sbp_adamw_opts o = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
    const sbp_range nd[] = {{3, 17}, {P / 2, P / 2 + 5000 < P ? P / 2 + 5000 : P}};
    float *g = malloc(sizeof *g * (size_t)P * 3), *p0 = malloc(sizeof *p0 * (size_t)P),
          *pf = malloc(sizeof *pf * (size_t)P), *pr = malloc(sizeof *pr * (size_t)P),
          *cf = malloc(sizeof *cf * (size_t)P), *cr = malloc(sizeof *cr * (size_t)P);
    uint64_t s = 7 + _i;
    for (int64_t i = 0; i < P * 3; i++) g[i] = rnd(&s) * 1e3f;
    for (int64_t i = 0; i < P; i++) p0[i] = rnd(&s) * 1e3f;
    sbp_adamw full;
    ck_assert_int_eq(sbp_adamw_init(&full, &o, SBP_FP32, P, NULL, &err), SBP_OK);
    ck_assert_int_eq(sbp_adamw_exclude_decay(&full, nd, P > 20 ? 2 : 0, &err), SBP_OK);
    memcpy(pf, p0, sizeof *pf * (size_t)P);
    for (int t = 0; t < 3; t++) sbp_adamw_step(&full, pf, g + (size_t)t * P, 1e-2);
    memcpy(cf, g, sizeof *cf * (size_t)P), memcpy(cr, g, sizeof *cr * (size_t)P);
    const double norm = sbp_grad_norm(g, P, SBP_FP32);
    sbp_clip_grad_norm(cf, P, SBP_FP32, 1e-3);
    int64_t covered = 0;
    for (int r = 0; r < N; r++) {
        sbp_adamw a;
        ck_assert_int_eq(sbp_adamw_init(&a, &o, SBP_FP32, P, NULL, &err), SBP_OK);
        ck_assert_int_eq(sbp_adamw_exclude_decay(&a, nd, P > 20 ? 2 : 0, &err), SBP_OK);
        int64_t owned = 0, at = 0;
        a.n_held = sbp_dist_owned(&a.held, &owned, &ps, N, r);
        ck_assert_int_ge(a.n_held, 0);
        memcpy(pr, p0, sizeof *pr * (size_t)P);
        /* the gradient as a sharded step leaves it: the rank's ranges packed in order */
        float *gs = malloc(sizeof *gs * (size_t)(owned ? owned : 1) * 3);
        for (int t = 0; t < 3; t++)
            for (int k = 0, q = 0; k < a.n_held; q += (int)(a.held[k].end - a.held[k].begin), k++)
                memcpy(gs + (size_t)t * owned + q, g + (size_t)t * P + a.held[k].begin,
                       sizeof *gs * (size_t)(a.held[k].end - a.held[k].begin));
        for (int t = 0; t < 3; t++) sbp_adamw_step(&a, pr, gs + (size_t)t * owned, 1e-2);
        free(gs);
        sbp_clip_ranges(cr, a.held, a.n_held, SBP_FP32, norm, 1e-3);
        for (int k = 0; k < a.n_held; k++) {
            const sbp_range *h = &a.held[k];
            const size_t n = (size_t)(h->end - h->begin);
            ck_assert(h->begin % BLK == 0 && (h->end % BLK == 0 || h->end == P));
            ck_assert(k == 0 || h->begin > a.held[k - 1].end);
            ck_assert_msg(
                !memcmp(pr + h->begin, pf + h->begin, n * 4) &&
                    !memcmp((float *)a.exp_avg + at, (float *)full.exp_avg + h->begin, n * 4) &&
                    !memcmp((float *)a.exp_avg_sq + at, (float *)full.exp_avg_sq + h->begin, n * 4),
                "N=%d rank %d: range [%lld, %lld) differs from one process's step", N, r,
                (long long)h->begin, (long long)h->end);
            at += (int64_t)n;
        }
        ck_assert_int_eq(at, owned);
        covered += owned;
        sbp_adamw_free(&a, NULL);
    }
    ck_assert_int_eq(covered, P);
    ck_assert_msg(!memcmp(cf, cr, sizeof *cf * (size_t)P), "N=%d: the clipped shares differ", N);
    sbp_adamw_free(&full, NULL);
    free(g), free(p0), free(pf), free(pr), free(cf), free(cr);
    sbp_params_free(&ps);
}
END_TEST

/* The network model (src/dist/netmodel.c). One round by hand: buckets done at 1, 2, 3 s with
 * transfers of 0.5, 2 and 0.1 s: the link sends [1, 1.5], [2, 4], [4, 4.1]: 1.1 s after the
 * backward. Transfers that fit their windows expose nothing. */
START_TEST(net_round_by_hand) {
    const double b[] = {1, 1, 1}, d[] = {0.5, 2, 0.1}, fits[] = {0.9, 0.9, 0};
    ck_assert_double_eq_tol(sbp_dist_exposed_round(b, d, 3), 1.1, 1e-12);
    ck_assert_double_eq(sbp_dist_exposed_round(b, fits, 3), 0);
    const double late[] = {0, 0, 0.25}; /* the last bucket's transfer has no window */
    ck_assert_double_eq_tol(sbp_dist_exposed_round(b, late, 3), 0.25, 1e-12);
}
END_TEST

/* A whole step: with no compute to hide behind (an enormous FLOP rate) every byte and message is
 * exposed, so the exposed time is the traffic model's bytes/bandwidth + messages·latency; with a
 * slow rank only the exchanges after the backward (and the last buckets' transfers) remain. */
START_TEST(net_step_against_traffic) {
    sbp_config c;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_config_load(&c, "data/models/llama3-tiny.json", &err), SBP_OK);
    sbp_params ps;
    ck_assert_int_eq(sbp_params_build(&ps, &c, &err), SBP_OK);
    const sbp_grad_opts g = {.schedule = SBP_STREAM};
    for (int N = 2; N <= 4; N++)
        for (int opt = 0; opt < 2; opt++) {
            int64_t bytes, msgs;
            ck_assert_int_eq(sbp_dist_traffic(&bytes, &msgs, &ps, 4, N, 12, opt, &err), SBP_OK);
            const sbp_net fast = {.bandwidth = 1e6, .latency = 1e-3, .flops = 1e30};
            sbp_net_time t;
            ck_assert_int_eq(sbp_dist_net(&t, &c, &ps, &g, 1, 32, 4, N, 12, opt, &fast, &err),
                             SBP_OK);
            ck_assert_double_eq_tol(t.exposed, bytes / 1e6 + msgs * 1e-3, 1e-9);
            const sbp_net slow = {.bandwidth = 1e6, .latency = 1e-3, .flops = 1};
            ck_assert_int_eq(sbp_dist_net(&t, &c, &ps, &g, 1, 32, 4, N, 12, opt, &slow, &err),
                             SBP_OK);
            ck_assert(t.compute > 1e3 && t.exposed >= t.after && t.after > 0);
            ck_assert(t.exposed < bytes / 1e6 + msgs * 1e-3);
        }
    sbp_params_free(&ps);
}
END_TEST

/* plan's flags for it: the time printed as the library computes it; malformed or incomplete
 * flags are usage errors naming what is wrong. */
START_TEST(net_plan_cli) {
    const char *q = "plan --config data/models/llama3-tiny.json --seq 32 --schedules stream "
                    "--grad-accum 4 --ranks 2 --optimizer";
    int rc = tu_cli("", 60, "%s --bandwidth 1M --latency 1e-3 --flops 0.001 --json", q);
    tu_check_run(rc, 0, "\"network_time\"", "\"bandwidth_bytes_per_s\":\t1000000",
                 "\"schedule\":\t\"stream\"");
    sbp_config c;
    sbp_err err = {0};
    sbp_params ps;
    ck_assert_int_eq(sbp_config_load(&c, "data/models/llama3-tiny.json", &err), SBP_OK);
    ck_assert_int_eq(sbp_params_build(&ps, &c, &err), SBP_OK);
    const sbp_grad_opts g = {.schedule = SBP_STREAM};
    const sbp_net net = {.bandwidth = 1e6, .latency = 1e-3, .flops = 1e6};
    sbp_net_time t;
    ck_assert_int_eq(sbp_dist_net(&t, &c, &ps, &g, 1, 32, 4, 2, 4, 1, &net, &err), SBP_OK);
    const char *at = strstr(tu_last_output(), "\"exposed_s\"");
    ck_assert_msg(at != NULL, "no exposed_s in %s", tu_last_output());
    ck_assert_msg(fabs(strtod(at + strlen("\"exposed_s\":"), NULL) - t.exposed) <= 1e-9 * t.exposed,
                  "plan says %s, the library %.17g", at, t.exposed);
    sbp_params_free(&ps);
    tu_expect_usage("--bandwidth takes bytes per second", "%s --bandwidth 10X --flops 1", q);
    tu_expect_usage("needs --ranks N (N > 1) or --seq-ranks S, --bandwidth and --flops",
                    "%s --bandwidth 10G", q);
}
END_TEST

/* Without a launcher: one process, no MPI started; a build without MPI refuses two processes. */
START_TEST(transport_one_process) {
    sbp_err err = {0};
    sbp_comm *c;
    unsetenv("OMPI_COMM_WORLD_SIZE"), unsetenv("PMIX_RANK");
    ck_assert_int_eq(sbp_comm_start(&c, 0, &err), SBP_OK);
    ck_assert_int_eq(sbp_comm_size(c), 1);
    ck_assert_int_eq(sbp_comm_rank(c), 0);
    double x = 3, y = 0;
    ck_assert_int_eq(sbp_comm_allgather(c, &y, &x, sizeof x, "x", &err), SBP_OK);
    ck_assert(y == 3);
    sbp_comm_finish(c);
    if (!sbp_comm_built()) {
        setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
        ck_assert_int_eq(sbp_comm_start(&c, 0, &err), SBP_EUSAGE);
        ck_assert(strstr(err.msg, "no MPI") != NULL);
        unsetenv("OMPI_COMM_WORLD_SIZE");
    }
}
END_TEST

/* What every cut of T tokens for S ranks on grain g is: from 0 to T, every rank some rows,
 * starting on a grain, whole grains but the last rank's */
static void check_cut(const int *b, int T, int S, int g) {
    ck_assert_int_eq(b[0], 0);
    ck_assert_int_eq(b[S], T);
    for (int q = 0; q < S; q++) {
        ck_assert_int_gt(b[q + 1] - b[q], 0);
        ck_assert_int_eq(b[q] % g, 0);
        ck_assert((b[q + 1] - b[q]) % g == 0 || q == S - 1);
    }
}

/* Sequence parallel's slices: consecutive, covering [0, T), whole grains (the last rank's may
 * end short at T), the first ranks the extra grains, balanced to one grain; refused with fewer
 * grains than ranks. */
START_TEST(seq_slices) {
    static const int Ts[] = {1, 127, 128, 129, 300, 450, 512, 4096, 4097, 131072};
    static const int grains[] = {1, 7, 128, 512};
    int b[SBP_SEQ_MAX + 1];
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++)
        for (size_t j = 0; j < sizeof grains / sizeof *grains; j++)
            for (int S = 1; S <= 9; S++) {
                const int T = Ts[i], g = grains[j], n = (T + g - 1) / g;
                const int ok = sbp_seq_slices(b, T, S, g);
                ck_assert_int_eq(ok, n >= S);
                if (!ok) continue;
                check_cut(b, T, S, g);
                for (int q = 0; q < S; q++) {
                    const int rows = b[q + 1] - b[q];
                    ck_assert_int_le(rows, (n / S + (n % S != 0)) * g);
                    if (q > 0) ck_assert_int_le(rows, b[q] - b[q - 1]); /* the first: no fewer */
                }
            }
    ck_assert(!sbp_seq_slices(b, 100, 0, 8) && !sbp_seq_slices(b, 0, 2, 8) &&
              !sbp_seq_slices(b, 100, 2, 0));
}
END_TEST

/* The cut by work (--seq-overlap): the same shape rules as the even cut, at least one grain a
 * rank; on a causal model the earlier ranks take more rows, never fewer; the bench model at
 * T = 8192 on the 512-token grain cuts at 4608 (the calibration that sbp_seq_slices_by_work
 * names); a window short against T leaves little to balance (Gemma-3's local layers: within a
 * grain of even for the 1B model's 5:1 layers at T = 32768); and the refusals of the even cut. */
START_TEST(seq_slices_by_work) {
    sbp_config bench, gemma;
    sbp_err err = {0};
    ck_assert_msg(!sbp_config_load(&bench, "data/models/bench.json", &err), "%s", err.msg);
    ck_assert_msg(!sbp_config_load(&gemma, "data/configs/gemma3-1b.json", &err), "%s", err.msg);
    int b[SBP_SEQ_MAX + 1];
    static const int Ts[] = {1, 127, 300, 450, 4096, 8192, 65536};
    static const int grains[] = {1, 128, 512};
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++)
        for (size_t j = 0; j < sizeof grains / sizeof *grains; j++)
            for (int S = 1; S <= 8; S++) {
                const int T = Ts[i], g = grains[j], n = (T + g - 1) / g;
                const int ok = sbp_seq_slices_by_work(b, &bench, T, S, g);
                ck_assert_int_eq(ok, n >= S);
                if (!ok) continue;
                check_cut(b, T, S, g);
                /* causal: a later rank's rows cost more, so it takes no more rows than the rank
                 * before but for the rounding to a grain */
                for (int q = 1; q < S - 1; q++)
                    ck_assert_int_le(b[q + 1] - b[q], b[q] - b[q - 1] + g);
            }
    ck_assert(sbp_seq_slices_by_work(b, &bench, 8192, 2, 512) && b[1] == 4608);
    ck_assert(sbp_seq_slices_by_work(b, &bench, 65536, 4, 512));
    ck_assert_msg(b[1] - b[0] > 16384 && b[4] - b[3] < 16384, "bench S = 4: %d %d %d", b[1], b[2],
                  b[3]);
    ck_assert(sbp_seq_slices_by_work(b, &gemma, 32768, 4, 512));
    for (int q = 0; q < 4; q++)
        ck_assert_msg(abs(b[q + 1] - b[q] - 8192) <= 512 + 512, "gemma3-1b: rank %d has %d rows", q,
                      b[q + 1] - b[q]);
    ck_assert(!sbp_seq_slices_by_work(b, &bench, 100, 0, 8) &&
              !sbp_seq_slices_by_work(b, &bench, 0, 2, 8) &&
              !sbp_seq_slices_by_work(b, &bench, 100, 2, 0));
}
END_TEST

/* A rank's share of a step's FLOPs: the shares of a cut add up to 1; under a causal mask a
 * later range of as many rows costs more (its queries see more keys); a range's share grows
 * with the range. */
START_TEST(seq_work_share) {
    sbp_config c;
    sbp_err err = {0};
    ck_assert_msg(!sbp_config_load(&c, "data/models/bench.json", &err), "%s", err.msg);
    for (int S = 1; S <= 5; S++) {
        int b[SBP_SEQ_MAX + 1];
        ck_assert(sbp_seq_slices(b, 8192, S, 512));
        double sum = 0;
        for (int q = 0; q < S; q++) sum += sbp_seq_work_share(&c, 8192, b[q], b[q + 1]);
        ck_assert_double_eq_tol(sum, 1, 1e-12);
    }
    ck_assert(sbp_seq_work_share(&c, 8192, 4096, 8192) > sbp_seq_work_share(&c, 8192, 0, 4096));
    ck_assert(sbp_seq_work_share(&c, 8192, 0, 4097) > sbp_seq_work_share(&c, 8192, 0, 4096));
    ck_assert_double_eq(sbp_seq_work_share(&c, 8192, 0, 8192), 1);
    ck_assert(sbp_seq_work_share(&c, 8192, 5, 5) == 0 &&
              sbp_seq_work_share(&c, 8192, 0, 9000) == 0);
}
END_TEST

/* Sequence parallel's exposed time (plan --seq-ranks S --bandwidth ...): with no compute to hide
 * behind and no latency, every byte is exposed, so the time is the rank sending the most's
 * bytes (the model's traffic) at the link's rate; with latency it lies between that and every
 * rank's; with a compute that hides every round, only the exchanges after the rounds are, and
 * the compute is the m = 2 rounds' of the rank with the most work (at least 1/S of each step);
 * the command line prints the library's figure. */
START_TEST(seq_net_model) {
    sbp_config c;
    sbp_err err = {0};
    ck_assert_msg(!sbp_config_load(&c, "data/models/llama3-tiny.json", &err), "%s", err.msg);
    for (int S = 2; S <= 3; S++) {
        sbp_plan_opts o = {.B = 1,
                           .T = 450,
                           .seq_ranks = S,
                           .micro_batches = 4,
                           .ranks = 2 * S,
                           .grad = {.schedule = SBP_STREAM, .block = 8, .chunk = 40}};
        int64_t bytes = 0, msgs = 0;
        ck_assert_msg(!sbp_plan_seq_traffic(&bytes, &msgs, &c, &o, &err), "%s", err.msg);
        const sbp_net bare = {.bandwidth = 1e6, .latency = 0, .flops = 1e30};
        sbp_net_time t;
        ck_assert_msg(!sbp_plan_seq_net(&t, &c, &o, &bare, &err), "%s", err.msg);
        ck_assert_msg(fabs(t.exposed - bytes / 1e6) <= 1e-12 * t.exposed,
                      "S = %d: exposed %.17g, the rank sending the most %.17g", S, t.exposed,
                      bytes / 1e6);
        const sbp_net fast = {.bandwidth = 1e6, .latency = 1e-3, .flops = 1e30};
        ck_assert_msg(!sbp_plan_seq_net(&t, &c, &o, &fast, &err), "%s", err.msg);
        const double sent = bytes / 1e6 + msgs * 1e-3;
        ck_assert_msg(t.exposed >= sent * (1 - 1e-12) && t.exposed <= S * sent,
                      "S = %d: exposed %g, the rank sending the most %g", S, t.exposed, sent);
        ck_assert(t.compute < 1e-9 && t.per_round > 0 && t.after > 0);
        const sbp_net slow = {.bandwidth = 1e6, .latency = 1e-3, .flops = 1};
        ck_assert_msg(!sbp_plan_seq_net(&t, &c, &o, &slow, &err), "%s", err.msg);
        const double step = sbp_step_flops(&c, 1, 450, &o.grad);
        ck_assert_msg(t.compute >= 2 * step / S && t.compute <= 2 * step, "S = %d: %g of %g", S,
                      t.compute, step);
        ck_assert(t.per_round == 0 && t.exposed == t.after && t.after > 0);
    }
    /* the bench model's gradient (44.6M elements) outweighs its K/V at T = 1024: the group's last
     * rank, which sends the pieces, sends the most */
    sbp_config bench;
    ck_assert_msg(!sbp_config_load(&bench, "data/models/bench.json", &err), "%s", err.msg);
    sbp_plan_opts big = {
        .B = 1, .T = 1024, .seq_ranks = 2, .micro_batches = 2, .ranks = 4, .grad = {.block = 512}};
    int64_t bytes = 0, msgs = 0;
    ck_assert_msg(!sbp_plan_seq_traffic(&bytes, &msgs, &bench, &big, &err), "%s", err.msg);
    ck_assert(bytes > (int64_t)4 * 44000000);
    const sbp_net bare = {.bandwidth = 1e9, .latency = 0, .flops = 1e30};
    sbp_net_time bt;
    ck_assert_msg(!sbp_plan_seq_net(&bt, &bench, &big, &bare, &err), "%s", err.msg);
    ck_assert_msg(fabs(bt.exposed - bytes / 1e9) <= 1e-12 * bt.exposed, "bench: %.17g, %.17g",
                  bt.exposed, bytes / 1e9);
    sbp_plan_opts one = {.B = 1, .T = 450, .seq_ranks = 1};
    sbp_net_time t;
    const sbp_net net = {.bandwidth = 1e6, .latency = 0, .flops = 1e9};
    ck_assert_int_eq(sbp_plan_seq_net(&t, &c, &one, &net, &err), SBP_EUSAGE);
    const char *q = "plan --config data/models/llama3-tiny.json --seq 450 --schedules stream "
                    "--seq-ranks 2 --block 8 --chunk 40";
    int rc = tu_cli("", 60, "%s --bandwidth 1M --latency 1e-3 --flops 0.001 --json", q);
    tu_check_run(rc, 0, "\"network_time\"", "\"exposed_s\"", "\"sent_bytes_per_step\"");
    sbp_plan_opts o = {.B = 1,
                       .T = 450,
                       .seq_ranks = 2,
                       .grad = {.schedule = SBP_STREAM, .block = 8, .chunk = 40}};
    const sbp_net cli = {.bandwidth = 1e6, .latency = 1e-3, .flops = 1e6};
    ck_assert_msg(!sbp_plan_seq_net(&t, &c, &o, &cli, &err), "%s", err.msg);
    const char *at = strstr(tu_last_output(), "\"exposed_s\"");
    ck_assert_msg(at != NULL, "no exposed_s in %s", tu_last_output());
    ck_assert_msg(fabs(strtod(at + strlen("\"exposed_s\":"), NULL) - t.exposed) <= 1e-9 * t.exposed,
                  "plan says %s, the library %.17g", at, t.exposed);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("dist");
    TCase *tc = tcase_create("dist");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, pieces_fold_and_norm, 0, N_SLABS * 6);
    tcase_add_test(tc, pieces_balanced);
    tcase_add_loop_test(tc, zero2_shards, 0, N_SLABS * 6);
    tcase_add_test(tc, net_round_by_hand);
    tcase_add_test(tc, net_step_against_traffic);
    tcase_add_test(tc, net_plan_cli);
    tcase_add_test(tc, transport_one_process);
    tcase_add_test(tc, seq_slices);
    tcase_add_test(tc, seq_slices_by_work);
    tcase_add_test(tc, seq_work_share);
    tcase_add_test(tc, seq_net_model);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
