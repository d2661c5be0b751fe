/* audit.c — another implementation's gradients judged per tensor (see audit.h). */
#include "audit.h"
#include "../ref/ref.h"
#include "../src/core/err.h"
#include "../src/core/objective.h"
#include "../src/io/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The smallest budget, whatever our own run achieves: a few units of the precision. */
static double budget_floor(sbp_theirs_precision p) {
    return p == SBP_THEIRS_FP64 ? 1e-13 : p == SBP_THEIRS_FP32 ? 1e-7 : 1e-3;
}

const char *sbp_audit_status_name(int status) {
    static const char *names[] = {"ok", "OVER BUDGET", "NON-FINITE", "SHAPE", "MISSING"};
    return status >= 0 && status <= 4 ? names[status] : "?";
}

static const char *kind_name(sbp_objective_kind k) {
    return sbp_obj_kind_name(k);
}
static const char *loss_name(const sbp_objective *o) {
    return sbp_obj_loss_name(o);
}

/* What is audited: the model's gradient, or with --lora an adapter's (the base frozen). */
typedef struct {
    const sbp_model *m64;
    const sbp_lora *l64;  /* NULL without an adapter */
    const sbp_params *ps; /* the gradient's table: m64's, or l64's */
} subject;

/* The float64 oracle's gradient of the objective, from the files alone: the oracle reads the
 * model, the batch and the reference model with its own readers (ref/ref.h), so a reading
 * mistake of the library does not reach the truth. Its table is mapped to m64's by name. */
static sbp_status oracle_grad(double *loss, double *grads /* (total) */, const subject *su,
                              const sbp_audit_opts *o, sbp_err *err) {
    ref_model rm;
    ref_lora rl = {0};
    double *tg;
    const ref_files f = {.model_dir = o->model,
                         .batch_path = o->batch,
                         .o = &o->objective,
                         .scale_rewards = !o->no_scale_rewards,
                         .ref_model_dir = o->ref_model,
                         .lora_dir = o->lora,
                         .unattended = o->unattended};
    sbp_status st = ref_truth_files(loss, &tg, &rm, o->lora ? &rl : NULL, &f, NULL, 0, err);
    if (st) return st;
    const sbp_params *theirs = o->lora ? &rl.ps : &rm.ps;
    for (int i = 0; i < su->ps->n && !st; i++) {
        const sbp_param *p = &su->ps->p[i];
        int j = sbp_params_find(theirs, p->name);
        if (j < 0 || theirs->p[j].numel != p->numel)
            st = sbp_fail(err, SBP_EINPUT,
                          "%s: the oracle's reading of the %s has no tensor \"%s\" of the "
                          "library's shape",
                          o->lora ? o->lora : o->model, o->lora ? "adapter" : "model", p->name);
        else
            memcpy(grads + p->offset, tg + theirs->p[j].offset, sizeof(double) * (size_t)p->numel);
    }
    free(tg);
    if (o->lora) ref_lora_free(&rl);
    ref_model_free(&rm);
    return st;
}

/* A batch for a run at precision prec: the file, with the reference log-probs of ref_model
 * computed at that precision (a model rounded to bf16 for the bf16 yardstick). */
static sbp_status load_batch(sbp_batch *b, const sbp_audit_opts *o, const sbp_config *cfg,
                             sbp_precision prec, int bf16, sbp_err *err) {
    sbp_status st =
        sbp_batch_load_as(b, o->batch, cfg, o->objective.kind, !o->no_scale_rewards, err);
    if (st || !o->ref_model) return st;
    sbp_model ref;
    if ((st = sbp_model_load(&ref, o->ref_model, prec, NULL, err))) return st;
    if (ref.cfg.vocab != cfg->vocab)
        st = sbp_fail(err, SBP_EINPUT,
                      "%s: the reference model's vocabulary (%d) differs from the policy's (%d)",
                      o->ref_model, ref.cfg.vocab, cfg->vocab);
    if (bf16) sbp_model_round_bf16(&ref);
    sbp_grad_opts g = {.block = o->block, .unattended = o->unattended};
    if (!st) st = sbp_batch_set_reference(b, &ref, &o->objective, &g, NULL, err);
    sbp_model_free(&ref, NULL);
    return st;
}

