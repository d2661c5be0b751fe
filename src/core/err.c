/* err.c — status names and error messages. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *sbp_status_name(sbp_status st) {
    switch (st) {
    case SBP_OK: return "ok";
    case SBP_EUSAGE: return "usage error";
    case SBP_EIO: return "I/O error";
    case SBP_EFORMAT: return "format error";
    case SBP_EINPUT: return "input error";
    case SBP_ENOMEM: return "out of memory";
    case SBP_ENUMERIC: return "numeric error";
    case SBP_EPEER: return "peer failed";
    }
    return "unknown status";
}

sbp_status sbp_fail(sbp_err *err, sbp_status st, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = st;
    }
    return st;
}

sbp_status sbp_fail_prefix(sbp_err *err, const char *fmt, ...) {
    if (!err) return SBP_EUSAGE;
    char prefix[sizeof err->msg], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t lp = strlen(prefix), lo = strlen(old), cap = sizeof err->msg - 1;
    if (lp > cap) lp = cap;
    if (lo > cap - lp) lo = cap - lp;
    memcpy(err->msg, prefix, lp);
    memcpy(err->msg + lp, old, lo);
    err->msg[lp + lo] = '\0';
    return err->status;
}
