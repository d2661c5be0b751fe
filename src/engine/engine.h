/* engine.h — the run context, the buffers of a layer, and the steps every schedule is built from
 * (internal; compiled once per precision).
 *
 * Three rooms:
 *   driver.c   the schedules as rows of one table (what the forward keeps, the chunk size) and
 *              the one driver that runs any row;
 *   steps/     the four layer steps and the head step, written against the op table;
 *   ops.h      the op table; ops/ holds the CPU and planning tables (cuda/ the CUDA ones).
 *
 * The four layer steps (steps/layer.c), for one layer l and one sequence:
 *   kv_forward      input RMSNorm, K and V of all T tokens (the part every chunk attends to);
 *   chunk_forward   queries, attention, o_proj, residual, post-norm and MLP of rows [s, e);
 *   chunk_backward  the backward of chunk_forward for rows [s, e): dX of the rows through the
 *                   residual and the query path, dK/dV of keys [0, e) accumulated;
 *   kv_backward     the backward of kv_forward for all T, adding the K/V path to dX. */
#ifndef SBP_ENGINE_H
#define SBP_ENGINE_H

#include "../core/objective.h"
#include "../dist/seqlink.h"
#include "../streambp.h"
#include "ops.h"

/* A LoRA adapter on a projection (streambp.h): A (r, in), B (out, r); NULL without one. */
typedef struct {
    real *A, *B;
} lora_ab;

/* The tensors of one layer: weights, or their gradients (same layout). NULL where the family has
 * no such tensor, and for the gradients of a frozen base model. Backend memory. */
typedef struct {
    real *wq, *bq;                      /* (Q, C), (Q) */
    real *wk, *bk;                      /* (KV, C), (KV) */
    real *wv, *bv;                      /* (KV, C), (KV) */
    real *wo;                           /* (C, Q) */
    real *q_norm, *k_norm;              /* (HD) each, Qwen3 */
    real *wg, *wu;                      /* (F, C) each */
    real *wd;                           /* (C, F) */
    real *in_norm;                      /* (C) */
    real *post_norm;                    /* (C) the MLP's input norm; Gemma-3: the attention
                                         * output's (its post_attention_layernorm) */
    real *pre_ff_norm, *post_ff_norm;   /* (C) each, Gemma-3: the MLP's input and output norms */
    lora_ab aq, ak, av, ao, ag, au, ad; /* adapters of q, k, v, o, gate, up, down */
} layer_p;

/* Everything a run needs that does not change while it runs. */
struct eng {
    const sbp_ops *ops;
    /* while a rank defers its gradient calls (ops/defer.c): ops is the deferring table, and this
     * its log */
    struct defer_log *defer;
    /* with a profile: ops is the timing table (ops/profile.c), which calls inner's operations
     * and adds their calls and time to prof */
    const sbp_ops *inner;
    sbp_profile *prof;
    /* with the planning table: the table the planned run would use (the workspace it sizes) */
    const sbp_ops *planned;
    double prof_start; /* when the run began (the timing table's begin) */
    const sbp_config *cfg;
    int C, Q, KV, F, V, NH, NKV, HD, L;
    int blk;        /* token block (the fast mode's products run per block) */
    int T;          /* tokens per sequence in this batch */
    int elem_bytes; /* bytes charged per real: sizeof(real), or the planner's storage size */
    int bf16;       /* round every stored tensor to bfloat16 (ops.h) */
    int portable;   /* the numerics the table implements (the planning table needs to know) */
    int unattended; /* sbp_unattended: attention rows that see no key */
    /* the softmax scale of every layer's scores (sbp_attn_dims.scale) */
    double attn_scale;
    int lora_r;  /* the adapters' rank; 0: no adapter */
    real lora_s; /* their scaling, alpha/r or alpha/√r */
    sbp_ledger *lg;
    void *backend; /* the backend's state of this run (CUDA: its allocations and errors) */
    int oom;       /* set when an allocation fails; oom_what names the buffer */
    char oom_what[64];
    real *ws;              /* workspace of the products and attention (ops->workspace) */
    const real *cos, *sin; /* (T, HD/2) RoPE tables (Gemma-3: of the global layers) */
    layer_p *w, *g;        /* (L) weight and gradient views */
    real *emb, *gemb;      /* (V, C) */
    real *head, *ghead;    /* (V, C): lm_head, or the embedding when tied */
    real *fnorm, *gfnorm;  /* (C) final norm */
    const int32_t *ids;    /* (B, T) input ids */
    const uint8_t *mask;   /* (B, T) attention mask */
    const int32_t *tgt;    /* (B, T) the target predicted at t: labels[b][t+1], or −1 */
    /* NULL: the gradient views point into the slab (added to); else into a bucket scratch,
     * folded or handed on per bucket (fold.h) */
    struct grad_fold *fold;

