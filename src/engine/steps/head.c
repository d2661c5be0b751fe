/* head.c — final RMSNorm, LM head and the objective, in passes of rows, with the backward done
 * pass by pass so that only `rows`·V logits exist at a time (unless the logits are
 * materialised, as HF's baseline keeps them).
 *
 * For rows [s, e) of sequence b:
 *   hn     = rmsnorm(hL[s:e], w_final)
 *   logits = hn·W_headᵀ / τ                                  (τ: GRPO's temperature)
 *   logp_t = log softmax(logits_t)[labels[t+1]]              (targets shifted inside, as HF)
 *   loss  += the objective's terms, coef_t = dL/dlogp_t      (on the host: objective.c)
 * and back: dlogits = coef·(onehot − softmax)/τ, dhn = dlogits·W_head, dW_head += dlogitsᵀ·hn,
 * then the final-norm backward into dh. The per-row log-probs go down to the host and the
 * coefficients come back up: the only traffic between the objective and the backend. The loss
 * is summed term by term in ascending (sequence, token) order, the same in every schedule. */
#include "../engine.h"
#include "../fold.h"

#include <stdlib.h>
#include <string.h>

typedef struct head_work {
    real *logits;              /* (rows or T·B, V) */
    real *hn, *dhn, *rstd;     /* (rows, C), (rows, C), (rows) */
    double *logp, *lse, *coef; /* (rows) each */
    double *h_logp, *h_coef;   /* (rows) each, on the host */
    /* (V, C), (C): the open token block's partial sums of the head's and the final norm's
     * weight gradients (sums.c); NULL when nothing is carried */
    real *phead, *pfnorm;
    /* (rows, C), (rows, VOCAB_BLOCK): the head's dx of a vocabulary block and the block's
     * columns of dlogits (sum_vocab_dx); NULL in the fast numerics or V ≤ VOCAB_BLOCK */
    real *pdx, *pdy;
} head_work;

static void work_free(eng *e, head_work *w) {
    efree(e, w->logits), efree(e, w->hn), efree(e, w->dhn), efree(e, w->rstd);
    efree(e, w->logp), efree(e, w->lse), efree(e, w->coef);
    efree(e, w->phead), efree(e, w->pfnorm), efree(e, w->pdx), efree(e, w->pdy);
    free(w->h_logp), free(w->h_coef);
}

static int work_alloc(eng *e, head_work *w, const sbp_batch *b, const head_opts *o, int backward) {
    const size_t rows = (size_t)o->rows, V = (size_t)e->V;
    const size_t nz = o->materialise ? (size_t)b->B * (e->r1 - e->r0) * V : rows * V;
    *w = (head_work){0};
    w->logits = ealloc(e, SBP_MEM_LOGITS, nz, o->materialise ? "logits (B·T·V)" : "logits chunk");
    w->hn = ealloc(e, SBP_MEM_LOGITS, rows * e->C, "final-norm output");
    w->rstd = ealloc(e, SBP_MEM_LOGITS, rows, "final-norm rstd");
    w->lse = ealloc_bytes(e, SBP_MEM_LOGITS, sizeof(double) * rows, "per-row lse");
    if (backward) {
        w->dhn = ealloc(e, SBP_MEM_LOGITS, rows * e->C, "final-norm output gradient");
        w->logp = ealloc_bytes(e, SBP_MEM_LOGITS, sizeof(double) * rows, "per-row log-probs");
        w->coef = ealloc_bytes(e, SBP_MEM_LOGITS, sizeof(double) * rows, "per-row dL/dlogp");
        w->h_logp = malloc(sizeof(double) * rows);
        w->h_coef = malloc(sizeof(double) * rows);
        if (!w->h_logp || !w->h_coef) e->oom = 1;
        if (e->portable && e->T > SUM_BLOCK) { /* pend_work_alloc's rule */
            if (e->ghead)
                w->phead = ealloc(e, SBP_MEM_LOGITS, V * e->C, "head gradient's open token block");
            if (e->gfnorm)
                w->pfnorm =
                    ealloc(e, SBP_MEM_LOGITS, (size_t)e->C, "final norm's open token block");
        }
        if (e->portable && e->V > VOCAB_BLOCK) {
            w->pdx = ealloc(e, SBP_MEM_LOGITS, rows * e->C, "head dx of a vocabulary block");
            w->pdy = ealloc(e, SBP_MEM_LOGITS, rows * VOCAB_BLOCK, "dlogits of a vocabulary block");
        }
    }
    if (e->oom) work_free(e, w);
    return !e->oom;
}

