#!/usr/bin/env python3
"""Write the fixture batches in data/batches/ (standard library only, deterministic).

Each batch is a safetensors file with input_ids, labels and attention_mask, all [B, T]. Padding
positions have attention_mask 0 and label -100; prompt positions have label -100, so the loss
covers completions only. Token ids stay below 176, the smallest vocabulary of the tiny models.
Run from the repository root: python3 data/make_batches.py
"""
import json
import struct

IGNORE = -100
VOCAB = 176


def lcg(seed):
    """A tiny deterministic generator, so the fixtures do not depend on Python's random module."""
    state = seed & 0xFFFFFFFF
    while True:
        state = (1664525 * state + 1013904223) & 0xFFFFFFFF
        yield state >> 8


def row(gen, T, pad_left, pad_right, prompt):
    """One sequence: pad_left pads, `prompt` prompt tokens, completion, pad_right pads."""
    ids, labels, mask = [], [], []
    for t in range(T):
        pad = t < pad_left or t >= T - pad_right
        tok = 0 if pad else 1 + next(gen) % (VOCAB - 1)
        ids.append(tok)
        mask.append(0 if pad else 1)
        labels.append(IGNORE if pad or t < pad_left + prompt else tok)
    return ids, labels, mask


def write(path, rows, dtype):
    fmt, size = {"I64": ("<q", 8), "I32": ("<i", 4)}[dtype]
    B, T = len(rows), len(rows[0][0])
    tensors = {}
    blob = b""
    for k, name in enumerate(("input_ids", "labels", "attention_mask")):
        data = b"".join(struct.pack(fmt, v) for r in rows for v in r[k])
        tensors[name] = {"dtype": dtype, "shape": [B, T],
                         "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    header = {"__metadata__": {"objective": "sft", "generator": "data/make_batches.py"}}
    header.update(tensors)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob)


def custom(gen, T, spec):
    """A row from a per-position spec: 'p' pad, 'i' prompt (ignored label), 'v' valid label."""
    ids, labels, mask = [], [], []
    for t in range(T):
        c = spec[t]
        tok = 0 if c == "p" else 1 + next(gen) % (VOCAB - 1)
        ids.append(tok)
        mask.append(0 if c == "p" else 1)
        labels.append(tok if c == "v" else IGNORE)
    return ids, labels, mask


def write_tensors(path, tensors, meta):
    """tensors: list of (name, dtype, shape, flat values)."""
    fmts = {"I64": "<q", "I32": "<i", "F32": "<f", "F64": "<d"}
    blob, header = b"", {"__metadata__": meta}
    for name, dtype, shape, values in tensors:
        data = b"".join(struct.pack(fmts[dtype], v) for v in values)
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob)


def flat(rows, k):
    return [v for r in rows for v in r[k]]


def dpo(path, gen, chosen, rejected, ref=None):
    """chosen / rejected: lists of specs (see custom); ref: (ref_chosen, ref_rejected) or None."""
    c = [custom(gen, len(x), x) for x in chosen]
    r = [custom(gen, len(x), x) for x in rejected]
    B, Tc, Tr = len(c), len(chosen[0]), len(rejected[0])
    t = [("chosen_input_ids", "I64", [B, Tc], flat(c, 0)),
         ("chosen_labels", "I64", [B, Tc], flat(c, 1)),
         ("chosen_attention_mask", "I64", [B, Tc], flat(c, 2)),
         ("rejected_input_ids", "I64", [B, Tr], flat(r, 0)),
         ("rejected_labels", "I64", [B, Tr], flat(r, 1)),
         ("rejected_attention_mask", "I64", [B, Tr], flat(r, 2))]
    if ref:
        t += [("ref_chosen_logps", "F64", [B], ref[0]), ("ref_rejected_logps", "F64", [B], ref[1])]
    write_tensors(path, t, {"objective": "dpo", "generator": "data/make_batches.py"})


