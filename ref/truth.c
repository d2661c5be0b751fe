/* truth.c — the truth of a step: a batch's reference log-probs from a reference model, and the
 * oracle's loss and gradients of a set of files (model, adapter, batch, reference model) read by
 * io.c's readers and run through the objectives (objectives.c, objectives32.c). See ref.h. */
#include "ref.h"
#include "../src/core/err.h"

#include <stdlib.h>
#include <string.h>

int ref_set_reference(sbp_batch *b, const ref_model *m, const sbp_objective *o,
                      sbp_unattended unattended, sbp_err *err) {
    if (o->kind == SBP_OBJ_SFT) return sbp_fail(err, SBP_EUSAGE, "ref: SFT has no reference");
    double tau = o->kind == SBP_OBJ_GRPO && o->temperature > 0 ? o->temperature : 1;
    double *logp = malloc(sizeof *logp * (size_t)b->B * b->T);
    if (!logp) return sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    const ref_net net = {.cfg = &m->cfg, .ps = &m->ps, .w = m->w, .unattended = unattended};
    int st = ref_logprobs(logp, &net, b, tau, err);
    if (st) {
        free(logp);
        return st;
    }
    if (o->kind == SBP_OBJ_GRPO) {
        free(b->ref_logps);
        b->ref_logps = logp;
        return SBP_OK;
    }
    double *stat = calloc((size_t)b->B, sizeof *stat);
    if (!stat) {
        free(logp);
        return sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    }
    for (int r = 0; r < b->B; r++) {
        int n = 0;
        for (int t = 0; t + 1 < b->T; t++)
            if (b->labels[(size_t)r * b->T + t + 1] != SBP_IGNORE)
                stat[r] += logp[(size_t)r * b->T + t], n++;
        if (o->dpo_loss == SBP_DPO_IPO && n) stat[r] /= n;
    }
    free(logp);
    free(b->ref_seq_logps);
    b->ref_seq_logps = stat;
    return SBP_OK;
}

int ref_truth(double *loss, double *grads, const ref_net *net, const sbp_batch *b,
              const sbp_objective *o, int f32, sbp_err *err) {
    if (o->kind == SBP_OBJ_DPO) return (f32 ? ref_dpo_f32 : ref_dpo)(loss, grads, net, b, o, err);
    if (o->kind == SBP_OBJ_GRPO)
        return (f32 ? ref_grpo_f32 : ref_grpo)(loss, grads, net, b, o, err);
    int st = (f32 ? ref_sft_f32 : ref_sft)(loss, grads, net, b, err);
    if (!st && o->num_items > 0) { /* a micro-batch of a larger step: N of the step */
        double k = (double)b->n_targets / o->num_items;
        *loss *= k;
        for (int64_t i = 0; grads && i < ref_grad_total(net); i++) grads[i] *= k;
    }
    return st;
}

int ref_truth_files(double *loss, double **grads, ref_model *m, ref_lora *lora, const ref_files *f,
                    char *mismatch, size_t n_mismatch, sbp_err *err) {
    *grads = NULL;
    if (lora) memset(lora, 0, sizeof *lora);
    int st = ref_model_read(m, f->model_dir, mismatch, n_mismatch, err);
    if (st) return st;
    if (f->lora_dir && !lora) st = sbp_fail(err, SBP_EUSAGE, "ref: an adapter needs a ref_lora");
    if (!st && f->lora_dir) st = ref_lora_read(lora, f->lora_dir, &m->cfg, err);
    sbp_batch b = {0};
    int have_batch = 0;
    if (!st) {
        st = ref_batch_read(&b, f->batch_path, &m->cfg, f->o->kind, f->scale_rewards, err);
        have_batch = !st;
    }
    if (!st && f->ref_model_dir) {
        ref_model r;
        if (!(st = ref_model_read(&r, f->ref_model_dir, NULL, 0, err))) {
            st = ref_set_reference(&b, &r, f->o, f->unattended, err);
            ref_model_free(&r);
        }
    }
    const ref_net net = {.cfg = &m->cfg,
                         .ps = &m->ps,
                         .w = m->w,
                         .unattended = f->unattended,
                         .lora = f->lora_dir ? lora : NULL};
    if (!st && !(*grads = malloc(sizeof **grads * (size_t)ref_grad_total(&net))))
        st = sbp_fail(err, SBP_ENOMEM, "ref: out of memory");
    if (!st) st = ref_truth(loss, *grads, &net, &b, f->o, f->f32, err);
    if (have_batch) ref_batch_free(&b);
    if (st) {
        free(*grads), *grads = NULL;
        ref_model_free(m);
        if (lora) ref_lora_free(lora);
    }
    return st;
}
