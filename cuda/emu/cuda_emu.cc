/* cuda_emu.cc — the SIMT emulator behind cuda_emu.h: fibers, rounds, barriers, warp operations,
 * shared memory, device memory and errors.
 *
 * How a launch runs. Blocks run one after another on the calling host thread (in the order
 * sbp_emu_set_order chose). A block of n threads gets n fibers; each fiber runs the kernel until
 * it reaches a barrier or a warp operation, where it records what it waits at and switches
 * straight to the next fiber of the round's queue (the last one switches back to the scheduler).
 * When the queue is empty every live fiber is waiting, so the scheduler can decide exactly:
 *   - a warp operation completes when every lane of its mask waits at the same operation (same
 *     call site, same kind, same mask); its lanes get their results and become runnable;
 *   - a barrier completes when all n threads wait at the same __syncthreads call site;
 *   - if neither can happen, or a participant can never arrive (it exited, or waits at a barrier
 *     while the warp operation waits for it), the block is at fault: the launch stops with a
 *     sticky cudaErrorLaunchFailure and a message naming the kernel, block, threads and sites.
 * The next round's queue is the runnable fibers in the chosen order.
 *
 * Fibers switch with a hand-written x86-64 context switch (the callee-saved registers only) or,
 * elsewhere or on request, glibc's swapcontext (a system call each: about ten times slower). Under
 * AddressSanitizer every switch is announced with
 * __sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber. Stacks are 256 KiB of lazily
 * committed memory with a guard page below, kept for reuse.
 *
 * State. The emulator is a test harness and keeps per-process state, all in one place (Process,
 * behind a mutex): the sticky and last errors and the message, the table of device allocations,
 * the dynamic shared memory opt-ins, the order, quiet flag and fiber kind, and the counters. The
 * scheduler of a host thread (its fibers and the running block) is thread-local, as are the
 * builtins threadIdx/blockIdx/blockDim/gridDim. */
#include "cuda_emu.h"

#include <errno.h>
#include <map>
#include <mutex>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define SBP_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SBP_EMU_ASAN 1
#endif
#endif
#ifndef SBP_EMU_ASAN
#define SBP_EMU_ASAN 0
#endif
#if SBP_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__) && !defined(SBP_EMU_NO_ASM)
#define SBP_EMU_HAVE_FAST 1
#else
#define SBP_EMU_HAVE_FAST 0
#endif

/* ---- the x86-64 context switch ----------------------------------------------------------------
 * sbp_emu_ctx_switch(save, load): pushes the System V callee-saved general registers on the current
 * stack, stores the stack pointer in *save, loads `load` and pops the same from there. A new
 * fiber's stack is built to look like one that called it: its "return address" is
 * sbp_emu_ctx_start, which calls the function left in r12 with a clean frame chain.
 * The MXCSR and x87 control words (rounding, FTZ/DAZ) are not switched: all fibers share the host
 * thread's floating-point environment, which kernels never change (CUDA has no way to); loading
 * them costed half of every switch. */
#if SBP_EMU_HAVE_FAST
extern "C" void sbp_emu_ctx_switch(void **save, void *load);
extern "C" void sbp_emu_ctx_start(void);
asm(R"(
    .text
    .p2align 4
    .globl sbp_emu_ctx_switch
    .hidden sbp_emu_ctx_switch
    .type sbp_emu_ctx_switch, @function
sbp_emu_ctx_switch:
    .cfi_startproc
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .cfi_endproc
    .size sbp_emu_ctx_switch, .-sbp_emu_ctx_switch

    .p2align 4
    .globl sbp_emu_ctx_start
    .hidden sbp_emu_ctx_start
    .type sbp_emu_ctx_start, @function
sbp_emu_ctx_start:
    .cfi_startproc
    .cfi_undefined rip
    xorl %ebp, %ebp
    callq *%r12
    ud2
    .cfi_endproc
    .size sbp_emu_ctx_start, .-sbp_emu_ctx_start
)");
#endif

