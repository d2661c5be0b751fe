/* test_train.c — `streambp train` and the training library (src/train).
 *
 * Library: one AdamW step against the closed form and two against a plain long-double
 * transcription of torch.optim.AdamW, the no-decay group, clipping, the learning-rate schedules,
 * thread-count independence, the data order and its restoration, JSONL records.
 * Command line: 50 steps of the tiny Qwen3 with full, ckpt and stream give byte-identical
 * weights and loss logs, and the loss falls; other objectives, float64 and gradient accumulation
 * agree across schedules too; a run stopped at step 25, and a run killed with SIGKILL, resume to
 * the bytes of a run that never stopped; the PyTorch cross-check (verify/torch_adamw.py) when
 * torch is installed; bad input exits 2, names the problem and leaves every file as it was. */
#include "testutil.h"

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The bundled demo: tiny Qwen3, counting records, T = 64 in rows of 4 records, blocks of 16. */
#define DEMO_DATA                                                                                  \
    "--jsonl data/train/counting.jsonl --seq 64 --batch-size 4 --lr 1e-2 --warmup-steps 5 "        \
    "--shuffle --weight-decay 0.01 --block 16 --chunk 32 --logit-chunk 16"

static const char *model(void) {
    return tu_model("qwen3-tiny", 1);
}

/* streambp train on the demo settings; returns the exit status (output in tu_last_output). */
static int train(const char *out, const char *schedule, int steps, int threads, const char *extra) {
    return tu_sh("%s train --model %s " DEMO_DATA " --steps %d --schedule %s --threads %d "
                 "--out %s %s",
                 tu_bin(), model(), steps, schedule, threads, out, extra);
}

static void assert_same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = tu_slurp(a, &na), *y = tu_slurp(b, &nb);
    ck_assert_msg(na == nb && memcmp(x, y, na) == 0, "%s and %s differ", a, b);
    free(x), free(y);
}

/* Loss of row `step` of a loss log (1-based), and the number of rows. */
static double loss_at(const char *csv, int step, int *rows) {
    double found = NAN;
    int n = 0;
    for (const char *l = strchr(csv, '\n'); l && l[1]; l = strchr(l + 1, '\n')) {
        long long s;
        double epoch, loss;
        if (sscanf(l + 1, "%lld,%lf,%lf", &s, &epoch, &loss) != 3) break;
        n++;
        if (s == step) found = loss;
    }
    if (rows) *rows = n;
    return found;
}

/* ---- AdamW ----------------------------------------------------------------------------------- */

/* torch.optim.AdamW written out plainly in long double, for one element. */
typedef struct {
    long double p, m, v;
} ref_elem;

static void ref_step(ref_elem *e, long double g, int step, long double lr, long double b1,
                     long double b2, long double eps, long double wd) {
    e->p *= 1 - lr * wd;
    e->m = b1 * e->m + (1 - b1) * g;
    e->v = b2 * e->v + (1 - b2) * g * g;
    long double mhat = e->m / (1 - powl(b1, step)), vhat = e->v / (1 - powl(b2, step));
    e->p -= lr * mhat / (sqrtl(vhat) + eps);
}

START_TEST(adamw_against_hand_computation) {
    const sbp_precision prec = _i ? SBP_FP32 : SBP_FP64;
    enum { N = 6 };
    const double p0[N] = {1, -0.5, 0.25, 2, 0, 0.75};
    const double g1[N] = {0.5, -0.1, 0, 3, 1e-3, -2e-9}, g2[N] = {-0.25, 0.2, 0.5, 3, 0, 1e-9};
    const double lr = 0.1, wd = 0.01;
    sbp_adamw_opts o = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = wd};
    sbp_adamw a;
    sbp_err err = {0};
    sbp_ledger lg = {0};
    ck_assert_int_eq(sbp_adamw_init(&a, &o, prec, N, &lg, &err), SBP_OK);
    /* both moments are charged to the optimizer category, in the slab's precision */
    size_t esz = prec == SBP_FP64 ? 8 : 4;
    ck_assert_int_eq(lg.cur[SBP_MEM_OPTIMIZER], (int64_t)(2 * N * esz));
    double pd[N], gd[N];
    float pf[N], gf[N];
    ref_elem ref[N];
    for (int i = 0; i < N; i++)
        pd[i] = p0[i], pf[i] = (float)p0[i], ref[i] = (ref_elem){p0[i], 0, 0};
    void *p = prec == SBP_FP64 ? (void *)pd : (void *)pf,
         *g = prec == SBP_FP64 ? (void *)gd : (void *)gf;
    /* step 1, the closed form: m̂ = g, v̂ = g², so p ← p·(1 − lr·wd) − lr·g/(|g| + eps) */
    for (int i = 0; i < N; i++) gd[i] = g1[i], gf[i] = (float)g1[i];
    sbp_adamw_step(&a, p, g, lr);
    ck_assert_int_eq(a.step, 1);
    for (int i = 0; i < N; i++) {
        double want = p0[i] * (1 - lr * wd) - lr * g1[i] / (fabs(g1[i]) + 1e-8);
        double got = prec == SBP_FP64 ? pd[i] : pf[i], tol = prec == SBP_FP64 ? 1e-15 : 3e-7;
        ck_assert_msg(fabs(got - want) <= tol * fmax(1, fabs(want)),
                      "step 1, element %d: %.17g, closed form %.17g", i, got, want);
        ref_step(&ref[i], g1[i], 1, lr, 0.9L, 0.999L, 1e-8L, wd);
    }
    /* step 2 against the long-double transcription */
    for (int i = 0; i < N; i++) gd[i] = g2[i], gf[i] = (float)g2[i];
    sbp_adamw_step(&a, p, g, lr);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        ref_step(&ref[i], g2[i], 2, lr, 0.9L, 0.999L, 1e-8L, wd);
        double got = prec == SBP_FP64 ? pd[i] : pf[i];
        worst = fmax(worst, fabs(got - (double)ref[i].p) / fmax(1, fabs((double)ref[i].p)));
    }
    ck_assert_msg(worst <= (prec == SBP_FP64 ? 2e-15 : 5e-7), "step 2: worst rel. error %.3g",
                  worst);
    printf("adamw %s: two steps vs long-double torch formula, worst rel. error %.2e\n",
           prec == SBP_FP64 ? "fp64" : "fp32", worst);
    sbp_adamw_free(&a, &lg);
    ck_assert_int_eq(lg.cur[SBP_MEM_OPTIMIZER], 0);
}
END_TEST

