/* objopts.h — the objective options shared by `grad` and `verify` (see objopts.c). */
#ifndef SBP_OBJOPTS_H
#define SBP_OBJOPTS_H

#include "../streambp.h"

/* getopt codes of the objective options; spread OBJ_LONG_OPTIONS into a struct option table */
enum {
    OBJ_OPT_OBJECTIVE = 1000,
    OBJ_OPT_LOSS_TYPE,
    OBJ_OPT_BETA,
    OBJ_OPT_LABEL_SMOOTHING,
    OBJ_OPT_EPS_LOW,
    OBJ_OPT_EPS_HIGH,
    OBJ_OPT_TEMPERATURE,
    OBJ_OPT_MAX_COMPLETION,
    OBJ_OPT_NO_SCALE,
    OBJ_OPT_REF_MODEL
};
#define OBJ_LONG_OPTIONS                                                                           \
    {"objective", required_argument, 0, OBJ_OPT_OBJECTIVE},                                        \
        {"loss-type", required_argument, 0, OBJ_OPT_LOSS_TYPE},                                    \
        {"beta", required_argument, 0, OBJ_OPT_BETA},                                              \
        {"label-smoothing", required_argument, 0, OBJ_OPT_LABEL_SMOOTHING},                        \
        {"epsilon-low", required_argument, 0, OBJ_OPT_EPS_LOW},                                    \
        {"epsilon-high", required_argument, 0, OBJ_OPT_EPS_HIGH},                                  \
        {"temperature", required_argument, 0, OBJ_OPT_TEMPERATURE},                                \
        {"max-completion-length", required_argument, 0, OBJ_OPT_MAX_COMPLETION},                   \
        {"no-scale-rewards", no_argument, 0, OBJ_OPT_NO_SCALE}, {                                  \
        "ref-model", required_argument, 0, OBJ_OPT_REF_MODEL                                       \
    }

typedef struct {
    sbp_objective obj;
    const char *loss_type;
    const char *ref_model;
    int scale_rewards;
    int beta_set;
} obj_args;

extern const char obj_usage[];

void obj_args_init(obj_args *a);
/* Handles one option code; prints the error and returns 0 when the value is bad. */
int obj_args_option(obj_args *a, const char *cmd, int code, const char *arg);
/* Defaults that depend on the objective (DPO's beta 0.1), the loss type; 0 on error. */
int obj_args_finish(obj_args *a, const char *cmd);
const char *obj_kind_name(sbp_objective_kind k);
const char *obj_loss_name(const sbp_objective *o);
/* With --ref-model: the reference log-probs of each batch, from a forward pass of that model
 * (DPO: each row's sum, or mean for ipo; GRPO: per token), replacing the batch's own. */
sbp_status obj_reference(const obj_args *a, sbp_batch *b, int n, const sbp_config *policy,
                         sbp_precision prec, const sbp_grad_opts *g, sbp_ledger *lg, sbp_err *err);

#endif
