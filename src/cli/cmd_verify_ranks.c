/* cmd_verify_ranks.c — `mpirun -np N streambp verify --ranks N`: the data-parallel step over the
 * processes of the job (src/dist) against one process, bit for bit, on the bundled model: so an
 * installation's MPI layer is checked by the auditor too (issue 54 item 5).
 *
 * Every rank builds the bundled Qwen3-tiny (seed 1) and reads the same 12 micro-batches (the
 * fixtures tests/mpi_ranks.sh steps over); then for each configuration every rank runs the step
 * alone (no transport) and over the job's N processes — unsharded (every rank ends with the whole
 * gradient) or sharded (ZeRO-2: each its share, gathered to rank 0 into a gradient file as
 * `grad` writes it) — and compares the two: the gradients bitwise (a share against the same
 * elements of the one-process gradient), the loss's bits, and, sharded, the file's bytes against
 * the one-process file's. Every rank's verdict is gathered to rank 0, which prints the table. */
#include "../core/err.h"
#include "../dist/dist.h"
#include "../io/file.h"
#include "verify/defaults.h"
#include "cli.h"
#include "cmd_verify.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: mpirun -np N streambp verify --ranks N [--comm-timeout S]\n"
    "\n"
    "Checks the data-parallel step of this build's MPI layer (src/dist, docs/distributed.md):\n"
    "on the bundled Qwen3-tiny (seed 1) and 12 micro-batches from data/batches, every process\n"
    "runs the step alone and over the N processes of the job, and the two must agree bit for\n"
    "bit — the whole gradient on every rank (unsharded), each rank's share of it and the\n"
    "gradient file rank 0 writes from the shares (sharded, ZeRO-2, as `grad` under mpirun), and\n"
    "the loss — in the portable and fast numerics, fp32, fp64 and bf16 storage, stream, full and\n"
    "ckpt. N must be the job's process count and divide 12 (1, 2, 3, 4, 6, 12).\n"
    "\n"
    "  --ranks N         the processes of the job (mpirun -np N)\n"
    "  --comm-timeout S  end the run (exit 3) when a peer is silent for S seconds (default 600)\n"
    "Exit status: 0 every configuration is bitwise equal, 1 one differs, 2 usage or input error,\n"
    "3 a peer failed or went silent.\n";

/* The micro-batches of the step: the fixtures tests/mpi_ranks.sh runs, each a few rows of
 * T <= 32, of different T (so the ranks' micro-batches differ in shape). */
static const char *const micro[] = {"sft-tiny",
                                    "suite-chunk-starts-on-ignored",
                                    "suite-left-padding",
                                    "suite-right-padding",
                                    "suite-single-target",
                                    "suite-t22",
                                    "suite-target-from-padding-2",
                                    "suite-target-from-padding",
                                    "suite-unattended-left-pad",
                                    "suite-unequal-rows",
                                    "suite-left-padding",
                                    "sft-tiny"};
enum { N_MICRO = sizeof micro / sizeof micro[0] };

typedef struct {
    const char *what;
    sbp_precision prec;
    int bf16;
    sbp_numerics numerics;
    sbp_schedule schedule;
    int chunk, block, sharded;
} config;

static const config configs[] = {
    {"portable fp32 stream chunk 7, sharded", SBP_FP32, 0, SBP_NUMERICS_PORTABLE, SBP_STREAM, 7, 4,
     1},
    {"portable fp64 full, unsharded", SBP_FP64, 0, SBP_NUMERICS_PORTABLE, SBP_FULL, 0, 4, 0},
    {"portable bf16 ckpt, sharded", SBP_FP32, 1, SBP_NUMERICS_PORTABLE, SBP_CKPT, 0, 4, 1},
    {"fast fp32 stream chunk 8, unsharded", SBP_FP32, 0, SBP_NUMERICS_FAST, SBP_STREAM, 8, 4, 0},
    {"fast fp64 stream chunk 8, sharded", SBP_FP64, 0, SBP_NUMERICS_FAST, SBP_STREAM, 8, 4, 1},
};
enum { N_CONFIGS = sizeof configs / sizeof configs[0] };

typedef struct {
    sbp_model m32, m64, mb; /* mb: the float32 weights rounded to bf16 */
    sbp_batch b32[N_MICRO], b64[N_MICRO];
    char dir[600]; /* this rank's private directory for the files */
} inputs;

static void inputs_free(inputs *in) {
    for (int i = 0; i < N_MICRO; i++) sbp_batch_free(&in->b32[i]), sbp_batch_free(&in->b64[i]);
    sbp_model_free(&in->m32, NULL), sbp_model_free(&in->m64, NULL), sbp_model_free(&in->mb, NULL);
}

