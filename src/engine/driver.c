/* driver.c — the schedules as rows of one table, and the one driver that runs them.
 *
 * A schedule is what the forward keeps and how the layer is cut into chunks; everything else —
 * the steps, their order, the buffers and when they live — is the same for every row:
 *
 *   row      keeps after the forward       layer chunk   logits
 *   full     every activation (*)          T (**)        B·T·V materialised
 *   ckpt     the layer inputs              T             B·T·V materialised
 *   stream   the layer inputs              c             passes of rows
 *
 * (`--chunked-logits` switches full and ckpt to passes of rows; the planner lists ckpt so
 * switched as "ckpt-chunked".) StreamBP (Luo et al., arXiv
 * 2506.03077) is the last row: the backward of a layer recomputes its K/V side once for all T
 * tokens, then walks the sequence in chunks [s, e) in ascending order, recomputing and
 * backpropagating each chunk's queries, attention and MLP and accumulating dK/dV of keys [0, e);
 * the K/V side is backpropagated once at the end (on a Gemma-3 local layer, key block by key
 * block as their window's queries finish, holding only the keys the next chunk can see:
 * layer_backward). Checkpointing is the same loop with one chunk
 * of T rows; full BP keeps what checkpointing recomputes. (*) Every schedule forms the outputs of
 * the norms and of SwiGLU again in the backward (chunk_formed, engine.h): no product and no
 * attention is recomputed in full BP. (**) The backward's chunk; full BP's forward runs in chunks
 * of whole token blocks (forward_rows).
 *
 * Buffer lifetimes, one rule for every row:
 *   - the kept tensors (layer inputs, or every activation) live from the forward that writes
 *     them to the backward that reads them; a layer's kept activations are freed when its
 *     backward is done, as autograd frees a layer's saved tensors;
 *   - the working set of a pass (the K/V side and the chunk's activations where they are not
 *     kept, the norm block, the backward's gradient scratch) is allocated when the pass starts
 *     and freed when it ends, so nothing of a layer lives while the head runs;
 *   - the hidden-state gradient lives from the head to the embedding backward. */
#include "engine.h"
#include "fold.h"

#include <stdlib.h>

static const sched_row rows[] = {
    [SBP_FULL] = {.keep_all = 1, .chunked = 0, .chunk_logits = 0},
    [SBP_CKPT] = {.keep_all = 0, .chunked = 0, .chunk_logits = 0},
    [SBP_STREAM] = {.keep_all = 0, .chunked = 1, .chunk_logits = 1},
};

const sched_row *sched_row_of(sbp_schedule s) {
    return &rows[s];
}

/* The buffers of one run of the driver. */
typedef struct {
    real *xs;       /* (L, B, T, C) layer inputs x_0 .. x_{L−1} */
    real *xL;       /* (B, T, C) the last layer's output */
    real *g;        /* (B, T, C) the hidden-state gradient, updated in place layer by layer */
    kv_acts *kv;    /* (L·B) when every activation is kept, else (1) */
    chunk_acts *ca; /* the same */
    chunk_formed fm;
    int n_kept; /* L·B or 1 */
    norm_block nb;
    lora_work lw;
    chunk_grads cg;
    kv_work kvw;
    pend_work pd; /* the portable sums' open token blocks (steps/sums.c), in the backward */
    query_side qs_mine, qs_in; /* sequence parallel, in the backward (relay.c) */
    int kvwin;   /* the local layers' K/V side is bounded by the window (kv_window_*) */
    int seqwin;  /* sequence parallel: the local layers' keys travel as far as the window */
    int kv_rows; /* rows of the K/V buffers of a pass that does not keep them (T, or less) */
    int kv_kept; /* the top layer's K/V side kept from the forward through the head (head_late,
                  * a rank after the first): the pass's buffers outlive the forward's pass */
} run_bufs;

/* Whether a row of the batch sees no key on a local layer of window W while the unattended mode
 * makes such a row attend to all T keys (unattended.c): every key of (i − W, i] padding. */
