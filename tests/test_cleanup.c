/* test_cleanup.c — issue 35 item 1 (and the rename half of item 5): nothing the program deletes,
 * renames or rewrites is followed through a symbolic link. Each test plants links in a run
 * directory that point to a directory outside it holding a canary, and checks that the canary's
 * directory is unchanged afterwards (tu_snapshot), that the links themselves are gone or
 * refused, and that temporary names cannot be predicted. Each failed before its fix: the run
 * directory's cleanup and the checkpoint rewrite emptied the link's target. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* A directory outside the run directory with a canary file (and a subdirectory); returns its
 * path and snapshot. */
static const char *outside(const char *name, char **snap) {
    const char *d = tu_keep(tu_new_dir(name));
    tu_spit(tu_join(d, "canary.txt"), "keep me\n", 8);
    ck_assert_int_eq(mkdir(tu_join(d, "sub"), 0755), 0);
    tu_spit(tu_path("%s/sub/deep.txt", name), "and me\n", 7);
    *snap = tu_snapshot(d);
    return d;
}

static void assert_same(const char *d, char *snap) {
    char *now = tu_snapshot(d);
    ck_assert_msg(strcmp(now, snap) == 0, "%s changed:\nbefore\n%s\nafter\n%s", d, snap, now);
    free(now), free(snap);
}

/* A pid that no process has now: a child that has exited and been reaped. */
static long dead_pid(void) {
    pid_t p = fork();
    if (p == 0) _exit(0);
    ck_assert_int_gt(p, 0);
    waitpid(p, NULL, 0);
    return (long)p;
}

static int is_link(const char *p) {
    struct stat sb;
    return lstat(p, &sb) == 0 && S_ISLNK(sb.st_mode);
}

START_TEST(stale_names_are_links_removed_as_links) {
    char *snap, *fsnap;
    const char *out = outside("stale-outside", &snap);
    const char *ofile = tu_keep(tu_path("stale-outside-file.txt"));
    tu_spit(ofile, "a file outside\n", 15);
    fsnap = tu_slurp(ofile, NULL);
    const char *run = tu_keep(tu_new_dir("stale-run"));
    const long pid = dead_pid();
    const char *l1 = tu_keep(tu_path("stale-run/checkpoint-3.tmp.%ld", pid));
    const char *l2 = tu_keep(tu_path("stale-run/checkpoint-3.old.%ld.Ab12Cd", pid));
    const char *l3 = tu_keep(tu_path("stale-run/loss.csv.tmp.%ld", pid));
    ck_assert_int_eq(symlink(out, l1), 0);
    ck_assert_int_eq(symlink(out, l2), 0);
    ck_assert_int_eq(symlink(ofile, l3), 0);
    sbp_remove_stale(run);
    assert_same(out, snap);
    char *f = tu_slurp(ofile, NULL);
    ck_assert_str_eq(f, fsnap);
    free(f), free(fsnap);
    ck_assert_msg(!is_link(l1) && !is_link(l2) && !is_link(l3), "a stale link was left");
    /* the same through `train --out`: a fresh run in a directory holding only planted links */
    const char *run2 = tu_keep(tu_new_dir("stale-run2"));
    outside("stale-outside2", &snap);
    ck_assert_int_eq(
        symlink(tu_path("stale-outside2"), tu_path("stale-run2/checkpoint-1.tmp.%ld", dead_pid())),
        0);
    int rc = tu_sh("timeout 120 '%s' train --model '%s' --jsonl data/train/counting.jsonl --seq 32 "
                   "--batch-size 2 --steps 2 --block 16 --threads 1 --out '%s'",
                   tu_bin(), tu_model("qwen3-tiny", 1), run2);
    ck_assert_msg(rc == 0, "%s", tu_last_output());
    assert_same(tu_path("stale-outside2"), snap);
}
END_TEST

START_TEST(a_linked_checkpoint_is_not_rewritten_through) {
    char *snap;
    const char *out = outside("ck-outside", &snap);
    const char *run = tu_keep(tu_new_dir("ck-run"));
    const char *ck = tu_keep(tu_join(run, "checkpoint-5"));
    ck_assert_int_eq(symlink(out, ck), 0);
    sbp_outdir d;
    sbp_err err = {0};
    ck_assert_msg(sbp_outdir_open(&d, ck, &err) == SBP_OK, "%s", err.msg);
    char p[4400];
    tu_spit(sbp_outdir_file(&d, "trainer_state.json", p, sizeof p), "{}", 2);
    ck_assert_msg(sbp_outdir_commit(&d, &err) != SBP_OK, "a symbolic link was replaced");
    ck_assert_msg(strstr(err.msg, "symbolic link"), "%s", err.msg);
    assert_same(out, snap);
    ck_assert(is_link(ck));
    tu_assert_no_tmp(run);
}
END_TEST

