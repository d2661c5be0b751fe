/* main.c — the `streambp` command: git-style subcommands. */
#include "cli.h"
#include "cmd_verify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *openblas_get_corename(void); /* from OpenBLAS; not in every cblas.h */

/* OpenBLAS 0.3.21 (Debian 12) does not know newer x86 models (e.g. Emerald Rapids, family 6 model
 * 207) and falls back to its generic "Prescott" SSE3 kernels, about 6x slower than the AVX-512
 * ones on the same core. The kernels are chosen when the library loads, from OPENBLAS_CORETYPE;
 * so when that is unset and OpenBLAS picked Prescott on a CPU with AVX-512 or AVX2, this sets it
 * (and the caller runs the process again). Bits of the fast numerics depend on the kernels anyway
 * (the portable numerics do not use OpenBLAS). STREAMBP_NO_CORETYPE=1 keeps OpenBLAS's choice.
 * 1 when it set the variable. */
static int fix_openblas_core(void) {
    if (getenv("OPENBLAS_CORETYPE") || getenv("STREAMBP_NO_CORETYPE")) return 0;
    if (strcmp(openblas_get_corename(), "Prescott") != 0) return 0;
    __builtin_cpu_init();
    const char *core = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                           ? "SkylakeX"
                       : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "Haswell"
                                                                                         : NULL;
    return core && setenv("OPENBLAS_CORETYPE", core, 1) == 0;
}

/* OpenMP threads (ours and OpenBLAS's) that wait at a barrier spin first: GCC's libgomp about
 * 300,000 rounds before it sleeps, LLVM's libomp (a clang build) 200 ms. Beside other busy
 * processes a spinning thread holds a core the thread it waits for needs: the tiny demo's step
 * took 1-3 s instead of 0.1 s. Sleeping at once (OMP_WAIT_POLICY=passive, the default from
 * 2026-12-06 to 12-07) costs a futex sleep and a wake-up at every barrier, which some VMs make
 * dear: on a 2-vCPU AMD Zen 3 KVM guest `verify fd` took 14.9 s (7.8 s of it in the kernel)
 * against 2.0 s spinning 1,000 rounds first. So a short spin, then sleep: GOMP_SPINCOUNT=1000
 * (libgomp's own figure for an oversubscribed machine) and KMP_BLOCKTIME=1 (ms, libomp), unless
 * the user chose (OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME);
 * docs/performance.md#threads-and-a-busy-machine. The runtimes read the variables when they load,
 * before main, so the caller runs the process again. 1 when it set them. */
static int brief_openmp_wait(void) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || getenv("KMP_BLOCKTIME")) return 0;
    return setenv("GOMP_SPINCOUNT", "1000", 1) == 0 && setenv("KMP_BLOCKTIME", "1", 1) == 0;
}

/* Sets the environment the libraries read when they load, and runs this binary again when that
 * changed anything. A failed exec runs on as we are, with the libraries' own choices. */
static void library_environment(char **argv) {
    int core = fix_openblas_core();
    int wait = brief_openmp_wait();
    if (!core && !wait) return;
    execv("/proc/self/exe", argv); /* returns only on failure */
    if (core) unsetenv("OPENBLAS_CORETYPE");
}

static const char usage[] =
    "usage: streambp <command> [options]\n"
    "\n"
    "Exact gradients of Hugging Face decoders (Qwen3, Qwen2.5, Llama-3, Gemma-3) with full BP,\n"
    "gradient checkpointing and StreamBP, bit-identical across schedules.\n"
    "\n"
    "commands:\n"
    "  grad      compute the gradient of one step and write it (safetensors, HF names)\n"
    "  init      write a seeded random model directory from a config.json\n"
    "  lora      lora init: a new LoRA adapter directory (peft's layout)\n"
    "  verify    check the schedules against each other and the float64 oracle; compare and\n"
    "            audit gradient files (verify --help)\n"
    "  plan      peak memory of a step, largest T under a budget, the paper's table\n"
    "  bench     step time, FLOP rate and memory of each schedule against the sgemm rate\n"
    "  train     AdamW training of every weight, checkpoints that resume bit for bit\n"
    "  version   print the version\n"
    "\n"
    "Run `streambp <command> --help` for the options of a command.\n"
    "Exit status: 0 success, 1 a check failed (mismatch, NaN/Inf), 2 usage or input error,\n"
    "3 a peer process failed or went silent (under mpirun).\n"
    "Threads: --threads N, else OMP_NUM_THREADS, else every core this process may use; OpenMP\n"
    "threads spin briefly, then sleep, unless OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME\n"
    "says otherwise (docs/performance.md).\n";

int main(int argc, char **argv) {
    library_environment(argv);
    if (argc < 2) {
        fputs(usage, stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    /* getopt prefixes its messages with argv[0]; make that "streambp <command>" */
    char name[64];
    snprintf(name, sizeof name, "streambp %s", cmd);
    argv[1] = name;
    if (strcmp(cmd, "grad") == 0) return cmd_grad(argc - 1, argv + 1);
    if (strcmp(cmd, "init") == 0) return cmd_init(argc - 1, argv + 1);
    if (strcmp(cmd, "lora") == 0) return cmd_lora(argc - 1, argv + 1);
    if (strcmp(cmd, "verify") == 0) return verify_main(argc - 1, argv + 1);
    if (strcmp(cmd, "plan") == 0) return cmd_plan(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return cmd_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("streambp %s\n", SBP_VERSION);
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    fprintf(stderr, "streambp: unknown command \"%s\"\n\n%s", cmd, usage);
    return EXIT_USAGE;
}