namespace sbp_emu {

thread_local Builtins builtins;

namespace {

constexpr size_t kStackBytes = 256 << 10;
constexpr size_t kSharedLimit = 48 << 10;       /* per block without an opt-in */
constexpr size_t kSharedOptInLimit = 227 << 10; /* H100/H200's largest opt-in (A100: 163 KiB) */
constexpr unsigned kMaxThreads = 1024;
constexpr uint64_t kMaxBlocks = 1 << 24; /* the emulator's own limit: a test harness, not a GPU */

/* ---- per-process state ---- */
struct Process {
    std::mutex mu;
    cudaError_t sticky = cudaSuccess; /* a fault inside a kernel: stays until cleared */
    cudaError_t last = cudaSuccess;   /* any error: cudaGetLastError returns and clears it */
    cudaError_t message_code = cudaSuccess;
    std::string message, described;           /* the detail, and "name: detail" */
    std::map<uintptr_t, size_t> allocs;       /* cudaMalloc'd ranges: base -> bytes */
    std::map<const void *, size_t> dyn_optin; /* cudaFuncSetAttribute(MaxDynamicShared...) */
    sbp_emu_order order = SBP_EMU_FORWARD;
    uint64_t seed = 0;
    uint64_t order_launches = 0; /* launches since the order was set: salts the shuffles */
    std::string order_error;     /* a bad SBP_EMU_ORDER, reported by every launch */
    int quiet = 0;
    sbp_emu_fibers fibers = SBP_EMU_HAVE_FAST ? SBP_EMU_FIBERS_FAST : SBP_EMU_FIBERS_UCONTEXT;
    sbp_emu_stats stats = {0, 0, 0, 0};
    int launches_running = 0;
    Process() { read_environment(); }
    void read_environment();
};

/* Never destroyed: device memory still allocated at exit stays reachable (as on a GPU it is
 * released with the context, not leaked), and no static destructor races a late API call. */
Process &proc() {
    static Process *p = new Process;
    return *p;
}

void Process::read_environment() {
    const char *o = getenv("SBP_EMU_ORDER");
    if (o && *o) {
        char *end = nullptr;
        if (!strcmp(o, "forward"))
            order = SBP_EMU_FORWARD;
        else if (!strcmp(o, "reverse"))
            order = SBP_EMU_REVERSE;
        else if (!strncmp(o, "shuffle:", 8) && o[8] &&
                 (errno = 0, seed = strtoull(o + 8, &end, 0), !*end && !errno))
            order = SBP_EMU_SHUFFLE;
        else
            order_error = std::string("SBP_EMU_ORDER=") + o +
                          ": expected forward, reverse or shuffle:SEED (an unsigned integer)";
    }
    const char *f = getenv("SBP_EMU_FIBERS");
    if (f && !strcmp(f, "ucontext")) fibers = SBP_EMU_FIBERS_UCONTEXT;
}

const char *error_name(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidSymbol: return "cudaErrorInvalidSymbol";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

const char *error_string(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidSymbol: return "invalid device symbol";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    }
    return "unknown error";
}

/* Records an error (sticky for faults inside kernels) with its message; returns e. */
cudaError_t record(cudaError_t e, bool sticky, const std::string &msg) {
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    if (sticky && p.sticky == cudaSuccess) p.sticky = e;
    p.last = e;
    p.message = msg;
    p.message_code = e;
    p.described = std::string(error_string(e)) + " (cuda-emu: " + msg + ")";
    if (!p.quiet) fprintf(stderr, "cuda-emu: %s: %s\n", error_name(e), msg.c_str());
    return e;
}

std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

/* "file:line[:column]" in a fixed buffer: no heap, so it may live in a frame that a fault
 * abandons (see fault_in_fiber). */
struct Where {
    char text[512];
    const char *c_str() const { return text; }
};
Where where(const Site &s) {
    Where w;
    if (s.column)
        snprintf(w.text, sizeof w.text, "%s:%d:%d", s.file, s.line, s.column);
    else
        snprintf(w.text, sizeof w.text, "%s:%d", s.file, s.line);
    return w;
}

cudaError_t sticky_error() {
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    return p.sticky;
}

void poison(void *ptr, size_t bytes) {
    const uint32_t word = SBP_EMU_POISON;
    unsigned char *b = static_cast<unsigned char *>(ptr);
    for (size_t i = 0; i < bytes; i++) b[i] = (unsigned char)(word >> (8 * (i % 4)));
}

/* ---- fibers ---- */
enum State : uint8_t { RUNNABLE, AT_BARRIER, AT_WARP, DONE };

struct Fiber {
    /* context */
    void *sp = nullptr;       /* fast switch: the saved stack pointer */
    ucontext_t *uc = nullptr; /* ucontext switch */
    char *stack = nullptr;    /* usable stack [stack, stack + stack_bytes) */
    size_t stack_bytes = 0;
    void *asan_fake = nullptr; /* AddressSanitizer's fake stack while switched out */
    const void *asan_prev_bottom = nullptr;
    size_t asan_prev_bytes = 0;
    bool abandoned = false; /* left inside the kernel by a fault: its stack shadow is stale */
    /* the CUDA thread */
    uint3 tid = {0, 0, 0};
    unsigned linear = 0, lane = 0;
    State state = DONE;
    /* what it waits at, and the result */
    Site site = {nullptr, 0, 0};
    int op = 0; /* Barrier or WarpOp */
    unsigned mask = 0;
    int b = 0, width = 32;
    uint64_t value = 0, result = 0;
};

struct SharedArray {
    const void *key;
    void *ptr;
};

struct Sched {
    Fiber *pool = nullptr;       /* kMaxThreads fibers, contiguous (scans over them stay cheap) */
    std::vector<Fiber *> fibers; /* fibers[i] runs thread i of the block; those with a stack */
    Fiber main;                  /* the scheduler's own context (its stack is the host thread's) */
    Fiber *cur = nullptr;        /* the running fiber, or null in the scheduler */
    Fiber *prev = nullptr;       /* the context that switched to the running one */
    std::vector<Fiber *> queue;  /* this round's fibers, in order */
    size_t next = 0;
    bool fast = true;
    /* the running launch and block */
    const Launch *launch = nullptr;
    void (*body)(void *) = nullptr;
    void *ctx = nullptr;
    unsigned n = 0;
    uint3 block = {0, 0, 0};
    uint64_t launch_seq = 0;
    std::vector<SharedArray> shared;
    size_t static_bytes = 0, limit = kSharedLimit;
    void *dynamic = nullptr;
    bool failed = false;
    uint64_t rounds = 0, switches = 0;
    ~Sched();
};

thread_local Sched sched;

Sched::~Sched() {
    for (Fiber *f : fibers) {
        munmap(f->stack - getpagesize(), f->stack_bytes + getpagesize());
        delete f->uc;
    }
    delete[] pool;
    delete main.uc;
}

/* Gives the next fiber of the pool its stack; false if out of memory. */
bool add_fiber(Sched &s) {
    if (!s.pool) s.pool = new Fiber[kMaxThreads];
    Fiber *f = &s.pool[s.fibers.size()];
    size_t page = (size_t)getpagesize();
    void *m = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return false;
    mprotect(m, page, PROT_NONE); /* a guard page: an overflow faults instead of corrupting */
    f->stack = static_cast<char *>(m) + page;
    f->stack_bytes = kStackBytes;
    s.fibers.push_back(f);
    return true;
}

extern "C" void sbp_emu_fiber_main(void);

/* Makes f start the kernel from the top when next switched to. */
void reset_fiber(Sched &s, Fiber *f) {
#if SBP_EMU_ASAN
    if (f->abandoned) ASAN_UNPOISON_MEMORY_REGION(f->stack, f->stack_bytes);
#endif
    f->abandoned = false;
    f->asan_fake = nullptr;
#if SBP_EMU_HAVE_FAST
    if (s.fast) {
        uintptr_t top = ((uintptr_t)(f->stack + f->stack_bytes) & ~(uintptr_t)15) - 16;
        void **sp = reinterpret_cast<void **>(top - 56);       /* 7 words: 16-aligned after ret */
        for (int i = 0; i < 6; i++) sp[i] = nullptr;           /* r15 r14 r13 r12 rbx rbp */
        sp[3] = reinterpret_cast<void *>(&sbp_emu_fiber_main); /* r12 */
        sp[6] = reinterpret_cast<void *>(&sbp_emu_ctx_start);  /* the "return address" */
        f->sp = sp;
        return;
    }
#endif
    if (!f->uc) f->uc = new ucontext_t;
    getcontext(f->uc);
    f->uc->uc_stack.ss_sp = f->stack;
    f->uc->uc_stack.ss_size = f->stack_bytes;
    f->uc->uc_link = nullptr;
    makecontext(f->uc, sbp_emu_fiber_main, 0);
}

/* Switches from `from` to `to`; returns when `from` is switched to again (never if dying). */
void switch_to(Sched &s, Fiber *from, Fiber *to, bool dying) {
    s.switches++;
    s.prev = from;
    if (to == &s.main) {
        s.cur = nullptr;
    } else {
        s.cur = to;
        builtins.thread_idx = to->tid;
    }
#if SBP_EMU_ASAN
    __sanitizer_start_switch_fiber(dying ? nullptr : &from->asan_fake, to->stack, to->stack_bytes);
#endif
#if SBP_EMU_HAVE_FAST
    if (s.fast)
        sbp_emu_ctx_switch(&from->sp, to->sp);
    else
#endif
    {
        if (!from->uc) from->uc = new ucontext_t;
        swapcontext(from->uc, to->uc);
    }
#if SBP_EMU_ASAN
    /* back in `from`: learn the bounds of the stack we came from (the scheduler's are known only
     * this way) */
    __sanitizer_finish_switch_fiber(from->asan_fake, &from->asan_prev_bottom,
                                    &from->asan_prev_bytes);
    if (s.prev == &s.main) {
        s.main.stack = (char *)from->asan_prev_bottom;
        s.main.stack_bytes = from->asan_prev_bytes;
    }
#endif
}

/* The running fiber gives way to the next of the round (or to the scheduler). */
void yield(Sched &s, Fiber *f, bool dying) {
    Fiber *to = s.next < s.queue.size() ? s.queue[s.next++] : &s.main;
    switch_to(s, f, to, dying);
}

std::string thread_name(const Fiber *f) {
    return format("thread (%u,%u,%u)", f->tid.x, f->tid.y, f->tid.z);
}

std::string block_prefix(const Sched &s) {
    return format("kernel %s (launched at %s:%d) block (%u,%u,%u): ", s.launch->kernel,
                  s.launch->file, s.launch->line, s.block.x, s.block.y, s.block.z);
}

/* A fault found by the running fiber: record it (printf-style), leave the block, never come back.
 * The fiber's frames are abandoned, destructors unrun, so callers pass plain C values only (no
 * std::string temporaries, which would leak); the message is built and freed in a scope here. */
[[noreturn]] void fault_in_fiber(Sched &s, Fiber *f, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
[[noreturn]] void fault_in_fiber(Sched &s, Fiber *f, const char *fmt, ...) {
    {
        char what[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        record(cudaErrorLaunchFailure, true, block_prefix(s) + thread_name(f) + ": " + what);
    }
    s.failed = true;
    f->abandoned = true;
    switch_to(s, f, &s.main, true);
    abort(); /* unreachable: an abandoned fiber is never resumed */
}

/* The running fiber, or a message and exit for device code called outside a launch (a host-side
 * programming error, not a kernel fault: there is no launch to fail). */
Fiber *running(Sched &s, const char *what, const Site &site) {
    if (!s.cur) {
        fprintf(stderr, "cuda-emu: %s at %s called outside a kernel launch\n", what,
                where(site).c_str());
        abort();
    }
    return s.cur;
}

const char *op_name(int op, bool barrier) {
    if (barrier) {
        static const char *const names[] = {"__syncthreads", "__syncthreads_count",
                                            "__syncthreads_and", "__syncthreads_or"};
        return names[op];
    }
    static const char *const names[] = {"__shfl_sync",     "__shfl_up_sync", "__shfl_down_sync",
                                        "__shfl_xor_sync", "__ballot_sync",  "__all_sync",
                                        "__any_sync",      "__syncwarp"};
    return names[op];
}

bool same_site(const Site &a, const Site &b) {
    return a.line == b.line && a.column == b.column &&
           (a.file == b.file || !strcmp(a.file, b.file));
}

std::string waits_at(const Fiber *f) {
    if (f->state == AT_BARRIER)
        return format("%s at %s", op_name(f->op, true), where(f->site).c_str());
    if (f->state == AT_WARP)
        return format("%s(mask 0x%08x) at %s", op_name(f->op, false), f->mask,
                      where(f->site).c_str());
    if (f->state == DONE) return "has exited";
    return "is running";
}

/* ---- resolving a round ---- */

/* The lane's result of a completed warp operation over the lanes `mask` of the warp at `base`.
 * Shuffles follow the PTX definition of shfl.sync with CUDA's c operand for `width`. Returns
 * false (and fills why) if the lane reads a lane outside the mask, which CUDA leaves undefined. */
bool warp_result(Sched &s, Fiber *f, unsigned base, unsigned mask, std::string *why) {
    unsigned lane = f->lane;
    switch (f->op) {
    case SHFL_IDX:
    case SHFL_UP:
    case SHFL_DOWN:
    case SHFL_XOR: {
        unsigned c = ((32u - (unsigned)f->width) << 8) | (f->op == SHFL_UP ? 0u : 0x1fu);
        unsigned segmask = (c >> 8) & 0x1f, clamp = c & 0x1f, bval = (unsigned)f->b & 0x1f;
        int max_lane = (int)((lane & segmask) | (clamp & ~segmask));
        int min_lane = (int)(lane & segmask);
        int j = 0;
        bool in_range = false;
        switch (f->op) {
        case SHFL_UP: j = (int)lane - (int)bval, in_range = j >= max_lane; break;
        case SHFL_DOWN: j = (int)(lane + bval), in_range = j <= max_lane; break;
        case SHFL_XOR: j = (int)(lane ^ bval), in_range = j <= max_lane; break;
        default: j = min_lane | (int)(bval & ~segmask), in_range = j <= max_lane; break;
        }
        if (!in_range) j = (int)lane;
        if (!(mask >> j & 1)) {
            *why = format("%s %s at %s reads lane %d, which is not in the mask 0x%08x",
                          thread_name(f).c_str(), op_name(f->op, false), where(f->site).c_str(), j,
                          mask);
            return false;
        }
        f->result = s.fibers[base + (unsigned)j]->value;
        return true;
    }
    case VOTE_BALLOT:
    case VOTE_ALL:
    case VOTE_ANY: {
        unsigned ballot = 0;
        for (unsigned j = 0; j < 32; j++)
            if ((mask >> j & 1) && s.fibers[base + j]->value) ballot |= 1u << j;
        f->result = f->op == VOTE_BALLOT ? ballot
                    : f->op == VOTE_ALL  ? (ballot == mask)
                                         : (ballot != 0);
        return true;
    }
    default: f->result = 0; return true;
    }
}

/* Completes the warp operations whose participants have all arrived. Returns 1 if any completed,
 * 0 if none could, -1 after recording a fault (a participant that can never arrive). */
int resolve_warps(Sched &s, std::string *fault) {
    int progress = 0;
    for (unsigned i = 0; i < s.n; i++) {
        Fiber *f = s.fibers[i];
        if (f->state != AT_WARP) continue;
        unsigned base = i & ~31u, lanes = s.n - base < 32 ? s.n - base : 32;
        bool ready = true;
        for (unsigned j = 0; j < 32 && ready; j++) {
            if (!(f->mask >> j & 1)) continue;
            /* the message is formatted only for a fault: this loop is the emulator's hot path */
            auto who = [&] {
                return format("%s (warp %u lane %u) at %s(mask 0x%08x) at %s: lane %u ",
                              thread_name(f).c_str(), i / 32, f->lane, op_name(f->op, false),
                              f->mask, where(f->site).c_str(), j);
            };
            if (j >= lanes) {
                *fault = who() + format("does not exist (the block has %u threads)", s.n);
                return -1;
            }
            Fiber *o = s.fibers[base + j];
            if (o->state == DONE || o->state == AT_BARRIER) {
                *fault = who() + "(" + thread_name(o) + ") " + waits_at(o) +
                         (o->state == DONE ? " before reaching it" : ": they wait for each other");
                return -1;
            }
            if (o->state != AT_WARP || o->op != f->op || o->mask != f->mask ||
                !same_site(o->site, f->site))
                ready = false;
        }
        if (!ready) continue;
        /* all of the mask is here; lanes at the same site whose masks overlap this one but differ
         * mean the warp disagrees on the mask, which CUDA leaves undefined */
        for (unsigned j = 0; j < 32 && base + j < s.n; j++) {
            Fiber *o = s.fibers[base + j];
            if (o->state == AT_WARP && same_site(o->site, f->site) && o->mask != f->mask &&
                (o->mask & f->mask)) {
                *fault =
                    format("lanes disagree on the mask of %s at %s: %s (lane %u) passes "
                           "0x%08x, %s (lane %u) passes 0x%08x",
                           op_name(f->op, false), where(f->site).c_str(), thread_name(f).c_str(),
                           f->lane, f->mask, thread_name(o).c_str(), o->lane, o->mask);
                return -1;
            }
        }
        for (unsigned j = 0; j < 32; j++)
            if (f->mask >> j & 1)
                if (!warp_result(s, s.fibers[base + j], base, f->mask, fault)) return -1;
        for (unsigned j = 0; j < 32; j++)
            if (f->mask >> j & 1) s.fibers[base + j]->state = RUNNABLE;
        progress = 1;
    }
    return progress;
}

/* Completes the block's barrier if all threads wait at one call site. Returns 1 if it did, 0 if
 * the barrier is still waiting for threads that can arrive, -1 after recording a fault. */
int resolve_barrier(Sched &s, std::string *fault) {
    Fiber *first = nullptr, *done = nullptr, *elsewhere = nullptr;
    unsigned waiting = 0, live = 0;
    for (unsigned i = 0; i < s.n; i++) {
        Fiber *f = s.fibers[i];
        if (f->state == DONE) {
            if (!done) done = f;
            continue;
        }
        live++;
        if (f->state != AT_BARRIER) continue;
        waiting++;
        if (!first)
            first = f;
        else if (!elsewhere && (f->op != first->op || !same_site(f->site, first->site)))
            elsewhere = f;
    }
    if (!first) return 0;
    if (waiting < live) return 0; /* others are at warp operations: resolve_warps decides */
    if (elsewhere) {
        *fault = format("%s waits at %s, but %s waits at %s", thread_name(first).c_str(),
                        waits_at(first).c_str(), thread_name(elsewhere).c_str(),
                        waits_at(elsewhere).c_str());
        return -1;
    }
    if (done) {
        *fault =
            format("%s waits at %s, which %s never reaches: it has exited",
                   thread_name(first).c_str(), waits_at(first).c_str(), thread_name(done).c_str());
        return -1;
    }
    int count = 0;
    for (unsigned i = 0; i < s.n; i++) count += s.fibers[i]->value != 0;
    int r = first->op == BAR_COUNT ? count
            : first->op == BAR_AND ? count == (int)s.n
            : first->op == BAR_OR  ? count != 0
                                   : 0;
    for (unsigned i = 0; i < s.n; i++) {
        s.fibers[i]->result = (uint64_t)r;
        s.fibers[i]->state = RUNNABLE;
    }
    return 1;
}

uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Puts items in the chosen order; `salt` makes every (launch, block, round) a new shuffle. */
template <class T>
void order_items(std::vector<T> &v, sbp_emu_order order, uint64_t seed, uint64_t salt) {
    if (order == SBP_EMU_REVERSE) {
        for (size_t i = 0, j = v.size(); i + 1 < j; i++, j--) std::swap(v[i], v[j - 1]);
    } else if (order == SBP_EMU_SHUFFLE) {
        uint64_t state = seed ^ (salt * 0xd1342543de82ef95ull);
        for (size_t i = v.size(); i > 1; i--) std::swap(v[i - 1], v[splitmix64(&state) % i]);
    }
}

void free_shared(Sched &s) {
    for (SharedArray &a : s.shared) free(a.ptr);
    s.shared.clear();
    free(s.dynamic);
    s.dynamic = nullptr;
}

/* Runs one block to completion; false after a fault (recorded). */
bool run_block(Sched &s, uint3 block, uint64_t block_linear, sbp_emu_order order, uint64_t seed) {
    const Launch &l = *s.launch;
    s.block = block;
    builtins.block_idx = block;
    s.failed = false;
    s.static_bytes = 0;
    if (posix_memalign(&s.dynamic, 16, l.shared_bytes ? l.shared_bytes : 1)) {
        record(cudaErrorMemoryAllocation, true, block_prefix(s) + "no host memory for shared");
        return false;
    }
    poison(s.dynamic, l.shared_bytes);
    for (unsigned i = 0; i < s.n; i++) {
        Fiber *f = s.fibers[i];
        reset_fiber(s, f);
        f->linear = i;
        f->lane = i % 32;
        f->tid = uint3{i % l.block.x, i / l.block.x % l.block.y, i / (l.block.x * l.block.y)};
        f->state = RUNNABLE;
    }
    std::string fault;
    for (uint64_t round = 0;; round++) {
        s.queue.clear();
        for (unsigned i = 0; i < s.n; i++)
            if (s.fibers[i]->state == RUNNABLE) s.queue.push_back(s.fibers[i]);
        if (s.queue.empty()) {
            bool all_done = true;
            for (unsigned i = 0; i < s.n; i++) all_done = all_done && s.fibers[i]->state == DONE;
            if (all_done) break;
            int w = resolve_warps(s, &fault);
            int b = w < 0 ? -1 : resolve_barrier(s, &fault);
            if (w == 0 && b == 0) {
                /* nothing can complete: name the first waiting thread and whom it waits for */
                for (unsigned i = 0; i < s.n && fault.empty(); i++) {
                    Fiber *f = s.fibers[i];
                    if (f->state != AT_WARP) continue;
                    unsigned base = i & ~31u;
                    for (unsigned j = 0; j < 32 && fault.empty(); j++) {
                        Fiber *o = s.fibers[base + j];
                        if ((f->mask >> j & 1) && o != f &&
                            (o->op != f->op || o->mask != f->mask || !same_site(o->site, f->site)))
                            fault =
                                format("%s (lane %u) waits at %s for lane %u, which waits at %s",
                                       thread_name(f).c_str(), f->lane, waits_at(f).c_str(), j,
                                       waits_at(o).c_str());
                    }
                }
                if (fault.empty()) fault = "deadlock: no barrier or warp operation can complete";
            }
            if (!fault.empty()) {
                record(cudaErrorLaunchFailure, true, block_prefix(s) + fault);
                s.failed = true;
                break;
            }
            continue;
        }
        order_items(s.queue, order, seed,
                    s.launch_seq * 0x100000001b3ull ^ block_linear << 20 ^ round);
        s.rounds++;
        s.next = 1;
        switch_to(s, &s.main, s.queue[0], false);
        if (s.failed) break;
    }
    if (s.failed)
        for (unsigned i = 0; i < s.n; i++)
            if (s.fibers[i]->state != DONE) s.fibers[i]->abandoned = true;
    free_shared(s);
    return !s.failed;
}

} // namespace

/* A fiber's first and only frame: run the kernel, then give way for good. */
extern "C" void sbp_emu_fiber_main(void) {
    Sched &s = sched;
    Fiber *f = s.cur;
#if SBP_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &f->asan_prev_bottom, &f->asan_prev_bytes);
    if (s.prev == &s.main) {
        s.main.stack = (char *)f->asan_prev_bottom;
        s.main.stack_bytes = f->asan_prev_bytes;
    }
#endif
    s.body(s.ctx);
    f->state = DONE;
    yield(s, f, true);
    abort(); /* unreachable: a finished fiber is never resumed */
}

/* ---- device-side entry points ---- */

int barrier(Barrier kind, int pred, Site site) {
    Sched &s = sched;
    Fiber *f = running(s, op_name(kind, true), site);
    f->state = AT_BARRIER;
    f->op = kind;
    f->site = site;
    f->value = pred != 0;
    yield(s, f, false);
    return (int)f->result;
}

uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int b, int width, Site site) {
    Sched &s = sched;
    Fiber *f = running(s, op_name(op, false), site);
    if (!(mask >> f->lane & 1))
        fault_in_fiber(s, f, "%s(mask 0x%08x) at %s: the mask does not include the calling lane %u",
                       op_name(op, false), mask, where(site).c_str(), f->lane);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fault_in_fiber(s, f, "%s at %s: width %d is not a power of two from 1 to 32",
                       op_name(op, false), where(site).c_str(), width);
    f->state = AT_WARP;
    f->op = op;
    f->mask = mask;
    f->value = value;
    f->b = b;
    f->width = width;
    f->site = site;
    yield(s, f, false);
    return f->result;
}

void *shared_array(const void *key, size_t bytes, size_t align, const char *name, Site site) {
    Sched &s = sched;
    Fiber *f = running(s, "SBP_SHARED", site);
    for (SharedArray &a : s.shared)
        if (a.key == key) return a.ptr;
    if (s.static_bytes + bytes > kSharedLimit ||
        s.static_bytes + bytes + s.launch->shared_bytes > s.limit)
        fault_in_fiber(s, f,
                       "shared array %s (%zu bytes) at %s brings the block's shared memory to %zu "
                       "static + %zu dynamic bytes, over the limit of %zu (static at most %zu)",
                       name, bytes, where(site).c_str(), s.static_bytes + bytes,
                       s.launch->shared_bytes, s.limit, kSharedLimit);
    void *p = nullptr;
    if (posix_memalign(&p, align < 16 ? 16 : align, bytes ? bytes : 1))
        fault_in_fiber(s, f, "no host memory for shared array %s", name);
    poison(p, bytes);
    s.shared.push_back({key, p});
    s.static_bytes += bytes;
    return p;
}

void *dynamic_shared(void) {
    Sched &s = sched;
    running(s, "SBP_SHARED_DYN", Site{"(dynamic shared memory)", 0, 0});
    return s.dynamic;
}

/* ---- launch ---- */

void launch(const Launch &l, void (*body)(void *), void *ctx) {
    Sched &s = sched;
    Process &p = proc();
    if (s.cur)
        fault_in_fiber(s, s.cur, "launches kernel %s at %s:%d from inside a kernel (not emulated)",
                       l.kernel, l.file, l.line);
    sbp_emu_order order;
    uint64_t seed;
    std::string order_error;
    size_t optin = 0;
    {
        std::lock_guard<std::mutex> lock(p.mu);
        if (p.sticky != cudaSuccess) return; /* a faulted context runs nothing */
        order = p.order;
        seed = p.seed;
        order_error = p.order_error;
        auto it = p.dyn_optin.find(l.func);
        if (it != p.dyn_optin.end()) optin = it->second;
        s.fast = p.fibers == SBP_EMU_FIBERS_FAST;
        s.launch_seq = p.order_launches++;
    }
    std::string at = format("kernel %s launched at %s:%d", l.kernel, l.file, l.line);
    if (!order_error.empty()) {
        record(cudaErrorInvalidValue, false, at + ": " + order_error);
        return;
    }
    const dim3 &g = l.grid, &b = l.block;
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (!b.x || !b.y || !b.z || b.x > 1024 || b.y > 1024 || b.z > 64 || threads > kMaxThreads ||
        !g.x || !g.y || !g.z || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
        record(cudaErrorInvalidConfiguration, false,
               at + format(" with grid (%u,%u,%u) and block (%u,%u,%u): CUDA allows blocks of at "
                           "most 1024 threads, (1024,1024,64), and grids up to "
                           "(2^31-1,65535,65535), no dimension 0",
                           g.x, g.y, g.z, b.x, b.y, b.z));
        return;
    }
    uint64_t nblocks_total = (uint64_t)g.x * g.y * g.z;
    if (nblocks_total > kMaxBlocks) {
        record(cudaErrorLaunchOutOfResources, false,
               at + format(" with grid (%u,%u,%u): more than the emulator's %llu blocks", g.x, g.y,
                           g.z, (unsigned long long)kMaxBlocks));
        return;
    }
    size_t dyn_limit = optin ? optin : kSharedLimit;
    if (l.shared_bytes > dyn_limit) {
        record(cudaErrorInvalidValue, false,
               at + format(" with %zu bytes of dynamic shared memory: over %zu%s", l.shared_bytes,
                           dyn_limit,
                           optin ? " (its cudaFuncAttributeMaxDynamicSharedMemorySize)"
                                 : " (raise with cudaFuncSetAttribute)"));
        return;
    }
    while (s.fibers.size() < threads)
        if (!add_fiber(s)) {
            record(cudaErrorMemoryAllocation, false, at + ": no memory for fiber stacks");
            return;
        }
    {
        std::lock_guard<std::mutex> lock(p.mu);
        p.launches_running++;
    }
    s.launch = &l;
    s.body = body;
    s.ctx = ctx;
    s.n = (unsigned)threads;
    s.limit = optin ? kSharedOptInLimit : kSharedLimit;
    s.rounds = s.switches = 0;
    builtins.block_dim = b;
    builtins.grid_dim = g;
    std::vector<uint64_t> blocks(nblocks_total);
    for (size_t i = 0; i < blocks.size(); i++) blocks[i] = i;
    order_items(blocks, order, seed, s.launch_seq);
    uint64_t nblocks = 0;
    for (uint64_t i : blocks) {
        uint3 bi = {(unsigned)(i % g.x), (unsigned)(i / g.x % g.y), (unsigned)(i / g.x / g.y)};
        nblocks++;
        if (!run_block(s, bi, i, order, seed)) break;
    }
    s.launch = nullptr;
    builtins = Builtins{};
    std::lock_guard<std::mutex> lock(p.mu);
    p.launches_running--;
    p.stats.launches++;
    p.stats.blocks += nblocks;
    p.stats.rounds += s.rounds;
    p.stats.switches += s.switches;
}

cudaError_t symbol_copy(void *symbol, size_t symbol_bytes, size_t offset, void *host, size_t bytes,
                        bool to_symbol, Site site) {
    if (cudaError_t e = sticky_error()) return e;
    if (offset > symbol_bytes || bytes > symbol_bytes - offset || (!host && bytes))
        return record(cudaErrorInvalidValue, false,
                      format("cudaMemcpy%sSymbol at %s: %zu bytes at offset %zu of a %zu-byte "
                             "symbol%s",
                             to_symbol ? "To" : "From", where(site).c_str(), bytes, offset,
                             symbol_bytes, host ? "" : ", host pointer NULL"));
    if (to_symbol)
        memmove(static_cast<char *>(symbol) + offset, host, bytes);
    else
        memmove(host, static_cast<char *>(symbol) + offset, bytes);
    return cudaSuccess;
}

cudaError_t func_set_attribute(const void *func, cudaFuncAttribute attr, int value, Site site) {
    if (cudaError_t e = sticky_error()) return e;
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        (size_t)value > kSharedOptInLimit)
        return record(cudaErrorInvalidValue, false,
                      format("cudaFuncSetAttribute at %s: attribute %d value %d (only "
                             "MaxDynamicSharedMemorySize up to %zu is emulated)",
                             where(site).c_str(), (int)attr, value, kSharedOptInLimit));
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    p.dyn_optin[func] = (size_t)value;
    return cudaSuccess;
}

} // namespace sbp_emu