def grpo(path, gen, specs, rewards=None, advantages=None, group=None, logps=True, old_band=None):
    """specs: 'p' pad, 'i' prompt, 'c' completion token; old/ref log-probs on completion tokens.
    old_band: (centre, half-width) of the old log-probs instead of [-5, -2]; centred on the tiny
    models' typical log-prob (about -ln V), it puts ratios on both sides of the clip range."""
    rows = [custom(gen, len(x), x.replace("c", "v")) for x in specs]
    B, T = len(rows), len(specs[0])
    cmask = [1 if ch == "c" else 0 for x in specs for ch in x]
    t = [("input_ids", "I64", [B, T], flat(rows, 0)),
         ("attention_mask", "I64", [B, T], flat(rows, 2)),
         ("completion_mask", "I64", [B, T], cmask)]
    meta = {"objective": "grpo", "generator": "data/make_batches.py"}
    if rewards is not None:
        t.append(("rewards", "F32", [B], rewards))
        meta["group_size"] = str(group)
    if advantages is not None:
        t.append(("advantages", "F32", [B], advantages))
    if logps:  # plausible per-token log-probs, at the position of the token they score
        if old_band:
            c, w = old_band
            old = [c + w * ((next(gen) % 2001) / 1000.0 - 1.0) if m else 0.0 for m in cmask]
        else:
            old = [-(2.0 + (next(gen) % 3000) / 1000.0) if m else 0.0 for m in cmask]
        ref = [-(2.0 + (next(gen) % 3000) / 1000.0) if m else 0.0 for m in cmask]
        t += [("old_logps", "F32", [B, T], old), ("ref_logps", "F32", [B, T], ref)]
    write_tensors(path, t, meta)


def main():
    g = lcg(1234)
    # B=2, T=24: row 0 right-padded, row 1 left-padded; prompts of different lengths, so the
    # first valid target of each row falls inside a block, not on its boundary.
    write("data/batches/sft-tiny.safetensors",
          [row(g, 24, 0, 5, 6), row(g, 24, 4, 0, 7)], "I64")
    # B=2, T=96, int32 ids: the default batch of `make demo`.
    write("data/batches/sft-demo.safetensors",
          [row(g, 96, 0, 11, 21), row(g, 96, 9, 0, 30)], "I32")

    # The edge-case suite of `streambp verify --suite` (verify/suite.c says which case uses which).
    s = "data/batches/suite-"
    # T = 22: not a multiple of the chunks 8 and 12 the suite uses.
    write(s + "t22.safetensors", [row(g, 22, 0, 3, 5), row(g, 22, 2, 0, 4)], "I64")
    # Chunks of 8 start at positions 8 and 16 on a -100 label (prompt masking), with valid
    # targets right after; the loss count of the authors' code goes wrong exactly here.
    write(s + "chunk-starts-on-ignored.safetensors",
          [custom(g, 24, "iiiiiiiiivvvvvvviiiiivvv"),
           custom(g, 24, "iiiiiiiiiivvvvvvviiivvvv")], "I64")
    write(s + "left-padding.safetensors",
          [custom(g, 24, "ppppppiiivvvvvvvvvvvvvvv"),
           custom(g, 24, "ppiiiivvvvvvvvvvvvvvvvvv")], "I64")
    write(s + "right-padding.safetensors",
          [custom(g, 24, "iiiivvvvvvvvvvvvvvpppppp"),
           custom(g, 24, "iivvvvvvvvvvvvvvvvvvvvpp")], "I64")
    # B = 3: one row with no target at all, two with very unequal target counts.
    write(s + "unequal-rows.safetensors",
          [custom(g, 24, "iiiiiiiiiiiiiiiiiiiiiiii"),
           custom(g, 24, "ivvvvvvvvvvvvvvvvvvvvvvv"),
           custom(g, 24, "iiiiiiiiiiiiiiiiiiiivvpp")], "I64")
    # Exactly one valid target in the whole batch.
    write(s + "single-target.safetensors",
          [custom(g, 24, "iiiiiiiiiiiiiiiiiiiiiiii"),
           custom(g, 24, "iiiiiiiiiiiiiiivpppppppp")], "I64")
    # A valid target predicted from a padded position (left padding, label right after the
    # pads), and a hole in the attention mask.
    write(s + "target-from-padding.safetensors",
          [custom(g, 24, "ppppvvvvvvvvvvvvvvvvvvvv"),
           custom(g, 24, "iiivvvvpvvvvvvvvvvvvvvvv")], "I64")

    # DPO: 2 pairs, chosen (T=20) and rejected (T=24) of different lengths with right padding;
    # reference log-probs (summed) from the batch.
    dpo("data/batches/dpo-tiny.safetensors", g,
        ["iiiiiivvvvvvvvvvvvpp", "iiiivvvvvvvvvvvvvvvv"],
        ["iiiiiivvvvvvvvvvvvvvvvpp", "iiiivvvvvvvppppppppppppp"],
        ref=([-61.5, -80.25], [-95.0, -40.75]))
    # DPO without reference log-probs (a reference model is needed); one pair whose chosen
    # completion is a single token.
    dpo("data/batches/dpo-noref.safetensors", g,
        ["iiiiiiiiiiiiiiiiiiivpppp", "iiiiivvvvvvvvvvvvvvvvvvv"],
        ["iiiiiivvvvvvvvvvvvvvvvpp", "iiiiivvvvvvvvvvvvvvvvvpp"])
    # GRPO: 2 groups of 2 completions, left-padded prompts, completions starting mid-block,
    # rewards with the group size; old and reference per-token log-probs.
    grpo("data/batches/grpo-tiny.safetensors", g,
         ["ppiiiiiiiccccccccccccppp", "iiiiiiiiiiccccccccccccc" + "c",
          "pppppiiiiiiccccccccccccc", "piiiiiiiiiiiiccccccppppp"],
         rewards=[1.0, 0.25, -0.5, 0.75], group=2)
    # GRPO with advantages given, no old log-probs (ratio 1), one group with equal rewards.
    grpo("data/batches/grpo-adv.safetensors", g,
         ["iiiiiiiiccccccccccccccpp", "iiiiiicccccccccccccccccc",
          "ppppiiiiiiiiiccccccccccc", "iiiiiiiiiiicccccccpppppp"],
         advantages=[0.9, -1.1, 0.3, -0.2], logps=False)
    grpo("data/batches/grpo-equal-rewards.safetensors", g,
         ["iiiiiiiicccccccccccccccc", "iiiiiiiicccccccccccppppp",
          "iiiiiiiiccccccccccccccpp", "iiiiiiiiccccccccpppppppp"],
         rewards=[0.5, 0.5, 1.0, 0.0], group=2)
    more(g)


