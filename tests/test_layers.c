/* test_layers.c — tests/layers.sh, the check of the include graph between folders (issue 36): the
 * repository passes it, and it fails a tree with an include from a lower layer up to a higher
 * one, an include of no file, or a folder missing from its layer list. The trees are built in
 * the suite's temporary directory; the script runs under `timeout`. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* A small tree whose includes all go down: cli -> api -> engine -> core -> the public header. */
static const char *good_tree(const char *name) {
    const char *root = tu_new_dir(name);
    tu_put(root, "src/streambp.h", "int sbp_x;\n");
    tu_put(root, "src/core/err.h", "#include \"../streambp.h\"\n");
    tu_put(root, "src/engine/entry.h", "#include \"../core/err.h\"\n");
    tu_put(root, "src/engine/ops/cpu.c", "#include \"../entry.h\"\n#include <stdio.h>\n");
    tu_put(root, "src/api/grad.c", "#include \"../engine/entry.h\"\n");
    tu_put(root, "verify/run.h", "#include \"../src/core/err.h\"\n");
    tu_put(root, "src/cli/cmd_verify_run.c",
           "#include \"verify/run.h\"\n#include \"../api/x.h\"\n");
    tu_put(root, "src/api/x.h", "\n");
    return root;
}

static int layers(const char *root) {
    return tu_sh("timeout 60 tests/layers.sh '%s'", root);
}

START_TEST(test_repository_passes) {
    int rc = tu_sh("timeout 60 tests/layers.sh");
    ck_assert_msg(rc == 0, "tests/layers.sh fails on the repository:\n%s", tu_last_output());
}
END_TEST

START_TEST(test_downward_tree_passes) {
    const char *root = good_tree("down");
    ck_assert_msg(layers(root) == 0, "%s", tu_last_output());
}
END_TEST

START_TEST(test_upward_include_fails) {
    const char *root = good_tree("up");
    tu_put(root, "src/engine/steps/layer.c", "#include \"../../api/x.h\"\n"); /* engine -> api */
    ck_assert_int_eq(layers(root), 1);
    ck_assert_msg(strstr(tu_last_output(),
                         "src/engine/steps/layer.c:1: src/engine includes src/api/x.h from "
                         "src/api, a higher layer"),
                  "%s", tu_last_output());
}
END_TEST

START_TEST(test_upward_through_root_path_fails) {
    const char *root = good_tree("root");
    tu_put(root, "verify/run.c",
           "#include \"src/cli/cli.h\"\n"); /* the -I. spelling, verify -> cli */
    tu_put(root, "src/cli/cli.h", "\n");
    ck_assert_int_eq(layers(root), 1);
    ck_assert_msg(strstr(tu_last_output(), "verify/run.c:1: verify includes src/cli/cli.h"), "%s",
                  tu_last_output());
}
END_TEST

START_TEST(test_unknown_include_and_folder_fail) {
    const char *root = good_tree("unknown");
    tu_put(root, "src/io/file.c", "#include \"nowhere.h\"\n");
    ck_assert_int_eq(layers(root), 1);
    ck_assert_msg(strstr(tu_last_output(), "names no source file"), "%s", tu_last_output());
    root = good_tree("folder");
    tu_put(root, "src/newlayer/a.c", "#include \"../streambp.h\"\n");
    ck_assert_int_eq(layers(root), 1);
    ck_assert_msg(strstr(tu_last_output(), "\"src/newlayer\" is not in the layer list"), "%s",
                  tu_last_output());
}
END_TEST

/* Every entry point a macro names (SBP_ENTRY(name) in a .c file of src/: name_f32 and name_f64)
 * is found by grepping "name_f32(" in src: at a one-line definition or in a comment that spells it
 * out (a line starting with a type, or a comment line); calls, indented, do not count. */
START_TEST(test_entry_points_greppable) {
    int rc = tu_sh("cd src && names=$(grep -rhoE 'SBP_ENTRY\\([a-z_0-9]+\\)' --include='*.c' . | "
                   "sed 's/SBP_ENTRY(\\(.*\\))/\\1/' | sort -u) && [ -n \"$names\" ] && "
                   "for n in $names; do for p in f32 f64; do echo \"entry point ${n}_$p\"; "
                   "grep -rqE \"^([a-z_].*[ *]|[ ]\\*.*|/\\*.*)${n}_$p\\(\" --include='*.c' . || "
                   "echo \"MISSING: ${n}_$p( is in no definition or comment of src/\"; "
                   "done; done");
    ck_assert_int_eq(rc, 0);
    const char *out = tu_last_output();
    ck_assert_msg(!strstr(out, "MISSING"), "%s", out);
    ck_assert_msg(strstr(out, "entry point sbp_engine_grad_f64"), "%s", out);
    /* the CUDA op tables, named by SBP_CUDA_TABLE (cuda/cuda.cuh) in cuda/ops.cu */
    rc =
        tu_sh("names=$(sed -n 's/^#define SBP_CUDA_TABLE *\\([a-z_0-9]*\\).*/\\1/p' cuda/cuda.cuh) "
              "&& [ -n \"$names\" ] && for n in $names; do echo \"entry point $n\"; "
              "grep -qE \"^([a-z_].*[ *]|[ ]\\*.*|/\\*.*)$n\\(\" cuda/*.cu || "
              "echo \"MISSING: $n( is in no definition or comment of cuda/\"; done");
    ck_assert_int_eq(rc, 0);
    out = tu_last_output();
    ck_assert_msg(!strstr(out, "MISSING"), "%s", out);
    ck_assert_msg(strstr(out, "entry point sbp_ops_cuda_emu_f32"), "%s", out);
}
END_TEST

int main(void) {
    Suite *s = suite_create("layers");
    TCase *tc = tcase_create("layers");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_repository_passes);
    tcase_add_test(tc, test_downward_tree_passes);
    tcase_add_test(tc, test_upward_include_fails);
    tcase_add_test(tc, test_upward_through_root_path_fails);
    tcase_add_test(tc, test_unknown_include_and_folder_fail);
    tcase_add_test(tc, test_entry_points_greppable);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
