"""Batch files for streambp, from Hugging Face / TRL-style tensors (docs/training.md#objectives).

Inputs may be torch tensors, numpy arrays or nested lists; ids are written as int64, floats as
float64. Each writer checks shapes before anything is written.

    sft(path, input_ids, labels=None, attention_mask=None)
    dpo(path, chosen_input_ids, rejected_input_ids, ...)
    grpo(path, input_ids=..., completion_mask=..., advantages=... | rewards=..., group_size=...)
    from_hf(path, objective=None, **tensors)   # one of the three, by objective or by the keys
"""
from array import array

from . import _safetensors

IGNORE_INDEX = -100


def _nested(x):
    """A nested list from a tensor, an array or a list."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
    if hasattr(x, "tolist"):
        x = x.tolist()
    return x


def _matrix(name, x, ints=True):
    """[B, T] as a list of rows; checks that it is rectangular and 2-D."""
    rows = _nested(x)
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        raise ValueError("%s must be 2-D [B, T]" % name)
    T = len(rows[0])
    if T == 0 or any(len(r) != T for r in rows):
        raise ValueError("%s must be rectangular [B, T] with T > 0" % name)
    for r in rows:
        for v in r:
            if isinstance(v, list):
                raise ValueError("%s must be 2-D [B, T]" % name)
    return [[_int(name, v) if ints else _float(name, v) for v in r] for r in rows]


def _int(name, v):
    """v as an int64, checked: an integral number in range (never a wrapped or truncated one)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__index__"):
        raise ValueError("%s holds %r, not an integer" % (name, v))
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf")) or v != int(v)):
        raise ValueError("%s holds a non-integer value %r" % (name, v))
    i = int(v)
    if not -2 ** 63 <= i < 2 ** 63:
        raise ValueError("%s holds %d, outside int64" % (name, i))
    return i


def _float(name, v):
    if isinstance(v, bool) or isinstance(v, (str, bytes)):
        raise ValueError("%s holds %r, not a number" % (name, v))
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        raise ValueError("%s holds %r, not a number" % (name, v))


def _vector(name, x, B):
    v = _nested(x)
    if not isinstance(v, list) or len(v) != B or any(isinstance(e, list) for e in v):
        raise ValueError("%s must be 1-D with %d entries" % (name, B))
    return [_float(name, e) for e in v]


def _same_shape(name, rows, like_name, like):
    if len(rows) != len(like) or len(rows[0]) != len(like[0]):
        raise ValueError("%s is [%d, %d] but %s is [%d, %d]" % (
            name, len(rows), len(rows[0]), like_name, len(like), len(like[0])))


def _i64(name, rows):
    return (name, "I64", (len(rows), len(rows[0])), array("q", [v for r in rows for v in r]).tobytes())


def _f64(name, values, shape):
    flat = [v for r in values for v in r] if shape and len(shape) == 2 else values
    return (name, "F64", shape, array("d", flat).tobytes())


def _labels_from(ids, mask, loss_mask=None):
    """labels = ids where the token counts (attention mask, and loss mask when given), else -100."""
    out = []
    for b, r in enumerate(ids):
        out.append([v if (mask is None or mask[b][t]) and (loss_mask is None or loss_mask[b][t])
                    else IGNORE_INDEX for t, v in enumerate(r)])
    return out


def sft(path, input_ids, labels=None, attention_mask=None, metadata=None):
    """An SFT batch: HF causal-LM inputs. labels as given to the model (not shifted; -100
    ignored); None: input_ids where attention_mask is 1 (DataCollatorForLanguageModeling)."""
    ids = _matrix("input_ids", input_ids)
    mask = _matrix("attention_mask", attention_mask) if attention_mask is not None else None
    if mask is not None:
        _same_shape("attention_mask", mask, "input_ids", ids)
    lab = _matrix("labels", labels) if labels is not None else _labels_from(ids, mask)
    _same_shape("labels", lab, "input_ids", ids)
    tensors = [_i64("input_ids", ids), _i64("labels", lab)]
    if mask is not None:
        tensors.append(_i64("attention_mask", mask))
    meta = {"objective": "sft", "generator": "streambp.batch"}
    meta.update(metadata or {})
    _safetensors.write(path, tensors, meta)


def _flush_left(ids, mask, loss):
    """TRL's flush_left: each row shifted so its first real token sits at position 0, then the
    columns that are padding in every row dropped from the right."""
    out_i, out_m, out_l = [], [], []
    for r, m, l in zip(ids, mask, loss):
        k = next((t for t, v in enumerate(m) if v), len(m))  # leading padding
        out_i.append(r[k:] + [0] * k)
        out_m.append(m[k:] + [0] * k)
        out_l.append(l[k:] + [0] * k)
    T = max((max((t + 1 for t, v in enumerate(m) if v), default=0) for m in out_m), default=0)
    T = max(T, 1)
    return [r[:T] for r in out_i], [m[:T] for m in out_m], [l[:T] for l in out_l]