/* Row s of sequence bi in a (B, R, width) buffer of this rank's rows (engine.h). */
static size_t at(const eng *e, int bi, int s, int width) {
    return ((size_t)bi * (e->r1 - e->r0) + (size_t)(s - e->r0)) * width;
}

/* The logits of rows [s, ...) of sequence bi. */
static real *logits_at(const eng *e, const head_work *w, const head_opts *o, int bi, int s) {
    return w->logits + (o->materialise ? at(e, bi, s, e->V) : 0);
}

/* hn, the (temperature-scaled) logits and the log-probs of rows [s, end) of sequence bi. */
static void head_forward(const eng *e, head_work *w, double *logp, real *z, const real *h_s, int bi,
                         int s, int end, double inv_tau) {
    const sbp_ops *op = e->ops;
    const int M = end - s;
    op->rmsnorm_forward(e, w->hn, w->rstd, h_s, e->fnorm, M, e->C);
    op->linear_forward(e, z, w->hn, e->head, NULL, s, end, e->V, e->C);
    if (inv_tau != 1) op->scale(e, z, (real)inv_tau, (size_t)M * e->V);
    op->logprob_forward(e, logp, w->lse, z, e->tgt + (size_t)bi * e->T + s, M);
}

/* The end of the pass of rows that starts at row s. */
static int pass_end_row(const eng *e, const head_opts *o, int s) {
    return s + o->rows < e->r1 ? s + o->rows : e->r1;
}

/* DPO's first pass: forward only over every row, each target's log-prob down to the host, and
 * the pair factors from them. */
static int first_pass(eng *e, double *loss, head_work *w, const real *hL, const sbp_batch *b,
                      const head_opts *o) {
    const size_t BT = (size_t)b->B * e->T;
    double *logp =
        ealloc_bytes(e, SBP_MEM_LOGITS, sizeof(double) * BT, "log-probs of every target");
    double *h_logp = malloc(sizeof(double) * BT);
    if (!logp || !h_logp) {
        e->oom = 1;
        efree(e, logp), free(h_logp);
        return 0;
    }
    for (int bi = 0; bi < b->B; bi++)
        for (int s = e->r0, end; s < e->r1; s = end) {
            end = pass_end_row(e, o, s);
            head_forward(e, w, logp + (size_t)bi * e->T + s, logits_at(e, w, o, bi, s),
                         hL + at(e, bi, s, e->C), bi, s, end, o->inv_tau);
        }
    e->ops->download(e, h_logp, logp, sizeof(double) * BT);
    /* sequence parallel: the other ranks' rows (exact copies) */
    const int got = relay_gather_rows(e, h_logp, b->B, e->T);
    if (got) sbp_obj_prepare(o->ev, loss, h_logp);
    efree(e, logp), free(h_logp);
    return got;
}

/* What head_rows forms of a pass: the path to dH, the weight gradients' chains, or both. */
enum { HEAD_DX = 1, HEAD_DW = 2, HEAD_ALL = HEAD_DX | HEAD_DW };

/* Rows [s, end) of sequence bi: the forward, the loss terms (added to *loss) and the parts of the
 * backward: dhn = dlogits·W_head and dH through the final norm (HEAD_DX), dW_head and the final
 * norm's weight gradient (HEAD_DW). kept: the pass's dhn rows where they outlive the pass (formed
 * by HEAD_DX, read by a later HEAD_DW of the same rows), else NULL. Either part alone runs the
 * same calls on the same values as both together: the products' dX and dW halves and the norm's
 * dx and dw loops are separate computations in every table (ops/defer.c relies on it too). */
