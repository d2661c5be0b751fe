/* gemm.c — the portable matrix product: C += A·B with every element of C one chain of fused
 * multiply-adds in ascending k, continuing from the value C already holds (docs/numerics.md §4).
 *
 * The blocking is Goto's: column blocks of NC, k blocks of KC (ascending), row blocks of MC;
 * B packed into KC×NR panels, A into MR×KC panels, and an MR×NR register tile per micro-kernel
 * call that loads C, runs its k loop and stores C. Splitting k into blocks stores the running
 * value in C and reloads it, which changes nothing in any element's chain; neither do the tile
 * sizes (chosen per instruction set), the SIMD lanes (over j, i.e. over outputs) or the threads
 * (each owns whole tiles of C). So the result is the same on every machine, for every thread
 * count and for every split of the rows between calls — the properties StreamBP's bitwise
 * promise needs — and a CUDA kernel with the same chains reproduces it (cuda/). The linear
 * layers' products (pgemm_fold_set, pgemm_panels, pgemm_fold) cut each chain into panels of k
 * fixed by k alone, each added in ascending order: the same properties (docs/numerics.md §4, §10).
 *
 * The micro-kernel is plain C over a fixed MR×NR tile: GCC turns its fma calls into vector FMA
 * instructions where the target has them, and into calls to the (exact) software fma where it
 * does not (-march=x86-64), with the same bits. With AVX-512, and with AVX2 + FMA (x86-64-v3:
 * Haswell and later, AMD Zen 1–3), it is written in intrinsics instead, because GCC's version of
 * the plain loop copies the C tile through the stack (about 12% of the kernel's time, perf):
 * _mm512_fmadd and _mm256_fmadd are the same correctly rounded fma per lane, so the bits are
 * those of the plain loop (golden digests, built with all three; tests/test_pgemm.c). */
#include "kernels.h"
#include "transpose.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#define VEC_BYTES 64
#elif defined(__AVX__)
#define VEC_BYTES 32
#else
#define VEC_BYTES 16
#endif

/* KC and MC for AVX-512 were measured at the bench model's layer shapes against OpenBLAS
 * (1 thread, Xeon with 48 KB L1d / 2 MB L2): KC 512 / MC 48 ran at 0.87–1.0 of cblas_sgemm,
 * against 0.71–0.86 at 256 / 96; MC 24, 36, 192, KC 384, 768, NC 512, 1024 and 8×48, 14×32,
 * 6×64 tiles were no better. NC 2048 rather than 4096 for the LM head (N = 32000, the only
 * product wider than 2048 in the bench model): its packed B block is 4 MB instead of 8.5, which
 * is the fast mode's whole product workspace, and its forward read 84–90 GFLOP/s against 80–84
 * (2048 × 32000 × 512, alternated). AVX2 + FMA (16 ymm registers): a 6 × 16 float tile (12
 * accumulators, two B vectors and a broadcast), MC 96 until 2026-12-07 (below). KC 512 everywhere:
 * it is the engine's default token block, so the fast dW sums its blocks inside pgemm_fold
 * (linear.c) instead of one product per 192-row panel per block and an extra pass; and one k block
 * covers the bench model's K = 512. A deeper product takes longer k blocks within the same
 * workspace (blocking_of). AVX2 (x86-64-v3 build, OpenBLAS Haswell kernels, Zen 4,
 * bench/pgemm_rates.c at T = 2048, 2026-12-04): a step's products 0.78–0.80 of OpenBLAS's tile grid
 * on 2 threads with KC 256, 0.95–0.99 with KC 512 (dW 0.59–0.69 → 0.78–1.01), and 1.00 → 1.03–1.04
 * on 1 thread (CPU time); KC 256 had been chosen on 1 thread alone, where KC 384 and 512, MC 48,
 * 144 and 192 were within ±3% of it. MC 48 on every instruction set, so that the workspace (and
 * with it every plan and ledger peak) is the same on every machine (WS_NR, WS_MCR below): on AVX2
 * (Zen 3, 2 threads, bench/pgemm_rates.c at T = 2048, 2026-12-07) MC 48 read 1.040–1.068 of
 * OpenBLAS's tile grid over a step's products against 1.058–1.077 with MC 96, alternated. */
