/* mpi.c — the transport over MPI (Open MPI 4.1), the only file built with mpicc's flags.
 *
 * MPI starts only under a launcher (OMPI_COMM_WORLD_SIZE or PMIX_RANK set): a singleton MPI_Init
 * costs a third of a second and most runs are one process. MPI_THREAD_FUNNELED: only the main
 * thread calls MPI, OpenMP runs as in one process. Errors return (MPI_ERRORS_RETURN); every wait
 * is a test loop with a deadline, so a dead or stopped peer ends the run with SBP_EPEER instead of
 * a hang. Only exact data moves: bytes, and a MAX over unsigned integers. */
#include "../core/clock.h"
#include "../core/err.h"
#include "dist.h"

#include <limits.h>
#include <stdio.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    FIRST_REQ = 64
}; /* the request list's first size; it doubles as needed (every test run grows it) */

struct sbp_comm {
    int mpi; /* MPI was started (else one process, no launcher) */
    int rank, size;
    double timeout;
    MPI_Request *req; /* (cap) outstanding: [0, nreq) */
    int *peer;        /* (cap) the other end of each */
    int nreq, cap;
    int64_t bytes, messages;
    double waited;   /* seconds spent waiting for requests and collectives */
    int test_failed; /* an MPI error sbp_comm_progress met, reported by the next wait */
};

static sbp_comm single = {.size = 1};

int sbp_comm_built(void) {
    return 1;
}

static sbp_status mpi_fail(sbp_comm *c, int code, const char *what, sbp_err *err) {
    char s[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(code, s, &len);
    return sbp_fail(err, SBP_EPEER, "rank %d: MPI failed on %s: %s", c->rank, what, s);
}

sbp_status sbp_comm_start(sbp_comm **out, double timeout_s, sbp_err *err) {
    *out = NULL;
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK")) {
        *out = &single;
        return SBP_OK;
    }
    int provided = 0, flag = 0;
    MPI_Initialized(&flag);
    if (!flag && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return sbp_fail(err, SBP_EPEER, "MPI_Init_thread failed");
    sbp_comm *c = calloc(1, sizeof *c);
    if (c)
        c->req = malloc(sizeof *c->req * FIRST_REQ), c->peer = malloc(sizeof *c->peer * FIRST_REQ);
    if (!c || !c->req || !c->peer) {
        if (c) free(c->req), free(c->peer);
        free(c);
        return sbp_fail(err, SBP_ENOMEM, "out of memory for the transport");
    }
    c->mpi = 1, c->cap = FIRST_REQ;
    c->timeout = timeout_s > 0 ? timeout_s : 600;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    *out = c;
    return SBP_OK;
}

void sbp_comm_finish(sbp_comm *c) {
    if (!c || !c->mpi) return;
    MPI_Finalize();
    free(c->req), free(c->peer);
    free(c);
}

int sbp_comm_rank(const sbp_comm *c) {
    return c ? c->rank : 0;
}

int sbp_comm_size(const sbp_comm *c) {
    return c ? c->size : 1;
}

void sbp_comm_abort(sbp_comm *c, int code) {
    if (c && c->mpi) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

static int add_request(sbp_comm *c, const void *buf, size_t bytes, int peer, int tag, int send,
                       sbp_err *err) {
    if (!c->mpi || peer < 0 || peer >= c->size || peer == c->rank)
        return sbp_fail(err, SBP_EUSAGE, "rank %d: no peer %d", c->rank, peer), -1;
    if (bytes > INT_MAX)
        return sbp_fail(err, SBP_EUSAGE, "rank %d: a message of %zu bytes (more than 2^31)",
                        c->rank, bytes),
               -1;
    if (c->nreq == c->cap) { /* MPI_Request is a handle: its value may move */
        const int cap = c->cap < INT_MAX / 2 ? 2 * c->cap : INT_MAX;
        MPI_Request *req = c->nreq < cap ? realloc(c->req, sizeof *req * (size_t)cap) : NULL;
        if (req) c->req = req;
        int *peers = req ? realloc(c->peer, sizeof *peers * (size_t)cap) : NULL;
        if (!peers)
            return sbp_fail(err, SBP_ENOMEM, "out of memory for %d messages in flight", c->nreq),
                   -1;
        c->peer = peers, c->cap = cap;
    }
    MPI_Request *r = &c->req[c->nreq];
    const int rc = send
                       ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, r)
                       : MPI_Irecv((void *)buf, (int)bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, r);
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, send ? "a send" : "a receive", err), -1;
    if (send) c->bytes += (int64_t)bytes, c->messages++;
    c->peer[c->nreq] = peer;
    return c->nreq++;
}

