/* schedule.c — learning-rate schedules with linear warm-up, the formulas of transformers'
 * optimization.py (LambdaLR factors multiplied into the peak learning rate):
 *
 *     if step < warmup: return step / max(1, warmup)
 *     cosine:   progress = (step - warmup) / max(1, total - warmup)
 *               return max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)))
 *               with num_cycles = 0.5
 *     linear:   return max(0.0, (total - step) / max(1, total - warmup))
 *     constant: return 1.0
 *
 * The trainer calls scheduler.step() after optimizer.step(), so optimizer step k (from 0) runs
 * at lr · factor(k): with warm-up the first step has lr 0, as in HF Trainer. The expressions
 * below keep Python's evaluation order, so the values are its bits (the same libm cos). */
#include "../streambp.h"

#include <math.h>
#include <string.h>

static const char *const names[] = {"cosine", "linear", "constant"};

const char *sbp_lr_kind_name(sbp_lr_kind k) {
    return (unsigned)k < 3 ? names[k] : "?";
}

int sbp_lr_kind_parse(const char *s, sbp_lr_kind *out) {
    for (int i = 0; i < 3; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (sbp_lr_kind)i;
            return 1;
        }
    return 0;
}

static double factor(const sbp_lr_sched *s, int64_t step) {
    if (step < s->warmup) return (double)step / (double)(s->warmup > 1 ? s->warmup : 1);
    int64_t rest = s->total - s->warmup;
    double den = (double)(rest > 1 ? rest : 1);
    switch (s->kind) {
    case SBP_LR_COSINE: {
        const double num_cycles = 0.5, pi = 3.141592653589793;
        double progress = (double)(step - s->warmup) / den;
        return fmax(0.0, 0.5 * (1.0 + cos(pi * num_cycles * 2.0 * progress)));
    }
    case SBP_LR_LINEAR: return fmax(0.0, (double)(s->total - step) / den);
    case SBP_LR_CONSTANT: break;
    }
    return 1.0;
}

double sbp_lr_at(const sbp_lr_sched *s, int64_t step) {
    return s->lr * factor(s, step);
}
