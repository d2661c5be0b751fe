/* test_ref.c — the float64 oracle in ref/ (ref/ref.h), and what it checks:
 *  1. ref itself, by central finite differences of its own loss, on every tensor of each family:
 *     on sft-tiny, on a hand-made batch whose left-padded row has queries with no visible key and
 *     targets predicted from padded positions, and at a temperature ≠ 1 with random weights;
 *  2. src/ against ref: each family × both bundled batches × every schedule (block-multiple and
 *     ragged chunks), in float64 (≤ 1e-10 rel. L2 per parameter) and float32 (≤ 1e-4);
 *  3. ref against verify/torch_grads.py (PyTorch autograd), when torch is importable.
 * The worst measured values are printed once per check, for the README. */
#include "testutil.h"
#include "../ref/ref.h"
#include "../src/core/rng.h"
#include "../src/io/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *families[] = {"qwen3-tiny", "qwen2-tiny", "llama3-tiny"};
#define TINY "data/batches/sft-tiny.safetensors"
#define DEMO "data/batches/sft-demo.safetensors"

/* Finite differences: fd = (f(w + h e_i) − f(w − h e_i)) / 2h has truncation error h²/6·|f'''|
 * and rounding error about ε·|f|/h (ε = 1.1e-16, f ≈ 6 here). Measured with ref on the three tiny
 * models and sft-tiny, worst |fd − g| over 4 random entries of every tensor:
 *   h = 1e-4: 2.3e-9 (truncation),   h = 1e-5: 2.3e-10,   h = 1e-6: 2.1e-9 (rounding).
 * With h = 1e-5, over every check below (the suite prints them): |fd − g| ≤ 4e-10 on entries with
 * |g| ≤ 0.1 and ≤ 1.3e-9 on the largest ones (|g| ≈ 1, truncation: ~1e-9 relative); relative to
 * |g| the worst is 3.4e-7, on entries with |g| ~ 1e-4, where the absolute rounding noise dominates.
 * Bound: atol + rtol·|g| with atol = 2e-9 (5× the rounding noise) and rtol = 1e-7 (75× the
 * truncation term). A wrong derivative in any op gives errors of order |g| itself (3e-3 to 0.2
 * measured with a deliberately broken RoPE, SiLU, softmax or RMSNorm backward). */
#define FD_STEP 1e-5
#define FD_ATOL 2e-9
#define FD_RTOL 1e-7

/* src/ in float64 against ref: the two sum in different orders (blocked BLAS vs naive loops), so
 * they differ by rounding only: measured worst per-parameter rel. L2 3.5e-15, loss 3.3e-16.
 * float32 src against the float64 truth: measured worst 1.9e-6 (Qwen2's k_proj.bias, a gradient
 * that nearly cancels: a bias common to all keys would not change the softmax without RoPE),
 * loss 1.9e-8. torch_grads.py (float64 autograd) against ref: 2.7e-15. */
#define SRC_TOL_FP64      1e-10
#define SRC_LOSS_TOL_FP64 1e-12
#define SRC_TOL_FP32      1e-4
#define TORCH_TOL         1e-10

/* ---------------------------------------------------------------------------------------------
 * Helpers */

static int64_t count_targets(const sbp_batch *b) {
    int64_t n = 0;
    for (int r = 0; r < b->B; r++)
        for (int t = 0; t + 1 < b->T; t++) n += b->labels[(size_t)r * b->T + t + 1] != SBP_IGNORE;
    return n;
}

/* coef for the SFT loss: −1/N at every valid target, 0 elsewhere. */
static double *sft_coef(const sbp_batch *b) {
    double *coef = calloc((size_t)b->B * b->T, sizeof *coef);
    ck_assert_ptr_nonnull(coef);
    double N = (double)count_targets(b);
    for (int r = 0; r < b->B; r++)
        for (int t = 0; t + 1 < b->T; t++)
            if (b->labels[(size_t)r * b->T + t + 1] != SBP_IGNORE)
                coef[(size_t)r * b->T + t] = -1.0 / N;
    return coef;
}

