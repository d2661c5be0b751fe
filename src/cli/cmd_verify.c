/* cmd_verify.c — `streambp verify <what>`: dispatch to the verifier's subcommands. */
#include "cli.h"
#include "cmd_verify.h"

#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: streambp verify [options]            the full check (streambp verify --help)\n"
    "       streambp verify <command> [options]\n"
    "\n"
    "  diff A B    compare two gradient files tensor by tensor (HF names)\n"
    "  fd          finite-difference spot checks of the float64 gradient\n"
    "  audit       judge another implementation's gradient file against the float64 truth\n"
    "  digest F    the fingerprint of a gradient file (SHA-256 per tensor, the loss in hex)\n"
    "  golden      the committed golden cases recomputed here, against their digests\n"
    "  optim       optimizer steps (clipping, AdamW, schedule) against a float64 oracle\n"
    "  reach       the paths the bundled model does not take (fast tiles, windows, T = 300,\n"
    "              V = 1100, rows with no key, reference models, LoRA) against the oracle\n"
    "  --suite     the edge-case fixtures, each through the full check\n"
    "  --self-test faults planted into the verifier's own inputs, each to be flagged\n"
    "  --ranks N   under mpirun -np N: the data-parallel step against one process, bitwise\n";

int verify_main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "diff") == 0) return verify_diff(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "fd") == 0) return verify_fd(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "audit") == 0) return verify_audit(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "digest") == 0) return verify_digest(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "golden") == 0) return verify_golden(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "optim") == 0) return verify_optim(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "reach") == 0) return verify_reach(argc - 1, argv + 1);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--suite") == 0) return verify_suite(argc, argv);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--self-test") == 0) return verify_selftest(argc, argv);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--ranks") == 0) return verify_ranks(argc, argv);
    if (argc < 2 || argv[1][0] == '-') return verify_run(argc, argv);
    if (strcmp(argv[1], "help") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    fputs(usage, stderr);
    return EXIT_USAGE;
}
