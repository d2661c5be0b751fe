/* test_harden.c — regression tests for issue 11, "Hardening": each test feeds what a hostile
 * user or a careless tool would (a second __metadata__, sizes whose products overflow, a FIFO
 * where a file belongs, a symbolic link planted at the temporary output name, ...) and checks
 * the clear exit 2 (or status) that must come instead of a crash, a hang, a loss of data or a
 * silently wrong reading. Every one of them failed before its fix.
 *
 * Command-line cases run build/streambp under `timeout`, so a hang fails the test instead of
 * stalling the suite. */
#define _GNU_SOURCE /* O_TMPFILE */
#include "testutil.h"
#include "../src/io/file.h"
#include "../src/io/safetensors.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MODEL "qwen3-tiny"
#define V     200 /* its vocab_size */

/* ---------------------------------------------------------------------------------------------
 * Running the command line */

/* `timeout 120 streambp ARGS` (stdout and stderr together in tu_last_output()); tu_sh fails
 * the test on any sanitizer report. */
#define run_cli(...) tu_cli("", 120, __VA_ARGS__)
#define check_run    tu_check_run
#define last_cmd     tu_last_cmd()

static const char *good_model(void) {
    return tu_model(MODEL, 1);
}

static const char *sft_batch(void) {
    return "data/batches/sft-tiny.safetensors";
}

