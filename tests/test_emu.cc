/* test_emu.cc — the SIMT emulator (cuda/emu) on the kernels of cuda/emu/tests.
 *
 * Correct kernels: each result is compared bit for bit against a host computation written from
 * CUDA's documented semantics (not from the emulator's code), in every fiber order (forward,
 * reverse, two shuffles) and with both fiber switches (fast, ucontext): the loop index _i picks
 * order _i % 4 and switch _i / 4.
 * Broken kernels: each must fail its launch with a sticky cudaErrorLaunchFailure whose message
 * names the kernel, the block, the thread and the call site; a race must show up as a bitwise
 * difference between two orders. Under SAN=1, out-of-bounds shared and global accesses must be
 * AddressSanitizer reports (run in a child process: `test_emu --child NAME`).
 * `test_emu --bench [fast|ucontext]` prints the emulator's speed instead of testing. */
#include "../cuda/emu/tests/emu_kernels.h"
#include "../cuda/sbp_cuda.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

static const char *const kOrderNames[] = {"forward", "reverse", "shuffle:1", "shuffle:2"};

/* Loop index -> order and fiber switch; starts from a reset device (no error, allocation or
 * shared memory opt-in left by an earlier test when Check does not fork). */
static const char *setup(int i) {
    cudaDeviceReset();
    sbp_emu_set_quiet(0);
    static const sbp_emu_order orders[] = {SBP_EMU_FORWARD, SBP_EMU_REVERSE, SBP_EMU_SHUFFLE,
                                           SBP_EMU_SHUFFLE};
    sbp_emu_set_order(orders[i % 4], i % 4 == 3 ? 2 : 1);
    if (sbp_emu_set_fibers(i / 4 ? SBP_EMU_FIBERS_UCONTEXT : SBP_EMU_FIBERS_FAST)) {
#if defined(__x86_64__) && !defined(SBP_EMU_NO_ASM)
        ck_abort_msg("fiber switch %d not available", i / 4);
#else
        ck_assert_int_eq(sbp_emu_set_fibers(SBP_EMU_FIBERS_UCONTEXT), 0); /* the only one here */
#endif
    }
    static char name[64];
    snprintf(name, sizeof name, "order %s, %s fibers", kOrderNames[i % 4],
             i / 4 ? "ucontext" : "fast");
    return name;
}

/* A device buffer of n elements, freed at scope exit. */
template <class T> struct Dev {
    T *p = nullptr;
    size_t n;
    explicit Dev(size_t count) : n(count) {
        ck_assert_int_eq(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    }
    Dev(const std::vector<T> &v) : Dev(v.size()) {
        ck_assert_int_eq(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice),
                         cudaSuccess);
    }
    ~Dev() { cudaFree(p); }
    std::vector<T> get() const {
        std::vector<T> v(n);
        ck_assert_int_eq(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost),
                         cudaSuccess);
        return v;
    }
};