static int unattended_rows(const eng *e, const sbp_batch *b, int W) {
    if (e->unattended == SBP_UNATTENDED_ZERO || !b->mask) return 0;
    for (int bi = 0; bi < b->B; bi++) {
        const uint8_t *m = b->mask + (size_t)bi * b->T;
        int last = -1; /* the last real key at or before i */
        for (int i = 0; i < b->T; i++) {
            if (m[i]) last = i;
            if (last < 0 || last <= i - W) return 1;
        }
    }
    return 0;
}

/* The K/V side of the chunked row's local layers is bounded by the window, except for a batch
 * with rows that attend to all T keys (today's full-T path). Its buffers hold kv_rows rows when
 * every layer is local, else T (the global layers need them, and share the buffers). */
static void kv_plan(eng *e, run_bufs *r, const sched_row *row, const sbp_batch *b, int c) {
    int most = 0;
    /* sequence parallel holds the K/V side of all T rows (docs/distributed.md §8, stage 1) */
    const int local =
        e->gemma && e->cfg->sliding_window > 0 && !unattended_rows(e, b, e->cfg->sliding_window);
    r->kvwin = row->chunked && local && !e->link;
    r->seqwin = local && e->link;
    for (int l = 0; l < e->L; l++) {
        const int need = r->kvwin ? kv_rows(e, sbp_layer_window(e->cfg, l), c) : e->T;
        most = need > most ? need : most;
    }
    r->kv_rows = most;
}

/* The working set of one pass (engine.h's rule): allocated at its start, freed at its end. */
static int pass_begin(eng *e, run_bufs *r, const sched_row *row, int c, int backward) {
    const int blk = e->blk < e->T ? e->blk : e->T; /* the K/V side's rows per call */
    if (!norm_block_alloc(e, &r->nb) || !lora_work_alloc(e, &r->lw, c > blk ? c : blk) ||
        !chunk_formed_alloc(e, &r->fm, c))
        return 0;
    const int kvr = row->keep_all ? e->T : r->kv_rows;
    if (!row->keep_all && ((!r->kv[0].k && !kv_acts_alloc(e, &r->kv[0], kvr, SBP_MEM_LAYER)) ||
                           !chunk_acts_alloc(e, &r->ca[0], c, SBP_MEM_LAYER)))
        return 0;
    if (!backward) return 1;
    /* dK, dV of the K/V side's keys, sequence parallel this rank's only */
    const int seq = seq_shared(e), dkr = seq ? e->r1 - e->r0 : kvr;
    if (!kv_work_alloc(e, &r->kvw, dkr) || !chunk_grads_alloc(e, &r->cg, c) ||
        !pend_work_alloc(e, &r->pd, dkr))
        return 0;
    if (!seq) return 1;
    /* sequence parallel: this rank's query side for the earlier ranks, and a piece of a later
     * rank's */
    const int piece = seq_piece(e, c), me = e->link->rank, S = e->link->size;
    return (me == 0 || query_side_alloc(e, &r->qs_mine, e->r1 - e->r0, piece)) &&
           (me == S - 1 || query_side_alloc(e, &r->qs_in, piece, piece));
}

static void pass_end(eng *e, run_bufs *r, const sched_row *row, int kv_kept) {
    norm_block_free(e, &r->nb);
    lora_work_free(e, &r->lw);
    chunk_formed_free(e, &r->fm);
    if (!row->keep_all && !kv_kept) kv_acts_free(e, &r->kv[0]);
    if (!row->keep_all) chunk_acts_free(e, &r->ca[0]);
    kv_work_free(e, &r->kvw);
    chunk_grads_free(e, &r->cg);
    pend_work_free(e, &r->pd);
    query_side_free(e, &r->qs_mine), query_side_free(e, &r->qs_in);
}

/* Where layer l of sequence bi keeps its activations: its own slot when every activation is
 * kept, else the one slot the pass reuses. */
static size_t kept_slot(const sched_row *row, int l, int B, int bi) {
    return row->keep_all ? (size_t)l * B + bi : 0;
}

