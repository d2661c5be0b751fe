#!/usr/bin/env python3
"""Lines executed per source file, from a coverage build (`make coverage`, docs/verify.md).

    tests/coverage.py --bin build-cov/streambp --profdata build-cov/verify.profdata \
        [--min PCT] [--exclude tests/coverage-exclude.txt] [--json OUT] [--list]

The coverage build is clang's source-based coverage (-fprofile-instr-generate
-fcoverage-mapping); this script asks llvm-cov for the line counts of every file of src/engine,
src/kernels (their .c files and the headers whose inline code they compile) and src/dist, and
prints the lines that ran and the lines that have code, per file and per folder. A line has code
when llvm-cov maps it to a region of a function (comments, blank lines, declarations outside
functions and code excluded by the preprocessor are not lines).

The numeric code is compiled twice into one binary (real = float and real = double, each copy
with every function of the file): llvm-cov adds the two copies' counts line by line, so a source
line counts once, and it ran when it ran in either precision. (Counting each copy's lines apart
would count every line twice and show nothing more: the two copies are the same source lines.)

The exclusion list (--exclude, tests/coverage-exclude.txt) names the lines the run cannot
reach, each with its reason, one entry a line: `file | text | reason`, where text is a piece of
the line's source ("=text": the whole line; "*": every line of the file; never a line number, so
code moving in the file keeps the entry valid): error
paths (an allocation that fails), code this build cannot execute (the other instruction set's
branch of a compile-time constant), entry points only tests call, the CUDA backend's. The share
that --min applies to is over the lines not so named: ran / (lines - named). The share of every
line is printed beside it. Lines that did not run and match no entry are listed as "not run, no
reason given" (they count against the share); entries that match no line left unrun are listed
as stale (the line ran, or is gone).

Exit status: 1 when the share of src/engine + src/kernels lines that ran is below --min, or when
--strict is given and a line that did not run has no reason; 2 on a usage or tool error.
Python 3 standard library only.
"""
import argparse
import json
import os
import re
import subprocess
import sys

GROUPS = ("src/engine", "src/kernels", "src/dist")
THRESHOLD_GROUPS = ("src/engine", "src/kernels")  # the percentage --min applies to
LINE = re.compile(r"^\s*(\d+)\|\s*([0-9.]+[kMGTPE]?|)\|(.*)$")


def tool(name):
    """llvm-cov or llvm-profdata: the unversioned name, else the newest versioned one."""
    for cand in [name] + ["%s-%d" % (name, v) for v in range(20, 10, -1)]:
        for d in os.environ.get("PATH", "").split(os.pathsep):
            p = os.path.join(d, cand)
            if os.path.isfile(p) and os.access(p, os.X_OK):
                return p
    sys.exit("coverage.py: %s not found (apt-get install llvm)" % name)


def sources():
    """The files of GROUPS, relative to the tree's root."""
    out = []
    for g in GROUPS:
        for root, _, names in os.walk(g):
            out += [os.path.join(root, n) for n in names if n.endswith((".c", ".h"))]
    return sorted(out)


def line_counts(binary, profdata, files):
    """{file: {line: (count > 0, source text)}} for the lines llvm-cov maps."""
    cmd = [tool("llvm-cov"), "show", binary, "-instr-profile=" + profdata,
           "-show-instantiations=false", "-show-expansions=false", "-use-color=false"] + files
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    if res.returncode != 0:
        sys.exit("coverage.py: llvm-cov failed: %s" % res.stderr.decode(errors="replace")[-600:])
    out, cur = {}, None
    root = os.getcwd() + os.sep
    for raw in res.stdout.decode(errors="replace").split("\n"):
        m = LINE.match(raw)
        if m:
            if cur is not None and m.group(2):
                out[cur][int(m.group(1))] = (m.group(2) != "0", m.group(3))
            continue
        head = raw.strip()
        if head.endswith(":") and (head.startswith("/") or head.startswith("src/")):
            path = head[:-1]
            cur = path[len(root):] if path.startswith(root) else path
            out.setdefault(cur, {})
    return out


def read_exclusions(path):
    """[(file, text, reason, line number)] from `file | text | reason` lines."""
    out = []
    if not path:
        return out
    with open(path, encoding="utf-8") as fh:
        for no, raw in enumerate(fh, 1):
            s = raw.strip()
            if not s or s.startswith("#"):
                continue
            parts = [p.strip() for p in s.split(" | ")]
            if len(parts) != 3 or not all(parts):
                sys.exit("coverage.py: %s:%d: want `file | text | reason`" % (path, no))
            out.append((parts[0], parts[1], parts[2], no))
    return out


