"""audit: `streambp verify audit` from Python, with TRL-named objective options."""
import json
import os
import shutil
import subprocess
import tempfile

from . import _safetensors


class StreamBPError(RuntimeError):
    """streambp refused the input (exit status 2), or the binary could not be run."""


def _inert(text):
    """text with every character that is not printable (newlines, terminal escapes, C1 and
    bidirectional controls) escaped, so that a tensor name or a diagnosis taken from a file
    cannot forge a line of a report (a "PASS") or hide one."""
    out = []
    for c in str(text):
        if c == "\\":
            out.append("\\\\")
        elif c.isprintable():
            out.append(c)
        elif c in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c])
        elif ord(c) < 0x80:
            out.append("\\x%02X" % ord(c))
        else:
            out.append("\\u%04X" % ord(c) if ord(c) < 0x10000 else "\\U%08X" % ord(c))
    return "".join(out)


def find_binary(binary=None):
    """The streambp executable: `binary`, else $STREAMBP, else `streambp` on PATH."""
    b = binary or os.environ.get("STREAMBP") or shutil.which("streambp")
    if not b:
        raise StreamBPError("cannot find the streambp binary: pass binary=, set STREAMBP to "
                            "build/streambp, or put streambp on PATH")
    if not (os.path.isfile(b) and os.access(b, os.X_OK)):
        raise StreamBPError("%s is not an executable file" % b)
    return b


