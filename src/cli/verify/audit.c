/* cli/verify/audit.c — `streambp verify audit`: another implementation's gradients, judged per
 * tensor against the float64 truth with a budget measured from our own run at their precision. */
#include "../cli.h"
#include "../../../verify/audit.h"
#include "verify.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: streambp verify audit --model DIR --batch FILE --grads THEIRS.safetensors [options]\n"
    "\n"
    "Judges a gradient file written by another implementation (PyTorch, JAX, a CUDA kernel) for\n"
    "the same model and batch: computes the float64 truth (the ref/ oracle), measures what our\n"
    "own run at their precision achieves against it, and passes each of their tensors when its\n"
    "relative L2 error against the truth is within slack x our error (with a floor). Tensors are\n"
    "matched by HF name; missing tensors, shape mismatches and NaN/Inf fail.\n"
    "\n"
    "  --precision-of-theirs P  fp32 | bf16 | fp64 (default fp32); bf16 is measured with our\n"
    "                           float32 engine emulating pure-bf16 training\n"
    "  --slack X                budget factor (default 4)\n"
    "  --block N                token block of our runs (default 256)\n"
    "  --no-ref                 float64 full BP as the truth (ref/ is naive: for large models)\n"
    "  --json                   JSON instead of the table\n"
    "Exit status: 0 every tensor passes, 1 one fails, 2 usage or input error.\n";

int verify_audit(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"batch", required_argument, 0, 'b'},
        {"grads", required_argument, 0, 'g'}, {"precision-of-theirs", required_argument, 0, 'p'},
        {"slack", required_argument, 0, 's'}, {"block", required_argument, 0, 'B'},
        {"no-ref", no_argument, 0, 'n'},      {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    sbp_audit_opts o = {.precision = SBP_THEIRS_FP32};
    int json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': o.model = optarg; break;
        case 'b': o.batch = optarg; break;
        case 'g': o.grads = optarg; break;
        case 'p':
            if (strcmp(optarg, "fp32") == 0)
                o.precision = SBP_THEIRS_FP32;
            else if (strcmp(optarg, "bf16") == 0)
                o.precision = SBP_THEIRS_BF16;
            else if (strcmp(optarg, "fp64") == 0)
                o.precision = SBP_THEIRS_FP64;
            else {
                fprintf(stderr,
                        "streambp verify audit: --precision-of-theirs must be fp32, bf16 "
                        "or fp64, got \"%s\"\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        case 's':
            if (!parse_number("verify audit", "slack", optarg, 1, &o.slack)) return EXIT_USAGE;
            break;
        case 'B':
            if (!parse_pos_int("verify audit", "block", optarg, &o.block)) return EXIT_USAGE;
            break;
        case 'n': o.no_ref = 1; break;
        case 'j': json = 1; break;
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return EXIT_USAGE;
        }
    }
    if (optind < argc || !o.model || !o.batch || !o.grads) {
        fprintf(stderr, "streambp verify audit: --model, --batch and --grads are required\n%s",
                usage);
        return EXIT_USAGE;
    }
    sbp_audit_report rep;
    sbp_err err = {0};
    if (sbp_audit(&rep, &o, &err)) return report_error("verify audit", &err);
    static const char *pname[] = {"fp32", "bf16 (emulated)", "fp64"};
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "grads", o.grads);
        cJSON_AddStringToObject(j, "precision_of_theirs", pname[o.precision]);
        cJSON_AddStringToObject(j, "truth", rep.truth);
        cJSON_AddNumberToObject(j, "truth_loss", rep.truth_loss);
        if (rep.their_loss[0]) cJSON_AddStringToObject(j, "their_loss", rep.their_loss);
        cJSON_AddNumberToObject(j, "slack", o.slack > 0 ? o.slack : 4);
        cJSON *rows = cJSON_AddArrayToObject(j, "rows");
        for (int i = 0; i < rep.n; i++) {
            const sbp_audit_row *r = &rep.rows[i];
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "tensor", r->name);
            cJSON_AddStringToObject(x, "verdict", sbp_audit_status_name(r->status));
            cJSON_AddNumberToObject(x, "ours_rel_l2", r->ours_rel_l2);
            cJSON_AddNumberToObject(x, "budget", r->budget);
            if (r->status <= 2) {
                cJSON_AddNumberToObject(x, "rel_l2",
                                        isfinite(r->theirs.rel_l2) ? r->theirs.rel_l2 : -1);
                cJSON_AddNumberToObject(x, "cosine",
                                        isfinite(r->theirs.cosine) ? r->theirs.cosine : -1);
                cJSON_AddNumberToObject(x, "norm_ratio",
                                        isfinite(r->theirs.norm_ratio) ? r->theirs.norm_ratio : -1);
                cJSON_AddNumberToObject(x, "max_abs",
                                        isfinite(r->theirs.max_abs) ? r->theirs.max_abs : -1);
                cJSON_AddNumberToObject(x, "nonfinite", (double)r->theirs.nonfinite_a);
            }
            cJSON_AddItemToArray(rows, x);
        }
        if (rep.extra[0]) cJSON_AddStringToObject(j, "extra_tensors", rep.extra);
        cJSON_AddBoolToObject(j, "pass", rep.failed == 0);
        print_json(j);
    } else {
        printf("audit of %s (precision %s) against the %s, slack %g\n", o.grads, pname[o.precision],
               rep.truth, o.slack > 0 ? o.slack : 4);
        printf("loss: truth %.17g, ours at their precision %.17g, theirs %s\n", rep.truth_loss,
               rep.our_loss, rep.their_loss[0] ? rep.their_loss : "(not in the file)");
        printf("%-50s %10s %10s %10s %9s %9s %9s  %s\n", "tensor", "theirs", "ours", "budget",
               "1-cos", "ratio-1", "max abs", "verdict");
        for (int i = 0; i < rep.n; i++) {
            const sbp_audit_row *r = &rep.rows[i];
            if (r->status >= 3) {
                printf("%-50s %10s %10.3g %10.3g %9s %9s %9s  %s\n", r->name, "-", r->ours_rel_l2,
                       r->budget, "", "", "", sbp_audit_status_name(r->status));
                continue;
            }
            printf("%-50s %10.3g %10.3g %10.3g %9.2g %+9.2g %9.3g  %s\n", r->name, r->theirs.rel_l2,
                   r->ours_rel_l2, r->budget, 1 - r->theirs.cosine, r->theirs.norm_ratio - 1,
                   r->theirs.max_abs, sbp_audit_status_name(r->status));
        }
        printf("(theirs, ours: relative L2 error against the truth; budget = slack x max(ours, "
               "floor))\n");
        for (int i = 0; i < rep.n; i++)
            if (rep.rows[i].status == 2)
                printf("  %s: %lld non-finite values, the first at index %lld\n", rep.rows[i].name,
                       (long long)rep.rows[i].theirs.nonfinite_a,
                       (long long)rep.rows[i].theirs.first_nonfinite_a);
        if (rep.extra[0]) printf("not in the model (ignored): %s\n", rep.extra);
        printf("%d of %d tensors pass\n%s\n", rep.n - rep.failed, rep.n,
               rep.failed ? "FAIL" : "PASS");
    }
    int failed = rep.failed;
    sbp_audit_free(&rep);
    return failed ? EXIT_MISMATCH : 0;
}
