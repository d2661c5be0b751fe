/* test_window.c — sliding-window attention (issue 34, Gemma-3's local layers): the portable and
 * the fast kernels against a naive masked softmax in long double (forward and backward, rows
 * with no visible key included), float64 finite differences, chunk independence (chunks smaller
 * and larger than the window and straddling its edge, bit for bit), a window of T or more equal
 * to no window, and the point of the window: the kernels never read a key tile before the window
 * of the chunk's first query (the keys there lie behind a PROT_NONE guard).
 *
 * The visibility rule is HF 4.51.3's (docs/gemma3.md): key j is visible from query i iff
 * i − W < j ≤ i and kmask[j]; a query that sees no key is, under --unattended hf-eager, uniform
 * over all T keys. The test binary is built in float64 (real = double). */
#include "testutil.h"
#include "../src/kernels/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    int NH, NKV, HD, T, blk, win;
    int pad; /* 0 none; 1 left padding longer than most windows, a hole, right padding */
} wcfg;

static double *zeros(size_t n) {
    double *x = calloc(n ? n : 1, sizeof *x);
    ck_assert_ptr_nonnull(x);
    return x;
}

/* uniform in [−1, 1), xorshift64* */
static double *randu(size_t n, uint64_t seed) {
    double *x = zeros(n);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        x[i] = (double)((s * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0 * 2 - 1;
    }
    return x;
}

/* pad 1: keys [0, 21) (longer than the small windows: their queries' windows are all padding),
 * a hole [T/2, T/2 + 3) and right padding of 30 keys (past the last real key by more than the
 * small windows). */
static uint8_t *make_mask(int T, int pad) {
    uint8_t *m = malloc((size_t)T);
    ck_assert_ptr_nonnull(m);
    for (int j = 0; j < T; j++)
        m[j] = !pad || !(j < 21 || (j >= T / 2 && j < T / 2 + 3) || j >= T - 30);
    return m;
}

static sbp_attn_dims dims_of(const wcfg *c, int s, int e, double scale) {
    return (sbp_attn_dims){.s = s,
                           .M = e - s,
                           .T = c->T,
                           .NH = c->NH,
                           .NKV = c->NKV,
                           .HD = c->HD,
                           .blk = c->blk,
                           .window = c->win,
                           .scale = scale};
}

static int visible(const wcfg *c, const uint8_t *kmask, int i, int j) {
    return j <= i && kmask[j] && (!c->win || j > i - c->win);
}

/* The dense softmax with the window, in long double: o, lse of every query (a query with no
 * visible key: o = 0, lse = +inf with mode 0; uniform over all T keys with hf-eager), and the
 * backward of L = Σ r·o (HF's autograd: dS = P∘(dP − D), also for the uniform rows). */
static void naive(double *o, double *lse, double *dq, double *dk, double *dv, const double *q,
                  const double *k, const double *v, const double *r, const uint8_t *kmask,
                  const wcfg *c, double scale, int mode) {
    const int T = c->T, HD = c->HD, Q = c->NH * HD, KV = c->NKV * HD;
    long double *P = calloc((size_t)T, sizeof *P), *acc = calloc((size_t)HD, sizeof *acc);
    ck_assert_ptr_nonnull(P);
    ck_assert_ptr_nonnull(acc);
    for (int i = 0; i < T; i++)
        for (int h = 0; h < c->NH; h++) {
            const int g = h / (c->NH / c->NKV);
            const double *q_i = q + (size_t)i * Q + h * HD, *r_i = r + (size_t)i * Q + h * HD;
            long double mx = -INFINITY, sum = 0, D = 0;
            int any = 0;
            for (int j = 0; j < T; j++) {
                P[j] = -INFINITY;
                if (!visible(c, kmask, i, j)) continue;
                long double d = 0;
                for (int x = 0; x < HD; x++)
                    d += (long double)q_i[x] * k[(size_t)j * KV + g * HD + x];
                P[j] = d * scale, mx = fmaxl(mx, P[j]), any = 1;
            }
            if (!any && mode == 0) {
                for (int x = 0; x < HD; x++) o[(size_t)i * Q + h * HD + x] = 0;
                lse[(size_t)i * c->NH + h] = INFINITY;
                continue;
            }
            for (int j = 0; j < T; j++) sum += any ? expl(P[j] - mx) : 1;
            for (int j = 0; j < T; j++) P[j] = any ? expl(P[j] - mx) / sum : 1.0L / T;
            lse[(size_t)i * c->NH + h] = any ? (double)(mx + logl(sum)) : INFINITY;
            for (int x = 0; x < HD; x++) acc[x] = 0;
            for (int j = 0; j < T; j++)
                for (int x = 0; x < HD; x++) acc[x] += P[j] * v[(size_t)j * KV + g * HD + x];
            for (int x = 0; x < HD; x++) {
                o[(size_t)i * Q + h * HD + x] = (double)acc[x];
                D += (long double)r_i[x] * acc[x];
            }
            for (int j = 0; j < T; j++) {
                if (P[j] == 0) continue;
                long double dp = 0;
                for (int x = 0; x < HD; x++)
                    dp += (long double)r_i[x] * v[(size_t)j * KV + g * HD + x];
                const long double dS = P[j] * (dp - D) * scale;
                for (int x = 0; x < HD; x++) {
                    dq[(size_t)i * Q + h * HD + x] += (double)(dS * k[(size_t)j * KV + g * HD + x]);
                    dk[(size_t)j * KV + g * HD + x] += (double)(dS * q_i[x]);
                    dv[(size_t)j * KV + g * HD + x] += (double)(P[j] * r_i[x]);
                }
            }
        }
    free(P), free(acc);
}

/* One attention problem: inputs, dO = r, and the kernel (portable or fast) with the unattended
 * rows of `mode`, run chunk by chunk as the engine runs it. */
typedef struct {
    wcfg c;
    int portable, mode, Q, KV;
    double scale;
    double *q, *k, *v, *r, *ws;
    uint8_t *kmask;
} prob;

static void prob_init(prob *p, wcfg c, int portable, int mode, double scale, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->c = c, p->portable = portable, p->mode = mode, p->scale = scale;
    p->Q = c.NH * c.HD, p->KV = c.NKV * c.HD;
    const size_t T = (size_t)c.T;
    p->q = randu(T * p->Q, seed), p->k = randu(T * p->KV, seed + 1);
    p->v = randu(T * p->KV, seed + 2), p->r = randu(T * p->Q, seed + 3);
    size_t ws =
        portable ? attention_workspace(c.HD) : tiled_attention_workspace(c.blk, c.NH, c.NKV, c.HD);
    if (unattended_workspace(c.T) > ws) ws = unattended_workspace(c.T);
    p->ws = zeros(ws);
    p->kmask = make_mask(c.T, c.pad);
}

static void prob_free(prob *p) {
    free(p->q), free(p->k), free(p->v), free(p->r), free(p->ws), free(p->kmask);
}

/* Forward of queries [s, e) into o, lse (whole-sequence buffers) from k, v (row 0 at k). */
static void fwd(prob *p, double *o, double *lse, const double *k, const double *v, int s, int e) {
    const sbp_attn_dims d = dims_of(&p->c, s, e, p->scale);
    double *o_s = o + (size_t)s * p->Q, *l_s = lse + (size_t)s * p->c.NH;
    const double *q_s = p->q + (size_t)s * p->Q;
    if (p->portable)
        attention_forward(o_s, l_s, p->ws, q_s, k, v, p->kmask, &d);
    else
        tiled_attention_forward(o_s, l_s, p->ws, q_s, k, v, p->kmask, &d);
    unattended_forward(o_s, p->ws, q_s, k, v, p->kmask, &d, p->mode);
}

/* Backward of queries [s, e): dq rows s.., dk and dv accumulated. */
static void bwd(prob *p, double *dq, double *dk, double *dv, const double *o, const double *lse,
                const double *k, const double *v, int s, int e) {
    const sbp_attn_dims d = dims_of(&p->c, s, e, p->scale);
    const size_t so = (size_t)s * p->Q, sl = (size_t)s * p->c.NH;
    double *dsum = zeros((size_t)(e - s) * p->c.NH);
    unattended_backward(dq + so, dk, dv, p->ws, p->r + so, o + so, p->q + so, k, v, p->kmask, &d,
                        p->mode);
    if (p->portable)
        attention_backward(dq + so, dk, dv, dsum, p->ws, p->r + so, o + so, lse + sl, p->q + so, k,
                           v, p->kmask, &d);
    else
        tiled_attention_backward(dq + so, dk, dv, dsum, p->ws, p->r + so, o + so, lse + sl,
                                 p->q + so, k, v, p->kmask, &d);
    free(dsum);
}

typedef struct {
    double *o, *lse, *dq, *dk, *dv;
} outs;

/* The forward over every chunk, then the backward over every chunk in ascending order; chunk
 * boundaries at multiples of `chunk` (T: one call). */
static outs run_chunked(prob *p, int chunk) {
    const size_t T = (size_t)p->c.T;
    outs u = {zeros(T * p->Q), zeros(T * p->c.NH), zeros(T * p->Q), zeros(T * p->KV),
              zeros(T * p->KV)};
    for (int s = 0; s < p->c.T; s += chunk)
        fwd(p, u.o, u.lse, p->k, p->v, s, s + chunk < p->c.T ? s + chunk : p->c.T);
    for (int s = 0; s < p->c.T; s += chunk)
        bwd(p, u.dq, u.dk, u.dv, u.o, u.lse, p->k, p->v, s,
            s + chunk < p->c.T ? s + chunk : p->c.T);
    return u;
}

static void outs_free(outs *u) {
    free(u->o), free(u->lse), free(u->dq), free(u->dk), free(u->dv);
}

static const char *name_of(const prob *p) {
    static char buf[200];
    const wcfg *c = &p->c;
    snprintf(buf, sizeof buf, "%s NH %d NKV %d HD %d T %d tile %d window %d%s%s",
             p->portable ? "portable" : "fast", c->NH, c->NKV, c->HD, c->T,
             p->portable ? ATTN_TILE : attention_tile(c->blk), c->win, c->pad ? " padded" : "",
             p->mode ? " hf-eager" : "");
    return buf;
}

static void assert_close(const char *what, const prob *p, const double *got, const double *want,
                         size_t n, double tol) {
    double scale = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(want[i]) && fabs(want[i]) > scale) scale = fabs(want[i]);
    for (size_t i = 0; i < n; i++) {
        const int same_inf = isinf(want[i]) && got[i] == want[i];
        ck_assert_msg(same_inf || fabs(got[i] - want[i]) <= tol * (scale > 1 ? scale : 1),
                      "%s, %s: element %zu is %.17g, want %.17g", what, name_of(p), i, got[i],
                      want[i]);
    }
}

