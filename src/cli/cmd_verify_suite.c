/* cmd_verify_suite.c — `streambp verify --suite`: every edge-case fixture through the full matrix.
 */
#include "cli.h"
#include "options.h"
#include "verify/defaults.h"
#include "verify/suite.h"
#include "cmd_verify.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: streambp verify --suite [--case NAME] [--list] [--json]\n"
    "\n"
    "Runs the edge-case fixtures, each through the whole verification matrix (every schedule,\n"
    "block-multiple and ragged chunks, fp32 and fp64, 1 and 2 threads, against the ref/\n"
    "oracle), and prints one line per case. The cases target the places where chunked backprop\n"
    "goes wrong: chunk boundaries (T not divisible, chunk 1, T, > T, a chunk starting on a -100\n"
    "label), padding (left, right, holes, a target predicted from a pad), batches with empty or\n"
    "unequal rows and a single target, GQA 1:1, 2:1, 4:1, tied embeddings, Qwen3's head_dim,\n"
    "Qwen2's biases, llama3 RoPE scaling; every DPO and GRPO loss type, temperatures and clip\n"
    "ranges, reference models, a config relying on a default, micro-batches of different T, and\n"
    "float32 at positions near 20000. Each feature is on at least two fixtures.\n"
    "Gemma-3 (sliding-window and global layers, (1 + w) norms, GeGLU): a window shorter than\n"
    "a chunk (gemma3-window-lt-chunk), longer than T (gemma3-window-over-T), equal to the key\n"
    "tile (gemma3-window-is-tile), left padding inside the window (gemma3-left-pad-window), DPO\n"
    "(gemma3-dpo) and GRPO (gemma3-grpo).\n"
    "\n"
    "  --case NAME   run one case (see --list)\n"
    "  --list        list the cases\n"
    "  --json        JSON instead of the table\n"
    "Exit status: 0 every case passes, 1 one fails, 2 usage or input error.\n";

static const char reach_usage[] =
    "usage: streambp verify reach [--case NAME] [--list] [--json]\n"
    "\n"
    "The reach cases, each through the verification matrix against the ref/ oracle: the code the\n"
    "bundled model and batch do not take. The fast numerics' attention at key tiles with a\n"
    "ragged last tile (a tail shorter than a vector) and one kv head (its two-pass backward),\n"
    "and a Gemma-3 window across key tiles and chunks, at T = 300 (three token blocks of the\n"
    "portable sums) and V = 1100 (three vocabulary blocks); rows that see no key in HF's eager\n"
    "and sdpa modes; a reference model's log-probs; a LoRA adapter. The default\n"
    "`streambp verify` runs this step too.\n"
    "\n"
    "  --case NAME   run one case (see --list)\n"
    "  --list        list the cases\n"
    "  --json        JSON instead of the table\n"
    "Exit status: 0 every case passes, 1 one fails, 2 usage or input error.\n";

/* The suite's or the reach step's cases, from the command line. */
static int run_cases(int reach, int argc, char **argv) {
    static const struct option opts[] = {
        {"suite", no_argument, 0, 'S'}, {"case", required_argument, 0, 'c'},
        {"list", no_argument, 0, 'l'},  OPTION_JSON,
        {"help", no_argument, 0, 'h'},  {0, 0, 0, 0}};
    int only = -1, json = 0, c;
    const char *cmd = reach ? "verify reach" : "verify --suite";
    const int count = reach ? sbp_reach_count() : sbp_suite_count();
    const sbp_suite_case *(*at)(int) = reach ? sbp_reach_case_at : sbp_suite_case_at;
    common_opts co = {.cmd = cmd, .json = &json};
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'S':
            if (reach) {
                fputs(reach_usage, stderr);
                return EXIT_USAGE;
            }
            break;
        case 'c':
            for (int i = 0; i < count && only < 0; i++)
                if (strcmp(at(i)->name, optarg) == 0) only = i;
            if (only < 0) {
                fprintf(stderr, "streambp %s: no case \"%s\" (see --list)\n", cmd, optarg);
                return EXIT_USAGE;
            }
            break;
        case 'l':
            for (int i = 0; i < count; i++) printf("%-26s %s\n", at(i)->name, at(i)->what);
            return 0;
        case 'h': fputs(reach ? reach_usage : usage, stdout); return 0;
        default:
            if (common_opt_code(c)) {
                if (!common_opt(&co, c, optarg)) return EXIT_USAGE;
                break;
            }
            fputs(reach ? reach_usage : usage, stderr);
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "streambp %s: unexpected argument \"%s\"\n", cmd, argv[optind]);
        return EXIT_USAGE;
    }
    if (json) {
        cJSON *j = cJSON_CreateObject();
        int rc = cases_check(NULL, j, reach, only);
        if (rc == EXIT_USAGE) {
            cJSON_Delete(j);
            return rc;
        }
        print_json(j);
        return rc;
    }
    return cases_check(stdout, NULL, reach, only);
}

