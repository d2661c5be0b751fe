/* test_ref.c — the float64 oracle in ref/ (ref/ref.h), and what it checks:
 *  1. ref itself, by central finite differences of its own loss, on every tensor of each family:
 *     on sft-tiny, on a hand-made batch whose left-padded row has queries with no visible key and
 *     targets predicted from padded positions, and at a temperature ≠ 1 with random weights;
 *  2. src/ against ref: each family × both bundled batches × every schedule (block-multiple and
 *     ragged chunks), in float64 (≤ 1e-10 rel. L2 per parameter) and float32 (≤ 1e-4);
 *  3. ref against verify/torch_grads.py (PyTorch autograd), when torch is installed;
 *  4. rows that see no key (zero, hf-eager, hf-sdpa) and LoRA adapters: the oracle by finite
 *     differences (hf-eager, whose gradient is autograd's and not the derivative of its forward,
 *     on the tensors no score depends on, and at a point where it is hf-sdpa's), and src against
 *     it for SFT, DPO and GRPO, every mode with and without an adapter, every schedule, float64;
 *     `grad --lora --ref-model` (the reference a plain model) against it.
 * The worst measured values are printed once per check, for docs/numerics.md §1. */
#include "testutil.h"
#include "../ref/ref.h"
#include "../src/core/rng.h"
#include "../src/io/safetensors.h"

#include <cJSON.h>
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

/* Σ coef·logp(tau) of a network, from ref_logprobs alone (the function the gradient is of). */
static double net_objective(const ref_net *net, const sbp_batch *b, const double *coef /* (B*T) */,
                            double tau) {
    size_t n = (size_t)b->B * b->T;
    double *logp = malloc(sizeof *logp * n), f = 0;
    ck_assert_ptr_nonnull(logp);
    sbp_err err = {0};
    if (ref_logprobs(logp, net, b, tau, &err)) ck_abort_msg("ref_logprobs: %s", err.msg);
    for (size_t i = 0; i < n; i++) f += coef[i] * logp[i];
    free(logp);
    return f;
}

/* f(w) = Σ coef·logp(w; tau) of the plain model m with weights w. */
static double objective(const sbp_model *m, const sbp_batch *b, const double *w,
                        const double *coef /* (B*T) */, double tau) {
    return net_objective(REF_NET(&m->cfg, &m->params, w), b, coef, tau);
}

/* ref_sft's loss and gradient (allocated). */
static double *ref_grads(double *loss, const sbp_model *m, const sbp_batch *b) {
    double *g = malloc(sizeof *g * (size_t)m->params.total);
    ck_assert_ptr_nonnull(g);
    sbp_err err = {0};
    if (ref_sft(loss, g, REF_NET(&m->cfg, &m->params, m->w), b, &err))
        ck_abort_msg("ref_sft: %s", err.msg);
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
    ck_assert_msg(ref_backward(g, coef, REF_NET(&m.cfg, &m.params, m.w), &b, 0.7, &err) == 0, "%s",
                  err.msg);
    fd_check(&m, &b, coef, 0.7, g, 2, 300, "qwen2-tiny tau 0.7, random coef");
    double *g2 = malloc(sizeof *g2 * (size_t)m.params.total);
    ck_assert_ptr_nonnull(g2);
    /* ref_backward accumulates: a second call on top of the first doubles the gradient (up to
     * the rounding of the additions) */
    memcpy(g2, g, sizeof *g2 * (size_t)m.params.total);
    ck_assert_int_eq(ref_backward(g2, coef, REF_NET(&m.cfg, &m.params, m.w), &b, 0.7, &err), 0);
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
    ck_assert_msg(ref_logprobs(a, REF_NET(&m.cfg, &m.params, m.w), &b, 1.0, &err) == 0, "%s",
                  err.msg);
    for (int r = 0; r < PB; r++)
        for (int t = 0; t < PT; t++) {
            int i = r * PT + t, has = t + 1 < PT && b.labels[i + 1] != SBP_IGNORE;
            ck_assert_msg(has ? a[i] < 0 : a[i] == 0, "logp[%d][%d] = %g", r, t, a[i]);
        }
    const int changed[] = {0, 1, 3 * PT};
    for (int k = 0; k < 3; k++) b.ids[changed[k]] = (b.ids[changed[k]] + 1 + k) % m.cfg.vocab;
    ck_assert_int_eq(ref_logprobs(c, REF_NET(&m.cfg, &m.params, m.w), &b, 1.0, &err), 0);
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
    ck_assert_int_eq(ref_sft(&loss, g, REF_NET(&m.cfg, &m.params, m.w), &b, &err), SBP_EINPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "no target"));
    memcpy(b.labels, labels, sizeof labels);
    /* a token id outside the vocabulary */
    b.ids[3] = m.cfg.vocab;
    err.msg[0] = '\0';
    ck_assert_int_eq(ref_sft(&loss, g, REF_NET(&m.cfg, &m.params, m.w), &b, &err), SBP_EINPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "input_ids[0][3]"));
    b.ids[3] = 0;
    /* a temperature that is not > 0 */
    ck_assert_int_eq(ref_logprobs(logp, REF_NET(&m.cfg, &m.params, m.w), &b, 0.0, &err),
                     SBP_EUSAGE);
    ck_assert_int_eq(ref_backward(g, logp, REF_NET(&m.cfg, &m.params, m.w), &b, -1.0, &err),
                     SBP_EUSAGE);
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
 * block-multiple chunk and a ragged one, float64 and float32, fast and portable numerics. One test,
 * so that the worst values over all of it are printed once. */
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

/* torch_grads.py's gradient file of one model and batch (torch_cross_check writes them). */
static const char *torch_file(const char *family, const char *batch_name) {
    return tu_path("torch-%s-%s.safetensors", family, batch_name);
}