static void assert_same(const char *what, const prob *p, int chunk, const double *got,
                        const double *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&got[i], &want[i], sizeof *got) == 0,
                      "%s, %s, chunks of %d: element %zu is %.17g, one call gives %.17g", what,
                      name_of(p), chunk, i, got[i], want[i]);
}

/* Windows against a tile of 64 (portable) and of 16 (fast, blk 16): smaller than a tile, equal
 * to one, one more, larger than T. T = 150: several tiles, a partial last one. */
static const int windows[] = {1, 5, 16, 17, 63, 64, 65, 100, 149, 150, 1000};
enum { NWIN = sizeof windows / sizeof windows[0] };

static wcfg cfg_of(int w, int pad) {
    return (wcfg){.NH = 4, .NKV = 2, .HD = 8, .T = 150, .blk = 16, .win = windows[w], .pad = pad};
}

/* _i: window × {portable, fast} × {no padding, padding}; forward and backward of one call
 * against the naive softmax, with hf-eager rows when padded. */
START_TEST(window_vs_naive) {
    const int w = _i % NWIN, portable = _i / NWIN % 2, pad = _i / (2 * NWIN);
    prob p;
    prob_init(&p, cfg_of(w, pad), portable, pad ? SBP_UNATTENDED_HF_EAGER : 0, 0.3,
              700 + (uint64_t)_i);
    const size_t T = (size_t)p.c.T, nq = T * p.Q, nkv = T * p.KV;
    outs u = run_chunked(&p, p.c.T);
    double *o = zeros(nq), *lse = zeros(T * p.c.NH), *dq = zeros(nq), *dk = zeros(nkv),
           *dv = zeros(nkv);
    naive(o, lse, dq, dk, dv, p.q, p.k, p.v, p.r, p.kmask, &p.c, p.scale, p.mode);
    assert_close("o", &p, u.o, o, nq, 1e-14);
    assert_close("lse", &p, u.lse, lse, T * p.c.NH, 1e-14);
    assert_close("dq", &p, u.dq, dq, nq, 1e-13);
    assert_close("dk", &p, u.dk, dk, nkv, 1e-13);
    assert_close("dv", &p, u.dv, dv, nkv, 1e-13);
    free(o), free(lse), free(dq), free(dk), free(dv);
    outs_free(&u);
    prob_free(&p);
}
END_TEST