static void launched(const char *what) {
    cudaError_t e = cudaGetLastError();
    ck_assert_msg(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
}

/* Bitwise equality of two arrays; names the first difference. */
template <class T>
static void same_bits(const std::vector<T> &got, const std::vector<T> &want, const char *what,
                      const char *how) {
    ck_assert_uint_eq(got.size(), want.size());
    for (size_t i = 0; i < got.size(); i++)
        ck_assert_msg(!memcmp(&got[i], &want[i], sizeof(T)), "%s (%s): element %zu differs", what,
                      how, i);
}

static uint64_t rng_state;
static uint32_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
/* Uniform in [-1, 1), with a spread of exponents so that sums round. */
static std::vector<float> random_floats(size_t n, uint64_t seed) {
    rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
    std::vector<float> v(n);
    for (float &x : v)
        x = ((float)(rng() % 2000001) - 1000000.0f) / 1000000.0f * (float)(1 + rng() % 1000);
    return v;
}

/* ---- correct kernels ---- */

START_TEST(block_sum) {
    const char *how = setup(_i);
    const int n = 1000; /* 4 blocks, the last one padded with zeros */
    std::vector<float> x = random_floats(n, 1), want(4);
    for (int b = 0; b < 4; b++) {
        float s[256];
        for (int t = 0; t < 256; t++) s[t] = b * 256 + t < n ? x[b * 256 + t] : 0.0f;
        for (int h = 128; h > 0; h >>= 1)
            for (int t = 0; t < h; t++) s[t] = s[t] + s[t + h];
        want[b] = s[0];
    }
    Dev<float> dx(x), out(4);
    emu_block_sum(out.p, dx.p, n);
    launched("block_sum");
    same_bits(out.get(), want, "block sum", how);
}
END_TEST

START_TEST(warp_ops) {
    const char *how = setup(_i);
    const int n = 768; /* 6 blocks of 4 warps */
    static const int widths[] = {32, 16, 8, 4, 2, 1};
    std::vector<float> x = random_floats(n, 2);
    std::vector<int> src(n), width(n);
    for (int i = 0; i < n; i++) {
        src[i] = (int)(rng() % 120) - 40; /* out of [0, width) too: taken modulo width */
        width[i] = widths[(i / 32) % 6];  /* one width per warp */
    }
    std::vector<float> down(n), bfly(n), scan(n), idx(n), xorw(n);
    for (int w = 0; w < n; w += 32) {
        float d[32], b[32], s[32];
        for (int l = 0; l < 32; l++) d[l] = b[l] = s[l] = x[w + l];
        for (int o = 16; o > 0; o >>= 1) { /* lanes past the end read their own value */
            float nd[32], nb[32];
            for (int l = 0; l < 32; l++) nd[l] = d[l] + (l + o < 32 ? d[l + o] : d[l]);
            for (int l = 0; l < 32; l++) nb[l] = b[l] + b[l ^ o];
            memcpy(d, nd, sizeof d);
            memcpy(b, nb, sizeof b);
        }
        for (int o = 1; o < 16; o <<= 1) { /* segments of 16: lanes below o keep their value */
            float ns[32];
            for (int l = 0; l < 32; l++) ns[l] = l % 16 >= o ? s[l] + s[l - o] : s[l];
            memcpy(s, ns, sizeof s);
        }
        for (int l = 0; l < 32; l++) {
            int i = w + l, wd = width[i];
            down[i] = d[l];
            bfly[i] = b[l];
            scan[i] = s[l];
            idx[i] = x[w + l / wd * wd + ((src[i] % wd) + wd) % wd];
            int j = l ^ 5; /* width 4: a later group of 4 gives the caller's own value */
            xorw[i] = j / 4 > l / 4 ? x[i] : x[w + j];
        }
    }
    Dev<float> dx(x), ddown(n), dbfly(n), dscan(n), didx(n), dxorw(n);
    Dev<int> dsrc(src), dwidth(width);
    emu_warp_ops(ddown.p, dbfly.p, dscan.p, didx.p, dxorw.p, dx.p, dsrc.p, dwidth.p, n);
    launched("warp_ops");
    same_bits(ddown.get(), down, "__shfl_down_sync tree", how);
    same_bits(dbfly.get(), bfly, "__shfl_xor_sync butterfly", how);
    same_bits(dscan.get(), scan, "__shfl_up_sync scan, width 16", how);
    same_bits(didx.get(), idx, "__shfl_sync with source lanes and widths", how);
    same_bits(dxorw.get(), xorw, "__shfl_xor_sync with width 4", how);
}
END_TEST

START_TEST(votes) {
    const char *how = setup(_i);
    const int n = 192;
    std::vector<int> p(n);
    rng_state = 3;
    for (int i = 0; i < n; i++) p[i] = (int)(rng() % 3) - 1; /* -1, 0, 1: any nonzero is true */
    for (int i = 0; i < 32; i++) p[64 + i] = 1;              /* an all-true warp */
    for (int i = 0; i < 64; i++) p[128 + i] = 0;             /* an all-false block */
    std::vector<unsigned> ballot(n), half(n);
    std::vector<int> all(n), any(n), count(n), band(n), bor(n);
    for (int w = 0; w < n; w += 32) {
        unsigned m = 0;
        for (int l = 0; l < 32; l++) m |= (p[w + l] != 0) << l;
        for (int l = 0; l < 32; l++) {
            ballot[w + l] = m;
            all[w + l] = m == 0xffffffffu;
            any[w + l] = m != 0;
            half[w + l] = m & (l < 16 ? 0x0000ffffu : 0xffff0000u);
        }
    }
    for (int b = 0; b < n; b += 64) {
        int c = 0;
        for (int t = 0; t < 64; t++) c += p[b + t] != 0;
        for (int t = 0; t < 64; t++) count[b + t] = c, band[b + t] = c == 64, bor[b + t] = c > 0;
    }
    Dev<int> dp(p), dall(n), dany(n), dcount(n), dband(n), dbor(n);
    Dev<unsigned> dballot(n), dhalf(n);
    emu_votes(dballot.p, dall.p, dany.p, dhalf.p, dcount.p, dband.p, dbor.p, dp.p, n);
    launched("votes");
    same_bits(dballot.get(), ballot, "__ballot_sync", how);
    same_bits(dall.get(), all, "__all_sync", how);
    same_bits(dany.get(), any, "__any_sync", how);
    same_bits(dhalf.get(), half, "__ballot_sync on half warps", how);
    same_bits(dcount.get(), count, "__syncthreads_count", how);
    same_bits(dband.get(), band, "__syncthreads_and", how);
    same_bits(dbor.get(), bor, "__syncthreads_or", how);
}
END_TEST

START_TEST(matmul) {
    const char *how = setup(_i);
    const int M = 37, N = 29, K = 45; /* none a multiple of the 16-wide tile */
    std::vector<float> A = random_floats((size_t)M * K, 4), B = random_floats((size_t)K * N, 5);
    std::vector<float> C((size_t)M * N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc = fmaf(A[i * K + k], B[k * N + j], acc);
            C[i * N + j] = acc;
        }
    Dev<float> dA(A), dB(B), dC((size_t)M * N);
    emu_matmul(dC.p, dA.p, dB.p, M, N, K);
    launched("matmul");
    same_bits(dC.get(), C, "tiled matmul", how);
}
END_TEST

START_TEST(dynamic_shared) {
    const char *how = setup(_i);
    const int n = 384, bs = 96;
    std::vector<float> x = random_floats(n, 6), want(n);
    for (int i = 0; i < n; i++) want[i] = x[i / bs * bs + bs - 1 - i % bs];
    Dev<float> dx(x), out(n);
    emu_reverse_dynamic(out.p, dx.p, n, bs);
    launched("reverse_dynamic");
    same_bits(out.get(), want, "dynamic shared memory", how);
}
END_TEST

START_TEST(layout3d) {
    const char *how = setup(_i);
    std::vector<int> want(6 * 64 * 4);
    for (int b = 0; b < 6; b++)
        for (int z = 0; z < 2; z++)
            for (int y = 0; y < 4; y++)
                for (int x = 0; x < 8; x++) {
                    int linear = x + 8 * y + 32 * z, g = b * 64 + linear;
                    want[4 * g + 0] = b % 2 + 10 * (b / 2);
                    want[4 * g + 1] = linear % 32;
                    want[4 * g + 2] = linear ^ 1;
                    want[4 * g + 3] = x + 100 * y + 10000 * z;
                }
    Dev<int> out(want.size());
    emu_layout3d(out.p);
    launched("layout3d");
    same_bits(out.get(), want, "3-D block coordinates and warps", how);
}
END_TEST

START_TEST(no_contraction) {
    const char *how = setup(_i);
    /* a = b = 1 + 2^-12 and c = -(1 + 2^-11): a·b = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11, so
     * a·b + c is 0 in two roundings and 2^-24 fused; then random values */
    const int n = 256;
    std::vector<float> a = random_floats(n, 7), b = random_floats(n, 8), c = random_floats(n, 9);
    a[0] = b[0] = 1.0f + ldexpf(1.0f, -12);
    c[0] = -(1.0f + ldexpf(1.0f, -11));
    std::vector<float> two(n), fused(n);
    for (int i = 0; i < n; i++) {
        volatile float prod = a[i] * b[i];
        two[i] = prod + c[i];
        fused[i] = fmaf(a[i], b[i], c[i]);
    }
    ck_assert_msg(two[0] == 0.0f && fused[0] == ldexpf(1.0f, -24), "the host reference fused");
    Dev<float> da(a), db(b), dc(c), dout(n), dfused(n);
    emu_mul_add(dout.p, dfused.p, da.p, db.p, dc.p, n);
    launched("mul_add");
    same_bits(dout.get(), two, "a*b + c is two roundings (no contraction)", how);
    same_bits(dfused.get(), fused, "fmaf", how);
}
END_TEST

START_TEST(poisoned_memory) {
    setup(_i);
    Dev<float> out(64);
    std::vector<uint32_t> bits(64);
    memcpy(bits.data(), out.get().data(), 64 * 4); /* fresh cudaMalloc memory */
    for (int i = 0; i < 64; i++) ck_assert_uint_eq(bits[i], SBP_EMU_POISON);
    std::vector<float> zeros(64, 0.0f);
    ck_assert_int_eq(cudaMemcpy(out.p, zeros.data(), 256, cudaMemcpyDefault), cudaSuccess);
    emu_read_uninit_shared(out.p);
    launched("read_uninit_shared");
    std::vector<float> got = out.get();
    memcpy(bits.data(), got.data(), 64 * 4);
    for (int i = 0; i < 64; i++) {
        ck_assert_uint_eq(bits[i], SBP_EMU_POISON);
        ck_assert(isnan(got[i]));
    }
    double d;
    uint64_t two = ((uint64_t)SBP_EMU_POISON << 32) | SBP_EMU_POISON;
    memcpy(&d, &two, 8);
    ck_assert(isnan(d));
}
END_TEST

/* ---- races: the two-order comparison ---- */

START_TEST(race_shows_between_orders) {
    setup(_i); /* here only the fiber switch of _i matters: the test sets the orders itself */
    std::vector<float> x = random_floats(64, 10), want(64), racy[5], fixed[5];
    for (int t = 0; t < 64; t++) want[t] = x[(t + 1) % 64];
    Dev<float> dx(x), out(64);
    Dev<int> last(1);
    int writer[5];
    /* forward, reverse, shuffle:1, shuffle:2, shuffle:1 again */
    static const sbp_emu_order orders[] = {SBP_EMU_FORWARD, SBP_EMU_REVERSE, SBP_EMU_SHUFFLE,
                                           SBP_EMU_SHUFFLE, SBP_EMU_SHUFFLE};
    static const uint64_t seeds[] = {0, 0, 1, 2, 1};
    for (int o = 0; o < 5; o++) {
        sbp_emu_set_order(orders[o], seeds[o]);
        emu_neighbor_racy(out.p, dx.p);
        launched("neighbor_racy");
        racy[o] = out.get();
        emu_neighbor_fixed(out.p, dx.p);
        launched("neighbor_fixed");
        fixed[o] = out.get();
        emu_last_writer(last.p);
        launched("last_writer");
        writer[o] = last.get()[0];
        same_bits(fixed[o], want, "the fixed kernel", kOrderNames[o < 4 ? o : 2]);
    }
    for (int o = 1; o < 4; o++)
        for (int p = 0; p < o; p++)
            ck_assert_msg(memcmp(racy[o].data(), racy[p].data(), 64 * 4),
                          "the racy kernel gave the same bits in orders %s and %s", kOrderNames[p],
                          kOrderNames[o]);
    same_bits(racy[4], racy[2], "shuffle:1 set twice", "reproducible");
    /* forward: thread t reads s[t + 1] before thread t + 1 wrote it: the poison */
    uint32_t bits;
    memcpy(&bits, &racy[0][0], 4);
    ck_assert_uint_eq(bits, SBP_EMU_POISON);
    /* between blocks: the last block to run wins */
    ck_assert_int_eq(writer[0], 7);
    ck_assert_int_eq(writer[1], 0);
    ck_assert_int_eq(writer[4], writer[2]);
}
END_TEST

/* ---- faults ---- */

/* Runs a broken kernel and checks the error is sticky and the message names the kernel, block
 * (0,0,0), the file and each fragment. */
static void expect_fault(void (*bad)(float *), const char *kernel,
                         std::vector<const char *> fragments, const char *how) {
    sbp_emu_set_quiet(1);
    Dev<float> out(64);
    bad(out.p);
    ck_assert_msg(cudaGetLastError() == cudaErrorLaunchFailure, "%s (%s): no fault reported",
                  kernel, how);
    std::string m = sbp_emu_last_message();
    fragments.push_back(kernel);
    fragments.push_back("block (0,0,0)");
    fragments.push_back("emu_bad_kernels.cu:");
    for (const char *f : fragments)
        ck_assert_msg(m.find(f) != std::string::npos, "%s (%s): message lacks \"%s\": %s", kernel,
                      how, f, m.c_str());
    /* sticky: every later call reports it, and a launch runs nothing */
    ck_assert_int_eq(cudaGetLastError(), cudaErrorLaunchFailure);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    ck_assert_msg(strstr(cudaGetErrorString(cudaErrorLaunchFailure), kernel),
                  "cudaGetErrorString does not carry the message");
    float *p = nullptr;
    ck_assert_int_eq(cudaMalloc(&p, 4), cudaErrorLaunchFailure);
    sbp_emu_clear_error();
    ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
    ck_assert_str_eq(sbp_emu_last_message(), "");
    /* the emulator still works after a fault (the abandoned fibers are reusable) */
    std::vector<float> x = random_floats(64, 11), want(64);
    for (int t = 0; t < 64; t++) want[t] = x[(t + 1) % 64];
    Dev<float> dx(x), dout(64);
    emu_neighbor_fixed(dout.p, dx.p);
    launched("neighbor_fixed after a fault");
    same_bits(dout.get(), want, "a kernel after a fault", how);
}

START_TEST(fault_skipped_barrier) {
    const char *how = setup(_i);
    expect_fault(bad_skip_barrier, "kernel skip_barrier_kernel",
                 {"waits at __syncthreads at", "thread (5,0,0) never reaches: it has exited"}, how);
}
END_TEST

START_TEST(fault_split_barrier) {
    const char *how = setup(_i);
    expect_fault(bad_split_barrier, "kernel split_barrier_kernel",
                 {"waits at __syncthreads at", ", but thread ("}, how);
}
END_TEST

START_TEST(fault_mask_excludes_lane) {
    const char *how = setup(_i);
    expect_fault(bad_mask_excludes_lane, "kernel mask_excludes_lane_kernel",
                 {"__shfl_down_sync(mask 0x0000ffff)", "does not include the calling lane"}, how);
}
END_TEST

START_TEST(fault_exited_lane) {
    const char *how = setup(_i);
    expect_fault(bad_exited_lane, "kernel exited_lane_kernel",
                 {"__shfl_xor_sync(mask 0xffffffff)", "lane 31 (thread (31,0,0)) has exited"}, how);
}
END_TEST

START_TEST(fault_mask_mismatch) {
    const char *how = setup(_i);
    expect_fault(bad_mask_mismatch, "kernel mask_mismatch_kernel",
                 {"lanes disagree on the mask of __shfl_sync", "0x0000ffff", "0xffffffff"}, how);
}
END_TEST

START_TEST(fault_source_outside_mask) {
    const char *how = setup(_i);
    expect_fault(bad_source_outside_mask, "kernel source_outside_mask_kernel",
                 {"reads lane 5, which is not in the mask 0x00000003"}, how);
}
END_TEST

START_TEST(fault_shuffle_vs_barrier) {
    const char *how = setup(_i);
    expect_fault(
        bad_shuffle_vs_barrier, "kernel shuffle_vs_barrier_kernel",
        {"__shfl_down_sync(mask 0xffffffff)", "__syncthreads at", "they wait for each other"}, how);
}
END_TEST

START_TEST(fault_width) {
    const char *how = setup(_i);
    expect_fault(bad_width, "kernel width_kernel", {"width 12 is not a power of two"}, how);
}
END_TEST

START_TEST(fault_partial_warp) {
    const char *how = setup(_i);
    expect_fault(bad_partial_warp, "kernel partial_warp_kernel",
                 {"lane 16 does not exist (the block has 48 threads)"}, how);
}
END_TEST

START_TEST(fault_shared_limit) {
    const char *how = setup(_i);
    expect_fault(bad_static_shared, "kernel static_shared_kernel",
                 {"shared array big (53248 bytes)", "over the limit of 49152"}, how);
    expect_fault(bad_static_plus_dynamic, "kernel static_plus_dynamic_kernel",
                 {"40960 static + 16384 dynamic bytes, over the limit of 49152"}, how);
}
END_TEST

/* ---- launch configuration and API checks (not sticky) ---- */

START_TEST(launch_configuration) {
    setup(_i);
    sbp_emu_set_quiet(1);
    Dev<int> out(2048);
    struct {
        unsigned gx, bx, by, bz;
    } bad[] = {{1, 1025, 1, 1}, {1, 32, 32, 2}, {1, 1, 1, 65}, {0, 32, 1, 1}, {1, 0, 1, 1}};
    for (auto &c : bad) {
        emu_touch(out.p, c.gx, c.bx, c.by, c.bz, 0);
        ck_assert_msg(cudaGetLastError() == cudaErrorInvalidConfiguration,
                      "block (%u,%u,%u) grid %u accepted", c.bx, c.by, c.bz, c.gx);
        ck_assert_msg(strstr(sbp_emu_last_message(), "kernel touch_kernel launched at"), "%s",
                      sbp_emu_last_message());
        ck_assert_int_eq(cudaGetLastError(), cudaSuccess); /* not sticky */
    }
    emu_touch(out.p, 1u << 30, 32, 1, 1, 0); /* valid CUDA, but 2^30 blocks */
    ck_assert_int_eq(cudaGetLastError(), cudaErrorLaunchOutOfResources);
    ck_assert_msg(strstr(sbp_emu_last_message(), "more than the emulator's"), "%s",
                  sbp_emu_last_message());
    emu_touch(out.p, 2, 1024, 1, 1, 0); /* the largest block */
    launched("touch, 1024 threads");
    for (int v : out.get()) ck_assert_int_eq(v, 1);
    /* dynamic shared memory: 48 KiB without an opt-in, up to the opt-in with one */
    emu_touch(out.p, 1, 32, 1, 1, 48 * 1024);
    launched("touch, 48 KiB dynamic shared");
    emu_touch(out.p, 1, 32, 1, 1, 48 * 1024 + 4);
    ck_assert_int_eq(cudaGetLastError(), cudaErrorInvalidValue);
    ck_assert_msg(strstr(sbp_emu_last_message(), "raise with cudaFuncSetAttribute"), "%s",
                  sbp_emu_last_message());
    ck_assert_int_eq(emu_touch_allow_shared(228 * 1024), cudaErrorInvalidValue);
    ck_assert_int_eq(cudaGetLastError(), cudaErrorInvalidValue);
    ck_assert_int_eq(emu_touch_allow_shared(100 * 1024), cudaSuccess);
    emu_touch(out.p, 1, 32, 1, 1, 100 * 1024);
    launched("touch, 100 KiB dynamic shared after the opt-in");
    emu_touch(out.p, 1, 32, 1, 1, 100 * 1024 + 1);
    ck_assert_int_eq(cudaGetLastError(), cudaErrorInvalidValue);
}
END_TEST

/* One API misuse: the call's result, the error expected, and a fragment of its message. */
static void api_case(cudaError_t got, cudaError_t want, const char *what, const char *fragment) {
    ck_assert_msg(got == want, "%s: got %d, want %d", what, got, want);
    ck_assert_msg(strstr(sbp_emu_last_message(), fragment) &&
                      strstr(sbp_emu_last_message(), "test_emu.cc:"),
                  "%s: %s", what, sbp_emu_last_message());
    ck_assert_int_eq(cudaGetLastError(), want); /* reported once, not sticky */
    ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
}

START_TEST(memory_api_checks) {
    setup(_i);
    sbp_emu_set_quiet(1);
    Dev<float> a(16), b(16);
    float host[32] = {0};
    api_case(cudaMemcpy(nullptr, host, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue,
             "NULL dst", "a NULL pointer");
    api_case(cudaMemcpy(host + 8, host, 64, cudaMemcpyHostToHost), cudaErrorInvalidValue,
             "overlap (host)", "overlap");
    api_case(cudaMemcpy(a.p + 4, a.p, 32, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue,
             "overlap (device)", "overlap");
    api_case(cudaMemcpy(host, a.p, 68, cudaMemcpyDeviceToHost), cudaErrorInvalidValue,
             "past the end of a", "source range runs past the end");
    api_case(cudaMemcpy(a.p, host, 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue, "wrong kind",
             "the destination is device memory and the source host memory");
    api_case(cudaMemcpy(host, host + 16, 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue,
             "host as device", "the destination is host memory");
    api_case(cudaMemcpy(a.p, b.p, 64, (cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection,
             "bad kind", "kind 7");
    api_case(cudaMemset(a.p + 8, 0, 64), cudaErrorInvalidValue, "memset past the end",
             "not inside one cudaMalloc allocation");
    api_case(cudaFree(host), cudaErrorInvalidValue, "free of a host pointer",
             "not a pointer cudaMalloc returned");
    /* the good ones: device-to-device, Default both ways, memset, zero bytes */
    std::vector<float> v = random_floats(16, 12);
    ck_assert_int_eq(cudaMemcpy(a.p, v.data(), 64, cudaMemcpyDefault), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(b.p, a.p, 64, cudaMemcpyDeviceToDevice), cudaSuccess);
    same_bits(b.get(), v, "device to device", "");
    ck_assert_int_eq(cudaMemset(b.p, 0, 64), cudaSuccess);
    same_bits(b.get(), std::vector<float>(16, 0.0f), "cudaMemset", "");
    ck_assert_int_eq(cudaMemcpy(nullptr, nullptr, 0, cudaMemcpyDeviceToHost), cudaSuccess);
    float *z = host;
    ck_assert_int_eq(cudaMalloc(&z, 0), cudaSuccess);
    ck_assert_ptr_null(z);
}
END_TEST

START_TEST(bad_order_environment) {
    /* SBP_EMU_ORDER is read once per process: check it in a child with a bad value */
    char cmd[600], exe[512];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ck_assert(len > 0);
    exe[len] = 0;
    snprintf(cmd, sizeof cmd, "SBP_EMU_ORDER=sideways '%s' --child order 2>/dev/null", exe);
    ck_assert_int_eq(WEXITSTATUS(system(cmd)), 3);
    snprintf(cmd, sizeof cmd, "SBP_EMU_ORDER=shuffle:42 '%s' --child order 2>/dev/null", exe);
    ck_assert_int_eq(WEXITSTATUS(system(cmd)), 0);
}
END_TEST

#if defined(__SANITIZE_ADDRESS__)
/* Runs `test_emu --child NAME`, which must fail with a sanitizer report containing every one of
 * `want` (the kind of error, the kernel, the allocation's size). */
static void expect_report(const char *name, std::vector<const char *> want) {
    char exe[512], log[] = "/tmp/test_emu_asan_XXXXXX", cmd[1200];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ck_assert(len > 0);
    exe[len] = 0;
    int fd = mkstemp(log);
    ck_assert(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "'%s' --child %s 2>'%s' >/dev/null", exe, name, log);
    int status = system(cmd);
    FILE *f = fopen(log, "r");
    ck_assert_ptr_nonnull(f);
    std::string text;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, got);
    fclose(f);
    unlink(log);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3,
                  "%s: the child did not fail (status %d)", name, status);
    for (const char *w : want)
        ck_assert_msg(text.find(w) != std::string::npos, "%s: no \"%s\" in:\n%.3000s", name, w,
                      text.c_str());
}

/* Shared memory through a pointer, as a kernel that hands its tile to a helper would: ASan's
 * report, at the array's exact size (32 floats). */
START_TEST(asan_oob_shared) {
    expect_report("oob-shared", {"ERROR: AddressSanitizer: heap-buffer-overflow",
                                 "oob_shared_kernel", "is located 0 bytes ", "128-byte region"});
}
END_TEST

/* Shared memory indexed as the array SBP_SHARED declares: UBSan's bounds check sees the type. */
START_TEST(ubsan_oob_shared_index) {
    expect_report(
        "oob-shared-index",
        {"emu_bad_kernels.cu:", "runtime error: index 32 out of bounds for type 'float [32]'"});
}
END_TEST

/* Global memory: cudaMalloc's exact size (100 floats). */
START_TEST(asan_oob_global) {
    expect_report("oob-global", {"ERROR: AddressSanitizer: heap-buffer-overflow",
                                 "oob_global_kernel", "is located 0 bytes ", "400-byte region"});
}
END_TEST
#endif

/* ---- child modes and the benchmark ---- */

static int child(const char *what) {
    float *out = nullptr;
    if (!strcmp(what, "order")) { /* exit 3 if the launch reports a bad SBP_EMU_ORDER */
        cudaMalloc(&out, 64 * 4);
        emu_neighbor_fixed(out, out);
        cudaError_t e = cudaGetLastError();
        return e == cudaSuccess ? 0 : strstr(sbp_emu_last_message(), "SBP_EMU_ORDER") ? 3 : 4;
    }
    if (!strcmp(what, "oob-shared")) {
        cudaMalloc(&out, 32 * 4);
        bad_oob_shared(out);
    } else if (!strcmp(what, "oob-shared-index")) {
        cudaMalloc(&out, 32 * 4);
        bad_oob_shared_index(out);
    } else if (!strcmp(what, "oob-global")) {
        cudaMalloc(&out, 100 * 4);
        bad_oob_global(out, 100);
    } else {
        return 2;
    }
    return 0; /* not caught */
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A device copy of v (no Check here: its asserts only work inside a test). */
static float *upload(const std::vector<float> &v) {
    float *p = nullptr;
    if (cudaMalloc(&p, v.size() * 4) ||
        cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice))
        return nullptr;
    return p;
}

/* One block of 256 threads with 9 barriers (block_sum), and a 16×16-tile matmul. */
static int bench(const char *only) {
    const int M = 64, N = 64, K = 64;
    float *x = upload(random_floats(256, 1)), *out = upload(std::vector<float>(1));
    float *A = upload(random_floats(M * K, 2)), *B = upload(random_floats(K * N, 3));
    float *C = upload(std::vector<float>(M * N));
    for (int kind = 0; kind < 2; kind++) {
        if (sbp_emu_set_fibers(kind ? SBP_EMU_FIBERS_UCONTEXT : SBP_EMU_FIBERS_FAST)) continue;
        const char *name = kind ? "ucontext" : "fast";
        if (only && strcmp(only, name)) continue;
        sbp_emu_stats s0, s1;
        int reps = kind ? 100 : 2000;
        emu_block_sum(out, x, 256);
        sbp_emu_get_stats(&s0);
        double t0 = now();
        for (int r = 0; r < reps; r++) emu_block_sum(out, x, 256);
        double t = (now() - t0) / reps;
        sbp_emu_get_stats(&s1);
        double sw = (double)(s1.switches - s0.switches) / reps;
        printf("%-8s block_sum: 1 block x 256 threads, 9 barriers: %8.1f us per launch, %.0f "
               "switches, %.1f ns per switch\n",
               name, t * 1e6, sw, t * 1e9 / sw);
        reps = kind ? 5 : 50;
        t0 = now();
        for (int r = 0; r < reps; r++) emu_matmul(C, A, B, M, N, K);
        t = (now() - t0) / reps;
        printf("%-8s matmul 64x64x64: 16 blocks x 256 threads, 8 barriers each: %8.1f us\n", name,
               t * 1e6);
    }
    for (float *p : {x, out, A, B, C}) cudaFree(p);
    return cudaGetLastError() != cudaSuccess;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) return child(argv[2]);
    if (argc >= 2 && !strcmp(argv[1], "--bench")) return bench(argc > 2 ? argv[2] : nullptr);
    Suite *s = suite_create("emu");
    TCase *ok = tcase_create("kernels");
    tcase_add_loop_test(ok, block_sum, 0, 8);
    tcase_add_loop_test(ok, warp_ops, 0, 8);
    tcase_add_loop_test(ok, votes, 0, 8);
    tcase_add_loop_test(ok, matmul, 0, 8);
    tcase_add_loop_test(ok, dynamic_shared, 0, 8);
    tcase_add_loop_test(ok, layout3d, 0, 8);
    tcase_add_loop_test(ok, no_contraction, 0, 8);
    tcase_add_loop_test(ok, poisoned_memory, 0, 2);
    tcase_add_loop_test(ok, race_shows_between_orders, 0, 8);
    suite_add_tcase(s, ok);
    TCase *bad = tcase_create("faults");
    tcase_add_loop_test(bad, fault_skipped_barrier, 0, 8);
    tcase_add_loop_test(bad, fault_split_barrier, 0, 8);
    tcase_add_loop_test(bad, fault_mask_excludes_lane, 0, 8);
    tcase_add_loop_test(bad, fault_exited_lane, 0, 8);
    tcase_add_loop_test(bad, fault_mask_mismatch, 0, 8);
    tcase_add_loop_test(bad, fault_source_outside_mask, 0, 8);
    tcase_add_loop_test(bad, fault_shuffle_vs_barrier, 0, 8);
    tcase_add_loop_test(bad, fault_width, 0, 8);
    tcase_add_loop_test(bad, fault_partial_warp, 0, 8);
    tcase_add_loop_test(bad, fault_shared_limit, 0, 8);
    tcase_add_loop_test(bad, launch_configuration, 0, 2);
    tcase_add_loop_test(bad, memory_api_checks, 0, 1);
    tcase_add_test(bad, bad_order_environment);
#if defined(__SANITIZE_ADDRESS__)
    tcase_add_test(bad, asan_oob_shared);
    tcase_add_test(bad, ubsan_oob_shared_index);
    tcase_add_test(bad, asan_oob_global);
#endif
    suite_add_tcase(s, bad);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed != 0;
}
