/* test_verifyload.c — verify's "load" group compares the library's reading of config.json with
 * the oracle's field by field (verify/load.c): Gemma-3's window fields, its RoPE fields and every
 * family's pad_token_id included (issue 34). Each field is planted different in the oracle's copy
 * and must be named in the notes; the unchanged readings must agree. And `verify --suite
 * --help` names the Gemma-3 fixtures. */
#include "testutil.h"
#include "../verify/load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The library's and the oracle's readings of a tu_model directory. */
typedef struct {
    sbp_model m;
    ref_model rm;
    sbp_ledger lg;
} readings;

static void read_both(readings *r, const char *model) {
    sbp_err err = {0};
    memset(r, 0, sizeof *r);
    const char *dir = tu_model(model, 1);
    if (sbp_model_load(&r->m, dir, SBP_FP64, &r->lg, &err)) ck_abort_msg("%s", err.msg);
    if (ref_model_read(&r->rm, dir, NULL, 0, &err)) ck_abort_msg("ref: %s", err.msg);
}

static void free_both(readings *r) {
    sbp_model_free(&r->m, &r->lg);
    ref_model_free(&r->rm);
}

/* The number of disagreements and the notes, the oracle reading config `ref_cfg`. */
static int compare(readings *r, const sbp_config *ref_cfg, char *notes, size_t n) {
    sbp_verify_group g = {.n_rows = r->m.params.n};
    g.rows = calloc((size_t)g.n_rows, sizeof *g.rows);
    ck_assert_ptr_nonnull(g.rows);
    sbp_batch b = {0}; /* no batch: the same empty one on both sides */
    const sbp_config keep = r->rm.cfg;
    r->rm.cfg = *ref_cfg;
    notes[0] = 0;
    const int bad = sbp_verify_compare_inputs(&g, notes, n, &r->m, &b, &r->rm, &b);
    r->rm.cfg = keep;
    free(g.rows);
    return bad;
}

/* _i: the field planted different in the oracle's reading of gemma3-tiny. */
START_TEST(gemma3_fields_compared) {
    readings r;
    read_both(&r, "gemma3-tiny");
    char notes[2048];
    ck_assert_int_eq(r.m.cfg.family, SBP_GEMMA3);
    ck_assert_msg(compare(&r, &r.rm.cfg, notes, sizeof notes) == 0, "%s", notes);
    sbp_config c = r.rm.cfg;
    const char *field = NULL;
    switch (_i) {
    case 0: c.sliding_window += 1, field = "sliding_window:"; break;
    case 1: c.sliding_window_pattern += 1, field = "sliding_window_pattern"; break;
    case 2: c.rope_local_theta *= 2, field = "rope_local_base_freq"; break;
    case 3: c.query_pre_attn_scalar += 1, field = "query_pre_attn_scalar"; break;
    case 4: c.pad_token_id += 1, field = "pad_token_id"; break;
    case 5: c.rope_linear = !c.rope_linear, c.rope_factor = 8, field = "linear rope scaling"; break;
    case 6: c.wrapped = 1, field = "multimodal gemma3 wrapper"; break;
    }
    ck_assert_msg(compare(&r, &c, notes, sizeof notes) >= 1 && strstr(notes, field),
                  "planted %s, notes: %s", field, notes);
    free_both(&r);
}
END_TEST

/* A linear RoPE factor (Gemma-3 4B and up) is compared too, not only llama3's; and pad_token_id
 * on a family other than Gemma-3 (Llama-3's tiny model has none: -1). */
START_TEST(rope_factor_and_pad_every_family) {
    readings r;
    char notes[2048];
    read_both(&r, "gemma3-tiny");
    sbp_config c = r.rm.cfg, lib = r.m.cfg;
    c.rope_linear = 1, c.rope_factor = 8;
    r.m.cfg.rope_linear = 1, r.m.cfg.rope_factor = 4;
    ck_assert_msg(compare(&r, &c, notes, sizeof notes) == 1 && strstr(notes, "rope factor"),
                  "notes: %s", notes);
    r.m.cfg = lib;
    free_both(&r);
    read_both(&r, "llama3-tiny");
    ck_assert_int_eq(r.m.cfg.pad_token_id, -1);
    ck_assert_msg(compare(&r, &r.rm.cfg, notes, sizeof notes) == 0, "%s", notes);
    c = r.rm.cfg;
    c.pad_token_id = 0;
    ck_assert_msg(compare(&r, &c, notes, sizeof notes) == 1 && strstr(notes, "pad_token_id"),
                  "notes: %s", notes);
    free_both(&r);
}
END_TEST

/* `verify --suite --help` names every Gemma-3 case that `--list` lists. */
START_TEST(suite_help_names_gemma3_cases) {
    tu_check_run(tu_cli("", 60, "verify --suite --list"), 0, "gemma3-");
    char list[8192];
    snprintf(list, sizeof list, "%s", tu_last_output());
    tu_check_run(tu_cli("", 60, "verify --suite --help"), 0, "Gemma-3");
    int n = 0;
    for (char *save = NULL, *line = strtok_r(list, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char name[64];
        if (sscanf(line, "%63s", name) != 1 || strncmp(name, "gemma3-", 7) != 0) continue;
        n++;
        ck_assert_msg(strstr(tu_last_output(), name), "verify --suite --help does not name %s",
                      name);
    }
    ck_assert_int_ge(n, 6);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("verifyload");
    TCase *tc = tcase_create("verifyload");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, gemma3_fields_compared, 0, 7);
    tcase_add_test(tc, rope_factor_and_pad_every_family);
    tcase_add_test(tc, suite_help_names_gemma3_cases);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
