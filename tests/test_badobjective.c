/* test_badobjective.c — bad input for DPO and GRPO: every case exits 2 with a message naming
 * the problem and leaves no output file (the SFT cases are in test_badinput.c). */
#include "../src/io/safetensors.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A fixture batch as editable tensors. */
typedef struct {
    sbp_st_entry e[16];
    char names[16][64];
    void *data[16];
    int n;
    const char *meta[16];
    char metabuf[8][64];
} st_copy;

static void load_copy(st_copy *c, const char *path) {
    sbp_st_file sf;
    sbp_err err = {0};
    memset(c, 0, sizeof *c);
    ck_assert_msg(sbp_st_open(&sf, path, &err) == SBP_OK, "%s", err.msg);
    for (int i = 0; i < sf.n; i++) {
        const sbp_st_tensor *t = &sf.t[i];
        snprintf(c->names[i], sizeof c->names[i], "%s", t->name);
        c->data[i] = malloc(t->end - t->begin + 8);
        ck_assert_int_eq(sbp_st_read_raw(&sf, t, c->data[i], &err), SBP_OK);
        c->e[i] = (sbp_st_entry){
            .name = c->names[i], .dtype = t->dtype, .ndim = t->ndim, .data = c->data[i]};
        memcpy(c->e[i].shape, t->shape, sizeof t->shape);
    }
    c->n = sf.n;
    for (int i = 0; i < sf.n_meta && i < 4; i++) {
        snprintf(c->metabuf[2 * i], 64, "%s", sf.meta_key[i]);
        snprintf(c->metabuf[2 * i + 1], 64, "%s", sf.meta_val[i]);
        c->meta[2 * i] = c->metabuf[2 * i], c->meta[2 * i + 1] = c->metabuf[2 * i + 1];
    }
    sbp_st_close(&sf);
}

static int find(const st_copy *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->names[i], name) == 0) return i;
    ck_abort_msg("fixture has no %s", name);
    return -1;
}

static void drop(st_copy *c, const char *name) {
    int i = find(c, name);
    free(c->data[i]);
    for (int j = i; j + 1 < c->n; j++) {
        c->e[j] = c->e[j + 1], c->data[j] = c->data[j + 1];
        memcpy(c->names[j], c->names[j + 1], sizeof c->names[j]);
        c->e[j].name = c->names[j];
    }
    c->n--;
}

static void set_meta(st_copy *c, const char *key, const char *val) {
    int i = 0;
    while (c->meta[i] && strcmp(c->meta[i], key) != 0) i += 2;
    snprintf(c->metabuf[i], 64, "%s", key);
    snprintf(c->metabuf[i + 1], 64, "%s", val);
    c->meta[i] = c->metabuf[i], c->meta[i + 1] = c->metabuf[i + 1];
}

static const char *save_copy(st_copy *c, const char *file) {
    static char path[600];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), file);
    sbp_err err = {0};
    ck_assert_msg(sbp_st_write(path, c->e, c->n, c->meta, &err) == SBP_OK, "%s", err.msg);
    for (int i = 0; i < c->n; i++) free(c->data[i]);
    return path;
}

/* Runs grad with the objective options; checks exit 2, the message, and no output file. */
static void expect(const char *batch, const char *args, const char *want) {
    char out[600];
    snprintf(out, sizeof out, "%s/grad-out.safetensors", tu_tmpdir());
    remove(out);
    int rc = tu_sh("%s grad --model %s --batch '%s' %s --out %s", tu_bin(),
                   tu_model("qwen3-tiny", 1), batch, args, out);
    ck_assert_msg(rc == 2, "grad --batch %s %s exited %d, expected 2:\n%s", batch, args, rc,
                  tu_last_output());
    ck_assert_msg(strstr(tu_last_output(), want), "the message does not mention \"%s\":\n%s", want,
                  tu_last_output());
    ck_assert_msg(!tu_exists(out), "a failed run left %s", out);
}

#define DPO  "data/batches/dpo-tiny.safetensors"
#define GRPO "data/batches/grpo-tiny.safetensors"

START_TEST(dpo_missing_tensor) {
    st_copy c;
    load_copy(&c, DPO);
    drop(&c, "rejected_input_ids");
    expect(save_copy(&c, "dpo-norej.safetensors"), "--objective dpo", "rejected_input_ids");
    expect("data/batches/sft-tiny.safetensors", "--objective dpo", "chosen_input_ids");
}
END_TEST

START_TEST(dpo_pair_shapes) {
    st_copy c;
    load_copy(&c, DPO);
    for (const char *n = "rejected_input_ids";;
         n = n[9] == 'i' ? "rejected_labels" : "rejected_attention_mask") {
        c.e[find(&c, n)].shape[0] = 1; /* the first row only */
        if (n[9] == 'a') break;
    }
    expect(save_copy(&c, "dpo-pairs.safetensors"), "--objective dpo", "2 chosen but 1 rejected");
}
END_TEST

