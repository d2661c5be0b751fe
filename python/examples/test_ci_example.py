"""A pytest file to copy into your CI: streambp judges your gradients for SFT, DPO and GRPO.

Setup in CI:
    make -C <streambp checkout>                 # build/streambp
    pip install <streambp checkout>/python      # this helper (pure Python)
    export STREAMBP=<streambp checkout>/build/streambp
    export STREAMBP_CONFIG=<a small config.json of your model family>   # optional
Then `pytest test_ci_example.py`. Each test: a small random model written by `streambp init`,
a batch, your loss and backward, your gradients dumped under HF names, and the audit: the
float64 truth, with a budget measured from streambp's own run at your precision. On failure the
assertion message carries the audit's diagnosis ("one factor, 19/21", "float32-level error",
"only layer 1 fails", ...).

Replace load_model() with your implementation. As written it uses transformers; inside the
streambp repository without transformers it falls back to the repository's own independent
PyTorch implementation, so the example runs in streambp's tests too.
"""
import os

import pytest
import torch

import streambp

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))  # only used inside the streambp repository
CONFIG = os.environ.get("STREAMBP_CONFIG",
                        os.path.join(REPO, "data", "models", "llama3-tiny.json"))
IGNORE = -100


def load_model(model_dir, dtype):
    """YOUR implementation under test: a torch module whose parameters carry HF names (wrappers
    such as DDP, torch.compile or peft are fine) and whose forward(input_ids, attention_mask,
    labels=None) returns .logits, and .loss when given labels, as transformers' models do."""
    try:
        import transformers
    except ImportError:
        ref = os.path.join(REPO, "python", "tests", "reference_impl.py")
        if not os.path.exists(ref):
            pytest.skip("transformers is not installed")
        import importlib.util
        spec = importlib.util.spec_from_file_location("reference_impl", ref)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.ReferenceModel(model_dir, dtype)
    return transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=dtype, attn_implementation="eager")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    if not os.path.exists(CONFIG):
        pytest.skip("set STREAMBP_CONFIG to a small config.json of your model family")
    return streambp.init_model(CONFIG, str(tmp_path_factory.mktemp("model") / "m"), seed=1)


def vocab(model_dir):
    import json
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)["vocab_size"]