/* ---- runtime API ---- */

using namespace sbp_emu;

namespace {

/* Where [ptr, ptr + bytes) lies: 1 inside one device allocation, 0 outside all of them, -1
 * partly inside one (overrunning it, or starting before it). */
int device_range(Process &p, const void *ptr, size_t bytes) {
    uintptr_t a = (uintptr_t)ptr, e = a + bytes;
    auto it = p.allocs.upper_bound(a);
    if (it != p.allocs.end() && it->first < e) return -1; /* an allocation starts inside */
    if (it == p.allocs.begin()) return 0;
    --it;
    if (a >= it->first + it->second) return 0;
    return e <= it->first + it->second ? 1 : -1;
}

} // namespace

cudaError_t cudaMalloc(void **ptr, size_t bytes, const char *file, int line) {
    if (cudaError_t e = sticky_error()) return e;
    Site at{file, line, 0};
    if (!ptr)
        return record(cudaErrorInvalidValue, false,
                      std::string("cudaMalloc at ") + where(at).c_str() +
                          ": the pointer to set is NULL");
    *ptr = nullptr;
    if (!bytes) return cudaSuccess;
    void *q = nullptr;
    if (posix_memalign(&q, 256, bytes))
        return record(cudaErrorMemoryAllocation, false,
                      format("cudaMalloc at %s: %zu bytes", where(at).c_str(), bytes));
    poison(q, bytes);
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    p.allocs[(uintptr_t)q] = bytes;
    *ptr = q;
    return cudaSuccess;
}

