/* test_layers.c — tests/layers.sh, the checks of the include graph between folders (issue 36)
 * and of the calls between files (issue 52): the repository and its build pass them, and they
 * fail a tree with an include from a lower layer up to a higher one, an include of no file, a
 * folder missing from its layer list, an object that uses a symbol of a higher layer's file, or
 * two files that use each other. The trees (and their objects, compiled by cc) are built in the
 * suite's temporary directory; the script runs under `timeout`. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
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
    /* the calls, on the objects of the build this suite belongs to (run.sh sets BUILD) */
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    rc = tu_sh("timeout 60 tests/layers.sh . '%s'", build);
    ck_assert_msg(rc == 0, "tests/layers.sh fails on the objects of %s:\n%s", build,
                  tu_last_output());
    ck_assert_msg(strstr(tu_last_output(), "no two files use each other"), "%s", tu_last_output());
}
END_TEST

/* Compiles root/SRC into root/obj/KIND/OBJ.o, as the Makefile lays its objects out. */
static void compile(const char *root, const char *kind, const char *src) {
    char obj[512];
    snprintf(obj, sizeof obj, "%s", src);
    *strrchr(obj, '.') = '\0';
    int rc = tu_sh("cd '%s' && mkdir -p \"obj/%s/$(dirname '%s')\" && cc -c '%s' -o 'obj/%s/%s.o'",
                   root, kind, obj, src, kind, obj);
    ck_assert_msg(rc == 0, "%s", tu_last_output());
}

/* good_tree with objects whose calls go down: the API calls the engine (compiled twice, as
 * the numeric code is: one source, two objects defining the same names) and the core. */
static const char *good_objects(const char *name) {
    const char *root = good_tree(name);
    tu_put(root, "src/core/err.c", "int sbp_fail(void) { return 1; }\n");
    tu_put(root, "src/engine/run.c",
           "int sbp_fail(void);\nint drive(void) { return sbp_fail(); }\n");
    tu_put(root, "src/api/grad.c", "int drive(void);\nint sbp_grad(void) { return drive(); }\n");
    compile(root, "common", "src/core/err.c");
    compile(root, "f32", "src/engine/run.c");
    compile(root, "f64", "src/engine/run.c");
    compile(root, "common", "src/api/grad.c");
    return root;
}

static int calls(const char *root) {
    return tu_sh("timeout 60 tests/layers.sh '%s' '%s/obj'", root, root);
}

START_TEST(test_downward_calls_pass) {
    const char *root = good_objects("calls-down");
    ck_assert_msg(calls(root) == 0, "%s", tu_last_output());
    ck_assert_msg(strstr(tu_last_output(), "4 objects under"), "%s", tu_last_output());
}
END_TEST

START_TEST(test_upward_call_fails) {
    const char *root = good_objects("calls-up");
    /* the core calls a function of the API: an include would not show it (it declares it) */
    tu_put(root, "src/core/flops.c",
           "int sbp_grad(void);\nint flops(void) { return sbp_grad(); }\n");
    compile(root, "common", "src/core/flops.c");
    ck_assert_int_eq(calls(root), 1);
    ck_assert_msg(strstr(tu_last_output(), "src/core/flops.c: src/core uses sbp_grad of "
                                           "src/api/grad.c from src/api, a higher layer"),
                  "%s", tu_last_output());
}
END_TEST

START_TEST(test_files_using_each_other_fail) {
    const char *root = good_objects("calls-pair");
    /* two files of one layer: the driver calls the entry's bucket_end, the entry calls drive */
    tu_put(root, "src/engine/entry.c",
           "int drive(void);\nint bucket_end(void) { return 0; }\nint entry(void) { return "
           "drive(); }\n");
    tu_put(root, "src/engine/run.c",
           "int sbp_fail(void);\nint bucket_end(void);\n"
           "int drive(void) { return sbp_fail() + bucket_end(); }\n");
    compile(root, "f32", "src/engine/entry.c");
    compile(root, "f32", "src/engine/run.c");
    compile(root, "f64", "src/engine/run.c");
    ck_assert_int_eq(calls(root), 1);
    ck_assert_msg(strstr(tu_last_output(), "src/engine/entry.c and src/engine/run.c use each "
                                           "other: src/engine/entry.c uses drive, "
                                           "src/engine/run.c uses bucket_end"),
                  "%s", tu_last_output());
}
END_TEST

START_TEST(test_no_objects_is_an_error) {
    const char *root = good_tree("calls-none");
    ck_assert_int_eq(tu_sh("timeout 60 tests/layers.sh '%s' '%s/obj'", root, root), 2);
    ck_assert_msg(strstr(tu_last_output(), "no objects under"), "%s", tu_last_output());
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
    tcase_add_test(tc, test_downward_calls_pass);
    tcase_add_test(tc, test_upward_call_fails);
    tcase_add_test(tc, test_files_using_each_other_fail);
    tcase_add_test(tc, test_no_objects_is_an_error);
    tcase_add_test(tc, test_downward_tree_passes);
    tcase_add_test(tc, test_upward_include_fails);
    tcase_add_test(tc, test_upward_through_root_path_fails);
    tcase_add_test(tc, test_unknown_include_and_folder_fail);
    tcase_add_test(tc, test_entry_points_greppable);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
