/* micro.c — a batch cut into micro-batches of different T (see micro.h). */
#include "micro.h"
#include "../src/core/err.h"

#include <stdlib.h>
#include <string.h>

/* Copies `rows` rows listed in which[] of b into m with T columns; per-row and per-token arrays
 * follow their rows. */
static sbp_status take_rows(sbp_batch *m, const sbp_batch *b, const int *which, int rows, int T,
                            sbp_err *err) {
    memset(m, 0, sizeof *m);
    const size_t n = (size_t)rows * T;
    m->B = rows, m->T = T, m->kind = b->kind;
    m->ids = malloc(sizeof *m->ids * n);
    m->labels = malloc(sizeof *m->labels * n);
    m->mask = malloc(n);
    int ok = m->ids && m->labels && m->mask;
    if (ok && b->advantages) ok = (m->advantages = malloc(sizeof(double) * rows)) != NULL;
    if (ok && b->ref_seq_logps) ok = (m->ref_seq_logps = malloc(sizeof(double) * rows)) != NULL;
    if (ok && b->old_logps) ok = (m->old_logps = malloc(sizeof(double) * n)) != NULL;
    if (ok && b->ref_logps) ok = (m->ref_logps = malloc(sizeof(double) * n)) != NULL;
    if (!ok) {
        sbp_batch_free(m);
        return sbp_fail(err, SBP_ENOMEM, "out of memory splitting the batch");
    }
    for (int r = 0; r < rows; r++) {
        const size_t from = (size_t)which[r] * b->T, to = (size_t)r * T;
        memcpy(m->ids + to, b->ids + from, sizeof *m->ids * T);
        memcpy(m->labels + to, b->labels + from, sizeof *m->labels * T);
        memcpy(m->mask + to, b->mask + from, T);
        if (m->old_logps) memcpy(m->old_logps + to, b->old_logps + from, sizeof(double) * T);
        if (m->ref_logps) memcpy(m->ref_logps + to, b->ref_logps + from, sizeof(double) * T);
        if (m->advantages) m->advantages[r] = b->advantages[which[r]];
        if (m->ref_seq_logps) m->ref_seq_logps[r] = b->ref_seq_logps[which[r]];
    }
    sbp_batch_count_targets(m);
    return SBP_OK;
}

/* 1 + the last position holding a target label among the rows (at least 1). */
static int cut_after_targets(const sbp_batch *b, const int *which, int rows) {
    int T = 1;
    for (int r = 0; r < rows; r++)
        for (int t = b->T - 1; t >= T; t--)
            if (b->labels[(size_t)which[r] * b->T + t] != SBP_IGNORE) {
                T = t + 1;
                break;
            }
    return T;
}

sbp_status sbp_verify_split(sbp_batch *mb, int *n, const sbp_batch *b, sbp_err *err) {
    const int dpo = b->kind == SBP_OBJ_DPO;
    const int units = dpo ? b->pairs : b->B; /* what a micro-batch takes whole */
    *n = 0;
    if (units < 2) return SBP_OK;
    int parts = units < SBP_VERIFY_MAX_MICRO ? units : SBP_VERIFY_MAX_MICRO;
    int *which = malloc(sizeof *which * (size_t)b->B);
    if (!which) return sbp_fail(err, SBP_ENOMEM, "out of memory splitting the batch");
    sbp_status st = SBP_OK;
    for (int k = 0, u0 = 0; k < parts && !st; k++) {
        int u1 = (int)((long)units * (k + 1) / parts), rows = 0;
        for (int u = u0; u < u1; u++) which[rows++] = u; /* SFT/GRPO rows, DPO chosen rows */
        if (dpo)
            for (int u = u0; u < u1; u++) which[rows++] = b->pairs + u; /* their rejected rows */
        int T = k == 0 ? b->T : cut_after_targets(b, which, rows);
        if (!(st = take_rows(&mb[k], b, which, rows, T, err))) {
            mb[k].pairs = dpo ? u1 - u0 : 0;
            (*n)++;
        }
        u0 = u1;
    }
    free(which);
    if (st) {
        for (int k = 0; k < *n; k++) sbp_batch_free(&mb[k]);
        *n = 0;
    }
    return st;
}
