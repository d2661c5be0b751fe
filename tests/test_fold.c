/* test_fold.c — the fold (docs/distributed.md): a step over micro-batches forms each
 * micro-batch's gradient and loss from zero and folds them in order, S ← S + g_k, L ← L + l_k,
 * one IEEE add per element. That definition is what makes a step's bits independent of how the
 * micro-batches are spread over processes, so it is checked to the bit here against separate
 * one-batch steps folded by hand: untied and tied heads, LoRA, fp32/fp64, bf16 storage (each
 * fold result rounded), every schedule. Also: the memory it costs (one largest-bucket scratch,
 * plus the embedding's with a tied head) in the ledger and in the planner, and the committed
 * golden digest of an accumulated step (data/golden-accum/, SBP_GOLDEN_UPDATE=1 rewrites); the
 * first error standing when the hook that takes the buckets refuses one; and the gradient sink,
 * a one-batch step's gradient handed out a bucket at a time through the fold (its bits, memory,
 * plan and refusals). */
#include "../src/dist/dist.h"
#include "../src/api/resolve.h"
#include "../src/engine/entry.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *sft_batches[] = {
    "data/batches/sft-tiny.safetensors", "data/batches/suite-unequal-rows.safetensors",
    "data/batches/suite-left-padding.safetensors", "data/batches/suite-right-padding.safetensors"};
enum { N_MICRO = 4 };

/* Round to nearest even on the upper 16 bits (src/kernels/bf16.c). */
static float to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return f;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* s ← s + g over n elements, as the fold defines it. */
static void fold(void *s, const void *g, int64_t n, sbp_precision prec, int bf16) {
    for (int64_t i = 0; i < n; i++)
        if (prec == SBP_FP64)
            ((double *)s)[i] = ((double *)s)[i] + ((const double *)g)[i];
        else {
            float v = ((float *)s)[i] + ((const float *)g)[i];
            ((float *)s)[i] = bf16 ? to_bf16(v) : v;
        }
}

typedef struct {
    const char *model;
    sbp_precision prec;
    sbp_schedule sched;
    sbp_numerics num;
    int bf16, lora, threads;
} fold_case;

