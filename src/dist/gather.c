/* gather.c — a sharded slab to rank 0, one tensor at a time (docs/distributed.md §4).
 *
 * ZeRO-2 leaves every rank its own 4096-element blocks of the gradient and of AdamW's moments,
 * packed in ascending order (sbp_dist_owned). The files stay the one-process files, written by
 * rank 0: it gathers each tensor's elements from their owners into a buffer of the largest tensor
 * and writes it, so no rank ever holds a whole slab. Only copies move. */
#include "../core/err.h"
#include "../io/safetensors.h"
#include "dist.h"

#include <stdlib.h>
#include <string.h>

enum { TAG = 1 << 20 }; /* above every piece index of a step (its tags) */

void sbp_dist_shares_free(sbp_dist_shares *sh) {
    for (int j = 0; j < sh->N; j++)
        free(sh->rj ? sh->rj[j] : NULL), free(sh->pk ? sh->pk[j] : NULL);
    free(sh->rj), free(sh->nj), free(sh->pk);
    memset(sh, 0, sizeof *sh);
}

sbp_status sbp_dist_shares_of(sbp_dist_shares *sh, const sbp_params *ps, int N, sbp_err *err) {
    sh->N = N;
    sh->rj = calloc((size_t)N, sizeof *sh->rj);
    sh->nj = calloc((size_t)N, sizeof *sh->nj);
    sh->pk = calloc((size_t)N, sizeof *sh->pk);
    int ok = sh->rj && sh->nj && sh->pk;
    for (int j = 0; ok && j < N; j++) {
        int64_t owned;
        ok = (sh->nj[j] = sbp_dist_owned(&sh->rj[j], &owned, ps, N, j)) >= 0 &&
             (sh->pk[j] = malloc(sizeof *sh->pk[j] * (size_t)(sh->nj[j] + 1)));
        for (int k = 0; ok && k <= sh->nj[j]; k++)
            sh->pk[j][k] = k ? sh->pk[j][k - 1] + sh->rj[j][k - 1].end - sh->rj[j][k - 1].begin : 0;
    }
    if (ok) return SBP_OK;
    if (!sh->rj || !sh->nj || !sh->pk) sh->N = 0;
    sbp_dist_shares_free(sh);
    return sbp_fail(err, SBP_ENOMEM, "out of memory");
}

sbp_status sbp_dist_gather(sbp_comm *c, void *buf, const void *share, const sbp_dist_shares *sh,
                           int64_t lo, int64_t hi, int esz, const char *what, sbp_err *err) {
    const int r = sbp_comm_rank(c);
    for (int j = 0; j < sh->N; j++)
        for (int q = 0; q < sh->nj[j] && (r == 0 || j == r); q++) {
            const sbp_range *g = &sh->rj[j][q];
            const int64_t b = g->begin > lo ? g->begin : lo, e = g->end < hi ? g->end : hi;
            if (b >= e) continue;
            const size_t bytes = (size_t)(e - b) * esz;
            char *at = (char *)buf + (size_t)(b - lo) * esz;
            const char *src = (const char *)share + (size_t)(sh->pk[j][q] + b - g->begin) * esz;
            if (r == 0 && j == 0)
                memcpy(at, src, bytes);
            else if ((r == 0 ? sbp_comm_irecv(c, at, bytes, j, TAG, err)
                             : sbp_comm_isend(c, src, bytes, 0, TAG, err)) < 0)
                return err->status;
        }
    return sbp_comm_waitall(c, what, err);
}

sbp_status sbp_dist_save_grads(const char *path, sbp_comm *c, const sbp_params *ps,
                               sbp_precision prec, const void *share, const char *const *meta,
                               sbp_ledger *lg, sbp_err *err) {
    const int root = sbp_comm_rank(c) == 0;
    const int esz = prec == SBP_FP64 ? 8 : 4;
    int64_t most = 1;
    for (int i = 0; i < ps->n; i++) most = ps->p[i].numel > most ? ps->p[i].numel : most;
    sbp_st_entry *e = calloc((size_t)(ps->n ? ps->n : 1), sizeof *e);
    sbp_dist_shares sh = {0};
    sbp_status st = e ? sbp_dist_shares_of(&sh, ps, sbp_comm_size(c), err)
                      : sbp_fail(err, SBP_ENOMEM, "out of memory");
    char *buf = root && !st ? sbp_ledger_alloc_raw(lg, SBP_MEM_GRADS, (size_t)most * esz) : NULL;
    if (root && !st && !buf) st = sbp_fail(err, SBP_ENOMEM, "out of memory for a gradient tensor");
    for (int i = 0; !st && i < ps->n; i++)
        e[i] = (sbp_st_entry){.name = ps->p[i].name,
                              .dtype = prec == SBP_FP64 ? SBP_DT_F64 : SBP_DT_F32,
                              .ndim = ps->p[i].ndim,
                              .shape = {ps->p[i].shape[0], ps->p[i].shape[1]}};
    sbp_outfile o;
    int open = 0;
    sbp_status wst = SBP_OK; /* rank 0's write failure; the others' parts are still taken */
    sbp_err werr = {0};
    if (root && !st) wst = sbp_outfile_open(&o, path, &werr), open = !wst;
    if (root && !wst && !st) wst = sbp_st_write_header(&o, e, ps->n, meta, path, &werr);
    for (int i = 0; i < ps->n && !st; i++) {
        const sbp_param *p = &ps->p[i];
        st = sbp_dist_gather(c, buf, share, &sh, p->offset, p->offset + p->numel, esz,
                             "the gradient file", err);
        if (root && !st && !wst) wst = sbp_outfile_write(&o, buf, (size_t)p->numel * esz, &werr);
    }
    if (root && !st && !wst) wst = sbp_outfile_commit(&o, &werr), open = 0;
    if (open) sbp_outfile_abort(&o);
    if (!st && wst) *err = werr, st = wst;
    sbp_ledger_free(lg, buf);
    sbp_dist_shares_free(&sh);
    free(e);
    return st;
}