/* u64 little-endian length, the header bytes, then the data bytes. */
static const char *write_st(const char *name, const char *header, size_t hlen, const void *data,
                            size_t ndata) {
    const char *path = tu_path("%s", name);
    unsigned char *b = malloc(8 + hlen + ndata);
    ck_assert_ptr_nonnull(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(b + 8, header, hlen);
    if (ndata) memcpy(b + 8 + hlen, data, ndata);
    tu_spit(path, b, 8 + hlen + ndata);
    free(b);
    return path;
}

/* An SFT batch of one row of two I64 tokens, with `extra` spliced into the header (after the
 * two tensors; "" for none). */
static const char *sft_with(const char *name, const char *extra) {
    static const int64_t data[4] = {5, 6, 5, 6};
    char h[2048];
    snprintf(h, sizeof h,
             "{\"input_ids\":{\"dtype\":\"I64\",\"shape\":[1,2],\"data_offsets\":[0,16]},"
             "\"labels\":{\"dtype\":\"I64\",\"shape\":[1,2],\"data_offsets\":[16,32]}%s}",
             extra);
    return write_st(name, h, strlen(h), data, sizeof data);
}

static void expect_open_fails(const char *path, sbp_status want, const char *msg) {
    sbp_st_file sf;
    sbp_err err = {0};
    sbp_status st = sbp_st_open(&sf, path, &err);
    if (st == SBP_OK) sbp_st_close(&sf);
    ck_assert_msg(st == want, "%s: status %s, want %s (%s)", path, sbp_status_name(st),
                  sbp_status_name(want), err.msg);
    ck_assert_msg(strstr(err.msg, msg), "%s: message \"%s\" lacks \"%s\"", path, err.msg, msg);
}

/* ---------------------------------------------------------------------------------------------
 * 1. Duplicate keys in a safetensors header (a second "__metadata__" overflowed a buffer) */

START_TEST(dup_metadata_batch) {
    const char *b = sft_with("dup-meta.safetensors", ",\"__metadata__\":{\"a\":\"1\"},"
                                                     "\"__metadata__\":{\"b\":\"2\",\"c\":\"3\","
                                                     "\"d\":\"4\",\"e\":\"5\"}");
    check_run(run_cli("grad --model '%s' --batch '%s'", good_model(), b), 2, "__metadata__",
              "appears twice");
    expect_open_fails(b, SBP_EFORMAT, "appears twice");
    /* the other commands that read safetensors: a diff, an audit, a model */
    check_run(run_cli("verify diff '%s' '%s'", b, b), 2, "appears twice");
    check_run(run_cli("verify audit --model '%s' --batch '%s' --grads '%s'", good_model(),
                      sft_batch(), b),
              2, "appears twice");
}
END_TEST

START_TEST(dup_keys_any_kind) {
    static const struct {
        const char *name, *extra;
    } cases[] = {
        {"dup-tensor", ",\"x\":{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[32,32]},"
                       "\"x\":{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[32,32]}"},
        {"dup-meta-key", ",\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}"},
        {"dup-field", ",\"x\":{\"dtype\":\"I64\",\"dtype\":\"F32\",\"shape\":[0],"
                      "\"data_offsets\":[32,32]}"},
        /* the same name spelled with an escape */
        {"dup-escaped", ",\"__metadata__\":{\"ab\":\"1\",\"\\u0061b\":\"2\"}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s.safetensors", cases[i].name);
        expect_open_fails(sft_with(name, cases[i].extra), SBP_EFORMAT, "appears twice");
    }
    /* a model shard, and config.json */
    const char *d = tu_new_dir("dup-model");
    char *cfg = tu_slurp(tu_join(good_model(), "config.json"), NULL);
    char *brace = strrchr(cfg, '}');
    *brace = '\0';
    char text[8192];
    snprintf(text, sizeof text, "%s, \"hidden_size\": 128}", cfg);
    tu_spit(tu_join(d, "config.json"), text, strlen(text));
    tu_sh("cp '%s/model.safetensors' '%s/'", good_model(), d);
    free(cfg);
    check_run(run_cli("grad --model '%s' --batch '%s'", d, sft_batch()), 2, "hidden_size",
              "appears twice");
}
END_TEST

/* HF's reader (serde_json) rejects a header that is not UTF-8, and so do we now. */
START_TEST(names_not_utf8) {
    const char *b =
        sft_with("bad-utf8.safetensors",
                 ",\"x\xff\":{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[32,32]}");
    check_run(run_cli("grad --model '%s' --batch '%s'", good_model(), b), 2, "not valid UTF-8");
    static const char *const bad[] = {"\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x80",
                                      "\xe2\x82"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char extra[200], name[64];
        snprintf(extra, sizeof extra,
                 ",\"x%s\":{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[32,32]}", bad[i]);
        snprintf(name, sizeof name, "bad-utf8-%zu.safetensors", i);
        expect_open_fails(sft_with(name, extra), SBP_EFORMAT, "not valid UTF-8");
    }
    /* valid UTF-8 of every length stays fine; \u0000 would cut a name short */
    sbp_st_file sf;
    sbp_err err = {0};
    const char *ok = sft_with("good-utf8.safetensors",
                              ",\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\":{\"dtype\":\"I64\","
                              "\"shape\":[0],\"data_offsets\":[32,32]}");
    ck_assert_msg(sbp_st_open(&sf, ok, &err) == SBP_OK, "%s", err.msg);
    sbp_st_close(&sf);
    expect_open_fails(sft_with("nul-escape.safetensors",
                               ",\"x\\u0000y\":{\"dtype\":\"I64\",\"shape\":[0],"
                               "\"data_offsets\":[32,32]}"),
                      SBP_EFORMAT, "\\u0000");
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 2. Sizes: products and limits */

/* A config.json from the good model's with some fields replaced (JSON text of the values). */
static const char *config_with(const char *name, const char *const *kv) {
    char *text = tu_slurp(tu_join(good_model(), "config.json"), NULL);
    cJSON *o = cJSON_Parse(text);
    free(text);
    for (int i = 0; kv[i]; i += 2) /* raw: the digits exactly as given */
        if (!cJSON_ReplaceItemInObjectCaseSensitive(o, kv[i], cJSON_CreateRaw(kv[i + 1])))
            cJSON_AddRawToObject(o, kv[i], kv[i + 1]);
    text = cJSON_Print(o);
    const char *path = tu_path("%s.json", name);
    tu_spit(path, text, strlen(text));
    free(text);
    cJSON_Delete(o);
    return path;
}

START_TEST(config_count_overflow) {
    /* every field below 1e9 (the old per-field check), the product far past int64 */
    const char *c = config_with(
        "huge", (const char *const[]){"vocab_size", "999999999", "hidden_size", "999999999",
                                      "intermediate_size", "999999999", "num_hidden_layers", "999",
                                      "head_dim", "128", NULL});
    check_run(run_cli("plan --config '%s' --seq 8", c), 2, "vocab_size", "more than the supported");
    /* within every field's limit, past the parameter limit */
    c = config_with("many-params",
                    (const char *const[]){"vocab_size", "16777216", "hidden_size", "131072",
                                          "intermediate_size", "1048576", "num_hidden_layers",
                                          "1024", "num_attention_heads", "1024",
                                          "num_key_value_heads", "1024", "head_dim", "128", NULL});
    check_run(run_cli("plan --config '%s' --seq 8", c), 2, "parameters");
    sbp_config cfg = {.family = SBP_LLAMA,
                      .vocab = 1 << 24,
                      .hidden = 1 << 17,
                      .ffn = 1 << 20,
                      .layers = 1024,
                      .heads = 1024,
                      .kv_heads = 1024,
                      .head_dim = 128,
                      .eps = 1e-6,
                      .rope_theta = 1e4};
    sbp_err err = {0};
    sbp_params ps;
    ck_assert_int_eq(sbp_config_param_count(&cfg), -1);
    ck_assert_int_eq(sbp_params_build(&ps, &cfg, &err), SBP_EINPUT);
    cfg.layers = 2, cfg.vocab = 1000, cfg.hidden = 64, cfg.ffn = 96, cfg.heads = 4;
    cfg.kv_heads = 2, cfg.head_dim = 16;
    ck_assert_int_eq(sbp_params_build(&ps, &cfg, &err), SBP_OK);
    ck_assert_int_eq(sbp_config_param_count(&cfg), ps.total);
    sbp_params_free(&ps);
}
END_TEST

/* 10^7 layers: refused by name at once, not after an 18 GB parameter table. */
START_TEST(config_too_many_layers) {
    const char *c =
        config_with("layers", (const char *const[]){"num_hidden_layers", "10000000", NULL});
    check_run(run_cli("plan --config '%s' --seq 8", c), 2, "num_hidden_layers", "10000000");
    check_run(run_cli("init --config '%s' --out '%s'", c, tu_path("layers-out")), 2,
              "num_hidden_layers");
    ck_assert_msg(!tu_exists(tu_path("layers-out")), "a refused init created its directory");
}
END_TEST

/* --block 2^29 + 1: 4·block overflowed int and the stream schedule looped forever. */
START_TEST(block_too_large) {
    check_run(
        run_cli("grad --model '%s' --batch '%s' --block 536870913", good_model(), sft_batch()), 2,
        "--block", "at most");
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, good_model(), sft_batch(), SBP_FP32);
    sbp_grad_opts o = {.schedule = SBP_STREAM, .block = SBP_MAX_BLOCK + 1};
    sbp_grad_result r;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_grad(&r, &m, &b, &o, NULL, &err), SBP_EUSAGE);
    ck_assert_msg(strstr(err.msg, "block"), "%s", err.msg);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

START_TEST(threads_too_many) {
    check_run(run_cli("grad --model '%s' --batch '%s' --threads 100000", good_model(), sft_batch()),
              2, "--threads", "100000");
    check_run(run_cli("verify --threads 1,100000"), 2, "--threads");
}
END_TEST

/* A model file for config `cfg_path` whose BF16 data is a hole: the header as a real file's,
 * the data never written (it reads as zeros), so it costs no disk. */
static void sparse_weights(const char *path, const char *cfg_path) {
    sbp_config cfg;
    sbp_params ps;
    sbp_err err = {0};
    ck_assert_msg(sbp_config_load(&cfg, cfg_path, &err) == SBP_OK, "%s", err.msg);
    ck_assert_msg(sbp_params_build(&ps, &cfg, &err) == SBP_OK, "%s", err.msg);
    cJSON *h = cJSON_CreateObject();
    long long at = 0;
    for (int i = 0; i < ps.n; i++) {
        const sbp_param *p = &ps.p[i];
        char t[200];
        snprintf(t, sizeof t,
                 "{\"dtype\":\"BF16\",\"shape\":[%lld%s%lld],\"data_offsets\":[%lld,%lld]}",
                 (long long)p->shape[0], p->ndim == 2 ? "," : "",
                 p->ndim == 2 ? (long long)p->shape[1] : 0LL, at, at + 2 * p->numel);
        if (p->ndim == 1) /* drop the placeholder second dimension */
            snprintf(t, sizeof t,
                     "{\"dtype\":\"BF16\",\"shape\":[%lld],\"data_offsets\":[%lld,%lld]}",
                     (long long)p->shape[0], at, at + 2 * p->numel);
        cJSON_AddRawToObject(h, p->name, t);
        at += 2 * p->numel;
    }
    char *text = cJSON_PrintUnformatted(h);
    size_t hl = strlen(text);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint64_t h64 = hl;
    fwrite(&h64, 8, 1, f);
    fwrite(text, 1, hl, f);
    ck_assert_int_eq(ftruncate(fileno(f), (off_t)(8 + hl + (uint64_t)at)), 0);
    fclose(f);
    free(text);
    cJSON_Delete(h);
    sbp_params_free(&ps);
}

/* With an adapter the check plans the adapter's gradient, not every weight's: a limit between the
 * two plans runs the LoRA step and refuses the full one (it refused both). */
START_TEST(memory_check_lora) {
    const char *dir = tu_new_dir("mem-lora"), *ad = tu_join(dir, "adapter");
    check_run(run_cli("lora init --model '%s' --out '%s' --r 2", good_model(), ad), 0, "wrote");
    sbp_config cfg;
    sbp_err err = {0};
    sbp_batch b;
    ck_assert_msg(!sbp_model_check(&cfg, good_model(), &err), "%s", err.msg);
    ck_assert_msg(!sbp_batch_load(&b, sft_batch(), &cfg, &err), "%s", err.msg);
    int64_t peak[2];
    for (int lora = 0; lora < 2; lora++) {
        sbp_ledger lg;
        sbp_plan_opts po = {
            .grad = {.schedule = SBP_STREAM}, .B = b.B, .T = b.T, .storage_bytes = 4};
        if (lora) po.lora = (sbp_lora_config){.r = 2, .alpha = 8, .targets = SBP_LORA_ALL};
        ck_assert_msg(!sbp_plan(&lg, &cfg, &po, &err), "%s", err.msg);
        peak[lora] = lg.peak_total;
    }
    sbp_batch_free(&b);
    ck_assert_msg(peak[1] < peak[0], "LoRA plan %lld, full %lld", (long long)peak[1],
                  (long long)peak[0]);
    const long long limit = (peak[0] + peak[1]) / 2;
    check_run(run_cli("grad --model '%s' --batch '%s' --lora '%s' --mem-limit %lld", good_model(),
                      sft_batch(), ad, limit),
              0, "loss");
    check_run(run_cli("grad --model '%s' --batch '%s' --mem-limit %lld", good_model(), sft_batch(),
                      limit),
              2, "planned peak", "--mem-limit");
}
END_TEST

/* The planned peak against the memory available, before the weights are even read. */
START_TEST(memory_check) {
    const char *dir = tu_new_dir("mem-out"), *out = tu_join(dir, "g.safetensors");
    check_run(run_cli("grad --model '%s' --batch '%s' --mem-limit 64K --out '%s'", good_model(),
                      sft_batch(), out),
              2, "planned peak", "64.0 KiB", "--mem-limit", "--force");
    ck_assert(!tu_exists(out));
    check_run(run_cli("grad --model '%s' --batch '%s' --mem-limit 64K --force --out '%s'",
                      good_model(), sft_batch(), out),
              0, "loss");
    ck_assert(tu_exists(out));
    /* a 46e9-parameter model, far past this machine: the limit is found without being given,
     * and the step is refused before a weight is read (the file is sparse: all zeros) */
    const char *big = tu_new_dir("mem-big");
    const char *c = config_with("big", (const char *const[]){"vocab_size", "131072", "hidden_size",
                                                             "8192", "intermediate_size", "28672",
                                                             "num_hidden_layers", "64", NULL});
    tu_sh("cp '%s' '%s/config.json'", c, big);
    sparse_weights(tu_join(big, "model.safetensors"), c);
    check_run(run_cli("grad --model '%s' --batch '%s'", big, sft_batch()), 2, "planned peak", "GiB",
              "available");
}
END_TEST

START_TEST(planning_ledger_rejected) {
    sbp_model m;
    sbp_batch b;
    tu_load(&m, &b, good_model(), sft_batch(), SBP_FP32);
    sbp_ledger lg = {.plan = 1};
    sbp_grad_opts o = {.schedule = SBP_STREAM};
    sbp_grad_result r;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_grad(&r, &m, &b, &o, &lg, &err), SBP_EUSAGE);
    ck_assert_msg(strstr(err.msg, "planning ledger"), "%s", err.msg);
    double *logp = calloc((size_t)b.B * b.T, sizeof *logp);
    ck_assert_int_eq(sbp_logprobs(logp, &m, &b, &o, 1, &lg, &err), SBP_EUSAGE);
    free(logp);
    sbp_model m2;
    ck_assert_int_eq(sbp_model_load(&m2, good_model(), SBP_FP32, &lg, &err), SBP_EUSAGE);
    ck_assert_int_eq(lg.cur_total, 0);
    sbp_batch_free(&b);
    sbp_model_free(&m, NULL);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 3. File types and paths */

START_TEST(fifo_inputs) {
    const char *fifo = tu_path("a-fifo");
    unlink(fifo);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    check_run(run_cli("grad --model '%s' --batch '%s'", good_model(), fifo), 2,
              "not a regular file", "FIFO");
    check_run(run_cli("verify diff '%s' '%s'", fifo, fifo), 2, "not a regular file");
    /* a single-file model, a shard named by the index, and a config.json that are FIFOs */
    const char *d = tu_new_dir("fifo-model");
    tu_sh("cp '%s/config.json' '%s/'", good_model(), d);
    ck_assert_int_eq(mkfifo(tu_join(d, "model.safetensors"), 0600), 0);
    check_run(run_cli("grad --model '%s' --batch '%s'", d, sft_batch()), 2, "not a regular file");
    d = tu_new_dir("fifo-shard");
    tu_sh("cp '%s/config.json' '%s/'", good_model(), d);
    const char *idx = "{\"weight_map\": {\"model.embed_tokens.weight\": \"shard.safetensors\"}}";
    tu_spit(tu_join(d, "model.safetensors.index.json"), idx, strlen(idx));
    ck_assert_int_eq(mkfifo(tu_join(d, "shard.safetensors"), 0600), 0);
    check_run(run_cli("grad --model '%s' --batch '%s'", d, sft_batch()), 2, "not a regular file");
    d = tu_new_dir("fifo-config");
    ck_assert_int_eq(mkfifo(tu_join(d, "config.json"), 0600), 0);
    check_run(run_cli("grad --model '%s' --batch '%s'", d, sft_batch()), 2, "not a regular file");
}
END_TEST

/* A symbolic link planted at the name the temporary file used to get (<out>.tmp.<pid>) was
 * followed, and its target truncated. */
START_TEST(tmp_symlink_not_followed) {
    const char *dir = tu_new_dir("planted");
    const char *victim = tu_join(dir, "victim.txt"), *out = tu_join(dir, "out.safetensors");
    tu_spit(victim, "precious", 8);
    char planted[800];
    snprintf(planted, sizeof planted, "%s.tmp.%ld", out, (long)getpid());
    ck_assert_int_eq(symlink(victim, planted), 0);
    const float x[2] = {1, 2};
    sbp_st_entry e = {"x", SBP_DT_F32, 1, {2}, x};
    sbp_err err = {0};
    ck_assert_msg(sbp_st_write(out, &e, 1, NULL, &err) == SBP_OK, "%s", err.msg);
    size_t n;
    char *v = tu_slurp(victim, &n);
    ck_assert_msg(n == 8 && memcmp(v, "precious", 8) == 0, "the link's target was written");
    free(v);
    struct stat sb;
    ck_assert(lstat(planted, &sb) == 0 && S_ISLNK(sb.st_mode)); /* not ours: left alone */
    sbp_st_file sf;
    ck_assert_int_eq(sbp_st_open(&sf, out, &err), SBP_OK);
    sbp_st_close(&sf);
}
END_TEST

/* An existing output that is not a regular file is refused, not replaced. */
START_TEST(out_not_regular) {
    const char *dir = tu_new_dir("out-special");
    const char *fifo = tu_join(dir, "fifo");
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    check_run(run_cli("grad --model '%s' --batch '%s' --out '%s'", good_model(), sft_batch(), fifo),
              2, fifo, "FIFO", "refusing");
    struct stat sb;
    ck_assert(lstat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode));
    const char *target = tu_join(dir, "target"), *link = tu_join(dir, "link");
    tu_spit(target, "keep", 4);
    ck_assert_int_eq(symlink(target, link), 0);
    check_run(run_cli("grad --model '%s' --batch '%s' --out '%s'", good_model(), sft_batch(), link),
              2, "symbolic link");
    ck_assert(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode));
    tu_assert_no_tmp(dir);
    sbp_err err = {0};
    ck_assert_int_eq(sbp_check_writable(fifo, &err), SBP_EIO);
}
END_TEST

