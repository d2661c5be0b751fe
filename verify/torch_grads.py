#!/usr/bin/python3
"""Independent PyTorch cross-check of streambp's gradients (see ref/SEMANTICS.md, the contract).

Loads a Hugging Face decoder (model_type qwen3, qwen2, llama, gemma3_text, or a multimodal gemma3
directory's text model) and a batch, computes the loss of
an objective (SFT, DPO or GRPO) with plain autograd, and writes d(loss)/d(parameter) for every
parameter under its HF name. It imports neither transformers, TRL nor safetensors; the
safetensors format is read and written here.

Semantic choices (all from ref/SEMANTICS.md):
  * RMSNorm (x / sqrt(mean(x^2) + eps)) * w; Qwen3 adds per-head q_norm/k_norm before RoPE;
    Qwen2 has q/k/v biases; SwiGLU MLP with silu; GQA: query head h reads kv head h // (NH/NKV).
  * RoPE, rotate-half pairs (i, i + HD/2), inv_freq[i] = theta^(-2i/HD), optional llama3 scaling;
    inv_freq, angles, cos and sin are computed in float64 and rounded once to the compute dtype.
    Positions are 0..T-1 in every row, padded or not.
  * Key j is visible from query t iff j <= t and attention_mask[j] == 1. A query with no visible
    key outputs exactly 0 (HF gives such rows mask-backend artefacts instead).
  * Every objective is built on the per-target log-probabilities: logits at t predict
    labels[t+1]; -100 is ignored; log_softmax in float64 (GRPO: of logits / temperature).
  * SFT loss: the sum of per-target negative log-likelihoods divided by N, the number of valid
    targets of the whole batch. N = 0 is an input error.
  * DPO (TRL DPOTrainer, loss types sigmoid and ipo): chosen rows then rejected rows, padded on
    the right to a common length; the row statistic is the summed log-prob (ipo: the mean);
    reference values from the batch or from --ref-model.
  * GRPO (TRL GRPOTrainer, loss types grpo, bnpo, dr_grpo, dapo): completion tokens are the
    targets; advantages given or group-normalised from rewards; clipped ratio against old_logps
    (the current log-probs, detached, when absent) and the k3 KL term against ref_logps.
  * Tied embeddings: the head uses model.embed_tokens.weight and there is no lm_head.weight; the
    embedding gradient includes the head's contribution (autograd accumulates it).
  * pad_token_id (every family; Gemma-3's default 0): HF's nn.Embedding(padding_idx=pad), so the
    pad row gets no gradient from the lookups (a tied head still adds its own).
  * Gemma-3 (docs/gemma3.md): embeddings scaled by sqrt(C) rounded to the dtype; every RMSNorm
    x·rsqrt(mean(x²) + eps)·(1 + w), four per layer plus q_norm/k_norm over head_dim and the final
    one; GeGLU with gelu tanh on the gate; attention scale query_pre_attn_scalar^-0.5; layer l is
    sliding iff (l + 1) % sliding_window_pattern, its query t seeing keys t - W < j <= t, rotated
    by rope_local_base_freq unscaled; global layers rope_theta with linear scaling; hf-sdpa rows
    without a key are hf-eager's (Gemma-3 never unmasks them).
Exit status: 0 ok, 2 bad input or unsupported model, 1 --fd-check failure.
"""
import argparse
import json
import math
import os
import shlex
import struct
import sys
import tempfile

import numpy as np
import torch

IGNORE_INDEX = -100
ST_DTYPES = {"F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2),
             "I64": ("<i8", 8), "I32": ("<i4", 4)}
FAMILIES = ("qwen3", "qwen2", "llama", "gemma3_text", "gemma3")


class InputError(Exception):
    """Bad input or unsupported model: reported on stderr, exit status 2."""


# ----------------------------------------------------------------------------- safetensors I/O

def _no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise InputError("duplicate key in safetensors header")
    return dict(pairs)


