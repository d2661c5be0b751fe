/* relay.c — the ranks of a sequence group as the driver sees them (sequence parallel,
 * docs/distributed.md §8; engine.h). Compiled once per precision.
 *
 * Rank q of S holds rows [bounds[q], bounds[q + 1]) of every sequence. A sum whose chain runs over
 * the tokens keeps one process's order by handing its running state on in token order: a relay
 * is a series of rounds, each visiting ranks 0, 1, …, S − 1, the state (its items) travelling
 * from each rank to the next and from the last rank to rank 0 between rounds. Both ends of a
 * hand-over list the same items (the sizes follow from the bounds); an empty item is no message.
 * The dK, dV chains of a key run over the later queries: the key's rank sums them itself, sent
 * the query side of every later rank's queries that see it (relay_query_*). With no link, or a
 * planning link (no functions: its buffers are charged, nothing moves), every call is a no-op.
 *
 * No deadlock. A rank waits in three ways: on a receive, on a send to a later rank (a relay's
 * hand-over but a layer's first, the head's, the embedding's) and on a flush of what it posted.
 * (The head's round under --seq-overlap with one sequence, head_late: a rank after the first
 * posts its receive before the layers, so the send to it waits only for the transport; the rank
 * takes it in a layer's backward after the chunks, once it is in, or at the bottom layer
 * waiting: the rank before sends it at such a point of its own or in its head, having waited
 * only on the ranks before it and the layers above.)
 * Everything that goes to an earlier rank is posted (the last rank's hand-over to rank 0, the
 * query sides), and so are K and V and a layer's first hand-over to a later rank. A receive
 * waits on an earlier rank (its K/V, its round's hand-over, sent once that rank's part of the
 * layer is done) or for a query side of the same layer, which its sender posted piece by piece
 * as its chunks were done, before it waits on anything of the layer's rounds but its first
 * hand-over from the rank before (which every rank posts before its own key pass); so a part of
 * a layer waits on later ranks only for what they post first, and on earlier ranks and the layer
 * above. A flush waits for a receive that waits on nothing this rank has still to do: K and V
 * are flushed before they are written again (the later rank took them when it began the layer,
 * having waited on this rank only for the layer above), a layer's first hand-over before its
 * second round writes the bucket (the next rank takes it before its chunks, or after them under
 * --seq-overlap; either waits only on this rank's K/V and first hand-over), the query
 * sides before the next layer's chunks (every earlier rank took them in this layer's key pass,
 * which waits only on the ranks after it), a hand-over to rank 0 before the next is posted
 * (rank 0 took it in the round before). A large message moves only while its receiver is inside
 * the transport: ranks call relay_progress between their long computations, so that a rank
 * sending to one that computes waits for one call, not for its layer. Two other messages go to
 * earlier ranks, neither inside a relay: DPO's log-probs, gathered while every rank is in the
 * gather, and the result's pieces from the last
 * rank, whose receives were posted before the step (src/api/seqpar.c). */
#include "engine.h"

int seq_grain(int portable, int blk) {
    if (portable) return SUM_BLOCK;
    int a = blk > 0 ? blk : 1, b = SUM_BLOCK;
    while (b) {
        const int t = a % b;
        a = b, b = t;
    }
    return (blk > 0 ? blk : 1) / a * SUM_BLOCK;
}

static int moving(const eng *e) {
    return e->link && e->link->size > 1 && e->link->send;
}

/* head: the head's hand-over received ahead (seqlink.h's send_head) */
static int items_send_kind(eng *e, int to, const relay_item *it, int n, int head,
                           const char *what) {
    const sbp_seq_link *k = e->link;
    for (int i = 0; i < n && !e->link_failed; i++)
        if (it[i].bytes && !(head ? k->send_head : k->send)(k->ctx, to, it[i].p, it[i].bytes, what))
            e->link_failed = 1;
    return !e->link_failed;
}

static int items_send(eng *e, int to, const relay_item *it, int n, const char *what) {
    return items_send_kind(e, to, it, n, 0, what);
}

/* kind: SBP_SEQ_SIDE (the query sides), SBP_SEQ_HEAD (posted: the head's hand-over received
 * ahead, flushed by relay_head_in) or −1 (the others) */
static int items_recv_kind(eng *e, int from, const relay_item *it, int n, int kind,
                           const char *what) {
    const sbp_seq_link *k = e->link;
    int (*recv)(void *, int, void *, size_t, const char *) = kind == SBP_SEQ_SIDE ? k->recv_side
                                                             : kind == SBP_SEQ_HEAD
                                                                 ? k->post_recv_head
                                                                 : k->recv;
    for (int i = 0; i < n && !e->link_failed; i++)
        if (it[i].bytes && !recv(k->ctx, from, it[i].p, it[i].bytes, what)) e->link_failed = 1;
    if (kind == SBP_SEQ_HEAD) e->posted[kind] = !e->link_failed;
    return !e->link_failed;
}

