/* cmd_init.c — `streambp init`: a seeded random model directory from a config.json. */
#include "cli.h"
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: streambp init --config FILE --out DIR [--seed N] [--force]\n"
    "\n"
    "Writes DIR/config.json and DIR/model.safetensors (F32, HF names) for the model described by\n"
    "FILE, with weights drawn from a seeded generator: matrices ~ N(0, initializer_range), norm\n"
    "weights 1 + 0.1 N(0,1) (Gemma-3, whose norms scale by 1 + w: w = 0.1 N(0,1)), biases\n"
    "0.1 N(0,1). The same seed gives the same bytes everywhere.\n"
    "\n"
    "  --config FILE   a HF config.json (qwen3, qwen2, llama, gemma3_text, or gemma3: its\n"
    "                  text model)\n"
    "  --out DIR       output directory (created if missing); written in a temporary directory\n"
    "                  beside it and renamed into place, so it never holds a mix of two models\n"
    "  --seed N        seed, default 0\n"
    "  --force         replace a model already in DIR (without it, an existing config.json or\n"
    "                  model.safetensors is refused); a DIR holding other files is refused\n";

int cmd_init(int argc, char **argv) {
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'}, {"out", required_argument, 0, 'o'}, OPTION_SEED,
        {"force", no_argument, 0, 'f'},        {"help", no_argument, 0, 'h'},      {0, 0, 0, 0}};
    const char *config = NULL, *out = NULL;
    unsigned long long seed = 0;
    int c, force = 0;
    common_opts co = {.cmd = "init", .seed = &seed};
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config = optarg; break;
        case 'o': out = optarg; break;
        case 'f': force = 1; break;
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
    if (optind < argc || !config || !out) {
        fprintf(stderr, "streambp init: --config and --out are required\n%s", usage);
        return EXIT_USAGE;
    }
    if (!out[0]) {
        fprintf(stderr, "streambp init: --out is empty; give a directory name\n");
        return EXIT_USAGE;
    }
    static const char *const ours[] = {"config.json", "model.safetensors", NULL};
    if (!out_dir_ready("init", out, ours, force)) return EXIT_USAGE;
    sbp_config cfg;
    sbp_err err = {0};
    sbp_outdir d;
    if (sbp_config_load(&cfg, config, &err) || out_dir_open(&d, out, &err))
        return report_error("init", &err);
    if (sbp_model_init(&cfg, seed, d.tmp, &err)) {
        sbp_outdir_abort(&d);
        return report_error("init", &err);
    }
    if (sbp_outdir_commit(&d, &err)) return report_error("init", &err);
    printf("wrote %s/config.json and %s/model.safetensors (%s, seed %llu)\n", out, out,
           cfg.model_type, seed);
    return 0;
}
