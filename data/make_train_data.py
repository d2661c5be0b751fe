#!/usr/bin/env python3
"""Write data/train/counting.jsonl, the bundled training data (standard library only,
deterministic): token-id records {"input_ids": [...], "labels": [...]} that a tiny model can
learn in a few dozen steps.

Each record counts through the vocabulary with a fixed stride: ids 1 + (s + d*t) mod 175, with a
start s and a stride d in {1, 2, 3, 5} drawn per record, so the next token follows from the
previous two. Lengths run from 12 to 80 tokens (some exceed the demo's T = 64 and are
truncated). Every other record masks its first four tokens with label -100, like a prompt; the
others leave out "labels" (then labels = input_ids). Token ids stay below 176, the smallest
vocabulary of the tiny models. Run from the repository root: python3 data/make_train_data.py
"""
import json

VOCAB = 176
RECORDS = 96


def lcg(seed):
    """A tiny deterministic generator, so the data does not depend on Python's random module."""
    state = seed & 0xFFFFFFFF
    while True:
        state = (1664525 * state + 1013904223) & 0xFFFFFFFF
        yield state >> 8


def main():
    gen = lcg(2024)
    lines = []
    for r in range(RECORDS):
        start = next(gen) % (VOCAB - 1)
        stride = (1, 2, 3, 5)[next(gen) % 4]
        length = 12 + next(gen) % 69
        ids = [1 + (start + stride * t) % (VOCAB - 1) for t in range(length)]
        rec = {"input_ids": ids}
        if r % 2 == 1:
            rec["labels"] = [-100] * 4 + ids[4:]
        lines.append(json.dumps(rec, separators=(",", ":")))
    with open("data/train/counting.jsonl", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
