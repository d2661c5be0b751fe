/* test_linkcheck.c — tests/linkcheck.py, the check that every link and document citation in the
 * repository resolves (issue 36): the repository passes it, a small tree whose links and
 * citations all resolve passes, and each planted fault fails naming its file and line: a link to
 * a missing file, an anchor no heading has, a § number no heading has, a citation of a missing
 * docs page, a citation of DESIGN (not in the repository), a README section that does not exist.
 * A link inside a code block is not a link. Each fact of tests/facts.txt is stated in its home
 * and nowhere else but where its entry allows: a restatement elsewhere fails naming the file,
 * line and home, and so does a home that no longer states it or a malformed entry. The trees are
 * built in the suite's temporary directory (not a git work tree, so every file under it is
 * checked); the script runs under `timeout`. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* A tree whose links and citations all resolve. */
static const char *good_tree(const char *name) {
    const char *root = tu_new_dir(name);
    tu_put(root, "README.md",
           "# demo\n\n## Exactness\n\nSee [the contract](docs/numerics.md#2-chains) and\n"
           "[commands](docs/commands.md), [this](#exactness), ![a plot](data/p.png).\n\n"
           "```sh\n[not a link](nowhere.md)\n```\n\nand `[code](nowhere.md)` neither.\n");
    tu_put(root, "data/p.png", "png");
    tu_put(root, "docs/numerics.md",
           "# Numerics\n\n## 1. Promise\n\nThe default block is 512.\n\n## 2. Chains\n\n"
           "### 2.1 Products\n\nBack to [the front page](../README.md#exactness).\n");
    tu_put(root, "docs/commands.md", "# Commands\n\n## Limits and bad input\n\ntext\n");
    tu_put(root, "src/kernels/gemm.c",
           "/* one chain per element (docs/numerics.md §2, §2.1); rules in\n"
           " * docs/numerics.md\n * §1; bad input: docs/commands.md#limits-and-bad-input;\n"
           " * README \"Exactness\" */\n");
    tu_put(root, "Makefile", "# docs/numerics.md §1\nall:\n");
    /* one fact, stated in its home and in the history its entry allows; cited elsewhere */
    tu_put(root, "tests/facts.txt",
           "# a comment\n\nfact: the default block\nhome: docs/numerics.md\n"
           "pattern: default block (?:is )?\\d+\nallow: docs/log.md\n");
    tu_put(root, "docs/log.md", "# Log\n\nOn 12-01 the default block 256 became 512.\n");
    tu_put(root, "src/kernels/linear.c", "/* the block: docs/numerics.md §1 */\n");
    return root;
}

static int linkcheck(const char *root) {
    return tu_sh("timeout 60 python3 tests/linkcheck.py '%s'", root);
}

/* The planted tree fails, and the output names where and what. */
static void expect_fail(const char *root, const char *where, const char *what) {
    ck_assert_int_eq(linkcheck(root), 1);
    ck_assert_msg(strstr(tu_last_output(), where) && strstr(tu_last_output(), what),
                  "expected %s ... %s in:\n%s", where, what, tu_last_output());
}

START_TEST(test_repository_passes) {
    int rc = tu_sh("timeout 60 python3 tests/linkcheck.py");
    ck_assert_msg(rc == 0, "tests/linkcheck.py fails on the repository:\n%s", tu_last_output());
}
END_TEST

START_TEST(test_good_tree_passes) {
    const char *root = good_tree("good");
    ck_assert_msg(linkcheck(root) == 0, "%s", tu_last_output());
}
END_TEST

START_TEST(test_missing_file_fails) {
    const char *root = good_tree("file");
    tu_put(root, "docs/cuda.md", "# CUDA\n\nSee [the kernels](../cuda/gemm.cu).\n");
    expect_fail(root, "docs/cuda.md:3:", "link to a missing file: ../cuda/gemm.cu");
}
END_TEST