    /* Sequence parallel (docs/distributed.md §8, relay.c): this rank holds rows [r0, r1) of
     * every sequence, and every per-sequence row buffer (layer inputs, hidden-state gradient,
     * kept activations, materialised logits) holds those rows from r0 on; 0 and T with no link.
     * link_failed: a send or receive failed, the run stops (the link's provider has the
     * error). */
    const sbp_seq_link *link;
    int *bounds; /* (link->size + 1) rank q holds rows [bounds[q], bounds[q + 1]) */
    int r0, r1, link_failed;
    int posted[SBP_SEQ_KINDS]; /* a posted message of each kind (relay.c) not flushed yet */
    int seq_overlap;           /* defer a rank's gradient calls behind the relay (ops/defer.c) */

    /* Gemma-3 (gemma.c); gemma 0 and the rest unused in the other families */
    int gemma;                 /* sandwich norms, GeGLU, scaled embedding, two RoPE bases */
    const real *cos_l, *sin_l; /* (T, HD/2) the local (sliding) layers' RoPE tables */
    real emb_scale;            /* sqrt(C) in HF's dtype: the embedding's output is x·emb_scale */
    real *norm1p;              /* the norm weights as used, 1 + w (w: the model's), one slab */
};

/* The tensors of a parameter slab (views.c): slab holds the slab's elements from base on (0, or
 * a bucket's scratch holding [base, base + n)); NULL when the family has no such tensor or there
 * is no slab (a forward-only run has no gradients). */
real *slab_view(real *slab, int64_t base, const sbp_params *ps, sbp_param_kind kind, int layer);
void layer_views(layer_p *lp, real *slab, int64_t base, const sbp_params *ps, int l);
void adapter_views(layer_p *lp, real *slab, int64_t base, const sbp_params *ps, int l);

/* n reals (ealloc) or bytes charged to cat through the table, uninitialised; NULL when out of
 * memory (e->oom set). */
real *ealloc(eng *e, sbp_mem_cat cat, size_t n, const char *what);
void *ealloc_bytes(eng *e, sbp_mem_cat cat, size_t bytes, const char *what);
void efree(eng *e, void *p);

/* ---- the buffers of a layer (steps/buffers.c) ------------------------------------------------ */

/* K/V side of one layer for one sequence: all T rows. The input-norm output xn = rmsnorm(x) is
 * not kept: it is formed again a block of rows at a time wherever it is needed (the K/V
 * projections, each chunk's queries, the K/V weight gradients), so no T×C buffer but the layer
 * input and its gradient exists. */
typedef struct {
    real *kpre;  /* (T, KV) k before k_norm (Qwen3 only, else NULL) */
    real *krstd; /* (T, NKV) (Qwen3 only) */
    real *k;     /* (T, KV) after k_norm and RoPE */
    real *v;     /* (T, KV) */
    /* rows [lo, hi) are held, key j at row j − lo: 0 and T, except on a local layer of the
     * stream schedule (kv_window_*), whose buffers hold `rows` < T rows (kv_rows) */
    int lo, hi, rows;
} kv_acts;

/* What a chunk's backward reads of one layer, for `rows` consecutive rows of one sequence (all
 * T rows in full BP). The outputs of the two norms and of the SwiGLU product are not here: see
 * chunk_formed. */
