#!/usr/bin/env python3
"""seq_options.py — the cost model behind the sequence-parallel design (docs/distributed.md §8):
what each way of keeping one process's bits costs when S ranks share every sequence of a
stream-schedule training step, in memory, traffic and time. Sequence parallel is not built;
this is the comparison that chose how to build it.

Python 3 standard library only. Memory and traffic are formulas of the HF config's dimensions
(below), the same on every machine. The time column needs the step's shares on one process,
measured by `streambp bench --profile --json` (--profile FILE) or given (--shares), and assumes
perfect thread scaling of the one process it is compared with.

The sums that cross the slices (docs/distributed.md §8) and the rules compared:
  dK/dV of a key, a chain over the query blocks that see it, ascending (docs/numerics.md §4):
    relay      systolic: rank r takes key slice j's accumulator from rank r − 1, slices
               ascending, holding its rows' attention state (q, o, dO, dQ); the last rank's
               critical path is 2S − 1 slice steps;
    key-owner  the key's rank runs the dK/dV pass itself over every later query block in
               order, the query side (q and dO stored, lse and D in float) sent to it; dQ stays
               with the query's rank, so P and dP are formed on both sides (7 products against
               the one-pass backward's 5); the pairs a rank visits are then T·T/S whatever slices
               it holds;
    segments   each G-token segment of queries sums a dK/dV partial of every earlier key from
               +0; the key's rank holds the later segments' partials until they fold in order;
  the weight, bias and norm-weight gradients (the layers'), the head's and the embedding's:
    relay      the accumulator goes rank to rank in token order, as float reals (an unfinished
               sum is never rounded to bf16); a rank keeps its rows' weight-product inputs until
               its turn, so a layer's weight products run one rank after another;
    segments   each G-token segment's gradient is a partial from +0, folded in segment order by
               the owners of the 4096-element blocks as micro-batches are (docs/distributed.md
               §3); one process keeps that partial too (the bits change once, for T > G);
    tree       the segments' partials added in a fixed binary tree over aligned segment ranges:
               at most 2·log2 of a rank's segments leave it, a stack of log2(segments) + 1
               partials stays; one process keeps log2(T/G) + 1.
Zig-zag (rank r holds segments r and 2S − 1 − r of each 2S) balances the causal triangle where T
holds 2S segments; the relay of dK/dV needs contiguous slices.

Columns: one process's memory beyond today's for the same T (the rules that change its bits);
a rank's memory beyond one process's stream step on T/S rows (the earlier keys of a global
layer, which every rule holds, included); the bytes the rank that sends the most sends in a step
(K and V of its rows to the later ranks in the forward and again in the backward's recompute,
included); the slowest rank's step over one process's step on S threads.

Usage: bench/seq_options.py --config FILE --seq T --ranks S[,S...] [--storage bf16|fp32]
       [--segment G] [--profile FILE | --shares attn_fwd=a,attn_bwd=b,dw_layers=c,dw_head=d]
"""
import argparse
import json
import math
import os
import stat
import sys

SHARES = ("attn_fwd", "attn_bwd", "dw_layers", "dw_head", "head_fwd")


def read_json(path, limit=64 << 20):
    """A JSON file that is a regular file of at most limit bytes, its last component not a
    symbolic link (O_NOFOLLOW)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{path}: {st.st_size} bytes, more than {limit}")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        return json.loads(f.read(limit + 1).decode("utf-8"))


def dims(path):
    """The dimensions the model needs, from a HF config.json."""
    c = read_json(path)
    d = {k: int(c[k]) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "vocab_size")}
    C, NH = d["hidden_size"], d["num_attention_heads"]
    HD = int(c.get("head_dim") or C // NH)
    Q, KV, F = NH * HD, d["num_key_value_heads"] * HD, d["intermediate_size"]
    qwen3 = c.get("model_type") == "qwen3"
    bias = c.get("model_type") == "qwen2" or bool(c.get("attention_bias"))
    p_layer = (Q * C + 2 * KV * C + C * Q + 3 * F * C + 2 * C + (2 * HD if qwen3 else 0) +
               ((Q + 2 * KV) if bias else 0))
    return {"C": C, "Q": Q, "KV": KV, "NH": NH, "L": d["num_hidden_layers"],
            "V": d["vocab_size"], "p_layer": p_layer, "tied": bool(c.get("tie_word_embeddings")),
            # what a token feeds one layer's weight products with: their inputs xn, xn2, o and
            # h, and the gradients of their outputs q, k, v, o_proj, gate, up and down
            "a_dw": 2 * C + Q + F + Q + 2 * KV + C + 2 * F + C}


def shares_of_profile(path):
    """The step's shares from `streambp bench --profile --json` (its first row): attention's
    forward and backward ops, and half of every linear_backward (its dW; dX is the other half,
    the same flops), the LM head's (n = V) apart."""
    d = read_json(path)
    row = d["rows"][0]
    prof = row["profile"]
    total = prof["engine_seconds"]
    s = dict.fromkeys(SHARES, 0.0)
    V = max(o.get("n", 0) for o in prof["operations"])
    for o in prof["operations"]:
        if o["op"] == "attention_forward":
            s["attn_fwd"] += o["seconds"] / total
        elif o["op"] == "attention_backward":
            s["attn_bwd"] += o["seconds"] / total
        elif o["op"] == "linear_backward":
            s["dw_head" if o.get("n") == V else "dw_layers"] += o["seconds"] / 2 / total
        elif o["op"] == "linear_forward" and o.get("n") == V:
            s["head_fwd"] += o["seconds"] / total
    return s, f"{row['schedule']}, T = {row['T']}, {d['threads']} thread(s), {path}"