int verify_suite(int argc, char **argv) {
    return run_cases(0, argc, argv);
}

int verify_reach(int argc, char **argv) {
    return run_cases(1, argc, argv);
}

int cases_check(FILE *f, cJSON *j, int reach, int only) {
    const char *cmd = reach ? "verify reach" : "verify --suite";
    const int count = reach ? sbp_reach_count() : sbp_suite_count();
    const sbp_suite_case *(*at)(int) = reach ? sbp_reach_case_at : sbp_suite_case_at;
    sbp_err err = {0};
    char data[512], workdir[600];
    if (sbp_data_dir(data, sizeof data, &err)) return report_error(cmd, &err);
    snprintf(workdir, sizeof workdir, "%s/streambp-suite-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(workdir)) {
        fprintf(stderr, "streambp %s: cannot create a temporary directory\n", cmd);
        return EXIT_USAGE;
    }
    cJSON *jcases = cJSON_CreateArray();
    int failed = 0, ran = 0, rc = 0;
    double t_all = sbp_now_seconds();
    if (f)
        fprintf(f, "%-26s %-12s %-36s %5s %6s  %s\n", "case", "model", "batch", "runs", "time",
                "verdict");
    for (int i = 0; i < count; i++) {
        if (only >= 0 && i != only) continue;
        const sbp_suite_case *k = at(i);
        sbp_verify_report rep;
        double t0 = sbp_now_seconds();
        if (sbp_suite_run_case(&rep, k, data, workdir, &err)) {
            rc = report_error(cmd, &err);
            break;
        }
        double secs = sbp_now_seconds() - t0;
        ran++;
        failed += rep.failed > 0;
        char why[400] = "";
        for (int gi = 0; gi < SBP_VG_N; gi++)
            if (rep.g[gi].failed)
                snprintf(why + strlen(why), sizeof why - strlen(why), " %.40s: %d tensors",
                         rep.g[gi].title, rep.g[gi].failed);
        if (rep.load_notes[0])
            snprintf(why + strlen(why), sizeof why - strlen(why),
                     " (inputs read differently: %.200s)", rep.load_notes);
        if (j) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "case", k->name);
            cJSON_AddStringToObject(x, "what", k->what);
            cJSON_AddStringToObject(x, "model", k->model);
            cJSON_AddStringToObject(x, "batch", k->batch);
            cJSON_AddNumberToObject(x, "runs", rep.n_runs);
            cJSON_AddNumberToObject(x, "seconds", secs);
            cJSON_AddBoolToObject(x, "pass", rep.failed == 0);
            cJSON *ft = cJSON_AddObjectToObject(x, "failed_tensors"); /* by group */
            for (int gi = 0; gi < SBP_VG_N; gi++) {
                if (!rep.g[gi].failed) continue;
                cJSON *names = cJSON_AddArrayToObject(ft, rep.g[gi].title);
                for (int r = 0; r < rep.g[gi].n_rows; r++)
                    if (rep.g[gi].rows[r].failed)
                        cJSON_AddItemToArray(names, cJSON_CreateString(rep.g[gi].rows[r].name));
            }
            if (rep.load_notes[0]) cJSON_AddStringToObject(x, "loading_notes", rep.load_notes);
            cJSON_AddItemToArray(jcases, x);
        }
        if (f)
            fprintf(f, "%-26s %-12s %-36s %5d %5.1fs  %s%s\n", k->name, k->model, k->batch,
                    rep.n_runs, secs, rep.failed ? "FAIL" : "ok", why);
        sbp_verify_report_free(&rep);
    }
    sbp_remove_tree(workdir); /* ours (mkdtemp), walked without following a link */
    if (rc) {
        cJSON_Delete(jcases);
        return rc;
    }
    if (j) {
        cJSON_AddItemToObject(j, "cases", jcases);
        cJSON_AddNumberToObject(j, "failed", failed);
        cJSON_AddBoolToObject(j, "pass", failed == 0);
    } else {
        cJSON_Delete(jcases);
    }
    if (f)
        fprintf(f,
                "%s: %d cases, %d failed, %.1f s (streambp verify --model DIR --batch FILE shows "
                "the per-tensor tables of any case)\n%s\n",
                reach ? "reach" : "suite", ran, failed, sbp_now_seconds() - t_all,
                failed ? "FAIL" : "PASS");
    return failed ? EXIT_MISMATCH : 0;
}
