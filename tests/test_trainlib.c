/* test_trainlib.c — the library half of `streambp train` (src/train/run.h) called directly: a
 * checkpoint saved and read back into a new run is the run it left (step, tokens, data position,
 * logs, weights and moments to the bit); a changed file, a changed setting, a run of the other
 * kind and a non-finite weight are refused with the name of what is wrong; and the run directory's
 * states (absent, a file, only stale logs, holding a run, holding another run) decide where a run
 * starts. */
#include "testutil.h"
#include "../src/train/run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A small SFT run of the tiny Qwen3 on the counting records, as test_rundir's CLI runs. */
static sbp_train_opts tiny_opts(const char *model) {
    sbp_train_opts o = {.model = model,
                        .jsonl = "data/train/counting.jsonl",
                        .T = 32,
                        .B = 2,
                        .shuffle = 1,
                        .seed = 42,
                        .steps = 6,
                        .grad_accum = 2,
                        .sched = {.kind = SBP_LR_COSINE, .lr = 1e-2, .total = 6},
                        .adam = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01},
                        .max_grad_norm = 1.0,
                        .prec = SBP_FP32,
                        .g = {.schedule = SBP_STREAM, .block = 16},
                        .threads = 1};
    return o;
}

/* n steps of r, each logged into the run state as the command logs it. */
static void take_steps(sbp_train_run *r, const sbp_train_opts *o, int n, sbp_ledger *lg) {
    sbp_err err = {0};
    for (int i = 0; i < n; i++) {
        int64_t tokens;
        sbp_step_result res;
        ck_assert_msg(sbp_train_run_batches(r, o, &tokens, lg, &err) == SBP_OK, "%s", err.msg);
        const double lr = sbp_lr_at(&o->sched, r->rs.step);
        ck_assert_msg(sbp_train_step(&res, &r->m, r->has_lora ? &r->lora : NULL, &r->opt, r->mb,
                                     o->grad_accum, &o->g, lr, o->max_grad_norm, lg,
                                     &err) == SBP_OK,
                      "%s", err.msg);
        r->rs.step++, r->rs.tokens += tokens;
        char row[200];
        snprintf(row, sizeof row, "%lld,%.17g\n", (long long)r->rs.step, res.loss);
        ck_assert(sbp_text_append(&r->rs.loss_csv, &r->rs.loss_len, &r->rs.loss_cap, row));
        ck_assert(sbp_text_append(&r->rs.timing_csv, &r->rs.timing_len, &r->rs.timing_cap, row));
    }
}

/* A run of o taken `steps` steps and saved as out/checkpoint-<steps>; its path in where. */
static void saved_run(sbp_train_run *r, const sbp_train_opts *o, const char *out, int steps,
                      char *where, size_t n, sbp_ledger *lg) {
    sbp_err err = {0};
    ck_assert_msg(sbp_train_run_open(r, o, NULL, lg, &err) == SBP_OK, "%s", err.msg);
    take_steps(r, o, steps, lg);
    ck_assert_int_eq(mkdir(out, 0755), 0);
    ck_assert_msg(sbp_checkpoint_save(where, n, out, o, &r->rs, &r->settings, &r->m, NULL,
                                      r->config_json, &r->opt, &err) == SBP_OK,
                  "%s", err.msg);
}

static size_t slab_bytes(const sbp_train_opts *o, int64_t n) {
    return (size_t)n * (o->prec == SBP_FP64 ? sizeof(double) : sizeof(float));
}

/* Saved at step 2 and opened as a new run from the checkpoint: the same state, logs, weights and
 * moments; and a third step from either gives the same bits. */
