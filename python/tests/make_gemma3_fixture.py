#!/usr/bin/env python3
"""Writes data/hf-gemma3/: a micro Gemma-3 (3 layers, window 4, layer 2 global with linear RoPE
scaling x8, as the 4B+ checkpoints) with float32
weights, an SFT batch longer than the window (right padding, the pad token at real positions),
and the float64 gradients Hugging Face transformers 4.51.3 computes for it with eager
attention: grads-stock.safetensors (HF as it is, with its float32 islands) and
grads-patched.safetensors (the islands in float64, python/tests/gemma3_hf.py). tests/
test_auditgemma.c audits both without torch: the stock file must fail with the Gemma-3
float32-island diagnosis, the patched one pass.

    /path/to/venv/bin/python python/tests/make_gemma3_fixture.py   (from the repository root)
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import gemma3_hf as g3  # noqa: E402
import streambp  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "data", "hf-gemma3")
CONFIG = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 96,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 64,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "query_pre_attn_scalar": 16, "sliding_window": 4,
    "sliding_window_pattern": 3, "attn_logit_softcapping": None,
    "final_logit_softcapping": None, "attention_bias": False, "pad_token_id": 0,
    "eos_token_id": 1, "bos_token_id": 2, "tie_word_embeddings": True,
    "initializer_range": 0.02,
}


def main():
    os.makedirs(OUT, exist_ok=True)
    cfg_path = os.path.join(OUT, "source-config.json")
    with open(cfg_path, "w") as f:
        json.dump(CONFIG, f, indent=2)
    # random weights rounded to float32 and saved as F32, so HF's float64 load is exact
    tmp = os.path.join(OUT, "tmp-model")
    g3.make_model_dir(cfg_path, tmp, seed=7, dtype=torch.float32)
    os.remove(cfg_path)
    for name in ("config.json", "model.safetensors"):
        os.replace(os.path.join(tmp, name), os.path.join(OUT, name))
    for name in os.listdir(tmp):
        os.remove(os.path.join(tmp, name))
    os.rmdir(tmp)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, CONFIG["vocab_size"], (2, 12), generator=g)
    ids[:, 3::5] = 0  # the pad token as a real input
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    ids[mask == 0] = 0
    labels = torch.where(mask == 1, ids, torch.full_like(ids, -100))
    streambp.batch.sft(os.path.join(OUT, "batch.safetensors"), input_ids=ids.tolist(),
                       labels=labels.tolist(), attention_mask=mask.tolist(),
                       metadata={"generator": "python/tests/make_gemma3_fixture.py"})
    for patched, name in ((False, "grads-stock.safetensors"), (True, "grads-patched.safetensors")):
        model = g3.load(OUT, "eager", patched)
        try:
            logits = model(input_ids=ids, attention_mask=mask).logits
            if patched:
                loss = g3.sft_loss(logits, labels)
            else:  # HF's own loss, logits.float() and all
                loss = model.loss_function(logits, labels, CONFIG["vocab_size"])
            loss.backward()
        finally:
            g3.unpatch_eager()
        streambp.dump_grads(model, os.path.join(OUT, name), loss=loss,
                            metadata={"generator": "transformers 4.51.3 %s float64 eager"
                                      % ("patched" if patched else "stock")})
    print("wrote", OUT)


if __name__ == "__main__":
    main()