def dpo(path, chosen_input_ids, rejected_input_ids, chosen_labels=None, rejected_labels=None,
        chosen_attention_mask=None, rejected_attention_mask=None, prompt_input_ids=None,
        prompt_attention_mask=None, ref_chosen_logps=None, ref_rejected_logps=None,
        metadata=None):
    """A DPO batch of B pairs.

    Two forms:
    - full sequences: chosen_/rejected_input_ids [B, Tc], [B, Tr] with their labels (-100 on the
      prompt and padding) or, without labels, every real token scored;
    - TRL's tokenized columns: prompt_input_ids [B, P] (left-padded) with prompt_attention_mask,
      and the completions chosen_/rejected_input_ids (right-padded) with their attention masks.
      Each row becomes prompt + completion, scored on the completion, then flushed left as
      TRL's DPOTrainer.concatenated_forward does (positions start at the first real token).
    ref_chosen_logps / ref_rejected_logps [B]: the reference model's summed log-probs (the mean
    for loss_type ipo), as TRL's precompute_ref_log_probs gives them; or use --ref-model.
    """
    sides = {}
    for side, ids_in, lab_in, mask_in in (("chosen", chosen_input_ids, chosen_labels,
                                           chosen_attention_mask),
                                          ("rejected", rejected_input_ids, rejected_labels,
                                           rejected_attention_mask)):
        ids = _matrix(side + "_input_ids", ids_in)
        mask = _matrix(side + "_attention_mask", mask_in) if mask_in is not None else None
        if mask is not None:
            _same_shape(side + "_attention_mask", mask, side + "_input_ids", ids)
        if prompt_input_ids is not None:
            if lab_in is not None:
                raise ValueError("with prompt_input_ids the labels come from the completion "
                                 "masks; do not pass %s_labels" % side)
            p = _matrix("prompt_input_ids", prompt_input_ids)
            pm = (_matrix("prompt_attention_mask", prompt_attention_mask)
                  if prompt_attention_mask is not None else [[1] * len(p[0]) for _ in p])
            _same_shape("prompt_attention_mask", pm, "prompt_input_ids", p)
            if len(p) != len(ids):
                raise ValueError("prompt_input_ids has %d rows, %s_input_ids %d"
                                 % (len(p), side, len(ids)))
            cm = mask if mask is not None else [[1] * len(ids[0]) for _ in ids]
            full = [a + b for a, b in zip(p, ids)]
            fmask = [a + b for a, b in zip(pm, cm)]
            loss = [[0] * len(a) + b for a, b in zip(pm, cm)]
            full, fmask, loss = _flush_left(full, fmask, loss)
            sides[side] = (full, _labels_from(full, fmask, loss), fmask)
        else:
            lab = (_matrix(side + "_labels", lab_in) if lab_in is not None
                   else _labels_from(ids, mask))
            _same_shape(side + "_labels", lab, side + "_input_ids", ids)
            sides[side] = (ids, lab, mask)
    B = len(sides["chosen"][0])
    if len(sides["rejected"][0]) != B:
        raise ValueError("%d chosen but %d rejected sequences" % (B, len(sides["rejected"][0])))
    tensors = []
    for side in ("chosen", "rejected"):
        ids, lab, mask = sides[side]
        tensors += [_i64(side + "_input_ids", ids), _i64(side + "_labels", lab)]
        if mask is not None:
            tensors.append(_i64(side + "_attention_mask", mask))
    if (ref_chosen_logps is None) != (ref_rejected_logps is None):
        raise ValueError("ref_chosen_logps and ref_rejected_logps come together")
    if ref_chosen_logps is not None:
        tensors.append(_f64("ref_chosen_logps", _vector("ref_chosen_logps", ref_chosen_logps, B),
                            (B,)))
        tensors.append(_f64("ref_rejected_logps",
                            _vector("ref_rejected_logps", ref_rejected_logps, B), (B,)))
    meta = {"objective": "dpo", "generator": "streambp.batch"}
    meta.update(metadata or {})
    _safetensors.write(path, tensors, meta)