START_TEST(adamw_no_decay_group) {
    /* zero gradients: a decayed element shrinks by exactly (1 − lr·wd), an excluded one stays */
    enum { N = 10 };
    double p[N], g[N] = {0};
    for (int i = 0; i < N; i++) p[i] = 1 + i;
    sbp_adamw_opts o = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.5};
    sbp_adamw a;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_adamw_init(&a, &o, SBP_FP64, N, NULL, &err), SBP_OK);
    sbp_range r[2] = {{2, 4}, {7, 8}};
    ck_assert_int_eq(sbp_adamw_exclude_decay(&a, r, 2, &err), SBP_OK);
    sbp_adamw_step(&a, p, g, 0.1);
    for (int i = 0; i < N; i++) {
        int excluded = (i >= 2 && i < 4) || i == 7;
        double want = excluded ? 1 + i : (1 + i) * (1 - 0.1 * 0.5);
        ck_assert_msg(p[i] == want, "element %d: %.17g, want %.17g", i, p[i], want);
    }
    /* ranges out of order, empty or outside the slab are refused */
    sbp_range bad[2] = {{5, 6}, {1, 2}};
    ck_assert_int_eq(sbp_adamw_exclude_decay(&a, bad, 2, &err), SBP_EUSAGE);
    bad[0] = (sbp_range){8, 12};
    ck_assert_int_eq(sbp_adamw_exclude_decay(&a, bad, 1, &err), SBP_EUSAGE);
    sbp_adamw_free(&a, NULL);
    /* the HF groups of a parameter table: every norm weight and every bias, nothing else */
    sbp_config cfg;
    sbp_params ps;
    ck_assert_int_eq(sbp_config_load(&cfg, "data/models/qwen2-tiny.json", &err), SBP_OK);
    ck_assert_int_eq(sbp_params_build(&ps, &cfg, &err), SBP_OK);
    sbp_range *nd;
    int nn;
    ck_assert_int_eq(sbp_params_no_decay(&nd, &nn, &ps, &err), SBP_OK);
    int64_t covered = 0, want = 0;
    for (int k = 0; k < nn; k++) covered += nd[k].end - nd[k].begin;
    for (int i = 0; i < ps.n; i++)
        if (strstr(ps.p[i].name, "norm") || strstr(ps.p[i].name, ".bias")) want += ps.p[i].numel;
    ck_assert_int_eq(covered, want);
    ck_assert_int_gt(want, 0);
    free(nd);
    sbp_params_free(&ps);
    /* hyper-parameters torch refuses */
    sbp_adamw_opts bad_o = o;
    bad_o.beta1 = 1;
    ck_assert_int_eq(sbp_adamw_check(&bad_o, &err), SBP_EUSAGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "beta1"));
    bad_o = o, bad_o.eps = -1;
    ck_assert_int_eq(sbp_adamw_check(&bad_o, &err), SBP_EUSAGE);
    bad_o = o, bad_o.weight_decay = NAN;
    ck_assert_int_eq(sbp_adamw_check(&bad_o, &err), SBP_EUSAGE);
}
END_TEST