typedef struct {
    int rows;    /* capacity */
    real *qpre;  /* (rows, Q) q before q_norm (Qwen3 only, else NULL) */
    real *qrstd; /* (rows, NH) (Qwen3 only) */
    real *q;     /* (rows, Q) after q_norm and RoPE */
    real *o;     /* (rows, Q) attention output */
    real *lse;   /* (rows, NH) */
    real *x2;    /* (rows, C) residual after attention */
    real *g, *u; /* (rows, F) gate and up projections */
    /* Gemma-3: the inputs of the two post-norms (kept: forming them again is a product) */
    real *ao, *aorstd; /* (rows, C), (rows) o·Woᵀ, before post_attention_layernorm */
    real *mo, *morstd; /* (rows, C), (rows) h·Wdᵀ, before post_feedforward_layernorm */
} chunk_acts;

/* The product inputs that are formed, never kept: xn = rmsnorm(x), xn2 = rmsnorm(x2) and
 * h = silu(g)·u, one after another in the same rows. The forward of a chunk forms each just before
 * its products read it; the backward forms each again from the kept x, x2, g and u (a norm or an
 * elementwise pass over the chunk, no product) just before its weight gradient reads it. The
 * bits are the same either time, so every schedule's gradients are unchanged; in full BP this
 * keeps 2C + F fewer reals per token and layer (a third of the bench model's activations). */
typedef struct {
    real *t;    /* (c, max(C, F)) xn, xn2 or h of the chunk's rows */
    real *rstd; /* (c) the rstd of the norm formed last */
} chunk_formed;

/* Gradients of one chunk's intermediate tensors; c = capacity in rows. */
typedef struct {
    real *dh, *dg, *du;     /* (c, F) */
    real *dxn2, *dx2, *dxn; /* (c, C) */
    real *dout, *dq;        /* (c, Q) */
    real *dqpre;            /* (c, Q) (Qwen3 only) */
    real *dsum;             /* (c, NH) */
    real *dao, *dmo;        /* (c, C) Gemma-3: of the post-norms' inputs */
} chunk_grads;

/* The gradient accumulators of the K/V side of one sequence. */
typedef struct {
    real *dk, *dv; /* (T, KV), rows as kv_acts; sequence parallel (R, KV), this rank's keys */
    real *dkpre;   /* (T, KV) (Qwen3 only), rows as dk's */
    real *dgin;    /* (C) Gemma-3: a local layer's K/V-path links of the input norm's weight
                    * gradient, one chain per column from zero, added to it once at the end of
                    * the layer's backward (docs/numerics.md §4) */
} kv_work;

/* Sequence parallel: the query side of a layer's backward for `rows` rows of one sequence, what
 * a key's rank reads to sum the dK, dV links of a later rank's queries itself (relay.c). */
typedef struct {
    int rows;
    int piece;        /* rows a message carries at most (seq_piece): both ends cut the same */
    real *q, *dout;   /* (rows, Q) the queries after RoPE, and dO */
    real *lse, *dsum; /* (rows, NH) the row's log-sum-exp and D = rowsum(dO ⊙ O) */
} query_side;

int query_side_alloc(eng *e, query_side *qs, int rows, int piece);
void query_side_free(eng *e, query_side *qs);

/* Scratch of the adapters' products for up to `rows` rows (allocated only with adapters). */
typedef struct {
    int rows;
    real *t, *dt; /* (rows, r) x·Aᵀ and its gradient */
    real *z, *dz; /* (rows, max(Q, KV, C, F)) t·Bᵀ and the scaled dy */
} lora_work;

int lora_work_alloc(eng *e, lora_work *lw, int rows);
void lora_work_free(eng *e, lora_work *lw);

/* One block of input-norm rows, formed again wherever the K/V side needs it. */
typedef struct {
    real *xn, *dxn; /* (blk, C) */
    real *rstd;     /* (blk) */
} norm_block;

