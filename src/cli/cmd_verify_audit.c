/* cmd_verify_audit.c — `streambp verify audit`: another implementation's gradients, judged per
 * tensor against the float64 truth with a budget measured from our own run at their precision. */
#include "cli.h"
#include "objopts.h"
#include "options.h"
#include "verify/audit.h"
#include "verify/text.h"
#include "cmd_verify.h"

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
    "matched by HF name; missing tensors, shape mismatches and NaN/Inf fail. When a tensor\n"
    "fails, a diagnosis says what the failures have in common: one scale factor (a wrong\n"
    "normaliser, written as a fraction such as 19/21), the error level of a lower precision\n"
    "than claimed, some layers only, one kind of tensor only, wrapped names.\n"
    "The objective options are grad's (TRL names); the truth and our yardstick use them both.\n"
    "\n"
    "  --numerics N             fast | portable: the numerics of our own runs (default fast)\n"
    "  --lora DIR               their file holds a LoRA adapter's gradients (peft's names, the\n"
    "                           base frozen): audited against the oracle's adapter gradient\n"
    "  --unattended MODE        rows that see no key: zero (default), hf-eager (what HF's eager\n"
    "                           attention computes), hf-sdpa (HF's sdpa) (grad --help)\n"
    "  --precision-of-theirs P  fp32 | bf16 | fp64 (default fp32); bf16 is measured with our\n"
    "                           float32 engine emulating pure-bf16 training\n"
    "  --slack X                budget factor (default 4)\n"
    "  --block N                token block of our runs (default 512)\n"
    "  --no-ref                 float64 full BP as the truth (ref/ is naive: for large models)\n"
    "  --json                   JSON instead of the table\n"
    "Exit status: 0 every tensor passes, 1 one fails, 2 usage or input error.\n"
    "\n";

static const char *pname[] = {"fp32", "bf16 (emulated)", "fp64"};

/* "dpo (sigmoid, beta 0.1, label smoothing 0)": the objective the audit used */
static void objective_text(char *buf, size_t n, const sbp_audit_opts *o) {
    const sbp_objective *ob = &o->objective;
    int len = snprintf(buf, n, "%s", obj_kind_name(ob->kind));
    if (ob->kind == SBP_OBJ_DPO)
        len += snprintf(buf + len, n - len, " (%s, beta %g, label smoothing %g)", obj_loss_name(ob),
                        ob->beta, ob->label_smoothing);
    if (ob->kind == SBP_OBJ_GRPO)
        len += snprintf(buf + len, n - len, " (%s, beta %g, epsilon [%g, %g], temperature %g%s)",
                        obj_loss_name(ob), ob->beta, ob->epsilon_low, ob->epsilon_high,
                        ob->temperature ? ob->temperature : 1,
                        o->no_scale_rewards ? ", rewards not scaled" : "");
    if (o->ref_model && len < (int)n)
        snprintf(buf + len, n - len, ", reference model %s", o->ref_model);
}

static double finite_or(double x, double alt) {
    return isfinite(x) ? x : alt;
}

