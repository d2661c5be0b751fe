/* resolve.c — sbp_engine_resolve: the options of a step as the engine runs them (resolve.h). */
#include "resolve.h"
#include "../core/err.h"

#include <string.h>

static int clamp(int v, int hi) {
    return v < hi ? v : hi;
}

sbp_status sbp_engine_resolve(sbp_engine_opts *eo, const sbp_grad_opts *opts, int T, sbp_err *err) {
    memset(eo, 0, sizeof *eo);
    if (opts->block < 0 || opts->chunk < 0 || opts->logit_chunk < 0)
        return sbp_fail(err, SBP_EUSAGE,
                        "block, chunk and logit chunk must be positive (got %d, %d, %d)",
                        opts->block, opts->chunk, opts->logit_chunk);
    if (opts->block > SBP_MAX_BLOCK) /* also keeps the default chunk, 2 blocks, within int */
        return sbp_fail(err, SBP_EUSAGE, "block %d is larger than the supported %d", opts->block,
                        SBP_MAX_BLOCK);
    if ((unsigned)opts->schedule > SBP_STREAM)
        return sbp_fail(err, SBP_EUSAGE, "unknown schedule %d", (int)opts->schedule);
    if ((unsigned)opts->numerics > SBP_NUMERICS_PORTABLE)
        return sbp_fail(err, SBP_EUSAGE, "unknown numerics %d", (int)opts->numerics);
    if ((unsigned)opts->unattended > SBP_UNATTENDED_HF_SDPA)
        return sbp_fail(err, SBP_EUSAGE, "unknown mode %d for rows without a visible key",
                        (int)opts->unattended);
    if ((unsigned)opts->device > SBP_DEVICE_CUDA_EMU)
        return sbp_fail(err, SBP_EUSAGE, "unknown device %d", (int)opts->device);
    if (opts->device != SBP_DEVICE_CPU && opts->numerics != SBP_NUMERICS_PORTABLE)
        return sbp_fail(err, SBP_EUSAGE,
                        "the %s backend computes the portable numerics only (--numerics portable)",
                        sbp_device_name(opts->device));
    if (opts->device != SBP_DEVICE_CPU && opts->emulate_bf16)
        return sbp_fail(err, SBP_EUSAGE, "bf16 storage runs on the CPU only");
    if (opts->device != SBP_DEVICE_CPU && opts->profile) /* its calls return before the work */
        return sbp_fail(err, SBP_EUSAGE, "the operations' profile times the CPU backend only");
    if (!sbp_device_built(opts->device))
        return sbp_fail(
            err, SBP_EUSAGE, "this build has no %s backend (%s)", sbp_device_name(opts->device),
            opts->device == SBP_DEVICE_CUDA_EMU ? "it was built with EMU=0"
                                                : "nvcc was not found when it was built");
    if (T < 1) return sbp_fail(err, SBP_EINPUT, "the batch has T = 0 tokens");
    eo->schedule = opts->schedule;
    eo->numerics = opts->numerics;
    eo->unattended = opts->unattended;
    eo->seq_overlap = opts->seq_overlap;
    eo->lora = opts->lora;
    eo->emulate_bf16 = opts->emulate_bf16;
    eo->profile = opts->profile;
    eo->block = opts->block ? opts->block : SBP_DEFAULT_BLOCK;
    eo->chunk = clamp(opts->chunk ? opts->chunk : SBP_DEFAULT_CHUNK(eo->block), T);
    eo->materialise = opts->schedule != SBP_STREAM && !opts->chunked_logits;
    eo->logit_chunk = clamp(opts->logit_chunk ? opts->logit_chunk : eo->block, T);
    if (eo->materialise) eo->logit_chunk = T;
    return SBP_OK;
}
