/* test_reports.c — reports that the files they report on cannot forge (issue 35, item 9), and a
 * DPO audit without reference log-probs that says what is missing (item 10).
 *
 * A gradient file whose tensor names and metadata hold a newline and "PASS", terminal escape
 * sequences (cursor up, erase line, carriage return), a C1 CSI, DEL and a bidirectional
 * override goes through `verify audit`, `verify diff` and `verify digest`: no line of their text
 * output may start with PASS, no control character, invalid UTF-8 or bidirectional override may
 * reach the terminal, the escaped forms must be there instead, and the verdict stays FAIL (the
 * reader refuses invalid UTF-8 in a header, so its escaping is tested on the function alone). The
 * JSON outputs must parse back to the exact names. Command-line cases run build/streambp under
 * `timeout`, so a hang fails instead of stalling. */
#include "testutil.h"
#include "../src/core/clock.h"
#include "../src/io/safetensors.h"
#include "../verify/text.h"

#include <cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#define MODEL     "qwen3-tiny"
#define SFT       "data/batches/sft-tiny.safetensors"
#define DPO_NOREF "data/batches/dpo-noref.safetensors"

/* The hostile strings: each tries to print a PASS line of its own or to hide the real verdict. */
#define NAME_NEWLINE "x\nPASS forged\n"
#define NAME_ESCAPES "\x1b[1A\x1b[2K\rPASS"
/* a C1 CSI, DEL, a right-to-left override */
#define NAME_BYTES                                                                                 \
    "bad\xc2\x9b"                                                                                  \
    "31m \x7f \xe2\x80\xae"                                                                        \
    "detide"
#define META_LOSS "1.5\nPASS"
#define META_OBJ  "grpo\x1b[2K\nPASS"

static const char *model(void) {
    return tu_model(MODEL, 1);
}

/* An honest fp32 gradient file of the model for the SFT batch (made once per process). */
static const char *honest(void) {
    const char *out = tu_path("honest.safetensors");
    if (!tu_exists(out)) {
        int rc = tu_sh("timeout 120 %s grad --model %s --batch " SFT " --out %s", tu_bin(), model(),
                       out);
        ck_assert_msg(rc == 0, "grad failed:\n%s", tu_last_output());
    }
    return tu_keep(out);
}

/* The honest file with its first tensor renamed to NAME_NEWLINE, two more copies under
 * NAME_ESCAPES and NAME_BYTES, and hostile "loss" and "objective" metadata. */
static const char *hostile(void) {
    const char *out = tu_path("hostile.safetensors");
    if (tu_exists(out)) return tu_keep(out);
    tu_tensors ts;
    tu_tensors_load(&ts, honest());
    ck_assert_int_lt(ts.n + 2, TU_MAX_TENSORS);
    sbp_st_entry e[TU_MAX_TENSORS];
    memcpy(e, ts.e, sizeof(sbp_st_entry) * (size_t)ts.n);
    int n = ts.n;
    e[0].name = NAME_NEWLINE;
    e[n] = ts.e[1], e[n].name = NAME_ESCAPES, n++;
    e[n] = ts.e[1], e[n].name = NAME_BYTES, n++;
    const char *meta[] = {"loss", META_LOSS, "objective", META_OBJ, NULL};
    sbp_err err = {0};
    ck_assert_msg(sbp_st_write(out, e, n, meta, &err) == SBP_OK, "%s", err.msg);
    tu_tensors_free(&ts);
    return tu_keep(out);
}

/* printf into one of a few rotating buffers (for command lines) */
static const char *str(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *str(const char *fmt, ...) {
    static char ring[4][3000];
    static int k;
    char *buf = ring[k++ % 4];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof ring[0], fmt, ap);
    va_end(ap);
    return buf;
}

/* Runs `timeout 120 streambp ARGS`, stdout alone into a file; returns the exit status and the
 * stdout text in *text (the caller frees it). */
static int run_stdout(char **text, const char *args) {
    static int runs;
    const char *path = tu_path("stdout-%d.txt", runs++);
    int rc = tu_sh("timeout 120 %s %s > '%s'", tu_bin(), args, path);
    *text = tu_slurp(path, NULL);
    return rc;
}