/* f(w) = Σ coef·logp(w; tau), from ref_logprobs alone (the function the gradient is of). */
static double objective(const sbp_model *m, const sbp_batch *b, const double *w,
                        const double *coef /* (B*T) */, double tau) {
    size_t n = (size_t)b->B * b->T;
    double *logp = malloc(sizeof *logp * n), f = 0;
    ck_assert_ptr_nonnull(logp);
    sbp_err err = {0};
    if (ref_logprobs(logp, &m->cfg, &m->params, w, b, tau, &err))
        ck_abort_msg("ref_logprobs: %s", err.msg);
    for (size_t i = 0; i < n; i++) f += coef[i] * logp[i];
    free(logp);
    return f;
}

/* ref_sft's loss and gradient (allocated). */
static double *ref_grads(double *loss, const sbp_model *m, const sbp_batch *b) {
    double *g = malloc(sizeof *g * (size_t)m->params.total);
    ck_assert_ptr_nonnull(g);
    sbp_err err = {0};
    if (ref_sft(loss, g, &m->cfg, &m->params, m->w, b, &err)) ck_abort_msg("ref_sft: %s", err.msg);
    return g;
}

/* objective() at w, for tu_fd_check */
typedef struct {
    const sbp_model *m;
    const sbp_batch *b;
    const double *coef;
    double tau;
} objective_ctx;

static double objective_at(const double *w, void *ctx) {
    const objective_ctx *c = ctx;
    return objective(c->m, c->b, w, c->coef, c->tau);
}

/* fd of objective() against g on k random entries of every tensor and the largest-|g| one */
static void fd_check(const sbp_model *m, const sbp_batch *b, const double *coef, double tau,
                     const double *g /* (params.total) */, int k, uint64_t seed, const char *what) {
    objective_ctx c = {m, b, coef, tau};
    tu_fd_check(&m->params, m->w, g, objective_at, &c, FD_STEP, FD_ATOL, FD_RTOL, k, seed, what);
}

/* A hand-made batch (B = 4, T = PT) for the padding rules:
 *   row 0, left padding of 3: queries 0..2 see no key (their attention output is 0); the
 *          targets at t = 0 and t = 2 are predicted from those padded positions;
 *   row 1, right padding of 2: the target at t = 8 is predicted from a padded position that
 *          does see the real keys 0..7;
 *   row 2, holes in the middle (keys 2, 3 and 6 masked), targets from those positions too;
 *   row 3, all padding: no query sees any key, yet three targets are predicted.
 * 25 targets, 9 of them predicted from a padded position. */
#define PB 4
#define PT 10
static void make_pad_batch(sbp_batch *b, int V) {
    static const uint8_t mask[PB][PT] = {{0, 0, 0, 1, 1, 1, 1, 1, 1, 1},
                                         {1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
                                         {1, 1, 0, 0, 1, 1, 0, 1, 1, 1},
                                         {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}};
    static const int8_t has_label[PB][PT] = {{0, 1, 0, 1, 1, 0, 1, 1, 1, 1},
                                             {0, 0, 1, 1, 1, 1, 1, 1, 0, 1},
                                             {0, 1, 1, 1, 1, 1, 1, 1, 1, 0},
                                             {0, 1, 1, 0, 0, 1, 0, 0, 0, 0}};
    memset(b, 0, sizeof *b);
    b->B = PB;
    b->T = PT;
    b->ids = malloc(sizeof *b->ids * PB * PT);
    b->labels = malloc(sizeof *b->labels * PB * PT);
    b->mask = malloc(PB * PT);
    ck_assert(b->ids && b->labels && b->mask);
    for (int r = 0; r < PB; r++)
        for (int t = 0; t < PT; t++) {
            int i = r * PT + t;
            b->ids[i] = (37 * i + 11) % V;
            b->labels[i] = has_label[r][t] ? (53 * i + 5) % V : SBP_IGNORE;
            b->mask[i] = mask[r][t];
            if (t > 0 && has_label[r][t]) {
                b->n_targets++;
                b->n_pad_targets += mask[r][t - 1] == 0;
            }
        }
    ck_assert_int_eq(b->n_targets, 25);
    ck_assert_int_eq(b->n_pad_targets, 9);
}

/* ---------------------------------------------------------------------------------------------
 * 1. ref checked by finite differences */

START_TEST(fd_sft_tiny) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model(families[_i], 7), TINY, SBP_FP64);
    double loss, *g = ref_grads(&loss, &m, &b), *coef = sft_coef(&b);
    /* the loss from ref_sft is the objective the FD differentiates */
    ck_assert_double_eq_tol(loss, objective(&m, &b, m.w, coef, 1.0), 1e-14 * fabs(loss));
    char what[64];
    snprintf(what, sizeof what, "%s sft-tiny", families[_i]);
    fd_check(&m, &b, coef, 1.0, g, 2, 100 + (uint64_t)_i, what);
    free(g);
    free(coef);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

