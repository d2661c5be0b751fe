/* cmd_verify_optim.c — `streambp verify optim`: the training arithmetic (verify/optim.h) checked
 * on this machine; also the default verify's last step. */
#include "verify/optim.h"
#include "cli.h"
#include "cmd_verify.h"

#include <string.h>

static const char usage[] =
    "usage: streambp verify optim\n"
    "\n"
    "Checks the training arithmetic on this machine: 6 optimizer steps through the library's\n"
    "train step (global-norm gradient clipping, AdamW with weight decay and bias correction,\n"
    "a warm-up schedule: cosine for the full weights, linear for a LoRA adapter), in float64 and\n"
    "float32, against an independent float64 oracle (ref/adamw.c: torch.optim.AdamW,\n"
    "clip_grad_norm_ and transformers' schedules as documented) given the library's gradient of\n"
    "each step. Compared after each step: the weights' change, both moments, the learning rate\n"
    "and the gradient norm; budget: relative 1e-12 (fp64), 1e-4 (fp32, measured). The model\n"
    "and batch are built in memory: no file is read or written. The default `streambp verify`\n"
    "ends with this check.\n"
    "Exit: 0 pass, 1 a difference over budget (the case, quantity, tensor and step are named).\n";

int optim_check(FILE *f) {
    sbp_optim_report rep;
    sbp_err err = {0};
    if (sbp_verify_optim(&rep, &err)) return report_error("verify optim", &err);
    int pass = 0;
    for (int i = 0; i < rep.n; i++) {
        const sbp_optim_case *c = &rep.c[i];
        pass += !c->failed;
        fprintf(f, "  %-26s %s (clip at %.3g; norms", c->name, c->failed ? "FAIL" : "PASS",
                c->max_norm);
        for (int k = 0; k < rep.steps; k++) fprintf(f, " %.3g", c->norm[k]);
        fprintf(f, ")\n");
        for (int q = 0; q < SBP_OQ_N; q++)
            fprintf(f, "    %-11s max rel diff %-9.2g budget %-6.0e %s  (worst: %s)\n",
                    sbp_optim_quantity[q], c->worst[q], c->budget,
                    c->worst[q] <= c->budget ? "ok  " : "FAIL", c->where[q]);
    }
    fprintf(f, "optim: %d/%d cases pass, %d steps each\n", pass, rep.n, rep.steps);
    return rep.failed ? EXIT_MISMATCH : 0;
}

int verify_optim(int argc, char **argv) {
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc != 1) {
        fprintf(stderr, "streambp verify optim: takes no %s, got \"%s\"\n%s",
                argv[1][0] == '-' ? "options (but --help)" : "arguments", argv[1], usage);
        return EXIT_USAGE;
    }
    printf("optimizer steps against the float64 oracle (ref/adamw.c)\n");
    int r = optim_check(stdout);
    if (r != EXIT_USAGE) printf("%s\n", r ? "FAIL" : "PASS");
    return r;
}
