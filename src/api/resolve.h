/* resolve.h — the user's step options (sbp_grad_opts) checked and turned into the engine's
 * (sbp_engine_opts, src/engine/entry.h): defaults, clamping to the batch, the device's limits.
 * Shared by sbp_grad and sbp_logprobs (grad.c) and sbp_plan (plan.c). Internal to src/api. */
#ifndef SBP_API_RESOLVE_H
#define SBP_API_RESOLVE_H

#include "../engine/entry.h"
#include "../streambp.h"

/* eo: zeroed, then filled for a batch of T tokens (block >= 1; chunk and logit_chunk in
 * [1, T]; logit_chunk = T when the logits are materialised); the fields the caller owns (ev,
 * device_ops, logp_out, ...) are left 0. SBP_EUSAGE on a bad option, SBP_EINPUT on T < 1. */
sbp_status sbp_engine_resolve(sbp_engine_opts *eo, const sbp_grad_opts *opts, int T, sbp_err *err);

#endif
