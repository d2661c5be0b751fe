/* grads.c — writing a gradient file (safetensors, HF names, the parameter table's order): from a
 * whole gradient (sbp_grads_save), or piece by piece while the step runs (sbp_grads_out). */
#include "../core/err.h"
#include "../streambp.h"
#include "file.h"
#include "safetensors.h"

#include <stdlib.h>
#include <string.h>

/* The file's entries: every tensor of ps, F32 or F64, data from grads (NULL: none yet). */
static sbp_st_entry *entries(const sbp_params *ps, sbp_precision prec, const void *grads) {
    sbp_st_entry *e = calloc((size_t)(ps->n ? ps->n : 1), sizeof *e);
    const size_t esz = prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    for (int i = 0; e && i < ps->n; i++) {
        const sbp_param *p = &ps->p[i];
        e[i] = (sbp_st_entry){.name = p->name,
                              .dtype = prec == SBP_FP64 ? SBP_DT_F64 : SBP_DT_F32,
                              .ndim = p->ndim,
                              .shape = {p->shape[0], p->shape[1]},
                              .data = grads ? (const char *)grads + esz * (size_t)p->offset : NULL};
    }
    return e;
}

sbp_status sbp_grads_save(const char *path, const sbp_params *ps, sbp_precision prec,
                          const void *grads, const char *const *meta, sbp_err *err) {
    sbp_st_entry *e = entries(ps, prec, grads);
    if (!e) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    sbp_status st = sbp_st_write(path, e, ps->n, meta, err);
    free(e);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Piece by piece. The file's data region is the slab itself (the table's tensors in order, each
 * at its slab offset: checked at open), so a piece [off, off + n) of the slab is one write at
 * data + off·esz, in whatever order the backward completes the pieces. The header, and so where
 * the data starts, is fixed before the first piece (sbp_grads_out_begin) and written at the
 * commit: the file's bytes are sbp_grads_save's. */

struct sbp_grads_out {
    sbp_outfile o;
    sbp_st_entry *e;
    int n;
    size_t esz;
    char *header;          /* the header's text, once begun (NULL before) */
    size_t padded;         /* its padded length: the data start at 8 + padded */
    int64_t total, filled; /* elements of the slab; elements written so far */
    sbp_status failed;     /* the first failure (SBP_OK: none), its message in err */
    sbp_err err;
};

sbp_status sbp_grads_out_open(sbp_grads_out **out, const char *path, const sbp_params *ps,
                              sbp_precision prec, sbp_err *err) {
    *out = NULL;
    int64_t at = 0;
    for (int i = 0; i < ps->n; at += ps->p[i].numel, i++)
        if (ps->p[i].offset != at) /* every table is laid out so; a gap would be a bug */
            return sbp_fail(err, SBP_EUSAGE, "%s: the tensor \"%s\" is not where the file puts it",
                            path, ps->p[i].name);
    sbp_grads_out *w = calloc(1, sizeof *w);
    if (!w || !(w->e = entries(ps, prec, NULL))) {
        free(w);
        return sbp_fail(err, SBP_ENOMEM, "out of memory");
    }
    w->n = ps->n, w->total = at;
    w->esz = prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    sbp_status st = sbp_outfile_open(&w->o, path, err);
    if (st) {
        free(w->e), free(w);
        return st;
    }
    *out = w;
    return SBP_OK;
}

sbp_status sbp_grads_out_begin(sbp_grads_out *w, const char *const *meta, sbp_err *err) {
    if (!w->failed && w->header)
        w->failed = sbp_fail(&w->err, SBP_EUSAGE, "%s: the header was fixed already", w->o.path);
    else if (!w->failed && !(w->header = sbp_st_header(&w->padded, w->e, w->n, meta)))
        w->failed = sbp_fail(&w->err, SBP_ENOMEM, "%s: cannot format the header", w->o.path);
    if (w->failed && err) *err = w->err;
    return w->failed;
}

int sbp_grads_out_put(void *ctx, int64_t off, int64_t n, const void *g) {
    sbp_grads_out *w = ctx;
    if (w->failed) return 0;
    if (!w->header)
        w->failed = sbp_fail(&w->err, SBP_EUSAGE,
                             "%s: a gradient piece before the header was fixed", w->o.path);
    else if (off < 0 || n < 0 || off > w->total - n)
        w->failed = sbp_fail(&w->err, SBP_EUSAGE,
                             "%s: a gradient piece [%lld, %lld) outside its %lld elements",
                             w->o.path, (long long)off, (long long)(off + n), (long long)w->total);
    else
        w->failed = sbp_outfile_pwrite(&w->o, 8 + w->padded + (uint64_t)off * w->esz, g,
                                       (size_t)n * w->esz, &w->err);
    if (!w->failed) w->filled += n;
    return !w->failed;
}

sbp_status sbp_grads_out_error(const sbp_grads_out *w, sbp_err *err) {
    if (w && w->failed && err) *err = w->err;
    return w ? w->failed : SBP_OK;
}

static void out_free(sbp_grads_out *w) {
    free(w->header);
    free(w->e);
    free(w);
}

sbp_status sbp_grads_out_commit(sbp_grads_out *w, const char *const *meta, sbp_err *err) {
    sbp_status st = w->failed;
    size_t padded = 0;
    char *text = NULL;
    if (st)
        *err = w->err; /* a failed write removed the file */
    else if (!w->header && w->total > 0)
        st = sbp_fail(err, SBP_EUSAGE, "%s: no gradient piece was written", w->o.path);
    else if (!w->header && !(w->header = sbp_st_header(&w->padded, w->e, w->n, meta)))
        st = sbp_fail(err, SBP_ENOMEM, "%s: cannot format the header", w->o.path);
    else if (w->filled != w->total)
        st = sbp_fail(err, SBP_EUSAGE, "%s: %lld of the gradient's %lld elements were written",
                      w->o.path, (long long)w->filled, (long long)w->total);
    else if (!(text = sbp_st_header(&padded, w->e, w->n, meta)))
        st = sbp_fail(err, SBP_ENOMEM, "%s: cannot format the header", w->o.path);
    else if (strcmp(text, w->header) != 0) /* the data start where the first header put them */
        st = sbp_fail(err, SBP_EUSAGE, "%s: the metadata changed after the header was fixed",
                      w->o.path);
    if (!st) { /* the length, the text and its padding, as sbp_st_write_header writes them */
        const size_t len = strlen(w->header);
        unsigned char *h = malloc(8 + w->padded);
        if (!h) st = sbp_fail(err, SBP_ENOMEM, "out of memory");
        for (int i = 0; h && i < 8; i++) h[i] = (unsigned char)((uint64_t)w->padded >> (8 * i));
        if (h) memcpy(h + 8, w->header, len), memset(h + 8 + len, ' ', w->padded - len);
        if (h) st = sbp_outfile_pwrite(&w->o, 0, h, 8 + w->padded, err);
        free(h);
    }
    free(text);
    if (!st)
        st = sbp_outfile_commit(&w->o, err);
    else if (w->o.f)
        sbp_outfile_abort(&w->o);
    out_free(w);
    return st;
}

void sbp_grads_out_abort(sbp_grads_out *w) {
    if (!w) return;
    if (w->o.f) sbp_outfile_abort(&w->o);
    out_free(w);
}
