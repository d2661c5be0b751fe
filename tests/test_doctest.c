/* test_doctest.c — tests/doctest.py, the runner that makes every ```sh block of README.md and
 * docs/<page>.md run as written and checks the numbers the pages quote against what the commands
 * print (issue 56). `make doctest` runs it on the repository; here it runs on planted pages in
 * the suite's temporary directory: a page whose blocks, markers and checks all hold passes and
 * prints each skipped block's reason; each planted fault fails naming the page and line: a
 * failing block, an unannounced exit, an announced exit that does not come, a number that
 * drifted in the text, one that drifted in the output, a table cell that drifted, a check of a
 * skipped block, a file another page wrote under /tmp/, a timeout, a file left in the
 * repository, an unknown marker. The script runs under `timeout`. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A page whose blocks all run as announced and whose numbers are what its commands print. */
static const char *good_page =
    "# A page\n\n"
    "```sh\necho first > /tmp/note\n```\n\n"
    "Text between blocks; the next block reads what the first one wrote.\n\n"
    "```sh\ngrep -q first /tmp/note\nprintf 'peak 857274368 bytes, 1995 tokens, 26758 "
    "more\\n'\n```\n"
    "<!-- doctest: expect mb:857.27 1995=1,995 26758=26,758 -->\n"
    "The peak is 857.27 MB and the largest T 1,995 (stream 26,758).\n\n"
    "<!-- doctest: exit 3 -->\n```sh\nexit 3\n```\n\n"
    "<!-- doctest: skip: needs a GPU -->\n```sh\nnvidia-smi\n```\n\n"
    "<!-- doctest: needs no-such-command-here -->\n```sh\nno-such-command-here\n```\n\n"
    "<!-- doctest: if: false -->\n```sh\nexit 1\n```\n\n"
    "<!-- doctest: run: printf '| 4.2 | 17 |\\n| 5 | 2,048 |\\n' -->\n"
    "<!-- doctest: table -->\n"
    "| a | b |\n|---|---|\n| 4.2 | 17 |\n| 5 | 2,048 |\n\n"
    "```python\nprint('not run')\n```\n";

static const char *page(const char *dir, const char *name, const char *text) {
    tu_put(dir, name, text);
    char path[1024];
    ck_assert_int_lt(snprintf(path, sizeof path, "%s/%s", dir, name), (int)sizeof path);
    return tu_keep(path);
}

static int doctest(const char *pages) {
    return tu_sh("timeout 120 python3 tests/doctest.py %s", pages);
}

/* The planted page fails, and the output names where and what. */
static void expect_fail(const char *pages, const char *where, const char *what) {
    ck_assert_int_eq(doctest(pages), 1);
    ck_assert_msg(strstr(tu_last_output(), where) && strstr(tu_last_output(), what),
                  "expected %s ... %s in:\n%s", where, what, tu_last_output());
}

/* The good page with its text from `from` replaced by `to` (the first occurrence). */
static const char *planted(const char *name, const char *from, const char *to) {
    const char *at = strstr(good_page, from);
    ck_assert_msg(at != NULL, "the good page has no %s", from);
    size_t n = strlen(good_page) + strlen(to) + 1;
    char *text = malloc(n);
    ck_assert_ptr_nonnull(text);
    snprintf(text, n, "%.*s%s%s", (int)(at - good_page), good_page, to, at + strlen(from));
    const char *p = page(tu_new_dir(name), "page.md", text);
    free(text);
    return p;
}

START_TEST(test_good_page_passes) {
    const char *p = page(tu_new_dir("good"), "page.md", good_page);
    ck_assert_msg(doctest(p) == 0, "%s", tu_last_output());
    const char *out = tu_last_output();
    ck_assert_msg(strstr(out, "page.md:22: needs a GPU"), "no reason printed:\n%s", out);
    ck_assert_msg(strstr(out, "needs no-such-command-here, not on PATH"), "%s", out);
    ck_assert_msg(strstr(out, "the test 'false' fails here"), "%s", out);
    ck_assert_msg(!strstr(out, "not run"), "a python block ran:\n%s", out);
}
END_TEST

START_TEST(test_failing_block_fails) {
    const char *p =
        planted("failing", "grep -q first /tmp/note\n", "grep -q first /tmp/note\nfalse\n");
    expect_fail(p, "page.md:9: exit status 1, not announced", "<!-- doctest: exit N -->");
}
END_TEST

