/* clock.h — the process's clock and its memory high-water mark, for the reports of the command
 * line, the benchmark and the distributed step's deadlines. Internal to the library. */
#ifndef SBP_CLOCK_H
#define SBP_CLOCK_H

/* Seconds on the monotonic clock (CLOCK_MONOTONIC): only differences mean anything. */
double sbp_now_seconds(void);
/* The process's peak resident set size so far, in bytes (getrusage's ru_maxrss). */
long long sbp_peak_rss_bytes(void);

#endif