START_TEST(clipping_as_torch) {
    double g[3] = {3, 4, 0};
    /* norm 5 > 1: scaled by 1/(5 + 1e-6), computed as torch does: reciprocal, then × max */
    double n = sbp_clip_grad_norm(g, 3, SBP_FP64, 1.0);
    ck_assert_double_eq(n, 5);
    double c = (1.0 / (5 + 1e-6)) * 1.0;
    ck_assert_double_eq(g[0], 3 * c);
    ck_assert_double_eq(g[1], 4 * c);
    /* under the bound, or without clipping: untouched; the norm is still returned */
    double h[2] = {0.3, 0.4};
    ck_assert_double_eq_tol(sbp_clip_grad_norm(h, 2, SBP_FP64, 10), 0.5, 1e-16);
    ck_assert(h[0] == 0.3 && h[1] == 0.4);
    float f[2] = {30, 40};
    ck_assert_double_eq(sbp_clip_grad_norm(f, 2, SBP_FP32, 0), 50);
    ck_assert(f[0] == 30 && f[1] == 40);
    ck_assert_double_eq(sbp_clip_grad_norm(f, 2, SBP_FP32, 5), 50);
    float cf = (1.0f / (50.0f + 1e-6f)) * 5.0f;
    ck_assert(f[0] == 30 * cf && f[1] == 40 * cf);
}
END_TEST

START_TEST(schedules_of_the_learning_rate) {
    sbp_lr_sched s = {.kind = SBP_LR_COSINE, .lr = 2, .warmup = 10, .total = 110};
    ck_assert_double_eq(sbp_lr_at(&s, 0), 0); /* HF: the first step of a warm-up runs at 0 */
    ck_assert_double_eq(sbp_lr_at(&s, 5), 1);
    ck_assert_double_eq(sbp_lr_at(&s, 10), 2);
    ck_assert_double_eq_tol(sbp_lr_at(&s, 60), 1, 1e-15);
    ck_assert_double_eq(sbp_lr_at(&s, 110), 0);
    ck_assert_double_eq_tol(sbp_lr_at(&s, 35), 2 * 0.5 * (1 + cos(M_PI * 0.25)), 1e-15);
    s.kind = SBP_LR_LINEAR;
    ck_assert_double_eq(sbp_lr_at(&s, 60), 1);
    ck_assert_double_eq(sbp_lr_at(&s, 110), 0);
    s.kind = SBP_LR_CONSTANT;
    ck_assert_double_eq(sbp_lr_at(&s, 3), 0.6);
    ck_assert_double_eq(sbp_lr_at(&s, 100), 2);
    s.warmup = 0;
    ck_assert_double_eq(sbp_lr_at(&s, 0), 2);
    sbp_lr_kind k;
    ck_assert(sbp_lr_kind_parse("cosine", &k) && k == SBP_LR_COSINE);
    ck_assert(!sbp_lr_kind_parse("exp", &k));
}
END_TEST

START_TEST(optimizer_and_norm_do_not_depend_on_threads) {
    enum { N = 3 * 4096 + 17 };
    float *p[2], *g = malloc(sizeof(float) * N);
    double norm[2];
    sbp_adamw a[2];
    sbp_err err = {0};
    sbp_adamw_opts o = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
    for (int t = 0; t < 2; t++) {
        sbp_set_threads(t + 1);
        p[t] = malloc(sizeof(float) * N);
        ck_assert_int_eq(sbp_adamw_init(&a[t], &o, SBP_FP32, N, NULL, &err), SBP_OK);
        sbp_range r = {4000, 4200};
        ck_assert_int_eq(sbp_adamw_exclude_decay(&a[t], &r, 1, &err), SBP_OK);
        uint32_t s = 7;
        for (int i = 0; i < N; i++) {
            s = s * 1664525u + 1013904223u;
            p[t][i] = (float)((int)(s >> 9) % 2001 - 1000) * 1e-3f;
        }
        for (int step = 0; step < 3; step++) {
            for (int i = 0; i < N; i++) {
                s = s * 1664525u + 1013904223u;
                g[i] = (float)((int)(s >> 9) % 2001 - 1000) * 1e-2f;
            }
            norm[t] = sbp_clip_grad_norm(g, N, SBP_FP32, 1.0);
            sbp_adamw_step(&a[t], p[t], g, 1e-2);
        }
    }
    ck_assert(norm[0] == norm[1]);
    ck_assert(memcmp(p[0], p[1], sizeof(float) * N) == 0);
    ck_assert(memcmp(a[0].exp_avg, a[1].exp_avg, sizeof(float) * N) == 0);
    ck_assert(memcmp(a[0].exp_avg_sq, a[1].exp_avg_sq, sizeof(float) * N) == 0);
    for (int t = 0; t < 2; t++) free(p[t]), sbp_adamw_free(&a[t], NULL);
    free(g);
    sbp_set_threads(1);
}
END_TEST

