"""The accuracy table over several draws: ours and torch float32's per-tensor error against the
float64 truth, for seeds S = 1 .. N of the measuring models' weights and tokens
(docs/accuracy.md, "Over several draws").

    build/torch-venv/bin/python python/tests/accuracy_seeds.py --seeds 8 --seq 512,4096 \
        [--wide] [--family qwen3,...] [--rope64] [--threads 2] [--accuracy build/accuracy] \
        --out FILE

One draw's error of a tensor moves by ±20% with any change of rounding (a 32-element norm weight
most), so one draw's largest ratio ours / torch over a family's tensors is the largest of many
noisy ratios. Over N draws each tensor's error is summarised by its root mean square, and the
ratio of those says whether a tensor is systematically worse than torch's or only in one draw.
For each seed: `build/accuracy --write-models DIR --seed S`, `accuracy_torch.py DIR --seed S`
(in this interpreter: run it with the HF venv's), `build/accuracy --all --seed S --torch F`.

FILE gets every draw's rows ("seed family T name fast portable torch"), then the summary that
is also printed: per family and T, the largest and the median over tensors of the RMS ratio,
the tensors whose RMS ratio exceeds 1.0, and for comparison the largest single-draw ratio.
Needs torch and transformers (the HF venv); not part of CI.
"""
import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_rows(text, seed):
    """build/accuracy --all --torch's rows: (seed, family, T, name, fast, portable, torch)."""
    rows = []
    for line in text.splitlines():
        p = line.split()
        if len(p) != 8 or p[0] in ("family", "#"):
            continue
        try:
            rows.append((seed, p[0], int(p[1]), p[2], float(p[3]), float(p[4]), float(p[5])))
        except ValueError:
            raise SystemExit("accuracy_seeds: cannot read the row %r" % line)
    if not rows:
        raise SystemExit("accuracy_seeds: build/accuracy printed no row with a torch error")
    return rows


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        raise SystemExit("accuracy_seeds: %s failed (%d):\n%s" % (cmd[0], r.returncode, r.stderr))
    return r.stdout


def draw(a, seed, work):
    """One draw's rows: the models of this seed, torch's errors on them, then ours."""
    models = os.path.join(work, "models-%d" % seed)
    wide = ["--wide"] if a.wide else []
    run([a.accuracy, "--write-models", models, "--seed", str(seed)] + wide)
    tfile = os.path.join(work, "torch-%d.txt" % seed)
    run([sys.executable, os.path.join(HERE, "accuracy_torch.py"), models, "--seq", a.seq,
         "--family", a.family, "--threads", str(a.threads), "--seed", str(seed), "--out", tfile]
        + (["--rope64"] if a.rope64 else []))
    out = run([a.accuracy, "--seq", a.seq, "--family", a.family, "--threads", str(a.threads),
               "--all", "--seed", str(seed), "--torch", tfile] + wide)
    shutil.rmtree(models)
    return parse_rows(out, seed)


def cpu_name():
    """The CPU's model name as lscpu shows it (the table's machine), or "unknown"."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def rms(xs):
    return math.sqrt(sum(x * x for x in xs) / len(xs))


def summary(rows, nseeds):
    """Per (family, T): the RMS ratios' largest, median and excess, and one draw's largest."""
    by = {}
    for s, fam, T, name, f, p, t in rows:
        by.setdefault((fam, T), {}).setdefault(name, []).append((f, p, t))
    lines = ["# %d draws; RMS ratio = sqrt(mean ours^2) / sqrt(mean torch^2) over the draws"
             % nseeds,
             "%-7s %6s %3s | %-44s %6s %6s %5s %6s | %-44s %6s %6s %5s %6s" % (
                 "family", "T", "n", "fast: worst tensor", "rms", "med", ">1.0", "1draw",
                 "portable: worst tensor", "rms", "med", ">1.0", "1draw")]
    for (fam, T), tensors in by.items():
        cells = []
        for k in (0, 1):
            ratio = {n: rms([e[k] for e in es]) / rms([e[2] for e in es])
                     for n, es in tensors.items()}
            one = max(e[k] / e[2] for es in tensors.values() for e in es)
            worst = max(ratio, key=ratio.get)
            cells.append("%-44s %6.2f %6.2f %5d %6.2f" % (
                worst, ratio[worst], statistics.median(ratio.values()),
                sum(r > 1.0 for r in ratio.values()), one))
        counts = {len(es) for es in tensors.values()}
        if counts != {nseeds}:
            raise SystemExit("accuracy_seeds: %s T = %d: a tensor is missing from a draw" % (fam, T))
        lines.append("%-7s %6d %3d | %s | %s" % (fam, T, len(tensors), cells[0], cells[1]))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=8, help="draws: seeds 1 .. N (default 8)")
    ap.add_argument("--seq", default="512,4096")
    ap.add_argument("--family", default="qwen3,qwen2,llama3,gemma3")
    ap.add_argument("--wide", action="store_true", help="a real model's widths (bench/accuracy.h)")
    ap.add_argument("--rope64", action="store_true",
                    help="torch float32 with float64 rotary tables (accuracy_torch.py)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--accuracy", default="build/accuracy", help="the C tool (make accuracy)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if not 1 <= a.seeds <= 1000:
        ap.error("--seeds: 1 .. 1000")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    # everything written under a fresh directory of ours, the result renamed into place complete
    work = tempfile.mkdtemp(prefix="streambp-accuracy-seeds-")
    fd, tmp = tempfile.mkstemp(prefix=".accuracy-seeds-", dir=os.path.dirname(os.path.abspath(a.out)))
    try:
        rows = []
        for seed in range(1, a.seeds + 1):
            rows += draw(a, seed, work)
            print("accuracy_seeds: seed %d done" % seed, file=sys.stderr, flush=True)
        text = summary(rows, a.seeds)
        with os.fdopen(fd, "w") as out:
            out.write("# %s; %s; cpu: %s\n" % (" ".join(sys.argv), started, cpu_name()))
            out.write("# seed family T tensor fast portable torch\n")
            for r in rows:
                out.write("%d %s %d %s %.6e %.6e %.6e\n" % r)
            out.write(text)
        os.replace(tmp, a.out)
        sys.stdout.write(text)
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
