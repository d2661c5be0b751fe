/* dist_cli.c — how a command of a distributed run ends on an error (docs/distributed.md). */
#include "../core/err.h"
#include "../dist/dist.h"
#include "cli.h"
#include "verify/text.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int dist_exit(sbp_comm *c, const char *cmd, const sbp_err *err) {
    if (sbp_comm_size(c) <= 1) {
        const int code = report_error(cmd, err);
        sbp_comm_finish(c);
        return code;
    }
    char msg[SBP_TEXT_ESCAPED];
    fprintf(stderr, "streambp %s: rank %d: %s\n", cmd, sbp_comm_rank(c),
            sbp_text_escape(msg, sizeof msg, err->msg));
    if (err->status == SBP_ENUMERIC) { /* every rank holds the same gradient and says the same */
        sbp_comm_finish(c);
        return EXIT_MISMATCH;
    }
    sbp_comm_abort(c, err->status == SBP_EPEER ? EXIT_PEER : EXIT_USAGE);
    return EXIT_USAGE; /* not reached */
}

int parse_comm_timeout(const char *cmd, const char *s, double *out) {
    char *end;
    const double v = strtod(s, &end);
    if (end == s || *end || !(v > 0) || !isfinite(v) || v > 1e7) {
        fprintf(stderr, "streambp %s: --comm-timeout must be seconds > 0, not \"%s\"\n", cmd, s);
        return 0;
    }
    *out = v;
    return 1;
}

int dist_follower(char *scratch, size_t n, const char **out, sbp_err *err) {
    const char *tmp = getenv("TMPDIR");
    if (snprintf(scratch, n, "%s/streambp-rank-XXXXXX", tmp && *tmp ? tmp : "/tmp") >= (int)n ||
        !mkdtemp(scratch)) {
        scratch[0] = 0;
        return sbp_fail(err, SBP_EIO, "cannot create a private directory for this rank"), 0;
    }
    static char run[4300];
    snprintf(run, sizeof run, "%s/run", scratch);
    *out = run;
    if (!freopen("/dev/null", "w", stdout)) return sbp_fail(err, SBP_EIO, "/dev/null"), 0;
    return 1;
}