/* ---- data ------------------------------------------------------------------------------------ */

START_TEST(sampler_order_and_restore) {
    sbp_sampler s, r;
    sbp_err err = {0};
    int64_t it[3];
    ck_assert_int_eq(sbp_sampler_init(&s, 7, 3, 0, 42, &err), SBP_OK);
    /* in order, 3 a batch, the last of an epoch shorter, then the next epoch */
    int want[][3] = {{0, 1, 2}, {3, 4, 5}, {6}, {0, 1, 2}};
    int wn[] = {3, 3, 1, 3};
    for (int b = 0; b < 4; b++) {
        ck_assert_int_eq(sbp_sampler_next(&s, it), wn[b]);
        for (int i = 0; i < wn[b]; i++) ck_assert_int_eq(it[i], want[b][i]);
    }
    ck_assert_int_eq(s.epoch, 1);
    sbp_sampler_free(&s);
    /* shuffled: each epoch a permutation, different epochs different ones */
    ck_assert_int_eq(sbp_sampler_init(&s, 50, 1, 1, 42, &err), SBP_OK);
    int64_t e0[50], e1[50];
    for (int e = 0; e < 2; e++) {
        int seen[50] = {0};
        for (int i = 0; i < 50; i++) {
            ck_assert_int_eq(sbp_sampler_next(&s, it), 1);
            (e ? e1 : e0)[i] = it[0];
            seen[it[0]]++;
        }
        for (int i = 0; i < 50; i++) ck_assert_int_eq(seen[i], 1);
    }
    ck_assert(memcmp(e0, e1, sizeof e0) != 0);
    int same = 1;
    for (int i = 0; i < 50; i++) same &= e0[i] == i;
    ck_assert_msg(!same, "the shuffled order is the identity");
    /* a sampler restored from (epoch, position, generator) continues identically */
    for (int i = 0; i < 17; i++) sbp_sampler_next(&s, it);
    ck_assert_int_eq(sbp_sampler_init(&r, 50, 1, 1, 42, &err), SBP_OK);
    ck_assert_int_eq(sbp_sampler_restore(&r, s.epoch, s.pos, s.rng, &err), SBP_OK);
    for (int i = 0; i < 120; i++) {
        int64_t a, b;
        sbp_sampler_next(&s, &a), sbp_sampler_next(&r, &b);
        ck_assert_int_eq(a, b);
    }
    ck_assert_int_eq(sbp_sampler_restore(&r, 0, 51, s.rng, &err), SBP_EINPUT);
    sbp_sampler_free(&s), sbp_sampler_free(&r);
}
END_TEST

static sbp_status open_jsonl(sbp_data **d, const char *text, int T, int B, sbp_err *err) {
    const char *path = tu_path("records-%d.jsonl", T);
    tu_spit(path, text, strlen(text));
    sbp_config cfg;
    ck_assert_int_eq(sbp_config_load(&cfg, "data/models/qwen3-tiny.json", err), SBP_OK);
    sbp_data_opts o = {.jsonl = path, .T = T, .B = B, .scale_rewards = 1};
    return sbp_data_open(d, &o, &cfg, err);
}

START_TEST(jsonl_records_padded_and_truncated) {
    sbp_data *d;
    sbp_err err = {0};
    const char *text = "{\"input_ids\": [1, 2, 3]}\n"
                       "\n"
                       "{\"input_ids\": [5, 6, 7, 8, 9], \"labels\": [-100, -100, 7, 8, 9]}\n"
                       "{\"input_ids\": [4, 4], \"labels\": [-100, -100]}\n"
                       "{\"input_ids\": [7]}\n";
    ck_assert_int_eq(open_jsonl(&d, text, 4, 2, &err), SBP_OK);
    ck_assert_int_eq(sbp_data_items(d), 2); /* two records without a target were skipped */
    ck_assert_int_eq(sbp_data_skipped(d), 2);
    ck_assert_int_eq(sbp_data_truncated(d), 1);
    ck_assert_int_eq(sbp_data_items_per_batch(d), 2);
    ck_assert_ptr_nonnull(strstr(sbp_data_item_name(d, 1), ":3"));
    int64_t items[2] = {0, 1};
    sbp_batch b;
    ck_assert_int_eq(sbp_data_batch(&b, d, items, 2, &err), SBP_OK);
    const int32_t ids[8] = {1, 2, 3, 0, 5, 6, 7, 8}, labels[8] = {1, 2, 3, -100, -100, -100, 7, 8};
    const uint8_t mask[8] = {1, 1, 1, 0, 1, 1, 1, 1};
    ck_assert_int_eq(b.B, 2);
    ck_assert_int_eq(b.T, 4);
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(b.ids[i], ids[i]);
        ck_assert_int_eq(b.labels[i], labels[i]);
        ck_assert_int_eq(b.mask[i], mask[i]);
    }
    ck_assert_int_eq(b.n_targets, 4); /* 2, 3 | 7, 8 */
    sbp_batch_free(&b);
    uint64_t h = sbp_data_hash(d);
    sbp_data_free(d);
    /* the hash follows the contents */
    ck_assert_int_eq(open_jsonl(&d, "{\"input_ids\": [1, 2, 4]}\n", 4, 2, &err), SBP_OK);
    ck_assert(sbp_data_hash(d) != h);
    sbp_data_free(d);
    /* bad records are named by line and index */
    static const char *bad[][2] = {
        {"{\"input_ids\": [1, 2]}\n{\"input_ids\": [1, 2, 300]}\n",
         "records-4.jsonl:2: input_ids[2] = 300"},
        {"{\"input_ids\": [1, 2], \"labels\": [1]}\n", "as long as input_ids"},
        {"not json\n", ":1: malformed JSON"},
        {"[1, 2]\n", ":1: not a JSON object"},
        {"{\"input_ids\": [1.5, 2]}\n", "input_ids[0] is not an integer"},
        {"{\"input_ids\": [1, 2], \"labels\": [1, -7]}\n", "labels[1] = -7"},
        {"{\"labels\": [1, 2]}\n", "no \"input_ids\""},
        {"{\"input_ids\": [1], \"labels\": [-100]}\n", "no record with a target"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_ne(open_jsonl(&d, bad[i][0], 4, 1, &err), SBP_OK);
        ck_assert_msg(strstr(err.msg, bad[i][1]), "case %zu: \"%s\" lacks \"%s\"", i, err.msg,
                      bad[i][1]);
    }
}
END_TEST

