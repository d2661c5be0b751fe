/* cmd_verify_diff.c — `streambp verify diff A B`: two gradient files compared by HF name. */
#include "cli.h"
#include "options.h"
#include "verify/diff.h"
#include "verify/text.h"
#include "cmd_verify.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: streambp verify diff A.safetensors B.safetensors [options]\n"
    "\n"
    "Compares every tensor of A against the reference B, matched by name: missing and extra\n"
    "tensors, shape mismatches and NaN/Inf in A are failures; for the rest the promise below must\n"
    "hold. Prints one row per tensor: bitwise equality, max ULP distance (in the coarser dtype),\n"
    "max abs error, relative L2 error ‖A−B‖/‖B‖, 1 − cosine and ‖A‖/‖B‖ − 1 (cosine alone cannot\n"
    "see a scale error), the verdict; then the first differing index of each failure.\n"
    "Gradients may be F64, F32, BF16 or F16. When a tensor fails, a diagnosis with B as the\n"
    "reference says what the failures have in common (one scale factor, a lower precision's\n"
    "error level, some layers or kinds of tensor only: see `streambp verify audit --help`).\n"
    "\n"
    "promise (several may be given; all must hold; default --rel-l2 1e-5):\n"
    "  --bitwise        identical dtype and bytes\n"
    "  --ulp N          max ULP distance <= N\n"
    "  --rtol R         every element: |A−B| <= atol + R·|B|   (default atol 0)\n"
    "  --atol A\n"
    "  --rel-l2 X       ‖A−B‖/‖B‖ <= X per tensor\n"
    "output:\n"
    "  --json           one JSON object instead of the table\n"
    "  --failures-only  print only the rows that fail\n"
    "Exit status: 0 every tensor passes, 1 at least one fails, 2 usage or unreadable file.\n";

static int parse_double(const char *opt, const char *text, double *out) {
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || !(v >= 0) || !isfinite(v)) {
        fprintf(stderr, "streambp verify diff: --%s must be a non-negative number, got \"%s\"\n",
                opt, text);
        return 0;
    }
    *out = v;
    return 1;
}

/* Names, metadata and paths are escaped (sbp_text_escape) so that a file cannot forge a line
 * of the report or hide one with a terminal escape. */
static void print_row(const sbp_diff_row *r) {
    const sbp_tensor_cmp *c = &r->cmp;
    char dt[24], name[SBP_TEXT_ESCAPED];
    sbp_text_escape(name, sizeof name, r->name);
    snprintf(dt, sizeof dt, "%s/%s", sbp_dtype_name(r->dtype_a), sbp_dtype_name(r->dtype_b));
    if (r->status == SBP_ROW_MISSING || r->status == SBP_ROW_EXTRA) {
        printf("%-52s %-9s %-7s %s\n", name, "", "", sbp_row_status_name(r->status));
        return;
    }
    if (r->status == SBP_ROW_SHAPE) {
        printf("%-52s %-9s shape %s vs %s  SHAPE\n", name, dt, r->shape_a, r->shape_b);
        return;
    }
    printf("%-52s %-9s %-7s %9.3g %9.3g %9.3g %9.2g %+9.2g  %s\n", name, dt,
           c->bitwise ? "yes" : "no", c->max_ulp, c->max_abs, c->rel_l2, 1 - c->cosine,
           c->norm_ratio - 1, sbp_row_status_name(r->status));
}

