#!/usr/bin/python3
"""Independent PyTorch cross-check of streambp's gradients (see ref/SEMANTICS.md, the contract).

Loads a Hugging Face decoder (model_type qwen3, qwen2 or llama) and a batch, computes the SFT loss
with plain autograd, and writes d(loss)/d(parameter) for every parameter under its HF name.
It imports neither transformers nor safetensors; the safetensors format is read and written here.

Semantic choices (all from ref/SEMANTICS.md):
  * RMSNorm (x / sqrt(mean(x^2) + eps)) * w; Qwen3 adds per-head q_norm/k_norm before RoPE;
    Qwen2 has q/k/v biases; SwiGLU MLP with silu; GQA: query head h reads kv head h // (NH/NKV).
  * RoPE, rotate-half pairs (i, i + HD/2), inv_freq[i] = theta^(-2i/HD), optional llama3 scaling;
    inv_freq, angles, cos and sin are computed in float64 and rounded once to the compute dtype.
    Positions are 0..T-1 in every row, padded or not.
  * Key j is visible from query t iff j <= t and attention_mask[j] == 1. A query with no visible
    key outputs exactly 0 (HF gives such rows mask-backend artefacts instead).
  * SFT loss: logits at t predict labels[t+1]; -100 is ignored; the sum of per-target negative
    log-likelihoods (log_softmax in float64) is divided by N, the number of valid targets of the
    whole batch. N = 0 is an input error.
  * Tied embeddings: the head uses model.embed_tokens.weight and there is no lm_head.weight; the
    embedding gradient includes the head's contribution (autograd accumulates it).
Exit status: 0 ok, 2 bad input or unsupported model, 1 --fd-check failure.
"""
import argparse
import json
import math
import os
import struct
import sys
import tempfile

import numpy as np
import torch

IGNORE_INDEX = -100
ST_DTYPES = {"F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2),
             "I64": ("<i8", 8), "I32": ("<i4", 4)}
FAMILIES = ("qwen3", "qwen2", "llama")


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
        raise InputError("model_type %r is not supported (qwen3, qwen2, llama)" % (family,))
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
                llama3=llama3, tied=bool(cfg.get("tie_word_embeddings", False)))


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
        if m["family"] == "qwen3":
            out += [(p + "self_attn.q_norm.weight", (HD,)), (p + "self_attn.k_norm.weight", (HD,))]
        out += [(p + "mlp.gate_proj.weight", (F, C)), (p + "mlp.up_proj.weight", (F, C)),
                (p + "mlp.down_proj.weight", (C, F)), (p + "input_layernorm.weight", (C,)),
                (p + "post_attention_layernorm.weight", (C,))]
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
    for name, shape in param_shapes(m):
        if name not in found:
            raise InputError("model is missing tensor %s" % name)
        if tuple(found[name].shape) != shape:
            raise InputError("%s has shape %s, expected %s" % (name, found[name].shape, shape))
        if found[name].dtype.kind != "f":
            raise InputError("%s is not a floating-point tensor" % name)
        params[name] = torch.from_numpy(found.pop(name).astype(np.float64)).to(dtype)
        params[name].requires_grad_(True)
    for name in found:
        print("torch_grads.py: warning: ignoring unused tensor %s" % name, file=sys.stderr)
    return m, params


def load_batch(path, V):
    """Return (input_ids, labels, attention_mask) as int64 [B, T] tensors, validated."""
    _, t = read_safetensors(path)
    for k in ("input_ids", "labels"):
        if k not in t:
            raise InputError("%s: missing tensor %s" % (path, k))
    if "attention_mask" not in t:
        t["attention_mask"] = np.ones_like(t["input_ids"])
    for k in ("input_ids", "labels", "attention_mask"):
        if t[k].dtype.kind != "i" or t[k].ndim != 2:
            raise InputError("%s: %s must be a 2-D I32 or I64 tensor" % (path, k))
        if t[k].shape != t["input_ids"].shape:
            raise InputError("%s: %s shape differs from input_ids" % (path, k))
    ids, labels, mask = (t[k].astype(np.int64) for k in ("input_ids", "labels", "attention_mask"))
    if ids.size == 0:
        raise InputError("%s: empty batch" % path)
    if ids.min() < 0 or ids.max() >= V:
        raise InputError("%s: input_ids outside [0, %d)" % (path, V))
    if not np.all((labels == IGNORE_INDEX) | ((labels >= 0) & (labels < V))):
        raise InputError("%s: labels must be -100 or in [0, %d)" % (path, V))
    if not np.all((mask == 0) | (mask == 1)):
        raise InputError("%s: attention_mask must be 0 or 1" % path)
    return torch.from_numpy(ids), torch.from_numpy(labels), torch.from_numpy(mask)