/* The run of layer l on sequence bi: its input and output in xs and ys, (B, R, C) slabs of this
 * rank's R = r1 − r0 rows (ys NULL in a backward), the hidden-state gradient g (B, R, C) or
 * NULL, and the kept buffers' slot k (l·B + bi when every activation is kept, else 0). The one
 * place a layer_run is built. */
static layer_run layer_at(eng *e, run_bufs *r, int l, int bi, size_t k, real *xs, real *ys,
                          real *g) {
    const size_t TC = (size_t)(e->r1 - e->r0) * e->C;
    const int W = sbp_layer_window(e->cfg, l);
    layer_run lr = {.w = &e->w[l],
                    .g = &e->g[l],
                    .x = xs + bi * TC,
                    .y = ys ? ys + bi * TC : NULL,
                    .dx = g ? g + bi * TC : NULL,
                    .kmask = e->mask + (size_t)bi * e->T,
                    .window = W,
                    .kvwin = r->kvwin && W > 0,
                    .relay_win = r->seqwin ? W : 0,
                    .kv = &r->kv[k],
                    .acts = &r->ca[k],
                    .fm = &r->fm,
                    .cg = &r->cg,
                    .kvw = &r->kvw,
                    .nb = &r->nb,
                    .lw = &r->lw,
                    .pd = r->pd.slab ? &r->pd : NULL,
                    .qs_mine = r->qs_mine.q ? &r->qs_mine : NULL,
                    .qs_in = r->qs_in.q ? &r->qs_in : NULL};
    return lr;
}

/* Layer l's input and output slabs in the driver's layer inputs: x_l, and x_{l+1} or the last
 * layer's output. */
static real *input_of(const run_bufs *r, int l, size_t BTC) {
    return r->xs + (size_t)l * BTC;
}
static real *output_of(const eng *e, const run_bufs *r, int l, size_t BTC) {
    return l + 1 < e->L ? r->xs + (size_t)(l + 1) * BTC : r->xL;
}

static void free_bufs(eng *e, run_bufs *r) {
    for (int i = 0; r->kv && r->ca && i < r->n_kept; i++)
        kv_acts_free(e, &r->kv[i]), chunk_acts_free(e, &r->ca[i]);
    free(r->kv), free(r->ca);
    norm_block_free(e, &r->nb);
    lora_work_free(e, &r->lw);
    chunk_formed_free(e, &r->fm);
    kv_work_free(e, &r->kvw);
    chunk_grads_free(e, &r->cg);
    pend_work_free(e, &r->pd);
    query_side_free(e, &r->qs_mine), query_side_free(e, &r->qs_in);
    efree(e, r->g), efree(e, r->xL), efree(e, r->xs);
}

/* Rows per chunk of the forward. A row that keeps every activation recomputes nothing from its
 * forward, so the forward need not run as one chunk of T: it runs in chunks of whole token
 * blocks near the user's chunk (block multiples change no bit, docs/numerics.md §10), and its
 * working set (the formed rows) is one such chunk's, not T rows. A T-row working set that lives
 * only in the forward is given back by the pool at the head, where the ledger peaks, and
 * displaced a kept tensor into the logits' pages in the next step: 1 GB re-faulted every step
 * of full BP at T = 8192. */
static int forward_rows(const eng *e, const sched_row *row, int chunk) {
    const int R = e->r1 - e->r0; /* this rank's rows: T in one process */
    if (row->chunked) return chunk;
    if (!row->keep_all || e->blk >= R) return R;
    const int c = chunk / e->blk * e->blk;
    return c < e->blk ? e->blk : c < R ? c : R;
}

/* The forward of one layer and sequence in chunks of fc rows: the K/V side of all T rows first,
 * or, bounded by the window, the rows each chunk needs as it comes. Sequence parallel: this
 * rank's rows [r0, r1), the earlier ranks' K and V received. */
static void layer_forward(eng *e, layer_run *lr, int fc) {
    const int T = e->r1;
    if (lr->kvwin)
        kv_window_begin(e, lr);
    else
        kv_forward(e, lr);
    for (int s = e->r0, end; s < T && !e->link_failed; s = end) {
        end = s + fc < T ? s + fc : T;
        if (lr->kvwin) kv_window_extend(e, lr, end, 0);
        chunk_forward(e, lr, s, end);
        if (lr->kvwin) kv_window_retire(e, lr, kv_window_next(e, lr->window, end), 0);
        relay_progress(e);
    }
}