/* Temporary files of killed runs: removed by the next write of the same output. */
START_TEST(stale_tmp_removed) {
    const char *dir = tu_new_dir("stale");
    const char *out = tu_join(dir, "g.safetensors");
    pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0); /* a pid that no process has now */
    char old_style[800], new_style[800], other[800];
    snprintf(old_style, sizeof old_style, "%s.tmp.%ld", out, (long)child);
    snprintf(new_style, sizeof new_style, "%s.tmp.%ld.0123456789abcdef", out, (long)child);
    snprintf(other, sizeof other, "%s/unrelated.tmp.%ld", dir, (long)child);
    tu_spit(old_style, "x", 1);
    tu_spit(new_style, "x", 1);
    tu_spit(other, "x", 1);
    check_run(run_cli("grad --model '%s' --batch '%s' --out '%s'", good_model(), sft_batch(), out),
              0, "loss");
    ck_assert_msg(!tu_exists(old_style) && !tu_exists(new_style), "stale temporaries left");
    ck_assert_msg(tu_exists(other), "a file of another output was removed");
}
END_TEST

/* Where the file system has O_TMPFILE, nothing is named in the directory before the commit, so
 * a run killed while writing leaves nothing. */
START_TEST(unnamed_until_commit) {
    const char *dir = tu_new_dir("unnamed");
    int probe = open(dir, O_TMPFILE | O_WRONLY, 0600);
    if (probe < 0) {
        printf("unnamed_until_commit: %s has no O_TMPFILE; skipped\n", dir);
        return;
    }
    close(probe);
    sbp_outfile o;
    sbp_err err = {0};
    const char *out = tu_join(dir, "f.bin");
    ck_assert_int_eq(sbp_outfile_open(&o, out, &err), SBP_OK);
    ck_assert_int_eq(sbp_outfile_write(&o, "abc", 3, &err), SBP_OK);
    DIR *d = opendir(dir);
    struct dirent *de;
    int names = 0;
    while ((de = readdir(d)))
        names += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    closedir(d);
    ck_assert_msg(names == 0, "%d names in %s before the commit", names, dir);
    ck_assert_int_eq(sbp_outfile_commit(&o, &err), SBP_OK);
    size_t n;
    char *text = tu_slurp(out, &n);
    ck_assert(n == 3 && memcmp(text, "abc", 3) == 0);
    free(text);
    tu_assert_no_tmp(dir);
}
END_TEST