def read_safetensors(path):
    """Return (metadata dict, {name: numpy array}) with every header entry validated."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise InputError("cannot read %s: %s" % (path, e))
    if len(blob) < 8:
        raise InputError("%s: too short for a safetensors file" % path)
    (hlen,) = struct.unpack("<Q", blob[:8])
    if hlen > len(blob) - 8:
        raise InputError("%s: header length %d exceeds the file" % (path, hlen))
    try:
        header = json.loads(blob[8:8 + hlen].decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError("%s: bad header JSON: %s" % (path, e))
    if not isinstance(header, dict):
        raise InputError("%s: header is not a JSON object" % path)
    meta = header.pop("__metadata__", None) or {}
    data = memoryview(blob)[8 + hlen:]
    tensors, spans = {}, []
    for name, info in header.items():
        where = "%s: tensor %r" % (path, name)
        if not isinstance(info, dict) or info.get("dtype") not in ST_DTYPES:
            raise InputError("%s: missing or unsupported dtype" % where)
        shape, offs = info.get("shape"), info.get("data_offsets")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise InputError("%s: bad shape %r" % (where, shape))
        if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int for o in offs)
                and 0 <= offs[0] <= offs[1] <= len(data)):
            raise InputError("%s: data_offsets %r out of range" % (where, offs))
        npdt, size = ST_DTYPES[info["dtype"]]
        if offs[1] - offs[0] != math.prod(shape) * size:
            raise InputError("%s: byte size does not match shape and dtype" % where)
        arr = np.frombuffer(data[offs[0]:offs[1]], dtype=npdt)
        if info["dtype"] == "BF16":  # bf16 is the top half of a float32
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = arr.reshape(shape).copy()
        spans.append((offs[0], offs[1], name))
    spans.sort()
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise InputError("%s: tensors %r and %r overlap" % (path, a, b))
    return meta, tensors


def write_safetensors(path, tensors, metadata):
    """Write {name: float tensor} (in the given order) atomically: temp file, then rename."""
    header, chunks, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        arr = t.detach().cpu().contiguous().numpy()
        code = {np.dtype("float64"): "F64", np.dtype("float32"): "F32"}[arr.dtype]
        raw = arr.astype(ST_DTYPES[code][0]).tobytes()
        header[name] = {"dtype": code, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((-(8 + len(hbytes))) % 8)  # data starts 8-byte aligned
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(hbytes)))
            f.write(hbytes)
            for raw in chunks:
                f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# ----------------------------------------------------------------------------- config and weights

def _rope_settings(cfg):
    """Return (theta, llama3 parameters or None) from rope_theta/rope_scaling or rope_parameters."""
    theta = cfg.get("rope_theta")
    rs = cfg.get("rope_scaling")
    rp = cfg.get("rope_parameters")
    if rs is not None and rp is not None:
        raise InputError("config has both rope_scaling and rope_parameters")
    spec = rp if rp is not None else rs
    if spec is not None:
        if not isinstance(spec, dict):
            raise InputError("rope_scaling/rope_parameters must be an object or null")
        if spec.get("rope_theta") is not None:
            if theta is not None and float(theta) != float(spec["rope_theta"]):
                raise InputError("rope_theta and rope_parameters.rope_theta disagree")
            theta = spec["rope_theta"]
    theta = float(10000.0 if theta is None else theta)  # HF's default for all three families
    if not theta > 0:
        raise InputError("rope_theta must be > 0")
    kind = None if spec is None else spec.get("rope_type", spec.get("type"))
    if kind in (None, "default"):
        return theta, None
    if kind != "llama3":
        raise InputError("rope type %r is not supported (only default and llama3)" % (kind,))
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    if any(spec.get(k) is None for k in keys):
        raise InputError("llama3 rope scaling needs %s" % ", ".join(keys))
    l3 = {k: float(spec[k]) for k in keys}
    if not (l3["factor"] > 0 and 0 < l3["low_freq_factor"] < l3["high_freq_factor"]
            and l3["original_max_position_embeddings"] > 0):
        raise InputError("llama3 rope scaling needs factor > 0 and 0 < low < high freq factor")
    return theta, l3


def parse_config(cfg):
    """Validate config.json and return a flat dict of the dimensions the model needs."""
    if not isinstance(cfg, dict):
        raise InputError("config.json is not a JSON object")
    family = cfg.get("model_type")
    if family not in FAMILIES:
        raise InputError("model_type %r is not supported (qwen3, qwen2, llama, gemma3_text, "
                         "gemma3)" % (family,))
    if family in ("gemma3_text", "gemma3"):
        return parse_gemma3(cfg)
    if cfg.get("hidden_act", "silu") != "silu":
        raise InputError("hidden_act %r is not supported (only silu)" % cfg["hidden_act"])
    if cfg.get("mlp_bias"):
        raise InputError("mlp_bias true is not supported")
    if family != "qwen2" and cfg.get("attention_bias"):
        raise InputError("attention_bias true is not supported for %s" % family)
    if cfg.get("use_sliding_window"):
        raise InputError("use_sliding_window true is not supported")
    if any(t != "full_attention" for t in cfg.get("layer_types") or []):
        raise InputError("layer_types other than full_attention are not supported")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise InputError("partial_rotary_factor != 1 is not supported")
    if cfg.get("quantization_config") is not None:
        raise InputError("quantized models are not supported")
    try:
        d = {k: int(cfg[k]) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                      "num_hidden_layers", "num_attention_heads")}
        eps = float(cfg["rms_norm_eps"])
    except (KeyError, TypeError, ValueError) as e:
        raise InputError("config.json: missing or bad field %s" % e)
    C, NH = d["hidden_size"], d["num_attention_heads"]
    NKV = NH if cfg.get("num_key_value_heads") is None else int(cfg["num_key_value_heads"])
    if min(d.values()) < 1 or NKV < 1 or NH % NKV != 0 or not eps > 0:
        raise InputError("bad dimensions: sizes and head counts must be >= 1, NH a multiple "
                         "of NKV, rms_norm_eps > 0")
    # head_dim: as HF, an explicit value wins; otherwise 128 for Qwen3 (Qwen3Config's default)
    # and hidden/heads for Llama and Qwen2.
    HD = cfg.get("head_dim")
    if HD is not None and (type(HD) is not int or HD < 1):
        raise InputError("head_dim %r is not a positive integer" % HD)
    if HD is None and family == "qwen3":
        HD = 128
    if HD is None:
        if C % NH != 0:
            raise InputError("hidden_size is not a multiple of num_attention_heads; need head_dim")
        HD = C // NH
    if HD % 2 != 0:
        raise InputError("head_dim %d is odd; RoPE needs it even" % HD)
    theta, llama3 = _rope_settings(cfg)
    return dict(family=family, V=d["vocab_size"], C=C, F=d["intermediate_size"],
                L=d["num_hidden_layers"], NH=NH, NKV=NKV, HD=HD, eps=eps, theta=theta,
                llama3=llama3, tied=bool(cfg.get("tie_word_embeddings", False)),
                pad=_pad_token(cfg, None, d["vocab_size"]))


def _pad_token(cfg, default, V):
    """pad_token_id: absent gives default, null None (no padding_idx)."""
    pad = cfg.get("pad_token_id", default)
    if pad is not None and (type(pad) is not int or not 0 <= pad < V):
        raise InputError("pad_token_id %r is not a token id below vocab_size" % (pad,))
    return pad


# Gemma3TextConfig's defaults in transformers 4.51.3 (docs/gemma3.md, "Config")
GEMMA3_DEFAULTS = dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216,
                       num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                       head_dim=256, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                       rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None,
                       query_pre_attn_scalar=256, sliding_window=4096, sliding_window_pattern=6,
                       attention_bias=False, tie_word_embeddings=True, pad_token_id=0,
                       final_logit_softcapping=None, attn_logit_softcapping=None)


def parse_gemma3(cfg):
    """Gemma-3's text model: gemma3_text, or a gemma3 (multimodal) config's text_config."""
    wrapped = cfg.get("model_type") == "gemma3"
    if wrapped:
        cfg = cfg.get("text_config")
        if not isinstance(cfg, dict):
            raise InputError("a gemma3 config needs a text_config object")
    g = dict(GEMMA3_DEFAULTS)
    g.update(cfg)
    if g["hidden_activation"] != "gelu_pytorch_tanh":
        raise InputError("hidden_activation %r is not supported (only gelu_pytorch_tanh)"
                         % (g["hidden_activation"],))
    for k in ("final_logit_softcapping", "attn_logit_softcapping"):
        if g[k] is not None:
            raise InputError("%s is set; not supported" % k)
    if g["attention_bias"]:
        raise InputError("attention_bias true is not supported for gemma3")
    try:
        d = {k: int(g[k]) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                    "num_hidden_layers", "num_attention_heads",
                                    "num_key_value_heads", "head_dim", "sliding_window",
                                    "sliding_window_pattern")}
        f = {k: float(g[k]) for k in ("rms_norm_eps", "rope_theta", "rope_local_base_freq",
                                      "query_pre_attn_scalar")}
    except (TypeError, ValueError) as e:
        raise InputError("config.json: bad field %s" % e)
    if (min(d.values()) < 1 or d["num_attention_heads"] % d["num_key_value_heads"]
            or d["head_dim"] % 2 or min(f.values()) <= 0):
        raise InputError("bad Gemma-3 dimensions or window")
    rs, factor = g["rope_scaling"], None
    if rs is not None:
        kind = rs.get("rope_type", rs.get("type")) if isinstance(rs, dict) else None
        if kind == "linear" and float(rs.get("factor", 0)) > 0:
            factor = float(rs["factor"])
        elif kind != "default":
            raise InputError("gemma3 rope_scaling %r is not supported (default, linear)" % (rs,))
    return dict(family="gemma3_text", wrapped=wrapped, V=d["vocab_size"], C=d["hidden_size"],
                F=d["intermediate_size"], L=d["num_hidden_layers"],
                NH=d["num_attention_heads"], NKV=d["num_key_value_heads"], HD=d["head_dim"],
                eps=f["rms_norm_eps"], theta=f["rope_theta"], llama3=None, linear=factor,
                local_theta=f["rope_local_base_freq"], W=d["sliding_window"],
                pattern=d["sliding_window_pattern"], qpas=f["query_pre_attn_scalar"],
                tied=bool(g["tie_word_embeddings"]),
                pad=_pad_token(g, 0, d["vocab_size"]))


def layer_window(m, l):
    """Gemma-3 4.51.3: layer l is sliding iff (l + 1) % sliding_window_pattern; 0: global."""
    if m["family"] != "gemma3_text":
        return 0
    return m["W"] if (l + 1) % m["pattern"] else 0


def param_shapes(m):
    """Ordered (HF name, shape) list, in the order of the table in ref/SEMANTICS.md."""
    C, F, V, HD = m["C"], m["F"], m["V"], m["HD"]
    Q, KV = m["NH"] * HD, m["NKV"] * HD
    out = [("model.embed_tokens.weight", (V, C))]
    for l in range(m["L"]):
        p = "model.layers.%d." % l
        for proj, rows in (("q", Q), ("k", KV), ("v", KV)):
            out.append((p + "self_attn.%s_proj.weight" % proj, (rows, C)))
            if m["family"] == "qwen2":
                out.append((p + "self_attn.%s_proj.bias" % proj, (rows,)))
        out.append((p + "self_attn.o_proj.weight", (C, Q)))
        if m["family"] in ("qwen3", "gemma3_text"):
            out += [(p + "self_attn.q_norm.weight", (HD,)), (p + "self_attn.k_norm.weight", (HD,))]
        out += [(p + "mlp.gate_proj.weight", (F, C)), (p + "mlp.up_proj.weight", (F, C)),
                (p + "mlp.down_proj.weight", (C, F)), (p + "input_layernorm.weight", (C,)),
                (p + "post_attention_layernorm.weight", (C,))]
        if m["family"] == "gemma3_text":
            out += [(p + "pre_feedforward_layernorm.weight", (C,)),
                    (p + "post_feedforward_layernorm.weight", (C,))]
    out += [("model.norm.weight", (C,))]
    return out + ([] if m["tied"] else [("lm_head.weight", (V, C))])


def load_model(model_dir, dtype):
    """Return (model description, ordered {name: leaf tensor requiring grad})."""
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            m = parse_config(json.load(f))
    except (OSError, ValueError, TypeError) as e:
        raise InputError("cannot read %s/config.json: %s" % (model_dir, e))
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    weight_map = None
    if os.path.exists(single):
        shards = ["model.safetensors"]
    elif os.path.exists(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
            raise InputError("bad %s: %s" % (index, e))
    else:
        raise InputError("%s has neither model.safetensors nor its index" % model_dir)
    found, where = {}, {}
    for shard in shards:
        for name, arr in read_safetensors(os.path.join(model_dir, shard))[1].items():
            if name in found:
                raise InputError("tensor %s appears in more than one shard" % name)
            found[name], where[name] = arr, shard
    for name, shard in (weight_map or {}).items():
        if where.get(name) != shard:
            raise InputError("index lists %s in %s, but it is not there" % (name, shard))
    params = {}
    pre = "language_model." if m.get("wrapped") else ""  # a gemma3 directory's text model
    for name, shape in param_shapes(m):
        stored = pre + name
        if stored not in found:
            raise InputError("model is missing tensor %s" % stored)
        if tuple(found[stored].shape) != shape:
            raise InputError("%s has shape %s, expected %s" % (stored, found[stored].shape, shape))
        if found[stored].dtype.kind != "f":
            raise InputError("%s is not a floating-point tensor" % stored)
        params[name] = torch.from_numpy(found.pop(stored).astype(np.float64)).to(dtype)
        params[name].requires_grad_(True)
    for name in found:
        if pre and name.startswith(("vision_tower.", "multi_modal_projector.")):
            continue  # the vision tower is not read (docs/gemma3.md)
        print("torch_grads.py: warning: ignoring unused tensor %s" % name, file=sys.stderr)
    return m, params


def _int_tensors(path, t, names, shape=None):
    """Validate 2-D integer tensors `names` of one shape; return them as int64 numpy arrays."""
    out = []
    for k in names:
        if t[k].dtype.kind not in "iu" or t[k].ndim != 2:
            raise InputError("%s: %s must be a 2-D integer tensor" % (path, k))
        shape = t[k].shape if shape is None else shape
        if t[k].shape != shape:
            raise InputError("%s: %s has shape %s, expected %s" % (path, k, t[k].shape, shape))
        out.append(t[k].astype(np.int64))
    if out[0].size == 0:
        raise InputError("%s: empty batch" % path)
    return out


def _check_rows(path, ids, labels, mask, V, prefix=""):
    """Token ids in [0, V), labels -100 or in [0, V), attention mask in {0, 1}."""
    if ids.min() < 0 or ids.max() >= V:
        raise InputError("%s: %sinput_ids outside [0, %d)" % (path, prefix, V))
    if not np.all((labels == IGNORE_INDEX) | ((labels >= 0) & (labels < V))):
        raise InputError("%s: %slabels must be -100 or in [0, %d)" % (path, prefix, V))
    if not np.all((mask == 0) | (mask == 1)):
        raise InputError("%s: %sattention_mask must be 0 or 1" % (path, prefix))


def _float_tensor(path, t, name, shape):
    """Float tensor `name` of exactly `shape`, as float64 (F32 values convert exactly)."""
    a = t[name]
    if a.dtype.kind != "f" or tuple(a.shape) != tuple(shape):
        raise InputError("%s: %s must be a float tensor of shape %s" % (path, name, list(shape)))
    return a.astype(np.float64)


def load_batch(path, V):
    """SFT batch: (input_ids, labels, attention_mask) as int64 [B, T] tensors, validated."""
    _, t = read_safetensors(path)
    for k in ("input_ids", "labels"):
        if k not in t:
            raise InputError("%s: missing tensor %s" % (path, k))
    if "attention_mask" not in t:
        t["attention_mask"] = np.ones_like(t["input_ids"])
    ids, labels, mask = _int_tensors(path, t, ("input_ids", "labels", "attention_mask"))
    _check_rows(path, ids, labels, mask, V)
    return torch.from_numpy(ids), torch.from_numpy(labels), torch.from_numpy(mask)


def load_sft(path, V, args):
    ids, labels, mask = load_batch(path, V)
    return dict(ids=ids, labels=labels, mask=mask)


def load_dpo(path, V, args):
    """DPO batch: the chosen rows, then the rejected rows, right-padded to a common T.

    As TRL's concatenated_forward: rows 0..B-1 chosen, B..2B-1 rejected; padding is id 0,
    mask 0, label -100 (right padding changes no logit of a real position under causal
    attention). ref_stat [2B] holds ref_chosen_logps then ref_rejected_logps, or None.
    """
    _, t = read_safetensors(path)
    sides = []
    for side in ("chosen", "rejected"):
        for k in ("input_ids", "labels"):
            if side + "_" + k not in t:
                raise InputError("%s: missing tensor %s_%s" % (path, side, k))
        names = [side + "_" + k for k in ("input_ids", "labels", "attention_mask")]
        if names[2] not in t:
            t[names[2]] = np.ones_like(t[names[0]])
        ids, labels, mask = _int_tensors(path, t, names)
        _check_rows(path, ids, labels, mask, V, side + "_")
        sides.append((ids, labels, mask))
    B = sides[0][0].shape[0]
    if sides[1][0].shape[0] != B:
        raise InputError("%s: %d chosen but %d rejected sequences"
                         % (path, B, sides[1][0].shape[0]))
    T = max(s[0].shape[1] for s in sides)
    rows = []
    for k, fill in ((0, 0), (1, IGNORE_INDEX), (2, 0)):
        padded = [np.pad(s[k], ((0, 0), (0, T - s[k].shape[1])), constant_values=fill)
                  for s in sides]
        rows.append(torch.from_numpy(np.concatenate(padded)))
    has = ["ref_chosen_logps" in t, "ref_rejected_logps" in t]
    if has[0] != has[1]:
        raise InputError("%s: ref_chosen_logps and ref_rejected_logps come together" % path)
    ref_stat = None
    if has[0]:
        ref_stat = torch.from_numpy(np.concatenate(
            [_float_tensor(path, t, "ref_%s_logps" % s, (B,)) for s in ("chosen", "rejected")]))
        if not torch.isfinite(ref_stat).all():
            raise InputError("%s: reference log-probs must be finite" % path)
    return dict(ids=rows[0], labels=rows[1], mask=rows[2], pairs=B, ref_stat=ref_stat)


def group_advantages(rewards, G, scale):
    """TRL's group-normalised advantages: groups of G consecutive rows,
    A = (r - mean) / (std + 1e-4) with the unbiased std (torch.std), or r - mean unscaled."""
    grouped = rewards.view(-1, G)
    mean = grouped.mean(dim=1).repeat_interleave(G)
    adv = rewards - mean
    if scale:
        adv = adv / (grouped.std(dim=1).repeat_interleave(G) + 1e-4)
    return adv


def load_grpo(path, V, args):
    """GRPO batch: labels = input_ids on completion tokens, -100 elsewhere (so position t predicts
    completion token t+1), advantages [B] (given, or from rewards and the group size), and the
    optional per-token old_logps / ref_logps moved from the scored token's position t to the
    predicting position t-1: [B, T-1], aligned with target_logprobs."""
    meta, t = read_safetensors(path)
    for k in ("input_ids", "completion_mask"):
        if k not in t:
            raise InputError("%s: missing tensor %s" % (path, k))
    if "attention_mask" not in t:
        t["attention_mask"] = np.ones_like(t["input_ids"])
    ids, cmask, mask = _int_tensors(path, t, ("input_ids", "completion_mask", "attention_mask"))
    if not np.all((cmask == 0) | (cmask == 1)):
        raise InputError("%s: completion_mask must be 0 or 1" % path)
    labels = np.where(cmask == 1, ids, IGNORE_INDEX)
    _check_rows(path, ids, labels, mask, V)
    B, T = ids.shape
    if ("advantages" in t) == ("rewards" in t):
        raise InputError("%s: a GRPO batch needs exactly one of advantages and rewards" % path)
    if "advantages" in t:
        adv = torch.from_numpy(_float_tensor(path, t, "advantages", (B,)))
    else:
        sizes = {meta[k] for k in ("group_size", "num_generations") if k in meta}
        if len(sizes) != 1:
            raise InputError("%s: rewards need one group size (group_size or num_generations) "
                             "in __metadata__" % path)
        try:
            G = int(sizes.pop())
        except ValueError:
            raise InputError("%s: the group size is not an integer" % path)
        if G < 2 or B % G != 0:
            raise InputError("%s: group size %d must be >= 2 and divide B = %d" % (path, G, B))
        rewards = torch.from_numpy(_float_tensor(path, t, "rewards", (B,)))
        adv = group_advantages(rewards, G, not args.no_scale_rewards)
    if not torch.isfinite(adv).all():
        raise InputError("%s: advantages (or rewards) must be finite" % path)
    valid = torch.from_numpy(cmask[:, 1:] == 1)
    per_token = {}
    for name in ("old_logps", "ref_logps"):
        if name in t:
            v = torch.from_numpy(_float_tensor(path, t, name, (B, T))[:, 1:].copy())
            if not torch.isfinite(v[valid]).all():
                raise InputError("%s: %s must be finite on completion tokens" % (path, name))
            per_token[name] = torch.where(valid, v, torch.zeros_like(v))
    return dict(ids=torch.from_numpy(ids), labels=torch.from_numpy(labels),
                mask=torch.from_numpy(mask), advantages=adv,
                old=per_token.get("old_logps"), ref=per_token.get("ref_logps"))


# ----------------------------------------------------------------------------- model

def rope_tables(m, T, dtype, local=False):
    """cos, sin of shape [T, HD/2]: computed in float64, then rounded to dtype. Gemma-3: the
    local (sliding) layers' table has base rope_local_base_freq and no scaling; the global one
    rope_theta, divided by the linear factor when there is one."""
    half = m["HD"] // 2
    theta = m["local_theta"] if local else m["theta"]
    inv_freq = [theta ** (-(2.0 * i) / m["HD"]) for i in range(half)]
    if not local and m.get("linear"):
        inv_freq = [f / m["linear"] for f in inv_freq]
    if m["llama3"] is not None:
        p = m["llama3"]
        O = p["original_max_position_embeddings"]
        lo, hi = p["low_freq_factor"], p["high_freq_factor"]
        for i, f in enumerate(inv_freq):
            wavelen = 2 * math.pi / f
            if wavelen < O / hi:
                continue
            if wavelen > O / lo:
                inv_freq[i] = f / p["factor"]
            else:
                s = (O / wavelen - lo) / (hi - lo)
                inv_freq[i] = (1 - s) * f / p["factor"] + s * f
    positions = torch.arange(T, dtype=torch.float64)
    angle = positions[:, None] * torch.tensor(inv_freq, dtype=torch.float64)[None, :]
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def rms_norm(x, w, eps):
    if x.dtype == torch.bfloat16:  # HF: normalise in float32, cast back, then scale
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
    return x * (1.0 / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)) * w


def rms_norm1p(x, w, eps):
    """Gemma3RMSNorm: x·rsqrt(mean(x²) + eps)·(1 + w); bf16: in float32, then cast back."""
    if x.dtype == torch.bfloat16:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
        return (y * (1.0 + w.float())).to(x.dtype)
    return x * (1.0 / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)) * (1.0 + w)


def linear(P, name, x):
    """x @ W^T (+ b when the model has that bias); W is [out, in] as in PyTorch. With a LoRA
    adapter on the module (load_lora), peft's LoraLayer: + lora_B(lora_A(x)) * scaling."""
    y = x @ P[name + ".weight"].t()
    y = y + P[name + ".bias"] if name + ".bias" in P else y
    if name + ".lora_A" in P:
        y = y + ((x @ P[name + ".lora_A"].t()) @ P[name + ".lora_B"].t()) * P["lora.scaling"]
    return y


LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def load_lora(adapter_dir, m, P, dtype):
    """Adds a peft LoRA adapter (adapter_config.json + adapter_model.safetensors) to P: the base
    tensors stop requiring grad, the adapter's lora_A [r, in] and lora_B [out, r] require it.
    Returns {peft tensor name: leaf tensor}. Read here, with nothing of streambp's code."""
    try:
        with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError("cannot read %s/adapter_config.json: %s" % (adapter_dir, e))
    if cfg.get("peft_type") != "LORA":
        raise InputError("%s: peft_type is not LORA" % adapter_dir)
    r, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
    targets = cfg["target_modules"]
    targets = LORA_MODULES if targets == "all-linear" else targets
    scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    tensors = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))[1]
    for p in P.values():
        p.requires_grad_(False)
    adapters = {}
    for l in range(m["L"]):
        for mod in LORA_MODULES:
            if mod not in targets:
                continue
            part = "self_attn." if mod in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp."
            name = "model.layers.%d.%s%s" % (l, part, mod)
            for ab in ("A", "B"):
                peft_name = "base_model.model.%s.lora_%s.weight" % (name, ab)
                if peft_name not in tensors:
                    raise InputError("%s: no tensor %s" % (adapter_dir, peft_name))
                t = torch.from_numpy(tensors[peft_name].astype(np.float64)).to(dtype)
                t.requires_grad_(True)
                P[name + ".lora_" + ab] = adapters[peft_name] = t
    P["lora.scaling"] = torch.tensor(scaling, dtype=dtype)
    return adapters