/* The tensors of a layer's gradient that its K/V side's backward adds to (kv_backward_rows):
 * wk, bk, wv, bv, k_norm and their adapters, and with in_norm the input norm's, whose query path
 * the chunks add to as well. Their ranges, ascending in memory, into sp (at most 10). */
typedef struct {
    const char *p;
    size_t bytes;
} span;

static int kv_side(span *sp, const layer_p *g, const eng *e, int in_norm) {
    const size_t C = (size_t)e->C, KV = (size_t)e->KV, r = (size_t)e->lora_r, R = sizeof(real);
    const span all[] = {{(const char *)g->wk, KV * C * R},    {(const char *)g->bk, KV * R},
                        {(const char *)g->wv, KV * C * R},    {(const char *)g->bv, KV * R},
                        {(const char *)g->k_norm, e->HD * R}, {(const char *)g->ak.A, r * C * R},
                        {(const char *)g->ak.B, KV * r * R},  {(const char *)g->av.A, r * C * R},
                        {(const char *)g->av.B, KV * r * R},  {(const char *)g->in_norm, C * R}};
    int n = 0;
    for (int i = 0; i < 10; i++) {
        if (!all[i].p || (i == 9 && !in_norm)) continue;
        int j = n++; /* insertion by address */
        for (; j > 0 && sp[j - 1].p > all[i].p; j--) sp[j] = sp[j - 1];
        sp[j] = all[i];
    }
    return n;
}

/* The part of a layer's bucket (b: its one buffer, bucket_items) that round 1 (the chunks) or 2
 * (the K/V side) of its backward adds to, as relay items: round 2 the K/V side's tensors and the
 * input norm's, round 1 everything else and the input norm's. A part travels only in its round:
 * the chunks' tensors are complete on the last rank after round 1, which keeps them through
 * round 2 and hands them to rank 0 for the next sequence's; the K/V side's reach rank 0 for
 * round 2 from the last rank, which holds them from the sequence before (or from zero, as every
 * rank does). The whole buffer when a tensor lies outside it (it cannot: layer_views). */
static int bucket_part(relay_item *it, int n, const relay_item *b, int nb, const layer_run *lr,
                       const eng *e, int round) {
    span sp[10];
    const int ns = nb == 1 ? kv_side(sp, lr->g, e, round == 2) : 0;
    const char *lo = nb == 1 ? b->p : NULL, *hi = lo ? lo + b->bytes : NULL;
    int inside = nb == 1;
    for (int i = 0; i < ns && inside; i++)
        inside = sp[i].p >= lo && sp[i].p + sp[i].bytes <= hi &&
                 (i == 0 || sp[i].p >= sp[i - 1].p + sp[i - 1].bytes);
    if (!inside) {
        for (int i = 0; i < nb; i++) it[n++] = b[i];
        return n;
    }
    if (round == 2) { /* adjacent tensors (wk and bk, ...) as one message */
        for (int i = 0, m = 0; i < ns; i++, m = 1) {
            relay_item *prev = &it[n - 1];
            if (m && (const char *)prev->p + prev->bytes == sp[i].p)
                prev->bytes += sp[i].bytes;
            else
                it[n++] = (relay_item){(void *)sp[i].p, sp[i].bytes};
        }
        return n;
    }
    for (int i = 0; i <= ns; i++) { /* the gaps between the K/V side's tensors */
        const char *from = i ? sp[i - 1].p + sp[i - 1].bytes : lo, *to = i < ns ? sp[i].p : hi;
        if (to > from) it[n++] = (relay_item){(void *)from, (size_t)(to - from)};
    }
    return n;
}

/* The running state of a layer's backward beside its bucket (relay.c) in the hand-over to rank
 * `to` of round 2 (the K/V side): on a local layer the K/V path's chain of the input norm's
 * weight gradient, from rank 1 on (to = S: the next sequence's round 1, which starts from
 * nothing). dK and dV do not travel: a key's rank sums them (key_rank_pass). */
