"""The repository's independent PyTorch implementation (verify/torch_grads.py) as an nn.Module
with Hugging Face parameter names, nested like transformers' modules, so dump_grads sees what it
sees on a real model: `model.layers.0.self_attn.q_proj.weight`, and a tied lm_head registered as
the same Parameter as model.embed_tokens.weight. forward(input_ids, attention_mask, labels)
returns what transformers' causal LMs return: .logits, and .loss with labels (HF's
ForCausalLMLoss: logits.float(), mean cross-entropy over the shifted targets).
Used by the tests and, where transformers is not installed, by examples/test_ci_example.py."""
import importlib.util
import os
import types

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def torch_grads():
    spec = importlib.util.spec_from_file_location(
        "torch_grads", os.path.join(REPO, "verify", "torch_grads.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class ReferenceModel(torch.nn.Module):
    def __init__(self, model_dir, dtype=torch.float32):
        super().__init__()
        self._tg = torch_grads()
        self.desc, tensors = self._tg.load_model(model_dir, dtype)
        self._params = {}
        for name, t in tensors.items():
            *path, leaf = name.split(".")
            mod = self
            for part in path:
                if not hasattr(mod, part):
                    mod.add_module(part, torch.nn.Module())
                mod = getattr(mod, part)
            p = torch.nn.Parameter(t.detach().clone())
            mod.register_parameter(leaf, p)
            self._params[name] = p
        if self.desc["tied"]:  # as transformers ties them: one Parameter, two names
            self.add_module("lm_head", torch.nn.Module())
            self.lm_head.register_parameter("weight", self._params["model.embed_tokens.weight"])

    def forward(self, input_ids, attention_mask=None, labels=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        logits = self._tg.forward(self.desc, self._params, input_ids, attention_mask)
        loss = None
        if labels is not None:
            V = logits.shape[-1]
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, V).float(), labels[:, 1:].reshape(-1), ignore_index=-100)
        return types.SimpleNamespace(logits=logits, loss=loss)