static void print_details(const sbp_diff_row *r) {
    const sbp_tensor_cmp *c = &r->cmp;
    char name[SBP_TEXT_ESCAPED];
    sbp_text_escape(name, sizeof name, r->name);
    if (r->status == SBP_ROW_MISSING)
        printf("  %s: in B, missing from A\n", name);
    else if (r->status == SBP_ROW_EXTRA)
        printf("  %s: in A, not in B\n", name);
    else if (r->status == SBP_ROW_SHAPE)
        printf("  %s: shape %s in A, %s in B\n", name, r->shape_a, r->shape_b);
    else if (r->status == SBP_ROW_NONFINITE)
        printf("  %s: %lld non-finite values in A, the first at index %lld\n", name,
               (long long)c->nonfinite_a, (long long)c->first_nonfinite_a);
    else if (c->first_diff >= 0)
        printf("  %s: first difference at index %lld: A = %.17g, B = %.17g; max abs %.3g at %lld\n",
               name, (long long)c->first_diff, r->a_at_first, r->b_at_first, c->max_abs,
               (long long)c->max_abs_at);
    if (c->nonfinite_b)
        printf("  %s: note: the reference B has %lld non-finite values (first at %lld)\n", name,
               (long long)c->nonfinite_b, (long long)c->first_nonfinite_b);
}

static void print_diff_json(const sbp_diff *d, const char *a, const char *b) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "a", a);
    cJSON_AddStringToObject(o, "b", b);
    if (d->loss_a[0]) cJSON_AddStringToObject(o, "loss_a", d->loss_a);
    if (d->loss_b[0]) cJSON_AddStringToObject(o, "loss_b", d->loss_b);
    cJSON_AddNumberToObject(o, "tensors", d->n);
    cJSON_AddNumberToObject(o, "bitwise_equal", d->n_bitwise);
    cJSON_AddNumberToObject(o, "failed", d->n_failed);
    cJSON *rows = cJSON_AddArrayToObject(o, "rows");
    for (int i = 0; i < d->n; i++) {
        const sbp_diff_row *r = &d->rows[i];
        const sbp_tensor_cmp *c = &r->cmp;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", r->name);
        cJSON_AddStringToObject(x, "verdict", sbp_row_status_name(r->status));
        if (r->status != SBP_ROW_MISSING && r->status != SBP_ROW_EXTRA) {
            cJSON_AddStringToObject(x, "dtype_a", sbp_dtype_name(r->dtype_a));
            cJSON_AddStringToObject(x, "dtype_b", sbp_dtype_name(r->dtype_b));
        }
        if (r->status == SBP_ROW_OK || r->status == SBP_ROW_MISMATCH ||
            r->status == SBP_ROW_NONFINITE) {
            cJSON_AddBoolToObject(x, "bitwise", c->bitwise);
            cJSON_AddNumberToObject(x, "max_ulp", c->max_ulp);
            cJSON_AddNumberToObject(x, "max_abs", isfinite(c->max_abs) ? c->max_abs : -1);
            cJSON_AddNumberToObject(x, "rel_l2", isfinite(c->rel_l2) ? c->rel_l2 : -1);
            cJSON_AddNumberToObject(x, "cosine", isfinite(c->cosine) ? c->cosine : -1);
            cJSON_AddNumberToObject(x, "norm_ratio", isfinite(c->norm_ratio) ? c->norm_ratio : -1);
            cJSON_AddNumberToObject(x, "scale", isfinite(c->scale) ? c->scale : 0);
            cJSON_AddNumberToObject(x, "rel_l2_rescaled",
                                    isfinite(c->rel_l2_rescaled) ? c->rel_l2_rescaled : -1);
            cJSON_AddNumberToObject(x, "first_diff", (double)c->first_diff);
            cJSON_AddNumberToObject(x, "nonfinite_a", (double)c->nonfinite_a);
            cJSON_AddNumberToObject(x, "first_nonfinite_a", (double)c->first_nonfinite_a);
        }
        cJSON_AddItemToArray(rows, x);
    }
    cJSON *diag = cJSON_AddArrayToObject(o, "diagnosis");
    for (int i = 0; i < d->diag.n; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "rule", d->diag.rule[i]);
        cJSON_AddStringToObject(x, "text", d->diag.text[i]);
        cJSON_AddItemToArray(diag, x);
    }
    print_json(o);
}