/* rows: T, or kv_rows' bound of a windowed K/V side */
int kv_acts_alloc(eng *e, kv_acts *a, int rows, sbp_mem_cat cat);
void kv_acts_free(eng *e, kv_acts *a);
int chunk_acts_alloc(eng *e, chunk_acts *a, int rows, sbp_mem_cat cat);
void chunk_acts_free(eng *e, chunk_acts *a);
int chunk_formed_alloc(eng *e, chunk_formed *f, int c);
void chunk_formed_free(eng *e, chunk_formed *f);
int chunk_grads_alloc(eng *e, chunk_grads *d, int c);
void chunk_grads_free(eng *e, chunk_grads *d);
int kv_work_alloc(eng *e, kv_work *d, int rows);
void kv_work_free(eng *e, kv_work *d);
int norm_block_alloc(eng *e, norm_block *nb);
void norm_block_free(eng *e, norm_block *nb);

/* ---- the portable numerics' sums over tokens in blocks (steps/sums.c) ------------------------
 * A weight, bias or norm-weight gradient sums over the tokens of each sequence. In the portable
 * numerics the sum is cut at the token positions k·SUM_BLOCK (docs/numerics.md §4): the first
 * block's tokens continue the chain from the stored gradient, every later block is a chain of
 * its own from +0, added to the gradient once it is complete. SUM_BLOCK is a constant of the
 * numerics, never a setting: the portable bits may not depend on one. It is at least the token
 * count of every golden case (so they keep their bits) and a multiple of the attention's key
 * tile (ATTN_TILE). */
enum { SUM_BLOCK = 128 };

/* The LM head's dx = Σ_v dlogits(t, v)·W_head(v, :) sums over the vocabulary; in the portable
 * numerics it is cut at the vocabulary positions k·VOCAB_BLOCK (docs/numerics.md §4): the first
 * block continues the chain in dx, every later block is a chain of its own from +0, added once,
 * blocks ascending. A constant of the numerics like SUM_BLOCK, at least the vocabulary of every
 * golden case (they keep their bits). */
enum { VOCAB_BLOCK = 512 };

/* The partial sum of the block a call leaves open, per gradient of a layer, carried to the next
 * call of the same sequence; allocated only in the portable numerics when T > SUM_BLOCK (else
 * every token is in the first block and nothing is carried). */
typedef struct {
    layer_p p;     /* the layer's gradients' partial sums (NULL where the layer has no gradient) */
    real *dgin;    /* (C) kv_work's dgin's (a local layer's K/V-path chain of its own) */
    real *dk, *dv; /* (rows, KV) each, rows as kv_work's: dK, dV over a block of queries */
    real *slab;    /* the one allocation holding them */
} pend_work;

/* rows: the K/V side's (kv_work_alloc's) */
int pend_work_alloc(eng *e, pend_work *p, int rows);
void pend_work_free(eng *e, pend_work *p);

/* The op's linear_backward and rmsnorm_backward, with the weight (and bias) gradient summed in
 * token blocks through the pending partial sums pw, pb (NULL: every row is in the first block,
 * or no gradient; the op is called as it is). linear: rows [s, end) of a sequence, as the op.
 * norm: M rows of the tokens from t0 on, rpt rows per token (q_norm, k_norm: the heads). */
void sum_linear_backward(const eng *e, real *dx, real *dw, real *pw, real *db, real *pb,
                         const real *dy, const real *x, const real *w, int s, int end, int N,
                         int K);
void sum_norm_backward(const eng *e, real *dx, real *dw, real *pw, const real *dout, const real *x,
                       const real *rstd, const real *w, int t0, int M, int rpt, int C);
/* The op's attention_backward with dK and dV summed over the queries in the same token blocks
 * (pdk, pdv: pend_work's, NULL: the op as it is). The K/V side holds keys [lo, hi), key j at
 * row j − lo; d->s counts from lo as the op's. */
void sum_attention_backward(const eng *e, real *dq, real *dk, real *dv, real *pdk, real *pdv,
                            real *dsum, const real *dout, const real *o, const real *lse,
                            const real *q, const real *k, const real *v, const uint8_t *kmask,
                            const sbp_attn_dims *d, int lo, int hi);
/* Whether a block of queries is open after the queries before t are done (its pending dK, dV
 * hold a partial sum): t inside a block past the first. */