int sbp_comm_isend(sbp_comm *c, const void *buf, size_t bytes, int to, int tag, sbp_err *err) {
    return add_request(c, buf, bytes, to, tag, 1, err);
}

int sbp_comm_irecv(sbp_comm *c, void *buf, size_t bytes, int from, int tag, sbp_err *err) {
    return add_request(c, buf, bytes, from, tag, 0, err);
}

/* Tests requests [0, n) of r until all are done or nothing completed for the timeout. */
static sbp_status wait_all(sbp_comm *c, MPI_Request *r, const int *peer, int n, const char *what,
                           sbp_err *err) {
    double last = sbp_now_seconds(), t0 = last;
    if (c->test_failed) return mpi_fail(c, c->test_failed, what, err);
    int left = 0; /* requests already completed by sbp_comm_test are null */
    for (int i = 0; i < n; i++) left += r[i] != MPI_REQUEST_NULL;
    while (left > 0) {
        int progress = 0;
        for (int i = 0; i < n; i++) {
            if (r[i] == MPI_REQUEST_NULL) continue;
            int done = 0;
            const int rc = MPI_Test(&r[i], &done, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) return mpi_fail(c, rc, what, err);
            if (done) left--, progress = 1;
        }
        if (progress)
            last = sbp_now_seconds();
        else if (sbp_now_seconds() - last > c->timeout) {
            int p = -1;
            for (int i = 0; i < n && p < 0; i++)
                if (r[i] != MPI_REQUEST_NULL) p = peer ? peer[i] : -1;
            return sbp_fail(err, SBP_EPEER, "nothing from rank %s%d for %s in %g s",
                            p < 0 ? "(any) " : "", p < 0 ? 0 : p, what, c->timeout);
        } else {
            struct timespec ts = {0, 50000}; /* oversubscribed ranks: leave the core to others */
            nanosleep(&ts, NULL);
        }
    }
    c->waited += sbp_now_seconds() - t0;
    return SBP_OK;
}

sbp_status sbp_comm_wait_poll(sbp_comm *c, sbp_comm_poll poll, void *ctx, const char *what,
                              sbp_err *err) {
    double last = sbp_now_seconds(), t0 = last;
    int rc, progress = 0, peer = -1;
    while ((rc = poll(ctx, &progress, &peer)) > 0) {
        if (progress) {
            last = sbp_now_seconds(), progress = 0;
            continue;
        }
        if (sbp_now_seconds() - last > c->timeout)
            return sbp_fail(err, SBP_EPEER, "nothing from rank %s%d for %s in %g s",
                            peer < 0 ? "(any) " : "", peer < 0 ? 0 : peer, what, c->timeout);
        struct timespec ts = {0, 50000}; /* as wait_all: leave the core to oversubscribed ranks */
        nanosleep(&ts, NULL);
    }
    c->waited += sbp_now_seconds() - t0;
    return rc < 0 ? err->status : SBP_OK;
}