static void print_audit_json(const sbp_audit_report *rep, const sbp_audit_opts *o) {
    char obj[256];
    objective_text(obj, sizeof obj, o);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "grads", o->grads);
    cJSON_AddStringToObject(j, "precision_of_theirs", pname[o->precision]);
    cJSON_AddStringToObject(j, "objective", obj_kind_name(o->objective.kind));
    cJSON_AddStringToObject(j, "loss_type", obj_loss_name(&o->objective));
    cJSON_AddStringToObject(j, "objective_settings", obj);
    cJSON_AddStringToObject(j, "truth", rep->truth);
    cJSON_AddNumberToObject(j, "truth_loss", rep->truth_loss);
    cJSON_AddNumberToObject(j, "our_loss", rep->our_loss);
    if (rep->their_loss[0]) cJSON_AddStringToObject(j, "their_loss", rep->their_loss);
    cJSON_AddNumberToObject(j, "slack", o->slack > 0 ? o->slack : 4);
    if (rep->lower) cJSON_AddStringToObject(j, "lower_precision_measured", rep->lower);
    cJSON *rows = cJSON_AddArrayToObject(j, "rows");
    for (int i = 0; i < rep->n; i++) {
        const sbp_audit_row *r = &rep->rows[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "tensor", r->name);
        cJSON_AddStringToObject(x, "verdict", sbp_audit_status_name(r->status));
        cJSON_AddNumberToObject(x, "ours_rel_l2", r->ours_rel_l2);
        cJSON_AddNumberToObject(x, "budget", r->budget);
        if (rep->lower) {
            cJSON_AddNumberToObject(x, "lower_rel_l2", r->lower_rel_l2);
            cJSON_AddNumberToObject(x, "lower_budget", r->lower_budget);
        }
        if (r->status <= 2) {
            const sbp_tensor_cmp *c = &r->theirs;
            cJSON_AddNumberToObject(x, "rel_l2", finite_or(c->rel_l2, -1));
            cJSON_AddNumberToObject(x, "cosine", finite_or(c->cosine, -1));
            cJSON_AddNumberToObject(x, "norm_ratio", finite_or(c->norm_ratio, -1));
            cJSON_AddNumberToObject(x, "scale", finite_or(c->scale, 0));
            cJSON_AddNumberToObject(x, "rel_l2_rescaled", finite_or(c->rel_l2_rescaled, -1));
            cJSON_AddNumberToObject(x, "max_abs", finite_or(c->max_abs, -1));
            cJSON_AddNumberToObject(x, "nonfinite", (double)c->nonfinite_a);
        }
        cJSON_AddItemToArray(rows, x);
    }
    if (rep->extra[0]) cJSON_AddStringToObject(j, "extra_tensors", rep->extra);
    cJSON *diag = cJSON_AddArrayToObject(j, "diagnosis");
    for (int i = 0; i < rep->diag.n; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "rule", rep->diag.rule[i]);
        cJSON_AddStringToObject(x, "text", rep->diag.text[i]);
        cJSON_AddItemToArray(diag, x);
    }
    cJSON_AddNumberToObject(j, "failed", rep->failed);
    cJSON_AddBoolToObject(j, "pass", rep->failed == 0);
    print_json(j);
}

/* Every string that comes from a file (tensor names, metadata, the diagnosis built from them)
 * or from the command line goes through sbp_text_escape, so that a file cannot print a line of
 * its own (a forged PASS) or a terminal escape that hides the real verdict. */
static void print_audit_text(const sbp_audit_report *rep, const sbp_audit_opts *o) {
    char obj[256], e1[SBP_TEXT_ESCAPED], e2[SBP_TEXT_ESCAPED];
    objective_text(obj, sizeof obj, o);
    printf("audit of %s (precision %s) against the %s, slack %g\n",
           sbp_text_escape(e1, sizeof e1, o->grads), pname[o->precision], rep->truth,
           o->slack > 0 ? o->slack : 4);
    printf("objective: %s\n", sbp_text_escape(e1, sizeof e1, obj));
    printf("loss: truth %.17g, ours at their precision %.17g, theirs %s\n", rep->truth_loss,
           rep->our_loss,
           rep->their_loss[0] ? sbp_text_escape(e1, sizeof e1, rep->their_loss)
                              : "(not in the file)");
    printf("%-50s %10s %10s %10s %9s %9s %9s  %s\n", "tensor", "theirs", "ours", "budget", "1-cos",
           "ratio-1", "max abs", "verdict");
    for (int i = 0; i < rep->n; i++) {
        const sbp_audit_row *r = &rep->rows[i];
        const char *name = sbp_text_escape(e1, sizeof e1, r->name);
        if (r->status >= 3) {
            printf("%-50s %10s %10.3g %10.3g %9s %9s %9s  %s\n", name, "-", r->ours_rel_l2,
                   r->budget, "", "", "", sbp_audit_status_name(r->status));
            continue;
        }
        printf("%-50s %10.3g %10.3g %10.3g %9.2g %+9.2g %9.3g  %s\n", name, r->theirs.rel_l2,
               r->ours_rel_l2, r->budget, 1 - r->theirs.cosine, r->theirs.norm_ratio - 1,
               r->theirs.max_abs, sbp_audit_status_name(r->status));
    }
    printf("(theirs, ours: relative L2 error against the truth; budget = slack x max(ours, "
           "floor))\n");
    for (int i = 0; i < rep->n; i++)
        if (rep->rows[i].status == 2)
            printf("  %s: %lld non-finite values, the first at index %lld\n",
                   sbp_text_escape(e1, sizeof e1, rep->rows[i].name),
                   (long long)rep->rows[i].theirs.nonfinite_a,
                   (long long)rep->rows[i].theirs.first_nonfinite_a);
    if (rep->extra[0])
        printf("not in the model (ignored): %s\n", sbp_text_escape(e1, sizeof e1, rep->extra));
    if (rep->diag.n) printf("diagnosis:\n");
    for (int i = 0; i < rep->diag.n; i++)
        printf("  - %s\n", sbp_text_escape(e2, sizeof e2, rep->diag.text[i]));
    printf("%d of %d tensors pass\n%s\n", rep->n - rep->failed, rep->n,
           rep->failed ? "FAIL" : "PASS");
}

