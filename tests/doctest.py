#!/usr/bin/env python3
"""doctest.py — every command block of README.md and docs/*.md runs as written, and the numbers the
pages quote from a command are the numbers it prints (`make doctest`, part of the whole `make
test`). Python 3 standard library only.

What runs: each ```sh fence of a page, in page order, as one bash script with `set -e -o
pipefail`, from the repository root (so `build/streambp ...` and `data/...` resolve as written),
with a per-block timeout. Each page gets a fresh scratch directory (removed afterwards); every
literal `/tmp/` in its blocks is read as that directory, so pages cannot see each other's files
or those of other runs on the machine, and a block that needs a file no block of its own page
writes fails. A block that leaves a new untracked file in the repository fails.

Markers: HTML comments on lines of their own (invisible on the rendered page).
  Directly above a fence (several may be stacked):
    <!-- doctest: skip: REASON -->      not run; REASON printed (torch, a GPU, hours, placeholders)
    <!-- doctest: needs CMD [CMD...] --> skipped, the reason printed, when a CMD is not on PATH
    <!-- doctest: if: SHELL-TEST -->     skipped, the reason printed, unless SHELL-TEST succeeds
                                         (e.g. /usr/bin/python3 -c "import torch")
    <!-- doctest: exit N -->             the block must exit with status N (default 0)
    <!-- doctest: timeout S -->          seconds the block may take (default 300)
  Anywhere:
    <!-- doctest: run: COMMAND -->       a block not shown on the page (one line), for numbers the
                                         page quotes from a command it does not show
    <!-- doctest: expect V[=TEXT] ... --> each V is printed by the nearest block above (fenced or
                                         run), and the next paragraph or table below the marker
                                         shows each TEXT (default V): a drift of either side fails.
                                         V: a number, printed as one (not part of a longer one);
                                         mib:X, mb:X, k:X a count printed that is X in MiB (2^20),
                                         MB (10^6) or thousands, rounded to X's decimals; a word,
                                         printed as one
    <!-- doctest: table -->              every number in the body rows of the next table is
                                         printed by the nearest block above (present, in any place)
A block whose numbers are checked cannot be skipped (the check fails naming it). A skipped block
must give its reason; an unannounced non-zero exit, a timeout, a failed check fail the page.

Usage: tests/doctest.py [--list | -v] [PAGE.md ...]   (default: README.md and docs/*.md of the
repository holding this script). --list: the blocks and their markers, nothing run; -v: each
block's output too. Exit 0 when every page passes, 1 otherwise.
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DEFAULT_TIMEOUT = 300
# The blocks run as a user's shell would: not inside the make that may have started this script.
# The OpenMP wait is streambp's own default (a short spin, then sleep: src/cli/main.c), as a
# user's shell gets it, unless the caller's environment chose; it changes no result.
ENV = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
MARKER = re.compile(r"^\s*<!--\s*doctest:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)(.*)$")
# a number: thousands separated by commas or not, a decimal part; not inside a longer number or
# a name (qwen3, x86-64)
NUM = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?![\d]|\.\d|,\d{3})")


class Block:
    def __init__(self, page, line, text, hidden=False):
        self.page, self.line, self.text, self.hidden = page, line, text, hidden
        self.skip = None  # reason
        self.needs = []
        self.cond = None  # a shell test that must succeed, or the block is skipped
        self.exit = 0
        self.timeout = DEFAULT_TIMEOUT
        self.output = None  # combined stdout and stderr once run

    def where(self):
        return "%s:%d" % (self.page, self.line)


class Check:
    def __init__(self, page, line, kind, args, block, scope, scope_line):
        self.page, self.line, self.kind, self.args = page, line, kind, args
        self.block, self.scope, self.scope_line = block, scope, scope_line


def scope_after(lines, i):
    """(first line number, text) of the paragraph or table after line i: marker and blank lines
    skipped, then everything up to the next blank line."""
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or MARKER.match(lines[j])):
        j += 1
    k = j
    while k < len(lines) and lines[k].strip():
        k += 1
    return j + 1, "\n".join(l for l in lines[j:k] if not MARKER.match(l))


def parse(page, text):
    """(blocks, checks, errors) of one page."""
    lines = text.split("\n")
    blocks, checks, errors, pending, last = [], [], [], [], None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line)
        if m:
            body = m.group(1)
            kw, _, rest = body.partition(" ")
            kw = kw.rstrip(":")
            rest = rest.strip()
            if kw in ("skip", "needs", "if", "exit", "timeout"):
                pending.append((i + 1, kw, rest))
            elif kw == "run":
                if not rest:
                    errors.append("%s:%d: run: with no command" % (page, i + 1))
                else:
                    last = Block(page, i + 1, rest, hidden=True)
                    blocks.append(last)
                    apply_markers(last, pending, errors)
                    pending = []
            elif kw in ("expect", "table"):
                if last is None:
                    errors.append("%s:%d: %s with no block above it" % (page, i + 1, kw))
                else:
                    start, scope = scope_after(lines, i)
                    checks.append(Check(page, i + 1, kw, rest.split(), last, scope, start))
                    if kw == "expect" and not rest.split():
                        errors.append("%s:%d: expect with no values" % (page, i + 1))
            else:
                errors.append("%s:%d: unknown doctest marker: %s" % (page, i + 1, body))
            i += 1
            continue
        f = FENCE.match(line)
        if f:
            fence, lang = f.group(2), f.group(3)
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence):
                j += 1
            if lang in ("sh", "bash", "shell"):
                last = Block(page, i + 1, "\n".join(lines[i + 1:j]))
                blocks.append(last)
                apply_markers(last, pending, errors)
            elif pending:
                errors.append("%s:%d: doctest markers above a ```%s block, which does not run" %
                              (page, pending[0][0], lang or ""))
            pending = []
            i = j + 1
            continue
        if line.strip() and pending:
            errors.append("%s:%d: doctest: %s is not directly above a ```sh block" %
                          (page, pending[0][0], pending[0][1]))
            pending = []
        i += 1
    if pending:
        errors.append("%s:%d: doctest: %s is not above a ```sh block" % (page, pending[0][0],
                                                                         pending[0][1]))
    return blocks, checks, errors


def apply_markers(block, markers, errors):
    for line, kw, rest in markers:
        if kw == "skip":
            if not rest:
                errors.append("%s:%d: skip without a reason" % (block.page, line))
            block.skip = rest or "no reason given"
        elif kw == "needs":
            block.needs += rest.split()
        elif kw == "if":
            if not rest:
                errors.append("%s:%d: if: with no test" % (block.page, line))
            block.cond = rest
        elif kw in ("exit", "timeout"):
            try:
                v = int(rest)
                if v < 0 or (kw == "timeout" and v == 0):
                    raise ValueError
            except ValueError:
                errors.append("%s:%d: %s wants a non-negative integer, not %r" %
                              (block.page, line, kw, rest))
                continue
            setattr(block, kw, v)


def untracked():
    try:
        out = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "-z",
                              "--untracked-files=all"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return set(e[3:] for e in out.decode("utf-8", "replace").split("\0") if e.startswith("?? "))


def condition(test):
    """True when the shell test fails (the block is then skipped)."""
    try:
        return subprocess.run(["bash", "--noprofile", "--norc", "-c", test], cwd=ROOT, env=ENV,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=60).returncode != 0
    except (OSError, subprocess.TimeoutExpired):
        return True


def run_block(block, scratch):
    """Runs a block; returns (status, seconds): status the exit status, or None on a timeout."""
    script = "set -e -o pipefail\n" + block.text.replace("/tmp/", scratch + "/") + "\n"
    t0 = time.time()
    # the script as an argument, not a file in the scratch directory the blocks write to
    p = subprocess.Popen(["bash", "--noprofile", "--norc", "-c", script], cwd=ROOT, env=ENV,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=block.timeout)
        status = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        status = None
    block.output = out.decode("utf-8", "replace")
    return status, time.time() - t0


def numbers(text):
    return set(n.replace(",", "") for n in NUM.findall(text))


UNITS = {"mib": 2.0 ** 20, "mb": 1e6, "k": 1e3}


def printed(text, v):
    """Whether the output text shows the expected value v (see the module's doc)."""
    unit, sep, x = v.partition(":")
    if sep and unit in UNITS:
        decimals = len(x.partition(".")[2])
        want = x.replace(",", "")
        for n in numbers(text):
            if "." not in n and "%.*f" % (decimals, int(n) / UNITS[unit]) == want:
                return True
        return False
    if NUM.fullmatch(v):
        return v.replace(",", "") in numbers(text)
    return re.search(r"\b" + re.escape(v) + r"\b", text) is not None


def has_text(scope, t):
    """t in the scope, not inside a longer number or word (a unit may follow: 14.0k, 2.5×)."""
    return re.search(r"(?<![\w.])" + re.escape(t) + r"(?!\d|[.,]\d)", scope) is not None


def check(c):
    """Failure messages of one number check."""
    b = c.block
    if b.output is None:
        return ["%s:%d: checks the block at %s, which did not run (%s)" %
                (c.page, c.line, b.where(), b.skip or "skipped")]
    errs = []
    if c.kind == "expect":
        for a in c.args:
            v, _, t = a.partition("=")
            if not t:  # the text shows the value as printed, or X of mib:X
                unit, sep, x = v.partition(":")
                t = x if sep and unit in UNITS else v
            if not printed(b.output, v):
                errs.append("%s:%d: %s does not print %s" % (c.page, c.line, b.where(), v))
            if not has_text(c.scope, t):
                errs.append("%s:%d: the text below (line %d) does not show %s" %
                            (c.page, c.line, c.scope_line, t))
    else:
        rows = [r for r in c.scope.split("\n") if r.lstrip().startswith("|")]
        if len(rows) < 3:
            return ["%s:%d: table: no table below it" % (c.page, c.line)]
        out = numbers(b.output)
        for k, row in enumerate(rows[2:]):
            for n in NUM.findall(row):
                if n.replace(",", "") not in out:
                    errs.append("%s:%d: table row %d: %s is not printed by %s" %
                                (c.page, c.scope_line + 2 + k, k + 1, n, b.where()))
    return errs


def tail(text, n=25):
    lines = text.rstrip("\n").split("\n")
    return "\n".join("    | " + l for l in lines[-n:])


def run_page(page, text, verbose=False):
    """Failure messages of one page; prints one line per block."""
    blocks, checks, errors = parse(page, text)
    if not blocks:
        return errors
    scratch = tempfile.mkdtemp(prefix="sbp-doctest-")
    before = untracked()
    try:
        for b in blocks:
            missing = [c for c in b.needs if shutil.which(c) is None]
            failed = b.cond and not b.skip and not missing and condition(b.cond)
            if b.skip or missing or failed:
                why = b.skip or ("needs %s, not on PATH" % ", ".join(missing) if missing else
                                 "the test %r fails here" % b.cond)
                print("skip %s: %s" % (b.where(), why))
                continue
            status, secs = run_block(b, scratch)
            if status is None:
                errors.append("%s: timed out after %d s\n%s" % (b.where(), b.timeout,
                                                                tail(b.output)))
                print("FAIL %s (timeout, %d s)" % (b.where(), b.timeout))
            elif status != b.exit:
                errors.append("%s: exit status %d, %s\n%s" %
                              (b.where(), status, "expected %d" % b.exit if b.exit
                               else "not announced (<!-- doctest: exit N -->)", tail(b.output)))
                print("FAIL %s (exit %d, %.1f s)" % (b.where(), status, secs))
            else:
                print("ok   %s%s (%.1f s)" % (b.where(), " (hidden run)" if b.hidden else "", secs), flush=True)
            if verbose:
                print(tail(b.output, 10 ** 6), flush=True)
        after = untracked()
        if before is not None and after is not None:
            for f in sorted(after - before):
                errors.append("%s: its blocks left %s in the repository (write under /tmp/)" %
                              (page, f))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for c in checks:
        errors += check(c)
    return errors


def main(argv):
    listing, verbose = "--list" in argv, "-v" in argv
    pages = [a for a in argv if a not in ("--list", "-v")]
    if not pages:
        pages = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in
                                       glob.glob(os.path.join(ROOT, "docs", "*.md")))
    errors, t0 = [], time.time()
    for page in pages:
        path = page if os.path.isabs(page) else os.path.join(ROOT, page)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            errors.append("%s: cannot read: %s" % (page, e))
            continue
        if listing:
            blocks, checks, errs = parse(page, text)
            errors += errs
            for b in blocks:
                print("%s%s%s%s%s" % (b.where(), " (hidden run)" if b.hidden else "",
                                      " skip: " + b.skip if b.skip else "",
                                      " needs " + " ".join(b.needs) if b.needs else "",
                                      " if: " + b.cond if b.cond else ""))
            continue
        errors += run_page(page, text, verbose)
    for e in errors:
        print(e)
    print("doctest: %d page(s), %s, %.0f s" % (len(pages), "%d failure(s)" % len(errors) if errors
                                               else "all pass", time.time() - t0), flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