static int hop_items(relay_item *it, int n, const layer_run *lr, const eng *e, int to, int round) {
    const int S = e->link ? e->link->size : 1;
    if (round == 2 && to > 0 && to < S && lr->window && lr->kvw->dgin)
        it[n++] = (relay_item){lr->kvw->dgin, sizeof(real) * e->C};
    return n;
}

/* The hand-over of a layer's backward to rank `to` in round 1 or 2: the bucket's part and, in
 * round 2, a local layer's input-norm chain (hop_items). Past the last rank, round 1 goes on as
 * rank 0's round 2 and round 2 as rank 0's round 1 of the next sequence. */
static int hand_over(relay_item *it, const relay_item *b, int nb, const layer_run *lr, const eng *e,
                     int to, int round) {
    if (e->link && to == e->link->size) to = 0, round = round == 1 ? 2 : 0;
    if (round == 0) return bucket_part(it, 0, b, nb, lr, e, 1); /* the next sequence's */
    return hop_items(it, bucket_part(it, 0, b, nb, lr, e, round), lr, e, to, round);
}

/* Sequence parallel's dK, dV at the key's rank: the later ranks' queries that see this rank's
 * keys (their query sides, posted to it by relay_query_post), rank by rank ascending and in
 * pieces ascending, each summed into this rank's dK, dV: the links of one process's chains, in
 * its order (every later query after this rank's own). */
static void key_rank_pass(eng *e, layer_run *lr) {
    const int me = e->link->rank, S = e->link->size;
    for (int p = me + 1; p < S && !e->link_failed; p++) {
        const int end = seq_seen_end(e, lr->relay_win, me, p), P = lr->qs_in->piece;
        for (int a = e->bounds[p], b; a < end && !e->link_failed; a = b) {
            b = a + P < end ? a + P : end;
            if (relay_query_recv(e, lr->qs_in, p, a, b)) key_rank_backward(e, lr, a, b);
        }
    }
}

/* Where a layer's backward writes its gradient (ops/defer.c): its bucket (b, nb), the open
 * blocks' partial sums before their dK, dV (pend_work's layout, steps/sums.c) and a local
 * layer's K/V-path chain of the input norm. */
static int grad_regions(relay_item *reg, const relay_item *b, int nb, const layer_run *lr,
                        const eng *e) {
    int n = 0;
    for (int i = 0; i < nb && n < DEFER_REGIONS; i++) reg[n++] = b[i];
    if (lr->pd && n < DEFER_REGIONS)
        reg[n++] = (relay_item){lr->pd->slab, (size_t)((char *)lr->pd->dk - (char *)lr->pd->slab)};
    if (lr->kvw->dgin && n < DEFER_REGIONS)
        reg[n++] = (relay_item){lr->kvw->dgin, sizeof(real) * e->C};
    return n;
}

/* A part of a layer's backward with its gradient calls deferred (ops/defer.c) on a rank after
 * the first: `part` runs the dX path at once; then the rank takes the relay's state from the
 * rank before (in), adds its own links to it in order (the log replayed) and hands it on (out).
 * Without deferral the state is taken first and the part adds to it as it runs. */
typedef struct {
    const relay_item *b;
    int nb, round, first, last;
} relay_round;

static void round_in(eng *e, const layer_run *lr, const relay_round *rr) {
    relay_item it[16]; /* bucket_part: at most 11 items, hop_items 1 */
    const int me = e->link ? e->link->rank : 0;
    relay_in(e, rr->round == 1 && rr->first, it, hand_over(it, rr->b, rr->nb, lr, e, me, rr->round),
             rr->round == 1 ? "a layer's backward" : "a layer's K/V backward");
}

/* Round 1's hand-over is posted (this rank goes on to its key pass; flushed before round 2
 * writes the bucket), round 2's sent. */
