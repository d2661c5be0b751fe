#!/usr/bin/env python3
"""The PyTorch baseline of `make bench-torch`: the bench model (or a real config, --config) in
PyTorch, timed beside streambp in the same run.

With Hugging Face transformers importable (`make bench-torch` makes a venv from PyPI with torch
2.x and transformers 4.51.3), the model is a LlamaForCausalLM built from data/models/bench.json
(Llama-style: hidden 512, 8 query / 4 key-value heads of 64, SwiGLU 1408, 4 layers, untied
vocabulary 32000), float32, timed two ways: "hf-sdpa" (the sdpa attention, plain autograd) and
"hf-ckpt" (the same with gradient_checkpointing_enable()). Without transformers (Debian's torch
1.13), the same model written by hand as HF's eager path computes it: "torch" and "torch-ckpt"
(torch.utils.checkpoint around every layer). Every (T, threads, mode) runs in a fresh process, so
its peak RSS is its own; a step is zero_grad + forward (labels = input ids) + backward, B = 1.
Each point is --rounds paired rounds: a round times one step of each side after a warm-up step
(streambp: `streambp bench --csv --warmup 1 --reps 1`, fast numerics, full and stream each in a
process of its own, which also gives its peak RSS), the two sides run
back to back with their order alternating, and the verdict is the median of the rounds' time
ratios: this VM's speed drifts by 20-30% within an hour, and only pairing cancels that.

--config FILE (repeatable) benchmarks a HF config.json instead of the bench model, e.g.
data/configs/qwen3-0.6b.json: random weights on both sides (HF's from_config, `streambp bench
--config`), transformers required. Both sides then report two steps: "cold", the first step of a
fresh process (what `streambp grad`, `verify` and an audit run: every buffer touched for the
first time), and "warm", the step after it; each is compared with the other side's step of the
same kind. Cold and warm come from separate streambp processes (`--warmup 0 --reps 1` and
`--warmup 1 --reps 1`) and from one HF process (its first and second step).

--avx2 forces the AVX2 path on both sides (`make bench-torch BUILD=build-avx2 ARCH=x86-64-v3`
passes it): streambp is to be a build without AVX-512 instructions (checked with objdump where it
is installed) and runs OpenBLAS's Haswell kernels for its sgemm rate; torch runs with
ATEN_CPU_CAPABILITY=avx2, MKL_ENABLE_INSTRUCTIONS=AVX2 and ONEDNN_MAX_CPU_ISA=AVX2 — what a CPU
without AVX-512 (AMD Zen 2/3) gives each. The header names the path ("path: avx2" or "native").

Usage: python3 bench/torch_bench.py [--streambp build/streambp] [--seq 2048 8192]
    [--threads 1 2] [--rounds 3] [--avx2] [--config FILE ...]
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


BENCH_JSON = os.path.join(HERE, "..", "data", "models", "bench.json")


def hf_model(config_path):
    """HF's model of a config.json, float32, sdpa attention, random weights; and its V."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(config_path) as f:
        cfg = json.load(f)
    kind = cfg.pop("model_type")
    cfg.pop("torch_dtype", None)
    config = AutoConfig.for_model(kind, **cfg)
    config.use_cache = False
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                             torch_dtype=torch.float32)
    model.train()
    return model, config.vocab_size


def hf_step_child(T, mode, threads, reps, config_path):
    """HF transformers: the model of config_path, sdpa attention (and checkpointing); the first
    step (cold) and the median of the `reps` after it (warm)."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, V = hf_model(config_path)
    if mode == "hf-ckpt":
        model.gradient_checkpointing_enable()
    ids = torch.randint(1, V, (1, T))
    times, cold = [], None
    for i in range(reps + 1):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        if i:
            times.append(time.perf_counter() - t0)
        else:
            cold = time.perf_counter() - t0
    times.sort()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    import transformers
    print(json.dumps({"T": T, "mode": mode, "median_s": times[len(times) // 2], "runs": reps,
                      "cold_s": cold,
                      "rss_bytes": rss, "torch": torch.__version__,
                      "transformers": transformers.__version__,
                      "cpu_capability": torch.backends.cpu.get_cpu_capability()}))


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


def have_transformers():
    try:
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


def ours_step(a, threads, T, config, s, warmup):
    """streambp bench's row of one schedule in a process of its own."""
    cmd = [a.streambp, "bench", "--csv", "--threads", str(threads), "--warmup", str(warmup),
           "--reps", "1", "--seq", str(T), "--numerics", "fast", "--no-train", "--schedules", s]
    if config != BENCH_JSON:
        cmd += ["--config", config]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
    return dict(zip(out[0].split(","), out[1].split(",")))