int verify_audit(int argc, char **argv) {
    static const struct option opts[] = {OPTION_MODEL,
                                         {"batch", required_argument, 0, 'b'},
                                         {"grads", required_argument, 0, 'g'},
                                         {"precision-of-theirs", required_argument, 0, 'p'},
                                         OPTION_NUMERICS,
                                         OPTION_UNATTENDED,
                                         {"lora", required_argument, 0, 'L'},
                                         {"slack", required_argument, 0, 's'},
                                         OPTION_BLOCK,
                                         {"no-ref", no_argument, 0, 'n'},
                                         OPTION_JSON,
                                         {"help", no_argument, 0, 'h'},
                                         OBJ_LONG_OPTIONS,
                                         {0, 0, 0, 0}};
    sbp_audit_opts o = {.precision = SBP_THEIRS_FP32};
    obj_args oa;
    obj_args_init(&oa);
    int json = 0, c;
    common_opts co = {.cmd = "verify audit",
                      .model = &o.model,
                      .numerics = &o.numerics,
                      .unattended = &o.unattended,
                      .block = &o.block,
                      .json = &json};
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
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
        case 'n': o.no_ref = 1; break;
        case 'L': o.lora = optarg; break;
        case 'h': printf("%s%s", usage, obj_usage); return 0;
        default:
            if (common_opt_code(c)) {
                if (!common_opt(&co, c, optarg)) return EXIT_USAGE;
                break;
            }
            if (c >= OBJ_OPT_OBJECTIVE && c <= OBJ_OPT_REF_MODEL) {
                if (!obj_args_option(&oa, "verify audit", c, optarg)) return EXIT_USAGE;
                break;
            }
            fputs(usage, stderr);
            return EXIT_USAGE;
        }
    }
    if (optind < argc || !o.model || !o.batch || !o.grads) {
        fprintf(stderr, "streambp verify audit: --model, --batch and --grads are required\n%s",
                usage);
        return EXIT_USAGE;
    }
    if (!obj_args_finish(&oa, "verify audit")) return EXIT_USAGE;
    o.objective = oa.obj, o.no_scale_rewards = !oa.scale_rewards, o.ref_model = oa.ref_model;
    sbp_audit_report rep;
    sbp_err err = {0};
    if (sbp_audit(&rep, &o, &err)) return report_error("verify audit", &err);
    if (json)
        print_audit_json(&rep, &o);
    else
        print_audit_text(&rep, &o);
    int failed = rep.failed;
    sbp_audit_free(&rep);
    return failed ? EXIT_MISMATCH : 0;
}