def _run(args, binary=None, timeout=None):
    try:
        # errors="replace": bytes that are not UTF-8 (a path, a name) must not make the helper fail
        p = subprocess.run([find_binary(binary)] + [str(a) for a in args], capture_output=True,
                           text=True, encoding="utf-8", errors="replace", timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StreamBPError("cannot run streambp: %s" % e)
    return p


def init_model(config, out, seed=1, binary=None):
    """`streambp init`: a seeded random HF model directory (config.json + model.safetensors)
    for the config file `config` (any HF config.json of a supported family); returns out."""
    p = _run(["init", "--config", config, "--seed", seed, "--out", out], binary)
    if p.returncode != 0:
        raise StreamBPError(p.stderr.strip() or "streambp init exited %d" % p.returncode)
    return str(out)


# TRL argument -> (streambp option, kind)
_OBJECTIVE_OPTIONS = {
    "objective": ("--objective", str),
    "loss_type": ("--loss-type", str),
    "beta": ("--beta", float),
    "label_smoothing": ("--label-smoothing", float),
    "epsilon_low": ("--epsilon-low", float),
    "epsilon_high": ("--epsilon-high", float),
    "temperature": ("--temperature", float),
    "max_completion_length": ("--max-completion-length", int),
    "ref_model": ("--ref-model", str),
}


def objective_args(**objective):
    """streambp options for TRL-named objective settings. `epsilon` is TRL's lower clip bound,
    and the upper one too unless epsilon_high is given; scale_rewards=False is
    --no-scale-rewards; None values are left out."""
    objective = {k: v for k, v in objective.items() if v is not None}
    if "epsilon" in objective:
        eps = objective.pop("epsilon")
        objective.setdefault("epsilon_low", eps)
        objective.setdefault("epsilon_high", eps)
    args = []
    if "scale_rewards" in objective:
        if not objective.pop("scale_rewards"):
            args.append("--no-scale-rewards")
    unknown = sorted(set(objective) - set(_OBJECTIVE_OPTIONS))
    if unknown:
        raise TypeError("unknown objective option%s %s (known: %s, epsilon, scale_rewards)" % (
            "s" if len(unknown) > 1 else "", ", ".join(unknown), ", ".join(sorted(_OBJECTIVE_OPTIONS))))
    for key, value in objective.items():
        opt, kind = _OBJECTIVE_OPTIONS[key]
        args += [opt, str(kind(value))]
    return args


class Row:
    """One tensor of the audit: verdict ("ok", "OVER BUDGET", "NON-FINITE", "SHAPE",
    "MISSING"), their relative L2 error against the truth, ours at their precision, the budget,
    cosine, norm ratio, the best single factor (scale) and the error left after it."""

    def __init__(self, raw):
        self.raw = raw
        self.tensor = raw["tensor"]
        self.verdict = raw["verdict"]
        self.passed = self.verdict == "ok"
        for key in ("rel_l2", "ours_rel_l2", "budget", "cosine", "norm_ratio", "scale",
                    "rel_l2_rescaled", "max_abs", "lower_rel_l2", "lower_budget"):
            setattr(self, key, raw.get(key))

    def __repr__(self):
        return "Row(%s: %s, rel_l2=%s, budget=%s)" % (self.tensor, self.verdict, self.rel_l2,
                                                     self.budget)


class AuditResult:
    """What `streambp verify audit --json` found. True when every tensor passed."""

    def __init__(self, raw, returncode, command):
        self.raw = raw
        self.returncode = returncode
        self.command = command
        self.rows = [Row(r) for r in raw.get("rows", [])]
        self.passed = bool(raw.get("pass")) and returncode == 0
        self.failed = [r.tensor for r in self.rows if not r.passed]
        self.diagnosis = [d["text"] for d in raw.get("diagnosis", [])]
        self.truth_loss = raw.get("truth_loss")
        self.our_loss = raw.get("our_loss")
        self.their_loss = raw.get("their_loss")

    @property
    def verdict(self):
        return self.passed

    def __bool__(self):
        return self.passed

    def report(self):
        """A short text for an assertion message: the verdict, failing rows, the diagnosis.
        Names and diagnosis lines are escaped (they may come from a hostile file)."""
        lines = ["streambp audit: %s (%d of %d tensors pass; truth %s)" % (
            "PASS" if self.passed else "FAIL", len(self.rows) - len(self.failed), len(self.rows),
            _inert(self.raw.get("truth")))]
        for r in self.rows:
            if not r.passed:
                lines.append("  %s: %s, relative L2 %s, budget %s" % (
                    _inert(r.tensor), _inert(r.verdict), r.rel_l2, r.budget))
        if self.diagnosis:
            lines.append("diagnosis:")
            lines += ["  - " + _inert(d) for d in self.diagnosis]
        return "\n".join(lines)

    def __repr__(self):
        return "AuditResult(passed=%s, failed=%s)" % (self.passed, self.failed)


def _precision_of(path):
    """fp64, fp32 or bf16 from the dtype of the file's tensors (the coarsest one)."""
    try:
        header = _safetensors.read_header(path)
    except (OSError, ValueError) as e:
        raise StreamBPError("cannot read the gradient file %s: %s" % (path, e))
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    if dtypes & {"BF16", "F16"}:
        return "bf16"
    return "fp32" if "F32" in dtypes else "fp64"


def audit(model_dir, batch, grads, binary=None, precision=None, slack=None, block=None,
          no_ref=False, timeout=None, **objective):
    """Runs `streambp verify audit --json` and returns an AuditResult.

    model_dir  the HF model directory both sides used
    batch      a batch file, or a dict of tensors for batch.from_hf (written to a temp dir)
    grads      a gradient file, or a torch model whose .grad to dump (written to a temp dir)
    precision  "fp32", "fp64" or "bf16" (a torch dtype works too); None: from the file's dtype
    objective  TRL names: objective="dpo", loss_type="sigmoid", beta=0.1, label_smoothing,
               epsilon / epsilon_low / epsilon_high, temperature, max_completion_length,
               scale_rewards=False, ref_model="dir"
    Raises StreamBPError when streambp refuses the input (exit status 2).
    """
    options = objective_args(**objective)  # unknown names fail before anything is written
    with tempfile.TemporaryDirectory(prefix="streambp-") as tmp:
        if isinstance(batch, dict):
            from . import batch as batch_mod
            path = os.path.join(tmp, "batch.safetensors")
            batch_mod.from_hf(path, objective=objective.get("objective"), **batch)
            batch = path
        if hasattr(grads, "named_parameters"):
            from .grads import dump_grads
            path = os.path.join(tmp, "grads.safetensors")
            dump_grads(grads, path)
            grads = path
        if precision is None:
            precision = _precision_of(grads)
        precision = {"torch.float64": "fp64", "torch.float32": "fp32",
                     "torch.bfloat16": "bf16", "float64": "fp64", "float32": "fp32",
                     "bfloat16": "bf16"}.get(str(precision), str(precision))
        args = ["verify", "audit", "--model", model_dir, "--batch", batch, "--grads", grads,
                "--precision-of-theirs", precision, "--json"] + options
        if slack is not None:
            args += ["--slack", slack]
        if block is not None:
            args += ["--block", block]
        if no_ref:
            args.append("--no-ref")
        p = _run(args, binary, timeout)
        command = [find_binary(binary)] + [str(a) for a in args]
        if p.returncode not in (0, 1):
            raise StreamBPError(p.stderr.strip() or "streambp verify audit exited %d"
                                % p.returncode)
        try:
            raw = json.loads(p.stdout)
        except ValueError:
            raw = None
        if not isinstance(raw, dict):
            raise StreamBPError("streambp verify audit printed no JSON object (exit %d): %s"
                                % (p.returncode, (p.stderr or p.stdout)[-2000:]))
        return AuditResult(raw, p.returncode, command)