static void head_rows(eng *e, head_work *w, const head_opts *o, double *loss, real *dh,
                      const real *hL, int bi, int s, int end, int parts, real *kept) {
    const sbp_ops *op = e->ops;
    const int T = e->T, C = e->C, V = e->V, M = end - s;
    const real *h_s = hL + at(e, bi, s, C);
    real *z = logits_at(e, w, o, bi, s), *dhn = kept ? kept : w->dhn;
    head_forward(e, w, w->logp, z, h_s, bi, s, end, o->inv_tau);
    op->download(e, w->h_logp, w->logp, sizeof(double) * M);
    sbp_obj_terms(o->ev, loss, w->h_coef, bi, s, M, w->h_logp);
    /* the gradient of the scaled logits, then through the scaling by 1/τ */
    for (int r = 0; r < M; r++) w->h_coef[r] *= o->inv_tau;
    op->upload(e, w->coef, w->h_coef, sizeof(double) * M);
    op->logprob_backward(e, z, w->coef, w->lse, e->tgt + (size_t)bi * T + s, M);
    const int dx = parts & HEAD_DX, dw = parts & HEAD_DW;
    if (dx) op->zero(e, dhn, (size_t)M * C);
    if (w->pdx) { /* dW_head over the tokens, then dx over the vocabulary, in blocks */
        if (dw && e->ghead)
            sum_linear_backward(e, NULL, e->ghead, w->phead, NULL, NULL, z, w->hn, e->head, s, end,
                                V, C);
        if (dx) sum_vocab_dx(e, dhn, w->pdx, w->pdy, z, e->head, s, end, V, C);
    } else if (dx || e->ghead) {
        sum_linear_backward(e, dx ? dhn : NULL, dw ? e->ghead : NULL, w->phead, NULL, NULL, z,
                            w->hn, e->head, s, end, V, C);
    }
    if (dx || e->gfnorm)
        sum_norm_backward(e, dx ? dh + at(e, bi, s, C) : NULL, dw ? e->gfnorm : NULL, w->pfnorm,
                          dhn, h_s, w->rstd, e->fnorm, s, M, 1, C);
    relay_progress(e);
}

void head_late_begin(const eng *e, head_late *late, const sbp_batch *b, const head_opts *o) {
    *late = (head_late){.on = seq_shared(e) && e->seq_overlap && b->B == 1 && !o->materialise,
                        .rank = e->link ? e->link->rank : 0,
                        .b = b,
                        .o = o};
}

/* The head's round as relay items: its bucket (bucket_items) and the loss. */
static int round_items(const eng *e, relay_item *it, double *loss) {
    const int nb = bucket_items(e, SBP_BUCKET_HEAD, it);
    it[nb] = (relay_item){loss, sizeof *loss};
    return nb + 1;
}

/* Rows [s, end) of sequence bi: the parts of head_rows (kept: rows [r0, r1)'s dhn), or with a
 * frozen head's log-probs kept (logp, rows from r0) only the loss terms, on the same values in
 * the same order as head_rows adds them. */
static void head_pass(eng *e, head_work *w, const head_opts *o, double *loss, real *dh,
                      const real *hL, int bi, int s, int end, int parts, real *kept,
                      const double *logp) {
    if (logp)
        sbp_obj_terms(o->ev, loss, w->h_coef, bi, s, end - s, logp + (s - e->r0));
    else
        head_rows(e, w, o, loss, dh, hL, bi, s, end, parts,
                  kept ? kept + (size_t)(s - e->r0) * e->C : NULL);
}

