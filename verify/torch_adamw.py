#!/usr/bin/python3
"""Cross-check of `streambp train`'s optimizer against torch.optim.AdamW, in float64.

Runs `streambp train --precision fp64` with a checkpoint after every step, takes each step's
gradient from `streambp grad` at the checkpointed weights (the engine is deterministic, so it is
the gradient the step used), and replays the step in PyTorch:

    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    torch.optim.AdamW(param groups, lr, betas, eps, weight_decay).step()
    lr of step k = peak lr * lr_lambda(k), transformers' get_{cosine,linear,constant}_schedule_
    with_warmup formulas (copied below; transformers need not be installed)

and compares, per step, the learning rate (bit for bit), the gradient norm, the weights and both
moments with streambp's checkpoint; then runs PyTorch's optimizer alone through every step from
the initial weights (fed the same gradients) and compares the final weights. Two runs: a single
AdamW step (no warm-up, no clipping), and five steps with warm-up, cosine decay, clipping,
gradient accumulation and HF's no-decay group for norms and biases. Passes when every
difference is at most 1e-12 (absolute; the weights are O(0.1..1)).

usage: verify/torch_adamw.py [--streambp build/streambp] [--workdir DIR] [--keep]
Exit status: 0 pass, 1 a difference above the bound, 2 a command failed.
"""
import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_grads import read_safetensors  # noqa: E402 (the same directory)

BOUND = 1e-12
BATCHES = ["data/batches/sft-tiny.safetensors", "data/batches/sft-demo.safetensors"]


def lr_lambda(kind, step, warmup, total):
    """transformers.optimization: the LambdaLR factors (num_cycles = 0.5 for cosine)."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    if kind == "constant":
        return 1.0
    if kind == "linear":
        return max(0.0, float(total - step) / float(max(1, total - warmup)))
    progress = float(step - warmup) / float(max(1, total - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(0.5) * 2.0 * progress)))


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.stderr.write("command failed (%d): %s\n%s%s" % (r.returncode, " ".join(cmd), r.stdout,
                                                             r.stderr))
        sys.exit(2)
    return r.stdout


def tensors(path):
    return read_safetensors(path)[1]


def is_no_decay(name):
    """HF Trainer's groups: biases and norm weights are not decayed."""
    return name.endswith(".bias") or "norm" in name