/* L = Σ r·o (o of the kernel), for finite differences. */
static double loss(prob *p) {
    const size_t T = (size_t)p->c.T, nq = T * p->Q;
    double *o = zeros(nq), *lse = zeros(T * p->c.NH);
    fwd(p, o, lse, p->k, p->v, 0, p->c.T);
    double l = 0;
    for (size_t i = 0; i < nq; i++) l += p->r[i] * o[i];
    free(o), free(lse);
    return l;
}

/* Central differences of L in q, k, v (25 random elements of each) against the backward, in
 * float64, on the padded problem (rows without a key: mode zero, whose forward is constant
 * there). */
START_TEST(window_fd) {
    const int w = _i % NWIN, portable = _i / NWIN;
    prob p;
    prob_init(&p, cfg_of(w, 1), portable, 0, 0.35, 900 + (uint64_t)_i);
    outs u = run_chunked(&p, p.c.T);
    const size_t T = (size_t)p.c.T;
    struct {
        const char *n;
        double *x, *g;
        size_t len;
    } xs[] = {{"dq", p.q, u.dq, T * p.Q}, {"dk", p.k, u.dk, T * p.KV}, {"dv", p.v, u.dv, T * p.KV}};
    uint64_t s = 12345 + (uint64_t)_i;
    for (int a = 0; a < 3; a++)
        for (int t = 0; t < 25; t++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            const size_t i = (size_t)(s >> 33) % xs[a].len;
            const double x0 = xs[a].x[i], h = 1e-5;
            xs[a].x[i] = x0 + h;
            const double lp = loss(&p);
            xs[a].x[i] = x0 - h;
            const double lm = loss(&p);
            xs[a].x[i] = x0;
            const double fd = (lp - lm) / (2 * h);
            ck_assert_msg(fabs(fd - xs[a].g[i]) <= 1e-8,
                          "%s, %s: element %zu: fd %.12g, grad %.12g", xs[a].n, name_of(&p), i, fd,
                          xs[a].g[i]);
        }
    outs_free(&u);
    prob_free(&p);
}
END_TEST

