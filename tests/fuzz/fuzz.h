/* fuzz.h — shared by the libFuzzer targets in tests/fuzz/ (make fuzz builds and runs them).
 *
 * The library reads files by path, so each input is handed over as a file: a memfd (an
 * anonymous in-memory file, a regular file to fstat) reached through /proc/self/fd. */
#ifndef SBP_FUZZ_H
#define SBP_FUZZ_H

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* An in-memory file holding data; its path in path (at least 64 bytes). -1 on failure. */
static int fuzz_file(char *path, const uint8_t *data, size_t n) {
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0) return -1;
    size_t at = 0;
    while (at < n) {
        ssize_t w = write(fd, data + at, n - at);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        at += (size_t)w;
    }
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