def rules(m, T, S, esz, G, sh):
    """(rule, bits, one process beyond today, rank memory, bytes sent, time or None) for S."""
    R = math.ceil(T / S)  # rows of the rank with the most
    acc = 4               # bytes of an unfinished sum (a float32 build)
    L, KV = m["L"], m["KV"]
    P = m["p_layer"] * acc                                  # one layer's gradient
    ends = m["V"] * m["C"] * acc * (1 if m["tied"] else 2)  # the head's and the embedding's
    qside = 2 * m["Q"] * esz + 2 * m["NH"] * 4
    kv_mem, kv_sent = (T - R) * 2 * KV * esz, 2 * R * 2 * KV * esz * (S - 1)
    nseg = math.ceil(T / G)
    zig = nseg >= 2 * S
    own = math.ceil(nseg / S)  # segments of the rank with the most
    leave = min(own, (2 if zig else 1) * 2 * max(1, math.ceil(math.log2(max(own, 2)))))
    depth = math.ceil(math.log2(nseg)) + 1 if nseg > 1 else 1
    strip = (2 * S - 1) / S ** 2  # the last rank's part of the causal triangle, contiguous
    tag = f"G = {G}, " + ("zig-zag" if zig else "contiguous")

    def time(af, ab, dwl, dwh, hf=1 / S):
        if sh is None:
            return None
        rest = 1 - sum(sh.values())
        return S * (rest / S + af * sh["attn_fwd"] + ab * sh["attn_bwd"] +
                    dwl * sh["dw_layers"] + dwh * sh["dw_head"] + hf * sh["head_fwd"])

    fwd = 1 / S if zig else strip
    # the relays pass through the ranks in token order, which zig-zag over whole token blocks
    # (512) keeps: rank r's second run comes back down the ranks
    zig_r = T >= 2 * S * 512
    fwd_r = 1 / S if zig_r else strip
    relay_mem = R * m["a_dw"] * esz + P  # one layer's weight-product inputs; the accumulator
    ko_mem, ko_sent = R * qside, L * R * qside * (S - 1)
    ko_bwd = 7 / 5 / S
    seg_own = P * (1 + nseg / S)  # the partial in progress; the owners' shares until folded
    # the pipelined relay: rank r runs layer l's weight products r turns after rank 0, working on
    # the layers below meanwhile; it trails by (S − 1)·f layers, f the part of a layer's work
    # that is its weight products (1/4 without shares: the forward twice, dX, dW)
    f = 0.25 if sh is None else sh["dw_layers"] / max(1e-9, 1 - sh["dw_head"])
    kept = 1 + math.ceil((S - 1) * f)
    return [
        ("relay / relay", "no", 0,
         kv_mem + R * 4 * m["Q"] * esz + (T - R) * 2 * KV * acc + relay_mem,
         L * (kv_sent + P + (T - R) * 2 * KV * acc) + ends,
         time(strip, 2 * (2 * S - 1) / S ** 2, 1, 1)),
        ("key-owner / relay" + (" (zig-zag)" if zig_r else ""), "no", 0,
         kv_mem + ko_mem + relay_mem, L * (kv_sent + P) + ko_sent + ends,
         time(fwd_r, ko_bwd, 1, 1)),
        ("key-owner / relay pipelined over layers" + (" (zig-zag)" if zig_r else ""), "no", 0,
         kv_mem + ko_mem + kept * R * m["a_dw"] * esz + 2 * P,
         L * (kv_sent + P) + ko_sent + ends, time(fwd_r, ko_bwd, 1 / S, 1)),
        # the head's and the embedding's gradients by vocabulary rows: rank r forms the logits
        # of its V/S rows for every token again (H gathered, each token's lse and target sent)
        # and sums its rows' gradient over all T tokens in one process's order; the embedding's
        # scatter-add takes the dX rows of the tokens whose ids it owns
        ("key-owner / relay pipelined, head and embedding split by vocabulary" +
         (" (zig-zag)" if zig_r else ""), "no", 0,
         kv_mem + ko_mem + kept * R * m["a_dw"] * esz + 2 * P + (T - R) * m["C"] * (esz + acc),
         L * (kv_sent + P) + ko_sent + R * (m["C"] * esz + 8) * (S - 1) + R * m["C"] * acc,
         time(fwd_r, ko_bwd, 1 / S, 1 / S, 2 / S)),
        (f"key-owner / segments, head and embedding relayed ({tag})", f"T > {G}", P,
         kv_mem + ko_mem + seg_own, L * kv_sent + ko_sent + own * L * P + ends,
         time(fwd, ko_bwd, 1 / S, 1)),
        (f"key-owner / segments ({tag})", f"T > {G}", P + ends,
         kv_mem + ko_mem + seg_own + ends * (1 + nseg / S),
         L * kv_sent + ko_sent + own * (L * P + ends), time(fwd, ko_bwd, 1 / S, 1 / S)),
        (f"key-owner / tree ({tag})", f"T > {G}", (depth - 1) * (P + ends),
         kv_mem + ko_mem + min(depth, own + 1) * (P + ends),
         L * kv_sent + ko_sent + leave * (L * P + ends), time(fwd, ko_bwd, 1 / S, 1 / S)),
        (f"segments / segments ({tag})", f"T > {G}", P + ends + T * 2 * KV * acc,
         kv_mem + T * 2 * KV * acc + (nseg - 1) * R * 2 * KV * acc + seg_own +
         ends * (1 + nseg / S),
         L * (kv_sent + own * (T - R) * 2 * KV * acc) + own * (L * P + ends),
         time(fwd, 1 / S if zig else strip, 1 / S, 1 / S)),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="a HF config.json")
    ap.add_argument("--seq", type=int, required=True, help="tokens per sequence, T")
    ap.add_argument("--ranks", required=True, help="S values, comma-separated")
    ap.add_argument("--storage", choices=("bf16", "fp32"), default="fp32")
    ap.add_argument("--segment", type=int, default=4096, help="G, tokens a segment")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--profile", help="`streambp bench --profile --json` output")
    g.add_argument("--shares", help=",".join(f"{k}=x" for k in SHARES))
    a = ap.parse_args()
    sh, src = None, None
    try:
        ranks = [int(s) for s in a.ranks.split(",")]
        if a.shares:
            sh = {k: float(v) for k, v in (kv.split("=", 1) for kv in a.shares.split(","))}
            src = "given"
        elif a.profile:
            sh, src = shares_of_profile(a.profile)
        m = dims(a.config)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as ex:
        sys.exit(f"seq_options.py: {ex.__class__.__name__}: {ex}")
    if sh is not None and (set(sh) != set(SHARES) or not all(0 <= v <= 1 for v in sh.values())
                           or sum(sh.values()) > 1):
        sys.exit(f"seq_options.py: the shares are {', '.join(SHARES)}, each in [0, 1], "
                 "summing to at most 1")
    if a.seq < 1 or a.segment < 1 or not ranks or any(s < 2 or s > a.seq for s in ranks):
        sys.exit("seq_options.py: --seq and --segment must be positive, every S in [2, T]")
    esz = 2 if a.storage == "bf16" else 4
    print(f"{a.config}: T = {a.seq}, {a.storage} storage; a layer's gradient "
          f"{m['p_layer'] * 4 / 2 ** 20:.1f} MiB as floats")
    if sh is not None:
        print("step shares (" + src + "): " + ", ".join(f"{k} {sh[k]:.3f}" for k in SHARES))
    print("| S | dK/dV / token sums | bits change | one process + GiB | rank + GiB | "
          "sent a step, GiB | step / 1 process |")
    print("|---|---|---|---|---|---|---|")
    for S in ranks:
        for name, bits, one, mem, sent, t in rules(m, a.seq, S, esz, a.segment, sh):
            tt = "—" if t is None else f"{t:.2f}"
            print(f"| {S} | {name} | {bits} | {one / 2 ** 30:.2f} | {mem / 2 ** 30:.2f} | "
                  f"{sent / 2 ** 30:.2f} | {tt} |")


if __name__ == "__main__":
    main()