START_TEST(save_then_read_is_the_same_run) {
    sbp_train_opts o = tiny_opts(tu_model("qwen3-tiny", 1));
    sbp_ledger lg = {0};
    sbp_err err = {0};
    sbp_train_run a, b;
    char where[4400];
    const char *out = tu_keep(tu_path("trainlib-roundtrip"));
    saved_run(&a, &o, out, 2, where, sizeof where, &lg);
    ck_assert_str_eq(where, tu_join(out, "checkpoint-2"));
    static const char *const files[] = {"config.json", "model.safetensors", "optimizer.safetensors",
                                        "loss.csv",    "timing.csv",        "trainer_state.json"};
    for (int i = 0; i < 6; i++)
        ck_assert_msg(tu_exists(tu_join(where, files[i])), "%s missing", files[i]);
    tu_assert_no_tmp(out);
    int recorded = 0;
    ck_assert_msg(sbp_checkpoint_verify(where, &recorded, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(recorded, 1);

    ck_assert_msg(sbp_train_run_open(&b, &o, where, &lg, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(b.rs.step, 2);
    ck_assert_int_eq(b.rs.tokens, a.rs.tokens);
    ck_assert_int_eq(b.rs.sampler.epoch, a.rs.sampler.epoch);
    ck_assert_int_eq(b.rs.sampler.pos, a.rs.sampler.pos);
    ck_assert_mem_eq(b.rs.sampler.rng, a.rs.sampler.rng, sizeof a.rs.sampler.rng);
    ck_assert_str_eq(b.rs.loss_csv, a.rs.loss_csv);
    ck_assert_str_eq(b.rs.timing_csv, a.rs.timing_csv);
    ck_assert_int_eq(b.opt.step, 2);
    ck_assert_int_eq(b.m.params.total, a.m.params.total);
    ck_assert(memcmp(b.m.w, a.m.w, slab_bytes(&o, a.m.params.total)) == 0);
    ck_assert(memcmp(b.opt.exp_avg, a.opt.exp_avg, slab_bytes(&o, a.opt.n)) == 0);
    ck_assert(memcmp(b.opt.exp_avg_sq, a.opt.exp_avg_sq, slab_bytes(&o, a.opt.n)) == 0);
    take_steps(&a, &o, 1, &lg);
    take_steps(&b, &o, 1, &lg);
    ck_assert(memcmp(b.m.w, a.m.w, slab_bytes(&o, a.m.params.total)) == 0);
    ck_assert_str_eq(b.rs.loss_csv, a.rs.loss_csv);
    sbp_train_run_free(&a, &lg);
    sbp_train_run_free(&b, &lg);
}
END_TEST

/* A byte changed in any hashed file of a checkpoint: verification names the file, and a run
 * cannot start from it. */
START_TEST(a_changed_file_is_named) {
    sbp_train_opts o = tiny_opts(tu_model("qwen3-tiny", 1));
    sbp_ledger lg = {0};
    sbp_err err = {0};
    sbp_train_run a;
    char where[4400];
    const char *out = tu_keep(tu_path("trainlib-hash"));
    saved_run(&a, &o, out, 1, where, sizeof where, &lg);
    sbp_train_run_free(&a, &lg);
    static const char *const files[] = {"loss.csv", "model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 3; i++) {
        const char *p = tu_keep(tu_join(where, files[i]));
        size_t n;
        char *bytes = tu_slurp(p, &n);
        bytes[n - 1] ^= 1;
        tu_spit(p, bytes, n);
        int recorded;
        ck_assert_int_eq(sbp_checkpoint_verify(where, &recorded, &err), SBP_EINPUT);
        ck_assert_msg(strstr(err.msg, files[i]) && strstr(err.msg, "SHA-256"), "%s", err.msg);
        sbp_run_start s;
        ck_assert_int_eq(sbp_rundir_start(&s, tu_path("trainlib-hash-new-%d", i), where, &err),
                         SBP_EINPUT);
        ck_assert_msg(strstr(err.msg, files[i]), "%s", err.msg);
        bytes[n - 1] ^= 1;
        tu_spit(p, bytes, n);
        free(bytes);
    }
    int recorded;
    ck_assert_msg(sbp_checkpoint_verify(where, &recorded, &err) == SBP_OK, "%s", err.msg);
}
END_TEST

/* A run whose settings differ from the checkpoint's is refused, naming the option; a full-weight
 * checkpoint is not resumed as an adapter's; settings of another count are refused. */
START_TEST(other_settings_are_refused_by_name) {
    sbp_train_opts o = tiny_opts(tu_model("qwen3-tiny", 1));
    sbp_ledger lg = {0};
    sbp_err err = {0};
    sbp_train_run a;
    char where[4400];
    const char *out = tu_keep(tu_path("trainlib-settings"));
    saved_run(&a, &o, out, 1, where, sizeof where, &lg);
    sbp_train_settings s = a.settings;
    sbp_run_state *rs = &a.rs; /* read back into the state it was saved from */
    ck_assert_msg(sbp_checkpoint_read(rs, where, &s, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(rs->step, 1);
    /* the learning rate */
    for (int i = 0; i < s.n; i++)
        if (strcmp(s.key[i], "lr") == 0) snprintf(s.val[i], sizeof s.val[i], "0.5");
    ck_assert_int_eq(sbp_checkpoint_read(rs, where, &s, &err), SBP_EINPUT);
    ck_assert_msg(strstr(err.msg, "--lr = 0.01") && strstr(err.msg, "this run 0.5"), "%s", err.msg);
    /* an adapter run against a full-weight checkpoint */
    s = a.settings;
    s.key[s.n] = "lora";
    snprintf(s.val[s.n++], sizeof s.val[0], "r 4");
    ck_assert_int_eq(sbp_checkpoint_read(rs, where, &s, &err), SBP_EINPUT);
    ck_assert_msg(strstr(err.msg, "trains the full weights; this run a LoRA adapter"), "%s",
                  err.msg);
    /* one setting fewer than the checkpoint's */
    s = a.settings;
    s.n--;
    ck_assert_int_eq(sbp_checkpoint_read(rs, where, &s, &err), SBP_EINPUT);
    ck_assert_msg(strstr(err.msg, "settings hold"), "%s", err.msg);
    /* the whole run: another seed is another run */
    sbp_train_opts o2 = o;
    o2.seed = 7;
    sbp_train_run b;
    ck_assert_int_eq(sbp_train_run_open(&b, &o2, where, &lg, &err), SBP_EINPUT);
    ck_assert_msg(strstr(err.msg, "--seed = 42, this run 7"), "%s", err.msg);
    sbp_train_run_free(&b, &lg);
    /* and the settings hash is of every key and value */
    s = a.settings;
    uint64_t h = sbp_train_settings_hash(&s);
    s.val[0][0] ^= 1;
    ck_assert(sbp_train_settings_hash(&s) != h);
    sbp_train_run_free(&a, &lg);
}
END_TEST

/* A non-finite weight is not saved: the step and the weight are named. */
START_TEST(a_non_finite_weight_is_not_saved) {
    sbp_train_opts o = tiny_opts(tu_model("qwen3-tiny", 1));
    sbp_ledger lg = {0};
    sbp_err err = {0};
    sbp_train_run a;
    ck_assert_msg(sbp_train_run_open(&a, &o, NULL, &lg, &err) == SBP_OK, "%s", err.msg);
    const sbp_param *p = &a.m.params.p[1];
    ((float *)a.m.w)[p->offset + 3] = NAN;
    const char *dir = tu_keep(tu_new_dir("trainlib-nan"));
    ck_assert_int_eq(sbp_train_save_trained(dir, o.model, &a.m, NULL, a.config_json, 5, &err),
                     SBP_ENUMERIC);
    ck_assert_msg(strstr(err.msg, "step 5") && strstr(err.msg, p->name) &&
                      strstr(err.msg, "element 3") && strstr(err.msg, "not saved"),
                  "%s", err.msg);
    ck_assert(!tu_exists(tu_join(dir, "model.safetensors")));
    sbp_train_run_free(&a, &lg);
}
END_TEST

/* Where a run starts, from the state of its directory. */
START_TEST(run_directory_states) {
    sbp_err err = {0};
    sbp_run_start s;
    /* absent: a fresh run */
    const char *fresh = tu_keep(tu_path("trainlib-dir-absent"));
    ck_assert_msg(sbp_rundir_start(&s, fresh, NULL, &err) == SBP_OK, "%s", err.msg);
    ck_assert(!s.ckpt[0] && !s.stale_logs && !s.unverified);
    ck_assert(sbp_rundir_holds_run(fresh) == NULL);
    /* a file */
    const char *file = tu_keep(tu_path("trainlib-dir-file"));
    tu_spit(file, "x", 1);
    ck_assert_int_eq(sbp_rundir_start(&s, file, NULL, &err), SBP_EIO);
    ck_assert_msg(strstr(err.msg, "exists and is not a directory"), "%s", err.msg);
    /* only the logs of a run that died before its first checkpoint */
    const char *logs = tu_keep(tu_new_dir("trainlib-dir-logs"));
    tu_spit(tu_join(logs, "loss.csv"), "step\n", 5);
    ck_assert(sbp_rundir_holds_run(logs) == NULL);
    ck_assert_msg(sbp_rundir_start(&s, logs, NULL, &err) == SBP_OK, "%s", err.msg);
    ck_assert_int_eq(s.stale_logs, 1);
    /* each mark of a run */
    static const char *const marks[] = {"model.safetensors", "trainer_state.json",
                                        "adapter_model.safetensors"};
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "trainlib-dir-run-%d", i);
        const char *d = tu_keep(tu_new_dir(name));
        tu_spit(tu_join(d, marks[i]), "x", 1);
        ck_assert_str_eq(sbp_rundir_holds_run(d), marks[i]);
        ck_assert_int_eq(sbp_rundir_start(&s, d, NULL, &err), SBP_EINPUT);
        ck_assert_msg(strstr(err.msg, "already holds a training run") && strstr(err.msg, marks[i]),
                      "%s", err.msg);
    }
    const char *ck = tu_keep(tu_new_dir("trainlib-dir-ck"));
    ck_assert_int_eq(mkdir(tu_join(ck, "checkpoint-3"), 0755), 0);
    ck_assert_str_eq(sbp_rundir_holds_run(ck), "checkpoint directories");
    /* a link to a run directory is no run directory (never followed) */
    const char *link = tu_keep(tu_path("trainlib-dir-link"));
    ck_assert_int_eq(symlink(ck, link), 0);
    ck_assert(sbp_rundir_holds_run(link) == NULL);
}
END_TEST

/* Resuming: into the checkpoint's own run directory, or an empty one; never into another run. */
START_TEST(resume_only_into_its_own_run) {
    sbp_train_opts o = tiny_opts(tu_model("qwen3-tiny", 1));
    sbp_ledger lg = {0};
    sbp_err err = {0};
    sbp_train_run a;
    char where[4400];
    const char *out = tu_keep(tu_path("trainlib-resume"));
    saved_run(&a, &o, out, 1, where, sizeof where, &lg);
    sbp_train_run_free(&a, &lg);
    sbp_run_start s;
    ck_assert_msg(sbp_rundir_start(&s, out, out, &err) == SBP_OK, "%s", err.msg);
    ck_assert_str_eq(s.ckpt, where);
    ck_assert_int_eq(s.unverified, 0);
    ck_assert_msg(sbp_rundir_start(&s, tu_path("trainlib-resume-empty"), where, &err) == SBP_OK,
                  "%s", err.msg);
    const char *other = tu_keep(tu_new_dir("trainlib-resume-other"));
    tu_spit(tu_join(other, "model.safetensors"), "x", 1);
    ck_assert_int_eq(sbp_rundir_start(&s, other, where, &err), SBP_EINPUT);
    ck_assert_msg(strstr(err.msg, "holds another training run"), "%s", err.msg);
    /* without --resume the run directory is refused */
    ck_assert_int_eq(sbp_rundir_start(&s, out, NULL, &err), SBP_EINPUT);
    ck_assert_msg(strstr(err.msg, "continue it with --resume"), "%s", err.msg);
}
END_TEST

/* The logs: created with their parents, rows appended to the files and to the state's copies. */
START_TEST(logs_written_and_appended) {
    sbp_err err = {0};
    sbp_run_state rs = {0};
    ck_assert(sbp_run_state_start(&rs, &err) == SBP_OK);
    const char *out = tu_keep(tu_path("trainlib-logs/a/b"));
    sbp_run_logs l;
    ck_assert_msg(sbp_rundir_open_logs(&l, out, &rs, &err) == SBP_OK, "%s", err.msg);
    ck_assert(sbp_rundir_log(&l, &rs, "1,loss\n", "1,time\n", &err) == SBP_OK);
    ck_assert(sbp_rundir_log(&l, &rs, "2,loss\n", "2,time\n", &err) == SBP_OK);
    sbp_rundir_close_logs(&l);
    char *loss = tu_slurp(tu_join(out, "loss.csv"), NULL);
    char *timing = tu_slurp(tu_join(out, "timing.csv"), NULL);
    ck_assert_str_eq(loss, rs.loss_csv);
    ck_assert_str_eq(timing, rs.timing_csv);
    char want[200];
    snprintf(want, sizeof want, "%s1,loss\n2,loss\n", sbp_loss_csv_header);
    ck_assert_str_eq(loss, want);
    snprintf(want, sizeof want, "%s1,time\n2,time\n", sbp_timing_csv_header);
    ck_assert_str_eq(timing, want);
    free(loss), free(timing);
    sbp_run_state_free(&rs);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("trainlib");
    TCase *tc = tcase_create("trainlib");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, save_then_read_is_the_same_run);
    tcase_add_test(tc, a_changed_file_is_named);
    tcase_add_test(tc, other_settings_are_refused_by_name);
    tcase_add_test(tc, a_non_finite_weight_is_not_saved);
    tcase_add_test(tc, run_directory_states);
    tcase_add_test(tc, resume_only_into_its_own_run);
    tcase_add_test(tc, logs_written_and_appended);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
