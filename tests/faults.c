/* faults.c — the faults of the distributed failure tests (tests/mpi_ranks.sh), linked into a
 * test build of the command, $(BUILD)/tests/streambp-faults, with the linker's --wrap: each call
 * the library makes to an engine entry point comes here first, and a run chosen by SBP_FAULT
 * gets a bucket hook that plants the fault before handing the bucket on. The library itself has
 * no test hook and reads no test variable.
 *
 *   SBP_FAULT=WHAT:RANK:RUN:BUCKET
 *     WHAT    kill (SIGKILL: a dead peer), stop (SIGSTOP: a silent one), nan (the bucket's first
 *             element made NaN: a non-finite gradient on one rank)
 *     RANK    the process (OMPI_COMM_WORLD_RANK, or PMIX_RANK; 0 without a launcher)
 *     RUN     the process's RUN-th engine run that hands its buckets on (one micro-batch of a
 *             distributed step: a rank of N runs n/N of a step's n), from 1
 *     BUCKET  first, middle or last of the run's buckets in completion order (the head, layers
 *             L−1 … 0, the embedding: src/dist/buckets.h), or an index from 0
 * A malformed SBP_FAULT ends the process with exit 2 before anything runs. */
#include "../src/dist/buckets.h"
#include "../src/engine/entry.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef sbp_status engine_fn(double *loss, void *grads, const sbp_model *m, const sbp_batch *b,
                             const sbp_engine_opts *o, sbp_ledger *lg, sbp_err *err);
engine_fn __real_sbp_engine_grad_f32, __real_sbp_engine_grad_f64;
engine_fn __wrap_sbp_engine_grad_f32, __wrap_sbp_engine_grad_f64;

enum { KILL, STOP, NAN_GRAD };

typedef struct {
    int what, rank, run;
    char bucket[16]; /* first | middle | last | an index */
} fault;

/* The process's fault, or 0 when SBP_FAULT is not set. */
static int fault_of(fault *f) {
    const char *s = getenv("SBP_FAULT");
    char what[8];
    int end = 0;
    if (!s) return 0;
    if (sscanf(s, "%7[a-z]:%d:%d:%15[a-z0-9]%n", what, &f->rank, &f->run, f->bucket, &end) != 4 ||
        s[end] || f->run < 1 ||
        (f->what = !strcmp(what, "kill")   ? KILL
                   : !strcmp(what, "stop") ? STOP
                   : !strcmp(what, "nan")  ? NAN_GRAD
                                           : -1) < 0) {
        fprintf(stderr, "streambp-faults: SBP_FAULT=\"%s\": want kill|stop|nan:RANK:RUN:BUCKET\n",
                s);
        exit(2);
    }
    return 1;
}

static int this_rank(void) {
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    if (!r) r = getenv("PMIX_RANK");
    return r ? atoi(r) : 0;
}

/* The bucket hook of the faulty run: bucket number `at` of the run (0 first) gets the fault,
 * then every bucket goes on to the library's hook. */
typedef struct {
    sbp_bucket_hook hook;
    void *ctx;
    int seen, at, what, f64;
} relay;

static int relay_bucket(void *ctx, int64_t off, int64_t n, const void *g) {
    relay *r = ctx;
    if (r->seen++ == r->at) {
        if (r->what == KILL) raise(SIGKILL);
        if (r->what == STOP) raise(SIGSTOP);
        if (r->what == NAN_GRAD && n > 0) { /* the engine's scratch: free to poison */
            if (r->f64)
                ((double *)g)[0] = NAN;
            else
                ((float *)g)[0] = NAN;
        }
    }
    return r->hook(r->ctx, off, n, g);
}

static sbp_status faulty(engine_fn *real, int f64, double *loss, void *grads, const sbp_model *m,
                         const sbp_batch *b, const sbp_engine_opts *o, sbp_ledger *lg,
                         sbp_err *err) {
    static int runs; /* this process's engine runs with a bucket hook */
    fault f;
    if (!o->bucket_hook || o->plan || !fault_of(&f) || f.rank != this_rank() || ++runs != f.run)
        return real(loss, grads, m, b, o, lg, err);
    const sbp_params *ps = o->lora ? &o->lora->params : &m->params;
    sbp_bucket bk[4096];
    const int nb = sbp_grad_buckets(bk, 4096, ps);
    int at = !strcmp(f.bucket, "first")    ? 0
             : !strcmp(f.bucket, "middle") ? nb / 2
             : !strcmp(f.bucket, "last")   ? nb - 1
                                           : atoi(f.bucket);
    if (nb < 1 || at < 0 || at >= nb) {
        fprintf(stderr, "streambp-faults: bucket %s of a run with %d buckets\n", f.bucket, nb);
        exit(2);
    }
    relay r = {o->bucket_hook, o->hook_ctx, 0, at, f.what, f64};
    sbp_engine_opts mine = *o;
    mine.bucket_hook = relay_bucket, mine.hook_ctx = &r;
    return real(loss, grads, m, b, &mine, lg, err);
}

sbp_status __wrap_sbp_engine_grad_f32(double *loss, void *grads, const sbp_model *m,
                                      const sbp_batch *b, const sbp_engine_opts *o, sbp_ledger *lg,
                                      sbp_err *err) {
    return faulty(__real_sbp_engine_grad_f32, 0, loss, grads, m, b, o, lg, err);
}

sbp_status __wrap_sbp_engine_grad_f64(double *loss, void *grads, const sbp_model *m,
                                      const sbp_batch *b, const sbp_engine_opts *o, sbp_ledger *lg,
                                      sbp_err *err) {
    return faulty(__real_sbp_engine_grad_f64, 1, loss, grads, m, b, o, lg, err);
}
