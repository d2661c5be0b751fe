#!/usr/bin/env python3
"""The PyTorch baseline of `make bench-torch`: the bench model in plain PyTorch, timed beside
streambp.

The model is data/models/bench.json (Llama-style: hidden 512, 8 query / 4 key-value heads of 64,
SwiGLU 1408, 4 layers, untied vocabulary 32000), written the way HF's eager code path computes
it: RMSNorm, rotate-half RoPE, GQA by repeat_interleave, softmax over a masked T x T score matrix
(torch 1.13 has no scaled_dot_product_attention), cross-entropy over materialised T x V logits.
Two modes: plain autograd ("torch"), and torch.utils.checkpoint around every decoder layer
("torch-ckpt"). Each (T, mode) runs in a fresh process, so its peak RSS is its own; the step is
zero_grad + forward + backward, float32, B = 1, median of --reps steps after one warm-up.
streambp's numbers for the same T come from `streambp bench --csv` in the same run.

Usage (Debian's python3-torch; optional): /usr/bin/python3 verify/torch_bench.py
    [--streambp build/streambp] [--seq 512 1024 2048] [--threads 2] [--reps 3]
"""
import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def step_child(T, mode, threads, reps):
    """Runs in a fresh interpreter: times the steps and prints one JSON line."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = json.load(open(os.path.join(HERE, "..", "data", "models", "bench.json")))
    C, Fd, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    NH, NKV, HD, V = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                      cfg["vocab_size"])
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]

    def p(*shape):
        return (torch.randn(*shape) * 0.02).requires_grad_()

    emb, head = p(V, C), p(V, C)
    layers = [dict(wq=p(NH * HD, C), wk=p(NKV * HD, C), wv=p(NKV * HD, C), wo=p(C, NH * HD),
                   wg=p(Fd, C), wu=p(Fd, C), wd=p(C, Fd),
                   n1=torch.ones(C, requires_grad=True), n2=torch.ones(C, requires_grad=True))
              for _ in range(L)]
    norm = torch.ones(C, requires_grad=True)
    params = [emb, head, norm] + [t for lw in layers for t in lw.values()]
    inv = 1.0 / theta ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
    causal = torch.full((T, T), float("-inf")).triu(1)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(x):  # [T, H, HD]
        a, b = x[..., :HD // 2], x[..., HD // 2:]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat([a * c - b * s, b * c + a * s], -1)

    def layer(x, wq, wk, wv, wo, wg, wu, wd, n1, n2):
        xn = rms(x, n1)
        q = rope((xn @ wq.t()).view(T, NH, HD)).transpose(0, 1)
        k = rope((xn @ wk.t()).view(T, NKV, HD)).transpose(0, 1).repeat_interleave(NH // NKV, 0)
        v = (xn @ wv.t()).view(T, NKV, HD).transpose(0, 1).repeat_interleave(NH // NKV, 0)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(HD) + causal, -1)
        x = x + (att @ v).transpose(0, 1).reshape(T, NH * HD) @ wo.t()
        xn2 = rms(x, n2)
        return x + (F.silu(xn2 @ wg.t()) * (xn2 @ wu.t())) @ wd.t()

    ids = torch.randint(1, V, (T,))
    times = []
    for i in range(reps + 1):
        for t in params:
            t.grad = None
        t0 = time.perf_counter()
        x = emb[ids]
        for lw in layers:
            args = [lw[k] for k in ("wq", "wk", "wv", "wo", "wg", "wu", "wd", "n1", "n2")]
            x = checkpoint(layer, x, *args) if mode == "torch-ckpt" else layer(x, *args)
        logits = rms(x, norm) @ head.t()
        loss = F.cross_entropy(logits[:-1], ids[1:])
        loss.backward()
        if i:
            times.append(time.perf_counter() - t0)
    times.sort()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"T": T, "mode": mode, "median_s": times[len(times) // 2], "runs": reps,
                      "rss_bytes": rss, "torch": torch.__version__}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streambp", default=os.path.join(HERE, "..", "build", "streambp"))
    ap.add_argument("--seq", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        step_child(int(a.child[0]), a.child[1], a.threads, a.reps)
        return 0
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch_bench.py: PyTorch is not importable (python3-torch); nothing to compare",
              file=sys.stderr)
        return 2
    ours = {}
    cmd = [a.streambp, "bench", "--csv", "--threads", str(a.threads), "--reps", str(a.reps)]
    for T in a.seq:
        cmd += ["--seq", str(T)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
    head = out[0].split(",")
    for line in out[1:]:
        row = dict(zip(head, line.split(",")))
        ours[(int(row["T"]), row["schedule"])] = row
    print("step = forward + backward, float32, B = 1, %d threads; median of %d steps; peak RSS "
          "of a process that ran only that point" % (a.threads, a.reps))
    print("%7s %-16s %10s %10s  %s" % ("T", "run", "median s", "RSS MiB",
                                       "torch / streambp (full, or ckpt for torch-ckpt)"))
    for T in a.seq:
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
        rows = []
        for mode in ("torch", "torch-ckpt"):
            r = subprocess.run([sys.executable, __file__, "--child", str(T), mode, "--threads",
                                str(a.threads), "--reps", str(a.reps)], capture_output=True,
                               text=True, env=env)
            if r.returncode != 0:
                print("%7d %-16s failed: %s" % (T, mode, r.stderr.strip().splitlines()[-1:]))
                continue
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        for s in ("full", "ckpt", "stream"):
            o = ours.get((T, s))
            if o:
                print("%7d %-16s %10.3f %10.1f" % (T, "streambp " + s, float(o["median_s"]),
                                                   int(o["rss_bytes"]) / 2**20))
        for row in rows:
            base = ours.get((T, "full" if row["mode"] == "torch" else "ckpt"))
            ratio = ("%.2fx time, %.2fx RSS" % (row["median_s"] / float(base["median_s"]),
                                                 row["rss_bytes"] / float(base["rss_bytes"]))
                     if base else "")
            print("%7d %-16s %10.3f %10.1f  %s" % (T, row["mode"], row["median_s"],
                                                   row["rss_bytes"] / 2**20, ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main())
