#!/usr/bin/python3
"""Cross-check of streambp's LoRA adapters against Hugging Face transformers + peft.

For each model family that the installed transformers knows (llama, qwen2, and qwen3 where it
exists), on a seeded random model written by `streambp init`:

  (a) ours in peft: an adapter from `streambp lora init --b-std` (all-linear, and q/v with
      rslora) loads with PeftModel.from_pretrained on the HF model read from our model
      directory; peft's config (r, lora_alpha, use_rslora, target modules, hence its scaling)
      is the file's, and every lora_A / lora_B it holds equals the file's tensor bit for bit,
      with no adapter tensor missing or extra.
  (b) peft's in ours: an adapter made by get_peft_model (lora_B set nonzero, seeded) and saved
      with save_pretrained loads in streambp: `streambp grad --lora` accepts it, and `streambp
      train --lora DIR --steps 1 --lr 0` (a load and a save through streambp's code, the values
      unchanged: an AdamW step at lr 0 with no weight decay adds -0) writes back every tensor
      bit for bit, which peft loads again.
  (c) numbers: the SFT loss gradient of the adapter (both adapters above) computed by HF + peft
      (eager attention, labels, loss.backward()) in float32 and float64, on a right-padded batch
      with prompt-masked labels (no row lacks a key), against `streambp grad --lora` at the same
      precision. HF's float64 models keep float32 islands (RoPE's cos/sin, RMSNorm's upcast, the
      loss's logits.float()), so the agreement is float32-level; the bounds below are about ten
      times the worst relative L2 measured with transformers 4.45.2 and peft 0.13.2. The 1e-10
      float64 agreement is checked against plain PyTorch (verify/torch_grads.py --lora) and ref/.

usage: verify/peft_check.py [--streambp build/streambp] [--workdir DIR] [--keep]
Needs torch, transformers, peft and safetensors; without them it prints "SKIPPED: ..." and exits
with status 77. Exit status: 0 pass, 1 a check failed, 2 a command failed.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import peft
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError as e:  # the test reports this as skipped
    print("SKIPPED: verify/peft_check.py needs torch, transformers, peft and safetensors (%s)" % e)
    sys.exit(77)

# about ten times the worst relative L2 per adapter tensor measured with transformers 4.45.2 and
# peft 0.13.2 (llama and qwen2, 8 adapters each way): float32 1.7e-6, float64 4.8e-7 (HF's
# float32 islands; our float64 gradient is within 1e-10 of plain PyTorch and ref/)
BOUND = {"float32": 2e-5, "float64": 5e-6}
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FAMILIES = {"llama": "llama3-tiny", "qwen2": "qwen2-tiny", "qwen3": "qwen3-tiny"}

failures = []


def check(ok, what):
    print("  %s %s" % ("ok  " if ok else "FAIL", what))
    if not ok:
        failures.append(what)


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print("command failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stdout))
        sys.exit(2)
    return r.stdout


def peft_name(param_name):
    """peft's parameter name in a wrapped model -> its name in adapter_model.safetensors."""
    return param_name.replace(".default.weight", ".weight")


def adapter_params(model):
    return {peft_name(n): p for n, p in model.named_parameters() if ".lora_" in n}


def hf_model(model_dir, dtype):
    return transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=dtype, attn_implementation="eager")


def make_batch(path, vocab):
    """Two right-padded rows with prompt-masked labels: every row's first token is real, so no
    attention row lacks a key and HF's eager attention means what ours does."""
    g = torch.Generator().manual_seed(11)
    B, T = 2, 24
    ids = torch.randint(1, vocab, (B, T), generator=g, dtype=torch.int32)
    mask = torch.ones(B, T, dtype=torch.int32)
    mask[1, 17:] = 0
    ids[1, 17:] = 0
    labels = ids.clone()
    labels[:, :5] = -100  # the prompt
    labels[mask == 0] = -100
    save_file({"input_ids": ids, "labels": labels, "attention_mask": mask}, path,
              metadata={"objective": "sft", "generator": "verify/peft_check.py"})
    return ids.long(), labels.long(), mask.long()


