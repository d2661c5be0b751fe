/* cmd_verify_fd.c — `streambp verify fd`: finite-difference spot checks in float64. */
#include "cli.h"
#include "options.h"
#include "verify/defaults.h"
#include "verify/fd.h"
#include "cmd_verify.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: streambp verify fd [--model DIR --batch FILE] [options]\n"
    "\n"
    "Checks the float64 analytic gradient against finite differences of the loss: for one random\n"
    "unit direction per tensor (and one over all parameters), the directional derivative g·u is\n"
    "compared with a central and a 4-point difference of step h. Without --model/--batch it runs\n"
    "on the bundled default (Qwen3-tiny, seed 1, data/batches/sft-demo.safetensors).\n"
    "\n"
    "  --schedule S   full | ckpt | stream (default stream)\n"
    "  --block N      token block (default 16)\n"
    "  --chunk N      stream chunk (default 32)\n"
    "  --step H       finite-difference step (default 2e-3)\n"
    "  --seed N       direction seed (default 1)\n"
    "  --tol X        pass when every 4-point relative error is <= X (default 1e-6)\n"
    "  --json         JSON instead of the table\n"
    "Exit status: 0 pass, 1 an error above --tol, 2 usage or input error.\n";

int verify_fd(int argc, char **argv) {
    static const struct option opts[] = {OPTION_MODEL,
                                         {"batch", required_argument, 0, 'b'},
                                         {"schedule", required_argument, 0, 's'},
                                         OPTION_BLOCK,
                                         OPTION_CHUNK,
                                         {"step", required_argument, 0, 'h'},
                                         {"seed", required_argument, 0, 'S'},
                                         {"tol", required_argument, 0, 't'},
                                         OPTION_JSON,
                                         {"help", no_argument, 0, 'H'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *batch = NULL;
    sbp_grad_opts g = {.schedule = SBP_STREAM, .block = 16, .chunk = 32};
    double step = 2e-3, tol = 1e-6;
    int seed = 1, json = 0, c;
    common_opts co = {
        .cmd = "verify fd", .model = &model, .block = &g.block, .chunk = &g.chunk, .json = &json};
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b': batch = optarg; break;
        case 's':
            if (!sbp_schedule_parse(optarg, &g.schedule)) {
                fprintf(stderr, "streambp verify fd: unknown schedule \"%s\"\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case 'S':
            if (!parse_pos_int("verify fd", "seed", optarg, &seed)) return EXIT_USAGE;
            break;
        case 'h':
        case 't': {
            char *end;
            double v = strtod(optarg, &end);
            if (end == optarg || *end || !(v > 0) || !isfinite(v)) {
                fprintf(stderr, "streambp verify fd: --%s must be a positive number\n",
                        c == 'h' ? "step" : "tol");
                return EXIT_USAGE;
            }
            *(c == 'h' ? &step : &tol) = v;
            break;
        }
        case 'H': fputs(usage, stdout); return 0;
        default:
            if (common_opt_code(c)) {
                if (!common_opt(&co, c, optarg)) return EXIT_USAGE;
                break;
            }
            fputs(usage, stderr);
            return EXIT_USAGE;
        }
    }
    if (optind < argc || !model != !batch) {
        fprintf(stderr, "streambp verify fd: give both --model and --batch, or neither\n%s", usage);
        return EXIT_USAGE;
    }
    sbp_err err = {0};
    sbp_default_inputs def = {0};
    if (!model) {
        if (sbp_default_inputs_make(&def, &err)) return report_error("verify fd", &err);
        model = def.model, batch = def.batch;
    }
    sbp_model m;
    sbp_batch b;
    sbp_fd_report rep = {0};
    int rc = 0;
    if (sbp_model_load(&m, model, SBP_FP64, NULL, &err)) {
        rc = report_error("verify fd", &err);
    } else {
        if (sbp_batch_load(&b, batch, &m.cfg, &err) ||
            (sbp_fd_check(&rep, &m, &b, &g, step, (uint64_t)seed, &err) && (sbp_batch_free(&b), 1)))
            rc = report_error("verify fd", &err);
        else
            sbp_batch_free(&b);
        sbp_model_free(&m, NULL);
    }
    sbp_default_inputs_free(&def);
    if (rc) return rc;
    int pass = rep.worst_four <= tol;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "step", step);
        cJSON_AddNumberToObject(o, "seed", seed);
        cJSON_AddNumberToObject(o, "loss", rep.loss);
        cJSON_AddNumberToObject(o, "worst_rel_err_four_point", rep.worst_four);
        cJSON_AddNumberToObject(o, "worst_rel_err_central", rep.worst_central);
        cJSON_AddNumberToObject(o, "tol", tol);
        cJSON_AddBoolToObject(o, "pass", pass);
        cJSON *rows = cJSON_AddArrayToObject(o, "rows");
        for (int i = 0; i < rep.n; i++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "name", rep.rows[i].name);
            cJSON_AddNumberToObject(x, "analytic", rep.rows[i].analytic);
            cJSON_AddNumberToObject(x, "central", rep.rows[i].central);
            cJSON_AddNumberToObject(x, "four_point", rep.rows[i].four_point);
            cJSON_AddNumberToObject(x, "rel_err_central", rep.rows[i].err_central);
            cJSON_AddNumberToObject(x, "rel_err_four_point", rep.rows[i].err_four);
            cJSON_AddItemToArray(rows, x);
        }
        print_json(o);
    } else {
        printf("finite differences in float64: %s schedule, step h = %g, direction seed %d, "
               "loss %.17g\n",
               sbp_schedule_name(g.schedule), step, seed, rep.loss);
        printf("%-52s %14s %14s %10s %10s\n", "direction", "g·u", "4-point", "err 4-pt",
               "err central");
        for (int i = 0; i < rep.n; i++)
            printf("%-52s %14.6e %14.6e %10.2e %10.2e\n", rep.rows[i].name, rep.rows[i].analytic,
                   rep.rows[i].four_point, rep.rows[i].err_four, rep.rows[i].err_central);
        printf("worst relative error: 4-point %.2e, central %.2e (tolerance %g on 4-point)\n%s\n",
               rep.worst_four, rep.worst_central, tol, pass ? "PASS" : "FAIL");
    }
    sbp_fd_free(&rep);
    return pass ? 0 : EXIT_MISMATCH;
}