START_TEST(dpo_reference_logps) {
    st_copy c;
    load_copy(&c, DPO);
    c.e[find(&c, "ref_chosen_logps")].shape[0] = 1;
    expect(save_copy(&c, "dpo-refshape.safetensors"), "--objective dpo",
           "\"ref_chosen_logps\" must have shape [2]");
    load_copy(&c, DPO);
    drop(&c, "ref_rejected_logps");
    expect(save_copy(&c, "dpo-refhalf.safetensors"), "--objective dpo", "come together");
    expect("data/batches/dpo-noref.safetensors", "--objective dpo", "needs reference log-probs");
    /* a reference model with another vocabulary */
    char other[600];
    snprintf(other, sizeof other, "--objective dpo --ref-model %s", tu_model("llama3-tiny", 1));
    expect("data/batches/dpo-noref.safetensors", other, "vocabulary");
}
END_TEST

START_TEST(dpo_row_without_targets) {
    st_copy c;
    load_copy(&c, DPO);
    int64_t *lab = c.data[find(&c, "rejected_labels")];
    for (int t = 0; t < c.e[find(&c, "rejected_labels")].shape[1]; t++) lab[t] = -100;
    expect(save_copy(&c, "dpo-empty.safetensors"), "--objective dpo",
           "the rejected sequence has no completion token");
}
END_TEST

START_TEST(grpo_groups_and_advantages) {
    st_copy c;
    load_copy(&c, GRPO);
    set_meta(&c, "group_size", "3");
    expect(save_copy(&c, "grpo-g3.safetensors"), "--objective grpo",
           "group size 3 does not divide B = 4");
    load_copy(&c, GRPO);
    set_meta(&c, "group_size", "two");
    expect(save_copy(&c, "grpo-gx.safetensors"), "--objective grpo", "group_size");
    load_copy(&c, GRPO);
    drop(&c, "rewards");
    expect(save_copy(&c, "grpo-none.safetensors"), "--objective grpo",
           "exactly one of \"advantages\" and \"rewards\"");
    expect("data/batches/sft-tiny.safetensors", "--objective grpo", "completion_mask");
}
END_TEST

START_TEST(grpo_token_logps) {
    st_copy c;
    load_copy(&c, GRPO);
    c.e[find(&c, "old_logps")].shape[1] = 12;
    c.e[find(&c, "old_logps")].shape[0] = 8;
    expect(save_copy(&c, "grpo-old.safetensors"), "--objective grpo",
           "\"old_logps\" must have shape [4, 24]");
    expect("data/batches/grpo-adv.safetensors", "--objective grpo --beta 0.04",
           "needs reference log-probs");
    load_copy(&c, GRPO);
    int64_t *cm = c.data[find(&c, "completion_mask")];
    cm[5] = 2;
    expect(save_copy(&c, "grpo-cm.safetensors"), "--objective grpo", "completion_mask");
}
END_TEST

START_TEST(bad_hyper_parameters) {
    expect(DPO, "--objective dpo --beta -1", "--beta must be a finite number >= 0");
    expect(DPO, "--objective dpo --beta nan", "--beta must be a finite number >= 0");
    expect(DPO, "--objective dpo --beta 0", "DPO needs beta > 0");
    expect(DPO, "--objective dpo --label-smoothing 0.6", "label smoothing must be in [0, 0.5]");
    expect(GRPO, "--objective grpo --temperature 0", "--temperature must be > 0");
    expect(GRPO, "--objective grpo --temperature inf", "--temperature must be a finite number");
    expect(GRPO, "--objective grpo --epsilon-low -0.1", "--epsilon-low must be a finite number");
    expect(GRPO, "--objective grpo --loss-type ipo", "does not apply to --objective grpo");
    expect(DPO, "--objective dpo --loss-type dapo", "does not apply to --objective dpo");
    expect(GRPO, "--objective grpo --max-completion-length 0", "--max-completion-length");
    expect(GRPO, "--objective ppo", "--objective must be sft, dpo or grpo");
    expect("data/batches/sft-tiny.safetensors", "--ref-model x",
           "--ref-model applies to dpo and grpo");
    expect("data/batches/sft-tiny.safetensors", "--temperature 0.5",
           "a temperature applies to GRPO only");
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("bad objective input");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, dpo_missing_tensor);
    tcase_add_test(tc, dpo_pair_shapes);
    tcase_add_test(tc, dpo_reference_logps);
    tcase_add_test(tc, dpo_row_without_targets);
    tcase_add_test(tc, grpo_groups_and_advantages);
    tcase_add_test(tc, grpo_token_logps);
    tcase_add_test(tc, bad_hyper_parameters);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
