/* cmd_lora.c — `streambp lora init`: a new LoRA adapter directory in peft's layout. */
#include "cli.h"
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: streambp lora init --model DIR --out DIR [options]\n"
    "\n"
    "Writes a new LoRA adapter for the model, as peft initialises one: lora_A Kaiming-uniform\n"
    "(seeded), lora_B zero; adapter_config.json + adapter_model.safetensors with peft's names, so\n"
    "PeftModel.from_pretrained(model, DIR) loads it. `grad --lora DIR` then computes the "
    "adapter's\n"
    "gradient (the base model frozen), `train --lora DIR` trains it.\n"
    "\n"
    "  --model DIR          the base model (for the shapes; its config.json is read)\n"
    "  --out DIR            the adapter directory to write; written in a temporary directory\n"
    "                       beside it and renamed into place (never a mix of two adapters)\n"
    "  --force              replace an adapter already in DIR (refused without it)\n"
    "  --r N                rank, 1 to 65536 (default 8)\n"
    "  --alpha X            lora_alpha (default 16); the scaling is alpha/r\n"
    "  --rslora             use_rslora: the scaling is alpha/sqrt(r)\n"
    "  --targets LIST       q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj or all-linear\n"
    "                       (default q_proj,v_proj, peft's default for these models)\n"
    "  --seed N             the generator's seed (default 1)\n"
    "  --b-std X            lora_B from N(0, X²) instead of zero: an adapter whose gradients of\n"
    "                       lora_A are not all zero (for tests and audits)\n"
    "  --precision P        fp32 | fp64 (default fp32): the dtype of the file\n";

int cmd_lora(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "init") != 0) {
        if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
            fputs(usage, stdout);
            return 0;
        }
        fputs(usage, stderr);
        return EXIT_USAGE;
    }
    static const struct option opts[] = {OPTION_MODEL,
                                         {"out", required_argument, 0, 'o'},
                                         {"r", required_argument, 0, 'r'},
                                         {"alpha", required_argument, 0, 'a'},
                                         {"rslora", no_argument, 0, 'R'},
                                         {"targets", required_argument, 0, 't'},
                                         OPTION_SEED,
                                         {"b-std", required_argument, 0, 'b'},
                                         {"precision", required_argument, 0, 'p'},
                                         {"force", no_argument, 0, 'f'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *out = NULL;
    sbp_lora_config lc = {.r = 8, .alpha = 16, .targets = SBP_LORA_Q | SBP_LORA_V};
    double b_std = 0;
    unsigned long long seed = 1;
    sbp_precision prec = SBP_FP32;
    int c, force = 0;
    common_opts co = {.cmd = "lora init", .model = &model, .seed = &seed};
    optind = 1;
    while ((c = getopt_long(argc - 1, argv + 1, "", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'r':
            if (!parse_pos_int("lora init", "r", optarg, &lc.r)) return EXIT_USAGE;
            break;
        case 'a':
            if (!parse_number("lora init", "alpha", optarg, 0, &lc.alpha) || lc.alpha == 0) {
                fprintf(stderr, "streambp lora init: --alpha must be > 0\n");
                return EXIT_USAGE;
            }
            break;
        case 'R': lc.use_rslora = 1; break;
        case 't':
            if (!sbp_lora_targets_parse(optarg, &lc.targets)) {
                fprintf(stderr,
                        "streambp lora init: --targets \"%s\": a comma-separated list of q_proj, "
                        "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or all-linear\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        case 'b':
            if (!parse_number("lora init", "b-std", optarg, 0, &b_std)) return EXIT_USAGE;
            break;
        case 'p':
            if (!parse_precision("lora init", optarg, &prec)) return EXIT_USAGE;
            break;
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
    if (!model || !out || optind < argc - 1) {
        fprintf(stderr, "streambp lora init: --model and --out are required\n%s", usage);
        return EXIT_USAGE;
    }
    static const char *const ours[] = {"adapter_config.json", "adapter_model.safetensors", NULL};
    if (!out_dir_ready("lora init", out, ours, force)) return EXIT_USAGE;
    sbp_err err = {0};
    sbp_config cfg;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", model);
    sbp_lora a;
    if (sbp_config_load(&cfg, path, &err) ||
        sbp_lora_init(&a, &cfg, &lc, (uint64_t)seed, b_std, prec, &err))
        return report_error("lora init", &err);
    sbp_outdir d;
    sbp_status st = out_dir_open(&d, out, &err);
    if (!st && (st = sbp_lora_save(d.tmp, &a, model, &err))) sbp_outdir_abort(&d);
    if (!st) st = sbp_outdir_commit(&d, &err);
    if (!st)
        printf("wrote %s: r %d, alpha %g%s, %d tensors, %lld parameters\n", out, lc.r, lc.alpha,
               lc.use_rslora ? " (rslora)" : "", a.params.n, (long long)a.params.total);
    sbp_lora_free(&a, NULL);
    return st ? report_error("lora init", &err) : 0;
}
