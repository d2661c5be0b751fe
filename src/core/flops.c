/* flops.c — the floating-point work of one step as the engine executes it: every matrix product
 * (projections, attention tiles, LM head), recomputation included; elementwise work is left out.
 *
 * Per sequence, with P = the projections' FLOPs per token (2·(C·Q + 2·C·KV + Q·C + 3·C·F)),
 * H = 2·C·V per token and attention on W-wide tiles (each (query tile, key tile) pair at or
 * below the diagonal costs per head 4·wq·wk·HD in the forward and, in the backward, 10 in one
 * pass or 8 in pass 1 and 6 in pass 2 — one pass when the kv heads divide among the threads
 * (sbp_set_threads; src/kernels/fast/attention.c)):
 *   full   = L·(3P + A_fwd + A_bwd) + 3H·T               (forward, then dX and dW)
 *   ckpt   = full + L·(P − 2·F·C + A_fwd)                (the recompute skips the down projection;
 *                                                         Gemma-3's does not: its post-norm needs
 *                                                         the MLP output, + L·2·F·C)
 *   stream = ckpt                                        (K and V are projected once per layer)
 *   DPO adds H·T for its forward-only first pass over the head.
 * A sliding-window layer (Gemma-3's local layers, window Wn) meets for query tile i0 only the key
 * tiles from the one holding key i0 − Wn + 1 (fast/attention.c): its pairs grow as T·Wn, not T²;
 * A_fwd and A_bwd are summed over the layers with each layer's pairs.
 * With a LoRA adapter (o->lora) the base is frozen: no weight-gradient products, so the backward
 * of the projections costs P and of the head H (dX only), and each adapted projection (in K, out
 * N, rank r) adds per token 2r(K + N) forward (again in a recompute, except the down
 * projection's), and 6rK + 4rN backward (x·Aᵀ again, dt and dB, dX and dA). */
#include "../streambp.h"
#include "tiles.h"

#include <stdint.h>

double attention_tile_pairs(int s, int e, int W, int win) {
    double pairs = 0;
    for (int i0 = s; i0 < e; i0 = (i0 / W + 1) * W) {
        const int i1 = (i0 / W + 1) * W < e ? (i0 / W + 1) * W : e, wq = i1 - i0;
        const int lo = win ? i0 / W * W - win + 1 : 0;
        for (int j0 = lo > 0 ? lo / W * W : 0; j0 < i1; j0 += W)
            pairs += (double)wq * (j0 + W < i1 ? W : i1 - j0);
    }
    return pairs;
}

static double tile_pairs(int T, int W, int win) {
    return attention_tile_pairs(0, T, W, win);
}

/* P and H of the head comment: a token's projections and its head row, forward */
static void token_products(const sbp_config *c, double *P, double *H) {
    const double C = c->hidden, F = c->ffn, HD = c->head_dim;
    const double Q = (double)c->heads * HD, KV = (double)c->kv_heads * HD;
    *P = 2 * (C * Q + 2 * C * KV + Q * C + 3 * C * F), *H = 2 * C * c->vocab;
}

double sbp_step_flops(const sbp_config *c, int B, int T, const sbp_grad_opts *o) {
    const double C = c->hidden, F = c->ffn, HD = c->head_dim;
    const double Q = (double)c->heads * HD, KV = (double)c->kv_heads * HD;
    double P, H;
    token_products(c, &P, &H);
    const int W = attention_tile(o->block ? o->block : SBP_DEFAULT_BLOCK);
    /* Σ over the layers of their pairs: the global layers' and the local layers' */
    int local = 0;
    for (int l = 0; l < c->layers; l++) local += sbp_layer_window(c, l) != 0;
    double pairs = (c->layers - local) * tile_pairs(T, W, 0);
    if (local) pairs += local * tile_pairs(T, W, c->sliding_window);
    const double afwd = 4 * pairs * HD * c->heads,
                 abwd = (attention_one_pass(c->kv_heads) ? 10 : 14) * pairs * HD * c->heads;
    const int recompute = o->schedule != SBP_FULL;
    const int gem = c->family == SBP_GEMMA3; /* its recompute runs the down projection too */
    double f;
    if (!o->lora) {
        f = c->layers * 3 * P * T + afwd + abwd + 3 * H * T;
    } else {
        f = c->layers * 2 * P * T + afwd + abwd + 2 * H * T;
        const sbp_lora_config *lc = &o->lora->cfg;
        const double r = lc->r;
        const struct {
            unsigned bit;
            double K, N;
            int in_recompute;
        } proj[] = {{SBP_LORA_Q, C, Q, 1},     {SBP_LORA_K, C, KV, 1},   {SBP_LORA_V, C, KV, 1},
                    {SBP_LORA_O, Q, C, 1},     {SBP_LORA_GATE, C, F, 1}, {SBP_LORA_UP, C, F, 1},
                    {SBP_LORA_DOWN, F, C, gem}};
        for (size_t i = 0; i < sizeof proj / sizeof proj[0]; i++) {
            if (!(lc->targets & proj[i].bit)) continue;
            const double fwd = 2 * r * (proj[i].K + proj[i].N);
            const double bwd = 6 * r * proj[i].K + 4 * r * proj[i].N;
            f += c->layers * T * (fwd + bwd + (recompute && proj[i].in_recompute ? fwd : 0));
        }
    }
    if (recompute) f += c->layers * (P - (gem ? 0 : 2 * F * C)) * T + afwd;
    if (o->objective.kind == SBP_OBJ_DPO) f += H * T;
    return f * B;
}

