/* seqlink.h — how the engine reaches the other ranks of its sequence group (sequence parallel,
 * docs/distributed.md §8): the one definition the engine (src/engine/relay.c), the step that
 * provides the link over the transport (src/api/seqpar.c) and the planner share. */
#ifndef SBP_SEQLINK_H
#define SBP_SEQLINK_H

#include <stddef.h>

/* S ranks share every sequence of a step; rank q holds rows [bounds[q], bounds[q + 1]) of it
 * (sbp_seq_slices, with the engine's grain). The sends and receives are exact copies; each
 * returns 0 when the transport failed (the provider keeps its error). send and recv return when
 * their buffer may be used again; post returns at once, its buffer untouched until flush returns.
 * The messages that go to an earlier rank are posted, so no two ranks wait on each other
 * (src/engine/relay.c): the last rank's hand-over to rank 0 (post) and the query sides (dK, dV at
 * the key's rank: post_side, received with recv_side, matched apart from the other messages, so
 * that rank 0 may take the last rank's query side before the hand-over the last rank posted to
 * it earlier). Some that go to a later rank are posted too, so that the sender runs on (K and V,
 * a layer's first hand-over: post_ahead, received with recv, in the order sent among send's).
 * One is received ahead of where it is used: the head's hand-over under --seq-overlap with one
 * sequence (send_head, its receive posted by post_recv_head before the layers' messages from
 * the same rank, and matched apart from them). flush(kind) waits for the posted messages of one
 * kind (0: post's, 1: post_side's, 2: post_ahead's, 3: post_recv_head's). Messages of one kind
 * between two ranks arrive in the order sent.
 * A planning link has no functions: nothing is sent, the buffers are charged as a run allocates
 * them. */
typedef struct sbp_seq_link {
    int rank, size;
    void *ctx;
    int (*send)(void *ctx, int to, const void *buf, size_t bytes, const char *what);
    int (*recv)(void *ctx, int from, void *buf, size_t bytes, const char *what);
    int (*post)(void *ctx, int to, const void *buf, size_t bytes, const char *what);
    int (*flush)(void *ctx, int kind); /* kind: one of sbp_seq_kind */
    int (*post_side)(void *ctx, int to, const void *buf, size_t bytes, const char *what);
    int (*recv_side)(void *ctx, int from, void *buf, size_t bytes, const char *what);
    int (*post_ahead)(void *ctx, int to, const void *buf, size_t bytes, const char *what);
    void (*progress)(void *ctx); /* the transport moves what others wait on, waiting for nothing */
    int (*send_head)(void *ctx, int to, const void *buf, size_t bytes, const char *what);
    int (*post_recv_head)(void *ctx, int from, void *buf, size_t bytes, const char *what);
    int (*done)(void *ctx, int kind); /* the posted messages of a kind are done (no waiting) */
} sbp_seq_link;

/* The kinds of posted messages, each flushed apart */
typedef enum {
    SBP_SEQ_HANDOVER,
    SBP_SEQ_SIDE,
    SBP_SEQ_AHEAD,
    SBP_SEQ_HEAD,
    SBP_SEQ_KINDS
} sbp_seq_kind;

/* The rows of T tokens cut for S ranks in whole grains (the token block and the portable sums'
 * block, so that no block and no sum is split between ranks): ceil(T / grain) grains, the first
 * ranks one more where they do not divide; the last grain may be short. bounds (S + 1). Returns
 * 0 when there are fewer grains than ranks. */
int sbp_seq_slices(int *bounds, int T, int S, int grain);

enum { SBP_SEQ_MAX = 256 }; /* ranks sharing a sequence, at most */

#endif