/* ref against torch_grads.py's file of one model and batch; returns the worst rel. L2. */
static double against_torch(const char *family, const char *batch_name, const sbp_model *m,
                            const sbp_batch *b, double *loss_err) {
    char out[700];
    snprintf(out, sizeof out, "%s", torch_file(family, batch_name));
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
    if (!tu_python_has("/usr/bin/python3", "torch")) {
        printf("SKIPPED: PyTorch not installed (python3-torch); cross-check not run\n");
        fflush(stdout);
        return;
    }
    /* the padding batch, on the first family: torch's no-visible-key rows */
    char pad_path[700];
    snprintf(pad_path, sizeof pad_path, "%s/pad-batch.safetensors", tu_tmpdir());
    sbp_batch pad;
    sbp_model m0;
    sbp_batch b;
    tu_load(&m0, &b, tu_model(families[0], 7), TINY, SBP_FP64);
    make_pad_batch(&pad, m0.cfg.vocab);
    save_batch(pad_path, &pad);
    sbp_batch_free(&b);
    sbp_model_free(&m0, NULL);
    /* every torch run in one process (--jobs): torch is imported once */
    const char *jobs = tu_path("torch-ref-jobs.txt");
    FILE *jf = fopen(jobs, "w");
    ck_assert_ptr_nonnull(jf);
    for (int f = 0; f < 3; f++)
        fprintf(jf, "--model '%s' --batch '%s' --out '%s'\n", tu_model(families[f], 7), TINY,
                torch_file(families[f], "sft-tiny"));
    fprintf(jf, "--model '%s' --batch '%s' --out '%s'\n", tu_model(families[0], 7), pad_path,
            torch_file(families[0], "padding"));
    ck_assert_int_eq(fclose(jf), 0);
    int rc = tu_sh("/usr/bin/python3 verify/torch_grads.py --jobs '%s'", jobs);
    ck_assert_msg(rc == 0, "torch_grads.py --jobs failed (%d): %s", rc, tu_last_output());

    double worst = 0, worst_loss = 0, le;
    for (int f = 0; f < 3; f++) {
        sbp_model m;
        tu_load(&m, &b, tu_model(families[f], 7), TINY, SBP_FP64);
        worst = fmax(worst, against_torch(families[f], "sft-tiny", &m, &b, &le));
        worst_loss = fmax(worst_loss, le);
        sbp_batch_free(&b);
        if (f == 0) {
            worst = fmax(worst, against_torch(families[f], "padding", &m, &pad, &le));
            worst_loss = fmax(worst_loss, le);
        }
        sbp_model_free(&m, NULL);
    }
    sbp_batch_free(&pad);
    printf("ref vs torch (float64): worst per-parameter rel. L2 %.2e; worst loss rel. error "
           "%.2e\n",
           worst, worst_loss);
    fflush(stdout);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 4. Rows that see no key (ref/SEMANTICS.md) and LoRA adapters: the oracle by finite differences,
 *    and src against it for SFT, DPO and GRPO in every schedule */

#define LEFT_PAD  "data/batches/suite-unattended-left-pad.safetensors"
#define DPO_TINY  "data/batches/dpo-tiny.safetensors"
#define GRPO_TINY "data/batches/grpo-tiny.safetensors"

static const sbp_unattended modes[3] = {SBP_UNATTENDED_ZERO, SBP_UNATTENDED_HF_EAGER,
                                        SBP_UNATTENDED_HF_SDPA};

/* net_objective as a function of the base weights, or of the adapter's when net has one. */
typedef struct {
    const ref_net *net;
    const sbp_batch *b;
    const double *coef; /* (B*T) */
} net_ctx;

static double net_objective_at(const double *w, void *ctx) {
    const net_ctx *c = ctx;
    ref_net n = *c->net;
    ref_lora a;
    if (n.lora) {
        a = *n.lora;
        a.w = (double *)w; /* only read */
        n.lora = &a;
    } else {
        n.w = w;
    }
    return net_objective(&n, c->b, c->coef, 1.0);
}

/* ref_backward of Σ coef·logp (allocated, ref_grad_total(net)). */
static double *net_grads(const ref_net *net, const sbp_batch *b, const double *coef) {
    double *g = calloc((size_t)ref_grad_total(net), sizeof *g);
    ck_assert_ptr_nonnull(g);
    sbp_err err = {0};
    if (ref_backward(g, coef, net, b, 1.0, &err)) ck_abort_msg("ref_backward: %s", err.msg);
    return g;
}

static double rel_l2(const double *a, const double *b /* the reference */, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The tensors some layer's q or k depends on: the last layer's input norm, q, k (their biases
 * and norms), and everything before it. */
static int feeds_scores(const sbp_param *p, int L) {
    if (p->layer < 0) return p->kind == SBP_P_EMBED;
    if (p->layer < L - 1) return 1;
    return p->kind == SBP_P_IN_NORM || p->kind == SBP_P_Q || p->kind == SBP_P_QB ||
           p->kind == SBP_P_K || p->kind == SBP_P_KB || p->kind == SBP_P_QNORM ||
           p->kind == SBP_P_KNORM;
}

/* _i: family (_i / 3), mode (_i % 3). The oracle's SFT gradient on LEFT_PAD (two left-padded
 * rows whose first real token is predicted from a pad) against central differences of its
 * logp. zero and hf-sdpa are smooth functions of the weights: every tensor. hf-eager's forward
 * is uniform whatever the scores, but its gradient is autograd's through HF's finite-minimum mask,
 * which passes ds = p (dp − D) to the scores: it is the derivative of the forward only on the
 * tensors no score depends on, and must not be one on the others (its largest entry of the
 * last layer's q_proj is compared with FD); eager_at_uniform_point checks what it is there. */
START_TEST(fd_unattended) {
    const char *family = families[_i / 3];
    const sbp_unattended u = modes[_i % 3];
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model(family, 7), LEFT_PAD, SBP_FP64);
    int64_t rows, targets;
    sbp_batch_count_unattended(&b, &rows, &targets);
    ck_assert(rows == 9 && targets == 2);
    const ref_net net = {.cfg = &m.cfg, .ps = &m.params, .w = m.w, .unattended = u};
    double *coef = sft_coef(&b), *g = net_grads(&net, &b, coef);
    sbp_params sel = m.params; /* the tensors checked */
    sel.p = malloc(sizeof *sel.p * (size_t)m.params.n);
    ck_assert_ptr_nonnull(sel.p);
    sel.n = 0;
    for (int i = 0; i < m.params.n; i++)
        if (u != SBP_UNATTENDED_HF_EAGER || !feeds_scores(&m.params.p[i], m.cfg.layers))
            sel.p[sel.n++] = m.params.p[i];
    char what[96];
    snprintf(what, sizeof what, "%s left-pad %s%s", family, sbp_unattended_name(u),
             u == SBP_UNATTENDED_HF_EAGER ? " (no score)" : "");
    net_ctx c = {&net, &b, coef};
    tu_fd_check(&sel, m.w, g, net_objective_at, &c, FD_STEP, FD_ATOL, FD_RTOL, 2,
                400 + (uint64_t)_i, what);
    if (u == SBP_UNATTENDED_HF_EAGER) {
        char name[80];
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.weight", m.cfg.layers - 1);
        const sbp_param *p = &m.params.p[sbp_params_find(&m.params, name)];
        int64_t j = 0;
        for (int64_t k = 1; k < p->numel; k++)
            if (fabs(g[p->offset + k]) > fabs(g[p->offset + j])) j = k;
        double *w = (double *)m.w, w0 = w[p->offset + j];
        w[p->offset + j] = w0 + FD_STEP;
        double up = net_objective(&net, &b, coef, 1.0);
        w[p->offset + j] = w0 - FD_STEP;
        double down = net_objective(&net, &b, coef, 1.0), fd = (up - down) / (2 * FD_STEP);
        w[p->offset + j] = w0;
        printf("fd %-44s q_proj[%lld]: gradient %.6e, central difference %.6e\n", what,
               (long long)j, g[p->offset + j], fd);
        ck_assert_msg(fabs(fd - g[p->offset + j]) > 1e-3 * fabs(g[p->offset + j]),
                      "%s: hf-eager's q_proj gradient %.12g is the FD %.12g", what,
                      g[p->offset + j], fd);
    }
    free(sel.p);
    free(g);
    free(coef);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* hf-eager's gradient where it is a derivative: at weights where the scores of every row that sees
 * no key are equal over all keys, hf-eager's uniform p is hf-sdpa's softmax and autograd's ds is
 * the derivative of hf-sdpa's smooth function. One layer of llama3-tiny (no bias, no q/k norm),
 * with the pad token (id 0, at the pads of LEFT_PAD and nowhere else) embedded in the null space
 * of q_proj: the pads' q is 0. There hf-eager's logp and gradient are hf-sdpa's, which match FD. */
START_TEST(eager_at_uniform_point) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model("llama3-tiny", 7), LEFT_PAD, SBP_FP64);
    for (int i = 0; i < b.B * b.T; i++) ck_assert_int_eq(b.ids[i] == 0, b.mask[i] == 0);
    sbp_config c1 = m.cfg;
    c1.layers = 1;
    sbp_params ps;
    sbp_err err = {0};
    ck_assert_msg(ref_params_build(&ps, &c1, &err) == SBP_OK, "%s", err.msg);
    double *w = malloc(sizeof *w * (size_t)ps.total);
    ck_assert_ptr_nonnull(w);
    for (int i = 0; i < ps.n; i++) { /* the first layer of m, its embedding, norm and head */
        int k = sbp_params_find(&m.params, ps.p[i].name);
        ck_assert_int_ge(k, 0);
        memcpy(w + ps.p[i].offset, (const double *)m.w + m.params.p[k].offset,
               sizeof *w * (size_t)ps.p[i].numel);
    }
    /* q_proj's column 0 zero and the pad's embedding e_0: the pads' xn is along e_0, their q 0 */
    double *wq = w + sbp_params_offset(&ps, SBP_P_Q, 0),
           *pad = w + sbp_params_offset(&ps, SBP_P_EMBED, -1);
    for (int i = 0; i < c1.heads * c1.head_dim; i++) wq[(size_t)i * c1.hidden] = 0;
    memset(pad, 0, sizeof *pad * (size_t)c1.hidden);
    pad[0] = 1;
    ref_net net[3];
    for (int u = 0; u < 3; u++)
        net[u] = (ref_net){.cfg = &c1, .ps = &ps, .w = w, .unattended = modes[u]};
    const size_t n = (size_t)b.B * b.T;
    double *le = malloc(sizeof *le * n), *ls = malloc(sizeof *ls * n), *coef = sft_coef(&b);
    ck_assert(le && ls);
    ck_assert_int_eq(ref_logprobs(le, &net[1], &b, 1.0, &err), SBP_OK);
    ck_assert_int_eq(ref_logprobs(ls, &net[2], &b, 1.0, &err), SBP_OK);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabs(le[i] - ls[i]) <= 1e-14 * fabs(ls[i]),
                      "logp[%zu]: hf-eager %.17g, hf-sdpa %.17g", i, le[i], ls[i]);
    double *gz = net_grads(&net[0], &b, coef), *ge = net_grads(&net[1], &b, coef),
           *gs = net_grads(&net[2], &b, coef), worst = 0;
    for (int i = 0; i < ps.n; i++) {
        const sbp_param *p = &ps.p[i];
        double e = rel_l2(ge + p->offset, gs + p->offset, p->numel);
        ck_assert_msg(e <= 1e-13, "%s: hf-eager vs hf-sdpa rel. L2 %.3g", p->name, e);
        worst = fmax(worst, e);
    }
    /* the point is not trivial: the pads' scores pass a gradient to q_proj (zero mode none) */
    const sbp_param *q = &ps.p[sbp_params_find(&ps, "model.layers.0.self_attn.q_proj.weight")];
    ck_assert(rel_l2(gz + q->offset, ge + q->offset, q->numel) > 1e-3);
    printf("hf-eager at a uniform point (1-layer llama3-tiny): gradient vs hf-sdpa rel. L2 %.2e\n",
           worst);
    net_ctx c = {&net[2], &b, coef};
    tu_fd_check(&ps, w, gs, net_objective_at, &c, FD_STEP, FD_ATOL, FD_RTOL, 2, 500,
                "llama3-tiny 1 layer, uniform point, hf-sdpa");
    free(gz), free(ge), free(gs), free(le), free(ls), free(coef), free(w);
    ref_params_free(&ps);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* Adapters per family: every projection, some, and rsLoRA. */
