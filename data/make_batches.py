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


if __name__ == "__main__":
    main()