static sbp_status inputs_load(inputs *in, const char *model, sbp_err *err) {
    char data[512], path[700];
    sbp_status st = sbp_data_dir(data, sizeof data, err);
    if (!st) st = sbp_model_load(&in->m32, model, SBP_FP32, NULL, err);
    if (!st) st = sbp_model_load(&in->m64, model, SBP_FP64, NULL, err);
    if (!st) st = sbp_model_load(&in->mb, model, SBP_FP32, NULL, err);
    if (!st) sbp_model_round_bf16(&in->mb);
    for (int i = 0; i < N_MICRO && !st; i++) {
        snprintf(path, sizeof path, "%s/batches/%s.safetensors", data, micro[i]);
        st = sbp_batch_load(&in->b32[i], path, &in->m32.cfg, err);
        if (!st) st = sbp_batch_load(&in->b64[i], path, &in->m64.cfg, err);
    }
    return st;
}

/* The first tensor whose elements differ between a (the N-rank gradient, or this rank's share
 * when ranges is given: its owned ranges packed) and the one-process gradient g1; "" when none. */
static void first_diff(char *out, size_t n, const sbp_params *ps, const void *a, const void *g1,
                       size_t esz, const sbp_range *ranges, int nr) {
    out[0] = '\0';
    int64_t at = -1;
    if (!ranges) {
        for (int64_t i = 0; i < ps->total && at < 0; i++)
            if (memcmp((const char *)a + esz * (size_t)i, (const char *)g1 + esz * (size_t)i, esz))
                at = i;
    } else {
        int64_t k = 0; /* position in the packed share */
        for (int q = 0; q < nr && at < 0; q++)
            for (int64_t i = ranges[q].begin; i < ranges[q].end && at < 0; i++, k++)
                if (memcmp((const char *)a + esz * (size_t)k, (const char *)g1 + esz * (size_t)i,
                           esz))
                    at = i;
    }
    for (int t = 0; at >= 0 && t < ps->n; t++)
        if (at >= ps->p[t].offset && at < ps->p[t].offset + ps->p[t].numel) {
            snprintf(out, n, "%s, element %lld", ps->p[t].name, (long long)(at - ps->p[t].offset));
            return;
        }
}

/* Whether two files hold the same bytes (1), differ (0), or one cannot be read (-1). */
static int same_bytes(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    sbp_err err = {0};
    if (sbp_read_text(&x, &nx, a, (size_t)1 << 30, &err) ||
        sbp_read_text(&y, &ny, b, (size_t)1 << 30, &err)) {
        free(x);
        return -1;
    }
    const int same = nx == ny && memcmp(x, y, nx) == 0;
    free(x), free(y);
    return same;
}

/* One configuration on this rank: why[0] = '\0' when the N-rank step equals the one-process
 * step here. A failure of a step itself is returned (the caller ends the job). */
static sbp_status one_config(char *why, size_t wn, const config *c, inputs *in, sbp_comm *comm,
                             sbp_err *err) {
    const sbp_model *m = c->bf16 ? &in->mb : c->prec == SBP_FP64 ? &in->m64 : &in->m32;
    const sbp_batch *b = c->prec == SBP_FP64 ? in->b64 : in->b32;
    const sbp_params *ps = &m->params;
    const size_t esz = c->prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    const int rank = sbp_comm_rank(comm), N = sbp_comm_size(comm);
    sbp_grad_opts g = {.schedule = c->schedule,
                       .block = c->block,
                       .chunk = c->chunk,
                       .logit_chunk = c->chunk,
                       .numerics = c->numerics,
                       .emulate_bf16 = c->bf16};
    sbp_grad_result one, many;
    why[0] = '\0';
    sbp_status st = sbp_grad_batches(&one, m, b, N_MICRO, &g, NULL, err);
    if (st) return st;
    g.comm = comm, g.sharded = c->sharded;
    if ((st = sbp_grad_batches(&many, m, b, N_MICRO, &g, NULL, err))) {
        sbp_grad_result_free(&one, NULL);
        return st;
    }
    char diff[256] = "";
    if (memcmp(&one.loss, &many.loss, sizeof one.loss) != 0)
        snprintf(why, wn, "the loss %a, one process %a", many.loss, one.loss);
    if (!c->sharded) {
        first_diff(diff, sizeof diff, ps, many.grads, one.grads, esz, NULL, 0);
    } else {
        sbp_range *rg = NULL;
        int64_t owned = 0;
        const int nr = sbp_dist_owned(&rg, &owned, ps, N, rank);
        if (nr < 0 || owned != many.numel)
            snprintf(diff, sizeof diff, "its share has %lld elements, it owns %lld",
                     (long long)many.numel, (long long)owned);
        else
            first_diff(diff, sizeof diff, ps, many.grads, one.grads, esz, rg, nr);
        free(rg);
        /* the file rank 0 writes from the shares against the one-process file */
        char f1[700], fn[700];
        snprintf(f1, sizeof f1, "%s/one.safetensors", in->dir);
        snprintf(fn, sizeof fn, "%s/ranks.safetensors", in->dir);
        if (!st && rank == 0) st = sbp_grads_save(f1, ps, c->prec, one.grads, NULL, err);
        if (!st) st = sbp_dist_save_grads(fn, comm, ps, c->prec, many.grads, NULL, NULL, err);
        if (!st && rank == 0 && !diff[0] && !why[0] && same_bytes(fn, f1) != 1)
            snprintf(why, wn, "the gradient file rank 0 wrote differs from one process's");
        if (rank == 0) unlink(f1), unlink(fn);
    }
    if (diff[0] && !why[0]) snprintf(why, wn, "%s", diff);
    sbp_grad_result_free(&one, NULL), sbp_grad_result_free(&many, NULL);
    return st;
}