static const sbp_lora_config lora_cfgs[3] = {
    {.r = 4, .alpha = 8, .targets = SBP_LORA_ALL},
    {.r = 2,
     .alpha = 4,
     .use_rslora = 1,
     .targets = SBP_LORA_Q | SBP_LORA_V | SBP_LORA_O | SBP_LORA_DOWN},
    {.r = 3, .alpha = 5, .targets = SBP_LORA_K | SBP_LORA_GATE | SBP_LORA_UP}};

/* A peft adapter directory for model cfg with B ≠ 0 (normal, std 0.05: with B = 0 every gradient
 * of A is 0), written by the library; both sides then read the same file. */
static const char *make_adapter(const char *name, const sbp_config *cfg, const sbp_lora_config *lc,
                                uint64_t seed) {
    sbp_lora a;
    sbp_err err = {0};
    const char *dir = tu_new_dir(name);
    if (sbp_lora_init(&a, cfg, lc, seed, 0.05, SBP_FP64, &err) ||
        sbp_lora_save(dir, &a, NULL, &err))
        ck_abort_msg("adapter %s: %s", name, err.msg);
    sbp_lora_free(&a, NULL);
    return dir;
}

/* The oracle's adapter gradient (d loss / d lora_A, lora_B; the base frozen) against central
 * differences of its logp in the adapter's weights: on sft-tiny, and for qwen2-tiny on LEFT_PAD
 * with hf-sdpa rows. */