def pct(a, b):
    return 100.0 * a / b if b else 100.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the coverage build's streambp")
    ap.add_argument("--profdata", required=True, help="llvm-profdata merge's output")
    ap.add_argument("--min", type=float, default=0.0,
                    help="fail below this percentage of src/engine + src/kernels lines")
    ap.add_argument("--exclude", default=None, help="the reasons for lines that cannot run")
    ap.add_argument("--strict", action="store_true",
                    help="also fail when a line of src/engine or src/kernels did not run and "
                         "has no reason")
    ap.add_argument("--json", default=None, help="write the per-file table here")
    ap.add_argument("--list", action="store_true",
                    help="list every line that did not run (default: those with no reason, "
                         "grouped; with it: the excused ones and their reasons too)")
    a = ap.parse_args()

    data = line_counts(a.bin, a.profdata, sources())
    excl = read_exclusions(a.exclude)
    used, rows, unexcused, excused, tot = set(), [], [], [], {}
    for src in sorted(data):
        lines = data[src]
        if not lines:
            continue
        ran = sum(1 for hit, _ in lines.values() if hit)
        named = 0
        for ln in sorted(lines):
            hit, body = lines[ln]
            if hit:
                continue
            body = body.strip()
            why = None
            for k, (f, t, reason, _) in enumerate(excl):
                if f == src and (t == "*" or (body == t[1:] if t.startswith("=") else t in body)):
                    why = reason
                    used.add(k)
                    break
            named += why is not None
            (excused if why else unexcused).append((src, ln, body, why))
        group = next(g for g in GROUPS if src.startswith(g + "/"))
        t = tot.setdefault(group, [0, 0, 0])
        t[0] += ran
        t[1] += len(lines)
        t[2] += named
        rows.append((src, ran, len(lines), named))

    print("%-40s %6s %6s %6s %7s %7s" % ("file", "lines", "ran", "named", "%", "% all"))
    for src, ran, n, named in rows:
        print("%-40s %6d %6d %6d %6.1f%% %6.1f%%" %
              (src, n, ran, named, pct(ran, n - named), pct(ran, n)))
    print()
    for g in GROUPS:
        if g in tot:
            r, n, x = tot[g]
            print("%-40s %6d %6d %6d %6.1f%% %6.1f%%" % (g, n, r, x, pct(r, n - x), pct(r, n)))
    th = [sum(tot.get(g, [0, 0, 0])[i] for g in THRESHOLD_GROUPS) for i in (0, 1, 2)]
    share, share_all = pct(th[0], th[1] - th[2]), pct(th[0], th[1])
    print("%-40s %6d %6d %6d %6.1f%% %6.1f%%" %
          (" + ".join(THRESHOLD_GROUPS), th[1], th[0], th[2], share, share_all))

    if excused:
        n_ek = sum(1 for s, _, _, _ in excused if not s.startswith("src/dist/"))
        print("\nnot run, named with the reason (%s): %d lines, %d of them in src/engine + "
              "src/kernels" % (a.exclude, len(excused), n_ek))
        if a.list:
            for src, ln, body, why in excused:
                print("  %s:%d  %s\n      %s" % (src, ln, body[:90], why))
        else:  # one line per reason and file
            seen = {}
            for src, ln, _, why in excused:
                seen.setdefault((src, why), []).append(ln)
            for (src, why), lns in seen.items():
                print("  %s:%s  %s" % (src, ",".join(map(str, lns)), why))
    if unexcused:
        print("\nnot run, no reason given: %d lines" % len(unexcused))
        per = {}
        for src, ln, body, _ in unexcused:
            if a.list or not src.startswith("src/dist/"):
                print("  %s:%d  %s" % (src, ln, body[:100]))
            else:
                per[src] = per.get(src, 0) + 1
        for src, n in per.items():  # src/dist is reported, not checked: counts only
            print("  %s: %d lines (--list names them)" % (src, n))
    stale = [e for k, e in enumerate(excl) if k not in used]
    if stale:
        print("\nreasons that match no line left unrun (the line ran, or is gone):")
        for f, t, _, no in stale:
            print("  %s:%d  %s | %s" % (a.exclude, no, f, t))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump({"files": [{"file": s, "lines": n, "ran": r, "named": x}
                                 for s, r, n, x in rows],
                       "engine_kernels_percent": share,
                       "engine_kernels_percent_of_all_lines": share_all,
                       "not_run_no_reason": [[s, ln, b] for s, ln, b, _ in unexcused]}, fh,
                      indent=1)
    bad_strict = a.strict and any(not s.startswith("src/dist/") for s, _, _, _ in unexcused)
    ok = share + 1e-9 >= a.min and not bad_strict
    print("\nsrc/engine + src/kernels: %d of %d lines ran, %.2f%% of the %d not named as "
          "unreachable (%.2f%% of all; threshold %.2f%%)%s: %s" %
          (th[0], th[1], share, th[1] - th[2], share_all, a.min,
           "; a line not run has no reason" if bad_strict else "", "PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