/* Chunks of many sizes (1, below the window, at it, straddling it, across tiles) give the bits
 * of one call over [0, T): the portable kernel for every size, the fast one for chunks of
 * whole blocks (multiples of blk). Padded with hf-eager rows; the padding rows after the first
 * real key carry no gradient (r = 0 there: unattended.c's condition for rows whose window is all
 * padding). */
START_TEST(window_chunks_bitwise) {
    const int w = _i % NWIN, portable = _i / NWIN;
    prob p;
    prob_init(&p, cfg_of(w, 1), portable, SBP_UNATTENDED_HF_EAGER, 0.3, 1100 + (uint64_t)_i);
    for (int i = 21; i < p.c.T; i++) /* the hole and the right padding */
        for (int x = 0; x < p.Q && !p.kmask[i]; x++) p.r[(size_t)i * p.Q + x] = 0;
    const size_t T = (size_t)p.c.T, nq = T * p.Q, nkv = T * p.KV;
    outs one = run_chunked(&p, p.c.T);
    const int portable_chunks[] = {1, 7, 16, 17, 63, 65, 100};
    const int fast_chunks[] = {16, 48, 64, 96};
    const int *cs = portable ? portable_chunks : fast_chunks;
    const int nc = portable ? 7 : 4;
    for (int t = 0; t < nc; t++) {
        outs u = run_chunked(&p, cs[t]);
        assert_same("o", &p, cs[t], u.o, one.o, nq);
        assert_same("lse", &p, cs[t], u.lse, one.lse, T * p.c.NH);
        assert_same("dq", &p, cs[t], u.dq, one.dq, nq);
        assert_same("dk", &p, cs[t], u.dk, one.dk, nkv);
        assert_same("dv", &p, cs[t], u.dv, one.dv, nkv);
        outs_free(&u);
    }
    outs_free(&one);
    prob_free(&p);
}
END_TEST

