/* cmd_plan.h — planning helpers of the command line, shared by `plan` and `bench`. */
#ifndef SBP_CLI_PLAN_H
#define SBP_CLI_PLAN_H

#include "../streambp.h"

/* The schedules plan and bench compare: ckpt keeps B·T·V logits as HF's baseline does,
 * ckpt-chunked streams them. */
typedef struct {
    const char *name;
    sbp_schedule schedule;
    int chunked_logits;
} plan_schedule;

enum { PLAN_N_SCHEDULES = 4 };
extern const plan_schedule plan_schedules[PLAN_N_SCHEDULES];
/* Parses a comma-separated list of their names into use[]; prints an error and returns 0 for
 * an unknown one. */
int plan_parse_schedules(const char *cmd, const char *list, int use[PLAN_N_SCHEDULES]);

/* "80G", "512M", "1.5GiB" (binary units) -> bytes; prints an error naming cmd and returns 0. */
int plan_parse_size(const char *cmd, const char *text, int64_t *out);

#endif