int verify_ranks(int argc, char **argv) {
    int N = 0;
    double timeout = 600;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        char *end;
        if (strcmp(a, "--ranks") == 0 && v) {
            const long x = strtol(v, &end, 10);
            if (end == v || *end || x < 1 || x > N_MICRO || N_MICRO % x) {
                fprintf(stderr,
                        "streambp verify: --ranks must divide %d (1, 2, 3, 4, 6 or 12), "
                        "not \"%s\"\n",
                        N_MICRO, v);
                return EXIT_USAGE;
            }
            N = (int)x, i++;
        } else if (strcmp(a, "--comm-timeout") == 0 && v) {
            if (!parse_comm_timeout("verify", v, &timeout)) return EXIT_USAGE;
            i++;
        } else {
            fprintf(stderr, "streambp verify --ranks: unexpected argument \"%s\"\n%s", a, usage);
            return EXIT_USAGE;
        }
    }
    if (!N) {
        fputs(usage, stderr);
        return EXIT_USAGE;
    }
    sbp_err err = {0};
    sbp_comm *comm = NULL;
    if (sbp_comm_start(&comm, timeout, &err)) return report_error("verify --ranks", &err);
    const int rank = sbp_comm_rank(comm), size = sbp_comm_size(comm);
    if (size != N) { /* every rank sees the same size: each ends alike */
        if (rank == 0)
            fprintf(stderr,
                    "streambp verify --ranks %d: this job has %d process%s: run it as mpirun -np "
                    "%d streambp verify --ranks %d%s\n",
                    N, size, size == 1 ? "" : "es", N, N,
                    sbp_comm_built() ? "" : " (and this build has no MPI: mpicc was not found)");
        sbp_comm_finish(comm);
        return EXIT_USAGE;
    }
    int rc = dist_check_args(comm, "verify", argc, argv, &err);
    if (rc) return rc;
    if (rank > 0 && !freopen("/dev/null", "w", stdout)) {
        sbp_fail(&err, SBP_EIO, "/dev/null");
        return dist_exit(comm, "verify --ranks", &err);
    }
    sbp_default_inputs def = {0};
    inputs in = {0};
    const char *tmp = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
    snprintf(in.dir, sizeof in.dir, "%s/streambp-ranks-XXXXXX", tmp);
    sbp_status st = sbp_default_inputs_make(&def, &err);
    if (!st && !mkdtemp(in.dir))
        st = sbp_fail(&err, SBP_EIO, "cannot create a directory in %s: %s", tmp, strerror(errno));
    if (!st) st = inputs_load(&in, def.model, &err);
    printf("verify --ranks %d: the step over %d processes against one process, bit for bit\n"
           "(bundled Qwen3-tiny, seed 1; %d micro-batches of T <= 32, %d a rank)\n",
           N, N, N_MICRO, N_MICRO / N);
    int failed = 0;
    for (int k = 0; k < N_CONFIGS && !st; k++) {
        char why[300];
        double t0 = sbp_now_seconds();
        if ((st = one_config(why, sizeof why, &configs[k], &in, comm, &err))) break;
        /* every rank's verdict to every rank: a difference on any rank fails */
        char *all = calloc((size_t)N, sizeof why);
        if (!all) {
            st = sbp_fail(&err, SBP_ENOMEM, "out of memory");
            break;
        }
        if (!(st = sbp_comm_allgather(comm, all, why, sizeof why, "the verdicts", &err))) {
            int bad = -1;
            for (int r = 0; r < N && bad < 0; r++)
                if (all[(size_t)r * sizeof why]) bad = r;
            failed += bad >= 0;
            printf("  %-40s %s", configs[k].what, bad < 0 ? "bitwise" : "DIFFERS");
            if (bad >= 0) printf(" on rank %d: %s", bad, all + (size_t)bad * sizeof why);
            printf(" (%.1f s)\n", sbp_now_seconds() - t0);
        }
        free(all);
    }
    inputs_free(&in);
    if (in.dir[0] && strstr(in.dir, "XXXXXX") == NULL) sbp_remove_tree(in.dir);
    sbp_default_inputs_free(&def);
    if (st) return dist_exit(comm, "verify --ranks", &err);
    printf("ranks: %d of %d configurations bitwise equal over %d processes\n%s\n",
           N_CONFIGS - failed, N_CONFIGS, N, failed ? "FAIL" : "PASS");
    fflush(stdout);
    sbp_comm_finish(comm);
    return failed ? EXIT_MISMATCH : 0;
}