/* A window of T or more is no window: the same bits as window 0, portable and fast. */
START_TEST(window_wide_is_global) {
    const int portable = _i % 2, pad = _i / 2;
    prob a, b;
    wcfg c = cfg_of(NWIN - 1, pad);
    prob_init(&a, c, portable, pad ? SBP_UNATTENDED_HF_EAGER : 0, 0.25, 1300 + (uint64_t)_i);
    c.win = 0;
    prob_init(&b, c, portable, pad ? SBP_UNATTENDED_HF_EAGER : 0, 0.25, 1300 + (uint64_t)_i);
    const size_t T = (size_t)c.T;
    for (int chunk = 16; chunk <= c.T; chunk += c.T - 16) {
        outs u = run_chunked(&a, chunk), g = run_chunked(&b, chunk);
        assert_same("o", &a, chunk, u.o, g.o, T * a.Q);
        assert_same("dq", &a, chunk, u.dq, g.dq, T * a.Q);
        assert_same("dk", &a, chunk, u.dk, g.dk, T * a.KV);
        assert_same("dv", &a, chunk, u.dv, g.dv, T * a.KV);
        outs_free(&u), outs_free(&g);
    }
    prob_free(&a), prob_free(&b);
}
END_TEST

/* n keys of KV reals from key `first` on, readable; every key before `first` behind PROT_NONE
 * pages. *base is key 0's address (never dereferenced there); unmap with guard_free. */
typedef struct {
    void *map;
    size_t len;
    double *base;
} guarded;

static guarded guard_alloc(const double *src, int first, int T, int KV) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), row = sizeof(double) * (size_t)KV;
    const size_t before = ((size_t)first * row + page - 1) / page * page + page;
    const size_t data = ((size_t)(T - first) * row + page - 1) / page * page;
    guarded g = {.len = before + data};
    g.map = mmap(NULL, g.len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert(g.map != MAP_FAILED);
    ck_assert_int_eq(mprotect((char *)g.map + before, data, PROT_READ | PROT_WRITE), 0);
    double *at = (double *)((char *)g.map + before);
    memcpy(at, src + (size_t)first * KV, (size_t)(T - first) * row);
    g.base = (double *)((uintptr_t)at - (size_t)first * row);
    return g;
}

static void guard_free(guarded *g) {
    munmap(g->map, g->len);
}

