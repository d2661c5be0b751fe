"""tests/gemma3_layer_types.json against Hugging Face's Gemma3TextConfig (skipped without
transformers, or with one older than layer_types, 4.53): for each config streambp accepts, HF
makes local the layers streambp does; for each one streambp refuses, HF computes what the
pattern alone would not give (other local layers, or attention that is not causal), so a reader
of sliding_window_pattern (ref/, verify/torch_grads.py) would compute another model. Needs no
torch: only the config class."""
import json
import os
import warnings

import pytest

transformers = pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = json.load(open(os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests",
                                    "gemma3_layer_types.json")))["cases"]


def hf_config(cfg):
    kw = {k: v for k, v in cfg.items() if k != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = transformers.Gemma3TextConfig(**kw)
    if getattr(c, "layer_types", None) is None:
        pytest.skip("transformers %s has no layer_types (4.53 and later)" % transformers.__version__)
    return c


def hf_local(c):
    return [int(t == "sliding_attention") for t in c.layer_types]


def pattern_local(cfg):
    p = cfg.get("sliding_window_pattern", 6)
    return [int((l + 1) % p != 0) for l in range(cfg["num_hidden_layers"])]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_hf_agrees(case):
    cfg = case["config"]
    c = hf_config(cfg)
    bidirectional = bool(getattr(c, "use_bidirectional_attention", False))
    if "local" in case:  # accepted by streambp: HF computes the same model
        assert hf_local(c) == case["local"] == pattern_local(cfg)
        assert not bidirectional
    elif "hf_local" in case:  # refused: HF follows layer_types, not the pattern
        assert hf_local(c) == case["hf_local"] != pattern_local(cfg)
    else:  # refused: bidirectional attention
        assert case["hf_bidirectional"]
        if not hasattr(c, "use_bidirectional_attention"):
            pytest.skip("transformers %s has no use_bidirectional_attention" %
                        transformers.__version__)
        assert bidirectional