static const fold_case cases[] = {
    {"llama3-tiny", SBP_FP32, SBP_STREAM, SBP_NUMERICS_PORTABLE, 0, 0, 2},
    {"llama3-tiny", SBP_FP32, SBP_FULL, SBP_NUMERICS_FAST, 0, 0, 1},
    {"qwen3-tiny", SBP_FP32, SBP_STREAM, SBP_NUMERICS_FAST, 0, 0, 2}, /* tied */
    {"qwen3-tiny", SBP_FP64, SBP_CKPT, SBP_NUMERICS_PORTABLE, 0, 0, 1},
    {"qwen2-tiny", SBP_FP64, SBP_STREAM, SBP_NUMERICS_PORTABLE, 0, 0, 2},  /* biases */
    {"llama3-tiny", SBP_FP32, SBP_STREAM, SBP_NUMERICS_PORTABLE, 1, 0, 2}, /* bf16 */
    {"qwen3-tiny", SBP_FP32, SBP_STREAM, SBP_NUMERICS_PORTABLE, 0, 1, 2},  /* LoRA */
    {"qwen3-tiny", SBP_FP32, SBP_FULL, SBP_NUMERICS_FAST, 1, 0, 1},        /* tied, bf16 */
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

/* The micro-batches of a case, with the step's normaliser set by hand so that a one-batch step
 * over micro-batch k computes the very g_k the accumulated step does. */
static void load(sbp_model *m, sbp_batch *b, sbp_grad_opts *o, sbp_lora *a, const fold_case *c) {
    tu_load(m, NULL, tu_model(c->model, 1), NULL, c->prec);
    if (c->bf16) sbp_model_round_bf16(m);
    sbp_err err = {0};
    double items = 0;
    for (int k = 0; k < N_MICRO; k++) {
        if (sbp_batch_load_as(&b[k], sft_batches[k], &m->cfg, SBP_OBJ_SFT, 1, &err))
            ck_abort_msg("%s: %s", sft_batches[k], err.msg);
        items += b[k].n_targets;
    }
    *o = (sbp_grad_opts){.schedule = c->sched,
                         .numerics = c->num,
                         .block = 4,
                         .chunk = 7,
                         .logit_chunk = 5,
                         .emulate_bf16 = c->bf16,
                         .objective = {.kind = SBP_OBJ_SFT, .num_items = items}};
    if (c->lora) {
        sbp_lora_config lc = {
            .r = 2, .alpha = 4, .targets = SBP_LORA_Q | SBP_LORA_V | SBP_LORA_DOWN};
        if (sbp_lora_init(a, &m->cfg, &lc, 7, 0.05, c->prec, &err)) ck_abort_msg("%s", err.msg);
        o->lora = a;
    }
}

START_TEST(fold_bits) {
    const fold_case *c = &cases[_i];
    sbp_model m;
    sbp_batch b[N_MICRO];
    sbp_grad_opts o;
    sbp_lora a = {0};
    load(&m, b, &o, &a, c);
    sbp_set_threads(c->threads);
    sbp_err err = {0};
    sbp_grad_result acc, one;
    if (sbp_grad_batches(&acc, &m, b, N_MICRO, &o, NULL, &err)) ck_abort_msg("%s", err.msg);
    const int64_t n = c->lora ? a.params.total : m.params.total;
    const size_t bytes = (size_t)n * (c->prec == SBP_FP64 ? 8 : 4);
    void *s = malloc(bytes);
    double loss = 0;
    for (int k = 0; k < N_MICRO; k++) {
        if (sbp_grad(&one, &m, &b[k], &o, NULL, &err)) ck_abort_msg("%d: %s", k, err.msg);
        if (k == 0)
            memcpy(s, one.grads, bytes), loss = one.loss;
        else
            fold(s, one.grads, n, c->prec, c->bf16), loss = loss + one.loss;
        sbp_grad_result_free(&one, NULL);
    }
    int64_t first = -1;
    for (int64_t i = 0; i < n && first < 0; i++)
        if (memcmp((char *)s + i * (bytes / n), (char *)acc.grads + i * (bytes / n), bytes / n))
            first = i;
    ck_assert_msg(first < 0,
                  "case %d (%s): the accumulated gradient is not the fold at element %lld", _i,
                  c->model, (long long)first);
    ck_assert_msg(memcmp(&loss, &acc.loss, sizeof loss) == 0, "case %d: loss %.17g, fold %.17g", _i,
                  acc.loss, loss);
    free(s);
    sbp_grad_result_free(&acc, NULL);
    for (int k = 0; k < N_MICRO; k++) sbp_batch_free(&b[k]);
    if (c->lora) sbp_lora_free(&a, NULL);
    sbp_model_free(&m, NULL);
    sbp_set_threads(1);
}
END_TEST

/* Bytes the fold adds to a step: the largest bucket's scratch, and a tied embedding's own. */
static int64_t fold_scratch_bytes(const sbp_params *ps, int tied, int esz) {
    sbp_bucket bk[64];
    const int nb = sbp_grad_buckets(bk, 64, ps);
    ck_assert_int_gt(nb, 0);
    int64_t most = 0, emb = 0;
    for (int i = 0; i < nb; i++)
        if (tied && bk[i].id == SBP_BUCKET_EMBED)
            emb = bk[i].n;
        else if (bk[i].n > most)
            most = bk[i].n;
    return (most + emb) * esz;
}

/* The gradients' peak in the ledger: the slab alone for one micro-batch, the slab and the
 * scratch for several. */
START_TEST(fold_memory) {
    const char *models[] = {"llama3-tiny", "qwen3-tiny"};
    sbp_model m;
    sbp_batch b[N_MICRO];
    sbp_grad_opts o;
    sbp_lora a = {0};
    fold_case c = {models[_i], SBP_FP32, SBP_STREAM, SBP_NUMERICS_FAST, 0, 0, 1};
    load(&m, b, &o, &a, &c);
    sbp_err err = {0};
    sbp_ledger l1 = {0}, l4 = {0};
    sbp_grad_result r;
    ck_assert_int_eq(sbp_grad_batches(&r, &m, b, 1, &o, &l1, &err), SBP_OK);
    sbp_grad_result_free(&r, &l1);
    ck_assert_int_eq(sbp_grad_batches(&r, &m, b, N_MICRO, &o, &l4, &err), SBP_OK);
    sbp_grad_result_free(&r, &l4);
    const int64_t slab = m.params.total * 4, scratch = fold_scratch_bytes(&m.params, m.cfg.tied, 4);
    ck_assert_int_eq(l1.peak[SBP_MEM_GRADS], slab);
    ck_assert_int_eq(l4.peak[SBP_MEM_GRADS], slab + scratch);
    /* the buckets tile the slab: head, layers from the last down, embedding */
    sbp_bucket bk[64];
    const int nb = sbp_grad_buckets(bk, 64, &m.params);
    ck_assert_int_eq(nb, m.cfg.layers + 2);
    ck_assert_int_eq(bk[0].id, SBP_BUCKET_HEAD);
    ck_assert_int_eq(bk[1].id, m.cfg.layers - 1);
    ck_assert_int_eq(bk[nb - 1].id, SBP_BUCKET_EMBED);
    int64_t covered = 0;
    for (int i = 0; i < nb; i++) covered += bk[i].n;
    ck_assert_int_eq(covered, m.params.total);
    for (int k = 0; k < N_MICRO; k++) sbp_batch_free(&b[k]);
    sbp_model_free(&m, NULL);
}
END_TEST

/* The plan peaks where the measured step peaks, in total and in every category, to the byte. */
static void assert_planned(const sbp_ledger *plan, const sbp_ledger *real, const char *what) {
    ck_assert_msg(plan->peak_total == real->peak_total, "%s: planned %lld, measured %lld", what,
                  (long long)plan->peak_total, (long long)real->peak_total);
    for (int c = 0; c < SBP_MEM_NCATS; c++)
        ck_assert_msg(plan->peak[c] == real->peak[c] && plan->at_peak[c] == real->at_peak[c],
                      "%s: %s planned %lld (%lld at the peak), measured %lld (%lld)", what,
                      sbp_mem_cat_name(c), (long long)plan->peak[c], (long long)plan->at_peak[c],
                      (long long)real->peak[c], (long long)real->at_peak[c]);
}

/* The planner charges the fold: a step of four micro-batches of one shape, planned with
 * micro_batches = 4, peaks where the measured step peaks, in every category, to the byte. */
START_TEST(plan_counts_fold) {
    const char *models[] = {"llama3-tiny", "qwen3-tiny"};
    const sbp_schedule scheds[] = {SBP_STREAM, SBP_FULL};
    sbp_ledger real = {0}, plan;
    sbp_model m;
    sbp_batch b;
    sbp_err err = {0};
    if (sbp_model_load(&m, tu_model(models[_i % 2], 1), SBP_FP32, &real, &err))
        ck_abort_msg("%s", err.msg);
    if (sbp_batch_load(&b, "data/batches/sft-demo.safetensors", &m.cfg, &err))
        ck_abort_msg("%s", err.msg);
    sbp_batch micro[N_MICRO];
    for (int k = 0; k < N_MICRO; k++) micro[k] = b;
    sbp_grad_opts o = {.schedule = scheds[_i / 2], .block = 16, .chunk = 32, .logit_chunk = 16};
    sbp_grad_result r;
    if (sbp_grad_batches(&r, &m, micro, N_MICRO, &o, &real, &err)) ck_abort_msg("%s", err.msg);
    sbp_plan_opts po = {
        .grad = o, .B = b.B, .T = b.T, .storage_bytes = 4, .micro_batches = N_MICRO};
    if (sbp_plan(&plan, &m.cfg, &po, &err)) ck_abort_msg("plan: %s", err.msg);
    assert_planned(&plan, &real, models[_i % 2]);
    sbp_grad_result_free(&r, &real);
    sbp_batch_free(&b);
    sbp_model_free(&m, &real);
}
END_TEST

/* An accumulated step's digest from the CLI (four micro-batches, portable numerics), in three
 * configurations that must agree, against the committed one. */
START_TEST(golden_accumulated) {
    const char *models[] = {"llama3-tiny", "qwen3-tiny"};
    const char *runs[] = {
        "--schedule full --threads 1",
        "--schedule stream --chunk 7 --logit-chunk 5 --block 4 --threads 2",
        "--schedule ckpt --chunked-logits --logit-chunk 3 --block 16 --threads 2",
    };
    const char *dir = tu_path("golden-accum-%s", models[_i]);
    if (tu_sh("'%s' init --config data/models/%s.json --seed 1 --out '%s'", tu_bin(), models[_i],
              dir))
        ck_abort_msg("init: %s", tu_last_output());
    char batches[1024] = "";
    for (int k = 0; k < N_MICRO; k++)
        snprintf(batches + strlen(batches), sizeof batches - strlen(batches), " --batch %s",
                 sft_batches[k]);
    char golden[256];
    snprintf(golden, sizeof golden, "data/golden-accum/%s-sft4-fp32.txt", models[_i]);
    char *first = NULL;
    for (int r = 0; r < 3; r++) {
        const char *out = tu_path("accum-%s-%d.safetensors", models[_i], r);
        if (tu_sh("'%s' grad --model '%s'%s --numerics portable %s --out '%s'", tu_bin(), dir,
                  batches, runs[r], out))
            ck_abort_msg("grad: %s", tu_last_output());
        if (tu_sh("'%s' verify digest '%s'", tu_bin(), out))
            ck_abort_msg("digest: %s", tu_last_output());
        if (!first)
            first = strdup(tu_last_output());
        else
            ck_assert_msg(strcmp(first, tu_last_output()) == 0, "%s: run %d differs from run 0",
                          models[_i], r);
    }
    if (getenv("SBP_GOLDEN_UPDATE")) {
        FILE *f = fopen(golden, "w");
        ck_assert_ptr_nonnull(f);
        fputs(first, f);
        fclose(f);
    } else {
        FILE *f = fopen(golden, "r");
        ck_assert_msg(f != NULL, "no %s (SBP_GOLDEN_UPDATE=1 writes it)", golden);
        static char want[1 << 16];
        size_t got = fread(want, 1, sizeof want - 1, f);
        want[got] = 0;
        fclose(f);
        ck_assert_msg(strcmp(first, want) == 0, "%s: the accumulated step's digest changed:\n%s",
                      models[_i], first);
    }
    free(first);
}
END_TEST

/* A bucket hook that refuses bucket number `at` of the run (0: the first) and counts its calls. */
typedef struct {
    int calls, at;
} refusing;

static int refuse(void *ctx, int64_t off, int64_t n, const void *g) {
    refusing *r = ctx;
    return r->calls++ != r->at;
}

/* The first error stands (docs/development.md, "Errors"): a hook that refuses a bucket — a peer
 * that died or went silent while the bucket travelled — is not called again, the run stops there
 * and reports the hook's failure, at the first, a middle and the last bucket, tied and untied.
 * (The distributed step's own test of the rule, a stopped rank at each of those buckets giving
 * exit 3 for every family, is tests/mpi_ranks.sh's.) */
START_TEST(refused_bucket_stops_the_run) {
    const char *model = _i < 3 ? "llama3-tiny" : "qwen3-tiny"; /* untied, tied */
    sbp_model m;
    sbp_batch b;
    sbp_err err = {0};
    tu_load(&m, NULL, tu_model(model, 1), NULL, SBP_FP32);
    if (sbp_batch_load_as(&b, sft_batches[0], &m.cfg, SBP_OBJ_SFT, 1, &err))
        ck_abort_msg("%s", err.msg);
    sbp_bucket bk[64];
    const int nb = sbp_grad_buckets(bk, 64, &m.params);
    ck_assert_int_gt(nb, 2);
    refusing r = {0, _i % 3 == 0 ? 0 : _i % 3 == 1 ? nb / 2 : nb - 1};
    const sbp_grad_opts o = {.schedule = SBP_STREAM, .block = 4, .chunk = 7};
    const sbp_objective so = {.kind = SBP_OBJ_SFT, .num_items = b.n_targets};
    sbp_engine_opts eo;
    sbp_obj_eval ev;
    if (sbp_engine_resolve(&eo, &o, b.T, &err) || sbp_obj_begin(&ev, &so, &b, &err))
        ck_abort_msg("%s", err.msg);
    eo.ev = &ev, eo.fold = 1, eo.bucket_hook = refuse, eo.hook_ctx = &r;
    double loss = 0;
    sbp_ledger lg = {0};
    const sbp_status st = sbp_engine_grad_f32(&loss, NULL, &m, &b, &eo, &lg, &err);
    sbp_obj_end(&ev);
    ck_assert_int_eq(st, SBP_EIO);
    ck_assert_msg(strstr(err.msg, "could not be handed on"), "%s", err.msg);
    ck_assert_msg(r.calls == r.at + 1,
                  "%s: the hook refused bucket %d of %d and was called %d times", model, r.at, nb,
                  r.calls);
    ck_assert_int_eq(lg.cur_total, 0); /* what the run had allocated is freed */
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * The gradient sink (sbp_grad_opts.grad_sink): a one-batch step whose gradient leaves piece by
 * piece as the backward completes it, never held whole. */

/* A sink that puts each piece where it belongs in a slab of its own, counting how often each
 * element arrived, and the order of the pieces (their offsets). */
typedef struct {
    char *slab;
    unsigned char *seen;
    int64_t n, offs[64];
    int esz, pieces, refuse_at; /* refuse_at: the piece refused (-1: none) */
} collector;

/* A collector of n elements of esz bytes that refuses piece refuse_at (-1: none). */
static collector new_collector(int64_t n, int esz, int refuse_at) {
    return (collector){.slab = n ? calloc((size_t)n, (size_t)esz) : NULL,
                       .seen = n ? calloc((size_t)n, 1) : NULL,
                       .n = n,
                       .esz = esz,
                       .refuse_at = refuse_at};
}

static int collect(void *ctx, int64_t off, int64_t n, const void *g) {
    collector *c = ctx;
    if (c->pieces == c->refuse_at) return c->pieces++, 0;
    ck_assert(off >= 0 && n >= 0 && off + n <= c->n);
    memcpy(c->slab + off * c->esz, g, (size_t)n * c->esz);
    for (int64_t i = off; i < off + n; i++) c->seen[i]++;
    if (c->pieces < 64) c->offs[c->pieces] = off;
    c->pieces++;
    return 1;
}

/* The sink's gradient is the held one, bit for bit, every element once, and so is the loss:
 * untied and tied heads, LoRA, fp32/fp64, bf16 storage, every schedule (the fold's cases). */
START_TEST(sink_bits) {
    const fold_case *c = &cases[_i];
    sbp_model m;
    sbp_batch b[N_MICRO];
    sbp_grad_opts o;
    sbp_lora a = {0};
    load(&m, b, &o, &a, c);
    sbp_set_threads(c->threads);
    o.objective.num_items = 0; /* one batch's own normaliser */
    sbp_err err = {0};
    sbp_grad_result held, sunk;
    if (sbp_grad(&held, &m, &b[1], &o, NULL, &err)) ck_abort_msg("%s", err.msg);
    const int64_t n = c->lora ? a.params.total : m.params.total;
    const int esz = c->prec == SBP_FP64 ? 8 : 4;
    collector col = new_collector(n, esz, -1);
    o.grad_sink = collect, o.grad_sink_ctx = &col;
    if (sbp_grad(&sunk, &m, &b[1], &o, NULL, &err)) ck_abort_msg("%s", err.msg);
    ck_assert_ptr_null(sunk.grads);
    ck_assert_int_eq(sunk.n_targets, held.n_targets);
    ck_assert_msg(memcmp(&sunk.loss, &held.loss, sizeof held.loss) == 0, "loss %.17g, held %.17g",
                  sunk.loss, held.loss);
    for (int64_t i = 0; i < n; i++) {
        ck_assert_msg(col.seen[i] == 1, "case %d: element %lld arrived %d times", _i, (long long)i,
                      col.seen[i]);
        ck_assert_msg(memcmp(col.slab + i * esz, (char *)held.grads + i * esz, esz) == 0,
                      "case %d (%s): element %lld is not the held gradient's", _i, c->model,
                      (long long)i);
    }
    /* in the backward's order: the head (untied: first), the layers from the top, the embedding
     * last (LoRA: the layers only) */
    sbp_bucket bk[64];
    const int nb = sbp_grad_buckets(bk, 64, c->lora ? &a.params : &m.params);
    ck_assert_int_eq(col.pieces, nb);
    for (int i = 0; i < nb; i++) ck_assert_int_eq(col.offs[i], bk[i].off);
    free(col.slab), free(col.seen);
    sbp_grad_result_free(&held, NULL);
    for (int k = 0; k < N_MICRO; k++) sbp_batch_free(&b[k]);
    if (c->lora) sbp_lora_free(&a, NULL);
    sbp_model_free(&m, NULL);
    sbp_set_threads(1);
}
END_TEST

/* What the sink saves: no slab, the fold's scratch instead (the largest piece, and a tied
 * embedding's), and the planner charges exactly that, category by category, every schedule. */
START_TEST(sink_memory) {
    const char *models[] = {"llama3-tiny", "qwen3-tiny"};
    const sbp_schedule scheds[] = {SBP_STREAM, SBP_FULL, SBP_CKPT};
    sbp_ledger real = {0}, plan;
    sbp_model m;
    sbp_batch b;
    sbp_err err = {0};
    if (sbp_model_load(&m, tu_model(models[_i % 2], 1), SBP_FP32, &real, &err))
        ck_abort_msg("%s", err.msg);
    if (sbp_batch_load(&b, "data/batches/sft-demo.safetensors", &m.cfg, &err))
        ck_abort_msg("%s", err.msg);
    collector col = new_collector(m.params.total, 4, -1);
    sbp_grad_opts o = {.schedule = scheds[_i / 2], .block = 16, .chunk = 32, .logit_chunk = 16};
    o.grad_sink = collect, o.grad_sink_ctx = &col;
    sbp_grad_result r;
    if (sbp_grad(&r, &m, &b, &o, &real, &err)) ck_abort_msg("%s", err.msg);
    ck_assert_int_eq(real.peak[SBP_MEM_GRADS], fold_scratch_bytes(&m.params, m.cfg.tied, 4));
    sbp_plan_opts po = {.grad = o, .B = b.B, .T = b.T, .storage_bytes = 4};
    if (sbp_plan(&plan, &m.cfg, &po, &err)) ck_abort_msg("plan: %s", err.msg);
    assert_planned(&plan, &real, models[_i % 2]);
    /* held, the same step peaks higher by the slab less the scratch */
    sbp_ledger held;
    po.grad.grad_sink = NULL;
    if (sbp_plan(&held, &m.cfg, &po, &err)) ck_abort_msg("plan: %s", err.msg);
    ck_assert_int_eq(held.peak[SBP_MEM_GRADS], 4 * m.params.total);
    ck_assert_int_lt(plan.peak_total, held.peak_total);
    free(col.slab), free(col.seen);
    sbp_batch_free(&b);
    sbp_model_free(&m, &real);
}
END_TEST

/* A sink that refuses a piece (a full disk) stops the step there with SBP_EIO, is not called
 * again, and what the step allocated is freed; the first, a middle and the last piece. */
START_TEST(sink_refused) {
    sbp_model m;
    sbp_batch b;
    sbp_err err = {0};
    sbp_ledger lg = {0};
    tu_load(&m, NULL, tu_model("qwen3-tiny", 1), NULL, SBP_FP32);
    if (sbp_batch_load_as(&b, sft_batches[0], &m.cfg, SBP_OBJ_SFT, 1, &err))
        ck_abort_msg("%s", err.msg);
    sbp_bucket bk[64];
    const int nb = sbp_grad_buckets(bk, 64, &m.params) - 1; /* the tied embedding's with the head */
    collector col = new_collector(m.params.total, 4, _i == 0 ? 0 : _i == 1 ? nb / 2 : nb - 1);
    sbp_grad_opts o = {.schedule = SBP_STREAM, .block = 4, .chunk = 7};
    o.grad_sink = collect, o.grad_sink_ctx = &col;
    sbp_grad_result r;
    ck_assert_int_eq(sbp_grad(&r, &m, &b, &o, &lg, &err), SBP_EIO);
    ck_assert_msg(strstr(err.msg, "sink refused"), "%s", err.msg);
    ck_assert_int_eq(col.pieces, col.refuse_at + 1);
    ck_assert_int_eq(lg.cur_total, 0);
    free(col.slab), free(col.seen);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* `grad --out` writes the gradient as it forms; `--hold-grads` holds it and writes it after the
 * step: the two files are the same bytes, header and metadata included (tied and untied heads,
 * each schedule). */
START_TEST(grad_out_same_bytes) {
    const char *models[] = {"llama3-tiny", "qwen3-tiny"};
    const char *scheds[] = {"full", "ckpt", "stream"};
    const char *dir = tu_path("out-bytes-%s", models[_i % 2]);
    if (tu_sh("'%s' init --config data/models/%s.json --seed 1 --out '%s'", tu_bin(),
              models[_i % 2], dir))
        ck_abort_msg("init: %s", tu_last_output());
    const char *f[2];
    for (int h = 0; h < 2; h++) {
        f[h] = tu_keep(tu_path("out-bytes-%s-%d.safetensors", models[_i % 2], h));
        if (tu_sh(
                "'%s' grad --model '%s' --batch %s --schedule %s --block 4 --chunk 8 --out '%s'%s",
                tu_bin(), dir, sft_batches[1], scheds[_i / 2], f[h], h ? " --hold-grads" : ""))
            ck_abort_msg("grad: %s", tu_last_output());
    }
    size_t n0, n1;
    char *a = tu_slurp(f[0], &n0), *b = tu_slurp(f[1], &n1);
    ck_assert_msg(n0 == n1 && memcmp(a, b, n0) == 0, "%s, %s: the files differ", models[_i % 2],
                  scheds[_i / 2]);
    free(a), free(b);
}
END_TEST

/* A sink takes one micro-batch in one process on the CPU, and a plan of it no optimizer: the
 * rest is refused before anything runs, naming why. */
START_TEST(sink_refuses_what_it_cannot_take) {
    sbp_model m;
    sbp_batch b[N_MICRO];
    sbp_grad_opts o;
    sbp_lora a = {0};
    const fold_case c = {"llama3-tiny", SBP_FP32, SBP_STREAM, SBP_NUMERICS_FAST, 0, 0, 1};
    load(&m, b, &o, &a, &c);
    collector col = new_collector(0, 4, -1);
    o.grad_sink = collect, o.grad_sink_ctx = &col;
    sbp_err err = {0};
    sbp_grad_result r;
    ck_assert_int_eq(sbp_grad_batches(&r, &m, b, 2, &o, NULL, &err), SBP_EUSAGE);
    ck_assert_msg(strstr(err.msg, "one micro-batch") && strstr(err.msg, "2 micro-batches"), "%s",
                  err.msg);
    ck_assert_int_eq(col.pieces, 0);
    sbp_ledger plan;
    sbp_plan_opts po = {.grad = o, .B = 1, .T = 64, .storage_bytes = 4, .optimizer = 1};
    ck_assert_int_eq(sbp_plan(&plan, &m.cfg, &po, &err), SBP_EUSAGE);
    ck_assert_msg(strstr(err.msg, "no optimizer"), "%s", err.msg);
    po.optimizer = 0, po.micro_batches = 2;
    ck_assert_int_eq(sbp_plan(&plan, &m.cfg, &po, &err), SBP_EUSAGE);
    for (int k = 0; k < N_MICRO; k++) sbp_batch_free(&b[k]);
    sbp_model_free(&m, NULL);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("fold");
    TCase *tc = tcase_create("fold");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, fold_bits, 0, N_CASES);
    tcase_add_loop_test(tc, fold_memory, 0, 2);
    tcase_add_loop_test(tc, plan_counts_fold, 0, 4);
    tcase_add_loop_test(tc, golden_accumulated, 0, 2);
    tcase_add_loop_test(tc, refused_bucket_stops_the_run, 0, 6);
    tcase_add_loop_test(tc, sink_bits, 0, N_CASES);
    tcase_add_loop_test(tc, sink_memory, 0, 6);
    tcase_add_loop_test(tc, sink_refused, 0, 3);
    tcase_add_test(tc, sink_refuses_what_it_cannot_take);
    tcase_add_loop_test(tc, grad_out_same_bytes, 0, 6);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
