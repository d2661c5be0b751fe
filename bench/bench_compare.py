#!/usr/bin/env python3
"""Two builds of streambp timed against each other in one run, in interleaved rounds.

    bench/bench_compare.py OLD_BIN NEW_BIN [--seq T] [--rounds N] [--reps R] [--threads N]
                            [--schedules L]

Round k runs `bench --reps R` of the old binary, then of the new one (the order alternates from
round to round), each in a process of its own, so that a drift of the machine's speed touches
both alike. Each round gives one ratio per schedule (new's median step over old's, both taken
minutes apart at most); the verdict is the median of those ratios, printed with their quartiles.
Paired ratios, not the ratio of two medians: on a shared VM the speed of the machine drifts by
10-20% within an hour, and only the pairing cancels that. The
speed of one build is only ever compared with another measured in the same run
(docs/performance.md). Used for the fast mode's no-regression check: `make bench-compare OLD=<rev>`.
"""
import argparse
import csv
import io
import json
import os
import statistics
import subprocess
import sys


def options(binary):
    """Older builds lack --numerics (fast was all there was), --no-train and --warmup."""
    help_text = subprocess.run([binary, "bench", "--help"], capture_output=True, text=True).stdout
    return [o for o in (["--numerics", "fast"], ["--no-train"], ["--warmup", "1"])
            if o[0] in help_text]


def common_options(old, new):
    """The options both builds take: a warm-up step before the timed ones only when both do one
    (without --warmup, bench times a cold first step above T = 4096)."""
    theirs = options(old)
    return [o for o in options(new) if o in theirs]


def same_kernels(new):
    """OpenBLAS 0.3.21 takes newer CPUs for Prescott (generic SSE3 kernels, ~6x slower); newer
    builds set OPENBLAS_CORETYPE themselves (src/cli/main.c), older ones did not. Both builds get
    the kernels the new one runs with, so the comparison is of our code, not of OpenBLAS's
    choice."""
    if os.environ.get("OPENBLAS_CORETYPE"):
        return os.environ["OPENBLAS_CORETYPE"]
    out = subprocess.run([new, "bench", "--seq", "16", "--reps", "1", "--schedules", "stream",
                          "--json"] + sum(options(new), []), capture_output=True, text=True).stdout
    try:
        core = json.loads(out).get("blas_kernels")
    except ValueError:
        core = None
    if core:
        os.environ["OPENBLAS_CORETYPE"] = core
    return core or "OpenBLAS's own choice"


def one(binary, args):
    cmd = [binary, "bench", "--seq", str(args.seq), "--reps", str(args.reps),
           "--threads", str(args.threads), "--schedules", args.schedules, "--csv"] + args.common
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    return {r["schedule"]: float(r["median_s"]) for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="timed steps per process (bench --reps)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--schedules", default="full,ckpt,stream")
    args = ap.parse_args()
    args.common = sum(common_options(args.old, args.new), [])
    kernels = same_kernels(args.new)
    times = {"old": {}, "new": {}}
    ratios = {}
    for k in range(args.rounds):
        order = ("old", "new") if k % 2 == 0 else ("new", "old")
        got = {which: one(getattr(args, which), args) for which in order}
        for which in order:
            for s, v in got[which].items():
                times[which].setdefault(s, []).append(v)
        for s in got["old"]:
            ratios.setdefault(s, []).append(got["new"][s] / got["old"][s])
        print("round %d/%d: %s" % (k + 1, args.rounds, " ".join(
            "%s %.3f" % (s, r[-1]) for s, r in ratios.items())), file=sys.stderr)
    print("T = %d, %d threads, %d interleaved rounds of %d steps, fast numerics, OpenBLAS kernels "
          "%s; medians in seconds; new/old: the median of the rounds' ratios [quartiles]"
          % (args.seq, args.threads, args.rounds, args.reps, kernels))
    print("%-10s %10s %10s %10s   %s" % ("schedule", "old", "new", "new/old", "quartiles"))
    worst = 0.0
    for s in times["old"]:
        o, n = statistics.median(times["old"][s]), statistics.median(times["new"][s])
        r = ratios[s]
        q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0], r[0], r[0]]
        worst = max(worst, statistics.median(r))
        print("%-10s %10.3f %10.3f %10.3f   [%.3f, %.3f]" % (s, o, n, statistics.median(r), q[0],
                                                            q[2]))
    print("worst ratio %.3f (%s)" % (worst, "within 3%" if worst <= 1.03 else "SLOWER by more than 3%"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
