/* session.c — a training run loaded and checked before its first step: the model, the adapter,
 * the reference model, the data, the optimizer, and what a checkpoint resumed from holds (see
 * run.h). The step itself is sbp_train_step (step.c). */
#include "run.h"

#include "../core/err.h"
#include "../dist/dist.h"
#include "../io/file.h"
#include "zero2.h"

#include <stdlib.h>
#include <string.h>

/* The model, adapter, reference model and data of o; the settings they make. */
static sbp_status load_inputs(sbp_train_run *r, const sbp_train_opts *o, sbp_ledger *lg,
                              sbp_err *err) {
    char p[4300];
    snprintf(p, sizeof p, "%s/config.json", o->model);
    sbp_status st = sbp_model_load(&r->m, o->model, o->prec, lg, err);
    if (!st) st = sbp_read_text(&r->config_json, NULL, p, 16u << 20, err);
    if (st) return st;
    size_t esz = o->prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    uint64_t w_hash = sbp_hash64(r->m.w, esz * (size_t)r->m.params.total, 0), ref_hash = 0;
    uint64_t lora_hash = 0;
    if (o->lora) { /* checked against the model: targets, rank and every shape */
        if ((st = sbp_lora_load(&r->lora, o->lora, &r->m.cfg, o->prec, lg, err))) return st;
        r->has_lora = 1;
        lora_hash = sbp_hash64(r->lora.w, esz * (size_t)r->lora.params.total, 0);
    }
    if (o->ref_model) {
        if ((st = sbp_model_load(&r->ref, o->ref_model, o->prec, lg, err))) return st;
        r->has_ref = 1;
        if (r->ref.cfg.vocab != r->m.cfg.vocab)
            return sbp_fail(err, SBP_EINPUT,
                            "%s: the reference model's vocabulary (%d) differs from the "
                            "policy's (%d)",
                            o->ref_model, r->ref.cfg.vocab, r->m.cfg.vocab);
        ref_hash = sbp_hash64(r->ref.w, esz * (size_t)r->ref.params.total, 0);
    }
    sbp_data_opts dopt = {.paths = o->data,
                          .n_paths = o->n_data,
                          .jsonl = o->jsonl,
                          .T = o->T,
                          .B = o->B,
                          .objective = o->g.objective,
                          .scale_rewards = o->scale_rewards,
                          .reference_model = o->ref_model != NULL};
    if ((st = sbp_data_open(&r->data, &dopt, &r->m.cfg, err))) return st;
    sbp_train_settings_build(&r->settings, o, &r->m, w_hash, r->has_lora ? &r->lora : NULL,
                             lora_hash, r->data, ref_hash);
    return SBP_OK;
}

/* The checkpoint ckpt's state, then its weights or adapter and its moments in place of the
 * initial ones. */
static sbp_status resume(sbp_train_run *r, const sbp_train_opts *o, const char *ckpt,
                         sbp_ledger *lg, sbp_err *err) {
    sbp_status st = sbp_checkpoint_read(&r->rs, ckpt, &r->settings, err);
    if (st) return st;
    if (r->rs.step > o->steps)
        return sbp_fail(err, SBP_EINPUT,
                        "--resume %s: the checkpoint is at step %lld, after --steps %d", ckpt,
                        (long long)r->rs.step, o->steps);
    const sbp_params *tps;
    if (r->has_lora) { /* the frozen model is --model's (its hash matched); the adapter the
                        * checkpoint's */
        const sbp_lora_config c0 = r->lora.cfg;
        sbp_lora_free(&r->lora, lg);
        r->has_lora = 0;
        if ((st = sbp_lora_load(&r->lora, ckpt, &r->m.cfg, o->prec, lg, err))) return st;
        r->has_lora = 1;
        const sbp_lora_config *c1 = &r->lora.cfg;
        if (c1->r != c0.r || c1->alpha != c0.alpha || c1->use_rslora != c0.use_rslora ||
            c1->targets != c0.targets)
            return sbp_fail(err, SBP_EINPUT,
                            "%s/adapter_config.json: the adapter is not the one the run trains "
                            "(r, lora_alpha, use_rslora or target_modules differ from --lora %s)",
                            ckpt, o->lora);
        tps = &r->lora.params;
    } else {
        sbp_model_free(&r->m, lg);
        if ((st = sbp_model_load(&r->m, ckpt, o->prec, lg, err))) return st;
        tps = &r->m.params;
    }
    if (tps->total != r->opt.n)
        return sbp_fail(
            err, SBP_EINPUT, "%s: the checkpoint's %s has %lld parameters, this run's %lld", ckpt,
            r->has_lora ? "adapter" : "model", (long long)tps->total, (long long)r->opt.n);
    char p[4400];
    snprintf(p, sizeof p, "%s/optimizer.safetensors", ckpt);
    if ((st = sbp_adamw_load(&r->opt, p, tps, err))) return st;
    if (r->opt.step != r->rs.step)
        return sbp_fail(err, SBP_EINPUT,
                        "%s: the optimizer is at step %lld, the trainer state at %lld", ckpt,
                        (long long)r->opt.step, (long long)r->rs.step);
    return SBP_OK;
}