static void round_out(eng *e, const layer_run *lr, const relay_round *rr) {
    relay_item it[16];
    const int me = e->link ? e->link->rank : 0;
    const int n = hand_over(it, rr->b, rr->nb, lr, e, me + 1, rr->round);
    if (rr->round == 1)
        relay_out_ahead(e, it, n, "a layer's backward");
    else
        relay_out(e, rr->last, it, n, "a layer's K/V backward");
}

/* The backward of one layer and sequence in chunks of c rows, ascending; with a kept forward
 * (full BP) nothing is recomputed. The K/V side is backpropagated once after the last chunk,
 * or, bounded by the window, key block by key block as their queries are done.
 * Sequence parallel (relay.c): this rank's chunks sum dK, dV of its own keys and keep their query
 * side, which goes to the earlier ranks; the later ranks' query sides complete those sums here
 * (key_rank_pass); then the K/V side of this rank's keys. The layer's bucket travels in two
 * rounds over the ranks: the chunks' tensors, then the K/V side's (and a local layer's
 * input-norm chain). A rank after the first runs each part's dX path first and its gradient
 * calls when the round reaches it (deferred), so that it need not wait for the rank before.
 * first, last: the sequence is the batch's first, last (the bucket's relay starts, ends).
 * late: the head's late links (head_late) on a rank after the first, else NULL. */
static void layer_backward(eng *e, layer_run *lr, int c, int recompute, int first, int last,
                           head_late *late) {
    const int r0 = e->r0, r1 = e->r1, tail = !seq_last(e);
    const int defer = seq_shared(e) && e->link->rank > 0 && e->seq_overlap;
    relay_item b[2], reg[DEFER_REGIONS];
    const int nb = bucket_items(e, (int)(lr->w - e->w), b), nreg = grad_regions(reg, b, nb, lr, e);
    relay_round rr = {.b = b, .nb = nb, .round = 1, .first = first, .last = last};
    struct defer_log *dl = NULL;
    if (lr->kvwin)
        kv_window_begin(e, lr);
    else if (recompute && !(lr->kv_kept && e->link->rank > 0))
        kv_forward(e, lr); /* K and V of all T tokens, once (kept from the forward: head_late) */
    if (defer && !defer_begin(e, &dl, reg, nreg)) return;
    kv_begin_backward(e, lr);
    if (!defer) round_in(e, lr, &rr);
    if (lr->qs_mine) relay_flush_sides(e); /* the query side posted last taken before rewritten */
    int qs_from = r0;                      /* the query side's first row not posted yet */
    for (int s = r0, end; s < r1 && !e->link_failed && !e->oom; s = end) { /* chunks ascending */
        end = s + c < r1 ? s + c : r1;
        if (lr->kvwin) kv_window_extend(e, lr, end, 1);
        if (recompute) chunk_forward(e, lr, s, end);
        chunk_backward(e, lr, s, end);
        if (lr->kvwin) kv_window_retire(e, lr, kv_window_next(e, lr->window, end), 1);
        /* its pieces that are complete, so that the earlier ranks' key passes start */
        if (lr->qs_mine && !e->link_failed && !e->oom)
            relay_query_post(e, lr->qs_mine, lr->relay_win, &qs_from, end);
        relay_progress(e);
    }
    /* the rest, after a chunk that ran out of memory: the earlier ranks' key passes wait on it
     * (this rank's step fails; its peers hear of it at the end of the layer, not at a timeout) */
    if (lr->qs_mine && !e->link_failed)
        relay_query_post(e, lr->qs_mine, lr->relay_win, &qs_from, r1);
    if (defer) {
        defer_pause(e, dl);
        /* the head's late links, where this rank would wait for the round of the rank before */
        if (late && head_late_step(e, late)) bucket_end(e, SBP_BUCKET_HEAD);
        round_in(e, lr, &rr);
        if (!e->link_failed && !e->oom) defer_replay(e, dl);
        defer_end(e, dl), dl = NULL;
    }
    round_out(e, lr, &rr);
    if (seq_shared(e) && !e->link_failed) key_rank_pass(e, lr);
    relay_flush_ahead(e); /* round 1's hand-over taken: round 2 writes the input norm's part */
    rr.round = 2;
    if (defer && !defer_begin(e, &dl, reg, nreg)) return;
    if (!defer) round_in(e, lr, &rr);
    if (!lr->kvwin && !e->link_failed) kv_backward(e, lr); /* the K/V side of this rank's keys */
    if (defer) {
        defer_pause(e, dl);
        round_in(e, lr, &rr);
        if (!e->link_failed && !e->oom) defer_replay(e, dl);
        defer_end(e, dl);
    }
    if (!tail) kv_end_backward(e, lr);
    round_out(e, lr, &rr);
}