/* ---- the command: schedules, resume ------------------------------------------------------------
 */

START_TEST(fifty_steps_bitwise_across_schedules) {
    static const char *sched[3] = {"full", "ckpt", "stream"};
    static const int threads[3] = {1, 2, 2}; /* the thread count does not matter either */
    for (int s = 0; s < 3; s++) {
        int rc = train(tu_path("run-%s", sched[s]), sched[s], 50, threads[s], "--log-every 10");
        ck_assert_msg(rc == 0, "%s: %s", sched[s], tu_last_output());
        tu_assert_clean_output();
    }
    for (int s = 0; s < 2; s++) {
        assert_same_file(tu_path("run-%s/model.safetensors", sched[s]),
                         tu_path("run-stream/model.safetensors"));
        assert_same_file(tu_path("run-%s/loss.csv", sched[s]), tu_path("run-stream/loss.csv"));
    }
    char *csv = tu_slurp(tu_path("run-stream/loss.csv"), NULL);
    int rows;
    double first = loss_at(csv, 1, &rows), last = loss_at(csv, 50, NULL), head = 0, tail = 0;
    for (int k = 1; k <= 10; k++) head += loss_at(csv, k, NULL) / 10;
    for (int k = 41; k <= 50; k++) tail += loss_at(csv, k, NULL) / 10;
    ck_assert_int_eq(rows, 50);
    ck_assert_msg(last < 0.5 * first && tail < head - 1,
                  "the loss does not fall: %.4f -> %.4f (means of 10 steps %.4f -> %.4f)", first,
                  last, head, tail);
    printf("50 steps, qwen3-tiny, full/ckpt/stream byte-identical weights and loss.csv; loss "
           "%.4f -> %.4f (mean of the first 10 steps %.4f, of the last 10 %.4f)\n",
           first, last, head, tail);
    free(csv);
}
END_TEST

/* Other objectives, float64, accumulation, no-decay groups: full and stream agree bitwise. */
START_TEST(objectives_precisions_accumulation) {
    static const char *cases[][3] = {
        {"llama3-tiny",
         "--data data/batches/grpo-tiny.safetensors --objective grpo --loss-type "
         "dapo --beta 0.04 --grad-accum 2 --precision fp64",
         "grpo"},
        {"qwen2-tiny",
         "--data data/batches/dpo-tiny.safetensors --objective dpo "
         "--no-decay-norms-biases --weight-decay 0.1",
         "dpo"},
        {"qwen3-tiny",
         "--data data/batches/sft-tiny.safetensors --data "
         "data/batches/sft-demo.safetensors --grad-accum 3 --precision fp64 "
         "--lr-scheduler linear --warmup-steps 2",
         "sft"}};
    for (int c = 0; c < 3; c++) {
        for (int s = 0; s < 2; s++) {
            const char *sched = s ? "stream" : "full";
            int rc = tu_sh("%s train --model %s %s --steps 6 --lr 1e-3 --block 8 --chunk 8 "
                           "--logit-chunk 8 --schedule %s --threads 1 --out %s",
                           tu_bin(), tu_model(cases[c][0], 3), cases[c][1], sched,
                           tu_path("obj-%s-%s", cases[c][2], sched));
            ck_assert_msg(rc == 0, "%s %s: %s", cases[c][2], sched, tu_last_output());
        }
        assert_same_file(tu_path("obj-%s-full/model.safetensors", cases[c][2]),
                         tu_path("obj-%s-stream/model.safetensors", cases[c][2]));
        assert_same_file(tu_path("obj-%s-full/loss.csv", cases[c][2]),
                         tu_path("obj-%s-stream/loss.csv", cases[c][2]));
    }
}
END_TEST