START_TEST(fd_padding) {
    sbp_model m;
    tu_load(&m, NULL, tu_model(families[_i], 7), NULL, SBP_FP64);
    sbp_batch b;
    make_pad_batch(&b, m.cfg.vocab);
    double loss, *g = ref_grads(&loss, &m, &b), *coef = sft_coef(&b);
    char what[64];
    snprintf(what, sizeof what, "%s padding batch", families[_i]);
    fd_check(&m, &b, coef, 1.0, g, 2, 200 + (uint64_t)_i, what);
    free(g);
    free(coef);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* ref_backward with arbitrary coefficients (signs mixed, as GRPO's advantages) and a
 * temperature ≠ 1: the gradient of Σ coef·logp(logits / τ). */
START_TEST(fd_temperature_and_coef) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model("qwen2-tiny", 7), TINY, SBP_FP64);
    size_t n = (size_t)b.B * b.T;
    double *coef = calloc(n, sizeof *coef), *g = calloc((size_t)m.params.total, sizeof *g);
    ck_assert(coef && g);
    sbp_rng rng;
    sbp_rng_seed(&rng, 5);
    for (size_t i = 0; i < n; i++) coef[i] = sbp_rng_normal(&rng) / 10;
    sbp_err err = {0};
    ck_assert_msg(ref_backward(g, coef, &m.cfg, &m.params, m.w, &b, 0.7, &err) == 0, "%s", err.msg);
    fd_check(&m, &b, coef, 0.7, g, 2, 300, "qwen2-tiny tau 0.7, random coef");
    double *g2 = malloc(sizeof *g2 * (size_t)m.params.total);
    ck_assert_ptr_nonnull(g2);
    /* ref_backward accumulates: a second call on top of the first doubles the gradient (up to
     * the rounding of the additions) */
    memcpy(g2, g, sizeof *g2 * (size_t)m.params.total);
    ck_assert_int_eq(ref_backward(g2, coef, &m.cfg, &m.params, m.w, &b, 0.7, &err), 0);
    double num = 0, den = 0;
    for (int64_t i = 0; i < m.params.total; i++) {
        num += (g2[i] - 2 * g[i]) * (g2[i] - 2 * g[i]);
        den += 4 * g[i] * g[i];
    }
    ck_assert_msg(sqrt(num / den) <= 1e-14, "second ref_backward call: rel. L2 %.3g from 2g",
                  sqrt(num / den));
    free(g2);
    free(g);
    free(coef);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* The padding rules, exactly: a query with no visible key outputs 0, so a padded token that no
 * query sees (tokens 0 and 1 of row 0, token 0 of row 3) influences nothing but the prediction at
 * its own position; and logp is 0 wherever there is no target (ignored labels and t = T−1). */
START_TEST(padding_semantics) {
    sbp_model m;
    tu_load(&m, NULL, tu_model(families[_i], 7), NULL, SBP_FP64);
    sbp_batch b;
    make_pad_batch(&b, m.cfg.vocab);
    double a[PB * PT], c[PB * PT];
    sbp_err err = {0};
    ck_assert_msg(ref_logprobs(a, &m.cfg, &m.params, m.w, &b, 1.0, &err) == 0, "%s", err.msg);
    for (int r = 0; r < PB; r++)
        for (int t = 0; t < PT; t++) {
            int i = r * PT + t, has = t + 1 < PT && b.labels[i + 1] != SBP_IGNORE;
            ck_assert_msg(has ? a[i] < 0 : a[i] == 0, "logp[%d][%d] = %g", r, t, a[i]);
        }
    const int changed[] = {0, 1, 3 * PT};
    for (int k = 0; k < 3; k++) b.ids[changed[k]] = (b.ids[changed[k]] + 1 + k) % m.cfg.vocab;
    ck_assert_int_eq(ref_logprobs(c, &m.cfg, &m.params, m.w, &b, 1.0, &err), 0);
    ck_assert(c[0] != a[0] && c[3 * PT] != a[3 * PT]); /* their own tokens changed */
    for (int i = 0; i < PB * PT; i++)
        if (i != 0 && i != 3 * PT)
            ck_assert_msg(memcmp(&a[i], &c[i], sizeof a[i]) == 0,
                          "logp[%d][%d] depends on an invisible padded token: %.17g vs %.17g",
                          i / PT, i % PT, a[i], c[i]);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* Bad input: an error with a message, and nothing written. */
START_TEST(errors) {
    sbp_model m;
    tu_load(&m, NULL, tu_model("qwen3-tiny", 7), NULL, SBP_FP64);
    sbp_batch b;
    make_pad_batch(&b, m.cfg.vocab);
    size_t n = (size_t)m.params.total;
    double *g = malloc(sizeof *g * n), loss = 42, logp[PB * PT] = {0};
    ck_assert_ptr_nonnull(g);
    for (size_t i = 0; i < n; i++) g[i] = 7;
    sbp_err err = {0};
    /* no target at all (N = 0) */
    int32_t labels[PB * PT];
    memcpy(labels, b.labels, sizeof labels);
    for (int i = 0; i < PB * PT; i++) b.labels[i] = SBP_IGNORE;
    ck_assert_int_eq(ref_sft(&loss, g, &m.cfg, &m.params, m.w, &b, &err), SBP_EINPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "no target"));
    memcpy(b.labels, labels, sizeof labels);
    /* a token id outside the vocabulary */
    b.ids[3] = m.cfg.vocab;
    err.msg[0] = '\0';
    ck_assert_int_eq(ref_sft(&loss, g, &m.cfg, &m.params, m.w, &b, &err), SBP_EINPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "input_ids[0][3]"));
    b.ids[3] = 0;
    /* a temperature that is not > 0 */
    ck_assert_int_eq(ref_logprobs(logp, &m.cfg, &m.params, m.w, &b, 0.0, &err), SBP_EUSAGE);
    ck_assert_int_eq(ref_backward(g, logp, &m.cfg, &m.params, m.w, &b, -1.0, &err), SBP_EUSAGE);
    ck_assert(loss == 42);
    for (size_t i = 0; i < n; i++) ck_assert(g[i] == 7);
    free(g);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 2. src against ref */

typedef struct {
    sbp_schedule s;
    int block, chunk, logit_chunk, chunked_logits;
} sched;

/* Compares one sbp_grad result (model mr, float32 or float64) with ref's gradient; fails naming
 * the first parameter out of tolerance. Returns the worst rel. L2 and its parameter in *where. */
static double compare(const sbp_model *mr, const sbp_grad_result *r, const sbp_model *m64,
                      const double *g, double ref_loss, double tol, double loss_tol,
                      double *loss_err, const char *what, const char **where) {
    double worst = 0;
    for (int i = 0; i < mr->params.n; i++) {
        const sbp_param *p = &mr->params.p[i];
        double e = tu_rel_l2(mr, r->grads, m64, g, p);
        ck_assert_msg(e <= tol, "%s: %s rel. L2 %.3g > %.3g against ref", what, p->name, e, tol);
        if (e >= worst) {
            worst = e;
            *where = p->name;
        }
    }
    *loss_err = fabs(r->loss - ref_loss) / fabs(ref_loss);
    ck_assert_msg(*loss_err <= loss_tol, "%s: loss %.17g vs ref %.17g (rel. %.3g > %.3g)", what,
                  r->loss, ref_loss, *loss_err, loss_tol);
    return worst;
}

typedef struct {
    double grad, loss;
    char where[320];
} worst_seen;

static void run_against_ref(const char *family, const char *model_dir, const sbp_batch *b,
                            const char *batch_name, const sched *ss, int nss, worst_seen *w64,
                            worst_seen *w32) {
    sbp_model m64, m32;
    tu_load(&m64, NULL, model_dir, NULL, SBP_FP64);
    tu_load(&m32, NULL, model_dir, NULL, SBP_FP32);
    double ref_loss, *g = ref_grads(&ref_loss, &m64, b);
    for (int prec = 0; prec < 2; prec++)
        for (int num = 0; num < 2; num++) {
            const sbp_model *m = prec ? &m32 : &m64;
            worst_seen *ws = prec ? w32 : w64;
            for (int i = 0; i < nss; i++) {
                const sched *c = &ss[i];
                char what[240];
                snprintf(what, sizeof what, "%s %s %s %s %s block %d chunk %d logit chunk %d%s",
                         family, batch_name, prec ? "fp32" : "fp64", num ? "portable" : "fast",
                         sbp_schedule_name(c->s), c->block, c->chunk, c->logit_chunk,
                         c->chunked_logits ? " (chunked logits)" : "");
                sbp_grad_result r;
                tu_grad_n(&r, m, b, (sbp_numerics)num, c->s, c->block, c->chunk, c->logit_chunk,
                          c->chunked_logits);
                ck_assert_int_eq(r.n_targets, count_targets(b));
                double tol = prec ? SRC_TOL_FP32 : SRC_TOL_FP64;
                double ltol = prec ? SRC_TOL_FP32 : SRC_LOSS_TOL_FP64, le;
                const char *where = "";
                double e = compare(m, &r, &m64, g, ref_loss, tol, ltol, &le, what, &where);
                if (e > ws->grad) {
                    ws->grad = e;
                    snprintf(ws->where, sizeof ws->where, "%s, %s", what, where);
                }
                if (le > ws->loss) ws->loss = le;
                sbp_grad_result_free(&r, NULL);
            }
        }
    free(g);
    sbp_model_free(&m64, NULL);
    sbp_model_free(&m32, NULL);
}

/* Every family × both batches × full, ckpt (materialised and chunked logits) and stream with a
 * block-multiple chunk and a ragged one, float64 and float32, fast and portable numerics. One test, so that the worst values
 * over all of it are printed once. */
START_TEST(src_against_ref) {
    /* sft-tiny: T = 24, block 4; sft-demo: T = 96, block 16 */
    const sched tiny[] = {{SBP_FULL, 4, 0, 0, 0},    {SBP_CKPT, 4, 0, 0, 0},
                          {SBP_CKPT, 4, 0, 8, 1},    {SBP_STREAM, 4, 8, 4, 0},
                          {SBP_STREAM, 4, 4, 12, 0}, {SBP_STREAM, 4, 7, 7, 0},
                          {SBP_STREAM, 4, 1, 5, 0}};
    const sched demo[] = {{SBP_FULL, 16, 0, 0, 0},     {SBP_CKPT, 16, 0, 0, 0},
                          {SBP_CKPT, 16, 0, 32, 1},    {SBP_STREAM, 16, 32, 16, 0},
                          {SBP_STREAM, 16, 16, 48, 0}, {SBP_STREAM, 16, 7, 7, 0}};
    worst_seen w64 = {0}, w32 = {0};
    for (int f = 0; f < 3; f++) {
        const char *dir = tu_model(families[f], 7);
        for (int k = 0; k < 2; k++) {
            sbp_model m;
            sbp_batch b;
            tu_load(&m, &b, dir, k ? DEMO : TINY, SBP_FP64);
            ck_assert_int_eq(b.n_targets, count_targets(&b));
            run_against_ref(families[f], dir, &b, k ? "sft-demo" : "sft-tiny", k ? demo : tiny,
                            k ? 6 : 7, &w64, &w32);
            sbp_batch_free(&b);
            sbp_model_free(&m, NULL);
        }
    }
    printf("src vs ref, fp64: worst per-parameter rel. L2 %.2e (%s); worst loss rel. error %.2e\n",
           w64.grad, w64.where, w64.loss);
    printf("src vs ref, fp32: worst per-parameter rel. L2 %.2e (%s); worst loss rel. error %.2e\n",
           w32.grad, w32.where, w32.loss);
    fflush(stdout);
}
END_TEST

/* The hand-made padding batch (queries with no visible key, targets from padded positions)
 * through every schedule in float64. */
START_TEST(src_against_ref_padding) {
    const sched ss[] = {{SBP_FULL, 2, 0, 0, 0},
                        {SBP_CKPT, 2, 0, 0, 0},
                        {SBP_STREAM, 2, 4, 2, 0},
                        {SBP_STREAM, 2, 3, 3, 0}};
    worst_seen w64 = {0}, w32 = {0};
    sbp_model m;
    const char *dir = tu_model(families[_i], 7);
    tu_load(&m, NULL, dir, NULL, SBP_FP64);
    sbp_batch b;
    make_pad_batch(&b, m.cfg.vocab);
    run_against_ref(families[_i], dir, &b, "padding batch", ss, 4, &w64, &w32);
    printf("src vs ref, %s padding batch: worst rel. L2 fp64 %.2e, fp32 %.2e\n", families[_i],
           w64.grad, w32.grad);
    fflush(stdout);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 3. PyTorch cross-check */

/* Writes batch b as a safetensors file torch_grads.py can read. */
static void save_batch(const char *path, const sbp_batch *b) {
    size_t n = (size_t)b->B * b->T;
    int32_t *mask = malloc(sizeof *mask * n);
    ck_assert_ptr_nonnull(mask);
    for (size_t i = 0; i < n; i++) mask[i] = b->mask[i];
    sbp_st_entry e[3] = {
        {"input_ids", SBP_DT_I32, 2, {b->B, b->T}, b->ids},
        {"labels", SBP_DT_I32, 2, {b->B, b->T}, b->labels},
        {"attention_mask", SBP_DT_I32, 2, {b->B, b->T}, mask},
    };
    sbp_err err = {0};
    if (sbp_st_write(path, e, 3, NULL, &err)) ck_abort_msg("%s", err.msg);
    free(mask);
}

/* ref against torch_grads.py on one model and batch; returns the worst rel. L2. */
static double against_torch(const char *family, const char *batch_name, const char *batch_path,
                            const sbp_model *m, const sbp_batch *b, double *loss_err) {
    char out[700];
    snprintf(out, sizeof out, "%s/torch-%s-%s.safetensors", tu_tmpdir(), family, batch_name);
    int rc = tu_sh("/usr/bin/python3 verify/torch_grads.py --model '%s' --batch '%s' --out '%s'",
                   tu_model(family, 7), batch_path, out);
    ck_assert_msg(rc == 0, "torch_grads.py failed (%d) on %s %s: %s", rc, family, batch_name,
                  tu_last_output());
    double ref_loss, *g = ref_grads(&ref_loss, m, b);
    sbp_st_file sf;
    sbp_err err = {0};
    if (sbp_st_open(&sf, out, &err)) ck_abort_msg("%s", err.msg);
    const char *ls = sbp_st_meta(&sf, "loss");
    ck_assert_msg(ls != NULL, "%s: no loss in __metadata__", out);
    double torch_loss = strtod(ls, NULL), worst = 0;
    *loss_err = fabs(torch_loss - ref_loss) / fabs(ref_loss);
    ck_assert_msg(*loss_err <= SRC_LOSS_TOL_FP64, "%s %s: torch loss %.17g vs ref %.17g", family,
                  batch_name, torch_loss, ref_loss);
    for (int i = 0; i < m->params.n; i++) {
        const sbp_param *p = &m->params.p[i];
        const sbp_st_tensor *t = sbp_st_find(&sf, p->name);
        ck_assert_msg(t != NULL, "%s: no tensor %s", out, p->name);
        ck_assert_int_eq(t->numel, p->numel);
        double *tg = malloc(sizeof *tg * (size_t)p->numel), num = 0, den = 0;
        ck_assert_ptr_nonnull(tg);
        if (sbp_st_read(&sf, t, tg, SBP_DT_F64, &err)) ck_abort_msg("%s", err.msg);
        for (int64_t j = 0; j < p->numel; j++) {
            double d = tg[j] - g[p->offset + j];
            num += d * d;
            den += g[p->offset + j] * g[p->offset + j];
        }
        double e = den > 0 ? sqrt(num / den) : sqrt(num);
        ck_assert_msg(e <= TORCH_TOL, "%s %s: %s rel. L2 torch vs ref %.3g > %.3g", family,
                      batch_name, p->name, e, TORCH_TOL);
        if (e > worst) worst = e;
        free(tg);
    }
    sbp_st_close(&sf);
    free(g);
    return worst;
}

START_TEST(torch_cross_check) {
    if (tu_sh("/usr/bin/python3 -c 'import torch'") != 0) {
        printf("SKIPPED: PyTorch not importable (python3-torch); cross-check not run\n");
        fflush(stdout);
        return;
    }
    double worst = 0, worst_loss = 0, le;
    for (int f = 0; f < 3; f++) {
        sbp_model m;
        sbp_batch b;
        tu_load(&m, &b, tu_model(families[f], 7), TINY, SBP_FP64);
        worst = fmax(worst, against_torch(families[f], "sft-tiny", TINY, &m, &b, &le));
        worst_loss = fmax(worst_loss, le);
        sbp_batch_free(&b);
        if (f == 0) { /* the padding batch, on one family: torch's no-visible-key rows */
            char path[700];
            snprintf(path, sizeof path, "%s/pad-batch.safetensors", tu_tmpdir());
            make_pad_batch(&b, m.cfg.vocab);
            save_batch(path, &b);
            worst = fmax(worst, against_torch(families[f], "padding", path, &m, &b, &le));
            worst_loss = fmax(worst_loss, le);
            sbp_batch_free(&b);
        }
        sbp_model_free(&m, NULL);
    }
    printf("ref vs torch (float64): worst per-parameter rel. L2 %.2e; worst loss rel. error "
           "%.2e\n",
           worst, worst_loss);
    fflush(stdout);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("ref");
    TCase *fd = tcase_create("finite differences");
    tcase_set_timeout(fd, 300);
    tcase_add_loop_test(fd, fd_sft_tiny, 0, 3);
    tcase_add_loop_test(fd, fd_padding, 0, 3);
    tcase_add_test(fd, fd_temperature_and_coef);
    tcase_add_loop_test(fd, padding_semantics, 0, 3);
    tcase_add_test(fd, errors);
    suite_add_tcase(s, fd);
    TCase *src = tcase_create("src against ref");
    tcase_set_timeout(src, 300);
    tcase_add_test(src, src_against_ref);
    tcase_add_loop_test(src, src_against_ref_padding, 0, 3);
    suite_add_tcase(s, src);
    TCase *torch = tcase_create("torch");
    tcase_set_timeout(torch, 300);
    tcase_add_test(torch, torch_cross_check);
    suite_add_tcase(s, torch);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
