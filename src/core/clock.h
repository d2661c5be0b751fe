/* clock.h — the process's clock, its memory high-water mark and whether it gets huge pages, for
 * the reports of the command line, the benchmark and the distributed step's deadlines. Internal
 * to the library. */
#ifndef SBP_CLOCK_H
#define SBP_CLOCK_H

/* Seconds on the monotonic clock (CLOCK_MONOTONIC): only differences mean anything. */
double sbp_now_seconds(void);
/* The process's peak resident set size so far, in bytes (getrusage's ru_maxrss). */
long long sbp_peak_rss_bytes(void);
/* Whether this process's large buffers get transparent huge pages: 1 (the system's mode is
 * "always" or "madvise", which the ledger's madvise asks for), 0 (mode "never", or disabled for
 * the process with prctl PR_SET_THP_DISABLE), −1 (unknown: no readable mode). *mode names it:
 * "always", "madvise", "never", "disabled for this process", "unknown". */
int sbp_huge_pages(const char **mode);

#endif
