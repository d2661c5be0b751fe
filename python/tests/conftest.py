"""Fixtures: the streambp binary ($STREAMBP, else build/streambp of this repository), tiny models
written by `streambp init`, and the repository's fixture batches."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # the package from this source tree
sys.path.insert(0, HERE)

import streambp  # noqa: E402


@pytest.fixture(scope="session")
def binary():
    b = os.environ.get("STREAMBP") or os.path.join(REPO, "build", "streambp")
    if not os.path.exists(b):
        pytest.skip("no streambp binary (run make, or set STREAMBP)")
    os.environ["STREAMBP"] = os.path.abspath(b)
    return os.environ["STREAMBP"]


@pytest.fixture(scope="session")
def models(binary, tmp_path_factory):
    """{name: model directory} for the tiny configs; seed 2 of qwen3-tiny is a reference model."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name, cfg, seed in (("qwen3", "qwen3-tiny", 1), ("llama3", "llama3-tiny", 1),
                            ("qwen2", "qwen2-tiny", 1), ("ref", "qwen3-tiny", 2)):
        out[name] = streambp.init_model(os.path.join(REPO, "data", "models", cfg + ".json"),
                                        str(root / name), seed=seed)
    return out


@pytest.fixture(scope="session")
def data():
    return os.path.join(REPO, "data", "batches")