int sum_block_open(const eng *e, int t);
/* rows [0, n) of the pending dK, dV into dK, dV (a key retired before its block completes) */
void sum_fold_rows(const eng *e, real *g, const real *p, size_t n);
/* dx += dy·W (dy (M, N) rows [s, end), W (N, K), dx (M, K)) with the sum over N in blocks of
 * VOCAB_BLOCK: the first continues the chain in dx, every later one is summed from +0 into px
 * (M, K) over dy's columns copied into py (M, VOCAB_BLOCK) and added to dx once. px, py NULL:
 * the op as it is (N ≤ VOCAB_BLOCK, or the fast numerics). */
void sum_vocab_dx(const eng *e, real *dx, real *px, real *py, const real *dy, const real *w, int s,
                  int end, int N, int K);

/* ---- the layer steps (steps/layer.c) --------------------------------------------------------- */

/* One layer of one sequence, as the steps see it. */
typedef struct {
    const layer_p *w;     /* the layer's weights */
    layer_p *g;           /* their gradients */
    const real *x;        /* (T, C) the layer's input */
    real *y;              /* (T, C) its output; NULL when the forward is a recompute */
    real *dx;             /* (T, C) dY when the backward starts, dX when it ends (in place) */
    const uint8_t *kmask; /* (T) */
    int window;           /* the layer's sliding window (sbp_attn_dims.window), 0: global */
    int kvwin;            /* the K/V side is bounded by the window (kv_window_*) */
    int relay_win;        /* sequence parallel: K and V, and the query side, travel only where
                           * the window reaches (a local layer's window; 0: to every later or
                           * earlier rank, relay.c) */
    kv_acts *kv;          /* the K/V side */
    int kv_kept; /* sequence parallel, the top layer's backward under head_late: the later ranks
                  * kept its K/V side from the forward (rank 0 forms its rows again, sends none) */
    chunk_acts *acts; /* rows [0, T) when it holds T rows (full BP), else the current chunk */
    chunk_formed *fm; /* the current chunk's formed rows */
    chunk_grads *cg;  /* the chunk's gradients */
    kv_work *kvw;     /* dK, dV accumulators */
    norm_block *nb;
    lora_work *lw; /* the adapters' scratch (NULL without adapters) */
    pend_work *pd; /* the open token blocks' partial sums (NULL: none, pend_work) */
    /* sequence parallel, in the backward (else NULL): this rank's query side, rows from r0 (not
     * on rank 0), and a piece of a later rank's, received (not on the last) */
    query_side *qs_mine, *qs_in;
} layer_run;

/* K and V of this rank's rows, and (sequence parallel) the earlier ranks' rows received */
void kv_forward(eng *e, layer_run *lr);
void chunk_forward(const eng *e, layer_run *lr, int s, int end);
/* Rows [s, e): dx ← the residual path, then += the query path through the input norm; dY is
 * read before dX is written over it. kvw->dk, kvw->dv += keys [0, e) (sequence parallel: this
 * rank's keys only, the query side kept in lr->qs_mine for the earlier ranks' keys). */
void chunk_backward(const eng *e, layer_run *lr, int s, int end);
/* Sequence parallel: the dK, dV links of rows [a, b) of a later rank's queries (lr->qs_in, rows
 * from 0) into this rank's keys' accumulators, in one process's order. */
void key_rank_backward(const eng *e, layer_run *lr, int a, int b);
/* Zeroes the dK, dV accumulators (before a layer's first chunk_backward; a windowed K/V side
 * zeroes its rows as they arrive) and kvw->dgin. */
void kv_begin_backward(const eng *e, layer_run *lr);
/* dx += the K/V path through the input norm, for this rank's rows (all T in one process);
 * consumes kvw->dk, kvw->dv of those keys. */
void kv_backward(const eng *e, layer_run *lr);

