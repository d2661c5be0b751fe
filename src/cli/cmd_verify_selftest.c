/* cmd_verify_selftest.c — `streambp verify --self-test`: the verifier's comparisons shown able to
 * fail, on faults planted into its own inputs (verify/selftest.h); also a step of the default
 * `streambp verify`. */
#include "verify/defaults.h"
#include "verify/selftest.h"
#include "../io/file.h"
#include "cli.h"
#include "golden_data.h"
#include "cmd_verify.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: streambp verify --self-test [--json]\n"
    "\n"
    "Plants known faults into the verifier's own inputs and checks that each comparison flags\n"
    "it, on the bundled Qwen3-tiny (seed 1) and data/batches/sft-tiny.safetensors: one gradient\n"
    "element off by 4 x the fp64 budget, by 4 x the fp32 budget (the documented rule computed\n"
    "again from the oracle), by one ULP against the bitwise groups and by 4 x the ragged-chunk\n"
    "tolerance; two tensors swapped; every fp64 run given the fp32 gradient; a gradient file\n"
    "without a tensor (diff and audit); a gradient file one ULP off (its fingerprint); every\n"
    "committed golden digest with a line changed, dropped or added; and the inputs unchanged,\n"
    "where nothing may be flagged. A loosened budget or a comparison that cannot fail then fails\n"
    "here. The default `streambp verify` runs this step too (a few seconds).\n"
    "Exit status: 0 every fault flagged, 1 one was not, 2 usage or input error.\n";

/* The self-test's report as text to f (NULL: nothing), or as JSON into j (when not NULL).
 * Returns 0, EXIT_MISMATCH or EXIT_USAGE. */
int selftest_check(FILE *f, cJSON *j) {
    sbp_err err = {0};
    sbp_default_inputs def = {0};
    char data[512], batch[700], workdir[600];
    if (sbp_data_dir(data, sizeof data, &err) || sbp_default_inputs_make(&def, &err))
        return report_error("verify --self-test", &err);
    snprintf(batch, sizeof batch, "%s/batches/sft-tiny.safetensors", data);
    snprintf(workdir, sizeof workdir, "%s/streambp-selftest-XXXXXX",
             getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(workdir)) {
        fprintf(stderr, "streambp verify --self-test: cannot create %s: %s\n", workdir,
                strerror(errno));
        sbp_default_inputs_free(&def);
        return EXIT_USAGE;
    }
    /* the committed golden digests built into this binary: the texts `verify golden` compares */
    const char *text[256], *name[256];
    int n = 0;
    for (int i = 0; i < golden_n_files && n < 256; i++) {
        const char *p = golden_files[i].path;
        const size_t len = strlen(p);
        if (strncmp(p, "data/golden/", 12) != 0 || len < 4 || strcmp(p + len - 4, ".txt") != 0)
            continue;
        char *t = malloc(golden_files[i].size + 1);
        if (!t) break;
        memcpy(t, golden_files[i].data, golden_files[i].size);
        t[golden_files[i].size] = '\0';
        text[n] = t, name[n++] = p;
    }
    sbp_selftest_opts o = {.model = def.model,
                           .batch = batch,
                           .workdir = workdir,
                           .golden_text = text,
                           .golden_name = name,
                           .n_golden = n};
    sbp_selftest_report rep;
    double t0 = sbp_now_seconds();
    sbp_status st = sbp_selftest_run(&rep, &o, &err);
    double secs = sbp_now_seconds() - t0;
    for (int i = 0; i < n; i++) free((char *)text[i]);
    sbp_remove_tree(workdir); /* ours (mkdtemp), walked without following a link */
    sbp_default_inputs_free(&def);
    if (st) return report_error("verify --self-test", &err);
    if (f) {
        for (int i = 0; i < rep.n; i++) {
            const sbp_selftest_row *r = &rep.rows[i];
            fprintf(f, "  %-4s %s\n       %s: %s\n", r->ok ? "ok" : "FAIL", r->fault, r->check,
                    r->seen);
        }
        fprintf(f, "self-test: %d of %d planted faults handled as they must be, %.1f s\n",
                rep.n - rep.failed, rep.n, secs);
    }
    if (j) {
        cJSON *rows = cJSON_AddArrayToObject(j, "faults");
        for (int i = 0; i < rep.n; i++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "fault", rep.rows[i].fault);
            cJSON_AddStringToObject(x, "check", rep.rows[i].check);
            cJSON_AddStringToObject(x, "seen", rep.rows[i].seen);
            cJSON_AddBoolToObject(x, "ok", rep.rows[i].ok);
            cJSON_AddItemToArray(rows, x);
        }
        cJSON_AddBoolToObject(j, "pass", rep.failed == 0);
    }
    return rep.failed ? EXIT_MISMATCH : 0;
}

int verify_selftest(int argc, char **argv) {
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--self-test") == 0) continue;
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
            continue;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        fprintf(stderr, "streambp verify --self-test: unexpected argument \"%s\"\n%s", argv[i],
                usage);
        return EXIT_USAGE;
    }
    if (json) {
        cJSON *j = cJSON_CreateObject();
        int r = selftest_check(NULL, j);
        if (r == EXIT_USAGE) {
            cJSON_Delete(j);
            return r;
        }
        print_json(j);
        return r;
    }
    printf("self-test: faults planted into the verifier's inputs, each to be flagged\n");
    int r = selftest_check(stdout, NULL);
    if (r != EXIT_USAGE) printf("%s\n", r ? "FAIL" : "PASS");
    return r;
}