START_TEST(stop_and_resume_is_bitwise) {
    const char *whole = tu_path("whole"), *parts = tu_path("parts");
    ck_assert_msg(train(whole, "stream", 50, 1, "") == 0, "%s", tu_last_output());
    /* stopped at 25 with checkpoints every 10, resumed from the newest with another schedule */
    ck_assert_msg(train(parts, "stream", 50, 1, "--stop-at 25 --save-every 10") == 0, "%s",
                  tu_last_output());
    ck_assert(!tu_exists(tu_join(parts, "model.safetensors")));
    ck_assert(tu_exists(tu_join(parts, "checkpoint-25/optimizer.safetensors")));
    /* leftovers of a writer that died: the run removes its own kinds, and nothing else */
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    ck_assert_int_eq(waitpid(dead, NULL, 0), dead);
    const char *left_dir = tu_path("parts/checkpoint-30.tmp.%ld", (long)dead);
    const char *left_csv = tu_path("parts/loss.csv.tmp.%ld", (long)dead);
    const char *foreign = tu_path("parts/notes.tmp.%ld", (long)dead);
    ck_assert_int_eq(mkdir(left_dir, 0755), 0);
    tu_spit(tu_join(left_dir, "model.safetensors"), "half", 4);
    tu_spit(left_csv, "x", 1);
    tu_spit(foreign, "mine", 4);
    int rc = tu_sh("%s train --model %s " DEMO_DATA " --steps 50 --schedule ckpt --threads 2 "
                   "--out %s --save-every 10 --resume %s",
                   tu_bin(), model(), parts, parts);
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    ck_assert_ptr_nonnull(strstr(tu_last_output(), "resuming from"));
    ck_assert_ptr_nonnull(strstr(tu_last_output(), "checkpoint-25"));
    assert_same_file(tu_join(whole, "model.safetensors"), tu_join(parts, "model.safetensors"));
    assert_same_file(tu_join(whole, "loss.csv"), tu_join(parts, "loss.csv"));
    ck_assert(!tu_exists(left_dir) && !tu_exists(left_csv));
    ck_assert(tu_exists(foreign));
    unlink(foreign);
    /* the checkpoints the resumed run wrote again are those of the uninterrupted run */
    ck_assert_msg(tu_sh("%s train --model %s " DEMO_DATA " --steps 50 --threads 1 --out %s "
                        "--save-every 10",
                        tu_bin(), model(), tu_path("whole10")) == 0,
                  "%s", tu_last_output());
    assert_same_file(tu_path("whole10/checkpoint-40/optimizer.safetensors"),
                     tu_join(parts, "checkpoint-40/optimizer.safetensors"));
    tu_assert_no_tmp(parts);
}
END_TEST

/* A run killed with SIGKILL after a checkpoint, resumed from its newest checkpoint. */
START_TEST(kill_and_resume_is_bitwise) {
    const char *whole = tu_path("k-whole"), *killed = tu_path("k-killed");
    const char *extra = "--seq 32 --batch-size 2";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s train --model %s " DEMO_DATA " %s --steps 60 --threads 1",
             tu_bin(), model(), extra);
    ck_assert_msg(tu_sh("%s --out %s", cmd, whole) == 0, "%s", tu_last_output());
    char run[2300];
    snprintf(run, sizeof run, "%s --out %s --save-every 5", cmd, killed);
    const int was_killed = tu_kill_after(run, tu_join(killed, "checkpoint-20/trainer_state.json"));
    char *csv = tu_slurp(tu_join(killed, "loss.csv"), NULL);
    int rows;
    loss_at(csv, 1, &rows);
    free(csv);
    printf("kill: the run was %s after %d logged steps\n",
           was_killed ? "killed by SIGKILL" : "already finished (not killed)", rows);
    int rc = tu_sh("%s --out %s --save-every 5 --resume %s", cmd, killed, killed);
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    assert_same_file(tu_join(whole, "model.safetensors"), tu_join(killed, "model.safetensors"));
    assert_same_file(tu_join(whole, "loss.csv"), tu_join(killed, "loss.csv"));
    tu_assert_no_tmp(killed);
}
END_TEST