# ----------------------------------------------------------------------------- model

def rope_tables(m, T, dtype):
    """cos, sin of shape [T, HD/2]: computed in float64, then rounded to dtype."""
    half = m["HD"] // 2
    inv_freq = [m["theta"] ** (-(2.0 * i) / m["HD"]) for i in range(half)]
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


def linear(P, name, x):
    """x @ W^T (+ b when the model has that bias); W is [out, in] as in PyTorch."""
    y = x @ P[name + ".weight"].t()
    return y + P[name + ".bias"] if name + ".bias" in P else y


def rope(x, cos, sin):
    """x: [B, T, H, HD]; rotate pairs (i, i + HD/2) by angle t * inv_freq[i]."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def attention(q, k, v, mask):
    """q: [B,T,NH,HD], k/v: [B,T,NKV,HD], mask: [B,T] -> [B,T,NH*HD]. No-visible-key rows -> 0."""
    B, T, NH, HD = q.shape
    rep = NH // k.shape[2]
    q = q.transpose(1, 2)                                   # [B, NH, T, HD]
    k = k.transpose(1, 2).repeat_interleave(rep, dim=1)    # head h reads kv head h // rep
    v = v.transpose(1, 2).repeat_interleave(rep, dim=1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    visible = (causal[None, :, :] & mask.bool()[:, None, :])[:, None]  # [B, 1, T(query), T(key)]
    has_key = visible.any(dim=-1, keepdim=True)                       # [B, 1, T, 1]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(HD)
    # -inf only where a row has some visible key; rows with none get finite scores (all 0), so
    # softmax stays NaN-free, and their probabilities are then zeroed.
    scores = scores.masked_fill(~visible & has_key, float("-inf"))
    scores = scores.masked_fill(~has_key, 0.0)
    # HF's eager attention takes the softmax in float32 also for bf16 models
    up = scores.float() if scores.dtype == torch.bfloat16 else scores
    probs = torch.softmax(up, dim=-1).to(scores.dtype) * has_key.to(scores.dtype)
    return (probs @ v).transpose(1, 2).reshape(B, T, NH * HD)


def forward(m, P, input_ids, mask):
    """Logits [B, T, V] in the compute dtype."""
    B, T = input_ids.shape
    NH, NKV, HD, eps = m["NH"], m["NKV"], m["HD"], m["eps"]
    E = P["model.embed_tokens.weight"]
    cos, sin = rope_tables(m, T, E.dtype)
    x = E[input_ids]
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
        x = x + linear(P, p + "self_attn.o_proj", attention(q, k, v, mask))
        xn2 = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(linear(P, p + "mlp.gate_proj", xn2))
        x = x + linear(P, p + "mlp.down_proj", gate * linear(P, p + "mlp.up_proj", xn2))
    head = E if m["tied"] else P["lm_head.weight"]
    return rms_norm(x, P["model.norm.weight"], eps) @ head.t()


# ----------------------------------------------------------------------------- objectives

def target_logprobs(logits, labels):
    """Per-target log-probabilities, float64, shape [B, T-1]: log p(labels[:, t+1] | logits[:, t]).

    Returns (logp, valid); logp is 0 where the target is -100 (valid False). Objectives other than
    SFT (DPO, GRPO) can be written on top of this function.
    """
    targets = labels[:, 1:]
    valid = targets != IGNORE_INDEX
    logp_all = torch.log_softmax(logits[:, :-1, :].to(torch.float64), dim=-1)
    logp = logp_all.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(valid, logp, torch.zeros_like(logp)), valid


def sft_loss(logits, labels, n_targets):
    """Mean cross-entropy over the n_targets valid targets of the whole batch (float64)."""
    logp, _ = target_logprobs(logits, labels)
    return -logp.sum() / n_targets


def count_sft_targets(labels):
    return int((labels[:, 1:] != IGNORE_INDEX).sum())


OBJECTIVES = {"sft": (count_sft_targets, sft_loss)}


def compute_loss(m, P, batch, objective):
    ids, labels, mask = batch
    count, loss_fn = OBJECTIVES[objective]
    return loss_fn(forward(m, P, ids, mask), labels, count(labels))


# ----------------------------------------------------------------------------- checks and main

def fd_check(m, P, batch, objective, k, seed=0, step=1e-5):
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
                up = float(compute_loss(m, P, batch, objective))
                flat[i] = old - step
                down = float(compute_loss(m, P, batch, objective))
                flat[i] = old
                fd, an = (up - down) / (2 * step), float(g[i])
                rel = abs(fd - an) / max(abs(fd), abs(an), 1e-4)
                if rel >= worst[0]:
                    worst = (rel, "%s[%d] fd=%.12g autograd=%.12g" % (name, i, fd, an))
    return worst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF model directory")
    ap.add_argument("--batch", required=True, help="batch safetensors file")
    ap.add_argument("--out", help="gradient safetensors file to write")
    ap.add_argument("--dtype", choices=("float64", "float32", "bfloat16"), default="float64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--objective", choices=sorted(OBJECTIVES), default="sft")
    ap.add_argument("--fd-check", type=int, default=0, metavar="K",
                    help="finite-difference check of K entries per tensor (float64 only)")
    args = ap.parse_args(argv)
    if args.out is None and args.fd_check <= 0:
        ap.error("--out is required (unless --fd-check is given)")
    if args.fd_check > 0 and args.dtype != "float64":
        ap.error("--fd-check needs --dtype float64")
    torch.set_num_threads(max(1, args.threads))
    dtype = getattr(torch, args.dtype)
    try:
        m, P = load_model(args.model, dtype)
        batch = load_batch(args.batch, m["V"])
        n = OBJECTIVES[args.objective][0](batch[1])
        if n == 0:
            raise InputError("%s: no target to predict (every shifted label is -100)" % args.batch)
    except InputError as e:
        print("torch_grads.py: error: %s" % e, file=sys.stderr)
        return 2
    ids, labels, mask = batch
    from_pad = int(((labels[:, 1:] != IGNORE_INDEX) & (mask[:, :-1] == 0)).sum())
    loss = compute_loss(m, P, batch, args.objective)
    loss.backward()
    grads = {name: p.grad for name, p in P.items()}
    bad = [name for name, g in grads.items() if not torch.isfinite(g).all()]
    if not math.isfinite(float(loss)) or bad:
        print("torch_grads.py: error: non-finite loss or gradient in %s" % (bad or "loss"),
              file=sys.stderr)
        return 1
    print("loss=%.17g n_targets=%d targets_from_padded=%d model_type=%s dtype=%s"
          % (float(loss), n, from_pad, m["family"], args.dtype))
    if args.fd_check > 0:
        worst, where = fd_check(m, P, batch, args.objective, args.fd_check)
        print("fd-check: worst relative error %.3e at %s" % (worst, where))
        if worst > 1e-5:
            return 1
    if args.out:
        meta = {"loss": "%.17g" % float(loss), "n_targets": str(n), "objective": args.objective,
                "implementation": "verify/torch_grads.py", "torch_version": torch.__version__,
                "dtype": args.dtype, "model_type": m["family"],
                "targets_from_padded": str(from_pad)}
        if dtype == torch.bfloat16:  # written as F32: every bf16 value is exact in float32
            grads = {name: g.float() for name, g in grads.items()}
        write_safetensors(args.out, grads, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