/* The embedding's backward of every sequence: with a link, one relay round per sequence (the
 * bucket's sum in token order), a tied embedding's continuing the head's. */
static int embed_step(eng *e, run_bufs *r, const sbp_batch *b, const size_t RC) {
    const int B = b->B, T = e->T, R = e->r1 - e->r0;
    relay_item it[2];
    const int n = bucket_items(e, SBP_BUCKET_EMBED, it);
    if (e->fold && e->fold->tied && !relay_carry(e, it, n, "the tied embedding's gradient"))
        return 0;
    for (int bi = 0; bi < B && e->gemb; bi++) { /* no gradient for a frozen embedding */
        const size_t at = (size_t)bi * T + e->r0;
        if (!relay_in(e, bi == 0, it, n, "the embedding's backward")) return 0;
        embed_backward(e, r->g + bi * RC, e->ids + at, b->ids + at, R);
        if (!relay_out(e, bi == B - 1, it, n, "the embedding's backward")) return 0;
    }
    return 1;
}

int drive(eng *e, double *loss, const sbp_batch *b, const sched_row *row, int chunk,
          const head_opts *h) {
    /* this rank's R rows of each sequence (all T in one process): the layer inputs, the
     * hidden-state gradient and the kept activations hold those rows */
    const int B = b->B, L = e->L, T = e->T, R = e->r1 - e->r0, c = row->chunked ? chunk : R;
    const int fc = forward_rows(e, row, chunk);
    const size_t BTC = (size_t)B * R * e->C;
    const sbp_mem_cat kept = row->keep_all ? SBP_MEM_ACTIVATIONS : SBP_MEM_CHECKPOINTS;
    run_bufs r = {.n_kept = row->keep_all ? L * B : 1};
    head_late late;
    head_late_begin(e, &late, b, h);
    const int apart = late.on && late.rank > 0; /* the head's round in the layers' backward */
    r.kv_kept = apart && !row->keep_all;
    int ok = 0;
    r.kv = calloc((size_t)r.n_kept, sizeof *r.kv);
    r.ca = calloc((size_t)r.n_kept, sizeof *r.ca);
    r.xs = ealloc(e, kept, (size_t)L * BTC, "layer inputs");
    r.xL = ealloc(e, kept, BTC, "final hidden state");
    if (!r.kv || !r.ca) e->oom = 1;
    if (e->oom) goto out;
    kv_plan(e, &r, row, b, c);

    /* forward */
    for (int bi = 0; bi < B; bi++)
        embed_forward(e, r.xs + bi * (size_t)R * e->C, e->ids + (size_t)bi * T + e->r0, R);
    if (!pass_begin(e, &r, row, fc, 0)) goto out;
    for (int l = 0; l < L; l++)
        for (int bi = 0; bi < B; bi++) {
            layer_run lr = layer_at(e, &r, l, bi, kept_slot(row, l, B, bi), input_of(&r, l, BTC),
                                    output_of(e, &r, l, BTC), NULL);
            if (row->keep_all && (!kv_acts_alloc(e, lr.kv, T, SBP_MEM_ACTIVATIONS) ||
                                  !chunk_acts_alloc(e, lr.acts, R, SBP_MEM_ACTIVATIONS)))
                goto out;
            layer_forward(e, &lr, fc);
            if (e->link_failed) goto out;
        }
    if (!relay_flush_ahead(e)) goto out; /* the last K and V posted read before freed */
    pass_end(e, &r, row, r.kv_kept);

    /* the head: the loss and dH (with its round apart, the rest in a layer's backward) */
    r.g = ealloc(e, SBP_MEM_LAYER, BTC, "hidden-state gradient");
    if (e->oom) goto out;
    e->ops->zero(e, r.g, BTC); /* the head adds dH into it */
    if (apart)
        bucket_begin_apart(e, SBP_BUCKET_HEAD);
    else
        bucket_begin(e, SBP_BUCKET_HEAD);
    if (e->oom || !head_step(e, loss, r.g, r.xL, b, h, &late) ||
        (!apart && !bucket_end(e, SBP_BUCKET_HEAD)))
        goto out;
    if (!apart) efree(e, r.xL), r.xL = NULL;

    /* backward */
    if (!pass_begin(e, &r, row, c, 1)) goto out;
    for (int l = L - 1; l >= 0; l--) {
        bucket_begin(e, l);
        for (int bi = 0; bi < B; bi++) {
            layer_run lr =
                layer_at(e, &r, l, bi, kept_slot(row, l, B, bi), input_of(&r, l, BTC), NULL, r.g);
            lr.kv_kept = late.on && l == L - 1 && !row->keep_all; /* one sequence */
            late.last = l == 0;
            layer_backward(e, &lr, c, !row->keep_all, bi == 0, bi == B - 1, apart ? &late : NULL);
            /* out of memory: the head's round handed on all the same, so that the next rank is
             * not left waiting for it */
            if (apart && e->oom) late.last = 1, head_late_step(e, &late);
            if (row->keep_all) kv_acts_free(e, lr.kv), chunk_acts_free(e, lr.acts);
            if (e->link_failed) goto out;
        }
        /* the layer's gradient is complete: one fold or send per bucket; a rank out of memory
         * ends its step with the layer (what its peers wait on in it was posted) */
        if (!bucket_end(e, l) || e->oom) goto out;
    }
    if (apart) { /* what the head's late passes read, at a point that does not move with them */
        head_late_end(e, &late, 1);
        bucket_free_apart(e);
        efree(e, r.xL), r.xL = NULL;
    }
    if (!relay_flush(e)) goto out; /* the query side is read before it is freed */
    pass_end(e, &r, row, 0);
    bucket_begin(e, SBP_BUCKET_EMBED);
    ok = embed_step(e, &r, b, (size_t)R * e->C) && bucket_end(e, SBP_BUCKET_EMBED);
out:
    head_late_end(e, &late, 0);
    free_bufs(e, &r);
    return ok && !e->oom && !e->link_failed;
}

