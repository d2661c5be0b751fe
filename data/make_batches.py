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


def main():
    g = lcg(1234)
    # B=2, T=24: row 0 right-padded, row 1 left-padded; prompts of different lengths, so the
    # first valid target of each row falls inside a block, not on its boundary.
    write("data/batches/sft-tiny.safetensors",
          [row(g, 24, 0, 5, 6), row(g, 24, 4, 0, 7)], "I64")
    # B=2, T=96, int32 ids: the default batch of `make demo`.
    write("data/batches/sft-demo.safetensors",
          [row(g, 96, 0, 11, 21), row(g, 96, 9, 0, 30)], "I32")


if __name__ == "__main__":
    main()