int sbp_comm_test(sbp_comm *c, int r) {
    if (!c->mpi || r < 0 || r >= c->nreq || c->req[r] == MPI_REQUEST_NULL) return 1;
    int done = 0; /* a failure shows in the wait that follows */
    return MPI_Test(&c->req[r], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done;
}

void sbp_comm_progress(sbp_comm *c) {
    if (!c->mpi) return;
    for (int i = 0; i < c->nreq && !c->test_failed; i++) {
        int done = 0; /* a failure is kept for the wait that follows (the request may be gone) */
        if (c->req[i] != MPI_REQUEST_NULL) {
            const int rc = MPI_Test(&c->req[i], &done, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) c->test_failed = rc;
        }
    }
}

sbp_status sbp_comm_wait(sbp_comm *c, int r, const char *what, sbp_err *err) {
    if (!c->mpi || r < 0 || r >= c->nreq) return SBP_OK;
    const sbp_status st = wait_all(c, &c->req[r], &c->peer[r], 1, what, err);
    if (!st && r == c->nreq - 1) c->nreq--; /* the last one added, done: its place is free again */
    return st;
}

sbp_status sbp_comm_waitall(sbp_comm *c, const char *what, sbp_err *err) {
    if (!c->mpi) return SBP_OK;
    sbp_status st = wait_all(c, c->req, c->peer, c->nreq, what, err);
    if (!st) c->nreq = 0;
    return st;
}

sbp_status sbp_comm_allgather(sbp_comm *c, void *out, const void *in, size_t bytes,
                              const char *what, sbp_err *err) {
    if (!c->mpi) {
        if (out != in) memmove(out, in, bytes);
        return SBP_OK;
    }
    if (bytes > INT_MAX) return sbp_fail(err, SBP_EUSAGE, "%s: more than 2^31 bytes", what);
    MPI_Request r;
    const int rc =
        MPI_Iallgather(in, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, what, err);
    c->bytes += (int64_t)bytes * (c->size - 1), c->messages += c->size - 1;
    return wait_all(c, &r, NULL, 1, what, err);
}

sbp_status sbp_comm_allgatherv(sbp_comm *c, void *out, const void *in, const size_t *counts,
                               const size_t *displs, const char *what, sbp_err *err) {
    if (!c->mpi) {
        if ((char *)out + displs[0] != in) memmove((char *)out + displs[0], in, counts[0]);
        return SBP_OK;
    }
    int *ic = malloc(sizeof *ic * (size_t)c->size), *id = malloc(sizeof *id * (size_t)c->size);
    sbp_status st = ic && id ? SBP_OK : sbp_fail(err, SBP_ENOMEM, "out of memory");
    for (int j = 0; !st && j < c->size; j++) {
        if (counts[j] > INT_MAX || displs[j] > INT_MAX)
            st = sbp_fail(err, SBP_EUSAGE, "%s: more than 2^31 bytes", what);
        else
            ic[j] = (int)counts[j], id[j] = (int)displs[j];
    }
    MPI_Request r;
    int rc = MPI_SUCCESS;
    if (!st)
        rc = MPI_Iallgatherv(in, ic[c->rank], MPI_BYTE, out, ic, id, MPI_BYTE, MPI_COMM_WORLD, &r);
    if (!st && rc != MPI_SUCCESS) st = mpi_fail(c, rc, what, err);
    if (!st) {
        c->bytes += (int64_t)counts[c->rank] * (c->size - 1), c->messages += c->size - 1;
        st = wait_all(c, &r, NULL, 1, what, err);
    }
    free(ic), free(id);
    return st;
}

sbp_status sbp_comm_max_u64(sbp_comm *c, uint64_t *v, int n, const char *what, sbp_err *err) {
    if (!c->mpi) return SBP_OK;
    MPI_Request r;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, what, err);
    return wait_all(c, &r, NULL, 1, what, err);
}

void sbp_comm_counters(const sbp_comm *c, int64_t *bytes, int64_t *messages) {
    *bytes = c ? c->bytes : 0, *messages = c ? c->messages : 0;
}

double sbp_comm_waited(const sbp_comm *c) {
    return c ? c->waited : 0;
}