/* --out "": refused before the step (which would fail on this batch), not after it. */
START_TEST(out_empty) {
    static const int64_t data[4] = {5, 6, -100, -100};
    const char *h = "{\"input_ids\":{\"dtype\":\"I64\",\"shape\":[1,2],\"data_offsets\":[0,16]},"
                    "\"labels\":{\"dtype\":\"I64\",\"shape\":[1,2],\"data_offsets\":[16,32]}}";
    const char *b = write_st("no-target.safetensors", h, strlen(h), data, sizeof data);
    check_run(run_cli("grad --model '%s' --batch '%s' --out ''", good_model(), b), 2, "--out",
              "empty");
    ck_assert_msg(!strstr(tu_last_output(), "no valid target"), "%s", tu_last_output());
    sbp_err err = {0};
    ck_assert_int_eq(sbp_check_writable("", &err), SBP_EUSAGE);
    check_run(run_cli("init --config data/models/qwen3-tiny.json --out ''"), 2, "--out", "empty");
    sbp_config cfg;
    ck_assert_int_eq(sbp_config_load(&cfg, "data/models/qwen3-tiny.json", &err), SBP_OK);
    ck_assert_int_eq(sbp_model_init(&cfg, 1, "", &err), SBP_EUSAGE);
}
END_TEST