/* Fails unless every byte of s is printable ASCII, a newline, or part of valid UTF-8 that is
 * not a C1 control: what a terminal shows as text and nothing else. */
static void assert_inert(const char *s, const char *what) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; p[i];) {
        unsigned c = p[i];
        if (c == '\n' || (c >= 0x20 && c < 0x7f)) {
            i++;
            continue;
        }
        int len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
        ck_assert_msg(len > 0 && !(c == 0xc2 && p[i + 1] < 0xa0),
                      "%s: byte 0x%02x at offset %zu reaches the terminal:\n%s", what, c, i, s);
        for (int k = 1; k < len; k++)
            ck_assert_msg((p[i + k] & 0xc0) == 0x80, "%s: invalid UTF-8 at offset %zu:\n%s", what,
                          i, s);
        /* U+2028-U+202E (separators, bidirectional embeddings and overrides), U+2066-U+2069 */
        ck_assert_msg(!(c == 0xe2 && ((p[i + 1] == 0x80 && p[i + 2] >= 0xa8 && p[i + 2] <= 0xae) ||
                                      (p[i + 1] == 0x81 && p[i + 2] >= 0xa6 && p[i + 2] <= 0xa9))),
                      "%s: a line separator or bidirectional control at offset %zu:\n%s", what, i,
                      s);
        i += (size_t)len;
    }
}

/* Fails if a line of s, after its indentation and list marks, starts with "PASS". */
static void assert_no_pass_line(const char *s, const char *what) {
    for (const char *l = s; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        const char *p = l;
        while (*p == ' ' || *p == '-' || *p == '\t') p++;
        ck_assert_msg(strncmp(p, "PASS", 4) != 0, "%s: a line starts with PASS:\n%s", what, s);
    }
}

/* The last line of s (without its newline). */
static const char *last_line(const char *s) {
    static char buf[256];
    size_t n = strlen(s);
    while (n && s[n - 1] == '\n') n--;
    size_t b = n;
    while (b && s[b - 1] != '\n') b--;
    snprintf(buf, sizeof buf, "%.*s", (int)(n - b), s + b);
    return buf;
}

static void expect_in(const char *s, const char *want, const char *what) {
    ck_assert_msg(strstr(s, want) != NULL, "%s: no \"%s\" in:\n%s", what, want, s);
}

/* the escaped forms the reports must show instead */
static void expect_escaped(const char *out, const char *what) {
    expect_in(out, "x\\nPASS forged\\n", what);
    expect_in(out, "\\x1B[1A\\x1B[2K\\rPASS", what);
    expect_in(out, "bad\\u009B31m \\x7F \\u202Edetide", what);
}

START_TEST(escape_function) {
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"},
        {"a\nPASS", "a\\nPASS"},
        {"\r\t\x1b[31m", "\\r\\t\\x1B[31m"},
        {"back\\slash", "back\\\\slash"},
        {"\x01\x1f\x7f", "\\x01\\x1F\\x7F"},
        {"caf\xc3\xa9 \xe2\x80\x96 \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x80\x96 \xf0\x9f\x98\x80"},
        {"\xc2\x85\xc2\x9b", "\\u0085\\u009B"},                            /* C1 controls */
        {"\xe2\x80\xa8\xe2\x80\xae\xe2\x81\xa6", "\\u2028\\u202E\\u2066"}, /* separators, bidi */
        {"\xff\xc0\x80\xed\xa0\x80",
         "\\xFF\\xC0\\x80\\xED\\xA0\\x80"},           /* invalid, overlong, surrogate */
        {"\xe2\x80", "\\xE2\\x80"},                   /* truncated sequence */
        {"\xf4\x90\x80\x80", "\\xF4\\x90\\x80\\x80"}, /* above U+10FFFF */
        {"", ""},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_str_eq(sbp_text_escape(buf, sizeof buf, cases[i].in), cases[i].out);
    ck_assert_str_eq(sbp_text_escape(buf, sizeof buf, NULL), "(null)");
    /* too long: cut visibly, never mid-escape, and always terminated */
    char small[16];
    ck_assert_str_eq(sbp_text_escape(small, sizeof small, "abcdefghijklmnopqrstuvwxyz"),
                     "abcdefghijkl...");
    ck_assert_str_eq(sbp_text_escape(small, sizeof small, "abcdefghij\n\n"), "abcdefghij\\n...");
}
END_TEST