START_TEST(fd_lora) {
    const sbp_unattended u = _i == 1 ? SBP_UNATTENDED_HF_SDPA : SBP_UNATTENDED_ZERO;
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, tu_model(families[_i], 7), _i == 1 ? LEFT_PAD : TINY, SBP_FP64);
    ref_lora la;
    sbp_err err = {0};
    const char *dir = make_adapter(families[_i], &m.cfg, &lora_cfgs[_i], 600 + (uint64_t)_i);
    ck_assert_msg(ref_lora_read(&la, dir, &m.cfg, &err) == SBP_OK, "%s", err.msg);
    ck_assert(la.r == lora_cfgs[_i].r && la.targets == lora_cfgs[_i].targets);
    ck_assert(fabs(la.scale - sbp_lora_scaling(&lora_cfgs[_i])) <= 1e-15 * la.scale);
    const ref_net net = {.cfg = &m.cfg, .ps = &m.params, .w = m.w, .unattended = u, .lora = &la};
    ck_assert_int_eq(ref_grad_total(&net), la.ps.total);
    double *coef = sft_coef(&b), *g = net_grads(&net, &b, coef);
    /* the adapter changes the function */
    ref_net base = net;
    base.lora = NULL;
    double with = net_objective(&net, &b, coef, 1.0), without = net_objective(&base, &b, coef, 1.0);
    ck_assert_msg(fabs(with - without) > 1e-6, "adapter without effect: %.17g", with);
    char what[96];
    snprintf(what, sizeof what, "%s %s%s LoRA r %d%s", families[_i],
             _i == 1 ? "left-pad " : "sft-tiny", _i == 1 ? sbp_unattended_name(u) : "", la.r,
             lora_cfgs[_i].use_rslora ? " rslora" : "");
    net_ctx c = {&net, &b, coef};
    tu_fd_check(&la.ps, la.w, g, net_objective_at, &c, FD_STEP, FD_ATOL, FD_RTOL, 3,
                700 + (uint64_t)_i, what);
    free(g);
    free(coef);
    ref_lora_free(&la);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* Left padding of row r (mask 0 on [0, npad)) and a target at npad, predicted from the pad at
 * npad − 1; GRPO's old and reference log-probs of that target (at the predicting position) set
 * to −5.2, about log(1/V). */
static void pad_left(sbp_batch *b, int r, int npad) {
    const size_t i = (size_t)r * b->T;
    for (int t = 0; t < npad; t++) b->mask[i + t] = 0;
    b->labels[i + npad] = b->ids[i + npad];
    if (b->old_logps) b->old_logps[i + npad - 1] = -5.2;
    if (b->ref_logps) b->ref_logps[i + npad - 1] = -5.2;
    sbp_batch_count_targets(b);
}

/* The batch of objective k (SFT, DPO, GRPO) with targets predicted from rows that see no key:
 * LEFT_PAD; dpo-tiny with chosen row 1 and rejected row 0 (rows 1 and 2) left-padded; grpo-tiny
 * with the prompt pads of rows 0 and 2 predicting the first prompt token. */
static void unattended_batch(sbp_batch *b, int k, const sbp_config *cfg) {
    static const char *paths[3] = {LEFT_PAD, DPO_TINY, GRPO_TINY};
    static const sbp_objective_kind kinds[3] = {SBP_OBJ_SFT, SBP_OBJ_DPO, SBP_OBJ_GRPO};
    sbp_err err = {0};
    if (sbp_batch_load_as(b, paths[k], cfg, kinds[k], 1, &err)) ck_abort_msg("%s", err.msg);
    if (k == 1) pad_left(b, 1, 3), pad_left(b, 2, 4);
    if (k == 2) pad_left(b, 0, 2), pad_left(b, 2, 5);
    int64_t rows, targets;
    sbp_batch_count_unattended(b, &rows, &targets);
    ck_assert_int_eq(targets, 2);
}

/* One sbp_grad run (float64) against the oracle's gradient g and loss L, tensor by tensor by
 * name: src's table sp (the model's, or the adapter's) and ref's rp. Returns the worst rel. L2;
 * *loss_err the loss's relative error. */
static double src_vs_ref(const sbp_model *m, const sbp_batch *b, const sbp_grad_opts *op,
                         const sbp_params *sp, const sbp_params *rp, const double *g, double L,
                         double *loss_err, const char *what) {
    sbp_grad_result r;
    sbp_err err = {0};
    if (sbp_grad(&r, m, b, op, NULL, &err)) ck_abort_msg("%s: sbp_grad: %s", what, err.msg);
    ck_assert_int_eq(sp->n, rp->n);
    double worst = 0;
    for (int i = 0; i < sp->n; i++) {
        const sbp_param *p = &sp->p[i];
        int k = sbp_params_find(rp, p->name);
        ck_assert_msg(k >= 0 && rp->p[k].numel == p->numel, "%s: %s not in ref's table", what,
                      p->name);
        double e = rel_l2((const double *)r.grads + p->offset, g + rp->p[k].offset, p->numel);
        ck_assert_msg(e <= SRC_TOL_FP64, "%s: %s rel. L2 %.3g > %.3g against ref", what, p->name, e,
                      SRC_TOL_FP64);
        worst = fmax(worst, e);
    }
    *loss_err = fabs(r.loss - L) / fabs(L);
    ck_assert_msg(*loss_err <= SRC_LOSS_TOL_FP64, "%s: loss %.17g vs ref %.17g", what, r.loss, L);
    sbp_grad_result_free(&r, NULL);
    return worst;
}