START_TEST(test_pipeline_fails) {
    /* set -o pipefail: a failing command before a pipe is not hidden */
    const char *p = planted("pipe", "grep -q first /tmp/note\n", "false | cat\n");
    expect_fail(p, "page.md:9:", "exit status 1");
}
END_TEST

START_TEST(test_announced_exit_missing_fails) {
    const char *p = planted("exit", "```sh\nexit 3\n```", "```sh\ntrue\n```");
    expect_fail(p, "page.md:17: exit status 0", "expected 3");
}
END_TEST

START_TEST(test_drifted_text_fails) {
    const char *p = planted("text", "The peak is 857.27 MB", "The peak is 858.4 MB");
    expect_fail(p, "page.md:13: the text below (line 14)", "does not show 857.27");
}
END_TEST

START_TEST(test_drifted_output_fails) {
    const char *p = planted("output", "1995 tokens", "2012 tokens");
    expect_fail(p, "page.md:13:", "page.md:9 does not print 1995");
}
END_TEST

START_TEST(test_drifted_table_fails) {
    const char *p = planted("table", "| 5 | 2,048 |\n\n", "| 5 | 2,049 |\n\n");
    expect_fail(p, "page.md:41: table row 2", "2,049 is not printed by");
}
END_TEST

START_TEST(test_check_of_skipped_block_fails) {
    const char *p = planted("skipped", "```sh\ngrep -q first",
                            "<!-- doctest: skip: too slow -->\n```sh\ngrep -q first");
    expect_fail(p, "page.md:14: checks the block at", "which did not run (too slow)");
}
END_TEST

START_TEST(test_pages_do_not_share_tmp) {
    /* a page that reads what another page wrote under /tmp/ fails: each has its own scratch */
    const char *dir = tu_new_dir("tmp");
    const char *a = page(dir, "a.md", "```sh\necho x > /tmp/shared-note\n```\n");
    const char *b = page(dir, "b.md", "```sh\ncat /tmp/shared-note\n```\n");
    char pages[2048];
    snprintf(pages, sizeof pages, "'%s' '%s'", a, b);
    expect_fail(pages, "b.md:1: exit status 1", "shared-note");
}
END_TEST

START_TEST(test_timeout_fails) {
    const char *p =
        page(tu_new_dir("slow"), "page.md", "<!-- doctest: timeout 1 -->\n```sh\nsleep 30\n```\n");
    expect_fail(p, "page.md:2: timed out", "1 s");
}
END_TEST

START_TEST(test_file_left_in_repository_fails) {
    const char *p = page(tu_new_dir("left"), "page.md", "```sh\ntouch doctest-plant-file\n```\n");
    int rc = doctest(p);
    char *out = strdup(tu_last_output());
    remove("doctest-plant-file");
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(out, "left doctest-plant-file in the repository"), "%s", out);
    free(out);
}
END_TEST

START_TEST(test_bad_marker_fails) {
    const char *p =
        page(tu_new_dir("marker"), "page.md", "<!-- doctest: skipp: typo -->\n```sh\ntrue\n```\n");
    expect_fail(p, "page.md:1:", "unknown doctest marker: skipp: typo");
    p = page(tu_new_dir("stray"), "page.md",
             "<!-- doctest: exit 2 -->\ntext\n\n```sh\nexit 2\n```\n");
    expect_fail(p, "page.md:1:", "exit is not directly above a ```sh block");
}
END_TEST

int main(void) {
    Suite *s = suite_create("doctest");
    TCase *tc = tcase_create("doctest");
    tcase_set_timeout(tc, 150);
    tcase_add_test(tc, test_good_page_passes);
    tcase_add_test(tc, test_failing_block_fails);
    tcase_add_test(tc, test_pipeline_fails);
    tcase_add_test(tc, test_announced_exit_missing_fails);
    tcase_add_test(tc, test_drifted_text_fails);
    tcase_add_test(tc, test_drifted_output_fails);
    tcase_add_test(tc, test_drifted_table_fails);
    tcase_add_test(tc, test_check_of_skipped_block_fails);
    tcase_add_test(tc, test_pages_do_not_share_tmp);
    tcase_add_test(tc, test_timeout_fails);
    tcase_add_test(tc, test_file_left_in_repository_fails);
    tcase_add_test(tc, test_bad_marker_fails);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