START_TEST(torch_cross_check) {
    if (!tu_python_has("/usr/bin/python3", "torch")) {
        printf("SKIPPED: PyTorch not installed (python3-torch); AdamW cross-check not run\n");
        fflush(stdout);
        return;
    }
    int rc = tu_sh("/usr/bin/python3 verify/torch_adamw.py --streambp %s --workdir %s", tu_bin(),
                   tu_path("torch-adamw"));
    printf("%s", tu_last_output());
    fflush(stdout);
    ck_assert_msg(rc == 0, "verify/torch_adamw.py failed:\n%s", tu_last_output());
}
END_TEST

START_TEST(plot_or_skip) {
    const char *out = tu_path("plot");
    int rc = tu_sh("%s train --model %s " DEMO_DATA " --steps 3 --threads 1 --out %s --plot",
                   tu_bin(), model(), out);
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    char *said = strdup(tu_last_output());
    if (tu_sh("command -v gnuplot") == 0)
        ck_assert_msg(tu_exists(tu_join(out, "loss.png")), "no loss.png: %s", said);
    else
        ck_assert_msg(strstr(said, "--plot skipped: gnuplot is not installed"), "%s", said);
    free(said);
}
END_TEST

/* ---- bad input ------------------------------------------------------------------------------- */

/* A train command that must fail with exit 2 (tu_expect_usage). */
#define expect_usage(expect, ...) tu_expect_usage(expect, "train " __VA_ARGS__)

START_TEST(bad_options_and_data) {
    const char *m = model(), *out = tu_path("never");
    const char *base = "--jsonl data/train/counting.jsonl --seq 64";
    expect_usage("--lr must be", "--model %s %s --steps 5 --out %s --lr -1", m, base, out);
    expect_usage("beta1 must be in [0, 1)", "--model %s %s --steps 5 --out %s --beta1 1", m, base,
                 out);
    expect_usage("--eps must be", "--model %s %s --steps 5 --out %s --eps -1", m, base, out);
    expect_usage("--weight-decay must be", "--model %s %s --steps 5 --out %s --weight-decay nan", m,
                 base, out);
    expect_usage("--steps must be a positive integer", "--model %s %s --steps 0 --out %s", m, base,
                 out);
    expect_usage("--grad-accum must be", "--model %s %s --steps 5 --grad-accum 0 --out %s", m, base,
                 out);
    expect_usage("--max-grad-norm must be", "--model %s %s --steps 5 --max-grad-norm -1 --out %s",
                 m, base, out);
    expect_usage("--warmup-steps must be", "--model %s %s --steps 5 --warmup-steps -3 --out %s", m,
                 base, out);
    expect_usage("--stop-at 9 is after the last step",
                 "--model %s %s --steps 5 --stop-at 9 --out %s", m, base, out);
    expect_usage("--lr-scheduler must be", "--model %s %s --steps 5 --lr-scheduler exp --out %s", m,
                 base, out);
    expect_usage("fp32 or fp64", "--model %s %s --steps 5 --precision bf16 --out %s", m, base, out);
    expect_usage("missing --steps N", "--model %s %s --out %s", m, base, out);
    expect_usage("--jsonl needs --seq",
                 "--model %s --jsonl data/train/counting.jsonl --steps 5 "
                 "--out %s",
                 m, out);
    expect_usage("not both", "--model %s %s --data data/batches --steps 5 --out %s", m, base, out);
    expect_usage("--seq and --batch-size apply to --jsonl",
                 "--model %s --data data/batches/sft-tiny.safetensors --seq 8 --steps 5 --out %s",
                 m, out);
    expect_usage("/no/such/dir: no such batch file or directory",
                 "--model %s --data /no/such/dir --steps 5 --out %s", m, out);
    const char *empty = tu_new_dir("empty-data");
    expect_usage("holds no *.safetensors batch file", "--model %s --data %s --steps 5 --out %s", m,
                 empty, out);
    expect_usage("batch has no tensor \"input_ids\"",
                 "--model %s --data data/batches/dpo-tiny.safetensors --steps 5 --out %s", m, out);
    expect_usage("DPO needs reference log-probs",
                 "--model %s --data data/batches/dpo-noref.safetensors --objective dpo --steps 5 "
                 "--out %s",
                 m, out);
    const char *badj = tu_path("bad.jsonl");
    const char *badtext = "{\"input_ids\": [1, 2]}\n{\"input_ids\": [1, 999]}\n";
    tu_spit(badj, badtext, strlen(badtext));
    expect_usage("bad.jsonl:2: input_ids[1] = 999 is outside [0, 200)",
                 "--model %s --jsonl %s --seq 8 --steps 5 --out %s", m, badj, out);
    expect_usage("JSONL records are SFT data",
                 "--model %s --jsonl data/train/counting.jsonl --seq 8 --objective grpo --steps 5 "
                 "--out %s",
                 m, out);
    ck_assert_msg(!tu_exists(out), "%s was created by a failed run", out);
}
END_TEST

