"""Tests of the Python helper: names, batch writers, dump_grads and audit for every objective,
with gradients from the repository's independent PyTorch implementation (reference_impl.py)
and TRL's loss formulas written out in torch."""
import json
import os
import subprocess

import pytest
import torch

import streambp
from reference_impl import ReferenceModel, torch_grads

IGNORE = -100


# ----------------------------------------------------------------------------- helpers

def grad_loss(binary, model, batch, *opts):
    """`streambp grad --json` in float64; returns the loss."""
    p = subprocess.run([binary, "grad", "--model", model, "--batch", batch, "--precision",
                        "fp64", "--json"] + list(opts), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["loss"]


def read(path):
    return torch_grads().read_safetensors(path)


def token_logps(logits, labels, temperature=1.0):
    """TRL's per-token log-probs: logits at t score labels[t+1]; [B, T-1], 0 where ignored."""
    targets = labels[:, 1:]
    valid = targets != IGNORE
    lp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    lp = lp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(valid, lp, torch.zeros_like(lp)), valid


def sft_loss(logits, labels, upcast=False):
    """HF's causal-LM loss (ForCausalLMLoss): mean cross-entropy over the shifted targets.
    upcast: logits.float() first, as HF does whatever the model's dtype (for a float64 model
    that is a cast down to float32)."""
    V = logits.shape[-1]
    x = logits[:, :-1].reshape(-1, V)
    return torch.nn.functional.cross_entropy(x.float() if upcast else x,
                                             labels[:, 1:].reshape(-1), ignore_index=IGNORE)


def dpo_loss(logits, labels, ref_logps, beta):
    """TRL DPOTrainer, loss_type sigmoid: rows [0, B) chosen, [B, 2B) rejected."""
    lp, _ = token_logps(logits, labels)
    S = lp.sum(-1)
    B = S.shape[0] // 2
    z = (S[:B] - S[B:]) - (ref_logps[:B] - ref_logps[B:])
    return -torch.nn.functional.logsigmoid(beta * z).mean()


def pad_right(rows, T, value):
    return [r + [value] * (T - len(r)) for r in rows]


def random_ids(gen, B, T, V):
    return torch.randint(1, V, (B, T), generator=gen)


def dpo_tensors(gen, B=2, V=176):
    """TRL-tokenized DPO columns: left-padded prompts, right-padded completions."""
    P, C, R = 6, 7, 5
    prompt = random_ids(gen, B, P, V)
    pmask = torch.ones(B, P, dtype=torch.int64)
    pmask[1, :2] = 0  # the second prompt is shorter: left padding
    prompt[1, :2] = 0
    chosen, rejected = random_ids(gen, B, C, V), random_ids(gen, B, R, V)
    cmask, rmask = torch.ones(B, C, dtype=torch.int64), torch.ones(B, R, dtype=torch.int64)
    cmask[0, 5:] = 0
    chosen[0, 5:] = 0
    rmask[1, 3:] = 0
    rejected[1, 3:] = 0
    return dict(prompt_input_ids=prompt, prompt_attention_mask=pmask, chosen_input_ids=chosen,
                chosen_attention_mask=cmask, rejected_input_ids=rejected,
                rejected_attention_mask=rmask)


def concatenated(path):
    """The rows of a DPO batch file as TRL's concatenated_forward sees them: chosen then
    rejected, right-padded to a common length."""
    _, t = read(path)
    T = max(t["chosen_input_ids"].shape[1], t["rejected_input_ids"].shape[1])
    ids, labels, mask = [], [], []
    for side in ("chosen", "rejected"):
        ids += pad_right(t[side + "_input_ids"].tolist(), T, 0)
        labels += pad_right(t[side + "_labels"].tolist(), T, IGNORE)
        mask += pad_right(t[side + "_attention_mask"].tolist(), T, 0)
    return torch.tensor(ids), torch.tensor(labels), torch.tensor(mask)


# ----------------------------------------------------------------------------- names

def test_hf_name_strips_wrappers():
    cases = {
        "module.model.layers.0.mlp.up_proj.weight": "model.layers.0.mlp.up_proj.weight",
        "_orig_mod.module.model.norm.weight": "model.norm.weight",
        "module.module.lm_head.weight": "lm_head.weight",
        "base_model.model.model.layers.1.self_attn.q_proj.base_layer.weight":
            "model.layers.1.self_attn.q_proj.weight",
        "base_model.model.lm_head.modules_to_save.default.weight": "lm_head.weight",
        "model.layers.0._fsdp_wrapped_module.mlp.up_proj.weight": "model.layers.0.mlp.up_proj.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight": None,
        "base_model.model.lm_head.original_module.weight": None,
    }
    for name, want in cases.items():
        assert streambp.hf_name(name) == want, name


# ----------------------------------------------------------------------------- batches

def test_sft_batch_matches_the_fixture(binary, models, data, tmp_path):
    src = os.path.join(data, "sft-tiny.safetensors")
    _, t = read(src)
    out = str(tmp_path / "sft.safetensors")
    streambp.batch.from_hf(out, input_ids=torch.from_numpy(t["input_ids"]),
                           labels=torch.from_numpy(t["labels"]),
                           attention_mask=torch.from_numpy(t["attention_mask"]))
    meta, w = read(out)
    assert meta["objective"] == "sft"
    for k in ("input_ids", "labels", "attention_mask"):
        assert w[k].dtype.name == "int64" and (w[k] == t[k]).all(), k
    assert grad_loss(binary, models["qwen3"], out) == grad_loss(binary, models["qwen3"], src)
    # labels by default: every real token
    streambp.batch.sft(out, input_ids=t["input_ids"], attention_mask=t["attention_mask"])
    _, w = read(out)
    assert ((w["labels"] == IGNORE) == (t["attention_mask"] == 0)).all()


def test_dpo_trl_columns_become_flushed_full_rows(binary, models, tmp_path):
    cols = dpo_tensors(torch.Generator().manual_seed(0))
    trl = str(tmp_path / "trl.safetensors")
    streambp.batch.dpo(trl, **cols)
    _, t = read(trl)
    # row 1 of the chosen side: prompt [pad pad p2..p5] + completion [c0..c6]: flushed left
    p, c = cols["prompt_input_ids"][1].tolist(), cols["chosen_input_ids"][1].tolist()
    assert t["chosen_input_ids"][1].tolist()[:11] == p[2:] + c
    assert t["chosen_labels"][1].tolist()[:4] == [IGNORE] * 4  # the prompt is not scored
    assert t["chosen_labels"][1].tolist()[4:11] == c
    assert t["chosen_attention_mask"][1].tolist() == [1] * 11 + [0] * (len(t["chosen_attention_mask"][1]) - 11)
    # row 0 keeps its shape; its completion's padding is neither attended nor scored
    assert t["chosen_attention_mask"][0].tolist()[:11] == [1] * 11
    assert t["chosen_labels"][0].tolist()[11:] == [IGNORE] * (t["chosen_labels"].shape[1] - 11)
    # the same rows given in full form make the same batch
    full = str(tmp_path / "full.safetensors")
    streambp.batch.dpo(full, chosen_input_ids=t["chosen_input_ids"],
                       rejected_input_ids=t["rejected_input_ids"], chosen_labels=t["chosen_labels"],
                       rejected_labels=t["rejected_labels"],
                       chosen_attention_mask=t["chosen_attention_mask"],
                       rejected_attention_mask=t["rejected_attention_mask"],
                       ref_chosen_logps=[-10.0, -11.0], ref_rejected_logps=[-12.0, -9.5])
    loss = grad_loss(binary, models["qwen3"], full, "--objective", "dpo")
    assert loss > 0


def test_grpo_trl_tensors_match_full_form(binary, models, tmp_path):
    g = torch.Generator().manual_seed(1)
    B, P, C = 4, 5, 6
    prompt = random_ids(g, B, P, 176)
    pmask = torch.ones(B, P, dtype=torch.int64)
    pmask[2, :2] = 0
    comp = random_ids(g, B, C, 176)
    cmask = torch.ones(B, C, dtype=torch.int64)
    cmask[1, 4:] = 0
    old = -torch.rand(B, C, generator=g, dtype=torch.float64)
    ref = -torch.rand(B, C, generator=g, dtype=torch.float64)
    trl = str(tmp_path / "trl.safetensors")
    streambp.batch.grpo(trl, prompt_ids=prompt, prompt_mask=pmask, completion_ids=comp,
                        completion_mask=cmask, rewards=[1.0, 0.0, 0.5, 0.25], group_size=2,
                        old_per_token_logps=old, ref_per_token_logps=ref)
    meta, t = read(trl)
    assert meta["group_size"] == "2"
    assert t["input_ids"].tolist() == torch.cat([prompt, comp], 1).tolist()
    assert t["completion_mask"].tolist() == torch.cat([torch.zeros(B, P, dtype=torch.int64), cmask], 1).tolist()
    assert t["attention_mask"].tolist() == torch.cat([pmask, cmask], 1).tolist()
    assert (t["old_logps"][:, P:] == old.numpy()).all() and (t["old_logps"][:, :P] == 0).all()
    full = str(tmp_path / "full.safetensors")
    streambp.batch.grpo(full, input_ids=t["input_ids"], completion_mask=t["completion_mask"],
                        attention_mask=t["attention_mask"], advantages=[1.0, -1.0, 0.5, -0.5],
                        old_per_token_logps=t["old_logps"], ref_per_token_logps=t["ref_logps"])
    _, f = read(full)
    for k in ("input_ids", "completion_mask", "attention_mask", "old_logps", "ref_logps"):
        assert (f[k] == t[k]).all(), k
    for path in (trl, full):
        grad_loss(binary, models["qwen3"], path, "--objective", "grpo", "--beta", "0.04")


def test_batch_errors_write_nothing(tmp_path):
    out = str(tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match="rectangular"):
        streambp.batch.sft(out, input_ids=[[1, 2, 3], [4, 5]])
    with pytest.raises(ValueError, match="labels is"):
        streambp.batch.sft(out, input_ids=[[1, 2, 3]], labels=[[1, 2]])
    with pytest.raises(ValueError, match="group_size"):
        streambp.batch.grpo(out, input_ids=[[1, 2, 3]], completion_mask=[[0, 1, 1]], rewards=[1.0])
    with pytest.raises(ValueError, match="come together"):
        streambp.batch.dpo(out, chosen_input_ids=[[1, 2]], rejected_input_ids=[[3, 4]],
                           ref_chosen_logps=[0.0])
    with pytest.raises(ValueError, match="objective"):
        streambp.batch.from_hf(out, objective="ppo", input_ids=[[1]])
    assert not os.listdir(tmp_path)


# ----------------------------------------------------------------------------- dump_grads

class Wrapper(torch.nn.Module):
    """Stands for DDP (attribute `module`) or torch.compile (attribute `_orig_mod`)."""

    def __init__(self, attr, inner):
        super().__init__()
        self.add_module(attr, inner)


def peft_like(model):
    """peft's layout: base_model.model.<model>; one Linear becomes base_layer + LoRA A/B."""
    q = model.model.layers._modules["0"].self_attn.q_proj
    w = q._parameters.pop("weight")
    q.add_module("base_layer", torch.nn.Module())
    q.base_layer.register_parameter("weight", w)
    for ab in ("lora_A", "lora_B"):
        q.add_module(ab, torch.nn.Module())
        getattr(q, ab).add_module("default", torch.nn.Module())
        p = torch.nn.Parameter(torch.zeros(2, 2))
        p.grad = torch.ones(2, 2)
        getattr(q, ab).default.register_parameter("weight", p)
    outer = torch.nn.Module()
    outer.add_module("base_model", torch.nn.Module())
    outer.base_model.add_module("model", model)
    return outer


def sft_backward(model, data, upcast=False):
    _, t = read(os.path.join(data, "sft-tiny.safetensors"))
    ids, labels, mask = (torch.from_numpy(t[k]).long() for k in ("input_ids", "labels", "attention_mask"))
    model.zero_grad(set_to_none=True)
    loss = sft_loss(model(ids, mask).logits, labels, upcast)
    loss.backward()
    return loss


def test_dump_grads_names_wrappers_and_tied_head(models, data, tmp_path):
    m = ReferenceModel(models["qwen3"])  # qwen3-tiny ties lm_head to the embedding
    sft_backward(m, data)
    hf = [n for n, _ in m.named_parameters()]
    assert "lm_head.weight" not in hf and len(hf) == 24
    expected = {n: p.grad.clone() for n, p in m.named_parameters()}
    for i, wrapped in enumerate((m, Wrapper("module", m), Wrapper("_orig_mod", Wrapper("module", m)),
                                 peft_like(m))):
        path = str(tmp_path / ("g%d.safetensors" % i))
        names = streambp.dump_grads(wrapped, path, loss=1.5)
        assert sorted(names) == sorted(hf)
        meta, t = read(path)
        assert meta["loss"] == "1.5"
        assert sorted(t) == sorted(hf)
        for n in hf:
            assert t[n].dtype.name == "float32" and (t[n] == expected[n].numpy()).all(), n


def test_dump_grads_tied_head_registered_first_and_dtype(models, data, tmp_path):
    m = ReferenceModel(models["qwen3"])
    sft_backward(m, data)
    emb = m.model.embed_tokens.weight
    outer = torch.nn.Module()  # the head registered before the embedding: still written once,
    outer.add_module("lm_head", m.lm_head)  # under the embedding's name
    outer.add_module("model", m.model)
    path = str(tmp_path / "g.safetensors")
    names = streambp.dump_grads(outer, path, dtype="float64")
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    _, t = read(path)
    assert t["model.embed_tokens.weight"].dtype.name == "float64"
    assert (t["model.embed_tokens.weight"] == emb.grad.double().numpy()).all()
    # bfloat16 gradients are written as BF16 bits
    streambp.dump_grads(m, path, dtype=torch.bfloat16)
    _, t = read(path)
    assert (t["model.norm.weight"] == m.model.norm.weight.grad.bfloat16().float().numpy()).all()


def test_dump_grads_errors(models, tmp_path):
    m = ReferenceModel(models["llama3"])
    with pytest.raises(ValueError, match="loss.backward"):
        streambp.dump_grads(m, str(tmp_path / "g.safetensors"))
    for p in m.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable"):
        streambp.dump_grads(m, str(tmp_path / "g.safetensors"))
    assert not os.listdir(tmp_path)


# ----------------------------------------------------------------------------- audit

@pytest.mark.parametrize("name", ["qwen3", "llama3", "qwen2"])
def test_audit_sft_passes_and_a_scale_error_is_named(name, models, data, tmp_path):
    m = ReferenceModel(models[name])
    loss = sft_backward(m, data)
    batch = os.path.join(data, "sft-tiny.safetensors")
    good = str(tmp_path / "good.safetensors")
    streambp.dump_grads(m, good, loss=loss)
    r = streambp.audit(models[name], batch, good)
    assert r.passed and bool(r), r.report()
    assert r.raw["precision_of_theirs"] == "fp32" and not r.diagnosis and not r.failed
    assert len(r.rows) == len(list(m.parameters()))
    assert abs(float(r.their_loss) - r.truth_loss) < 1e-5 * r.truth_loss
    for p in m.parameters():
        p.grad.mul_(19 / 21)
    bad = str(tmp_path / "bad.safetensors")
    streambp.dump_grads(m, bad)
    r = streambp.audit(models[name], batch, bad)
    assert not r.passed
    assert sorted(r.failed) == sorted(row.tensor for row in r.rows)
    assert "one factor, 19/21 = 0.9047619" in r.diagnosis[0], r.report()
    assert "19/21" in r.report()


def test_audit_fp64_and_model_and_dict_inputs(models, data):
    m = ReferenceModel(models["qwen3"], torch.float64)
    sft_backward(m, data)
    _, t = read(os.path.join(data, "sft-tiny.safetensors"))
    batch = {k: torch.from_numpy(t[k]) for k in ("input_ids", "labels", "attention_mask")}
    r = streambp.audit(models["qwen3"], batch, m)  # both written to a temporary directory
    assert r.passed, r.report()
    assert r.raw["precision_of_theirs"] == "fp64"  # from the file's dtype


def test_audit_fp64_with_a_float32_loss_is_diagnosed(models, data, tmp_path):
    """HF's loss calls logits.float(): in a float64 model a float32 island."""
    m = ReferenceModel(models["qwen3"], torch.float64)
    sft_backward(m, data, upcast=True)
    path = str(tmp_path / "g.safetensors")
    streambp.dump_grads(m, path)
    r = streambp.audit(models["qwen3"], os.path.join(data, "sft-tiny.safetensors"), path)
    assert not r.passed
    assert "your fp64 gradients have float32-level error" in r.diagnosis[0], r.report()
    assert "the loss upcast" in r.diagnosis[0]
    r = streambp.audit(models["qwen3"], os.path.join(data, "sft-tiny.safetensors"), path,
                       precision="fp32")  # judged as what it is, it passes
    assert r.passed, r.report()


def test_audit_dpo_trl_loss_and_reference_model(models, tmp_path):
    cols = dpo_tensors(torch.Generator().manual_seed(2))
    batch = str(tmp_path / "dpo.safetensors")
    streambp.batch.dpo(batch, **cols)  # no reference log-probs: the reference model gives them
    ids, labels, mask = concatenated(batch)
    ref = ReferenceModel(models["ref"])
    with torch.no_grad():
        ref_lp, _ = token_logps(ref(ids, mask).logits, labels)
    m = ReferenceModel(models["qwen3"])
    dpo_loss(m(ids, mask).logits, labels, ref_lp.sum(-1), beta=0.1).backward()
    grads = str(tmp_path / "dpo-grads.safetensors")
    streambp.dump_grads(m, grads, metadata={"objective": "dpo", "beta": 0.1})
    r = streambp.audit(models["qwen3"], batch, grads, objective="dpo", beta=0.1,
                       ref_model=models["ref"])
    assert r.passed, r.report()
    assert r.raw["objective"] == "dpo" and "reference model" in r.raw["objective_settings"]
    # audited with the wrong beta: every tensor fails, and the metadata says why
    r = streambp.audit(models["qwen3"], batch, grads, objective="dpo", beta=0.2,
                       ref_model=models["ref"])
    assert not r.passed and len(r.failed) == len(r.rows)
    assert any("metadata says beta 0.1; the audit used beta 0.2" in d for d in r.diagnosis), r.report()
    # with reference log-probs in the batch instead
    ref_sums = ref_lp.sum(-1)
    B = ref_sums.shape[0] // 2
    _, t = read(batch)
    with_ref = str(tmp_path / "dpo-ref.safetensors")
    streambp.batch.dpo(with_ref, **{k: torch.from_numpy(v) for k, v in t.items()},
                       ref_chosen_logps=ref_sums[:B], ref_rejected_logps=ref_sums[B:])
    r = streambp.audit(models["qwen3"], with_ref, grads, objective="dpo", beta=0.1)
    assert r.passed, r.report()


def test_audit_grpo_trl_loss(models, tmp_path):
    g = torch.Generator().manual_seed(3)
    B, P, C = 4, 4, 6
    prompt, comp = random_ids(g, B, P, 176), random_ids(g, B, C, 176)
    cmask = torch.ones(B, C, dtype=torch.int64)
    cmask[0, 3:] = 0  # stopped early
    rewards = torch.tensor([1.0, 0.0, 0.3, 0.9], dtype=torch.float64)
    batch = str(tmp_path / "grpo.safetensors")
    streambp.batch.grpo(batch, prompt_ids=prompt, completion_ids=comp, completion_mask=cmask,
                        rewards=rewards, group_size=2)
    # TRL GRPOTrainer (one iteration: old = current, detached), loss_type bnpo
    G = rewards.view(-1, 2)
    adv = ((G - G.mean(1, keepdim=True)) / (G.std(1, keepdim=True) + 1e-4)).view(-1)
    m = ReferenceModel(models["qwen3"])
    ids = torch.cat([prompt, comp], 1)
    labels = torch.where(torch.cat([torch.zeros(B, P, dtype=torch.int64), cmask], 1) == 1, ids,
                         torch.full_like(ids, IGNORE))
    lp, valid = token_logps(m(ids, torch.cat([torch.ones(B, P, dtype=torch.int64), cmask], 1)).logits,
                           labels)
    ratio = torch.exp(lp - lp.detach())
    A = adv[:, None].float()
    per_token = -torch.min(ratio * A, torch.clamp(ratio, 0.8, 1.2) * A)
    loss = (per_token * valid).sum() / valid.sum()
    loss.backward()
    grads = str(tmp_path / "grpo-grads.safetensors")
    streambp.dump_grads(m, grads)
    r = streambp.audit(models["qwen3"], batch, grads, objective="grpo", loss_type="bnpo",
                       epsilon=0.2)
    assert r.passed, r.report()
    r = streambp.audit(models["qwen3"], batch, grads, objective="grpo", loss_type="grpo")
    assert not r.passed and r.diagnosis


def test_audit_errors(models, data, tmp_path):
    batch = os.path.join(data, "sft-tiny.safetensors")
    with pytest.raises(TypeError, match="unknown objective option beta_x"):
        streambp.audit(models["qwen3"], batch, "x.safetensors", beta_x=1)
    with pytest.raises(streambp.StreamBPError, match="cannot open|No such file"):
        streambp.audit(models["qwen3"], batch, str(tmp_path / "missing.safetensors"),
                       precision="fp32")
    with pytest.raises(streambp.StreamBPError, match="precision-of-theirs"):
        streambp.audit(models["qwen3"], batch, batch, precision="fp16")
    with pytest.raises(streambp.StreamBPError, match="not an executable"):
        streambp.audit(models["qwen3"], batch, batch, binary=str(tmp_path))