/* ---------------------------------------------------------------------------------------------
 * 4. Smaller ones */

static int is_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0xffff) == 0;
}

START_TEST(precision_bf16) {
    const char *dir = tu_new_dir("bf16"), *out = tu_join(dir, "g.safetensors"),
               *out32 = tu_join(dir, "g32.safetensors");
    check_run(run_cli("grad --model '%s' --batch '%s' --precision bf16 --out '%s'", good_model(),
                      sft_batch(), out),
              0, "bf16");
    check_run(
        run_cli("grad --model '%s' --batch '%s' --out '%s'", good_model(), sft_batch(), out32), 0,
        "loss");
    sbp_st_file sf, sf32;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_st_open(&sf, out, &err), SBP_OK);
    ck_assert_int_eq(sbp_st_open(&sf32, out32, &err), SBP_OK);
    ck_assert_str_eq(sbp_st_meta(&sf, "precision"), "bf16 (emulated)");
    int differ = 0;
    for (int i = 0; i < sf.n; i++) {
        const sbp_st_tensor *t = &sf.t[i];
        ck_assert_int_eq(t->dtype, SBP_DT_F32);
        float *a = malloc(sizeof *a * (size_t)t->numel), *b = malloc(sizeof *b * (size_t)t->numel);
        ck_assert_int_eq(sbp_st_read(&sf, t, a, SBP_DT_F32, &err), SBP_OK);
        ck_assert_int_eq(sbp_st_read(&sf32, sbp_st_find(&sf32, t->name), b, SBP_DT_F32, &err),
                         SBP_OK);
        for (int64_t j = 0; j < t->numel; j++) {
            if (!is_bf16(a[j]))
                ck_abort_msg("%s[%lld] = %a is not a bfloat16", t->name, (long long)j, a[j]);
            differ += a[j] != b[j];
        }
        free(a), free(b);
    }
    ck_assert_msg(differ > 0, "bf16 gave the fp32 gradient");
    sbp_st_close(&sf);
    sbp_st_close(&sf32);
}
END_TEST