START_TEST(temporary_names_unpredictable) {
    const char *run = tu_keep(tu_new_dir("tmp-run"));
    const char *target = tu_keep(tu_join(run, "checkpoint-2"));
    /* the name the old code used, planted as a link: must not be written through */
    char *snap;
    const char *out = outside("tmp-outside", &snap);
    ck_assert_int_eq(symlink(out, tu_path("tmp-run/checkpoint-2.tmp.%ld", (long)getpid())), 0);
    sbp_outdir a, b;
    sbp_err err = {0};
    ck_assert_msg(sbp_outdir_open(&a, target, &err) == SBP_OK, "%s", err.msg);
    ck_assert_msg(sbp_outdir_open(&b, target, &err) == SBP_OK, "%s", err.msg);
    ck_assert_msg(strcmp(a.tmp, b.tmp) != 0, "two writers got the same name %s", a.tmp);
    char pidname[64];
    snprintf(pidname, sizeof pidname, ".tmp.%ld", (long)getpid());
    ck_assert_msg(strlen(a.tmp) > strlen(target) + strlen(pidname) + 1,
                  "%s: no unpredictable part after the pid", a.tmp);
    sbp_outdir_abort(&b);
    char p[4400];
    tu_spit(sbp_outdir_file(&a, "x.txt", p, sizeof p), "one", 3);
    ck_assert_msg(sbp_outdir_commit(&a, &err) == SBP_OK, "%s", err.msg);
    assert_same(out, snap);
    /* rewriting it swaps the directories: the new content in place, nothing left beside it */
    ck_assert_msg(sbp_outdir_open(&a, target, &err) == SBP_OK, "%s", err.msg);
    tu_spit(sbp_outdir_file(&a, "x.txt", p, sizeof p), "two", 3);
    ck_assert_msg(sbp_outdir_commit(&a, &err) == SBP_OK, "%s", err.msg);
    char *x = tu_slurp(tu_join(target, "x.txt"), NULL);
    ck_assert_str_eq(x, "two");
    free(x);
    ck_assert_int_eq(tu_sh("ls '%s' | grep -c checkpoint-2", run), 0);
    ck_assert_msg(strncmp(tu_last_output(), "2", 1) == 0, "%s", tu_last_output()); /* + the link */
}
END_TEST

START_TEST(a_checkpoint_moved_aside_comes_back) {
    /* the state a writer killed between its two renames leaves where RENAME_EXCHANGE is missing:
     * the older complete checkpoint under its ".old" name, the final name free */
    const char *run = tu_keep(tu_new_dir("old-run"));
    const char *old = tu_keep(tu_path("old-run/checkpoint-7.old.%ld.Zq93xP", dead_pid()));
    ck_assert_int_eq(mkdir(old, 0755), 0);
    tu_spit(tu_join(old, "trainer_state.json"), "{\"step\": 7}", 11);
    sbp_remove_stale(run);
    ck_assert_msg(tu_exists(tu_path("old-run/checkpoint-7/trainer_state.json")),
                  "the complete older checkpoint was not put back");
    ck_assert(!tu_exists(old));
    /* when the name is taken (the new one made it), the older copy is removed */
    ck_assert_int_eq(mkdir(old, 0755), 0);
    tu_spit(tu_join(old, "trainer_state.json"), "{\"step\": 6}", 11);
    sbp_remove_stale(run);
    ck_assert(!tu_exists(old));
    char *s = tu_slurp(tu_path("old-run/checkpoint-7/trainer_state.json"), NULL);
    ck_assert_str_eq(s, "{\"step\": 7}");
    free(s);
}
END_TEST

START_TEST(remove_tree_stays_inside) {
    char *snap;
    const char *out = outside("tree-outside", &snap);
    const char *t = tu_keep(tu_new_dir("tree"));
    ck_assert_int_eq(mkdir(tu_join(t, "a"), 0755), 0);
    ck_assert_int_eq(symlink(out, tu_path("tree/a/link-dir")), 0);
    ck_assert_int_eq(symlink(tu_join(out, "canary.txt"), tu_path("tree/link-file")), 0);
    tu_spit(tu_path("tree/a/f.txt"), "x", 1);
    ck_assert_int_eq(sbp_remove_tree(t), 0);
    ck_assert(!tu_exists(t));
    assert_same(out, snap);
    /* a link given as the path is removed as a link */
    char *snap2;
    const char *out2 = outside("tree-outside2", &snap2);
    const char *l = tu_keep(tu_path("tree-link"));
    ck_assert_int_eq(symlink(out2, l), 0);
    ck_assert_int_eq(sbp_remove_tree(l), 0);
    ck_assert(!is_link(l));
    assert_same(out2, snap2);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("cleanup");
    TCase *tc = tcase_create("cleanup");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, stale_names_are_links_removed_as_links);
    tcase_add_test(tc, a_linked_checkpoint_is_not_rewritten_through);
    tcase_add_test(tc, temporary_names_unpredictable);
    tcase_add_test(tc, a_checkpoint_moved_aside_comes_back);
    tcase_add_test(tc, remove_tree_stays_inside);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return tu_run_suite(suite());
}