static int items_recv(eng *e, int from, const relay_item *it, int n, const char *what) {
    return items_recv_kind(e, from, it, n, -1, what);
}

int seq_shared(const eng *e) {
    return e->link && e->link->size > 1;
}

int seq_last(const eng *e) {
    return !e->link || e->link->rank == e->link->size - 1;
}

/* Items posted as messages of one kind (sbp_seq_kind; the comment above), flushed before they
 * are written again. */
static int items_post(eng *e, int to, const relay_item *it, int n, int kind, const char *what) {
    const sbp_seq_link *k = e->link;
    int (*post)(void *, int, const void *, size_t, const char *) =
        kind == SBP_SEQ_SIDE    ? k->post_side
        : kind == SBP_SEQ_AHEAD ? k->post_ahead
                                : k->post;
    for (int i = 0; i < n && !e->link_failed; i++)
        if (it[i].bytes && !post(k->ctx, to, it[i].p, it[i].bytes, what)) e->link_failed = 1;
    e->posted[kind] = !e->link_failed;
    return !e->link_failed;
}

static int items_wrap(eng *e, const relay_item *it, int n, const char *what) {
    return items_post(e, 0, it, n, SBP_SEQ_HANDOVER, what);
}

/* The posted messages of one kind taken. */
static int flush_kind(eng *e, int kind) {
    if (!moving(e) || !e->posted[kind]) return !e->link_failed;
    e->posted[kind] = 0;
    if (!e->link->flush(e->link->ctx, kind)) e->link_failed = 1;
    return !e->link_failed;
}

int relay_flush(eng *e) {
    return flush_kind(e, SBP_SEQ_HANDOVER) && flush_kind(e, SBP_SEQ_SIDE) &&
           flush_kind(e, SBP_SEQ_AHEAD) && flush_kind(e, SBP_SEQ_HEAD);
}

int relay_flush_sides(eng *e) {
    return flush_kind(e, SBP_SEQ_SIDE);
}

int relay_flush_ahead(eng *e) {
    return flush_kind(e, SBP_SEQ_AHEAD);
}

void relay_progress(const eng *e) {
    if (moving(e) && !e->link_failed) e->link->progress(e->link->ctx);
}

int relay_in(eng *e, int fresh, const relay_item *it, int n, const char *what) {
    if (!moving(e) || (fresh && e->link->rank == 0)) return !e->link_failed;
    const int S = e->link->size;
    return flush_kind(e, SBP_SEQ_HANDOVER) &&
           items_recv(e, (e->link->rank + S - 1) % S, it, n, what);
}

int relay_out(eng *e, int final, const relay_item *it, int n, const char *what) {
    if (!moving(e) || (final && seq_last(e))) return !e->link_failed;
    if (seq_last(e)) return flush_kind(e, SBP_SEQ_HANDOVER) && items_wrap(e, it, n, what);
    return items_send(e, e->link->rank + 1, it, n, what);
}

int relay_out_ahead(eng *e, const relay_item *it, int n, const char *what) {
    if (!moving(e)) return !e->link_failed;
    if (seq_last(e)) return flush_kind(e, SBP_SEQ_HANDOVER) && items_wrap(e, it, n, what);
    return items_post(e, e->link->rank + 1, it, n, SBP_SEQ_AHEAD, what);
}

int relay_head_post_in(eng *e, const relay_item *it, int n) {
    if (!moving(e) || e->link->rank == 0) return !e->link_failed;
    return items_recv_kind(e, e->link->rank - 1, it, n, SBP_SEQ_HEAD, "the head's backward");
}

int relay_head_in(eng *e) {
    return flush_kind(e, SBP_SEQ_HEAD);
}

int relay_head_ready(const eng *e) {
    if (!moving(e) || !e->posted[SBP_SEQ_HEAD] || e->link_failed) return 1;
    return e->link->done(e->link->ctx, SBP_SEQ_HEAD);
}

int relay_head_out(eng *e, const relay_item *it, int n) {
    if (!moving(e) || seq_last(e)) return !e->link_failed;
    return items_send_kind(e, e->link->rank + 1, it, n, 1, "the head's backward");
}

int relay_carry(eng *e, const relay_item *it, int n, const char *what) {
    if (!moving(e)) return !e->link_failed;
    const int last = e->link->size - 1;
    if (e->link->rank == last) return flush_kind(e, 0) && items_wrap(e, it, n, what);
    return e->link->rank == 0 ? items_recv(e, last, it, n, what) : !e->link_failed;
}

/* Rank q's rows of a (T, width) array of elements of esz bytes. */
static relay_item rows_of(const eng *e, void *a, int q, size_t width, size_t esz) {
    const int *bd = e->bounds;
    return (relay_item){(char *)a + (size_t)bd[q] * width * esz,
                        (size_t)(bd[q + 1] - bd[q]) * width * esz};
}