def hf_grads(model_dir, adapter_dir, dtype, batch):
    """The adapter's gradient of HF's causal-LM loss, under the file's names."""
    model = hf_model(model_dir, dtype)
    model = peft.PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
    model.to(dtype)  # the adapter layers in the model's dtype, as a float64 run needs
    ids, labels, mask = batch
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    return float(out.loss.detach()), {n: p.grad.detach().to(torch.float64)
                             for n, p in adapter_params(model).items()}


def rel_l2(a, b):
    d = torch.linalg.norm((a - b).flatten()).item()
    n = torch.linalg.norm(b.flatten()).item()
    return d / n if n > 0 else d


def compare_numbers(args, fam, model_dir, adapter_dir, batch_path, batch, label):
    for dtype, prec in ((torch.float32, "fp32"), (torch.float64, "fp64")):
        ours_path = os.path.join(args.workdir, "grad-%s-%s-%s.safetensors" % (fam, label, prec))
        out = run([args.streambp, "grad", "--model", model_dir, "--batch", batch_path, "--lora",
                   adapter_dir, "--precision", prec, "--schedule", "stream", "--block", "8",
                   "--chunk", "8", "--logit-chunk", "8", "--threads", "1", "--out", ours_path])
        ours_loss = float(next(l.split()[1] for l in out.splitlines() if l.startswith("loss")))
        ours = {k: v.to(torch.float64) for k, v in load_file(ours_path).items()}
        loss, theirs = hf_grads(model_dir, adapter_dir, dtype, batch)
        check(set(ours) == set(theirs),
              "%s %s %s: the same %d adapter gradients" % (fam, label, prec, len(theirs)))
        worst = max(rel_l2(theirs[k], ours[k]) for k in ours if k in theirs)
        lrel = abs(loss - ours_loss) / abs(ours_loss)
        bound = BOUND[str(dtype).split(".")[1]]
        check(worst <= bound and lrel <= bound,
              "%s %s %s: HF + peft vs streambp grad --lora: worst relative L2 %.2e, loss %.2e "
              "(bound %.0e)" % (fam, label, prec, worst, lrel, bound))