def grpo(path, input_ids=None, completion_mask=None, attention_mask=None, prompt_ids=None,
         prompt_mask=None, completion_ids=None, advantages=None, rewards=None, group_size=None,
         old_per_token_logps=None, ref_per_token_logps=None, metadata=None):
    """A GRPO batch of B completions.

    Two forms:
    - full sequences: input_ids and completion_mask [B, T] (1 on scored completion tokens),
      optional attention_mask; per-token log-probs [B, T], position t holding token t's;
    - TRL's GRPOTrainer tensors: prompt_ids, prompt_mask (left-padded) and completion_ids,
      completion_mask (right-padded, zero after EOS); per-token log-probs [B, C] for the
      completion tokens (old_per_token_logps, ref_per_token_logps as TRL names them), placed
      after the prompt. No flush: GRPO's forward keeps the padded positions.
    advantages [B], or rewards [B] with group_size (TRL's num_generations; groups are
    consecutive rows) for the trainer to normalise.
    """
    if prompt_ids is not None or completion_ids is not None:
        if input_ids is not None or attention_mask is not None:
            raise ValueError("give either input_ids (+ completion_mask) or prompt_ids + "
                             "completion_ids, not both")
        if prompt_ids is None or completion_ids is None or completion_mask is None:
            raise ValueError("TRL's form needs prompt_ids, completion_ids and completion_mask")
        p = _matrix("prompt_ids", prompt_ids)
        pm = _matrix("prompt_mask", prompt_mask) if prompt_mask is not None else [[1] * len(p[0]) for _ in p]
        _same_shape("prompt_mask", pm, "prompt_ids", p)
        c = _matrix("completion_ids", completion_ids)
        cm = _matrix("completion_mask", completion_mask)
        _same_shape("completion_mask", cm, "completion_ids", c)
        if len(p) != len(c):
            raise ValueError("prompt_ids has %d rows, completion_ids %d" % (len(p), len(c)))
        P = len(p[0])
        ids = [a + b for a, b in zip(p, c)]
        mask = [a + b for a, b in zip(pm, cm)]
        comp = [[0] * P + b for b in cm]

        def place(name, x):
            v = _matrix(name, x, ints=False)
            _same_shape(name, v, "completion_ids", c)
            return [[0.0] * P + r for r in v]
    else:
        if input_ids is None or completion_mask is None:
            raise ValueError("grpo needs input_ids and completion_mask (or TRL's prompt_ids, "
                             "completion_ids, completion_mask)")
        ids = _matrix("input_ids", input_ids)
        comp = _matrix("completion_mask", completion_mask)
        _same_shape("completion_mask", comp, "input_ids", ids)
        mask = _matrix("attention_mask", attention_mask) if attention_mask is not None else None
        if mask is not None:
            _same_shape("attention_mask", mask, "input_ids", ids)

        def place(name, x):
            v = _matrix(name, x, ints=False)
            _same_shape(name, v, "input_ids", ids)
            return v
    B, T = len(ids), len(ids[0])
    tensors = [_i64("input_ids", ids), _i64("completion_mask", comp)]
    if mask is not None:
        tensors.append(_i64("attention_mask", mask))
    meta = {"objective": "grpo", "generator": "streambp.batch"}
    if (advantages is None) == (rewards is None):
        raise ValueError("give advantages, or rewards with group_size (exactly one of the two)")
    if advantages is not None:
        tensors.append(_f64("advantages", _vector("advantages", advantages, B), (B,)))
    else:
        g = _int("group_size", group_size) if group_size is not None else 0
        if g <= 0 or B % g:
            raise ValueError("rewards need group_size (num_generations) dividing B = %d" % B)
        tensors.append(_f64("rewards", _vector("rewards", rewards, B), (B,)))
        meta["group_size"] = str(g)
    if old_per_token_logps is not None:
        tensors.append(_f64("old_logps", place("old_per_token_logps", old_per_token_logps), (B, T)))
    if ref_per_token_logps is not None:
        tensors.append(_f64("ref_logps", place("ref_per_token_logps", ref_per_token_logps), (B, T)))
    meta.update(metadata or {})
    _safetensors.write(path, tensors, meta)


def from_hf(path, objective=None, **tensors):
    """Writes a batch file from HF/TRL-style tensors: sft(), dpo() or grpo() by `objective`, or,
    without it, by the keys given (chosen_* means DPO; completion_* or prompt_ids means GRPO)."""
    if objective is None:
        if "chosen_input_ids" in tensors:
            objective = "dpo"
        elif "completion_mask" in tensors or "prompt_ids" in tensors:
            objective = "grpo"
        else:
            objective = "sft"
    writers = {"sft": sft, "dpo": dpo, "grpo": grpo}
    if objective not in writers:
        raise ValueError("objective must be sft, dpo or grpo, got %r" % (objective,))
    return writers[objective](path, **tensors)