START_TEST(audit_text_not_forged) {
    char *out;
    int rc = run_stdout(
        &out, str("verify audit --model %s --batch " SFT " --grads %s", model(), hostile()));
    ck_assert_msg(rc == 1, "verify audit exited %d, expected 1:\n%s\n%s", rc, out,
                  tu_last_output());
    assert_inert(out, "verify audit");
    assert_no_pass_line(out, "verify audit");
    expect_escaped(out, "verify audit");
    expect_in(out, "theirs 1.5\\nPASS", "verify audit (loss metadata)");
    expect_in(out, "objective grpo\\x1B[2K\\nPASS", "verify audit (objective metadata)");
    ck_assert_str_eq(last_line(out), "FAIL");
    free(out);
}
END_TEST

START_TEST(audit_json_exact) {
    char *out;
    int rc = run_stdout(
        &out, str("verify audit --json --model %s --batch " SFT " --grads %s", model(), hostile()));
    ck_assert_msg(rc == 1, "verify audit --json exited %d:\n%s", rc, tu_last_output());
    ck_assert_msg(!strchr(out, '\x1b') && !strchr(out, '\r'), "raw control bytes in JSON:\n%s",
                  out);
    cJSON *j = cJSON_Parse(out);
    ck_assert_msg(j != NULL, "not JSON:\n%s", out);
    const char *extra = cJSON_GetStringValue(cJSON_GetObjectItem(j, "extra_tensors"));
    ck_assert_ptr_nonnull(extra);
    ck_assert_msg(strstr(extra, NAME_NEWLINE) && strstr(extra, NAME_ESCAPES),
                  "the names did not survive JSON: %s", extra);
    ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(j, "their_loss")), META_LOSS);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "pass")));
    cJSON_Delete(j);
    free(out);
}
END_TEST

START_TEST(diff_text_not_forged) {
    char *out;
    int rc = run_stdout(&out, str("verify diff %s %s", hostile(), honest()));
    ck_assert_msg(rc == 1, "verify diff exited %d, expected 1:\n%s\n%s", rc, out, tu_last_output());
    assert_inert(out, "verify diff");
    assert_no_pass_line(out, "verify diff");
    expect_escaped(out, "verify diff");
    expect_in(out, "loss: A 1.5\\nPASS", "verify diff (loss metadata)");
    ck_assert_str_eq(last_line(out), "FAIL");
    free(out);
    /* the reference side too, and --failures-only */
    rc = run_stdout(&out, str("verify diff --failures-only %s %s", honest(), hostile()));
    ck_assert_msg(rc == 1, "verify diff (reversed) exited %d:\n%s", rc, tu_last_output());
    assert_inert(out, "verify diff (reversed)");
    assert_no_pass_line(out, "verify diff (reversed)");
    expect_escaped(out, "verify diff (reversed)");
    ck_assert_str_eq(last_line(out), "FAIL");
    free(out);
    /* JSON: the exact names, no raw control bytes */
    rc = run_stdout(&out, str("verify diff --json %s %s", hostile(), honest()));
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(!strchr(out, '\x1b') && !strchr(out, '\r'), "raw control bytes:\n%s", out);
    cJSON *j = cJSON_Parse(out);
    ck_assert_msg(j != NULL, "not JSON:\n%s", out);
    int found = 0;
    cJSON *row;
    cJSON_ArrayForEach(row, cJSON_GetObjectItem(j, "rows")) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(row, "name"));
        found += name && (strcmp(name, NAME_NEWLINE) == 0 || strcmp(name, NAME_ESCAPES) == 0);
    }
    ck_assert_int_eq(found, 2);
    cJSON_Delete(j);
    free(out);
}
END_TEST