/* The work of a stream step by token, for cutting a sequence among the ranks that share it:
 * each token's projections (the forward, the recompute, dX and dW: 4P) and its head rows (3H),
 * and, per layer, its attention: as a query, per key it sees, the forward twice and the
 * backward's score, dP and dQ products (4 + 4 + 6 per head and HD); as a key, in its rank's key
 * pass, per later query that sees it, the score, dP, dK and dV products (8). A window caps both
 * counts. The attention's FLOPs weigh twice the products' (ATTN_WEIGHT): its tiles run slower,
 * and the ranks after the first carry the overlap's extra head pass and copies. Calibrated on
 * the bench model at T = 8192, S = 2 under --seq-overlap, where the cuts on the 512-token grain
 * measured 10.17 s (4096 rows first), 9.70 s (4608) and 10.19 s (5120) on 2026-12-06 (Intel
 * Xeon, 2 vCPUs): this weight picks 4608, FLOPs alone 4096. */
enum { ATTN_WEIGHT = 2 };

typedef struct {
    double row, q;        /* per token; per (head·HD) of a query-key pair */
    int global, local, W; /* layers without a window, with window W */
    int T, grain;
} seq_work;

/* Σ_{u = 1..n} min(u, cap), cap < 0: no cap */
static double sum_min(int64_t n, int64_t cap) {
    if (n <= 0) return 0;
    if (cap < 0 || n <= cap) return (double)n * (double)(n + 1) / 2;
    return (double)cap * (double)(cap + 1) / 2 + (double)(n - cap) * (double)cap;
}

/* Σ over tokens t in [a, b) of min(t + 1, cap) (keys seen) and of min(T − 1 − t, cap − 1) (later
 * queries seeing t), weighted 14 and 8 */
static double pairs_of(const seq_work *w, int64_t a, int64_t b, int64_t cap) {
    const int64_t T = w->T, cap_by = cap < 0 ? -1 : cap - 1;
    return 14 * (sum_min(b, cap) - sum_min(a, cap)) +
           8 * (sum_min(T - 1 - a, cap_by) - sum_min(T - 1 - b, cap_by));
}

/* the work of tokens [a, b), in closed form */
static double range_work(const seq_work *w, int64_t a, int64_t b) {
    double pairs = (double)w->global * pairs_of(w, a, b, -1);
    if (w->local) pairs += (double)w->local * pairs_of(w, a, b, w->W);
    return (double)(b - a) * w->row + w->q * pairs;
}

/* the work of grain g */
static double grain_work(const seq_work *w, int g) {
    const int64_t a = (int64_t)g * w->grain, e = a + w->grain;
    return range_work(w, a, e < w->T ? e : w->T);
}

/* The per-token work of a step of T tokens on c, with attention weighed `weight` times the
 * products, on the grain (0: none). */
static seq_work work_of(const sbp_config *c, int T, int grain, double weight) {
    double P, H;
    token_products(c, &P, &H);
    seq_work w = {.row = c->layers * 4 * P + 3 * H,
                  .q = weight * (double)c->heads * c->head_dim,
                  .W = c->sliding_window,
                  .T = T,
                  .grain = grain};
    for (int l = 0; l < c->layers; l++) {
        if (sbp_layer_window(c, l))
            w.local++;
        else
            w.global++;
    }
    return w;
}

double sbp_seq_work_share(const sbp_config *c, int T, int r0, int r1) {
    if (T < 1 || r0 < 0 || r1 > T || r1 <= r0) return 0;
    const seq_work w = work_of(c, T, 0, 1);
    const double all = range_work(&w, 0, T);
    return all > 0 ? range_work(&w, r0, r1) / all : 0;
}

/* Grains [0, n) packed greedily into runs of work at most `most` (a grain over it alone makes a
 * run): start[q] the first grain of run q; the number of runs, S + 1 as soon as there would be
 * more than S. */
static int pack(int *start, const seq_work *w, int n, int S, double most) {
    int q = 0;
    double run = 0;
    start[0] = 0;
    for (int g = 0; g < n; g++) {
        const double gw = grain_work(w, g);
        if (run > 0 && run + gw > most) {
            if (++q == S) return S + 1;
            start[q] = g, run = 0;
        }
        run += gw;
    }
    return q + 1;
}

/* The cut whose largest rank's work is least (the step waits on that rank): the least bound
 * that S greedy runs meet, by bisection; where the runs are fewer than S, the last run of two
 * grains or more gives its last grain to a new run after it, until every rank has one. Every
 * rank computes it alike: no allocation, nothing that could differ between them. */
int sbp_seq_slices_by_work(int *bounds, const sbp_config *c, int T, int S, int grain) {
    if (S < 1 || T < 1 || grain < 1) return 0;
    const int n = T / grain + (T % grain != 0); /* grains, the last possibly short */
    if (n < S) return 0;
    const seq_work w = work_of(c, T, grain, ATTN_WEIGHT);
    double lo = 0, hi = 0; /* the least bound S runs meet lies in (lo, hi] */
    for (int g = 0; g < n; g++) hi += grain_work(&w, g);
    for (int i = 0; i < 100 && hi - lo > 1e-12 * hi; i++) {
        const double mid = lo + (hi - lo) / 2;
        if (pack(bounds, &w, n, S, mid) <= S)
            hi = mid;
        else
            lo = mid;
    }
    int runs = pack(bounds, &w, n, S, hi); /* bounds: the runs' first grains, then n */
    for (bounds[runs] = n; runs < S; runs++) {
        int at = runs - 1;
        while (bounds[at + 1] - bounds[at] < 2) at--; /* n ≥ S: one has two grains */
        for (int q = runs + 1; q > at + 1; q--) bounds[q] = bounds[q - 1];
        bounds[at + 1] = bounds[at + 2] - 1;
    }
    for (int q = 1; q < S; q++) bounds[q] *= grain;
    bounds[S] = T;
    return 1;
}
