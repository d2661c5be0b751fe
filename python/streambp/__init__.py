"""streambp: write gradients and batches for the streambp verifier and judge gradients with
`streambp verify audit` (the binary does the work; this package is pure Python).

    streambp.dump_grads(model, path)            every .grad under its Hugging Face name
    streambp.audit(model_dir, batch, grads)     -> AuditResult (.passed, .rows, .diagnosis)
    streambp.batch.from_hf(path, ...)           batch files from HF/TRL-style tensors
    streambp.init_model(config, out, seed)      a seeded random model directory
"""
from . import batch
from ._safetensors import SafetensorsError
from .audit import AuditResult, Row, StreamBPError, audit, find_binary, init_model, objective_args
from .grads import dump_grads, hf_name

__all__ = ["AuditResult", "Row", "SafetensorsError", "StreamBPError", "audit", "batch",
           "dump_grads", "find_binary", "hf_name", "init_model", "objective_args"]
__version__ = "0.1.0"