START_TEST(bad_resume_overwrites_nothing) {
    const char *run = tu_path("r-run"), *m = model();
    ck_assert_msg(train(run, "stream", 10, 1, "--stop-at 6 --save-every 3") == 0, "%s",
                  tu_last_output());
    char *before = tu_snapshot(run);
    const char *ck = tu_join(run, "checkpoint-6");
    /* another model: other weights of the same architecture, another architecture */
    expect_usage("initial weights (hash of --model's weights)",
                 "--model %s " DEMO_DATA " --steps 10 --out %s --resume %s",
                 tu_model("qwen3-tiny", 2), run, ck);
    expect_usage("the model (config.json) = qwen3",
                 "--model %s " DEMO_DATA " --steps 10 --out %s --resume %s",
                 tu_model("llama3-tiny", 1), run, ck);
    /* other settings */
    expect_usage("--lr = 0.01, this run 0.02",
                 "--model %s " DEMO_DATA " --steps 10 --out %s --resume %s --lr 2e-2", m, run, ck);
    expect_usage("--steps = 10, this run 12",
                 "--model %s " DEMO_DATA " --steps 12 --out %s --resume %s", m, run, ck);
    expect_usage("--precision = fp32, this run fp64",
                 "--model %s " DEMO_DATA " --steps 10 --out %s --resume %s --precision fp64", m,
                 run, ck);
    expect_usage("--block = 16, this run 32",
                 "--model %s " DEMO_DATA " --steps 10 --out %s --resume %s --block 32", m, run, ck);
    const char *other_data = tu_path("other.jsonl");
    tu_spit(other_data, "{\"input_ids\": [1, 2, 3]}\n", 25);
    expect_usage("data contents",
                 "--model %s --jsonl %s --seq 64 --batch-size 4 --lr 1e-2 --warmup-steps 5 "
                 "--shuffle --weight-decay 0.01 --block 16 --steps 10 --out %s --resume %s",
                 m, other_data, run, ck);
    /* a fresh run into it, a resume of nothing, a resume into another run's directory */
    expect_usage("already holds a training run", "--model %s " DEMO_DATA " --steps 10 --out %s", m,
                 run);
    expect_usage("no checkpoint there", "--model %s " DEMO_DATA " --steps 10 --out %s --resume %s",
                 m, tu_path("r-other"), tu_path("r-nothing"));
    const char *other = tu_path("r-other");
    ck_assert_msg(train(other, "stream", 2, 1, "") == 0, "%s", tu_last_output());
    char *other_before = tu_snapshot(other);
    expect_usage("holds another training run",
                 "--model %s " DEMO_DATA " --steps 10 --out %s --resume %s", m, other, ck);
    /* a damaged trainer state */
    const char *dam = tu_path("r-damaged");
    ck_assert_int_eq(
        tu_sh("cp -r '%s' '%s' && echo '{\"step\": 3}' > '%s/trainer_state.json'", ck, dam, dam),
        0);
    expect_usage("not a streambp trainer state",
                 "--model %s " DEMO_DATA " --steps 10 --out %s --resume %s", m, tu_path("r-new"),
                 dam);
    ck_assert(!tu_exists(tu_path("r-new")));
    char *after = tu_snapshot(run), *other_after = tu_snapshot(other);
    ck_assert_str_eq(before, after);
    ck_assert_str_eq(other_before, other_after);
    free(before), free(after), free(other_before), free(other_after);
    /* and the untouched run still resumes */
    ck_assert_msg(tu_sh("%s train --model %s " DEMO_DATA " --steps 10 --threads 1 --out %s "
                        "--resume %s",
                        tu_bin(), m, run, run) == 0,
                  "%s", tu_last_output());
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("train");
    TCase *lib = tcase_create("library");
    tcase_add_loop_test(lib, adamw_against_hand_computation, 0, 2);
    tcase_add_test(lib, adamw_no_decay_group);
    tcase_add_test(lib, clipping_as_torch);
    tcase_add_test(lib, schedules_of_the_learning_rate);
    tcase_add_test(lib, optimizer_and_norm_do_not_depend_on_threads);
    tcase_add_test(lib, sampler_order_and_restore);
    tcase_add_test(lib, jsonl_records_padded_and_truncated);
    suite_add_tcase(s, lib);
    TCase *cli = tcase_create("command");
    tcase_set_timeout(cli, 300);
    tcase_add_test(cli, fifty_steps_bitwise_across_schedules);
    tcase_add_test(cli, objectives_precisions_accumulation);
    tcase_add_test(cli, stop_and_resume_is_bitwise);
    tcase_add_test(cli, kill_and_resume_is_bitwise);
    tcase_add_test(cli, torch_cross_check);
    tcase_add_test(cli, plot_or_skip);
    tcase_add_test(cli, bad_options_and_data);
    tcase_add_test(cli, bad_resume_overwrites_nothing);
    suite_add_tcase(s, cli);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