/* Our own full-BP gradient at precision p, as doubles; b64 is the float64 batch (reused when
 * the reference log-probs do not depend on the precision). */
static sbp_status ours_at(double *out, double *loss, sbp_theirs_precision p,
                          const sbp_audit_opts *o, const subject *su, const sbp_batch *b64,
                          sbp_err *err) {
    sbp_grad_opts g = {.schedule = SBP_FULL,
                       .block = o->block,
                       .objective = o->objective,
                       .numerics = o->numerics,
                       .unattended = o->unattended,
                       .lora = su->l64};
    sbp_grad_result r;
    sbp_status st;
    const int64_t n = su->ps->total;
    if (p == SBP_THEIRS_FP64) {
        if ((st = sbp_grad(&r, su->m64, b64, &g, NULL, err))) return st;
        memcpy(out, r.grads, sizeof(double) * (size_t)n);
    } else {
        sbp_model m32;
        sbp_lora l32 = {0};
        sbp_batch b32 = {0};
        const int bf16 = p == SBP_THEIRS_BF16;
        if ((st = sbp_model_load(&m32, o->model, SBP_FP32, NULL, err))) return st;
        if (o->lora && (st = sbp_lora_load(&l32, o->lora, &m32.cfg, SBP_FP32, NULL, err))) {
            sbp_model_free(&m32, NULL);
            return st;
        }
        g.lora = o->lora ? &l32 : NULL;
        if (bf16) sbp_model_round_bf16(&m32), g.emulate_bf16 = 1;
        if (o->ref_model) st = load_batch(&b32, o, &m32.cfg, SBP_FP32, bf16, err);
        if (!st) st = sbp_grad(&r, &m32, o->ref_model ? &b32 : b64, &g, NULL, err);
        sbp_batch_free(&b32);
        sbp_lora_free(&l32, NULL);
        sbp_model_free(&m32, NULL);
        if (st) return st;
        for (int64_t i = 0; i < n; i++) out[i] = ((const float *)r.grads)[i];
    }
    *loss = r.loss;
    sbp_grad_result_free(&r, NULL);
    return SBP_OK;
}

static sbp_status truth_of(sbp_audit_report *rep, double *truth, const sbp_audit_opts *o,
                           const subject *su, const sbp_batch *b, sbp_err *err) {
    if (!o->no_ref) {
        rep->truth = "ref/ float64 oracle";
        return oracle_grad(&rep->truth_loss, truth, su, o, err);
    }
    rep->truth = "float64 full BP";
    return ours_at(truth, &rep->truth_loss, SBP_THEIRS_FP64, o, su, b, err);
}

/* The settings their file says it was computed with, where they differ from the audit's. */
static void check_metadata(sbp_diagnosis *d, const sbp_st_file *sf, const sbp_objective *o) {
    char said[240] = "", ours[240] = "";
    const char *obj = sbp_st_meta(sf, "objective"), *lt = sbp_st_meta(sf, "loss_type");
    if (obj && strcmp(obj, kind_name(o->kind)) != 0) {
        snprintf(said, sizeof said, "objective %s", obj);
        snprintf(ours, sizeof ours, "objective %s", kind_name(o->kind));
    } else if (obj && o->kind != SBP_OBJ_SFT) {
        if (lt && strcmp(lt, loss_name(o)) != 0) {
            snprintf(said, sizeof said, "loss_type %s", lt);
            snprintf(ours, sizeof ours, "loss_type %s", loss_name(o));
        }
        static const char *keys[] = {"beta", "label_smoothing", "epsilon_low", "epsilon_high",
                                     "temperature"};
        const double vals[] = {o->beta, o->label_smoothing, o->epsilon_low, o->epsilon_high,
                               o->temperature ? o->temperature : 1};
        for (int i = 0; i < 5; i++) {
            const char *v = sbp_st_meta(sf, keys[i]);
            char *end;
            double x = v ? strtod(v, &end) : 0;
            if (!v || end == v || fabs(x - vals[i]) <= 1e-12 * fmax(1, fabs(x))) continue;
            if (o->kind == SBP_OBJ_DPO && i >= 2) continue; /* GRPO-only settings */
            if (o->kind == SBP_OBJ_GRPO && i == 1) continue;
            snprintf(said + strlen(said), sizeof said - strlen(said), "%s%s %g",
                     said[0] ? ", " : "", keys[i], x);
            snprintf(ours + strlen(ours), sizeof ours - strlen(ours), "%s%s %g",
                     ours[0] ? ", " : "", keys[i], vals[i]);
        }
    }
    if (said[0])
        sbp_diag_add(d, "metadata",
                     "their file's metadata says %s; the audit used %s: audit with the options "
                     "the run used, or check the run's configuration",
                     said, ours);
}