enum {
    NR = 2 * VEC_BYTES / (int)sizeof(real), /* two vectors of outputs per row of the tile */
    MR = VEC_BYTES == 64 ? 12 : 6,          /* rows: MR·2 accumulators + B + broadcast fit */
    KC = 512,
    MC = 48,
    NC = 2048,
    KF = 2048,      /* the longest k block: blocking_of */
    NCMIN = 256,    /* its narrowest column block */
    NCHUNK = 256,   /* columns per task: the unit of work handed to a thread */
    PACK_AHEAD = 16 /* k steps prefetched ahead by pack_a's k-step walk (16: 2x in isolation) */
};

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

#if defined(__AVX512F__) && defined(SBP_REAL_F64)
typedef __m512d vreal;
#define vload  _mm512_loadu_pd
#define vstore _mm512_storeu_pd
#define vset1  _mm512_set1_pd
#define vfma   _mm512_fmadd_pd
#define vzero  _mm512_setzero_pd
#define vadd   _mm512_add_pd
#elif defined(__AVX512F__)
typedef __m512 vreal;
#define vload  _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vset1  _mm512_set1_ps
#define vfma   _mm512_fmadd_ps
#define vzero  _mm512_setzero_ps
#define vadd   _mm512_add_ps
#elif defined(SBP_REAL_F64) /* AVX2 + FMA: 16 ymm registers */
typedef __m256d vreal;
#define vload  _mm256_loadu_pd
#define vstore _mm256_storeu_pd
#define vset1  _mm256_set1_pd
#define vfma   _mm256_fmadd_pd
#define vzero  _mm256_setzero_pd
#define vadd   _mm256_add_pd
#else
typedef __m256 vreal;
#define vload  _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vset1  _mm256_set1_ps
#define vfma   _mm256_fmadd_ps
#define vzero  _mm256_setzero_ps
#define vadd   _mm256_add_ps
#endif
enum { VL = VEC_BYTES / (int)sizeof(real) }; /* lanes per vector; NR = 2·VL */

/* c (MR×NR, row stride ldc) += a_panel·b_panel over kc, or (zero) c = the same chains from +0,
 * or (zero and add, the fast mode's fold) c = c + the chains from +0: a (kc, MR) and b (kc, NR),
 * packed. acc[i][v] lane l holds c[i][v·VL + l]: one fma chain per element, ascending p. */
static void micro_kernel(real *restrict c, size_t ldc, const real *restrict a,
                         const real *restrict b, int kc, int zero, int add) {
    vreal acc[MR][2];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
        acc[i][0] = zero ? vzero() : vload(c + i * ldc);
        acc[i][1] = zero ? vzero() : vload(c + i * ldc + VL);
    }
    for (int p = 0; p < kc; p++) {
        const real *a_p = a + (size_t)p * MR, *b_p = b + (size_t)p * NR;
        const vreal b0 = vload(b_p), b1 = vload(b_p + VL);
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            const vreal a_ip = vset1(a_p[i]);
            acc[i][0] = vfma(a_ip, b0, acc[i][0]);
            acc[i][1] = vfma(a_ip, b1, acc[i][1]);
        }
    }
    if (add)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            acc[i][0] = vadd(vload(c + i * ldc), acc[i][0]);
            acc[i][1] = vadd(vload(c + i * ldc + VL), acc[i][1]);
        }
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
        vstore(c + i * ldc, acc[i][0]);
        vstore(c + i * ldc + VL, acc[i][1]);
    }
}

