/* test_golden.c — the portable numerics against the committed golden digests (data/golden/).
 *
 * For every family, objective and precision, a seeded model written by `streambp init` and a
 * B = 2 padded batch go through `streambp grad --numerics portable` in three configurations
 * that share nothing but the arithmetic contract: full BP on one thread, StreamBP with ragged
 * layer and logits chunks on two threads, checkpointing with chunked logits and another token
 * block. Each gradient file's fingerprint (`streambp verify digest`: SHA-256 per tensor and the
 * loss's bits) must equal the committed one; a mismatch names the first differing tensor.
 *
 * The binary under test is $STREAMBP (default build/streambp): `make test` runs this test again
 * against the same sources built with clang and with -march=x86-64 (no AVX, no hardware FMA),
 * and with SBP_GOLDEN_DEVICE=cuda-emu (the CUDA kernels in the SIMT emulator; `make gpu-check`
 * sets cuda), and the digests must not change. SBP_GOLDEN_UPDATE=1 rewrites the golden files
 * instead
 * (`make golden`): only for a deliberate change of the portable arithmetic, with the reason in
 * the commit message.
 *
 * The long cases (data/golden/long/cases, issue 54) run the same way: T = 300 over three token
 * blocks of the portable sums, V = 1100 over three vocabulary blocks, a Gemma-3 window crossing
 * chunks and blocks, bf16 storage (CPU only: skipped on a device) and LoRA adapters. On a device
 * (SBP_GOLDEN_DEVICE) only the stream configuration runs: it is the one whose bits the golden
 * file holds, and the emulator takes seconds per run at T = 300; on cuda-emu the float32 cases
 * only. */
#include "testutil.h"
#include "../src/io/file.h"
#include "../verify/golden.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* qwen2-hd24 and qwen3-hd72 have head sizes that are not powers of two (24 and 72, neither a
 * multiple of the 32-lane warp nor of the key tile): there the attention scale 1/sqrt(hd) is not
 * exact, and a backend that rounds it differently (cuda/ once did) shows up in every tensor.
 * gemma3-tiny: Gemma-3 with local layers whose window (8) is shorter than the batches, head_dim
 * 24 and query_pre_attn_scalar 32, GeGLU, the (1 + w) norms and padding_idx 0. */
static const char *families[] = {"qwen3-tiny", "qwen2-tiny", "llama3-tiny",
                                 "qwen2-hd24", "qwen3-hd72", "gemma3-tiny"};
enum { N_FAMILIES = sizeof families / sizeof families[0] };

static const struct {
    const char *name, *batch, *options;
} objectives[] = {
    {"sft", "data/batches/sft-tiny.safetensors", ""},
    {"dpo", "data/batches/dpo-tiny.safetensors", "--objective dpo --beta 0.1"},
    {"grpo", "data/batches/grpo-tiny.safetensors",
     "--objective grpo --loss-type bnpo --beta 0.04 --temperature 0.7 --epsilon-high 0.28"},
};

static const char *runs[] = {
    "--schedule full --threads 1",
    "--schedule stream --chunk 7 --logit-chunk 5 --block 4 --threads 2",
    "--schedule ckpt --chunked-logits --logit-chunk 3 --block 16 --threads 2",
};

/* The model of a family, written by the binary under test. */
static const char *model_dir(const char *family) {
    const char *dir = tu_path("golden-model-%s", family);
    if (!tu_exists(dir) &&
        tu_sh("'%s' init --config data/models/%s.json --seed 1 --out '%s'", tu_bin(), family, dir))
        ck_abort_msg("streambp init %s: %s", family, tu_last_output());
    return dir;
}

/* The fingerprint of one run, as text (allocated). */
static char *fingerprint(const char *family, int obj, const char *prec, int run) {
    const char *out =
        tu_path("golden-%s-%s-%s-%d.safetensors", family, objectives[obj].name, prec, run);
    const char *device = getenv("SBP_GOLDEN_DEVICE") ? getenv("SBP_GOLDEN_DEVICE") : "cpu";
    if (tu_sh("'%s' grad --model '%s' --batch %s %s --precision %s --numerics portable %s "
              "--device %s --out '%s'",
              tu_bin(), model_dir(family), objectives[obj].batch, objectives[obj].options, prec,
              runs[run], device, out))
        ck_abort_msg("grad %s %s %s (%s): %s", family, objectives[obj].name, prec, runs[run],
                     tu_last_output());
    if (tu_sh("'%s' verify digest '%s'", tu_bin(), out))
        ck_abort_msg("verify digest: %s", tu_last_output());
    return strdup(tu_last_output());
}

/* The first line where a and b differ, named by its first word (the tensor, or "loss"). */
static void assert_same(const char *got, const char *want, const char *what) {
    const char *g = got, *w = want;
    int line = 1;
    while (*g && *w) {
        const char *ge = strchr(g, '\n'), *we = strchr(w, '\n');
        size_t gl = ge ? (size_t)(ge - g) : strlen(g), wl = we ? (size_t)(we - w) : strlen(w);
        if (gl != wl || memcmp(g, w, gl) != 0) {
            int nl = (int)strcspn(w, " \n");
            ck_abort_msg("%s: line %d differs: %.*s (got \"%.*s\", golden \"%.*s\")", what, line,
                         nl, w, (int)gl, g, (int)wl, w);
        }
        g += gl + (ge != NULL), w += wl + (we != NULL), line++;
    }
    ck_assert_msg(!*g && !*w, "%s: %s has more lines than %s", what, *g ? "the run" : "golden",
                  *g ? "golden" : "the run");
}