START_TEST(test_missing_anchor_fails) {
    const char *root = good_tree("anchor");
    tu_put(root, "docs/memory.md", "# Memory\n\ntext\n\nThe [chains](numerics.md#3-chains).\n");
    expect_fail(root, "docs/memory.md:5:", "no heading for anchor #3-chains in docs/numerics.md");
}
END_TEST

START_TEST(test_missing_section_fails) {
    const char *root = good_tree("section");
    tu_put(root, "src/kernels/lanes.h", "/* the tree\n * (docs/numerics.md §5). */\n");
    expect_fail(root, "src/kernels/lanes.h:2:", "cites docs/numerics.md §5: no heading numbered 5");
}
END_TEST

START_TEST(test_missing_page_fails) {
    const char *root = good_tree("page");
    tu_put(root, "tests/test_x.c", "\n\n/* see docs/numerix.md §1 */\n");
    expect_fail(root, "tests/test_x.c:3:", "cites docs/numerix.md, which does not exist");
}
END_TEST

START_TEST(test_design_citation_fails) {
    const char *root = good_tree("design");
    tu_put(root, "cuda/ops.cu", "// the contract (DESIGN §11)\n");
    expect_fail(root, "cuda/ops.cu:1:", "cites DESIGN, which is not in the repository");
}
END_TEST

START_TEST(test_outside_document_fails) {
    const char *root = good_tree("outside");
    tu_put(root, "src/cli/cmd_plan.c", "/* the paper's table (notes/paper.md §5) */\n");
    expect_fail(root,
                "src/cli/cmd_plan.c:1:", "names notes/paper.md, which is not in the repository");
}
END_TEST

START_TEST(test_readme_section_fails) {
    const char *root = good_tree("readme");
    tu_put(root, "src/cli/cmd_grad.c",
           "\"  --batch FILE   formats in README \\\"Objectives\\\"\\n\"\n");
    expect_fail(root, "src/cli/cmd_grad.c:1:", "cites README \"Objectives\": no such heading");
}
END_TEST

START_TEST(test_restated_fact_fails) {
    const char *root = good_tree("fact");
    tu_put(root, "src/kernels/linear.c", "/* blocks of tokens:\n * the default block is 512 */\n");
    expect_fail(root, "src/kernels/linear.c:2:",
                "restates \"the default block\", defined in docs/numerics.md");
}
END_TEST

START_TEST(test_fact_gone_from_home_fails) {
    const char *root = good_tree("facthome");
    tu_put(root, "docs/numerics.md",
           "# Numerics\n\n## 1. Promise\n\ntext\n\n## 2. Chains\n\n### 2.1 Products\n\n"
           "Back to [the front page](../README.md#exactness).\n");
    expect_fail(root, "tests/facts.txt:",
                "\"the default block\" is not stated in its home docs/numerics.md");
}
END_TEST

START_TEST(test_bad_fact_entry_fails) {
    const char *root = good_tree("factentry");
    tu_put(root, "tests/facts.txt", "fact: a rule without a home\npattern: x\n");
    expect_fail(root, "tests/facts.txt:1:", "entry without home");
}
END_TEST

int main(void) {
    Suite *s = suite_create("linkcheck");
    TCase *tc = tcase_create("linkcheck");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_repository_passes);
    tcase_add_test(tc, test_good_tree_passes);
    tcase_add_test(tc, test_missing_file_fails);
    tcase_add_test(tc, test_missing_anchor_fails);
    tcase_add_test(tc, test_missing_section_fails);
    tcase_add_test(tc, test_missing_page_fails);
    tcase_add_test(tc, test_design_citation_fails);
    tcase_add_test(tc, test_outside_document_fails);
    tcase_add_test(tc, test_readme_section_fails);
    tcase_add_test(tc, test_restated_fact_fails);
    tcase_add_test(tc, test_fact_gone_from_home_fails);
    tcase_add_test(tc, test_bad_fact_entry_fails);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