def pct_peak(row):
    """The step's share of the vector FMA peak (streambp bench's pct_fma_peak), NaN where the
    build has none or the binary predates the column."""
    v = row.get("pct_fma_peak", "")
    return float(v) if v else math.nan


def ours(a, threads, T, config):
    """One round of streambp at one T: {schedule: row}. Each schedule in a process of its own, a
    warm-up step then one timed step, as the other side gets: in one process a step after
    another schedule's finds the pool's pages laid out for that one. With a real config, another
    process times the cold step (the first of its process) too."""
    rows = {}
    for s in ("full", "stream"):
        r = ours_step(a, threads, T, config, s, 1)
        rows[s] = {"median_s": float(r["median_s"]), "rss_bytes": int(r["rss_bytes"]),
                   "pct_sgemm": float(r["pct_sgemm"]), "pct_peak": pct_peak(r)}
        if config != BENCH_JSON:
            c = ours_step(a, threads, T, config, s, 0)
            rows[s]["cold_s"] = float(c["median_s"])
            rows[s]["cold_pct_sgemm"] = float(c["pct_sgemm"])
            rows[s]["cold_pct_peak"] = pct_peak(c)
    return rows


def theirs(a, threads, T, mode, config):
    """One round of HF (or the hand-written model) at one T: a fresh process, a warm-up step,
    then one timed step; None when it failed."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, __file__, "--child", str(T), mode, "--threads",
                        str(threads), "--reps", "1", "--config", config], capture_output=True,
                       text=True, env=env)
    if r.returncode != 0:
        print("%7d %-16s failed: %s" % (T, mode, r.stderr.strip().splitlines()[-1:]))
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def sgemm_rate(a, threads, config):
    cmd = [a.streambp, "bench", "--seq", "16", "--reps", "1", "--threads", str(threads),
           "--schedules", "stream", "--numerics", "fast", "--no-train", "--json"]
    if config != BENCH_JSON:
        cmd += ["--config", config]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["sgemm_gflops"]


def avx512_check(a):
    """The path's name for the header; with --avx2, a streambp binary holding AVX-512
    instructions (zmm registers) is refused."""
    if not a.avx2:
        return "native (streambp and torch on the machine's widest vectors)"
    try:
        dis = subprocess.run(["objdump", "-d", a.streambp], capture_output=True, text=True).stdout
    except OSError:
        dis = None
    if dis is not None and "zmm" in dis:
        sys.exit("torch_bench.py --avx2: %s holds AVX-512 instructions; build it with "
                 "ARCH=x86-64-v3 (make bench-torch BUILD=build-avx2 ARCH=x86-64-v3)" % a.streambp)
    return ("avx2 (streambp without AVX-512%s, OpenBLAS %s; torch ATEN_CPU_CAPABILITY=avx2, "
            "MKL_ENABLE_INSTRUCTIONS=AVX2, ONEDNN_MAX_CPU_ISA=AVX2)"
            % ("" if dis is not None else " (objdump missing: unchecked)",
               os.environ["OPENBLAS_CORETYPE"]))


def table(a, config, threads, modes, caps):
    """One table: every T at one thread count, paired rounds; with a real config, a cold row
    beside every warm one."""
    cold = config != BENCH_JSON
    print("\n%d thread%s; OpenBLAS sgemm at the start: %.1f GFLOP/s" % (
        threads, "s" if threads > 1 else "", sgemm_rate(a, threads, config)))
    print("%7s %-22s %10s %10s  %s" % ("T", "run", "median s", "RSS MiB",
                                       "their time / ours [min, max], RSS ours / theirs"))
    for T in a.seq:
        mine, them = [], {m: [] for m in modes}
        for k in range(a.rounds):
            if k % 2 == 0:
                mine.append(ours(a, threads, T, config))
            for m in modes:
                them[m].append(theirs(a, threads, T, m, config))
            if k % 2 == 1:
                mine.append(ours(a, threads, T, config))
        kinds = (("median_s", "pct_sgemm", "pct_peak", ""),
                 ("cold_s", "cold_pct_sgemm", "cold_pct_peak", " cold")) if cold \
            else (("median_s", "pct_sgemm", "pct_peak", ""),)
        for key, pct, peak, tag in kinds:
            for s in ("full", "stream"):
                of_peak = median([r[s][peak] for r in mine])
                print("%7d %-22s %10.3f %10.1f  %.0f%% of sgemm%s" % (
                    T, "streambp " + s + tag, median([r[s][key] for r in mine]),
                    max(r[s]["rss_bytes"] for r in mine) / 2**20,
                    median([r[s][pct] for r in mine]),
                    "" if math.isnan(of_peak) else ", %.0f%% of the FMA peak" % of_peak))
            for m in modes:
                s = "stream" if m.endswith("ckpt") else "full"
                pairs = [(t, o) for t, o in zip(them[m], mine) if t]
                caps.update(t.get("cpu_capability", "?") for t, _ in pairs)
                if not pairs:
                    continue
                ratios = [t[key] / o[s][key] for t, o in pairs]
                rss_t = max(t["rss_bytes"] for t, _ in pairs)
                rss_o = max(o[s]["rss_bytes"] for _, o in pairs)
                print("%7d %-22s %10.3f %10.1f  %.2fx [%.2f, %.2f] of %s, RSS %.0f%%" % (
                    T, m + tag, median([t[key] for t, _ in pairs]), rss_t / 2**20,
                    median(ratios), min(ratios), max(ratios), s + tag, 100.0 * rss_o / rss_t))
        sys.stdout.flush()


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streambp", default=os.path.join(HERE, "..", "build", "streambp"))
    ap.add_argument("--seq", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--avx2", action="store_true",
                    help="both sides on AVX2 kernels (streambp: a build without AVX-512)")
    ap.add_argument("--config", action="append",
                    help="a HF config.json instead of the bench model (repeatable)")
    ap.add_argument("--reps", type=int, default=3, help=argparse.SUPPRESS)  # the children's
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        T, mode = int(a.child[0]), a.child[1]
        if mode.startswith("hf"):
            hf_step_child(T, mode, a.threads[0], a.reps, (a.config or [BENCH_JSON])[0])
        else:
            step_child(T, mode, a.threads[0], a.reps)
        return 0
    if a.avx2:  # inherited by every child process, streambp's and torch's
        os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
        os.environ.update(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2",
                          ONEDNN_MAX_CPU_ISA="AVX2")
    path = avx512_check(a)
    try:
        import torch
    except ImportError:
        print("torch_bench.py: PyTorch is not importable; nothing to compare", file=sys.stderr)
        return 2
    hf = have_transformers()
    configs = [os.path.abspath(c) for c in a.config] if a.config else [BENCH_JSON]
    if a.config and not hf:
        print("torch_bench.py: --config needs HF transformers", file=sys.stderr)
        return 2
    modes = ("hf-sdpa", "hf-ckpt") if hf else ("torch", "torch-ckpt")
    versions = "torch %s%s" % (torch.__version__, ", transformers " + __import__(
        "transformers").__version__ if hf else " (no transformers: HF's eager path by hand)")
    print("step = forward + backward, float32, B = 1, each side in fresh processes, one warm-up "
          "step then one timed step per round; %d paired rounds per point, the order of the "
          "two sides alternating; time: median over rounds; ratio: median [min, max] of the "
          "rounds' ratios (> 1: streambp faster); RSS: peak of the process, largest over "
          "rounds; %s" % (a.rounds, versions))
    print("path: %s" % path)
    caps = set()  # torch's CPU capability as its children report it
    for config in configs:
        if config != BENCH_JSON:
            print("\nmodel: %s (random weights)" % os.path.relpath(config))
        for threads in a.threads:
            table(a, config, threads, modes, caps)
    print("\ntorch's CPU capability in its processes: %s" % ", ".join(sorted(caps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
