/* err.h — filling an sbp_err. Internal to the library. */
#ifndef SBP_ERR_H
#define SBP_ERR_H

#include "../streambp.h"

/* Sets err (if not NULL) to st and a printf-style message; returns st. */
sbp_status sbp_fail(sbp_err *err, sbp_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes an error message already in err with more context ("in file X: ..."). */
sbp_status sbp_fail_prefix(sbp_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