/* The K/V side of a local layer (window W > 0) in the stream schedule, bounded by the window:
 * the buffers hold keys [lo, hi) only, lo a multiple of kv_grain. Before chunk [s, e):
 * kv_window_extend(e) computes rows [hi, e) (row-independent chains: the bits of kv_forward) and,
 * in the backward, zeroes their dK, dV. After it: kv_window_retire(next) runs the K/V backward
 * of keys [lo, next) in whole token blocks, ascending (their every query is done: key j is
 * complete once queries up to j + W − 1 are), when `backward`, and slides the rest down to row 0.
 * kv_window_next says where the next chunk's keys begin (T after the last chunk). The
 * backward's calls are those of kv_backward over the same blocks, so the bits are unchanged. */
int kv_grain(const eng *e);
/* rows a windowed K/V side holds with chunks of c rows (T when the window does not help) */
int kv_rows(const eng *e, int window, int c);
int kv_window_next(const eng *e, int window, int end);
void kv_window_begin(const eng *e, layer_run *lr);
void kv_window_extend(const eng *e, layer_run *lr, int end, int backward);
void kv_window_retire(const eng *e, layer_run *lr, int next, int backward);
/* End of a layer's backward for one sequence: w_in's gradient += kvw->dgin (local layers). */
void kv_end_backward(const eng *e, layer_run *lr);

/* ---- the embedding (steps/embed.c) and Gemma-3's run tables (gemma.c) ---------------------- */

/* x (T, C) = the embedding rows of ids (T, backend memory); Gemma-3: times emb_scale. */
void embed_forward(const eng *e, real *x, const int32_t *ids, int T);
/* e->gemb += the backward of embed_forward for dx (T, C), which it overwrites: rows at the pad
 * token (cfg->pad_token_id, host_ids: the same T ids on the host) are zeroed first, HF's
 * padding_idx. */
void embed_backward(const eng *e, real *dx, const int32_t *ids, const int32_t *host_ids, int T);
/* Gemma-3's norm weights as used (1 + w), local RoPE tables and embedding scale (e->gemma; the
 * weight views, e->fnorm and e->T set). 0 when out of memory (e->oom set). */
int gemma_begin(eng *e);
void gemma_end(eng *e);

/* ---- sequence parallel: the ranks of a sequence group (relay.c) ------------------------------
 * With a link, every sum whose chain crosses the ranks' rows keeps one process's order by handing
 * its running state on in token order (docs/distributed.md §8): a relay is a series of rounds,
 * each visiting ranks 0 … S − 1. Each returns 0 when the link failed (e->link_failed set). */
typedef struct {
    void *p;
    size_t bytes;
} relay_item;
/* Before this rank's part of a round: the items from the previous rank of the ring, except on
 * rank 0 when the relay starts here (fresh). */
int relay_in(eng *e, int fresh, const relay_item *it, int n, const char *what);
/* After it: the items to the next rank, except from the last rank when the relay ends here
 * (final). */
int relay_out(eng *e, int final, const relay_item *it, int n, const char *what);
/* relay_out's items, not final, posted to the next rank (flushed by relay_flush_ahead before
 * they are written again), so that this rank runs on: a layer's first round. */
int relay_out_ahead(eng *e, const relay_item *it, int n, const char *what);
/* The last rank's items to rank 0: a relay that goes on after others ran (a tied embedding's
 * gradient from the head to the lookup). */
int relay_carry(eng *e, const relay_item *it, int n, const char *what);
/* The head's hand-over received ahead (--seq-overlap with one sequence, head_late): on a rank
 * after the first, the receive of the items from the rank before posted (before the layers'
 * messages from it arrive, on a kind of its own); relay_head_in waits for it; relay_head_out
 * sends them on to the next rank (nothing from the last), which posted its receive. */
int relay_head_post_in(eng *e, const relay_item *it, int n);
int relay_head_in(eng *e);
int relay_head_out(eng *e, const relay_item *it, int n);
/* Without waiting: whether the head's round posted by relay_head_post_in is in (1 with nothing
 * to move). */
int relay_head_ready(const eng *e);
/* K and V (T, KV) of a layer: this rank's rows posted to every later rank (flushed by
 * relay_flush_ahead before they are written again), every earlier rank's rows received; on a
 * layer of window W > 0 only the rows from seq_need(e, W, p) on, the ones rank p's queries
 * read. */