/* _i: family (_i / 3) and objective (_i % 3): SFT, DPO (sigmoid, β 0.1) or GRPO (grpo, β 0.04,
 * τ 0.7) on its batch with targets predicted from pads, each mode, without and with the family's
 * adapter: src in float64, fast full and stream (a block-multiple chunk), portable ckpt and stream
 * (a ragged chunk), against ref_truth: ≤ 1e-10 rel. L2 per tensor, loss ≤ 1e-12. */
START_TEST(src_against_ref_unattended_lora) {
    static const char *objs[3] = {"SFT", "DPO", "GRPO"};
    const sbp_objective os[3] = {{.kind = SBP_OBJ_SFT},
                                 {.kind = SBP_OBJ_DPO, .dpo_loss = SBP_DPO_SIGMOID, .beta = 0.1},
                                 {.kind = SBP_OBJ_GRPO,
                                  .grpo_loss = SBP_GRPO_GRPO,
                                  .beta = 0.04,
                                  .epsilon_low = 0.2,
                                  .epsilon_high = 0.2,
                                  .temperature = 0.7}};
    const sched ss[4] = {{SBP_FULL, 4, 0, 0, 0},
                         {SBP_CKPT, 4, 0, 0, 0},
                         {SBP_STREAM, 4, 8, 4, 0},
                         {SBP_STREAM, 4, 7, 5, 0}};
    const char *family = families[_i / 3];
    const int k = _i % 3;
    sbp_model m;
    sbp_batch b;
    tu_load(&m, NULL, tu_model(family, 7), NULL, SBP_FP64);
    unattended_batch(&b, k, &m.cfg);
    const char *dir = make_adapter(family, &m.cfg, &lora_cfgs[_i / 3], 800 + (uint64_t)_i);
    ref_lora rl;
    sbp_lora sl;
    sbp_err err = {0};
    ck_assert_msg(ref_lora_read(&rl, dir, &m.cfg, &err) == SBP_OK, "%s", err.msg);
    ck_assert_msg(sbp_lora_load(&sl, dir, &m.cfg, SBP_FP64, NULL, &err) == SBP_OK, "%s", err.msg);
    double worst = 0, worst_loss = 0;
    char where[300] = "";
    for (int lo = 0; lo < 2; lo++) {
        double L[3];
        for (int u = 0; u < 3; u++) {
            const ref_net net = {.cfg = &m.cfg,
                                 .ps = &m.params,
                                 .w = m.w,
                                 .unattended = modes[u],
                                 .lora = lo ? &rl : NULL};
            double *g = calloc((size_t)ref_grad_total(&net), sizeof *g);
            ck_assert_ptr_nonnull(g);
            if (ref_truth(&L[u], g, &net, &b, &os[k], 0, &err))
                ck_abort_msg("ref_truth: %s", err.msg);
            /* fast full and stream-8, portable ckpt and ragged stream-7 (their equality to
             * each other is test_schedules'; here each against the truth) */
            for (int s = 0; s < 4; s++) {
                const sched *c = &ss[s];
                const sbp_grad_opts op = {.schedule = c->s,
                                          .block = c->block,
                                          .chunk = c->chunk,
                                          .logit_chunk = c->logit_chunk,
                                          .objective = os[k],
                                          .numerics =
                                              s % 2 ? SBP_NUMERICS_PORTABLE : SBP_NUMERICS_FAST,
                                          .unattended = modes[u],
                                          .lora = lo ? &sl : NULL};
                char what[240];
                snprintf(what, sizeof what, "%s %s %s%s %s %s chunk %d logit chunk %d", family,
                         objs[k], sbp_unattended_name(modes[u]), lo ? " LoRA" : "",
                         sbp_numerics_name(op.numerics), sbp_schedule_name(c->s), c->chunk,
                         c->logit_chunk);
                double le, e = src_vs_ref(&m, &b, &op, lo ? &sl.params : &m.params,
                                          lo ? &rl.ps : &m.params, g, L[u], &le, what);
                if (e >= worst) worst = e, snprintf(where, sizeof where, "%s", what);
                worst_loss = fmax(worst_loss, le);
            }
            free(g);
        }
        /* the rows that see no key matter: each mode has its own loss */
        for (int u = 0; u < 3; u++)
            ck_assert_msg(fabs(L[u] - L[(u + 1) % 3]) > 1e-6 * fabs(L[0]),
                          "%s %s: losses %.17g %.17g %.17g", family, objs[k], L[0], L[1], L[2]);
    }
    printf("src vs ref, %-11s %-4s, 3 modes x (no adapter, LoRA) x 4 runs, fp64: worst rel. L2 "
           "%.2e (%s), loss %.2e\n",
           family, objs[k], worst, where, worst_loss);
    fflush(stdout);
    ref_lora_free(&rl);
    sbp_lora_free(&sl, NULL);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* `grad --lora DIR --ref-model REF`: the reference model is a plain model (TRL runs peft's
 * reference with the adapter disabled), not REF with the policy's adapter on it. On qwen3-tiny
 * and dpo-noref (a DPO batch without stored reference log-probs, so every reference log-prob is
 * REF's), with REF another seed's model and an adapter with B ≠ 0 on all projections, the CLI's
 * loss (--json and the file's metadata) and adapter gradient (the --out file, float64) against
 * ref_truth_files: loss ≤ 1e-12, ≤ 1e-10 rel. L2 per tensor. Measured: 9e-16 and 2.8e-15; with
 * the adapter on the reference (the old behaviour) the loss was 1.03697 against 0.96585. */
#define DPO_NOREF "data/batches/dpo-noref.safetensors"

START_TEST(cli_ref_model_lora) {
    const char *pm = tu_model("qwen3-tiny", 7), *rm = tu_model("qwen3-tiny", 9);
    sbp_config cfg;
    sbp_err err = {0};
    ck_assert_msg(sbp_config_load(&cfg, tu_join(pm, "config.json"), &err) == SBP_OK, "%s", err.msg);
    const char *dir = make_adapter("cli-ref-lora", &cfg, &lora_cfgs[0], 910);
    const char *out = tu_path("cli-ref-lora.safetensors");
    int rc = tu_sh("%s grad --model '%s' --batch " DPO_NOREF " --objective dpo --ref-model '%s' "
                   "--lora '%s' --precision fp64 --out '%s' --json",
                   tu_bin(), pm, rm, dir, out);
    ck_assert_msg(rc == 0, "grad --lora --ref-model: exit %d: %s", rc, tu_last_output());
    const char *js = strchr(tu_last_output(), '{');
    cJSON *root = js ? cJSON_Parse(js) : NULL;
    const cJSON *jl = cJSON_GetObjectItemCaseSensitive(root, "loss");
    ck_assert_msg(cJSON_IsNumber(jl), "no \"loss\" in grad --json: %s", tu_last_output());
    const double cli_loss = jl->valuedouble;
    cJSON_Delete(root);

    /* the oracle: the same files, the reference log-probs of REF (a plain model) */
    const sbp_objective o = {.kind = SBP_OBJ_DPO, .dpo_loss = SBP_DPO_SIGMOID, .beta = 0.1};
    const ref_files f = {.model_dir = pm,
                         .batch_path = DPO_NOREF,
                         .o = &o,
                         .scale_rewards = 1,
                         .ref_model_dir = rm,
                         .lora_dir = dir};
    ref_model m;
    ref_lora la;
    double L, *g;
    ck_assert_msg(ref_truth_files(&L, &g, &m, &la, &f, NULL, 0, &err) == SBP_OK, "%s", err.msg);
    const double le = fabs(cli_loss - L) / fabs(L);
    ck_assert_msg(le <= SRC_LOSS_TOL_FP64,
                  "grad --lora --ref-model: loss %.17g, the oracle's %.17g (rel. %.3g): is the "
                  "policy's adapter on the reference model?",
                  cli_loss, L, le);

    sbp_st_file sf;
    ck_assert_msg(sbp_st_open(&sf, out, &err) == SBP_OK, "%s", err.msg);
    const char *ls = sbp_st_meta(&sf, "loss");
    ck_assert_msg(ls && strtod(ls, NULL) == cli_loss, "%s: loss %s, --json %.17g", out,
                  ls ? ls : "(none)", cli_loss);
    ck_assert_int_eq(sf.n, la.ps.n);
    double worst = 0;
    for (int i = 0; i < la.ps.n; i++) {
        const sbp_param *p = &la.ps.p[i];
        const sbp_st_tensor *t = sbp_st_find(&sf, p->name);
        ck_assert_msg(t != NULL && t->numel == p->numel, "%s: no tensor %s of %lld elements", out,
                      p->name, (long long)p->numel);
        double *x = malloc(sizeof *x * (size_t)p->numel);
        ck_assert_ptr_nonnull(x);
        ck_assert_msg(sbp_st_read(&sf, t, x, SBP_DT_F64, &err) == SBP_OK, "%s", err.msg);
        const double e = rel_l2(x, g + p->offset, p->numel);
        ck_assert_msg(e <= SRC_TOL_FP64, "grad --lora --ref-model: %s rel. L2 %.3g > %.3g", p->name,
                      e, SRC_TOL_FP64);
        worst = fmax(worst, e);
        free(x);
    }
    sbp_st_close(&sf);
    printf("grad --lora --ref-model (qwen3-tiny, dpo-noref, fp64) vs ref: loss %.17g (rel. %.2e), "
           "worst adapter rel. L2 %.2e\n",
           cli_loss, le, worst);
    fflush(stdout);
    free(g);
    ref_lora_free(&la);
    ref_model_free(&m);
}
END_TEST

/* adapter_config.json of dir with key set to the JSON value v (text). */
static void edit_adapter_config(const char *dir, const char *key, const char *v) {
    const char *path = tu_join(dir, "adapter_config.json");
    char *text = tu_slurp(path, NULL);
    cJSON *o = cJSON_Parse(text), *item = cJSON_Parse(v);
    ck_assert(o && item);
    free(text);
    if (!cJSON_ReplaceItemInObjectCaseSensitive(o, key, item)) cJSON_AddItemToObject(o, key, item);
    text = cJSON_Print(o);
    ck_assert_ptr_nonnull(text);
    tu_spit(path, text, strlen(text));
    free(text);
    cJSON_Delete(o);
}

/* ref_lora_read refuses an adapter_config.json the oracle does not compute: lora_alpha ≤ 0 (a
 * scale streambp neither writes nor reads) and a non-empty modules_to_save (peft's trained full
 * copies of other modules), each an input error naming the field; modules_to_save null or []
 * (peft's default) and a positive lora_alpha are read. */
START_TEST(reader_lora_refuses) {
    sbp_config cfg;
    sbp_err err = {0};
    ck_assert_msg(sbp_config_load(&cfg, "data/models/qwen3-tiny.json", &err) == SBP_OK, "%s",
                  err.msg);
    static const struct {
        const char *key, *value, *want; /* want: in the error, or NULL: accepted */
    } cases[] = {{"lora_alpha", "0", "lora_alpha"},
                 {"lora_alpha", "-8", "lora_alpha"},
                 {"lora_alpha", "-0.0", "lora_alpha"},
                 {"lora_alpha", "8", NULL},
                 {"modules_to_save", "[\"lm_head\"]", "modules_to_save"},
                 {"modules_to_save", "[\"embed_tokens\", \"lm_head\"]", "modules_to_save"},
                 {"modules_to_save", "null", NULL},
                 {"modules_to_save", "[]", NULL}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char name[40];
        snprintf(name, sizeof name, "lora-refuse-%zu", k);
        const char *dir = make_adapter(name, &cfg, &lora_cfgs[0], 920 + k);
        edit_adapter_config(dir, cases[k].key, cases[k].value);
        ref_lora a;
        err = (sbp_err){0};
        const int st = ref_lora_read(&a, dir, &cfg, &err);
        if (!cases[k].want) {
            ck_assert_msg(st == SBP_OK, "%s %s: %s", cases[k].key, cases[k].value, err.msg);
            ref_lora_free(&a);
            continue;
        }
        ck_assert_msg(st == SBP_EINPUT, "%s %s: status %d, want SBP_EINPUT", cases[k].key,
                      cases[k].value, st);
        ck_assert_msg(strstr(err.msg, cases[k].want), "%s %s: the error does not name %s: %s",
                      cases[k].key, cases[k].value, cases[k].want, err.msg);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * The oracle's own readers (ref/io.c): what they derive from the raw files, by hand. */

static const char *spit_json(const char *name, const char *text) {
    const char *p = tu_path("%s", name);
    tu_spit(p, text, strlen(text));
    return p;
}

START_TEST(reader_config_defaults) {
    sbp_config c;
    sbp_err err = {0};
    /* Qwen3 without head_dim: HF's Qwen3Config default 128, not hidden / heads */
    const char *q = spit_json("q3.json", "{\"model_type\":\"qwen3\",\"vocab_size\":10,"
                                         "\"hidden_size\":64,\"intermediate_size\":8,"
                                         "\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                                         "\"rms_norm_eps\":1e-6}");
    ck_assert_msg(ref_config_read(&c, q, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(c.head_dim, 128);
    ck_assert_int_eq(c.kv_heads, 4);
    ck_assert(c.qk_norm && !c.qkv_bias && !c.tied);
    ck_assert(c.rope_theta == 10000.0);
    /* Llama without head_dim: hidden / heads; rope_parameters (transformers 5) with llama3 */
    const char *l = spit_json(
        "l.json", "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":64,"
                  "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                  "\"num_key_value_heads\":2,\"rms_norm_eps\":1e-5,\"tie_word_embeddings\":true,"
                  "\"rope_parameters\":{\"rope_theta\":500000.0,\"rope_type\":\"llama3\","
                  "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                  "\"original_max_position_embeddings\":8192}}");
    ck_assert_msg(ref_config_read(&c, l, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(c.head_dim, 16);
    ck_assert(c.rope_theta == 500000.0 && c.rope_llama3 && c.rope_factor == 8.0 && c.tied);
    /* Qwen2: biases, no q/k norm */
    const char *q2 = spit_json("q2.json", "{\"model_type\":\"qwen2\",\"vocab_size\":10,"
                                          "\"hidden_size\":32,\"intermediate_size\":8,"
                                          "\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                                          "\"rms_norm_eps\":1e-6}");
    ck_assert_msg(ref_config_read(&c, q2, &err) == SBP_OK, "%s", err.msg);
    ck_assert(c.qkv_bias && !c.qk_norm && c.head_dim == 8);
}
END_TEST

/* A batch written by hand with sbp_st_write; the oracle's reading checked value by value. */
START_TEST(reader_batches) {
    sbp_config cfg = {.family = SBP_QWEN3, .vocab = 50};
    sbp_err err = {0};
    sbp_batch b;
    /* DPO: chosen T = 3, rejected T = 5: chosen rows padded on the right to 5 */
    const int64_t ci[6] = {1, 2, 3, 4, 5, 6}, cl[6] = {-100, 2, 3, -100, 5, 6};
    const int64_t ri[10] = {7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    const int64_t rl[10] = {-100, 8, 9, 10, 11, -100, -100, 14, 15, 16};
    const double rc[2] = {-1, -2}, rr[2] = {-3, -4};
    const sbp_st_entry d[] = {{"chosen_input_ids", SBP_DT_I64, 2, {2, 3}, ci},
                              {"chosen_labels", SBP_DT_I64, 2, {2, 3}, cl},
                              {"rejected_input_ids", SBP_DT_I64, 2, {2, 5}, ri},
                              {"rejected_labels", SBP_DT_I64, 2, {2, 5}, rl},
                              {"ref_chosen_logps", SBP_DT_F64, 1, {2}, rc},
                              {"ref_rejected_logps", SBP_DT_F64, 1, {2}, rr}};
    const char *dp = tu_path("dpo-hand.safetensors");
    ck_assert_int_eq(sbp_st_write(dp, d, 6, NULL, &err), SBP_OK);
    ck_assert_msg(ref_batch_read(&b, dp, &cfg, SBP_OBJ_DPO, 1, &err) == SBP_OK, "%s", err.msg);
    ck_assert(b.B == 4 && b.T == 5 && b.pairs == 2);
    const int32_t want_labels[20] = {-100, 2, 3, -100, -100, -100, 5,    6,  -100, -100,
                                     -100, 8, 9, 10,   11,   -100, -100, 14, 15,   16};
    const uint8_t want_mask[20] = {1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int i = 0; i < 20; i++) {
        ck_assert_int_eq(b.labels[i], want_labels[i]);
        ck_assert_int_eq(b.mask[i], want_mask[i]);
        if (!want_mask[i]) ck_assert_int_eq(b.ids[i], 0);
    }
    ck_assert(b.ref_seq_logps[1] == -2 && b.ref_seq_logps[2] == -3);
    ck_assert_int_eq(b.n_targets, 2 + 2 + 4 + 3);
    ref_batch_free(&b);
    /* GRPO: labels from the completion mask, advantages from rewards (unbiased std), per-token
     * log-probs moved one position left */
    const int64_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8}, cm[8] = {0, 1, 1, 0, 0, 0, 1, 1};
    const double rew[2] = {1.0, 0.25}, old[8] = {0, -1, -2, 0, 0, 0, -3, -4};
    const sbp_st_entry g[] = {{"input_ids", SBP_DT_I64, 2, {2, 4}, ids},
                              {"completion_mask", SBP_DT_I64, 2, {2, 4}, cm},
                              {"rewards", SBP_DT_F64, 1, {2}, rew},
                              {"old_logps", SBP_DT_F64, 2, {2, 4}, old}};
    const char *meta[] = {"group_size", "2", NULL};
    const char *gp = tu_path("grpo-hand.safetensors");
    ck_assert_int_eq(sbp_st_write(gp, g, 4, meta, &err), SBP_OK);
    ck_assert_msg(ref_batch_read(&b, gp, &cfg, SBP_OBJ_GRPO, 1, &err) == SBP_OK, "%s", err.msg);
    const int32_t gl[8] = {-100, 2, 3, -100, -100, -100, 7, 8};
    for (int i = 0; i < 8; i++) ck_assert_int_eq(b.labels[i], gl[i]);
    /* mean 0.625, unbiased std sqrt(2 * 0.375^2 / 1) = 0.53033 */
    const double A = 0.375 / (sqrt(2 * 0.375 * 0.375) + 1e-4);
    ck_assert_msg(fabs(b.advantages[0] - A) < 1e-15 && fabs(b.advantages[1] + A) < 1e-15,
                  "advantages %.17g %.17g, want +-%.17g", b.advantages[0], b.advantages[1], A);
    const double want_old[8] = {-1, -2, 0, 0, 0, -3, -4, 0};
    for (int i = 0; i < 8; i++) ck_assert(b.old_logps[i] == want_old[i]);
    ref_batch_free(&b);
    ck_assert_msg(ref_batch_read(&b, gp, &cfg, SBP_OBJ_GRPO, 0, &err) == SBP_OK, "%s", err.msg);
    ck_assert(fabs(b.advantages[0] - 0.375) < 1e-15); /* no scaling: r - mean */
    ref_batch_free(&b);
}
END_TEST

/* Every tensor whose shape disagrees with config.json is listed, not only the first. */
START_TEST(reader_model_mismatch) {
    const char *d = tu_new_dir("ref-mismatch");
    tu_sh("cp '%s/model.safetensors' '%s/'", tu_model("qwen3-tiny", 1), d);
    char *cfg = tu_slurp(tu_join(tu_model("qwen3-tiny", 1), "config.json"), NULL);
    char *hd = strstr(cfg, "\"head_dim\"");
    ck_assert_ptr_nonnull(hd);
    memcpy(hd, "\"head_dxx\"", 10); /* no head_dim: the default 128, not the file's 32 */
    tu_spit(tu_join(d, "config.json"), cfg, strlen(cfg));
    free(cfg);
    ref_model m;
    char mismatch[4096];
    sbp_err err = {0};
    ck_assert_int_eq(ref_model_read(&m, d, mismatch, sizeof mismatch, &err), SBP_EINPUT);
    const char *want[] = {"model.layers.0.self_attn.q_proj.weight [128, 64] != [512, 64]",
                          "model.layers.1.self_attn.k_proj.weight",
                          "model.layers.1.self_attn.o_proj.weight",
                          "model.layers.0.self_attn.q_norm.weight [32] != [128]"};
    for (int i = 0; i < 4; i++)
        ck_assert_msg(strstr(mismatch, want[i]), "no \"%s\" in: %s", want[i], mismatch);
}
END_TEST

/* The float32 loops: the error of float32 arithmetic against the float64 oracle, no more (so
 * they are right) and no less (so they are float32). */
START_TEST(ref32_error) {
    ref_model m;
    double loss, loss32, *g;
    sbp_err err = {0};
    sbp_objective o = {.kind = SBP_OBJ_SFT};
    const ref_files f = {.model_dir = tu_model(families[_i], 1),
                         .batch_path = "data/batches/sft-tiny.safetensors",
                         .o = &o,
                         .scale_rewards = 1};
    ck_assert_msg(ref_truth_files(&loss, &g, &m, NULL, &f, NULL, 0, &err) == SBP_OK, "%s", err.msg);
    sbp_batch b;
    ck_assert_int_eq(
        ref_batch_read(&b, "data/batches/sft-tiny.safetensors", &m.cfg, SBP_OBJ_SFT, 1, &err),
        SBP_OK);
    double *g32 = malloc(sizeof *g32 * (size_t)m.ps.total);
    ck_assert_int_eq(ref_truth(&loss32, g32, REF_NET(&m.cfg, &m.ps, m.w), &b, &o, 1, &err), SBP_OK);
    double worst = 0, best = 1;
    for (int i = 0; i < m.ps.n; i++) {
        const sbp_param *p = &m.ps.p[i];
        double num = 0, den = 0;
        for (int64_t j = 0; j < p->numel; j++) {
            double e = g32[p->offset + j] - g[p->offset + j];
            num += e * e, den += g[p->offset + j] * g[p->offset + j];
        }
        worst = fmax(worst, sqrt(num / den)), best = fmin(best, sqrt(num / den));
    }
    printf("ref32 %-12s sft-tiny: per-tensor rel. L2 against ref64 %.2e .. %.2e, loss %.2e\n",
           families[_i], best, worst, fabs(loss32 - loss) / loss);
    ck_assert_msg(worst < 1e-5 && best > 1e-9, "ref32 error %.3g .. %.3g", best, worst);
    free(g), free(g32);
    ref_batch_free(&b);
    ref_model_free(&m);
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
    TCase *ul = tcase_create("rows without keys and LoRA");
    tcase_set_timeout(ul, 300);
    tcase_add_loop_test(ul, fd_unattended, 0, 9);
    tcase_add_test(ul, eager_at_uniform_point);
    tcase_add_loop_test(ul, fd_lora, 0, 3);
    tcase_add_loop_test(ul, src_against_ref_unattended_lora, 0, 9);
    tcase_add_test(ul, cli_ref_model_lora);
    suite_add_tcase(s, ul);
    TCase *rd = tcase_create("readers");
    tcase_set_timeout(rd, 120);
    tcase_add_test(rd, reader_config_defaults);
    tcase_add_test(rd, reader_batches);
    tcase_add_test(rd, reader_model_mismatch);
    tcase_add_test(rd, reader_lora_refuses);
    tcase_add_loop_test(rd, ref32_error, 0, 3);
    suite_add_tcase(s, rd);

    TCase *torch = tcase_create("torch");
    tcase_set_timeout(torch, 300);
    tcase_add_test(torch, torch_cross_check);
    suite_add_tcase(s, torch);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
