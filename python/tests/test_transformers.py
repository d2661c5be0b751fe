"""Real Hugging Face models (when transformers is importable; skipped otherwise): dump_grads
writes their names, a tied head once, and the audit passes float32 and bfloat16 gradients and
diagnoses float64 ones as having float32-level error (HF's float32 RoPE tables and loss upcast).
Measured with transformers 4.45.2 and torch 1.13: fp32 and bf16 within 1.2-1.7x our own error;
fp64 at 1e-7 relative, inside our float32 budget."""
import json
import os

import pytest
import torch

import streambp

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("config,tied", [("llama3-tiny", False), ("llama3-tiny", True),
                                         ("qwen2-tiny", False)])
def test_hf_model_gradients(config, tied, binary, data, tmp_path):
    with open(os.path.join(os.path.dirname(data), "models", config + ".json")) as f:
        cfg = json.load(f)
    cfg["tie_word_embeddings"] = tied
    cfg_path = str(tmp_path / "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    model_dir = streambp.init_model(cfg_path, str(tmp_path / "m"), seed=3)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, cfg["vocab_size"], (2, 40), generator=g)
    mask = torch.ones_like(ids)
    ids[1, 30:], mask[1, 30:] = 0, 0
    labels = torch.where(mask == 1, ids, torch.full_like(ids, -100))
    labels[:, :10] = -100
    batch = str(tmp_path / "batch.safetensors")
    streambp.batch.from_hf(batch, input_ids=ids, labels=labels, attention_mask=mask)
    for dtype, passes in ((torch.float32, True), (torch.bfloat16, True), (torch.float64, False)):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, torch_dtype=dtype, attn_implementation="eager")
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        grads = str(tmp_path / "grads.safetensors")
        names = streambp.dump_grads(model, grads)
        assert ("lm_head.weight" in names) == (not tied)
        assert len(names) == len(list(model.parameters()))
        r = streambp.audit(model_dir, batch, grads)
        assert r.passed == passes, r.report()
        if not passes:
            assert "your fp64 gradients have float32-level error" in r.diagnosis[0], r.report()