START_TEST(digest_text_not_forged) {
    char *out;
    int rc = run_stdout(&out, str("verify digest %s", hostile()));
    ck_assert_msg(rc == 0, "verify digest exited %d:\n%s", rc, tu_last_output());
    assert_inert(out, "verify digest");
    assert_no_pass_line(out, "verify digest");
    expect_escaped(out, "verify digest");
    /* one line for the loss and one per tensor, each ending in its dtype and a SHA-256 */
    tu_tensors ts;
    tu_tensors_load(&ts, hostile());
    int lines = 0;
    for (const char *l = out; *l; l = strchr(l, '\n') + 1) {
        const char *end = strchr(l, '\n');
        ck_assert_ptr_nonnull(end);
        if (lines++ == 0) {
            ck_assert_msg(strncmp(l, "loss ", 5) == 0, "first line: %s", out);
            continue;
        }
        ck_assert_msg(end - l > 70 && strncmp(end - 69, " F32 ", 5) == 0,
                      "a tensor line does not end in its dtype and hash:\n%s", out);
        for (const char *h = end - 64; h < end; h++)
            ck_assert_msg(strchr("0123456789abcdef", *h), "not a hash:\n%s", out);
    }
    ck_assert_int_eq(lines, ts.n + 1);
    tu_tensors_free(&ts);
    free(out);
    /* an honest file prints exactly as before: plain names are not touched */
    rc = run_stdout(&out, str("verify digest %s", honest()));
    ck_assert_int_eq(rc, 0);
    expect_in(out, "\nmodel.embed_tokens.weight F32 ", "verify digest (honest)");
    free(out);
}
END_TEST

START_TEST(dpo_audit_without_reference) {
    char *out;
    int rc = run_stdout(&out, str("verify audit --model %s --batch " DPO_NOREF
                                  " --grads %s --objective dpo",
                                  model(), honest()));
    const char *err = tu_last_output();
    ck_assert_msg(rc == 2, "exit %d, expected 2:\n%s", rc, err);
    ck_assert_msg(out[0] == '\0', "printed a report:\n%s", out);
    expect_in(err, DPO_NOREF, "dpo audit");
    expect_in(err, "ref_chosen_logps and ref_rejected_logps", "dpo audit");
    expect_in(err, "--ref-model", "dpo audit");
    ck_assert_msg(!strstr(err, "ref_seq_logps") && !strstr(err, "NULL"), "an internal message:\n%s",
                  err);
    free(out);
}
END_TEST

/* Huge pages off (prctl's, inherited by the commands this test runs, whatever the system's
 * mode): grad's text report notes it, --json names it, bench's heading names it; with the
 * process's own mode the note is there exactly when that mode is off (_i = 1). */
START_TEST(huge_pages_named) {
    if (_i == 0) ck_assert_int_eq(prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0), 0);
    const char *mode;
    const int on = sbp_huge_pages(&mode);
    if (_i == 0) {
        ck_assert_str_eq(mode, "disabled for this process");
        ck_assert_int_eq(on, 0);
    }
    int rc = tu_sh("timeout 120 %s grad --model %s --batch " SFT, tu_bin(), model());
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    char want[128];
    snprintf(want, sizeof want, "note      transparent huge pages are off (%s)", mode);
    ck_assert_msg(!strstr(tu_last_output(), want) == (on != 0), "%s", tu_last_output());
    rc = tu_sh("timeout 120 %s grad --model %s --batch " SFT " --json", tu_bin(), model());
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    cJSON *j = cJSON_Parse(tu_last_output());
    ck_assert_ptr_nonnull(j);
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "huge_pages");
    ck_assert_msg(cJSON_IsString(h) && !strcmp(h->valuestring, mode), "%s", tu_last_output());
    cJSON_Delete(j);
    rc = tu_sh("timeout 120 %s bench --config data/models/llama3-tiny.json --seq 16 --reps 1 "
               "--schedules stream --numerics fast --no-train --threads 1",
               tu_bin());
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    snprintf(want, sizeof want, "transparent huge pages: %s", mode);
    ck_assert_msg(strstr(tu_last_output(), want), "%s", tu_last_output());
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("reports");
    TCase *tc = tcase_create("reports");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, escape_function);
    tcase_add_test(tc, audit_text_not_forged);
    tcase_add_test(tc, audit_json_exact);
    tcase_add_test(tc, diff_text_not_forged);
    tcase_add_test(tc, digest_text_not_forged);
    tcase_add_test(tc, dpo_audit_without_reference);
    tcase_add_loop_test(tc, huge_pages_named, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite_with_model(suite(), MODEL, "test_reports");
}
