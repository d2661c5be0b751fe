/* sbp_emu.h — control of the SIMT emulator (cuda/emu): the order in which it runs threads and
 * blocks, its error messages, and counters. Plain C, so the C side of the project (a
 * `--device cuda-emu` option) can call it; cuda_emu.h includes it for the kernels' C++ side.
 *
 * The emulator is a test harness: it runs each block's threads as cooperative fibers on one host
 * thread, one block after another, and reports every misuse it can see (a barrier not reached by
 * every thread, a warp operation whose mask does not match, shared memory over the limit, a bad
 * cudaMemcpy) as a CUDA error with a message that names the kernel, block, threads and call site.
 */
#ifndef SBP_EMU_H
#define SBP_EMU_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Order in which runnable threads are resumed, at block start and after every barrier or warp
 * operation (a "round"), and the order in which the blocks of a grid run:
 *   SBP_EMU_FORWARD  ascending linear thread index x + y·Dx + z·Dx·Dy, blocks ascending (default)
 *   SBP_EMU_REVERSE  descending
 *   SBP_EMU_SHUFFLE  a fresh seeded permutation in every round (and of the blocks), reproducible:
 *                    it depends only on the seed, the number of launches since the order was set,
 *                    the block and the round.
 * A kernel without races gives the same bits in every order; a race between two barriers shows
 * up as a bitwise difference between two orders. The environment variable
 * SBP_EMU_ORDER=forward|reverse|shuffle:SEED sets the order the process starts with (a value that
 * does not parse makes every launch fail with cudaErrorInvalidValue and says why). */
typedef enum { SBP_EMU_FORWARD = 0, SBP_EMU_REVERSE = 1, SBP_EMU_SHUFFLE = 2 } sbp_emu_order;
void sbp_emu_set_order(sbp_emu_order order, uint64_t seed);
sbp_emu_order sbp_emu_get_order(uint64_t *seed);

/* The message of the most recent error: for a fault inside a kernel, "kernel NAME (launched at
 * FILE:LINE) block (x,y,z): ..." with the threads and the call site FILE:LINE:COL at fault; for an
 * API misuse, the call and its site. "" when no error has been recorded since the last clear. */
const char *sbp_emu_last_message(void);

/* Clears the sticky error, the last error and the message (device memory stays allocated).
 * cudaDeviceReset() also frees every allocation. */
void sbp_emu_clear_error(void);

/* Every recorded error is also printed to stderr ("cuda-emu: ..."), unless quiet is set
 * (tests that provoke errors on purpose set it). */
void sbp_emu_set_quiet(int quiet);

/* How fibers switch: SBP_EMU_FIBERS_FAST, a hand-written x86-64 context switch (a few ns), or
 * SBP_EMU_FIBERS_UCONTEXT, glibc's swapcontext (about 0.3 µs, a system call per switch; the only
 * choice on other machines). Returns 0, or -1 if the choice is not available here or a launch is
 * running. SBP_EMU_FIBERS=ucontext in the environment selects the fallback at start. */
typedef enum { SBP_EMU_FIBERS_FAST = 0, SBP_EMU_FIBERS_UCONTEXT = 1 } sbp_emu_fibers;
int sbp_emu_set_fibers(sbp_emu_fibers fibers);

/* Totals since the process started: launches run, blocks run, rounds (one pass over the runnable
 * threads of a block) and fiber switches. */
typedef struct {
    uint64_t launches, blocks, rounds, switches;
} sbp_emu_stats;
void sbp_emu_get_stats(sbp_emu_stats *stats);

#ifdef __cplusplus
}
#endif

#endif