/* The point of the window: a chunk [s, e) of a window layer reads K and V, and writes dK and dV,
 * only from the tile that holds key s − W + 1 on (the tile of the window's first key: the keys
 * before it lie behind PROT_NONE, a read there ends the test with SIGSEGV), and gives the bits
 * of the unguarded call. Chunks starting at 96 and 128, windows below and above a tile. */
START_TEST(window_reads_no_key_before_it) {
    const int portable = _i % 2, w = 1 + _i / 2; /* windows 5, 16, 17, 63, 64, 65 */
    prob p;
    prob_init(&p, cfg_of(w, 0), portable, 0, 0.3, 1500 + (uint64_t)_i);
    const int tile = portable ? ATTN_TILE : attention_tile(p.c.blk), T = p.c.T, KV = p.KV;
    for (int s = 96; s <= 128; s += 32) {
        const int e = s + 16 < T ? s + 16 : T, lo = s - p.c.win + 1;
        const int first = lo > 0 ? lo / tile * tile : 0;
        const size_t nq = (size_t)T * p.Q, nkv = (size_t)T * KV;
        double *o = zeros(nq), *lse = zeros((size_t)T * p.c.NH), *dq = zeros(nq);
        double *o2 = zeros(nq), *lse2 = zeros((size_t)T * p.c.NH), *dq2 = zeros(nq);
        double *dk = zeros(nkv), *dv = zeros(nkv);
        guarded gk = guard_alloc(p.k, first, T, KV), gv = guard_alloc(p.v, first, T, KV);
        guarded gdk = guard_alloc(dk, first, T, KV), gdv = guard_alloc(dv, first, T, KV);
        fwd(&p, o, lse, p.k, p.v, s, e);
        bwd(&p, dq, dk, dv, o, lse, p.k, p.v, s, e);
        fwd(&p, o2, lse2, gk.base, gv.base, s, e);
        bwd(&p, dq2, gdk.base, gdv.base, o2, lse2, gk.base, gv.base, s, e);
        assert_same("o (guarded)", &p, e - s, o2, o, nq);
        assert_same("dq (guarded)", &p, e - s, dq2, dq, nq);
        assert_same("dk (guarded)", &p, e - s, gdk.base + (size_t)first * KV,
                    dk + (size_t)first * KV, (size_t)(T - first) * KV);
        assert_same("dv (guarded)", &p, e - s, gdv.base + (size_t)first * KV,
                    dv + (size_t)first * KV, (size_t)(T - first) * KV);
        for (size_t x = 0; x < (size_t)first * KV; x++)
            ck_assert_msg(dk[x] == 0 && dv[x] == 0, "%s: key %zu before the window has a gradient",
                          name_of(&p), x / KV);
        guard_free(&gk), guard_free(&gv), guard_free(&gdk), guard_free(&gdv);
        free(o), free(lse), free(dq), free(o2), free(lse2), free(dq2), free(dk), free(dv);
    }
    prob_free(&p);
}
END_TEST

/* ---- the engine: Gemma-3's local layers in every schedule ----------------------------------- */

static void assert_same_grads(const sbp_model *m, const sbp_grad_result *ref,
                              const sbp_grad_result *r, const char *what) {
    const int i = tu_first_diff(m, ref->grads, r->grads);
    ck_assert_msg(i < 0, "%s: gradient of %s differs from the reference", what,
                  i < 0 ? "" : m->params.p[i].name);
    ck_assert_msg(memcmp(&ref->loss, &r->loss, sizeof r->loss) == 0,
                  "%s: loss %.17g differs from the reference's %.17g", what, r->loss, ref->loss);
}

/* gemma3-tiny (window 8, layers 0, 1 local and 2 global) on sft-tiny (T = 24, a left- and a
 * right-padded row) and sft-demo (T = 96): ckpt and stream with chunks smaller than the window,
 * equal to it, straddling it and larger, bit for bit full BP's; the portable numerics for any
 * chunk, the fast one for block multiples. _i: batch × precision × numerics. */
