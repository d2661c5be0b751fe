/* names.c — the spelling of each option enum of streambp.h, one table each, read both ways: the
 * name of a value (for messages, files and the command line) and the value of a name (the
 * parsers). The only place these strings are written. */
#include "../streambp.h"

#include <string.h>

static const char *const schedules[] = {
    [SBP_FULL] = "full", [SBP_CKPT] = "ckpt", [SBP_STREAM] = "stream"};
static const char *const numerics[] = {
    [SBP_NUMERICS_FAST] = "fast", [SBP_NUMERICS_PORTABLE] = "portable"};
static const char *const devices[] = {
    [SBP_DEVICE_CPU] = "cpu", [SBP_DEVICE_CUDA] = "cuda", [SBP_DEVICE_CUDA_EMU] = "cuda-emu"};
static const char *const unattended[] = {[SBP_UNATTENDED_ZERO] = "zero",
                                         [SBP_UNATTENDED_HF_EAGER] = "hf-eager",
                                         [SBP_UNATTENDED_HF_SDPA] = "hf-sdpa"};

#define COUNT(t) ((int)(sizeof t / sizeof t[0]))

/* names[v], or "?" for a value outside the table (a cast from a bad integer) */
static const char *name_of(const char *const *names, int n, int v) {
    return v >= 0 && v < n ? names[v] : "?";
}

/* The index of s in names, or −1. */
static int value_of(const char *const *names, int n, const char *s) {
    for (int v = 0; s && v < n; v++)
        if (strcmp(s, names[v]) == 0) return v;
    return -1;
}

const char *sbp_schedule_name(sbp_schedule s) {
    return name_of(schedules, COUNT(schedules), (int)s);
}

int sbp_schedule_parse(const char *s, sbp_schedule *out) {
    const int v = value_of(schedules, COUNT(schedules), s);
    if (v >= 0) *out = (sbp_schedule)v;
    return v >= 0;
}

const char *sbp_numerics_name(sbp_numerics n) {
    return name_of(numerics, COUNT(numerics), (int)n);
}

int sbp_numerics_parse(const char *s, sbp_numerics *out) {
    const int v = value_of(numerics, COUNT(numerics), s);
    if (v >= 0) *out = (sbp_numerics)v;
    return v >= 0;
}

const char *sbp_device_name(sbp_device d) {
    return name_of(devices, COUNT(devices), (int)d);
}

int sbp_device_parse(const char *s, sbp_device *out) {
    const int v = value_of(devices, COUNT(devices), s);
    if (v >= 0) *out = (sbp_device)v;
    return v >= 0;
}

const char *sbp_unattended_name(sbp_unattended u) {
    return name_of(unattended, COUNT(unattended), (int)u);
}

int sbp_unattended_parse(const char *s, sbp_unattended *out) {
    const int v = value_of(unattended, COUNT(unattended), s);
    if (v >= 0) *out = (sbp_unattended)v;
    return v >= 0;
}