/* group_size 2^32 + 2 was read as 2. */
START_TEST(group_size_narrowed) {
    static const int64_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8}, cm[8] = {0, 1, 1, 1, 0, 1, 1, 1};
    static const float rew[2] = {1, 0};
    char data[64 + 64 + 8];
    memcpy(data, ids, 64), memcpy(data + 64, cm, 64), memcpy(data + 128, rew, 8);
    const char *h =
        "{\"__metadata__\":{\"group_size\":\"4294967298\"},"
        "\"input_ids\":{\"dtype\":\"I64\",\"shape\":[2,4],\"data_offsets\":[0,64]},"
        "\"completion_mask\":{\"dtype\":\"I64\",\"shape\":[2,4],\"data_offsets\":[64,128]},"
        "\"rewards\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[128,136]}}";
    const char *b = write_st("grpo-g.safetensors", h, strlen(h), data, sizeof data);
    check_run(run_cli("grad --model '%s' --batch '%s' --objective grpo", good_model(), b), 2,
              "4294967298");
}
END_TEST

START_TEST(plan_budget_overflow) {
    check_run(run_cli("plan --config data/configs/qwen3-8b.json --budget 1e30G"), 2, "1e30G");
    check_run(run_cli("plan --config data/configs/qwen3-8b.json --budget 80G --schedules stream"),
              0, "stream");
}
END_TEST

