/* grads.c — writing a gradient file (safetensors, HF names, the parameter table's order). */
#include "../core/err.h"
#include "../streambp.h"
#include "safetensors.h"

#include <stdlib.h>

sbp_status sbp_grads_save(const char *path, const sbp_params *ps, sbp_precision prec,
                          const void *grads, const char *const *meta, sbp_err *err) {
    sbp_st_entry *e = calloc((size_t)ps->n, sizeof *e);
    if (!e) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    size_t esz = prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    for (int i = 0; i < ps->n; i++) {
        const sbp_param *p = &ps->p[i];
        e[i] = (sbp_st_entry){.name = p->name,
                              .dtype = prec == SBP_FP64 ? SBP_DT_F64 : SBP_DT_F32,
                              .ndim = p->ndim,
                              .shape = {p->shape[0], p->shape[1]},
                              .data = (const char *)grads + esz * (size_t)p->offset};
    }
    sbp_status st = sbp_st_write(path, e, ps->n, meta, err);
    free(e);
    return st;
}
