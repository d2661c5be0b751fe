"""dump_grads: a torch model's gradients as a safetensors file under Hugging Face names."""
import re

from . import _safetensors

EMBED = "model.embed_tokens.weight"
HEAD = "lm_head.weight"

# peft LoRA/DoRA adapter tensors: not base-model parameters (adapter audits come later)
# wrapper modules that add a path segment: DDP/DataParallel, torch.compile, FSDP, activation
# checkpointing
_WRAPPER = re.compile(r"(^|\.)(module|_orig_mod|_fsdp_wrapped_module|_checkpoint_wrapped_module)\.")
_ADAPTER = re.compile(r"(^|\.)(lora_[A-Za-z_]+|lora_magnitude_vector)(\.|$)")


def hf_name(name):
    """The Hugging Face name of a parameter of a wrapped model, or None for tensors that are not
    base-model parameters (peft adapters, peft's frozen copy of a module it also trains).

    Strips `module.` (DistributedDataParallel, DataParallel; nested too), `_orig_mod.`
    (torch.compile), `_fsdp_wrapped_module.` and `_checkpoint_wrapped_module.` (FSDP, activation
    checkpointing), `base_model.model.` (peft), `.base_layer.` (a peft-wrapped Linear) and
    `.modules_to_save.<adapter>.` (peft's trained copy of a module)."""
    if _ADAPTER.search(name) or ".original_module." in name:
        return None
    for _ in range(2):  # a second pass for overlapping repeats ("module.module.")
        name = _WRAPPER.sub(r"\1", name)
    if name.startswith("base_model.model."):
        name = name[len("base_model.model."):]
    name = name.replace(".base_layer.", ".")
    name = re.sub(r"\.modules_to_save\.[^.]+\.", ".", name)
    return name


def _raw(t, dtype):
    """(dtype code, shape, bytes) of a tensor, converted to dtype when given."""
    import torch
    codes = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
             torch.bfloat16: "BF16"}
    t = t.detach()
    if dtype is not None:
        t = t.to(dtype)
    if t.dtype not in codes:
        raise ValueError("gradient dtype %s is not a float dtype safetensors files hold" % t.dtype)
    t = t.cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: write the bits
        raw = t.view(torch.int16).numpy().tobytes()
    else:
        raw = t.numpy().tobytes()
    return codes[t.dtype], tuple(t.shape), raw


def _dtype(dtype):
    import torch
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {"float64": torch.float64, "fp64": torch.float64, "float32": torch.float32,
             "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ValueError("dtype %r: use a torch float dtype or one of %s" % (dtype, sorted(names)))
    return names[dtype]


def dump_grads(model, path, dtype=None, loss=None, metadata=None):
    """Writes every parameter's .grad of `model` to `path` (safetensors) under its Hugging Face
    name, and returns the names written, in the model's order.

    - Wrapper prefixes are stripped (see hf_name); peft adapter tensors are skipped.
    - A parameter registered under several names (a tied lm_head and embedding) is written once,
      under model.embed_tokens.weight when that is one of its names: its .grad already holds the
      sum of both uses, which is what streambp expects for a tied model.
    - Frozen parameters (requires_grad False) are skipped; a trainable one without .grad is an
      error (run loss.backward() first).
    - dtype: None keeps each gradient's dtype (F32, F64, BF16, F16); else a torch dtype or
      "float32", "float64", "bfloat16", "float16".
    - loss (a number or a 0-d tensor) is recorded as the "loss" metadata, which the audit prints
      beside the truth's; metadata adds other string pairs (e.g. objective="dpo", beta="0.1":
      the audit warns when they differ from its own options).
    """
    dtype = _dtype(dtype)
    # every name of every parameter, in registration order (named_parameters keeps only the
    # first name of a shared parameter, which is not always the embedding's)
    names, order = {}, []
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod._parameters.items():
            if p is None:
                continue
            full = "%s.%s" % (mod_name, pname) if mod_name else pname
            if id(p) not in names:
                names[id(p)] = (p, [])
                order.append(id(p))
            names[id(p)][1].append(full)
    entries, written, no_grad = [], {}, []
    for key in order:
        p, aliases = names[key]
        hf = [n for n in (hf_name(a) for a in aliases) if n is not None]
        if not hf or not p.requires_grad:
            continue
        name = EMBED if EMBED in hf else hf[0]
        if p.grad is None:
            no_grad.append(name)
            continue
        if name in written:
            raise ValueError("parameters %r and %r both map to the HF name %r"
                             % (written[name], aliases[0], name))
        written[name] = aliases[0]
        code, shape, raw = _raw(p.grad, dtype)
        entries.append((name, code, shape, raw))
    if no_grad:
        raise ValueError("%d trainable parameters have no .grad (run loss.backward() first): %s"
                         % (len(no_grad), ", ".join(no_grad[:5]) + (", ..." if len(no_grad) > 5 else "")))
    if not entries:
        raise ValueError("the model has no trainable base-model parameters with a gradient")
    meta = {"implementation": "streambp.dump_grads"}
    if loss is not None:
        meta["loss"] = repr(float(loss.item() if hasattr(loss, "item") else loss))
    meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
    _safetensors.write(path, entries, meta)
    return [e[0] for e in entries]
