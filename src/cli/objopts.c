/* objopts.c — the objective options shared by `grad` and `verify`, and the reference-model
 * pass that fills a batch's reference log-probs. */
#include "objopts.h"
#include "../core/err.h"
#include "../core/objective.h"
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char obj_usage[] =
    "objective (names as in TRL; formulas in ref/SEMANTICS.md):\n"
    "  --objective O          sft | dpo | grpo (default sft)\n"
    "  --loss-type L          dpo: sigmoid | ipo; grpo: grpo | bnpo | dr_grpo | dapo\n"
    "  --beta X               dpo: beta (default 0.1); grpo: KL coefficient (default 0)\n"
    "  --label-smoothing X    dpo sigmoid (default 0)\n"
    "  --epsilon-low X        grpo clip range [1 - low, 1 + high] (defaults 0.2, 0.2)\n"
    "  --epsilon-high X\n"
    "  --temperature X        grpo: logits / X (default 1)\n"
    "  --max-completion-length N   grpo dr_grpo normaliser (default T)\n"
    "  --no-scale-rewards     grpo: advantages r - mean, not (r - mean) / (std + 1e-4)\n"
    "  --ref-model DIR        reference log-probs from this model (dpo, grpo) instead of the "
    "batch\n";

void obj_args_init(obj_args *a) {
    memset(a, 0, sizeof *a);
    a->scale_rewards = 1;
    a->obj.epsilon_low = a->obj.epsilon_high = 0.2;
    a->obj.temperature = 1;
}

static int number(const char *cmd, const char *opt, const char *text, double *out) {
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || !isfinite(v) || v < 0) {
        fprintf(stderr, "streambp %s: --%s must be a finite number >= 0, got \"%s\"\n", cmd, opt,
                text);
        return 0;
    }
    *out = v;
    return 1;
}

int obj_args_option(obj_args *a, const char *cmd, int code, const char *arg) {
    sbp_objective *o = &a->obj;
    switch (code) {
    case OBJ_OPT_OBJECTIVE:
        if (!sbp_obj_kind_parse(&o->kind, arg)) {
            fprintf(stderr, "streambp %s: --objective must be sft, dpo or grpo, got \"%s\"\n", cmd,
                    arg);
            return 0;
        }
        return 1;
    case OBJ_OPT_LOSS_TYPE: a->loss_type = arg; return 1;
    case OBJ_OPT_BETA: a->beta_set = 1; return number(cmd, "beta", arg, &o->beta);
    case OBJ_OPT_LABEL_SMOOTHING: return number(cmd, "label-smoothing", arg, &o->label_smoothing);
    case OBJ_OPT_EPS_LOW: return number(cmd, "epsilon-low", arg, &o->epsilon_low);
    case OBJ_OPT_EPS_HIGH: return number(cmd, "epsilon-high", arg, &o->epsilon_high);
    case OBJ_OPT_TEMPERATURE:
        if (!number(cmd, "temperature", arg, &o->temperature)) return 0;
        if (o->temperature == 0) {
            fprintf(stderr, "streambp %s: --temperature must be > 0\n", cmd);
            return 0;
        }
        return 1;
    case OBJ_OPT_MAX_COMPLETION:
        return parse_pos_int(cmd, "max-completion-length", arg, &o->max_completion_length);
    case OBJ_OPT_NO_SCALE: a->scale_rewards = 0; return 1;
    case OBJ_OPT_REF_MODEL: a->ref_model = arg; return 1;
    }
    return 0;
}

int obj_args_finish(obj_args *a, const char *cmd) {
    sbp_objective *o = &a->obj;
    if (o->kind == SBP_OBJ_DPO && !a->beta_set) o->beta = 0.1;
    if (a->loss_type) {
        if (!sbp_obj_loss_parse(o, a->loss_type)) {
            fprintf(
                stderr,
                "streambp %s: --loss-type \"%s\" does not apply to --objective %s (dpo: sigmoid, "
                "ipo; grpo: grpo, bnpo, dr_grpo, dapo)\n",
                cmd, a->loss_type, obj_kind_name(o->kind));
            return 0;
        }
    }
    if (a->ref_model && o->kind == SBP_OBJ_SFT) {
        fprintf(stderr, "streambp %s: --ref-model applies to dpo and grpo\n", cmd);
        return 0;
    }
    return 1;
}

const char *obj_kind_name(sbp_objective_kind k) {
    return sbp_obj_kind_name(k);
}

const char *obj_loss_name(const sbp_objective *o) {
    return sbp_obj_loss_name(o);
}

sbp_status obj_reference(const obj_args *a, sbp_batch *b, int n, const sbp_config *policy,
                         sbp_precision prec, const sbp_grad_opts *g, sbp_ledger *lg, sbp_err *err) {
    if (!a->ref_model) return SBP_OK;
    sbp_model ref;
    sbp_status st = sbp_model_load(&ref, a->ref_model, prec, lg, err);
    if (st) return st;
    if (g->emulate_bf16) sbp_model_round_bf16(&ref); /* as the policy's weights are */
    if (ref.cfg.vocab != policy->vocab) {
        sbp_model_free(&ref, lg);
        return sbp_fail(err, SBP_EINPUT,
                        "%s: the reference model's vocabulary (%d) differs from the policy's (%d)",
                        a->ref_model, ref.cfg.vocab, policy->vocab);
    }
    /* the reference model is a plain model: a LoRA adapter belongs to the policy only (as TRL
     * runs peft's reference with the adapter disabled) */
    sbp_grad_opts ref_g = *g;
    ref_g.lora = NULL;
    for (int i = 0; i < n && !st; i++)
        st = sbp_batch_set_reference(&b[i], &ref, &a->obj, &ref_g, lg, err);
    sbp_model_free(&ref, lg);
    return st;
}