def more(g):
    """Fixtures added for issue 11 (written after the others, so those keep their bytes)."""
    # GRPO whose old log-probs sit around the models' own (ratios from about 0.5 to 2): both
    # clip bounds are crossed, so clip ranges with epsilon_low != epsilon_high are tested.
    grpo("data/batches/grpo-clip.safetensors", g,
         ["iiiiiiiiccccccccccccccccccccpp", "ppppiiiiiiiiiccccccccccccccccc",
          "iiiiiiiiiiiccccccccccccccccccc", "pppiiiiiicccccccccccccccccpppp"],
         rewards=[0.8, -0.3, 1.5, 0.1], group=2, old_band=(-5.35, 0.7))
    # GRPO, 3 groups of 2, whose rows end at very different positions: cut into micro-batches
    # after their last completion token, the step's micro-batches have T = 32, 26 and 19.
    grpo("data/batches/grpo-ragged.safetensors", g,
         ["iiiiiiiiiicccccccccccccccccccccc", "ppiiiiiiiiiiiicccccccccccccccccc",
          "iiiiiiiiccccccccccccccccccpppppp", "iiiiiiiiiiiiiccccccccccccppppppp",
          "iiiiiicccccccccccccppppppppppppp", "piiiiiiiiccccccccccppppppppppppp"],
         rewards=[0.2, 0.9, -1.0, 0.4, 0.0, 1.0], group=2, old_band=(-5.35, 0.7))
    # SFT, B = 3, T = 30: targets predicted from pads at two places (after left padding and
    # across a hole), a right-padded row, unequal target counts.
    write("data/batches/suite-target-from-padding-2.safetensors",
          [custom(g, 30, "pppppppvvvvvvvvvvvvvvvvvvvvvvv"),
           custom(g, 30, "iiiiivvvvvpppvvvvvvvvvvvvvvvvv"),
           custom(g, 30, "iiiiiiiiivvvvvvvvvvvvvvvpppppp")], "I64")
    # One row of T = 20000, left-padded: its 96 real tokens sit at positions 19904..19999, where
    # a RoPE angle rounded to float32 is off by about 1e-3 rad.
    T, real = 20000, 96
    spec = "p" * (T - real) + "i" * 24 + "v" * (real - 24)
    write("data/batches/sft-long-positions.safetensors", [custom(g, T, spec)], "I32")

    # Left padding with labels that copy the input ids (HF's usual SFT batch): the first real
    # token of each padded row is predicted from the last pad, a query that sees no key
    # (--unattended); pads of 3 and 6 positions and an unpadded row. Its own generator, so the
    # fixtures above keep their bytes.
    u = lcg(2026)
    write("data/batches/suite-unattended-left-pad.safetensors",
          [custom(u, 20, "pppvvvvvvvvvvvvvvvvv"), custom(u, 20, "ppppppvvvvvvvvvvvvvv"),
           custom(u, 20, "vvvvvvvvvvvvvvvvvvvv")], "I64")
    gemma3()
    gpu_long()
    golden_long()
    seq_parallel()


def gpu_long():
    """cuda/gpu-check.sh's long-sequence stage: T = 700 is 11 key tiles of the portable
    attention and two token blocks of 512, so a GPU run is compared with the CPU on the folds
    the tiny goldens (T <= 40) never reach; a right-padded row and a left-padded one. Its own
    generator, so the fixtures above keep their bytes."""
    u = lcg(700)
    write("data/batches/sft-t700.safetensors",
          [row(u, 700, 0, 23, 50), row(u, 700, 37, 0, 80)], "I32")