/* Our run at the next lower precision, and the budget it would give; NULL when there is none. */
static const char *lower_yardstick(sbp_audit_report *rep, double *buf, const double *truth,
                                   const sbp_audit_opts *o, const subject *su, const sbp_batch *b,
                                   double slack, sbp_err *err, sbp_status *st) {
    sbp_theirs_precision lp = o->precision == SBP_THEIRS_FP64   ? SBP_THEIRS_FP32
                              : o->precision == SBP_THEIRS_FP32 ? SBP_THEIRS_BF16
                                                                : SBP_THEIRS_FP64;
    if (o->precision == SBP_THEIRS_BF16) return NULL;
    double loss;
    if ((*st = ours_at(buf, &loss, lp, o, su, b, err))) return NULL;
    for (int i = 0; i < rep->n; i++) {
        const sbp_param *p = &su->ps->p[i];
        sbp_tensor_cmp c;
        sbp_compare(&c, buf + p->offset, truth + p->offset, p->numel, SBP_DT_F64, 0, 0);
        rep->rows[i].lower_rel_l2 = c.rel_l2;
        rep->rows[i].lower_budget = slack * fmax(c.rel_l2, budget_floor(lp));
    }
    return lp == SBP_THEIRS_FP32 ? "float32" : "bf16 (emulated)";
}

/* Gemma-3's signature: float64 gradients with float32-level error on most tensors (the
 * precision rule fired) are what stock HF transformers gives for this family, whose float64
 * model keeps float32 islands (docs/gemma3.md). Measured with transformers 4.51.3 on
 * gemma3-tiny: 6e-8 to 6e-7 relative L2 on every tensor, the norm upcast alone 2e-7 (median)
 * and q_norm/k_norm the worst; each other island 4e-8 to 1.5e-7. */
static void gemma3_islands(sbp_diagnosis *d, sbp_family family, sbp_theirs_precision prec) {
    int fired = 0;
    for (int i = 0; i < d->n; i++) fired |= strcmp(d->rule[i], "precision") == 0;
    if (family != SBP_GEMMA3 || prec != SBP_THEIRS_FP64 || !fired) return;
    sbp_diag_add(d, "precision",
                 "Gemma-3: HF's float64 Gemma3ForCausalLM keeps float32 islands: every "
                 "Gemma3RMSNorm in float32 (x.float(), the largest part, ~2e-7, worst on "
                 "q_norm/k_norm), RoPE inv_freq/cos/sin, eager softmax(dtype=float32) and the "
                 "loss's logits.float(); stock HF float64 measured 6e-8 to 6e-7 on every tensor. "
                 "Patch them to float64 to compare at float64 (docs/gemma3.md)");
}

