#!/usr/bin/env python3
"""linkcheck.py — every link and document citation in the repository resolves (`make linkcheck`,
part of `make test`). Standard library only.

Checked, each failure printed as FILE:LINE: what is wrong:
  1. relative markdown links [text](path), [text](path#anchor), [text](#anchor) and images in every
     *.md file: the file exists (relative to the linking file), and an anchor names a heading of
     the target (GitHub's rule: the heading's text lower-cased, punctuation dropped, spaces turned
     into hyphens, a -1, -2 ... suffix for repeats). Links inside code blocks and code spans are
     not links; http(s) and mailto links are not checked (CI has no network);
  2. citations in any text file (C, CUDA, Python, shell, Makefile, markdown, ...):
       docs/x.md §N [, §M ...]   docs/x.md exists and has a heading "## N. Title" (§N.M: "### N.M")
       docs/x.md#anchor          docs/x.md exists and has that heading anchor
       dir/name.md               any other repository path of a markdown file exists
       README "Heading"          README.md has a heading of that title (help texts cite these)
     and no file cites DESIGN.md or "DESIGN §N", a document that is not in the repository;
  3. each fact is defined once: tests/facts.txt (under ROOT; no file, no check) lists facts that
     had been restated, and gone stale, in several places; each names its home file and a
     pattern (a Python regular expression over a file's whole text) that a restatement of the
     fact matches. The pattern must match in the home (else the rule guards nothing) and in no
     other text file but those the entry allows (the dated history of docs/performance-log.md):
     everywhere else the fact is cited, not spelled out.
How § numbers map to headings: a section of a docs page is cited as §N when the page numbers its
headings "## N. Title" (subsections "### N.M Title"); docs/numerics.md does. Other pages are cited
by anchor.

Usage: tests/linkcheck.py [ROOT]   (default: the repository holding this script). Exit 0 when
everything resolves, 1 otherwise. The files are the repository's tracked and untracked,
not-ignored files (git ls-files), build directories excluded.
"""
import os
import re
import subprocess
import sys
import unicodedata

TEXT_EXT = {".c", ".h", ".cu", ".cuh", ".cc", ".py", ".sh", ".md", ".toml", ".gp", ".txt", ".yml"}
TEXT_NAMES = {"Makefile", "run"}  # .ci/run
# the checker, its test and its list of facts: they spell out the forms, broken ones included
SELF = {"tests/linkcheck.py", "tests/test_linkcheck.c", "tests/facts.txt"}
FACTS = "tests/facts.txt"


def repo_files(root):
    try:  # git's list when root is the top of a work tree, else every file under root
        top = subprocess.run(["git", "-C", root, "rev-parse", "--show-toplevel"], check=True,
                             capture_output=True).stdout.decode().strip()
        if os.path.realpath(top) != os.path.realpath(root):
            raise OSError("not the top of a work tree")
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], check=True, capture_output=True).stdout
        files = sorted(set(f for f in out.decode("utf-8", "replace").split("\0") if f))
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith((".git", "build"))]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return [f for f in files if not f.split("/")[0].startswith("build")
            and os.path.isfile(os.path.join(root, f)) and not os.path.islink(os.path.join(root, f))]


def is_text(path):
    base = os.path.basename(path)
    return os.path.splitext(base)[1] in TEXT_EXT or base in TEXT_NAMES


