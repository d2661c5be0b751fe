/* clock.c — the monotonic clock and the peak resident set (clock.h). */
#include "clock.h"

#include <sys/resource.h>
#include <time.h>

double sbp_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

long long sbp_peak_rss_bytes(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (long long)ru.ru_maxrss * 1024;
}