/* Frees even in a faulted context (where CUDA would refuse), so tests that provoke faults do not
 * leak under LeakSanitizer; the sticky error is still returned. */
cudaError_t cudaFree(void *ptr, const char *file, int line) {
    if (!ptr) return sticky_error();
    Process &p = proc();
    {
        std::lock_guard<std::mutex> lock(p.mu);
        auto it = p.allocs.find((uintptr_t)ptr);
        if (it != p.allocs.end()) {
            p.allocs.erase(it);
            free(ptr);
            return p.sticky;
        }
    }
    return record(cudaErrorInvalidValue, false,
                  format("cudaFree(%p) at %s:%d: not a pointer cudaMalloc returned, or freed "
                         "already",
                         ptr, file, line));
}

cudaError_t cudaMallocHost(void **ptr, size_t bytes, const char *file, int line) {
    if (cudaError_t e = sticky_error()) return e;
    if (!ptr || !(*ptr = malloc(bytes ? bytes : 1)))
        return record(cudaErrorMemoryAllocation, false,
                      format("cudaMallocHost at %s:%d: %zu bytes", file, line, bytes));
    poison(*ptr, bytes);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr, const char *, int) {
    free(ptr);
    return sticky_error();
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                       const char *file, int line) {
    if (cudaError_t e = sticky_error()) return e;
    static const char *const kinds[] = {"HostToHost", "HostToDevice", "DeviceToHost",
                                        "DeviceToDevice", "Default"};
    if ((unsigned)kind > cudaMemcpyDefault)
        return record(cudaErrorInvalidMemcpyDirection, false,
                      format("cudaMemcpy at %s:%d: kind %d", file, line, (int)kind));
    std::string call = format("cudaMemcpy%s(dst %p, src %p, %zu bytes) at %s:%d", kinds[kind], dst,
                              src, bytes, file, line);
    if (!bytes) return cudaSuccess;
    if (!dst || !src) return record(cudaErrorInvalidValue, false, call + ": a NULL pointer");
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (d < s + bytes && s < d + bytes)
        return record(cudaErrorInvalidValue, false, call + ": the ranges overlap");
    int dd, sd;
    {
        Process &p = proc();
        std::lock_guard<std::mutex> lock(p.mu);
        dd = device_range(p, dst, bytes);
        sd = device_range(p, src, bytes);
    }
    if (dd < 0 || sd < 0)
        return record(cudaErrorInvalidValue, false,
                      call + format(": the %s range runs past the end of its cudaMalloc allocation "
                                    "(or starts before it)",
                                    dd < 0 ? "destination" : "source"));
    bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyDefault && (dd != want_dd || sd != want_sd))
        return record(cudaErrorInvalidValue, false,
                      call + format(": the destination is %s memory and the source %s memory",
                                    dd ? "device" : "host", sd ? "device" : "host"));
    memcpy(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *ptr, int value, size_t bytes, const char *file, int line) {
    if (cudaError_t e = sticky_error()) return e;
    if (!bytes) return cudaSuccess;
    int in;
    {
        Process &p = proc();
        std::lock_guard<std::mutex> lock(p.mu);
        in = device_range(p, ptr, bytes);
    }
    if (in != 1)
        return record(cudaErrorInvalidValue, false,
                      format("cudaMemset(%p, %d, %zu bytes) at %s:%d: the range is not inside one "
                             "cudaMalloc allocation",
                             ptr, value, bytes, file, line));
    memset(ptr, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    return sticky_error();
}

cudaError_t cudaDeviceReset(void) {
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    for (auto &a : p.allocs) free(reinterpret_cast<void *>(a.first));
    p.allocs.clear();
    p.dyn_optin.clear();
    p.sticky = p.last = p.message_code = cudaSuccess;
    p.message.clear();
    p.described.clear();
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    cudaError_t e = p.sticky != cudaSuccess ? p.sticky : p.last;
    p.last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) {
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    return p.sticky != cudaSuccess ? p.sticky : p.last;
}

/* For the error last recorded, the CUDA text followed by the emulator's message, so that code
 * printing cudaGetErrorString(err) shows the kernel, block, threads and sites. */
const char *cudaGetErrorString(cudaError_t error) {
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    if (error != cudaSuccess && error == p.message_code) return p.described.c_str();
    return error_string(error);
}

const char *cudaGetErrorName(cudaError_t error) {
    return error_name(error);
}

cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return record(cudaErrorInvalidValue, false, "cudaGetDeviceCount: NULL");
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (!device) return record(cudaErrorInvalidValue, false, "cudaGetDevice: NULL");
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device != 0)
        return record(cudaErrorInvalidDevice, false,
                      format("cudaSetDevice(%d): the emulator is device 0", device));
    return sticky_error();
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
    static char token;
    if (!stream) return record(cudaErrorInvalidValue, false, "cudaStreamCreate: NULL");
    *stream = reinterpret_cast<cudaStream_t>(&token);
    return sticky_error();
}