int relay_kv(eng *e, real *k, real *v, int window);
/* The first key row the queries of rank p read on a layer of window W, or an earlier one: its
 * first row's window start, down to the ranks' grain (a multiple of kv_grain, where every
 * kernel's key tiles start); 0 on rank 0 or without a window. */
int seq_need(const eng *e, int window, int p);
/* dK, dV at the key's rank (docs/distributed.md §8): the rows of rank p's queries that see a key
 * of rank j on a layer of window W (0: every row of p > j), from bounds[p] to the returned end
 * (at most bounds[p]: none), an end rounded up to the ranks' grain so that every token block it
 * opens is complete. */
int seq_seen_end(const eng *e, int window, int j, int p);
/* The rows of a message of the query side: the chunk c rounded up to the ranks' grain, at most
 * rank 1's rows (the most a later rank holds). */
int seq_piece(const eng *e, int c);
/* This rank's query side (rows from r0) to every earlier rank whose keys its queries see, posted
 * in pieces of qs->piece rows from r0 as their rows are done: the pieces from row *from (on the
 * grid) that end by row `done` (every piece once done = r1), *from moved past them; flushed
 * before qs is written again (relay_flush_sides). */
int relay_query_post(eng *e, const query_side *qs, int window, int *from, int done);
/* Rows [a, b) of rank p's query side into qs's rows from 0 (b − a ≤ qs->piece, a on the piece
 * grid from bounds[p]). */
int relay_query_recv(eng *e, query_side *qs, int p, int a, int b);
/* a (B, T) array of doubles: every rank's rows gathered on every rank */
int relay_gather_rows(eng *e, double *a, int B, int T);
/* 1 when ranks share the sequence (a link of two or more ranks, a planning link too) */
int seq_shared(const eng *e);
/* 1 when this rank holds the sequence's last rows (or there is no link) */
int seq_last(const eng *e);
/* The run's posted messages completed (the end of a run). */
int relay_flush(eng *e);
/* The query sides posted (relay_query_post) taken, before their buffer is written again. */
int relay_flush_sides(eng *e);
/* The messages posted to later ranks (K and V, relay_out_ahead) taken, before their buffers are
 * written again. */
int relay_flush_ahead(eng *e);
/* Between two long computations: the link moves what the other ranks wait on from this one
 * (their sends of large messages are matched only while it is inside the transport). */
void relay_progress(const eng *e);
/* The rows a rank holds come in whole grains, so that no block, and no block's partial sum, is
 * split between ranks: SUM_BLOCK (the portable sums' blocks; the portable kernels' chains are
 * row by row and their key tiles divide it), and in the fast numerics also the token block (the
 * fast products' and attention tiles' grid): lcm(blk, SUM_BLOCK). */
int seq_grain(int portable, int blk);

/* ---- deferred gradient calls (ops/defer.c, sequence parallel) --------------------------------
 * defer_begin puts the deferring table in front of e->ops: calls writing into the regions (at
 * most DEFER_REGIONS: the layer's bucket, the open blocks' partial sums, a local layer's
 * K/V-path chain) keep their dX part and log the rest; defer_pause takes it away (the log
 * kept), defer_replay runs the log in order, defer_end frees it (and pauses). 0: out of memory
 * (e->oom set). */
enum { DEFER_REGIONS = 4 };
struct defer_log;
int defer_begin(eng *e, struct defer_log **log, const relay_item *region, int n);
void defer_pause(eng *e, struct defer_log *d);
void defer_replay(eng *e, struct defer_log *d);
void defer_end(eng *e, struct defer_log *d);

/* ---- the LM head and the objective (steps/head.c) -------------------------------------------- */

typedef struct {
    int rows;         /* rows per logits pass */
    int materialise;  /* one B·T·V logits buffer, as the HF baseline keeps */
    sbp_obj_eval *ev; /* the objective */
    double inv_tau;   /* 1 / temperature */
} head_opts;