/* An error after the output had started (a plan too large for the address space) returned
 * without freeing the JSON rows: exit 2 became LeakSanitizer's 1 under make test SAN=1. */
START_TEST(plan_error_no_leak) {
    check_run(run_cli("plan --config data/configs/qwen3-14b.json --seq 1073741824 --json "
                      "--schedules full"),
              2, "streambp plan");
}
END_TEST

/* Config floats are written with the digits that read back as the same double. */
START_TEST(config_float_roundtrip) {
    const char *c = config_with(
        "floats", (const char *const[]){"rope_theta", "1000000.1000000001", "rms_norm_eps",
                                        "1.0000000000000002e-06", "initializer_range",
                                        "0.020000000000000004", NULL});
    sbp_config a, b;
    sbp_err err = {0};
    ck_assert_int_eq(sbp_config_load(&a, c, &err), SBP_OK);
    ck_assert_msg(a.rope_theta != 1000000.1, "the test needs a value %.17g != 1000000.1",
                  a.rope_theta);
    const char *out = tu_path("floats-model");
    check_run(run_cli("init --config '%s' --out '%s'", c, out), 0, "wrote");
    ck_assert_int_eq(sbp_config_load(&b, tu_join(out, "config.json"), &err), SBP_OK);
    ck_assert_msg(a.rope_theta == b.rope_theta, "rope_theta %.17g came back as %.17g", a.rope_theta,
                  b.rope_theta);
    ck_assert_msg(a.eps == b.eps, "eps %.17g came back as %.17g", a.eps, b.eps);
    ck_assert_msg(a.init_range == b.init_range, "initializer_range %.17g came back as %.17g",
                  a.init_range, b.init_range);
    /* and the short form where it is exact */
    char *text = tu_slurp(tu_join(out, "config.json"), NULL);
    ck_assert_msg(strstr(text, "\"rms_norm_eps\":") && !strstr(text, "9.99999"), "%s", text);
    free(text);
}
END_TEST