static void diagnose(sbp_audit_report *rep, const sbp_audit_opts *o, const subject *su,
                     const sbp_st_file *sf) {
    sbp_diag_row *dr = calloc((size_t)rep->n, sizeof *dr);
    const char **extra = calloc((size_t)sf->n + 1, sizeof *extra);
    if (!dr || !extra) {
        free(dr), free(extra);
        return;
    }
    int n_extra = 0;
    for (int i = 0; i < sf->n; i++)
        if (sbp_params_find(su->ps, sf->t[i].name) < 0) extra[n_extra++] = sf->t[i].name;
    for (int i = 0; i < rep->n; i++) {
        const sbp_audit_row *r = &rep->rows[i];
        const sbp_param *p = &su->ps->p[i];
        dr[i] = (sbp_diag_row){.name = r->name,
                               .kind = (int)p->kind,
                               .layer = p->layer,
                               .missing = r->status == 4,
                               .shape = r->status == 3,
                               .judged = r->status <= 2,
                               .failed = r->status == 1 || r->status == 2,
                               .cmp = r->theirs,
                               .budget = r->budget,
                               .lower_budget = r->lower_budget};
    }
    static const sbp_diag_prec claimed[] = {SBP_DIAG_FP32, SBP_DIAG_BF16, SBP_DIAG_FP64};
    sbp_diag_input in = {.claimed = claimed[o->precision],
                         .lower = o->precision == SBP_THEIRS_FP64 ? SBP_DIAG_FP32 : SBP_DIAG_BF16,
                         .tied = su->m64->cfg.tied && !su->l64,
                         .extra = extra,
                         .n_extra = n_extra,
                         .their_loss = rep->their_loss[0] ? rep->their_loss : NULL,
                         .truth_loss = rep->truth_loss};
    sbp_diagnose(&rep->diag, dr, rep->n, &in);
    gemma3_islands(&rep->diag, su->m64->cfg.family, o->precision);
    free(dr), free(extra);
}