int seq_need(const eng *e, int window, int p) {
    if (p == 0 || window <= 0) return 0;
    const int j = e->bounds[p] - window + 1, g = seq_grain(e->portable, e->blk);
    return j <= 0 ? 0 : j / g * g;
}

/* Rank q's rows of a (T, width) array that rank p reads on a layer of window W: from
 * seq_need(e, W, p) on (all of them without a window). */
static relay_item rows_for(const eng *e, void *a, int q, int p, int W, size_t width, size_t esz) {
    relay_item it = rows_of(e, a, q, width, esz);
    const int need = seq_need(e, W, p), lo = e->bounds[q], hi = e->bounds[q + 1];
    const int from = need > hi ? hi : need > lo ? need : lo;
    it.p = (char *)it.p + (size_t)(from - lo) * width * esz;
    it.bytes = (size_t)(hi - from) * width * esz;
    return it;
}

int relay_kv(eng *e, real *k, real *v, int window) {
    if (!moving(e)) return !e->link_failed;
    const int me = e->link->rank, S = e->link->size;
    const size_t KV = (size_t)e->KV;
    /* in rank order, so that every wait is on a rank that is not waiting on this one */
    for (int q = 0; q < me; q++) {
        const relay_item it[2] = {rows_for(e, k, q, me, window, KV, sizeof(real)),
                                  rows_for(e, v, q, me, window, KV, sizeof(real))};
        if (!items_recv(e, q, it, 2, "keys and values")) return 0;
    }
    for (int q = me + 1; q < S; q++) {
        const relay_item mine[2] = {rows_for(e, k, me, q, window, KV, sizeof(real)),
                                    rows_for(e, v, me, q, window, KV, sizeof(real))};
        if (!items_post(e, q, mine, 2, SBP_SEQ_AHEAD, "keys and values")) return 0;
    }
    return 1;
}

int seq_seen_end(const eng *e, int window, int j, int p) {
    const int *bd = e->bounds;
    if (!window) return bd[p + 1];
    /* key bounds[j + 1] − 1 is seen by the queries before it + W, here up to the grain */
    const int g = seq_grain(e->portable, e->blk);
    const int64_t end = ((int64_t)bd[j + 1] - 1 + window + g - 1) / g * g;
    return end < bd[p + 1] ? (int)end : bd[p + 1];
}

int seq_piece(const eng *e, int c) {
    const int g = seq_grain(e->portable, e->blk), most = e->bounds[2] - e->bounds[1];
    const int64_t p = ((int64_t)c + g - 1) / g * g;
    return p < most ? (int)p : most;
}

/* Rows [a, b) of a query side whose row 0 is token r: its four items. */
static int query_items(relay_item *it, const eng *e, const query_side *qs, int r, int a, int b) {
    const size_t at = (size_t)(a - r), n = (size_t)(b - a), R = sizeof(real);
    const size_t Q = (size_t)e->Q, NH = (size_t)e->NH;
    it[0] = (relay_item){qs->q + at * Q, n * Q * R};
    it[1] = (relay_item){qs->dout + at * Q, n * Q * R};
    it[2] = (relay_item){qs->lse + at * NH, n * NH * R};
    it[3] = (relay_item){qs->dsum + at * NH, n * NH * R};
    return 4;
}

int relay_query_post(eng *e, const query_side *qs, int window, int *from, int done) {
    if (!moving(e)) return !e->link_failed;
    const int me = e->link->rank, P = qs->piece;
    int a = *from;
    for (int b; a < e->r1; a = b) { /* the pieces on the grid from r0 whose rows are all done */
        b = a + P < e->r1 ? a + P : e->r1;
        if (b > done) break;
        for (int j = me - 1; j >= 0; j--) { /* the nearest first: it reads this rank's first */
            const int end = seq_seen_end(e, window, j, me);
            if (a >= end) continue;
            relay_item it[4];
            const int n = query_items(it, e, qs, e->r0, a, b < end ? b : end);
            if (!items_post(e, j, it, n, SBP_SEQ_SIDE, "a query side")) return 0;
        }
    }
    *from = a;
    return 1;
}

int relay_query_recv(eng *e, query_side *qs, int p, int a, int b) {
    if (!moving(e)) return !e->link_failed;
    relay_item it[4];
    return items_recv_kind(e, p, it, query_items(it, e, qs, a, a, b), SBP_SEQ_SIDE, "a query side");
}

int relay_gather_rows(eng *e, double *a, int B, int T) {
    if (!moving(e)) return !e->link_failed;
    const int me = e->link->rank, S = e->link->size;
    for (int bi = 0; bi < B; bi++)
        for (int q = 0; q < S; q++) { /* rank q's rows to every other rank, q ascending */
            const relay_item it = rows_of(e, a + (size_t)bi * T, q, 1, sizeof(double));
            for (int to = 0; to < S && q == me; to++)
                if (to != me && !items_send(e, to, &it, 1, "log-probs")) return 0;
            if (q != me && !items_recv(e, q, &it, 1, "log-probs")) return 0;
        }
    return 1;
}
