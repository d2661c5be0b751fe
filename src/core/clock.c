/* clock.c — the monotonic clock, the peak resident set and the huge-page mode (clock.h). */
#include "clock.h"

#include <fcntl.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

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

/* Without huge pages a step faults every buffer in 4 KiB pages: 2.46 million page faults and
 * 3 s more system time in a Qwen3-0.6B full-BP step at T = 1024 (docs/performance.md, "Huge
 * pages"). */
int sbp_huge_pages(const char **mode) {
    if (prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1) {
        *mode = "disabled for this process";
        return 0;
    }
    *mode = "unknown";
    /* "always [madvise] never": the bracketed word is the mode */
    const int fd =
        open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[128];
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    static const char *const names[] = {"always", "madvise", "never"};
    for (int i = 0; i < 3; i++) {
        char want[16];
        const size_t k = strlen(names[i]);
        want[0] = '[', memcpy(want + 1, names[i], k), want[k + 1] = ']', want[k + 2] = 0;
        if (strstr(buf, want)) {
            *mode = names[i];
            return i < 2;
        }
    }
    return -1;
}