/* The head's weight-gradient links off the critical path (sequence parallel, --seq-overlap,
 * one sequence, logits in passes of rows: head_late_begin decides, alike on every rank). A rank
 * after the first forms its rows' dH in head_step and posts the receive of the head's round
 * from the rank before; the rank before sends it there once its own links are in. The rank adds
 * its links in head_late_step, called in each layer's backward where the rank would wait for
 * the round of the rank before (driver.c): at the first such point where the head's round is
 * in (at the bottom layer it waits for it), then it hands the head's round on. Its bucket
 * meanwhile forms in a scratch of its own (bucket_begin_apart). What the passes need lives from
 * the head to the end of the backward, wherever they run, so that the ledger's account does not
 * depend on the timing. */
struct head_work;
typedef struct {
    int on;              /* the head's round goes late on this run (every rank of the group) */
    int rank;            /* this rank's place in the group (0: its round runs in head_step) */
    int last;            /* head_late_step's last chance: it waits for the round */
    int done;            /* head_late_step ran */
    int posted, taken;   /* the round's receive posted; taken (waited for) */
    struct head_work *w; /* the passes' buffers; NULL: nothing late on this rank */
    const real *hL;      /* (R, C) the final hidden state */
    real *dh;            /* (R, C) the hidden-state gradient (written in head_step) */
    real *dhn;           /* (R, C) the rows' dhn, formed in head_step */
    double *logp;        /* (R) a frozen head's log-probs (on the host), else NULL */
    double *loss_in;     /* (1) the loss as the rank before hands it on */
    double *loss;        /* the caller's loss */
    const sbp_batch *b;
    const head_opts *o;
} head_late;
void head_late_begin(const eng *e, head_late *late, const sbp_batch *b, const head_opts *o);
/* Final norm, logits in passes of rows, the objective, and the backward down to dH: for each
 * sequence b, dh[b] (T, C) is written, the head, final-norm (and tied embedding) gradients
 * accumulate, and the loss terms are added to *loss in ascending (sequence, token) order. DPO
 * first runs the forward alone over every row to learn each pair's factor (objective.h). With
 * late->on on a rank after the first, only dh is written, and the rest is head_late_step's. */
int head_step(eng *e, double *loss, real *dh /* (B, T, C) */, const real *hL /* (B, T, C) */,
              const sbp_batch *b, const head_opts *o, head_late *late);
/* The late links (a rank after the first; nothing elsewhere): once the round from the rank
 * before is in, the passes of dW_head and the final norm's (the logits formed again) and the
 * loss terms; 1 when they ran and the round was handed on (its bucket is complete here), else 0
 * (failures flag e). */
int head_late_step(eng *e, head_late *late);
/* What head_step kept for head_late_step freed, whatever failed; wait: the round's receive
 * waited for first if head_late_step did not take it (not after a failure: the rank before may
 * wait on this one, and the job ends). */
void head_late_end(eng *e, head_late *late, int wait);
/* Forward only: logp (B·T, backend memory) = the log-prob of every target, 0 elsewhere. */
int head_logprobs(eng *e, double *logp, const real *hL /* (B, T, C) */, const sbp_batch *b,
                  const head_opts *o);

/* ---- the schedules (driver.c) ---------------------------------------------------------------- */

/* What distinguishes the schedules, and nothing else (driver.c has the table). */
typedef struct {
    int keep_all;     /* the forward keeps every activation (else only the layer inputs) */
    int chunked;      /* the layer runs in chunks of the user's size (else one chunk of T) */
    int chunk_logits; /* the logits run in passes of rows (else B·T·V materialised) */
} sched_row;

const sched_row *sched_row_of(sbp_schedule s);

/* One step: forward, head (loss and dH), backward into the gradient views; chunk: rows per
 * layer chunk when the row is chunked. */
int drive(eng *e, double *loss, const sbp_batch *b, const sched_row *row, int chunk,
          const head_opts *h);
/* Forward only, streamed: logp (B·T, backend memory) as head_logprobs. */
int drive_logprobs(eng *e, double *logp, const sbp_batch *b, int chunk, const head_opts *h);

#endif