def check_family(args, fam, example):
    print("%s (data/models/%s.json)" % (fam, example))
    w = args.workdir
    model_dir = os.path.join(w, "model-" + fam)
    run([args.streambp, "init", "--config", "data/models/%s.json" % example, "--seed", "1",
         "--out", model_dir])
    # (a) ours in peft
    ours = []
    for name, extra in (("all", ["--targets", "all-linear", "--r", "4", "--alpha", "8"]),
                        ("qv-rslora", ["--targets", "q_proj,v_proj", "--r", "3", "--alpha", "5",
                                       "--rslora"])):
        d = os.path.join(w, "ours-%s-%s" % (fam, name))
        run([args.streambp, "lora", "init", "--model", model_dir, "--out", d, "--b-std", "0.05",
             "--seed", "7"] + extra)
        ours.append((name, d))
        cfg = json.load(open(os.path.join(d, "adapter_config.json")))
        model = peft.PeftModel.from_pretrained(hf_model(model_dir, torch.float32), d)
        pc = model.peft_config["default"]
        check(pc.r == cfg["r"] and pc.lora_alpha == cfg["lora_alpha"] and
              bool(pc.use_rslora) == cfg["use_rslora"] and
              set(pc.target_modules) == set(cfg["target_modules"]),
              "%s ours-%s: peft reads r %d, lora_alpha %g, use_rslora %s, targets %s" %
              (fam, name, pc.r, pc.lora_alpha, pc.use_rslora, sorted(pc.target_modules)))
        layer = model.base_model.model.model.layers[0].self_attn.q_proj
        want = cfg["lora_alpha"] / (cfg["r"] ** 0.5 if cfg["use_rslora"] else cfg["r"])
        check(abs(layer.scaling["default"] - want) <= 1e-12 * want,
              "%s ours-%s: peft's scaling %.17g = %.17g" %
              (fam, name, layer.scaling["default"], want))
        theirs, mine = adapter_params(model), load_file(os.path.join(d, "adapter_model.safetensors"))
        check(set(theirs) == set(mine), "%s ours-%s: peft holds the file's %d tensors, no more" %
              (fam, name, len(mine)))
        same = all(torch.equal(theirs[k].detach(), mine[k]) for k in mine if k in theirs)
        check(same, "%s ours-%s: every lora_A / lora_B in peft equals the file's, bit for bit" %
              (fam, name))
    # (b) peft's in ours
    torch.manual_seed(3)
    theirs_dirs = []
    for name, lc in (("all", peft.LoraConfig(r=4, lora_alpha=16, target_modules=MODULES,
                                             lora_dropout=0.0, task_type="CAUSAL_LM")),
                     ("kod-rslora", peft.LoraConfig(r=2, lora_alpha=3,
                                                   target_modules=["k_proj", "o_proj", "down_proj"],
                                                   use_rslora=True, lora_dropout=0.0,
                                                   task_type="CAUSAL_LM"))):
        d = os.path.join(w, "peft-%s-%s" % (fam, name))
        model = peft.get_peft_model(hf_model(model_dir, torch.float32), lc)
        with torch.no_grad():  # peft's B starts at 0; a trained-looking one
            for n, p in model.named_parameters():
                if ".lora_B." in n:
                    p.normal_(0, 0.05)
        model.save_pretrained(d)
        theirs_dirs.append((name, d))
        saved = load_file(os.path.join(d, "adapter_model.safetensors"))
        out_dir = os.path.join(w, "roundtrip-%s-%s" % (fam, name))
        shutil.rmtree(out_dir, ignore_errors=True)
        run([args.streambp, "train", "--model", model_dir, "--lora", d, "--jsonl",
             "data/train/counting.jsonl", "--seq", "16", "--steps", "1", "--lr", "0",
             "--block", "8", "--threads", "1", "--out", out_dir])
        back = load_file(os.path.join(out_dir, "adapter_model.safetensors"))
        check(set(back) == set(saved) and all(torch.equal(back[k], saved[k]) for k in saved),
              "%s peft-%s: streambp loads peft's %d tensors and writes them back bit for bit" %
              (fam, name, len(saved)))
        again = peft.PeftModel.from_pretrained(hf_model(model_dir, torch.float32), out_dir)
        check(all(torch.equal(p.detach(), saved[k]) for k, p in adapter_params(again).items()),
              "%s peft-%s: peft loads streambp's copy again, the same values" % (fam, name))
    # (c) numbers
    batch_path = os.path.join(w, "batch-%s.safetensors" % fam)
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    batch = make_batch(batch_path, cfg["vocab_size"])
    for name, d in ours:
        compare_numbers(args, fam, model_dir, d, batch_path, batch, "ours-" + name)
    for name, d in theirs_dirs:
        compare_numbers(args, fam, model_dir, d, batch_path, batch, "peft-" + name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streambp", default=os.environ.get("STREAMBP", "build/streambp"))
    ap.add_argument("--workdir", help="scratch directory (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    torch.set_num_threads(2)
    # transformers warns that our llama3 rope_scaling has integer-valued factors and no
    # max_position_embeddings above the original 8192; both are read correctly
    transformers.logging.set_verbosity_error()
    made = args.workdir is None
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="peft-check-")
    os.makedirs(args.workdir, exist_ok=True)
    print("transformers %s, peft %s, torch %s" % (transformers.__version__, peft.__version__,
                                                  torch.__version__))
    try:
        for fam, example in FAMILIES.items():
            try:
                transformers.AutoConfig.for_model(fam)
            except (KeyError, ValueError):
                print("%s: not in transformers %s; skipped" % (fam, transformers.__version__))
                continue
            check_family(args, fam, example)
    finally:
        if made and not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    if failures:
        print("FAILED: %d check(s)" % len(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