def read(root, path):
    try:
        with open(os.path.join(root, path), encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def strip_code(md):
    """The markdown text with fenced code blocks and code spans blanked (newlines kept)."""
    out, fence = [], None
    for line in md.split("\n"):
        m = re.match(r"\s*(```+|~~~+)", line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            out.append("")
            continue
        if m:
            fence = m.group(1)
            out.append("")
            continue
        out.append(re.sub(r"(`+)(.+?)\1", lambda c: " " * len(c.group(0)), line))
    return "\n".join(out)


def slug(text):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    keep = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "-_" or cat[0] in "LN" or cat == "Mn":
            keep.append(ch)
        elif ch == " ":
            keep.append("-")
    return "".join(keep)


def headings(md):
    """(anchors, titles, section numbers) of a markdown text."""
    anchors, titles, sections, seen = set(), set(), set(), {}
    for line in strip_code_fences_only(md).split("\n"):
        m = re.match(r"(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        title = m.group(2)
        titles.add(title.replace("`", ""))
        s = slug(title)
        n = seen.get(s, 0)
        seen[s] = n + 1
        anchors.add(s if n == 0 else "%s-%d" % (s, n))
        num = re.match(r"(\d+(?:\.\d+)*)\.?\s", title)
        if num and len(m.group(1)) >= 2:
            sections.add(num.group(1))
    return anchors, titles, sections


def strip_code_fences_only(md):
    out, fence = [], None
    for line in md.split("\n"):
        m = re.match(r"\s*(```+|~~~+)", line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            out.append("")
        elif m:
            fence = m.group(1)
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


class Checker:
    def __init__(self, root):
        self.root = root
        self.errors = []
        self.cache = {}

    def doc(self, path):
        """headings of a repository markdown file, or None when it does not exist."""
        path = os.path.normpath(path)
        if path not in self.cache:
            full = os.path.join(self.root, path)
            text = read(self.root, path) if os.path.isfile(full) else None
            self.cache[path] = headings(text) if text is not None else None
        return self.cache[path]

    def fail(self, path, text, pos, msg):
        self.errors.append("%s:%d: %s" % (path, text.count("\n", 0, pos) + 1, msg))

    def exists(self, path):
        full = os.path.normpath(os.path.join(self.root, path))
        return full == self.root or full.startswith(self.root + os.sep) and os.path.exists(full)

    def check_markdown(self, path, text):
        body = strip_code(text)
        for m in re.finditer(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)",
                             body):
            target = m.group(1)
            if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            rel = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part \
                else path
            if file_part and not self.exists(rel):
                self.fail(path, body, m.start(), "link to a missing file: %s" % target)
                continue
            if anchor and rel.endswith(".md"):
                h = self.doc(rel)
                if h is None or anchor.lower() not in h[0]:
                    self.fail(path, body, m.start(), "no heading for anchor #%s in %s" % (anchor, rel))

    def check_citations(self, path, text):
        for m in re.finditer(r"\bDESIGN(?:\.md)?\s*§|\bDESIGN\.md\b", text):
            self.fail(path, text, m.start(), "cites DESIGN, which is not in the repository")
        sep = r"(?:[\s*#/]|,|and|to|or|–|-)*"
        for m in re.finditer(r"(?<![\w/.-])docs/([\w.-]+\.md)((?:" + sep + r"§\d+(?:\.\d+)*)*)(#[\w-]+)?",
                             text):
            doc = "docs/" + m.group(1)
            h = self.doc(doc)
            if h is None:
                self.fail(path, text, m.start(), "cites %s, which does not exist" % doc)
                continue
            for num in re.findall(r"§(\d+(?:\.\d+)*)", m.group(2) or ""):
                if num not in h[2]:
                    self.fail(path, text, m.start(), "cites %s §%s: no heading numbered %s" %
                              (doc, num, num))
            if m.group(3) and m.group(3)[1:].lower() not in h[0]:
                self.fail(path, text, m.start(), "cites %s%s: no such heading" % (doc, m.group(3)))
        for m in re.finditer(r"(?<![\w/.:-])((?:[\w.-]+/)+[\w.-]+\.md)\b", text):
            p = m.group(1)
            if p.startswith("docs/") or p.startswith(("http", "www.")):
                continue
            here = os.path.normpath(os.path.join(os.path.dirname(path), p))
            if not self.exists(p) and not self.exists(here):
                self.fail(path, text, m.start(), "names %s, which is not in the repository" % p)
        readme = None
        for m in re.finditer(r'\bREADME,? \\?"([^"\\]+)\\?"', text):
            if readme is None:
                readme = self.doc("README.md") or (set(), set(), set())
            if m.group(1) not in readme[1]:
                self.fail(path, text, m.start(), 'cites README "%s": no such heading' % m.group(1))


def read_facts(root):
    """[(name, home, compiled pattern, allowed paths)] from ROOT/tests/facts.txt, or [] when there
    is none. Entries are blocks of "key: value" lines (fact, home, pattern, allow...), separated
    by blank lines; '#' starts a comment line. A malformed entry is an error, not a skipped rule."""
    text = read(root, FACTS)
    if text is None:
        return [], []
    facts, errors, entry, start = [], [], {}, 0

    def close(entry, line):
        if not entry:
            return
        miss = [k for k in ("fact", "home", "pattern") if k not in entry]
        if miss:
            errors.append("%s:%d: entry without %s" % (FACTS, line, ", ".join(miss)))
            return
        try:
            rx = re.compile(entry["pattern"])
        except re.error as e:
            errors.append("%s:%d: bad pattern: %s" % (FACTS, line, e))
            return
        facts.append((entry["fact"], entry["home"], rx, set(entry.get("allow", []))))

    for i, line in enumerate(text.split("\n") + [""], 1):
        if line.startswith("#"):
            continue
        if not line.strip():
            close(entry, start)
            entry = {}
            continue
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or key not in ("fact", "home", "pattern", "allow"):
            errors.append("%s:%d: expected fact:, home:, pattern: or allow:" % (FACTS, i))
            continue
        if not entry:
            start = i
        if key == "allow":
            entry.setdefault("allow", []).append(value.strip())
        else:
            entry[key] = value.strip()
    return facts, errors


def check_facts(root, files, errors):
    """Each fact's pattern matches in its home and nowhere else but where the entry allows."""
    facts, errs = read_facts(root)
    errors.extend(errs)
    texts = {}
    for f in files:
        if is_text(f) and f not in SELF:
            text = read(root, f)
            if text is not None:
                texts[f] = text
    for name, home, rx, allow in facts:
        if home not in texts or not rx.search(texts[home]):
            errors.append("%s: the fact \"%s\" is not stated in its home %s (move the rule with "
                          "the text)" % (FACTS, name, home))
        for f, text in sorted(texts.items()):
            if f == home or f in allow:
                continue
            m = rx.search(text)
            if m:
                errors.append("%s:%d: restates \"%s\", defined in %s: cite it there instead" %
                              (f, text.count("\n", 0, m.start()) + 1, name, home))


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    c = Checker(root)
    n = 0
    files = repo_files(root)
    for f in files:
        if not is_text(f) or f in SELF:
            continue
        text = read(root, f)
        if text is None:
            continue
        n += 1
        if f.endswith(".md"):
            c.check_markdown(f, text)
        c.check_citations(f, text)
    check_facts(root, files, c.errors)
    for e in c.errors:
        print(e)
    print("linkcheck: %d files, %s" % (n, "%d broken" % len(c.errors) if c.errors else "all resolve"),
          file=sys.stderr)
    return 1 if c.errors else 0


if __name__ == "__main__":
    sys.exit(main())
