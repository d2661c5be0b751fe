/* none.c — the transport of a build without MPI: one process, every collective a copy. Launched
 * by mpirun with more than one process, it refuses to start (each process would compute the
 * whole step alone and write the same files). */
#include "../core/err.h"
#include "dist.h"

#include <stdlib.h>
#include <string.h>

struct sbp_comm {
    int unused;
};

static sbp_comm one;

int sbp_comm_built(void) {
    return 0;
}

/* The world size a launcher announces, or 1. */
static long launched_size(void) {
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    if (!s) s = getenv("PMIX_SIZE");
    if (!s) s = getenv("PMI_SIZE");
    return s ? strtol(s, NULL, 10) : 1;
}

sbp_status sbp_comm_start(sbp_comm **c, double timeout_s, sbp_err *err) {
    *c = NULL;
    if (launched_size() > 1)
        return sbp_fail(err, SBP_EUSAGE,
                        "launched as %ld processes, but this build has no MPI (rebuild with mpicc "
                        "installed: apt-get install openmpi-bin libopenmpi-dev)",
                        launched_size());
    *c = &one;
    return SBP_OK;
}

void sbp_comm_finish(sbp_comm *c) {}

/* One process waits on nothing but its own work: poll runs until done or stuck. */
sbp_status sbp_comm_wait_poll(sbp_comm *c, sbp_comm_poll poll, void *ctx, const char *what,
                              sbp_err *err) {
    int rc = 0, progress = 1, peer = -1;
    while (progress && (progress = 0, rc = poll(ctx, &progress, &peer)) > 0) {
    }
    if (rc > 0) return sbp_fail(err, SBP_EPEER, "nothing left to wait for on %s", what);
    return rc < 0 ? err->status : SBP_OK;
}

int sbp_comm_rank(const sbp_comm *c) {
    return 0;
}

int sbp_comm_size(const sbp_comm *c) {
    return 1;
}

void sbp_comm_abort(sbp_comm *c, int code) {
    exit(code); /* the CLI's call, as MPI_Abort is */
}

/* One process never sends: every piece it computes is its own. */
int sbp_comm_isend(sbp_comm *c, const void *buf, size_t bytes, int to, int tag, sbp_err *err) {
    return sbp_fail(err, SBP_EUSAGE, "no peer %d in a one-process run", to), -1;
}

int sbp_comm_irecv(sbp_comm *c, void *buf, size_t bytes, int from, int tag, sbp_err *err) {
    return sbp_fail(err, SBP_EUSAGE, "no peer %d in a one-process run", from), -1;
}

int sbp_comm_test(sbp_comm *c, int r) {
    return 1;
}

void sbp_comm_progress(sbp_comm *c) {}

sbp_status sbp_comm_wait(sbp_comm *c, int r, const char *what, sbp_err *err) {
    return SBP_OK;
}

sbp_status sbp_comm_waitall(sbp_comm *c, const char *what, sbp_err *err) {
    return SBP_OK;
}

sbp_status sbp_comm_allgather(sbp_comm *c, void *out, const void *in, size_t bytes,
                              const char *what, sbp_err *err) {
    if (out != in) memmove(out, in, bytes);
    return SBP_OK;
}

sbp_status sbp_comm_allgatherv(sbp_comm *c, void *out, const void *in, const size_t *counts,
                               const size_t *displs, const char *what, sbp_err *err) {
    if ((char *)out + displs[0] != in) memmove((char *)out + displs[0], in, counts[0]);
    return SBP_OK;
}

sbp_status sbp_comm_max_u64(sbp_comm *c, uint64_t *v, int n, const char *what, sbp_err *err) {
    return SBP_OK;
}

void sbp_comm_counters(const sbp_comm *c, int64_t *bytes, int64_t *messages) {
    *bytes = *messages = 0;
}

double sbp_comm_waited(const sbp_comm *c) {
    return 0;
}
