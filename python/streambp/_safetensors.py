"""Minimal safetensors writing and header reading (the format: an 8-byte little-endian header
length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then the
raw little-endian bytes). Written here so the package needs no dependency."""
import json
import os
import struct

ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4}


def write(path, tensors, metadata=None):
    """Writes tensors, a list of (name, dtype code, shape, raw bytes), atomically."""
    header, offset, seen = {}, 0, set()
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, code, shape, raw in tensors:
        if name in seen:
            raise ValueError("tensor %r written twice" % name)
        seen.add(name)
        n = 1
        for d in shape:
            n *= int(d)
        if len(raw) != n * ITEMSIZE[code]:
            raise ValueError("tensor %r: %d bytes for shape %s and dtype %s"
                             % (name, len(raw), list(shape), code))
        header[name] = {"dtype": code, "shape": [int(d) for d in shape],
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)  # the data starts 8-byte aligned
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for _, _, _, raw in tensors:
                f.write(raw)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_header(path):
    """The header of a safetensors file as a dict (with "__metadata__" when present)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("%s: too short for a safetensors file" % path)
        (n,) = struct.unpack("<Q", head)
        if n > 100 * 1024 * 1024:
            raise ValueError("%s: header length %d is not plausible" % (path, n))
        return json.loads(f.read(n).decode("utf-8"))