/* init on a model too large for memory names its size (it said "0 parameters"). */
START_TEST(init_message) {
    const char *c =
        config_with("init-huge", (const char *const[]){"vocab_size", "999999999", "hidden_size",
                                                       "999999999", NULL});
    check_run(run_cli("init --config '%s' --out '%s'", c, tu_path("init-huge-out")), 2,
              "vocab_size");
    ck_assert_msg(!strstr(tu_last_output(), " 0 parameters"), "%s", tu_last_output());
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("harden");
    TCase *tc = tcase_create("harden");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, dup_metadata_batch);
    tcase_add_test(tc, dup_keys_any_kind);
    tcase_add_test(tc, names_not_utf8);
    tcase_add_test(tc, config_count_overflow);
    tcase_add_test(tc, config_too_many_layers);
    tcase_add_test(tc, block_too_large);
    tcase_add_test(tc, threads_too_many);
    tcase_add_test(tc, memory_check);
    tcase_add_test(tc, memory_check_lora);
    tcase_add_test(tc, planning_ledger_rejected);
    tcase_add_test(tc, fifo_inputs);
    tcase_add_test(tc, tmp_symlink_not_followed);
    tcase_add_test(tc, out_not_regular);
    tcase_add_test(tc, stale_tmp_removed);
    tcase_add_test(tc, unnamed_until_commit);
    tcase_add_test(tc, out_empty);
    tcase_add_test(tc, precision_bf16);
    tcase_add_test(tc, group_size_narrowed);
    tcase_add_test(tc, plan_budget_overflow);
    tcase_add_test(tc, plan_error_no_leak);
    tcase_add_test(tc, config_float_roundtrip);
    tcase_add_test(tc, init_message);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite_with_model(suite(), MODEL, "test_harden");
}