/* _i: family (_i / 6), objective (_i / 2 % 3), precision (_i % 2). */
/* got (the fingerprint of a case on device) against the committed file golden, or written there
 * with SBP_GOLDEN_UPDATE=1. */
static void against_golden(const char *golden, const char *got, const char *device) {
    if (getenv("SBP_GOLDEN_UPDATE")) {
        tu_spit(golden, got, strlen(got));
        printf("wrote %s\n", golden);
        return;
    }
    char what[640];
    snprintf(what, sizeof what, "%s with %s on %s", golden, tu_bin(), device);
    char *want = tu_slurp(golden, NULL);
    assert_same(got, want, what);
    free(want);
}

START_TEST(golden_digests) {
    const char *family = families[_i / 6], *prec = _i % 2 ? "fp64" : "fp32";
    const int obj = _i / 2 % 3;
    char golden[256], what[640];
    snprintf(golden, sizeof golden, "data/golden/%s-%s-%s.txt", family, objectives[obj].name, prec);
    char *first = fingerprint(family, obj, prec, 0);
    for (int r = 1; r < 3; r++) {
        char *other = fingerprint(family, obj, prec, r);
        snprintf(what, sizeof what, "%s: \"%s\" against \"%s\"", golden, runs[r], runs[0]);
        assert_same(other, first, what);
        free(other);
    }
    against_golden(golden, first,
                   getenv("SBP_GOLDEN_DEVICE") ? getenv("SBP_GOLDEN_DEVICE") : "cpu");
    free(first);
}
END_TEST

static sbp_golden_case long_cases[SBP_GOLDEN_MAX_CASES];
static int n_long;

/* The fingerprint of one run of a long case, as text (allocated). */
static char *long_fingerprint(const sbp_golden_case *c, int run) {
    const char *device = getenv("SBP_GOLDEN_DEVICE") ? getenv("SBP_GOLDEN_DEVICE") : "cpu";
    const char *model = model_dir(c->config), *adapter = tu_path("golden-adapter-%s", c->name);
    if (c->adapter[0] && !tu_exists(adapter) &&
        tu_sh("'%s' lora init --model '%s' %s --seed 1 --out '%s'", tu_bin(), model, c->adapter,
              adapter))
        ck_abort_msg("lora init %s: %s", c->name, tu_last_output());
    const char *out = tu_path("golden-%s-%d.safetensors", c->name, run);
    if (tu_sh("'%s' grad --model '%s' %s%s%s --batch data/batches/%s.safetensors %s --numerics "
              "portable %s --device %s --out '%s'",
              tu_bin(), model, c->adapter[0] ? "--lora '" : "", c->adapter[0] ? adapter : "",
              c->adapter[0] ? "'" : "", c->batch, c->options, runs[run], device, out))
        ck_abort_msg("grad %s (%s): %s", c->name, runs[run], tu_last_output());
    if (tu_sh("'%s' verify digest '%s'", tu_bin(), out))
        ck_abort_msg("verify digest: %s", tu_last_output());
    return strdup(tu_last_output());
}

START_TEST(long_digests) {
    const sbp_golden_case *c = &long_cases[_i];
    const char *device = getenv("SBP_GOLDEN_DEVICE") ? getenv("SBP_GOLDEN_DEVICE") : "cpu";
    if (c->cpu_only && strcmp(device, "cpu") != 0) {
        printf("%s: CPU only, skipped on %s\n", c->name, device);
        return;
    }
    /* the emulator takes ~8 s a run of a long case: in make test it runs the float32 ones (the
     * float64 kernels are the same source; `verify golden --devices cuda-emu` runs them all) */
    if (strcmp(device, "cuda-emu") == 0 && strstr(c->options, "fp64")) {
        printf("%s: float64, left to `verify golden --devices cuda-emu`\n", c->name);
        return;
    }
    char golden[256], what[640];
    snprintf(golden, sizeof golden, "data/golden/long/%s.txt", c->name);
    char *first = long_fingerprint(c, 0);
    /* on a device the stream run alone (in the emulator each run of T = 300 takes seconds): the
     * other two configurations are the CPU's schedule equivalence, checked on the CPU */
    const int n_runs = strcmp(device, "cpu") == 0 ? 3 : 1;
    for (int r = 1; r < n_runs; r++) {
        char *other = long_fingerprint(c, r);
        snprintf(what, sizeof what, "%s: \"%s\" against \"%s\"", golden, runs[r], runs[0]);
        assert_same(other, first, what);
        free(other);
    }
    against_golden(golden, first, device);
    free(first);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("golden");
    TCase *tc = tcase_create("portable");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, golden_digests, 0, 6 * N_FAMILIES);
    char *text = NULL; /* outside a test: no ck_assert (tu_slurp) */
    size_t len;
    sbp_err err = {0};
    if (sbp_read_text(&text, &len, "data/golden/long/cases", 1 << 20, &err) ||
        sbp_golden_cases_parse(long_cases, SBP_GOLDEN_MAX_CASES, &n_long, text,
                               "data/golden/long/cases", &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    free(text);
    tcase_add_loop_test(tc, long_digests, 0, n_long);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    printf("golden digests of the portable numerics, binary %s, device %s\n", tu_bin(),
           getenv("SBP_GOLDEN_DEVICE") ? getenv("SBP_GOLDEN_DEVICE") : "cpu");
    return tu_run_suite(suite());
}
