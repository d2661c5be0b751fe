"""Hugging Face transformers' Gemma3ForCausalLM as the Gemma-3 cross-check's third
implementation (docs/gemma3.md), with and without its float32 islands.

A float64 HF Gemma-3 is not float64 throughout (transformers 4.51.3): Gemma3RMSNorm computes in
float32 (`x.float()`, `weight.float()`), the rotary tables are float32 (`inv_freq`, the angles,
cos and sin), eager attention's softmax is float32 (`dtype=torch.float32`, which also turns a
left-padded row's float64 mask minimum into -inf and the row into NaN), and the causal-LM loss
upcasts `logits.float()`. `patch_islands` replaces each with the same formula in the model's
dtype:

  * Gemma3RMSNorm.forward: (x * rsqrt(mean(x^2) + eps)) * (1 + w), no .float();
  * both Gemma3RotaryEmbedding modules: inv_freq = base^(-2i/HD) (/ factor for linear scaling on
    the global table; the local table is never scaled), angles, cos and sin in float64;
  * the module-level eager_attention_forward: softmax in the query's dtype;
  * the loss: computed here (`loss_from_logits`) from the float64 logits, never HF's.

`stock` (no patches) keeps all four and is what the audit's float32-island diagnosis is about.
"""
import json
import math
import types

import torch
import transformers
from transformers.models.gemma3 import modeling_gemma3 as mg

IGNORE = -100


def make_model_dir(config_path, out, seed, dtype=torch.float64, tied=None):
    """A random Gemma3ForCausalLM of the config at config_path, saved to out (config.json +
    model.safetensors in `dtype`): projections N(0, 0.1^2), the embedding N(0, 0.5^2), every
    (1 + w) norm weight N(0, 0.3^2) so that 1 + w is not 1."""
    with open(config_path) as f:
        raw = json.load(f)
    if tied is not None:
        raw["tie_word_embeddings"] = tied
    fields = {k: v for k, v in raw.items() if k not in ("architectures", "model_type")}
    cfg = transformers.Gemma3TextConfig(**fields)
    model = mg.Gemma3ForCausalLM._from_config(cfg, torch_dtype=dtype, attn_implementation="eager")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            sd = 0.3 if p.ndim == 1 else 0.5 if "embed_tokens" in name else 0.1
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * sd)
    model.save_pretrained(out, safe_serialization=True)
    return str(out)


def load(model_dir, attn, patched, dtype=torch.float64):
    """HF's model in `dtype` with attention `attn` ("eager" or "sdpa"), islands patched or not."""
    model = mg.Gemma3ForCausalLM.from_pretrained(model_dir, torch_dtype=dtype,
                                                 attn_implementation=attn)
    model.train()  # dropout is 0: train() changes nothing but is how a trainer runs it
    if patched:
        patch_islands(model)
    return model


def _rms_forward(self, x):
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)) * (1.0 + self.weight)


def _rope_forward(self, x, position_ids):
    half = torch.arange(0, self._hd, 2, dtype=torch.float64) / self._hd
    inv_freq = self._base ** (-half) / self._factor
    freqs = position_ids[:, :, None].to(torch.float64) * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _eager_fp64(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                softcap=None, **kwargs):
    key_states = mg.repeat_kv(key, module.num_key_value_groups)
    value_states = mg.repeat_kv(value, module.num_key_value_groups)
    w = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        w = w + attention_mask[:, :, :, : key_states.shape[-2]]
    w = torch.nn.functional.softmax(w, dim=-1)  # in the query's dtype, not float32
    out = torch.matmul(w, value_states).transpose(1, 2).contiguous()
    return out, w


def patch_rope(model):
    """Only the two rotary tables in float64, rounded once to the model's dtype; in place."""
    cfg = model.config
    inner = model.model
    rs = cfg.rope_scaling or {}
    linear = rs.get("rope_type", rs.get("type")) == "linear"
    for rot, base, factor in ((inner.rotary_emb, cfg.rope_theta, rs["factor"] if linear else 1.0),
                              (inner.rotary_emb_local, cfg.rope_local_base_freq, 1.0)):
        rot._hd, rot._base, rot._factor = cfg.head_dim, float(base), float(factor)
        rot.forward = types.MethodType(_rope_forward, rot)
    return model


def patch_islands(model):
    """Every float32 island of HF's Gemma-3 computed in the model's dtype instead (module
    docstring). Changes the model in place and the module's eager attention for the process."""
    cfg = model.config
    for m in model.modules():
        if isinstance(m, mg.Gemma3RMSNorm):
            m.forward = types.MethodType(_rms_forward, m)
    patch_rope(model)
    mg.eager_attention_forward = _eager_fp64
    return model


def unpatch_eager():
    """The module's own eager attention back (patch_islands replaced it process-wide)."""
    mg.eager_attention_forward = _ORIG_EAGER


_ORIG_EAGER = mg.eager_attention_forward


def target_logprobs(logits, labels):
    """logp[b, t] of labels[b, t + 1] (float64), and the mask of valid targets."""
    lp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    tgt = labels[:, 1:]
    valid = tgt != IGNORE
    got = lp[:, :-1, :].gather(-1, tgt.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return got * valid, valid


def sft_loss(logits, labels):
    """HF's causal-LM loss (mean over the batch's valid targets) in float64."""
    logp, valid = target_logprobs(logits, labels)
    return -logp.sum() / valid.sum()


def dpo_loss(logits, labels, pairs, ref_chosen, ref_rejected, beta):
    """TRL DPO, sigmoid, no label smoothing: rows [0, pairs) chosen, [pairs, 2 pairs) rejected."""
    logp, _ = target_logprobs(logits, labels)
    s = logp.sum(-1)
    z = (s[:pairs] - s[pairs:]) - (ref_chosen - ref_rejected)
    return -torch.nn.functional.logsigmoid(beta * z).mean()


def grads_of(model):
    """{HF name: float64 gradient}; a tied head's gradient is the embedding's (one tensor)."""
    out = {}
    for name, p in model.named_parameters():
        out[name] = p.grad.detach().to(torch.float64).clone()
    return out


def rel_l2(a, b):
    n = torch.linalg.vector_norm(b).item()
    return torch.linalg.vector_norm(a - b).item() / (n if n > 0 else 1.0)


def read_grads(path):
    """A streambp gradient file as {name: float64 tensor}."""
    from safetensors.torch import load_file
    return {k: v.to(torch.float64) for k, v in load_file(path).items()}


def worst(ours, theirs):
    """(worst per-tensor relative L2, its tensor) over every tensor of `theirs`."""
    w, at = 0.0, None
    for k, v in theirs.items():
        e = rel_l2(ours[k], v)
        if not math.isfinite(e) or e > w:
            w, at = e, k
    return w, at