def check(args, work, label, opts):
    """One training run, checked step by step and as a whole trajectory."""
    model = os.path.join(work, "model")
    out = os.path.join(work, "run-" + label)
    steps, accum = opts["steps"], opts["grad_accum"]
    cmd = [args.streambp, "train", "--model", model, "--out", out, "--precision", "fp64",
           "--steps", str(steps), "--save-every", "1", "--lr", repr(opts["lr"]),
           "--lr-scheduler", opts["sched"], "--warmup-steps", str(opts["warmup"]),
           "--weight-decay", repr(opts["wd"]), "--max-grad-norm", repr(opts["max_norm"]),
           "--beta1", repr(opts["betas"][0]), "--beta2", repr(opts["betas"][1]),
           "--eps", repr(opts["eps"]), "--grad-accum", str(accum), "--block", "8",
           "--threads", "1"]
    for b in BATCHES:
        cmd += ["--data", b]
    if opts["no_decay_nb"]:
        cmd.append("--no-decay-norms-biases")
    run(cmd)
    rows = [line.split(",") for line in open(os.path.join(out, "loss.csv")).read().splitlines()[1:]]
    assert len(rows) == steps, "loss.csv has %d rows, expected %d" % (len(rows), steps)

    names = list(tensors(os.path.join(model, "model.safetensors")).keys())
    w0 = tensors(os.path.join(model, "model.safetensors"))
    worst = {"lr": 0.0, "grad_norm": 0.0, "weights": 0.0, "exp_avg": 0.0, "exp_avg_sq": 0.0,
             "trajectory": 0.0}

    def make_optimizer(params):
        decay = [p for n, p in zip(names, params) if not (opts["no_decay_nb"] and is_no_decay(n))]
        nodecay = [p for n, p in zip(names, params) if opts["no_decay_nb"] and is_no_decay(n)]
        groups = [{"params": decay}]
        if nodecay:
            groups.append({"params": nodecay, "weight_decay": 0.0})
        return torch.optim.AdamW(groups, lr=opts["lr"], betas=opts["betas"], eps=opts["eps"],
                                 weight_decay=opts["wd"])

    traj = [torch.tensor(w0[n], dtype=torch.float64) for n in names]
    traj_opt = make_optimizer(traj)
    item = 0
    for k in range(1, steps + 1):
        prev = model if k == 1 else os.path.join(out, "checkpoint-%d" % (k - 1))
        files = []
        for _ in range(accum):  # files in the given order, epochs cycled
            files.append(BATCHES[item % len(BATCHES)])
            item += 1
        gpath = os.path.join(work, "grad-%s-%d.safetensors" % (label, k))
        gcmd = [args.streambp, "grad", "--model", prev, "--precision", "fp64", "--block", "8",
                "--threads", "1", "--out", gpath]
        for f in files:
            gcmd += ["--batch", f]
        run(gcmd)
        g = tensors(gpath)
        wprev = tensors(os.path.join(prev, "model.safetensors"))
        ours = tensors(os.path.join(out, "checkpoint-%d" % k, "model.safetensors"))
        moments = tensors(os.path.join(out, "checkpoint-%d" % k, "optimizer.safetensors"))

        lr = opts["lr"] * lr_lambda(opts["sched"], k - 1, opts["warmup"], steps)
        worst["lr"] = max(worst["lr"], abs(float(rows[k - 1][3]) - lr))

        # one step from streambp's state at k-1
        params = [torch.tensor(wprev[n], dtype=torch.float64) for n in names]
        for p, n in zip(params, names):
            p.grad = torch.tensor(g[n], dtype=torch.float64)
        opt = make_optimizer(params)
        if k > 1:
            before = tensors(os.path.join(prev, "optimizer.safetensors"))
            for p, n in zip(params, names):
                opt.state[p] = {"step": torch.tensor(float(k - 1)),
                                "exp_avg": torch.tensor(before[n + ".exp_avg"]),
                                "exp_avg_sq": torch.tensor(before[n + ".exp_avg_sq"])}
        for group in opt.param_groups:
            group["lr"] = lr
        if opts["max_norm"] > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, opts["max_norm"]))
        else:
            norm = float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad) for p in params])))
        worst["grad_norm"] = max(worst["grad_norm"], abs(float(rows[k - 1][4]) - norm))
        opt.step()
        for p, n in zip(params, names):
            st = opt.state[p]
            worst["weights"] = max(worst["weights"], float(np.max(np.abs(p.detach().numpy() - ours[n]))))
            worst["exp_avg"] = max(worst["exp_avg"], float(np.max(np.abs(
                st["exp_avg"].numpy() - moments[n + ".exp_avg"]))))
            worst["exp_avg_sq"] = max(worst["exp_avg_sq"], float(np.max(np.abs(
                st["exp_avg_sq"].numpy() - moments[n + ".exp_avg_sq"]))))

        # PyTorch's own trajectory, fed the same gradients
        for p, n in zip(traj, names):
            p.grad = torch.tensor(g[n], dtype=torch.float64)
        for group in traj_opt.param_groups:
            group["lr"] = lr
        if opts["max_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(traj, opts["max_norm"])
        traj_opt.step()

    final = tensors(os.path.join(out, "model.safetensors"))
    worst["trajectory"] = max(float(np.max(np.abs(p.detach().numpy() - final[n])))
                              for p, n in zip(traj, names))
    ok = all(v <= BOUND for v in worst.values())
    print("%-28s %s" % (label, "  ".join("%s %.2e" % kv for kv in worst.items())))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streambp", default="build/streambp")
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="torch-adamw-")
    os.makedirs(work, exist_ok=True)
    run([args.streambp, "init", "--config", "data/models/qwen2-tiny.json", "--seed", "5", "--out",
         os.path.join(work, "model")])
    print("torch %s; streambp train vs torch.optim.AdamW, float64, max |difference| per quantity "
          "(bound %.0e):" % (torch.__version__, BOUND))
    ok = check(args, work, "one step", dict(steps=1, grad_accum=1, lr=1e-3, sched="constant",
                                            warmup=0, wd=0.01, max_norm=0.0, betas=(0.9, 0.999),
                                            eps=1e-8, no_decay_nb=False))
    ok &= check(args, work, "5 steps, clip, warm-up+cos", dict(
        steps=5, grad_accum=2, lr=2e-2, sched="cosine", warmup=2, wd=0.1, max_norm=0.5,
        betas=(0.8, 0.95), eps=1e-6, no_decay_nb=True))
    if not args.keep and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    print("PASS" if ok else "FAIL: a difference above %.0e" % BOUND)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