def rope(x, cos, sin):
    """x: [B, T, H, HD]; rotate pairs (i, i + HD/2) by angle t * inv_freq[i]."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def attention(q, k, v, mask, unattended="zero", window=0, scale=None):
    """q: [B,T,NH,HD], k/v: [B,T,NKV,HD], mask: [B,T] -> [B,T,NH*HD]. window W > 0: query t
    sees keys t - W < j <= t only (Gemma-3's sliding layers); scale: 1/sqrt(HD) unless given.

    Rows that see no key (queries before a left-padded row's first real token): "zero" gives 0;
    "hf-eager" does what HF's eager attention does — adds the mask's finite minimum to the
    scores, so such a row's softmax is uniform over all T keys while autograd still reaches q
    and k; "hf-sdpa" does what HF's sdpa path does — unmasks the row
    (AttentionMaskConverter._unmask_unattended), so it attends to every key."""
    B, T, NH, HD = q.shape
    rep = NH // k.shape[2]
    q = q.transpose(1, 2)                                   # [B, NH, T, HD]
    k = k.transpose(1, 2).repeat_interleave(rep, dim=1)    # head h reads kv head h // rep
    v = v.transpose(1, 2).repeat_interleave(rep, dim=1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    if window:
        causal = causal & ~torch.ones(T, T, dtype=torch.bool).tril(diagonal=-window)
    visible = (causal[None, :, :] & mask.bool()[:, None, :])[:, None]  # [B, 1, T(query), T(key)]
    has_key = visible.any(dim=-1, keepdim=True)                       # [B, 1, T, 1]
    scores = (q @ k.transpose(-1, -2)) * scale if scale is not None else (
        (q @ k.transpose(-1, -2)) / math.sqrt(HD))
    if unattended == "hf-eager":
        up = scores.float() if scores.dtype == torch.bfloat16 else scores
        additive = torch.zeros(visible.shape, dtype=up.dtype).masked_fill(
            ~visible, torch.finfo(up.dtype).min)
        probs = torch.softmax(up + additive, dim=-1).to(scores.dtype)
        return (probs @ v).transpose(1, 2).reshape(B, T, NH * HD)
    if unattended == "hf-sdpa":
        visible = visible | ~has_key
        has_key = torch.ones_like(has_key)
    # -inf only where a row has some visible key; rows with none get finite scores (all 0), so
    # softmax stays NaN-free, and their probabilities are then zeroed.
    scores = scores.masked_fill(~visible & has_key, float("-inf"))
    scores = scores.masked_fill(~has_key, 0.0)
    # HF's eager attention takes the softmax in float32 also for bf16 models
    up = scores.float() if scores.dtype == torch.bfloat16 else scores
    probs = torch.softmax(up, dim=-1).to(scores.dtype) * has_key.to(scores.dtype)
    return (probs @ v).transpose(1, 2).reshape(B, T, NH * HD)


def forward_gemma3(m, P, input_ids, mask):
    """Gemma3ForCausalLM's logits [B, T, V] (docs/gemma3.md, "Forward")."""
    B, T = input_ids.shape
    NH, NKV, HD, eps = m["NH"], m["NKV"], m["HD"], m["eps"]
    E = P["model.embed_tokens.weight"]
    tables = {False: rope_tables(m, T, E.dtype), True: rope_tables(m, T, E.dtype, local=True)}
    scale = m["qpas"] ** -0.5
    # hf-sdpa is hf-eager on Gemma-3: its mask is never unmasked (docs/gemma3.md, "Padding")
    unatt = "hf-eager" if m.get("unattended") == "hf-sdpa" else m.get("unattended", "zero")
    s_emb = torch.tensor(math.sqrt(m["C"]), dtype=torch.float64).to(E.dtype)
    x = torch.nn.functional.embedding(input_ids, E, padding_idx=m["pad"]) * s_emb
    for l in range(m["L"]):
        p = "model.layers.%d." % l
        W = layer_window(m, l)
        cos, sin = tables[W > 0]
        a = rms_norm1p(x, P[p + "input_layernorm.weight"], eps)
        q = linear(P, p + "self_attn.q_proj", a).view(B, T, NH, HD)
        k = linear(P, p + "self_attn.k_proj", a).view(B, T, NKV, HD)
        v = linear(P, p + "self_attn.v_proj", a).view(B, T, NKV, HD)
        q = rope(rms_norm1p(q, P[p + "self_attn.q_norm.weight"], eps), cos, sin)
        k = rope(rms_norm1p(k, P[p + "self_attn.k_norm.weight"], eps), cos, sin)
        o = attention(q, k, v, mask, unatt, window=W, scale=scale)
        x = x + rms_norm1p(linear(P, p + "self_attn.o_proj", o),
                           P[p + "post_attention_layernorm.weight"], eps)
        xm = rms_norm1p(x, P[p + "pre_feedforward_layernorm.weight"], eps)
        h = torch.nn.functional.gelu(linear(P, p + "mlp.gate_proj", xm), approximate="tanh")
        x = x + rms_norm1p(linear(P, p + "mlp.down_proj", h * linear(P, p + "mlp.up_proj", xm)),
                           P[p + "post_feedforward_layernorm.weight"], eps)
    head = E if m["tied"] else P["lm_head.weight"]
    return rms_norm1p(x, P["model.norm.weight"], eps) @ head.t()


def forward(m, P, input_ids, mask):
    """Logits [B, T, V] in the compute dtype."""
    if m["family"] == "gemma3_text":
        return forward_gemma3(m, P, input_ids, mask)
    B, T = input_ids.shape
    NH, NKV, HD, eps = m["NH"], m["NKV"], m["HD"], m["eps"]
    E = P["model.embed_tokens.weight"]
    cos, sin = rope_tables(m, T, E.dtype)
    x = E[input_ids] if m.get("pad") is None else torch.nn.functional.embedding(
        input_ids, E, padding_idx=m.get("pad"))
    for l in range(m["L"]):
        p = "model.layers.%d." % l
        xn = rms_norm(x, P[p + "input_layernorm.weight"], eps)
        q = linear(P, p + "self_attn.q_proj", xn).view(B, T, NH, HD)
        k = linear(P, p + "self_attn.k_proj", xn).view(B, T, NKV, HD)
        v = linear(P, p + "self_attn.v_proj", xn).view(B, T, NKV, HD)
        if m["family"] == "qwen3":
            q = rms_norm(q, P[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, P[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        x = x + linear(P, p + "self_attn.o_proj",
                       attention(q, k, v, mask, m.get("unattended", "zero")))
        xn2 = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(linear(P, p + "mlp.gate_proj", xn2))
        x = x + linear(P, p + "mlp.down_proj", gate * linear(P, p + "mlp.up_proj", xn2))
    head = E if m["tied"] else P["lm_head.weight"]
    return rms_norm(x, P["model.norm.weight"], eps) @ head.t()


# ----------------------------------------------------------------------------- objectives

def target_logprobs(logits, labels, temperature=1.0):
    """Per-target log-probabilities, float64, shape [B, T-1]:
    log softmax(logits[:, t] / temperature)[labels[:, t+1]].

    Returns (logp, valid); logp is 0 where the target is -100 (valid False). The logits are cast
    to float64 before the division by the temperature.
    """
    targets = labels[:, 1:]
    valid = targets != IGNORE_INDEX
    logp_all = torch.log_softmax(logits[:, :-1, :].to(torch.float64) / temperature, dim=-1)
    logp = logp_all.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(valid, logp, torch.zeros_like(logp)), valid


def sft_loss(logits, batch, hp):
    """Mean cross-entropy over the valid targets of the whole batch (float64)."""
    logp, valid = target_logprobs(logits, batch["labels"])
    return -logp.sum() / int(valid.sum())


def dpo_row_stat(logp, valid, loss_type):
    """The per-row statistic of DPO: the summed log-probs, or their mean for ipo (as TRL)."""
    s = logp.sum(dim=-1)
    return s / valid.sum(dim=-1) if loss_type == "ipo" else s


def dpo_loss(logits, batch, hp):
    """TRL DPOTrainer: z = (S_chosen - S_rejected) - (R_chosen - R_rejected) per pair;
    sigmoid: -(1-ls) log sigmoid(beta z) - ls log sigmoid(-beta z); ipo: (z - 1/(2 beta))^2;
    the mean over pairs."""
    logp, valid = target_logprobs(logits, batch["labels"])
    S, R, P = dpo_row_stat(logp, valid, hp.loss_type), batch["ref_stat"], batch["pairs"]
    z = (S[:P] - S[P:]) - (R[:P] - R[P:])
    if hp.loss_type == "ipo":
        losses = (z - 1 / (2 * hp.beta)) ** 2
    else:
        logsig = torch.nn.functional.logsigmoid
        losses = (-logsig(hp.beta * z) * (1 - hp.label_smoothing)
                  - logsig(-hp.beta * z) * hp.label_smoothing)
    return losses.mean()


def grpo_loss(logits, batch, hp):
    """TRL GRPOTrainer's clipped surrogate with the optional k3 KL term, per completion token:
    l = -min(ratio A, clamp(ratio, 1 - eps_low, 1 + eps_high) A)
        + beta (exp(ref - logp) - (ref - logp) - 1),   ratio = exp(logp - old),
    logp at the temperature, old = logp.detach() when the batch has none; then normalised per
    loss type (grpo: per-row mean, then the mean over rows; bnpo: over all completion tokens;
    dr_grpo: by B * max_completion_length; dapo: by the completion tokens of the batch)."""
    logp, valid = target_logprobs(logits, batch["labels"], hp.temperature)
    old = batch["old"] if batch["old"] is not None else logp.detach()
    A = batch["advantages"][:, None]
    ratio = torch.exp(logp - old)
    clipped = torch.clamp(ratio, 1 - hp.epsilon_low, 1 + hp.epsilon_high)
    per_token = -torch.min(ratio * A, clipped * A)
    if hp.beta != 0:
        d = batch["ref"] - logp
        per_token = per_token + hp.beta * (torch.exp(d) - d - 1)
    per_token = torch.where(valid, per_token, torch.zeros_like(per_token))
    n_rows = valid.sum(dim=-1).to(torch.float64)
    B = per_token.shape[0]
    if hp.loss_type == "grpo":
        return (per_token.sum(dim=-1) / n_rows.clamp(min=1.0)).mean()
    if hp.loss_type == "bnpo":
        return per_token.sum() / n_rows.sum().clamp(min=1.0)
    if hp.loss_type == "dr_grpo":
        return per_token.sum() / (B * hp.max_completion_length)
    return per_token.sum() / n_rows.sum()  # dapo: num_items_in_batch, one process


class Objective:
    """One objective: its batch loader, its loss types (the first is the default), its default
    beta, and its loss function loss(logits, batch, hp) -> float64 scalar."""

    def __init__(self, load, loss_types, beta, loss):
        self.load, self.loss_types, self.beta, self.loss = load, loss_types, beta, loss


OBJECTIVES = {"sft": Objective(load_sft, (), None, sft_loss),
              "dpo": Objective(load_dpo, ("sigmoid", "ipo"), 0.1, dpo_loss),
              "grpo": Objective(load_grpo, ("grpo", "bnpo", "dr_grpo", "dapo"), 0.0, grpo_loss)}


def compute_loss(m, P, batch, hp):
    logits = forward(m, P, batch["ids"], batch["mask"])
    return OBJECTIVES[hp.objective].loss(logits, batch, hp)


def prepare_objective(m, batch, hp, ref_model):
    """Check the batch against the objective and fill in the reference values.

    With ref_model = (model description, params), its log-probs (same dtype, no_grad) replace
    the batch's: for DPO the row statistic, for GRPO the per-token values (at the temperature,
    as TRL scores the reference model). Returns the number of targets."""
    labels = batch["labels"]
    valid = labels[:, 1:] != IGNORE_INDEX
    n = int(valid.sum())
    if ref_model is not None:
        rm, rP = ref_model
        if rm["V"] != m["V"]:
            raise InputError("the reference model's vocabulary (%d) differs from the model's (%d)"
                             % (rm["V"], m["V"]))
        with torch.no_grad():
            logits = forward(rm, rP, batch["ids"], batch["mask"])
            logp, _ = target_logprobs(logits, labels, hp.temperature)
        if hp.objective == "dpo":
            batch["ref_stat"] = dpo_row_stat(logp, valid, hp.loss_type)
        elif hp.objective == "grpo":
            batch["ref"] = logp
    if hp.objective == "sft" and n == 0:
        raise InputError("no target to predict (every shifted label is -100)")
    if hp.objective == "dpo":
        empty = (valid.sum(dim=-1) == 0).nonzero().reshape(-1).tolist()
        if empty:
            raise InputError("DPO rows %s have no target (a pair needs both)" % empty)
        if batch["ref_stat"] is None:
            raise InputError("DPO needs reference log-probs: ref_chosen_logps and "
                             "ref_rejected_logps in the batch, or --ref-model")
    if hp.objective == "grpo":
        if hp.beta > 0 and batch["ref"] is None:
            raise InputError("the KL term (beta > 0) needs ref_logps in the batch or --ref-model")
        if hp.loss_type == "dapo" and n == 0:
            raise InputError("dapo divides by the completion tokens, and there are none")
    return n


# ----------------------------------------------------------------------------- checks and main

def fd_check(m, P, batch, hp, k, seed=0, step=1e-5):
    """Central differences on k entries of every tensor; returns the worst relative error.

    Entries are drawn among those with a nonzero gradient (plus one with a zero gradient, when
    there is one, to check it really is zero). rel = |fd - g| / max(|fd|, |g|, 1e-4): absolute
    errors below ~1e-9 are FD noise and always pass.
    """
    gen = torch.Generator().manual_seed(seed)
    worst = (0.0, "")
    with torch.no_grad():
        for name, p in P.items():
            g, flat = p.grad.reshape(-1), p.data.view(-1)
            nonzero = g.nonzero().reshape(-1)
            zero = (g == 0).nonzero().reshape(-1)
            picks = nonzero[torch.randperm(len(nonzero), generator=gen)[:k]].tolist()
            if len(zero):
                picks.append(int(zero[torch.randint(len(zero), (1,), generator=gen)]))
            for i in picks:
                old = float(flat[i])
                flat[i] = old + step
                up = float(compute_loss(m, P, batch, hp))
                flat[i] = old - step
                down = float(compute_loss(m, P, batch, hp))
                flat[i] = old
                fd, an = (up - down) / (2 * step), float(g[i])
                rel = abs(fd - an) / max(abs(fd), abs(an), 1e-4)
                if rel >= worst[0]:
                    worst = (rel, "%s[%d] fd=%.12g autograd=%.12g" % (name, i, fd, an))
    return worst


def hyper_parameters(ap, args):
    """Resolve per-objective defaults and check the options; returns args (completed)."""
    obj = OBJECTIVES[args.objective]
    if args.objective == "sft":
        given = [o for o, v in (("--loss-type", args.loss_type), ("--beta", args.beta),
                                ("--label-smoothing", args.label_smoothing),
                                ("--epsilon-low", args.epsilon_low),
                                ("--epsilon-high", args.epsilon_high),
                                ("--temperature", args.temperature),
                                ("--max-completion-length", args.max_completion_length),
                                ("--ref-model", args.ref_model)) if v is not None]
        if given or args.no_scale_rewards:
            ap.error("%s: not an SFT option" % ", ".join(given or ["--no-scale-rewards"]))
        args.temperature = 1.0
        return args
    if args.loss_type is None:
        args.loss_type = obj.loss_types[0]
    if args.loss_type not in obj.loss_types:
        ap.error("--loss-type %s: %s takes %s" % (args.loss_type, args.objective,
                                                  "|".join(obj.loss_types)))
    args.beta = obj.beta if args.beta is None else args.beta
    args.label_smoothing = args.label_smoothing or 0.0
    args.epsilon_low = 0.2 if args.epsilon_low is None else args.epsilon_low
    args.epsilon_high = 0.2 if args.epsilon_high is None else args.epsilon_high
    if args.objective == "dpo":
        if args.temperature not in (None, 1.0):
            ap.error("--temperature: DPO runs at temperature 1")
        if not (math.isfinite(args.beta) and args.beta > 0):
            ap.error("--beta must be > 0 for DPO")
        if not 0 <= args.label_smoothing <= 0.5:
            ap.error("--label-smoothing must be in [0, 0.5]")
    else:
        if not (math.isfinite(args.beta) and args.beta >= 0):
            ap.error("--beta must be >= 0 for GRPO")
        if not (min(args.epsilon_low, args.epsilon_high) >= 0
                and math.isfinite(args.epsilon_low + args.epsilon_high)):
            ap.error("--epsilon-low and --epsilon-high must be finite and >= 0")
        if args.max_completion_length is not None and args.max_completion_length < 1:
            ap.error("--max-completion-length must be >= 1")
    args.temperature = 1.0 if args.temperature is None else args.temperature
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        ap.error("--temperature must be finite and > 0")
    return args


def objective_metadata(hp, T):
    """The objective and its hyper-parameters, as __metadata__ strings."""
    meta = {"objective": hp.objective}
    if hp.objective == "dpo":
        meta.update(loss_type=hp.loss_type, beta="%.17g" % hp.beta,
                    label_smoothing="%.17g" % hp.label_smoothing)
    elif hp.objective == "grpo":
        meta.update(loss_type=hp.loss_type, beta="%.17g" % hp.beta,
                    epsilon_low="%.17g" % hp.epsilon_low, epsilon_high="%.17g" % hp.epsilon_high,
                    temperature="%.17g" % hp.temperature,
                    max_completion_length=str(hp.max_completion_length),
                    scale_rewards=str(not hp.no_scale_rewards).lower())
    if hp.ref_model:
        meta["ref_model"] = hp.ref_model
    return meta


def run_jobs(path):
    """--jobs FILE: one run per non-empty line of FILE (its arguments, quoted as for a shell),
    all in this process, so that torch is imported once. Returns the highest exit status."""
    try:
        with open(path) as f:
            jobs = [line.strip() for line in f if line.strip()]
    except OSError as e:
        print("torch_grads.py: error: cannot read %s: %s" % (path, e), file=sys.stderr)
        return 2
    worst = 0
    for job in jobs:
        try:
            rc = main(shlex.split(job))
        except SystemExit as e:  # argparse errors
            rc = e.code if isinstance(e.code, int) else 2
        if rc:
            print("torch_grads.py: job failed with status %d: %s" % (rc, job), file=sys.stderr)
        worst = max(worst, rc)
    return worst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", metavar="FILE",
                    help="run the argument lists of FILE, one per line, in one process")
    ap.add_argument("--model", help="HF model directory (required)")
    ap.add_argument("--batch", help="batch safetensors file (required)")
    ap.add_argument("--out", help="gradient safetensors file to write")
    ap.add_argument("--dtype", choices=("float64", "float32", "bfloat16"), default="float64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lora", metavar="DIR",
                    help="a peft LoRA adapter directory: the base frozen, the adapter's gradient")
    ap.add_argument("--unattended", choices=("zero", "hf-eager", "hf-sdpa"), default="zero",
                    help="attention rows that see no key (default zero; see attention())")
    ap.add_argument("--objective", choices=sorted(OBJECTIVES), default="sft")
    ap.add_argument("--loss-type", choices=("sigmoid", "ipo", "grpo", "bnpo", "dr_grpo", "dapo"),
                    help="dpo: sigmoid (default) or ipo; grpo: grpo (default), bnpo, dr_grpo, dapo")
    ap.add_argument("--beta", type=float,
                    help="DPO beta (default 0.1); GRPO KL coefficient (default 0: no KL term)")
    ap.add_argument("--label-smoothing", type=float, help="DPO sigmoid (default 0)")
    ap.add_argument("--epsilon-low", type=float, help="GRPO clip: 1 - eps_low (default 0.2)")
    ap.add_argument("--epsilon-high", type=float, help="GRPO clip: 1 + eps_high (default 0.2)")
    ap.add_argument("--temperature", type=float, help="GRPO: logits / temperature (default 1)")
    ap.add_argument("--max-completion-length", type=int,
                    help="GRPO dr_grpo normaliser (default: T)")
    ap.add_argument("--no-scale-rewards", action="store_true",
                    help="GRPO: advantages r - mean, without dividing by the group std")
    ap.add_argument("--ref-model", metavar="DIR",
                    help="reference model: its log-probs replace the batch's (DPO, GRPO)")
    ap.add_argument("--fd-check", type=int, default=0, metavar="K",
                    help="finite-difference check of K entries per tensor (float64 only)")
    args = ap.parse_args(argv)
    if args.jobs is not None:
        if vars(args) != vars(ap.parse_args(["--jobs", args.jobs])):
            ap.error("--jobs takes no other option")
        return run_jobs(args.jobs)
    if args.model is None or args.batch is None:
        ap.error("--model and --batch are required")
    if args.out is None and args.fd_check <= 0:
        ap.error("--out is required (unless --fd-check is given)")
    if args.fd_check > 0 and args.dtype != "float64":
        ap.error("--fd-check needs --dtype float64")
    hp = hyper_parameters(ap, args)
    torch.set_num_threads(max(1, args.threads))
    dtype = getattr(torch, args.dtype)
    try:
        m, P = load_model(args.model, dtype)
        m["unattended"] = args.unattended
        adapters = load_lora(args.lora, m, P, dtype) if args.lora else None
        ref_model = load_model(args.ref_model, dtype) if args.ref_model else None
        if ref_model is not None:
            ref_model[0]["unattended"] = args.unattended
        batch = OBJECTIVES[hp.objective].load(args.batch, m["V"], hp)
        T = batch["ids"].shape[1]
        if hp.objective == "grpo" and hp.max_completion_length is None:
            hp.max_completion_length = T
        n = prepare_objective(m, batch, hp, ref_model)
    except InputError as e:
        print("torch_grads.py: error: %s" % e, file=sys.stderr)
        return 2
    if hp.objective == "grpo" and batch["old"] is None and args.fd_check > 0:
        # old = logp.detach() makes the ratio 1 whatever the weights, so differences of the loss
        # would not see the clipped term; freezing old at the current log-probs gives the same
        # loss and gradient here, and a function the differences can check.
        with torch.no_grad():
            logits = forward(m, P, batch["ids"], batch["mask"])
            batch["old"] = target_logprobs(logits, batch["labels"], hp.temperature)[0]
    labels, mask = batch["labels"], batch["mask"]
    from_pad = int(((labels[:, 1:] != IGNORE_INDEX) & (mask[:, :-1] == 0)).sum())
    loss = compute_loss(m, P, batch, hp)
    loss.backward()
    if adapters is not None:  # the base is frozen: the adapter's gradient, under peft's names
        grads = {name: t.grad for name, t in adapters.items()}
    else:
        grads = {name: p.grad for name, p in P.items()}
    bad = [name for name, g in grads.items() if not torch.isfinite(g).all()]
    if not math.isfinite(float(loss)) or bad:
        print("torch_grads.py: error: non-finite loss or gradient in %s" % (bad or "loss"),
              file=sys.stderr)
        return 1
    print("loss=%.17g n_targets=%d targets_from_padded=%d model_type=%s dtype=%s objective=%s%s"
          % (float(loss), n, from_pad, m["family"], args.dtype, hp.objective,
             "" if hp.objective == "sft" else " loss_type=" + hp.loss_type))
    if args.fd_check > 0:
        worst, where = fd_check(m, P, batch, hp, args.fd_check)
        print("fd-check: worst relative error %.3e at %s" % (worst, where))
        if worst > 1e-5:
            return 1
    if args.out:
        meta = {"loss": "%.17g" % float(loss), "n_targets": str(n),
                "implementation": "verify/torch_grads.py", "torch_version": torch.__version__,
                "dtype": args.dtype, "model_type": m["family"],
                "targets_from_padded": str(from_pad)}
        meta.update(objective_metadata(hp, T))
        if dtype == torch.bfloat16:  # written as F32: every bf16 value is exact in float32
            grads = {name: g.float() for name, g in grads.items()}
        write_safetensors(args.out, grads, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
