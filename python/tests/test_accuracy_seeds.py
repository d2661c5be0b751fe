"""accuracy_seeds.py's reading of build/accuracy's rows and its summary over draws, on made-up
rows: no torch, no binary, so CI runs it (pytest collects it with the other python/tests)."""
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import accuracy_seeds  # noqa: E402

HEADER = ("family        T  tensor                                             fast   portable"
          "      torch     fast/t     port/t")


def test_parse_rows_keeps_rows_with_a_torch_error():
    text = "\n".join([
        HEADER,
        "qwen3       512  a.weight   2.000e-06  1.000e-06  1.000e-06       2.00       1.00",
        "qwen3       512  b.weight   1.000e-06  1.000e-06          -",
        "# qwen3 T = 512: 0.1 s for the three runs",
    ])
    assert accuracy_seeds.parse_rows(text, 7) == [(7, "qwen3", 512, "a.weight", 2e-6, 1e-6, 1e-6)]


def test_parse_rows_refuses_no_rows_and_bad_numbers():
    with pytest.raises(SystemExit):
        accuracy_seeds.parse_rows(HEADER, 1)
    with pytest.raises(SystemExit):
        accuracy_seeds.parse_rows("qwen3 512 a.weight 2e-6 x 1e-6 2.0 1.0", 1)


def test_summary_is_the_ratio_of_rms_errors():
    # tensor a: ours half of torch's (0.50); tensor b: ours 1 and 7 against torch 5 and 5, RMS 5
    # against 5 (1.00, the median; a mean would read 0.80) though one draw reads 1.40; tensor c:
    # ours twice torch's in both draws (2.00), the worst
    rows = [(1, "qwen3", 512, "a", 1.0, 1.0, 2.0), (2, "qwen3", 512, "a", 1.0, 1.0, 2.0),
            (1, "qwen3", 512, "b", 1.0, 1.0, 5.0), (2, "qwen3", 512, "b", 7.0, 1.0, 5.0),
            (1, "qwen3", 512, "c", 2.0, 1.0, 1.0), (2, "qwen3", 512, "c", 2.0, 1.0, 1.0)]
    line = accuracy_seeds.summary(rows, 2).splitlines()[-1].split()
    # family T n | worst rms med >1.0 1draw | worst rms med >1.0 1draw
    assert line[:3] == ["qwen3", "512", "3"]
    assert line[4] == "c" and float(line[5]) == 2.0 and float(line[6]) == 1.0
    assert line[7] == "1" and float(line[8]) == 2.0
    assert math.isclose(accuracy_seeds.rms([1.0, 7.0]), 5.0)


def test_summary_refuses_a_tensor_missing_from_a_draw():
    rows = [(1, "qwen3", 512, "a", 1.0, 1.0, 1.0), (2, "qwen3", 512, "a", 1.0, 1.0, 1.0),
            (1, "qwen3", 512, "b", 1.0, 1.0, 1.0)]
    with pytest.raises(SystemExit):
        accuracy_seeds.summary(rows, 2)