int verify_diff(int argc, char **argv) {
    static const struct option opts[] = {{"bitwise", no_argument, 0, 'b'},
                                         {"ulp", required_argument, 0, 'u'},
                                         {"rtol", required_argument, 0, 'r'},
                                         {"atol", required_argument, 0, 'a'},
                                         {"rel-l2", required_argument, 0, 'l'},
                                         OPTION_JSON,
                                         {"failures-only", no_argument, 0, 'f'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    sbp_promise p = {0};
    int json = 0, failures_only = 0, c;
    common_opts co = {.cmd = "verify diff", .json = &json};
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b': p.bitwise = 1; break;
        case 'u':
            if (!parse_double("ulp", optarg, &p.ulp)) return EXIT_USAGE;
            p.use_ulp = 1;
            break;
        case 'r':
            if (!parse_double("rtol", optarg, &p.rtol)) return EXIT_USAGE;
            p.use_allclose = 1;
            break;
        case 'a':
            if (!parse_double("atol", optarg, &p.atol)) return EXIT_USAGE;
            p.use_allclose = 1;
            break;
        case 'l':
            if (!parse_double("rel-l2", optarg, &p.rel_l2)) return EXIT_USAGE;
            p.use_rel_l2 = 1;
            break;
        case 'f': failures_only = 1; break;
        case 'h': fputs(usage, stdout); return 0;
        default:
            if (common_opt_code(c)) {
                if (!common_opt(&co, c, optarg)) return EXIT_USAGE;
                break;
            }
            fputs(usage, stderr);
            return EXIT_USAGE;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "streambp verify diff: expected two gradient files\n%s", usage);
        return EXIT_USAGE;
    }
    if (!p.bitwise && !p.use_ulp && !p.use_allclose && !p.use_rel_l2)
        p.use_rel_l2 = 1, p.rel_l2 = 1e-5;
    const char *a = argv[optind], *b = argv[optind + 1];
    sbp_diff d;
    sbp_err err = {0};
    if (sbp_diff_files(&d, a, b, &p, &err)) return report_error("verify diff", &err);
    if (json) {
        print_diff_json(&d, a, b);
    } else {
        char e1[SBP_TEXT_ESCAPED], e2[SBP_TEXT_ESCAPED];
        printf("A = %s\nB = %s (reference)\n", sbp_text_escape(e1, sizeof e1, a),
               sbp_text_escape(e2, sizeof e2, b));
        if (d.loss_a[0] || d.loss_b[0])
            printf("loss: A %s, B %s\n",
                   d.loss_a[0] ? sbp_text_escape(e1, sizeof e1, d.loss_a) : "-",
                   d.loss_b[0] ? sbp_text_escape(e2, sizeof e2, d.loss_b) : "-");
        printf("%-52s %-9s %-7s %9s %9s %9s %9s %9s  %s\n", "tensor", "dtype", "bitwise", "max ULP",
               "max abs", "rel L2", "1-cos", "ratio-1", "verdict");
        for (int i = 0; i < d.n; i++)
            if (!failures_only || d.rows[i].status != SBP_ROW_OK) print_row(&d.rows[i]);
        for (int i = 0; i < d.n; i++)
            if (d.rows[i].status != SBP_ROW_OK) print_details(&d.rows[i]);
        if (d.diag.n) printf("diagnosis (B taken as the reference):\n");
        for (int i = 0; i < d.diag.n; i++)
            printf("  - %s\n", sbp_text_escape(e1, sizeof e1, d.diag.text[i]));
        printf("%d tensors: %d bitwise equal, %d failed; promise:", d.n, d.n_bitwise, d.n_failed);
        if (p.bitwise) printf(" bitwise");
        if (p.use_ulp) printf(" max ULP <= %g", p.ulp);
        if (p.use_allclose) printf(" |A-B| <= %g + %g|B|", p.atol, p.rtol);
        if (p.use_rel_l2) printf(" rel L2 <= %g", p.rel_l2);
        printf("\n%s\n", d.n_failed ? "FAIL" : "PASS");
    }
    int failed = d.n_failed;
    sbp_diff_free(&d);
    return failed ? EXIT_MISMATCH : 0;
}