def golden_long():
    """The long golden cases (data/golden/long/cases): T = 300 spans three token blocks of the
    portable sums (128), so chunks of 7 and 5 split blocks and leave partial sums pending across
    calls; ids up to 599 (both long models have V >= 600), so targets fall in the second
    vocabulary block of 512 as well. A right-padded row with a short prompt and a left-padded one
    with a long prompt. Its own generator, so the fixtures above keep their bytes."""
    u = lcg(54)
    rows = []
    for T, left, right, prompt in ((300, 0, 17, 23), (300, 11, 0, 140)):
        ids, labels, mask = [], [], []
        for t in range(T):
            pad = t < left or t >= T - right
            tok = 0 if pad else 1 + next(u) % 599
            ids.append(tok)
            mask.append(0 if pad else 1)
            labels.append(IGNORE if pad or t < left + prompt else tok)
        rows.append((ids, labels, mask))
    write("data/batches/sft-long.safetensors", rows, "I32")


def seq_parallel():
    """Sequence parallel's fixtures (tests/mpi_ranks.sh, docs/distributed.md §8): ranks hold
    whole blocks of 128 tokens, so T = 450 (3.5 blocks: T a multiple of neither S nor a block)
    is shared by up to 4 ranks, T = 300 by up to 3; padding and prompts cross the ranks'
    boundaries (128, 256, 384). Their own generator, so the fixtures above keep their bytes."""
    u = lcg(53)
    d = "data/batches/seq-"
    write(d + "sft-450.safetensors",
          [custom(u, 450, "i" * 140 + "v" * 280 + "p" * 30),
           custom(u, 450, "p" * 200 + "i" * 20 + "v" * 230)], "I64")
    dpo(d + "dpo-300.safetensors", u,
        ["i" * 100 + "v" * 190 + "p" * 10, "p" * 130 + "i" * 10 + "v" * 160],
        ["i" * 100 + "v" * 200, "p" * 5 + "i" * 250 + "v" * 45],
        ref=([-1500.0, -900.0], [-1600.0, -250.0]))
    grpo(d + "grpo-300.safetensors", u,
         ["i" * 120 + "c" * 170 + "p" * 10, "p" * 3 + "i" * 117 + "c" * 180],
         advantages=[0.75, -0.75])
    # one sequence (B = 1), the case whose head's round goes late under --seq-overlap
    # (head_late in src/engine/engine.h): its own generator, so the fixtures above keep their
    # bytes; padding on rank 0's rows, the prompt across the first boundary (128)
    write(d + "sft-1x450.safetensors",
          [custom(lcg(56), 450, "p" * 60 + "i" * 100 + "v" * 290)], "I64")


def gemma3():
    """Gemma-3's window fixtures (issue 34; gemma3-tiny has W = 8, gemma3-w64 W = 64, the
    portable attention's key tile). Their own generator, so the fixtures above keep their
    bytes."""
    s = "data/batches/suite-gemma3-"
    u = lcg(34)
    # T = 40 > 5W: chunks of 12 and 20 hold whole windows, chunks of 5 are smaller than one
    # and straddle its edge; a right-padded and a left-padded row.
    write(s + "long.safetensors",
          [custom(u, 40, "iiiiivvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvpppp"),
           custom(u, 40, "pppiiivvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv")], "I64")
    # Left padding inside the window (3 pads: the first real queries' windows hold pads) and
    # longer than it (11 pads: the first real query's window is itself alone), the first real
    # token predicted from the last pad (a query with no key), and a hole inside a window.
    write(s + "left-pad-window.safetensors",
          [custom(u, 32, "pppvvvvvvvvvvvvvvvvvvvvvvvvvvvvv"),
           custom(u, 32, "pppppppppppvvvvvvvvvvvvvvvvvvvvv"),
           custom(u, 32, "iiiivvvvvvpvvvvvvvvvvvvvvvvvvvvv")], "I64")
    # T = 40 < W = 64: every sliding layer sees every earlier key, as a global one.
    write(s + "short.safetensors",
          [custom(u, 40, "iiiiiiivvvvvvvvvvvvvvvvvvvvvvvvvvvvvvppp"),
           custom(u, 40, "ppiiiiivvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv")], "I64")
    # T = 150 with W = 64 = the key tile: windows that start on a tile boundary, inside one,
    # and span exactly one tile.
    write(s + "tile.safetensors",
          [custom(u, 150, "i" * 10 + "v" * 135 + "p" * 5)], "I64")


if __name__ == "__main__":
    main()