/* Forward only: only the current layer's input and output are kept (no checkpoints), plus the
 * working set of one layer and one chunk, by the same rule. */
int drive_logprobs(eng *e, double *logp, const sbp_batch *b, int chunk, const head_opts *h) {
    const int B = b->B, L = e->L, T = e->T;
    const size_t TC = (size_t)T * e->C, BTC = (size_t)B * TC;
    const sched_row *row = sched_row_of(SBP_STREAM);
    kv_acts kv = {0};
    chunk_acts ca = {0};
    run_bufs r = {.kv = &kv, .ca = &ca};
    kv_plan(e, &r, row, b, chunk);
    real *x = ealloc(e, SBP_MEM_LAYER, BTC, "layer input");
    real *y = ealloc(e, SBP_MEM_LAYER, BTC, "layer output");
    int ok = 0;
    if (e->oom) goto out;
    for (int bi = 0; bi < B; bi++) embed_forward(e, x + bi * TC, e->ids + (size_t)bi * T, T);
    if (!pass_begin(e, &r, row, chunk, 0)) goto out;
    for (int l = 0; l < L; l++) {
        for (int bi = 0; bi < B; bi++) {
            layer_run lr = layer_at(e, &r, l, bi, 0, x, y, NULL);
            layer_forward(e, &lr, chunk);
        }
        real *t = x;
        x = y, y = t;
    }
    pass_end(e, &r, row, 0);
    efree(e, y);
    y = NULL;
    ok = head_logprobs(e, logp, x, b, h);
out:
    pass_end(e, &r, row, 0);
    efree(e, x), efree(e, y);
    return ok && !e->oom;
}