sbp_status sbp_audit(sbp_audit_report *rep, const sbp_audit_opts *o, sbp_err *err) {
    memset(rep, 0, sizeof *rep);
    const double slack = o->slack > 0 ? o->slack : 4;
    sbp_model m64;
    sbp_batch b = {0};
    sbp_st_file sf = {0};
    double *truth = NULL, *ours = NULL, *theirs = NULL;
    sbp_lora l64 = {0};
    sbp_status st = sbp_model_load(&m64, o->model, SBP_FP64, NULL, err);
    if (st) return st;
    if (o->lora && (st = sbp_lora_load(&l64, o->lora, &m64.cfg, SBP_FP64, NULL, err))) {
        sbp_model_free(&m64, NULL);
        return st;
    }
    const subject su = {&m64, o->lora ? &l64 : NULL, o->lora ? &l64.params : &m64.params};
    const sbp_params *ps = su.ps;
    if ((st = load_batch(&b, o, &m64.cfg, SBP_FP64, 0, err)) ||
        (st = sbp_st_open(&sf, o->grads, err)))
        goto out;
    /* said here, before the oracle, in the user's terms: the oracle and the engine would each
     * refuse later, in their own (internal) words */
    if (o->objective.kind == SBP_OBJ_DPO && b.kind == SBP_OBJ_DPO && !b.ref_seq_logps) {
        st = sbp_fail(err, SBP_EINPUT,
                      "%s: a DPO audit needs the reference model's log-probs and the batch has "
                      "none: add ref_chosen_logps and ref_rejected_logps to it (one value per "
                      "pair: the reference model's summed log-prob of each sequence, the mean for "
                      "loss_type ipo, as TRL's precompute_ref_log_probs gives them; "
                      "streambp.batch.dpo takes them), or pass --ref-model DIR (the reference "
                      "model, whose log-probs the audit then computes)",
                      o->batch);
        goto out;
    }
    truth = malloc(sizeof(double) * (size_t)ps->total);
    ours = malloc(sizeof(double) * (size_t)ps->total);
    rep->rows = calloc((size_t)ps->n, sizeof *rep->rows);
    if (!truth || !ours || !rep->rows) {
        st = sbp_fail(err, SBP_ENOMEM, "out of memory");
        goto out;
    }
    if ((st = truth_of(rep, truth, o, &su, &b, err)) ||
        (st = ours_at(ours, &rep->our_loss, o->precision, o, &su, &b, err)))
        goto out;
    const char *tl = sbp_st_meta(&sf, "loss");
    snprintf(rep->their_loss, sizeof rep->their_loss, "%s", tl ? tl : "");
    rep->n = ps->n;
    for (int i = 0; i < ps->n && !st; i++) {
        const sbp_param *p = &ps->p[i];
        sbp_audit_row *row = &rep->rows[i];
        snprintf(row->name, sizeof row->name, "%s", p->name);
        sbp_tensor_cmp oc;
        sbp_compare(&oc, ours + p->offset, truth + p->offset, p->numel, SBP_DT_F64, 0, 0);
        row->ours_rel_l2 = oc.rel_l2;
        row->budget = slack * fmax(oc.rel_l2, budget_floor(o->precision));
        const sbp_st_tensor *t = sbp_st_find(&sf, p->name);
        if (!t) {
            row->status = 4;
            continue;
        }
        int same = t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same) {
            snprintf(row->shape, sizeof row->shape, "%d-D", t->ndim);
            row->status = 3;
            continue;
        }
        if (!sbp_dtype_is_float(t->dtype)) {
            st = sbp_fail(err, SBP_EINPUT, "%s: tensor \"%s\" has dtype %s, not a float dtype",
                          o->grads, p->name, sbp_dtype_name(t->dtype));
            break;
        }
        free(theirs);
        if (!(theirs = malloc(sizeof(double) * (size_t)p->numel))) {
            st = sbp_fail(err, SBP_ENOMEM, "out of memory");
            break;
        }
        if ((st = sbp_st_read(&sf, t, theirs, SBP_DT_F64, err))) break;
        sbp_compare(&row->theirs, theirs, truth + p->offset, p->numel, t->dtype, 0, 0);
        row->status = row->theirs.nonfinite_a ? 2 : row->theirs.rel_l2 <= row->budget ? 0 : 1;
    }
    for (int i = 0; i < sf.n && !st; i++)
        if (sbp_params_find(ps, sf.t[i].name) < 0 &&
            strlen(rep->extra) + strlen(sf.t[i].name) + 3 < sizeof rep->extra)
            snprintf(rep->extra + strlen(rep->extra), sizeof rep->extra - strlen(rep->extra),
                     "%s%s", rep->extra[0] ? ", " : "", sf.t[i].name);
    for (int i = 0; i < rep->n; i++) rep->failed += rep->rows[i].status != 0;
    int numeric = 0;
    for (int i = 0; i < rep->n; i++) numeric += rep->rows[i].status == 1;
    /* the lower precision's budget only matters to the diagnosis of failures over budget */
    if (!st && numeric) rep->lower = lower_yardstick(rep, ours, truth, o, &su, &b, slack, err, &st);
    if (!st && (rep->failed || rep->extra[0])) {
        diagnose(rep, o, &su, &sf);
        check_metadata(&rep->diag, &sf, &o->objective);
        int64_t rows, targets;
        sbp_batch_count_unattended(&b, &rows, &targets);
        if (targets)
            sbp_diag_add(&rep->diag, "unattended",
                         "the batch has %lld attention rows that see no key (left padding) and "
                         "%lld targets predicted from them; here they follow --unattended %s, "
                         "while HF's values there depend on its attention backend: audit again "
                         "with --unattended hf-eager or hf-sdpa",
                         (long long)rows, (long long)targets, sbp_unattended_name(o->unattended));
    }
out:
    free(truth), free(ours), free(theirs);
    sbp_st_close(&sf);
    sbp_batch_free(&b);
    sbp_lora_free(&l64, NULL);
    sbp_model_free(&m64, NULL);
    if (st) sbp_audit_free(rep);
    return st;
}

void sbp_audit_free(sbp_audit_report *rep) {
    free(rep->rows);
    memset(rep, 0, sizeof *rep);
}