cudaError_t cudaStreamDestroy(cudaStream_t) {
    return sticky_error();
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
    return sticky_error();
}

/* ---- sbp_emu.h ---- */

extern "C" void sbp_emu_set_order(sbp_emu_order order, uint64_t seed) {
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    p.order = order;
    p.seed = seed;
    p.order_launches = 0;
    p.order_error.clear();
}

extern "C" sbp_emu_order sbp_emu_get_order(uint64_t *seed) {
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    if (seed) *seed = p.seed;
    return p.order;
}

extern "C" const char *sbp_emu_last_message(void) {
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    return p.message.c_str();
}

extern "C" void sbp_emu_clear_error(void) {
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    p.sticky = p.last = p.message_code = cudaSuccess;
    p.message.clear();
    p.described.clear();
}

extern "C" void sbp_emu_set_quiet(int quiet) {
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    p.quiet = quiet;
}

extern "C" int sbp_emu_set_fibers(sbp_emu_fibers fibers) {
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.launches_running || (fibers == SBP_EMU_FIBERS_FAST && !SBP_EMU_HAVE_FAST) ||
        (fibers != SBP_EMU_FIBERS_FAST && fibers != SBP_EMU_FIBERS_UCONTEXT))
        return -1;
    p.fibers = fibers;
    return 0;
}

extern "C" void sbp_emu_get_stats(sbp_emu_stats *stats) {
    Process &p = proc();
    std::lock_guard<std::mutex> lock(p.mu);
    *stats = p.stats;
}
