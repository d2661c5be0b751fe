"""torch float32's per-tensor gradient error against a float64 truth, on the measuring models of
`make accuracy` (bench/accuracy.h; docs/accuracy.md): the column our errors are compared with.

    python accuracy_torch.py MODELS_DIR --seq 512,2048 [--family qwen2,...] [--seed S] --out FILE

MODELS_DIR/<family> is written by `build/accuracy --write-models MODELS_DIR [--seed S]`. The
batch is the C tool's: one sequence of T tokens, token t = splitmix64(S * 2^32 + t) mod V (S = 1
unless --seed says; give the seed the models were written with), labels = ids, SFT.
For each family and T:

  * torch float32: HF's model in float32 with its default attention (sdpa) and its own loss,
    what a user runs;
  * the truth: the same weights in float64, sdpa, the loss's log-softmax in float64 (HF's loss
    would round the logits to float32 first), and every float32 island of HF's float64 model
    computed in float64: Gemma-3's (gemma3_hf.patch_islands), and the other families' RMSNorm
    (`hidden_states.to(torch.float32)`: forward and backward in float32) and rotary tables
    (inv_freq, angles, cos and sin in float32) by `patch_islands` below. Left in, those islands
    round the truth exactly where torch float32 rounds (the same float32 angles in both runs;
    layer 0's norm on the same embedding rows), so torch's error looked smaller than it is and
    ours was measured against a truth off by ~1e-7..1e-6 (docs/accuracy.md).

--rope64 gives torch float32 float64 rotary tables (angles, cos and sin in float64, rounded once
to float32, as ours are): not what users run, but torch's arithmetic with its one float32 island
that grows with T taken out, the reference docs/accuracy.md's "torch float32, exact rotary"
column is measured against.

FILE gets one line per tensor, "family T name error" (error = ||g32 - g64|| / ||g64||), which
`build/accuracy --torch FILE` reads. Needs torch and transformers (the HF venv); not part of CI.
"""
import argparse
import math
import os
import sys
import tempfile

import types

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MASK64 = (1 << 64) - 1


def token(seed, t, V):
    """bench/accuracy.h's acc_token: splitmix64(seed * 2^32 + t) mod V."""
    z = ((seed << 32) + t + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return z % V


def inv_freq64(cfg):
    """HF's rotary inverse frequencies (default, or llama3's scaling as _compute_llama3_parameters
    computes them) in float64; HF computes them in float32 whatever the model's dtype."""
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inv = 1.0 / (float(cfg.rope_theta) ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        inv = torch.where(medium, smoothed, inv_l)
    elif kind != "default":
        raise ValueError(f"accuracy_torch: rope type {kind} not patched")
    return inv


def _rms64(self, x):
    """HF's RMSNorm (Llama/Qwen2/Qwen3) without the .to(torch.float32): in x's dtype."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _rope64(self, x, position_ids):
    """HF's rotary tables with the angles, cos and sin in float64, then in x's dtype."""
    freqs = position_ids[:, :, None].to(torch.float64) * self._inv64[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    s = self.attention_scaling
    return (emb.cos() * s).to(x.dtype), (emb.sin() * s).to(x.dtype)


def _patch(model, rms, what):
    """HF's rotary tables in float64 (and with rms, its RMSNorm in the model's dtype); in place."""
    n = 0
    for m in model.modules():
        name = type(m).__name__
        if rms and name.endswith("RMSNorm"):
            m.forward = types.MethodType(_rms64, m)
            n += 1
        elif name.endswith("RotaryEmbedding"):
            m._inv64 = inv_freq64(model.config)
            m.forward = types.MethodType(_rope64, m)
            n += 1
    if not n:
        raise ValueError("accuracy_torch: no %s module to patch" % what)
    return model


def patch_rope64(model, family):
    """Only the rotary tables of a float32 model in float64 (--rope64); in place."""
    if family == "gemma3":
        import gemma3_hf
        return gemma3_hf.patch_rope(model)
    return _patch(model, False, "rotary")


def patch_islands(model):
    """The float32 islands of HF's Llama/Qwen2/Qwen3 (RMSNorm, rotary tables) computed in the
    model's dtype instead; in place."""
    return _patch(model, True, "RMSNorm or rotary")


def load(model_dir, dtype, family):
    """HF's model in dtype with sdpa; in float64 (the truth) its float32 islands patched."""
    if family == "gemma3":
        import gemma3_hf
        return gemma3_hf.load(model_dir, "sdpa", patched=dtype == torch.float64, dtype=dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=dtype, attn_implementation="sdpa")
    model.train()
    return patch_islands(model) if dtype == torch.float64 else model


def grads(model, ids, truth):
    model.zero_grad(set_to_none=True)
    if truth:
        logits = model(input_ids=ids).logits
        lp = torch.log_softmax(logits.to(torch.float64), dim=-1)[:, :-1, :]
        loss = -lp.gather(-1, ids[:, 1:].unsqueeze(-1)).mean()
    else:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return {n: p.grad.detach().to(torch.float64) for n, p in model.named_parameters()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models")
    ap.add_argument("--seq", default="512,2048,8192")
    ap.add_argument("--family", default="qwen3,qwen2,llama3,gemma3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1,
                    help="the tokens' seed, as build/accuracy --seed (default 1)")
    ap.add_argument("--rope64", action="store_true",
                    help="torch float32 with float64 rotary tables (docs/accuracy.md)")
    a = ap.parse_args()
    if not 0 <= a.seed < 1 << 32:
        ap.error("--seed: 0 .. 2^32-1, as build/accuracy's")
    torch.set_num_threads(a.threads)
    # written to an unpredictable temporary beside --out (O_EXCL, never through a planted
    # link) and renamed into place complete
    fd, tmp = tempfile.mkstemp(prefix=".accuracy-", dir=os.path.dirname(os.path.abspath(a.out)))
    try:
        with os.fdopen(fd, "w") as out:
            run(a, out)
        os.replace(tmp, a.out)
    except BaseException:
        os.unlink(tmp)
        raise


def run(a, out):
    """Every family and T: one line per tensor, `family T name relative-L2-error`."""
    for fam in a.family.split(","):
        d = os.path.join(a.models, fam)
        m32, m64 = load(d, torch.float32, fam), load(d, torch.float64, fam)
        if a.rope64:
            patch_rope64(m32, fam)
        V = m32.config.vocab_size
        for T in (int(x) for x in a.seq.split(",")):
            ids = torch.tensor([[token(a.seed, t, V) for t in range(T)]], dtype=torch.long)
            g64 = grads(m64, ids, True)
            g32 = grads(m32, ids, False)
            for n, t in g64.items():
                den = torch.linalg.vector_norm(t).item()
                err = torch.linalg.vector_norm(g32[n] - t).item() / (den if den > 0 else 1)
                out.write(f"{fam} {T} {n} {err:.6e}\n")
            out.flush()
            print(f"accuracy_torch: {fam} T = {T} done", file=sys.stderr)


if __name__ == "__main__":
    main()