/* the next tile's C rows (MR × NR) into L1 while this one computes */
static inline void prefetch_tile(const real *c, size_t ldc) {
    for (int i = 0; i < MR; i++) {
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + i * ldc + NR - 1), _MM_HINT_T0);
    }
}
#else
static inline void prefetch_tile(const real *c, size_t ldc) {
    (void)c, (void)ldc;
}

/* c (MR×NR, row stride ldc) += a_panel·b_panel over kc, or (zero) c = the same chains from +0,
 * or (zero and add) c = c + the chains from +0: a (kc, MR) and b (kc, NR), packed. */
static void micro_kernel(real *restrict c, size_t ldc, const real *restrict a,
                         const real *restrict b, int kc, int zero, int add) {
    real acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = zero ? 0 : c[i * ldc + j];
    for (int p = 0; p < kc; p++) {
        const real *a_p = a + (size_t)p * MR, *b_p = b + (size_t)p * NR;
        for (int i = 0; i < MR; i++) {
            const real a_ip = a_p[i];
            for (int j = 0; j < NR; j++) acc[i][j] = rfma(a_ip, b_p[j], acc[i][j]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) c[i * ldc + j] = add ? c[i * ldc + j] + acc[i][j] : acc[i][j];
}
#endif

/* The panels of a tile over a k block of kc: the first panel's chains as zero and add say (from
 * +0 or continuing c; added to c or not), every later one's from +0 and added to c, in ascending
 * order. */
static void panel_kernel(real *c, size_t ldc, const real *a, const real *b, int kc, int fk,
                         int zero, int add) {
    for (int q = 0; q < kc; q += fk)
        micro_kernel(c, ldc, a + (size_t)q * MR, b + (size_t)q * NR, kc - q < fk ? kc - q : fk,
                     zero || q > 0, add || q > 0);
}

/* One full tile over a k block of kc: the micro-kernel once (fk = 0: the chains continue, or start
 * from +0 where zero), or once per k panel of fk. Between panels the tile's running sums go
 * through a contiguous copy: C's rows, a row stride apart (4 KiB at K = 1024), share L1 sets, and
 * reloading them every panel made the folded products 3-11% slower (Qwen3-0.6B shapes, 1 thread).
 */
static void tile_kernel(real *c, size_t ldc, const real *a, const real *b, int kc, int fk, int zero,
                        int add) {
    if (!fk || kc <= fk) {
        micro_kernel(c, ldc, a, b, kc, zero, add);
        return;
    }
    real tile[MR * NR] __attribute__((aligned(64)));
    for (int i = 0; i < MR && (!zero || add); i++)
        memcpy(tile + i * NR, c + i * ldc, sizeof(real) * NR);
    panel_kernel(tile, NR, a, b, kc, fk, zero, add);
    for (int i = 0; i < MR; i++) memcpy(c + i * ldc, tile + i * NR, sizeof(real) * NR);
}

/* A partial tile (mr < MR or nr < NR) goes through a full-size copy: the extra rows and
 * columns compute on zero padding and are dropped. */
static void edge_kernel(real *c, size_t ldc, const real *a, const real *b, int kc, int fk, int mr,
                        int nr, int zero, int add) {
    real tile[MR * NR] = {0};
    for (int i = 0; i < mr && (!zero || add); i++)
        memcpy(tile + i * NR, c + i * ldc, sizeof(real) * (size_t)nr);
    if (fk)
        panel_kernel(tile, NR, a, b, kc, fk, zero, add);
    else
        micro_kernel(tile, NR, a, b, kc, zero, add);
    for (int i = 0; i < mr; i++) memcpy(c + i * ldc, tile + i * NR, sizeof(real) * (size_t)nr);
}

#if defined(__AVX512F__) && !defined(SBP_REAL_F64)
/* The packs' transposing case: an operand whose k index is contiguous in memory (the
 * forward's x and W, dX's dy) goes into panels whose rows are k steps, a transpose. Element by
 * element that ran at 3–4 GB/s, about a tenth of a layer product's time (perf, 1 thread); 16
 * rows of 16 contiguous floats loaded, transposed in registers and stored run at 7–10 GB/s,
 * close to this machine's streaming rate. A copy, so no bit changes. */

/* transpose16, transpose_block: transpose.h */
_Static_assert(MR == 12 && NR == 32, "the transposed packs' lane masks and halves");
#define PACK_TRANSPOSED 16     /* k steps per transposed block, and rows: NR = 2 blocks */
#define LANES_ALL       0xffff /* transpose_block's lanes: a B panel's 16 columns */
#define LANES_MR        0x0fff /* an A panel's MR = 12 rows */
#elif defined(__AVX2__) && defined(__FMA__) && !defined(SBP_REAL_F64)
/* The same transposing packs with AVX2: 8 × 8 blocks (rows of 8 contiguous floats loaded,
 * transposed in ymm registers, stored), for the NR = 16 B panels (two blocks) and the MR = 6 A
 * panels (6 lanes of each transposed row). A copy, so no bit changes. */

/* transpose8, transpose_block: transpose.h */
_Static_assert(MR == 6 && NR == 16, "the transposed packs' lanes and halves");
#define PACK_TRANSPOSED 8
#define LANES_ALL       8
#define LANES_MR        6
#else
#define PACK_TRANSPOSED 0
#endif

/* b(p, j) for p in [pc, pc+kc), j in [jc, jc+nc) into panels of NR columns: (npanels, kc, NR),
 * zero past column N. */
static void pack_b(real *dst, const real *B, size_t rsb, size_t csb, int pc, int kc, int jc,
                   int nc) {
    const int npanels = (nc + NR - 1) / NR;
#pragma omp parallel for schedule(static)
    for (int q = 0; q < npanels; q++) {
        real *d = dst + (size_t)q * kc * NR;
        const int j0 = jc + q * NR, nr = nc - q * NR < NR ? nc - q * NR : NR;
        int p = 0;
#if PACK_TRANSPOSED
        if (rsb == 1) /* NR = 2·PACK_TRANSPOSED: two blocks of columns */
            for (; p + PACK_TRANSPOSED <= kc; p += PACK_TRANSPOSED)
                for (int h = 0; h < 2; h++) {
                    const int j = PACK_TRANSPOSED * h, rows = nr - j < 0 ? 0
                                                              : nr - j > PACK_TRANSPOSED
                                                                  ? PACK_TRANSPOSED
                                                                  : nr - j;
                    transpose_block(d + (size_t)p * NR + j, NR,
                                    B + (size_t)(j0 + j) * csb + (size_t)(pc + p), csb, rows,
                                    LANES_ALL);
                }
#endif
        for (; p < kc; p++) {
            const real *src = B + (size_t)(pc + p) * rsb + (size_t)j0 * csb;
            for (int j = 0; j < nr; j++) d[p * NR + j] = src[(size_t)j * csb];
            for (int j = nr; j < NR; j++) d[p * NR + j] = 0;
        }
    }
}

/* a(i, p) for i in [ic, ic+mc), p in [pc, pc+kc) into panels of MR rows: (npanels, kc, MR).
 * Where a k step's rows are contiguous (rsa = 1: dW's dyᵀ, whose k steps are token rows up to
 * 5.6 KB apart) the block is read a k step at a time, all mc rows, and PACK_AHEAD k steps are
 * prefetched: the hardware's streams stop at 4 KB boundaries, and without this the pack took a
 * fifth of a wide layer's dW (perf, 1 thread, 1408 × 512 × 2048: 21% of the product's samples
 * in the pack, 11% with it). */
static void pack_a(real *dst, const real *A, size_t rsa, size_t csa, int ic, int mc, int pc,
                   int kc) {
    if (rsa == 1) {
        for (int p = 0; p < kc; p++) {
            const real *src = A + (size_t)(pc + p) * csa + (size_t)ic;
            if (p + PACK_AHEAD < kc)
                for (int i = 0; i < mc; i += 64 / (int)sizeof(real))
                    __builtin_prefetch(src + PACK_AHEAD * csa + (size_t)i);
            for (int ir = 0; ir < mc; ir += MR) {
                real *d = dst + (size_t)ir * kc + (size_t)p * MR;
                const int mr = mc - ir < MR ? mc - ir : MR;
                for (int i = 0; i < mr; i++) d[i] = src[ir + i];
                for (int i = mr; i < MR; i++) d[i] = 0;
            }
        }
        return;
    }
    for (int ir = 0; ir < mc; ir += MR) {
        real *d = dst + (size_t)ir * kc;
        const int mr = mc - ir < MR ? mc - ir : MR;
        int p = 0;
#if PACK_TRANSPOSED
        if (csa == 1) /* MR rows: the low MR lanes of each transposed row */
            for (; p + PACK_TRANSPOSED <= kc; p += PACK_TRANSPOSED)
                transpose_block(d + (size_t)p * MR, MR,
                                A + (size_t)(ic + ir) * rsa + (size_t)(pc + p), rsa, mr, LANES_MR);
#endif
        for (; p < kc; p++) {
            const real *src = A + (size_t)(ic + ir) * rsa + (size_t)(pc + p) * csa;
            for (int i = 0; i < mr; i++) d[p * MR + i] = src[(size_t)i * rsa];
            for (int i = mr; i < MR; i++) d[p * MR + i] = 0;
        }
    }
}

_Static_assert(MC / 2 % MR == 0, "gemm's half row blocks are whole register tiles");

/* The packed B block (kc, nc + NR) and one packed A block (kc, MC + MR) per thread. */
static size_t b_block(int nc, int kc) {
    return (size_t)kc * ((size_t)nc + NR);
}

static size_t a_block(int kc) {
    return (size_t)kc * (MC + MR);
}

/* The workspace is sized for the widest tile of any build (AVX-512's NR 32 and MC + MR 60), not
 * this build's: the planner counts it, the docs quote the ledger's peaks, and a plan must be the
 * same bytes on an AVX2 machine as on an AVX-512 one. */
enum { WS_NR = 32, WS_MCR = 60 };
_Static_assert((int)NR <= (int)WS_NR && (int)MC + (int)MR <= (int)WS_MCR,
               "every build's blocks fit the planned workspace");

/* The workspace of a product of depth K and N columns: its blocks at k blocks of KC and column
 * blocks of NC (or less), in any build. */
static size_t workspace_of(int N, int K, int nth) {
    const size_t kc = (size_t)(K < KC ? K : KC);
    return kc * ((size_t)(N < NC ? N : NC) + WS_NR) + (size_t)nth * kc * WS_MCR;
}

/* The blocking of a product: k blocks of kc (the last may be shorter), column blocks of nc. K in
 * the fewest k blocks of at most KF of even length (folded, in panels of fk: whole panels, so that
 * the panels start at multiples of fk whatever the blocking), with column blocks narrow enough that
 * the packed blocks fit the workspace of the KC blocking (workspace_of), when at least NCMIN
 * columns do; else that blocking. Each k block loads and stores the whole C block (the rows × nc)
 * once, and where C is large and K moderate that traffic is what the product waits on: the LM
 * head's forward (T × V logits) at K = 1152, Gemma-3-1B's hidden size, ran at 291–302 GFLOP/s in k
 * blocks of 512, 512 and 128 against 344–353 in one block of 1152 (NC 2048 or 512), and at 324
 * against 358 in a step's profile (2 threads, the Emerald Rapids VM, 2026-12-06). A chain does not
 * see its blocks: the bits are the same. */
typedef struct {
    int kc, nc;
} blocking;

static blocking blocking_of(int N, int K, int fk) {
    const int nth = omp_get_max_threads();
    const blocking old = {KC, NC};
    if (K <= KC) return old;
    const int nb = (K + KF - 1) / KF, step = fk ? fk : 1;
    int kc = ((K + nb - 1) / nb + step - 1) / step * step; /* whole panels (fk divides KF) */
    if (kc > K) kc = K;
    const size_t room = workspace_of(N, K, nth), a = (size_t)nth * a_block(kc);
    if (room <= a) return old;
    const size_t cols = (room - a) / (size_t)kc; /* nc + NR */
    const int nc = cols > (size_t)NR ? (int)((cols - NR) / NR * NR) : 0;
    if (nc < NCMIN && nc < N) return old;
    return (blocking){kc, nc < NC ? nc : NC};
}

_Static_assert(KC % PGEMM_PANEL == 0 && KF % KC == 0, "the fold's panels tile every k block");

size_t pgemm_workspace(int N, int K) {
    if (N <= 0 || K <= 0) return 0;
    return workspace_of(N, K, omp_get_max_threads());
}

/* C += A·B, or (set) C = A·B: the first k block's chains start from +0 instead of C. In panels
 * (fk > 0, a divisor of KC): every k panel [q, q + fk)'s chains start from +0 and are added to C,
 * panel after panel, except the first: set, its sum is C's first value; cont, it continues C's
 * chain (the portable numerics' rule for a sum cut into blocks, docs/numerics.md §4). */
static void gemm(real *C, size_t ldc, real *ws, const real *A, size_t rsa, size_t csa,
                 const real *B, size_t rsb, size_t csb, int M, int N, int K, int set, int fk,
                 int cont) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* no terms: every chain is its start */
        if (set)
            for (int i = 0; i < M; i++) memset(C + (size_t)i * ldc, 0, sizeof(real) * (size_t)N);
        return;
    }
    const blocking bl = blocking_of(N, K, fk);
    const int kb = bl.kc, NB = bl.nc;
    real *bpack = ws; /* b_block, then a_block per thread */
    const size_t bsize = b_block(N < NB ? N : NB, K < kb ? K : kb),
                 asize = a_block(K < kb ? K : kb);
    for (int jc = 0; jc < N; jc += NB) {
        const int nc = N - jc < NB ? N - jc : NB;
        for (int pc = 0; pc < K; pc += kb) { /* ascending k: each chain continues from C */
            /* the block's first panel (or its one chain): its start; every later panel of the
             * block starts from +0 and is added (panel_kernel) */
            const int kc = K - pc < kb ? K - pc : kb, first = pc == 0;
            const int zero = !fk ? set && first : !first || !cont || set;
            const int add = fk && (!first || (!set && !cont));
            pack_b(bpack, B, rsb, csb, pc, kc, jc, nc);
            /* Tasks: row blocks across all nc columns where there are enough for every thread
             * (each A block is then packed once; split by columns too, two threads packed every
             * A block twice, the LM head's dlogits included), else (row block, NCHUNK columns). */
            const int nth = omp_get_max_threads(), nrow = (M + MC - 1) / MC;
            const int ncol = nrow >= 4 * nth ? 1 : (nc + NCHUNK - 1) / NCHUNK;
            const int cw = ncol == 1 ? nc : NCHUNK;
            /* Row blocks of MC, the last nth·MC rows or more in blocks of MC/2 where the tasks are
             * whole row blocks: the threads' last tasks are then short and end closer together
             * (dynamic scheduling leaves one thread idle for up to a task at the end) */
            const int nbig = ncol == 1 ? (M - nth * MC > 0 ? (M - nth * MC) / MC : 0) : nrow;
            const int nsmall = ncol == 1 ? (M - nbig * MC + MC / 2 - 1) / (MC / 2) : 0;
            const int ntask = nbig * ncol + nsmall;
#pragma omp parallel
            {
                real *apack = ws + bsize + (size_t)omp_get_thread_num() * asize;
                int packed_ic = -1;
#pragma omp for schedule(dynamic, 1)
                for (int task = 0; task < ntask; task++) {
                    const int big = task < nbig * ncol, rows = big ? MC : MC / 2;
                    const int ic = big ? task / ncol * MC : nbig * MC + (task - nbig) * rows;
                    const int mc = M - ic < rows ? M - ic : rows;
                    const int j0 = big ? task % ncol * cw : 0;
                    const int j1 = big && j0 + cw < nc ? j0 + cw : nc;
                    if (ic != packed_ic) pack_a(apack, A, rsa, csa, ic, mc, pc, kc);
                    packed_ic = ic;
                    for (int jr = j0; jr < j1; jr += NR) {
                        const real *b = bpack + (size_t)(jr / NR) * kc * NR;
                        const int nr = j1 - jr < NR ? j1 - jr : NR;
                        for (int ir = 0; ir < mc; ir += MR) {
                            const int mr = mc - ir < MR ? mc - ir : MR;
                            real *c = C + (size_t)(ic + ir) * ldc + (size_t)(jc + jr);
                            if (ir + MR < mc) prefetch_tile(c + MR * ldc, ldc);
                            if (mr == MR && nr == NR)
                                tile_kernel(c, ldc, apack + (size_t)ir * kc, b, kc, fk, zero, add);
                            else
                                edge_kernel(c, ldc, apack + (size_t)ir * kc, b, kc, fk, mr, nr,
                                            zero, add);
                        }
                    }
                }
            }
        }
    }
}