sbp_status sbp_train_run_open(sbp_train_run *r, const sbp_train_opts *o, const char *ckpt,
                              sbp_ledger *lg, sbp_err *err) {
    memset(r, 0, sizeof *r);
    /* before anything is loaded or written: the first step would refuse it (sbp_dist_grad) after
     * the run directory's logs were begun */
    const int N = sbp_comm_size(o->g.comm);
    /* sequence parallel: every rank of a group runs its micro-batches (src/api/seqpar.c); a jsonl
     * run's T is known now (a batch file's is checked by its step) */
    sbp_status st0 = sbp_seq_check(o->T, &o->g, err);
    if (st0) return st0;
    /* data parallel's groups: every process, or with --seq-ranks S groups of S */
    const int groups = o->g.seq_ranks > 1 ? N / o->g.seq_ranks : N;
    if (o->grad_accum % groups)
        return sbp_fail(err, SBP_EUSAGE,
                        "%d micro-batches a step (--grad-accum) cannot be shared by %d %s: the "
                        "%s must divide them",
                        o->grad_accum, groups, o->g.seq_ranks > 1 ? "groups" : "processes",
                        o->g.seq_ranks > 1 ? "group count (N / --seq-ranks)" : "process count");
    sbp_status st = load_inputs(r, o, lg, err);
    if (st) return st;
    int per = sbp_data_items_per_batch(r->data);
    r->mb = calloc((size_t)o->grad_accum, sizeof *r->mb);
    r->items = calloc((size_t)per, sizeof *r->items);
    if (!r->mb || !r->items) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    r->n_mb = o->grad_accum;
    if ((st = sbp_sampler_init(&r->rs.sampler, sbp_data_items(r->data), per, o->shuffle, o->seed,
                               err)))
        return st;
    /* the trainable slab: the weights, or the adapter's tensors */
    const sbp_params *tps = r->has_lora ? &r->lora.params : &r->m.params;
    /* under mpirun the moments of this rank's blocks only (ZeRO-2, zero2.h) */
    if ((st = sbp_adamw_init_held(&r->opt, &o->adam, o->prec, tps, o->g.comm, lg, err))) return st;
    if (o->no_decay_nb) {
        sbp_range *nd;
        int nn;
        if ((st = sbp_params_no_decay(&nd, &nn, tps, err))) return st;
        st = sbp_adamw_exclude_decay(&r->opt, nd, nn, err);
        free(nd);
        if (st) return st;
    }
    /* resume: the settings, the logs and the data position, then the weights and moments */
    return ckpt && ckpt[0] ? resume(r, o, ckpt, lg, err) : sbp_run_state_start(&r->rs, err);
}

static int64_t real_tokens(const sbp_batch *b) {
    int64_t n = 0;
    for (size_t i = 0; i < (size_t)b->B * b->T; i++) n += b->mask[i] != 0;
    return n;
}

sbp_status sbp_train_run_batches(sbp_train_run *r, const sbp_train_opts *o, int64_t *tokens,
                                 sbp_ledger *lg, sbp_err *err) {
    sbp_status st = SBP_OK;
    *tokens = 0;
    for (int k = 0; k < r->n_mb && !st; k++) {
        sbp_batch_free(&r->mb[k]);
        int n = sbp_sampler_next(&r->rs.sampler, r->items);
        st = sbp_data_batch(&r->mb[k], r->data, r->items, n, err);
        if (!st && r->has_ref)
            st = sbp_batch_set_reference(&r->mb[k], &r->ref, &o->g.objective, &o->g, lg, err);
        if (!st) *tokens += real_tokens(&r->mb[k]);
    }
    return st;
}

void sbp_train_run_free(sbp_train_run *r, sbp_ledger *lg) {
    if (r->mb)
        for (int i = 0; i < r->n_mb; i++) sbp_batch_free(&r->mb[i]);
    free(r->mb), free(r->items);
    r->mb = NULL, r->items = NULL;
    sbp_adamw_free(&r->opt, lg);
    sbp_run_state_free(&r->rs);
    sbp_data_free(r->data);
    r->data = NULL;
    if (r->has_ref) sbp_model_free(&r->ref, lg);
    if (r->has_lora) sbp_lora_free(&r->lora, lg);
    if (r->m.w) sbp_model_free(&r->m, lg);
    r->has_ref = r->has_lora = 0;
    free(r->config_json);
    r->config_json = NULL;
}