int head_step(eng *e, double *loss, real *dh, const real *hL, const sbp_batch *b,
              const head_opts *o, head_late *late) {
    head_work w;
    if (!work_alloc(e, &w, b, o, 1)) return 0;
    if (o->ev->needs_logps && !first_pass(e, loss, &w, hL, b, o)) {
        work_free(e, &w);
        return 0;
    }
    /* sequence parallel: a relay round per sequence carries the head's bucket and the loss on in
     * token order (relay.c). With --seq-overlap a rank after the first forms its rows' dH before
     * the round reaches it, keeping dhn, and its weight gradients' links once it has: the
     * logits formed twice, the dX product once, while the ranks before it run their rows; with
     * a late round (head_late) those links wait for head_late_step. */
    const int ahead = seq_shared(e) && e->link->rank > 0 && e->seq_overlap;
    const int later = late->on && late->rank > 0; /* this rank's links in head_late_step */
    const size_t R = (size_t)(e->r1 - e->r0);
    real *kept =
        ahead ? ealloc(e, SBP_MEM_LOGITS, R * e->C, "the head's dhn, formed before its relay")
              : NULL;
    /* a frozen head and final norm (LoRA): the round adds only the loss terms, from the rows'
     * log-probs kept here (on the host) instead of the logits formed again */
    double *logp = ahead && !e->ghead && !e->gfnorm ? malloc(sizeof(double) * R) : NULL;
    if (ahead && !e->ghead && !e->gfnorm && !logp) e->oom = 1;
    /* the loss the round brings, on the heap: a receive posted into it may outlive a failed run */
    if (later && !(late->loss_in = malloc(sizeof *late->loss_in))) e->oom = 1;
    relay_item it[4];
    const int n = round_items(e, it, later ? late->loss_in : loss);
    if (later && !e->oom && relay_head_post_in(e, it, n)) /* one sequence: its round, ahead */
        late->posted = e->posted[SBP_SEQ_HEAD];
    for (int bi = 0; bi < b->B && !e->oom && !e->link_failed; bi++) {
        for (int s = e->r0, end; ahead && s < e->r1; s = end) {
            end = pass_end_row(e, o, s);
            double terms = 0; /* added to the loss in the relay's round, in token order */
            head_rows(e, &w, o, &terms, dh, hL, bi, s, end, HEAD_DX,
                      kept + (size_t)(s - e->r0) * e->C);
            if (logp) memcpy(logp + (s - e->r0), w.h_logp, sizeof(double) * (size_t)(end - s));
        }
        if (later) break;
        if (!relay_in(e, bi == 0, it, n, "the head's backward")) break;
        for (int s = e->r0, end; s < e->r1; s = end) {
            end = pass_end_row(e, o, s);
            head_pass(e, &w, o, loss, dh, hL, bi, s, end, ahead ? HEAD_DW : HEAD_ALL, kept, logp);
        }
        if (!(late->on ? relay_head_out(e, it, n)
                       : relay_out(e, bi == b->B - 1, it, n, "the head's backward")))
            break;
    }
    if (later && !e->oom && !e->link_failed) { /* head_late_step's, freed by head_late_end */
        late->w = malloc(sizeof w);
        if (late->w) {
            *late->w = w;
            late->hL = hL, late->dh = dh, late->dhn = kept, late->logp = logp, late->loss = loss;
            return 1;
        }
        e->oom = 1;
    }
    free(logp);
    efree(e, kept);
    work_free(e, &w);
    return !e->link_failed && !e->oom;
}

int head_late_step(eng *e, head_late *late) {
    if (!late->w || late->done || e->link_failed) return 0; /* none, or done */
    /* the round not here yet: later (out of memory, now: this rank's step ends soon) */
    if (!late->last && !e->oom && !relay_head_ready(e)) return 0;
    if (!relay_head_in(e)) return 0;
    late->taken = late->done = 1;
    /* every pass at once (spread over the layers' waits they measured slower: the rank before
     * then waits on this one's next chunks) */
    *late->loss = *late->loss_in;
    for (int s = e->r0, end; s < e->r1 && !e->oom; s = end) {
        end = pass_end_row(e, late->o, s);
        head_pass(e, late->w, late->o, late->loss, late->dh, late->hL, 0, s, end, HEAD_DW,
                  late->dhn, late->logp);
    }
    relay_item it[4];
    const int n = round_items(e, it, late->loss_in);
    *late->loss_in = *late->loss;
    /* handed on after a failure too: the next rank waits for it, and hears of the failure when
     * this rank ends the job */
    return relay_head_out(e, it, n) && !e->oom;
}

void head_late_end(eng *e, head_late *late, int wait) {
    if (wait && late->posted && !late->taken) late->taken = relay_head_in(e);
    /* a receive still posted may write the loss yet: left to the job's end (seqpar.h) */
    if (!late->posted || late->taken) free(late->loss_in);
    if (late->w) work_free(e, late->w);
    free(late->w);
    efree(e, late->dhn), free(late->logp);
    late->w = NULL, late->dhn = NULL, late->logp = NULL, late->loss_in = NULL;
}

int head_logprobs(eng *e, double *logp, const real *hL, const sbp_batch *b, const head_opts *o) {
    head_work w;
    if (!work_alloc(e, &w, b, o, 0)) return 0;
    for (int bi = 0; bi < b->B; bi++)
        for (int s = 0, end; s < e->T; s = end) {
            end = s + o->rows < e->T ? s + o->rows : e->T;
            head_forward(e, &w, logp + (size_t)bi * e->T + s, w.logits,
                         hL + ((size_t)bi * e->T + s) * e->C, bi, s, end, o->inv_tau);
        }
    work_free(e, &w);
    return 1;
}