void pgemm(real *C, size_t ldc, real *ws, const real *A, size_t rsa, size_t csa, const real *B,
           size_t rsb, size_t csb, int M, int N, int K) {
    gemm(C, ldc, ws, A, rsa, csa, B, rsb, csb, M, N, K, 0, 0, 0);
}

void pgemm_fold(real *C, size_t ldc, real *ws, const real *A, size_t rsa, size_t csa, const real *B,
                size_t rsb, size_t csb, int M, int N, int K, int panel) {
    gemm(C, ldc, ws, A, rsa, csa, B, rsb, csb, M, N, K, 0, panel, 0);
}

void pgemm_panels(real *C, size_t ldc, real *ws, const real *A, size_t rsa, size_t csa,
                  const real *B, size_t rsb, size_t csb, int M, int N, int K, int panel) {
    gemm(C, ldc, ws, A, rsa, csa, B, rsb, csb, M, N, K, 0, panel, 1);
}

void pgemm_fold_set(real *C, size_t ldc, real *ws, const real *A, size_t rsa, size_t csa,
                    const real *B, size_t rsb, size_t csb, int M, int N, int K, int panel) {
    gemm(C, ldc, ws, A, rsa, csa, B, rsb, csb, M, N, K, 1, panel, 0);
}

void pgemm_set(real *C, size_t ldc, real *ws, const real *A, size_t rsa, size_t csa, const real *B,
               size_t rsb, size_t csb, int M, int N, int K) {
    gemm(C, ldc, ws, A, rsa, csa, B, rsb, csb, M, N, K, 1, 0, 0);
}

/* SBP_ENTRY (real.h) names the two definitions, one per build of this file:
 *   int sbp_portable_gemm_f32(float *C, ...)    int sbp_portable_gemm_f64(double *C, ...) */
int SBP_ENTRY(sbp_portable_gemm)(real *C, const real *A, const real *B, int M, int N, int K) {
    real *ws = malloc(sizeof(real) * pgemm_workspace(N, K));
    if (M > 0 && N > 0 && K > 0 && !ws) return -1;
    pgemm_set(C, (size_t)N, ws, A, (size_t)K, 1, B, 1, (size_t)K, M, N, K);
    free(ws);
    return 0;
}
