"""torch float32's per-tensor gradient error against a float64 truth, on the measuring models of
`make accuracy` (bench/accuracy.h; docs/accuracy.md): the column our errors are compared with.

    python accuracy_torch.py MODELS_DIR --seq 512,2048 [--family qwen2,...] --out FILE

MODELS_DIR/<family> is written by `build/accuracy --write-models MODELS_DIR`. The batch is the
C tool's: one sequence of T tokens, token t = splitmix64(2^32 + t) mod V, labels = ids, SFT.
For each family and T:

  * torch float32: HF's model in float32 with its default attention (sdpa) and its own loss,
    what a user runs;
  * the truth: the same weights in float64, sdpa, the loss's log-softmax in float64 (HF's loss
    would round the logits to float32 first); Gemma-3's float32 islands (norms, rotary tables)
    computed in float64 (gemma3_hf.patch_islands).

FILE gets one line per tensor, "family T name error" (error = ||g32 - g64|| / ||g64||), which
`build/accuracy --torch FILE` reads. Needs torch and transformers (the HF venv); not part of CI.
"""
import argparse
import os
import sys
import tempfile

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


def load(model_dir, dtype, family):
    if family == "gemma3":
        import gemma3_hf
        return gemma3_hf.load(model_dir, "sdpa", patched=dtype == torch.float64, dtype=dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=dtype, attn_implementation="sdpa")
    model.train()
    return model


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
    a = ap.parse_args()
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
        V = m32.config.vocab_size
        for T in (int(x) for x in a.seq.split(",")):
            ids = torch.tensor([[token(1, t, V) for t in range(T)]], dtype=torch.long)
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