def sft_batch(V, seed=0):
    """Two rows: a prompt (not scored), a completion, right padding on the second."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (2, 24), generator=g)
    mask = torch.ones_like(ids)
    ids[1, 18:], mask[1, 18:] = 0, 0
    labels = torch.where(mask == 1, ids, torch.full_like(ids, IGNORE))
    labels[:, :8] = IGNORE  # the prompt
    return ids, labels, mask


def token_logps(logits, labels):
    """Per-token log-probs of the targets (logits at t score labels[t+1]), 0 where ignored."""
    targets = labels[:, 1:]
    valid = targets != IGNORE
    lp = torch.log_softmax(logits[:, :-1].float(), -1)
    lp = lp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(valid, lp, torch.zeros_like(lp)), valid


def test_sft_fp32(model_dir, tmp_path):
    model = load_model(model_dir, torch.float32)
    ids, labels, mask = sft_batch(vocab(model_dir))
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    batch, grads = str(tmp_path / "batch.safetensors"), str(tmp_path / "grads.safetensors")
    streambp.batch.from_hf(batch, input_ids=ids, labels=labels, attention_mask=mask)
    streambp.dump_grads(model, grads, loss=loss)
    result = streambp.audit(model_dir, batch, grads)  # precision from the file: fp32
    assert result.passed, result.report()


def test_float64_is_judged_as_what_it_computes(model_dir, tmp_path):
    """HF's loss calls logits.float(): a float64 model's gradients carry float32 error. Audited
    as fp64 they fail with that diagnosis; as fp32 they pass."""
    model = load_model(model_dir, torch.float64)
    ids, labels, mask = sft_batch(vocab(model_dir))
    model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    batch, grads = str(tmp_path / "batch.safetensors"), str(tmp_path / "grads.safetensors")
    streambp.batch.from_hf(batch, input_ids=ids, labels=labels, attention_mask=mask)
    streambp.dump_grads(model, grads)
    strict = streambp.audit(model_dir, batch, grads, precision="fp64")
    assert not strict.passed
    assert any("float32-level error" in d for d in strict.diagnosis), strict.report()
    result = streambp.audit(model_dir, batch, grads, precision="fp32")
    assert result.passed, result.report()


def test_dpo_sigmoid(model_dir, tmp_path):
    """TRL DPOTrainer's sigmoid loss; the reference is the initial policy (precomputed)."""
    V = vocab(model_dir)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, V, (2, 6), generator=g)
    chosen, rejected = torch.randint(1, V, (2, 7), generator=g), torch.randint(1, V, (2, 5), generator=g)
    # the rows as TRL's concatenated_forward builds them: prompt + completion, chosen first
    ids = torch.cat([torch.cat([prompt, chosen], 1),
                     torch.cat([prompt, rejected, torch.zeros(2, 2, dtype=torch.long)], 1)])
    mask = (torch.arange(13)[None, :] < torch.tensor([13, 13, 11, 11])[:, None]).long()
    labels = torch.where(mask == 1, ids, torch.full_like(ids, IGNORE))
    labels[:, :6] = IGNORE
    model = load_model(model_dir, torch.float32)
    with torch.no_grad():
        ref = token_logps(model(input_ids=ids, attention_mask=mask).logits, labels)[0].sum(-1)
    S = token_logps(model(input_ids=ids, attention_mask=mask).logits, labels)[0].sum(-1)
    beta = 0.1
    z = (S[:2] - S[2:]) - (ref[:2] - ref[2:])
    (-torch.nn.functional.logsigmoid(beta * z).mean()).backward()
    batch = str(tmp_path / "dpo.safetensors")
    streambp.batch.dpo(batch, prompt_input_ids=prompt, chosen_input_ids=chosen,
                       rejected_input_ids=rejected, ref_chosen_logps=ref[:2],
                       ref_rejected_logps=ref[2:])
    grads = str(tmp_path / "grads.safetensors")
    streambp.dump_grads(model, grads, metadata={"objective": "dpo", "beta": beta})
    result = streambp.audit(model_dir, batch, grads, objective="dpo", loss_type="sigmoid",
                            beta=beta)
    assert result.passed, result.report()


def test_grpo_bnpo(model_dir, tmp_path):
    """TRL GRPOTrainer, one iteration (old log-probs = current, detached), no KL, bnpo."""
    V = vocab(model_dir)
    g = torch.Generator().manual_seed(2)
    prompt, completion = torch.randint(1, V, (4, 5), generator=g), torch.randint(1, V, (4, 8), generator=g)
    completion_mask = torch.ones_like(completion)
    completion_mask[1, 5:] = 0  # EOS at 5
    rewards = torch.tensor([1.0, 0.0, 0.2, 0.7])
    batch = str(tmp_path / "grpo.safetensors")
    streambp.batch.grpo(batch, prompt_ids=prompt, completion_ids=completion,
                        completion_mask=completion_mask, rewards=rewards, group_size=2)
    grouped = rewards.view(-1, 2)
    advantages = ((grouped - grouped.mean(1, keepdim=True))
                  / (grouped.std(1, keepdim=True) + 1e-4)).view(-1, 1)
    model = load_model(model_dir, torch.float32)
    ids = torch.cat([prompt, completion], 1)
    mask = torch.cat([torch.ones_like(prompt), completion_mask], 1)
    labels = torch.where(torch.cat([torch.zeros_like(prompt), completion_mask], 1) == 1, ids,
                         torch.full_like(ids, IGNORE))
    logps, valid = token_logps(model(input_ids=ids, attention_mask=mask).logits, labels)
    ratio = torch.exp(logps - logps.detach())
    per_token = -torch.min(ratio * advantages, torch.clamp(ratio, 0.8, 1.2) * advantages)
    ((per_token * valid).sum() / valid.sum()).backward()
    grads = str(tmp_path / "grads.safetensors")
    streambp.dump_grads(model, grads)
    result = streambp.audit(model_dir, batch, grads, objective="grpo", loss_type="bnpo",
                            beta=0.0, epsilon=0.2)
    assert result.passed, result.report()