START_TEST(gemma_schedules_bitwise) {
    const int demo = _i / 4, fp64 = _i / 2 % 2, portable = _i % 2, block = demo ? 16 : 4;
    const int port_chunks[] = {1, 3, 7, 8, 9, 13, 20}, fast_tiny[] = {4, 8, 12, 20};
    const int fast_demo[] = {16, 32, 48, 80};
    const int *chunks = portable ? port_chunks : demo ? fast_demo : fast_tiny;
    const int n = portable ? 7 : 4;
    const sbp_numerics nm = portable ? SBP_NUMERICS_PORTABLE : SBP_NUMERICS_FAST;
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model("gemma3-tiny", 7),
            demo ? "data/batches/sft-demo.safetensors" : "data/batches/sft-tiny.safetensors",
            fp64 ? SBP_FP64 : SBP_FP32);
    ck_assert_int_gt(sbp_layer_window(&m.cfg, 0), 0);
    ck_assert_int_lt(sbp_layer_window(&m.cfg, 0), b.T);
    sbp_grad_result ref, r;
    tu_grad_n(&ref, &m, &b, nm, SBP_FULL, block, 0, 0, 0);
    char what[160];
    snprintf(what, sizeof what, "gemma3-tiny T %d %s %s ckpt", b.T, fp64 ? "fp64" : "fp32",
             portable ? "portable" : "fast");
    tu_grad_n(&r, &m, &b, nm, SBP_CKPT, block, 0, 0, 0);
    assert_same_grads(&m, &ref, &r, what);
    sbp_grad_result_free(&r, NULL);
    for (int i = 0; i < n; i++) {
        snprintf(what, sizeof what, "gemma3-tiny T %d %s %s stream chunk %d", b.T,
                 fp64 ? "fp64" : "fp32", portable ? "portable" : "fast", chunks[i]);
        tu_grad_n(&r, &m, &b, nm, SBP_STREAM, block, chunks[i], block, 0);
        assert_same_grads(&m, &ref, &r, what);
        sbp_grad_result_free(&r, NULL);
    }
    sbp_grad_result_free(&ref, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* The CUDA kernels (cuda/attention.cu, unattended.cu) in the SIMT emulator give the portable
 * CPU's bits with the window: gemma3-tiny on sft-demo (T = 96: queries past key 71 skip the
 * first tile of 64), stream chunk 16, fp32 and fp64, with rows without a key zero and hf-eager
 * (sft-demo's left padding). _i: precision × unattended mode. */
START_TEST(gemma_cuda_emu_bitwise) {
    if (!sbp_device_built(SBP_DEVICE_CUDA_EMU)) return;
    const int fp64 = _i % 2, eager = _i / 2;
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model("gemma3-tiny", 7), "data/batches/sft-demo.safetensors",
            fp64 ? SBP_FP64 : SBP_FP32);
    sbp_grad_result cpu, emu;
    sbp_grad_opts o = {.schedule = SBP_STREAM,
                       .block = 16,
                       .chunk = 16,
                       .logit_chunk = 16,
                       .numerics = SBP_NUMERICS_PORTABLE,
                       .unattended = eager ? SBP_UNATTENDED_HF_EAGER : SBP_UNATTENDED_ZERO};
    sbp_err err = {0};
    ck_assert_msg(sbp_grad(&cpu, &m, &b, &o, NULL, &err) == SBP_OK, "cpu: %s", err.msg);
    o.device = SBP_DEVICE_CUDA_EMU;
    ck_assert_msg(sbp_grad(&emu, &m, &b, &o, NULL, &err) == SBP_OK, "cuda-emu: %s", err.msg);
    char what[96];
    snprintf(what, sizeof what, "gemma3-tiny cuda-emu %s%s", fp64 ? "fp64" : "fp32",
             eager ? " hf-eager" : "");
    assert_same_grads(&m, &cpu, &emu, what);
    sbp_grad_result_free(&cpu, NULL), sbp_grad_result_free(&emu, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* Gemma-3 never unmasks a row without a key (no _unmask_unattended in 4.51.3's Gemma3TextModel):
 * --unattended hf-sdpa is hf-eager there, bit for bit, and differs from zero (sft-tiny's
 * left-padded row, its first real token made a target). */
START_TEST(gemma_sdpa_is_eager) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model("gemma3-tiny", 7), "data/batches/sft-tiny.safetensors", SBP_FP64);
    /* the first real token of a left-padded row becomes a target: predicted from a row that
     * sees no key */
    for (int bi = 0; bi < b.B; bi++) {
        const size_t row = (size_t)bi * b.T;
        int p = 0;
        while (p < b.T && !b.mask[row + p]) p++;
        if (p > 0 && p < b.T) b.labels[row + p] = b.ids[row + p];
    }
    sbp_batch_count_targets(&b);
    sbp_grad_result r[3];
    const sbp_unattended modes[] = {SBP_UNATTENDED_HF_EAGER, SBP_UNATTENDED_HF_SDPA,
                                    SBP_UNATTENDED_ZERO};
    for (int i = 0; i < 3; i++) {
        sbp_grad_opts o = {.schedule = SBP_STREAM,
                           .block = 4,
                           .chunk = 4,
                           .logit_chunk = 4,
                           .numerics = SBP_NUMERICS_PORTABLE,
                           .unattended = modes[i]};
        sbp_err err = {0};
        ck_assert_msg(sbp_grad(&r[i], &m, &b, &o, NULL, &err) == SBP_OK, "%s", err.msg);
    }
    assert_same_grads(&m, &r[0], &r[1], "gemma3-tiny hf-sdpa against hf-eager");
    ck_assert_msg(tu_first_diff(&m, r[0].grads, r[2].grads) >= 0,
                  "gemma3-tiny: hf-eager gives zero's gradient: no row without a key?");
    for (int i = 0; i < 3; i++) sbp_grad_result_free(&r[i], NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* The FLOP count (src/core/flops.c, the bench's GFLOP column) follows the kernels: with every
 * layer local (window 512, 4 layers, pattern 6) doubling T from 8192 doubles the step's work;
 * with every layer global it grows by more than 2.5. */
START_TEST(window_flops_linear) {
    sbp_config c;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_config_load(&c, "data/models/gemma3-bench.json", &err), SBP_OK);
    c.layers = 4; /* layers 0..3 of pattern 6: all local */
    sbp_grad_opts o = {.schedule = SBP_STREAM, .block = 512};
    const double local = sbp_step_flops(&c, 1, 16384, &o) / sbp_step_flops(&c, 1, 8192, &o);
    c.sliding_window_pattern = 1; /* every layer global */
    const double global = sbp_step_flops(&c, 1, 16384, &o) / sbp_step_flops(&c, 1, 8192, &o);
    ck_assert_msg(local > 1.99 && local < 2.01, "all local: work x %.4f for 2T, want 2", local);
    ck_assert_msg(global > 2.5, "all global: work x %.4f for 2T, want > 2.5", global);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("window");
    struct {
        const char *name;
        const TTest *test;
        int n;
    } cases[] = {{"naive", window_vs_naive, 4 * NWIN},
                 {"fd", window_fd, 2 * NWIN},
                 {"chunks", window_chunks_bitwise, 2 * NWIN},
                 {"wide", window_wide_is_global, 4},
                 {"guard", window_reads_no_key_before_it, 12},
                 {"gemma", gemma_schedules_bitwise, 8},
                 {"flops", window_flops_linear, 1},
                 {"cuda", gemma_cuda_emu_bitwise, 4},
                 {"sdpa", gemma_sdpa_is_eager, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name); /* CK_RUN_CASE=name runs one */
        tcase_set_timeout(tc, 300);
        tcase_add_loop_test(tc, cases[i].test, 0, cases[i].n);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
