"""Minimal safetensors writing and header reading (the format: an 8-byte little-endian header
length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then the
raw little-endian bytes). Written here so the package needs no dependency.

Files are treated as hostile: inputs must be regular files (a FIFO must not hang the reader), the
header length and every number in it are checked before use, and a malformed file raises
SafetensorsError naming the file and what is wrong. The writer never follows a link: it writes to
a temporary file of an unpredictable name created in the target's directory (O_EXCL, so a planted
name is never opened) and renames it over the target, which must be absent or a regular file."""
import json
import os
import stat
import struct
import tempfile

ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4}
MAX_HEADER = 100 * 1024 * 1024  # the safetensors crate's own limit
_MAX_INDEX = 2 ** 63 - 1  # offsets and dims beyond this fit no file the C reader accepts


class SafetensorsError(ValueError):
    """A safetensors file (or the tensors given to write one) is malformed or cannot be used."""


def _kind(mode):
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return what
    return "not a regular file"


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _dims(where, shape):
    """The shape as a list of checked non-negative ints, and its element count."""
    try:
        dims = list(shape)
    except TypeError:
        raise SafetensorsError("%s: shape %r is not a list of sizes" % (where, shape))
    n = 1
    for d in dims:
        if hasattr(d, "__index__") and not isinstance(d, bool):
            d = d.__index__()  # numpy / torch integers, never floats or strings
        if not _is_int(d) or d < 0 or d > _MAX_INDEX:
            raise SafetensorsError("%s: shape %r holds %r, not a size in [0, 2^63)"
                                   % (where, shape, d))
        n *= d
    if n > _MAX_INDEX:
        raise SafetensorsError("%s: shape %r has more than 2^63 elements" % (where, shape))
    return [int(d) for d in dims], n


def _check_target(path):
    """The output path must be absent or a regular file; a link, a directory, a FIFO or a device
    there is refused (never followed, never replaced) so that nothing is lost."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise SafetensorsError("%s: cannot examine the output path: %s" % (path, e.strerror))
    if not stat.S_ISREG(st.st_mode):
        raise SafetensorsError("%s: the output path is %s; refusing to replace it"
                               % (path, _kind(st.st_mode)))


def write(path, tensors, metadata=None):
    """Writes tensors, a list of (name, dtype code, shape, raw bytes), atomically."""
    path = os.fspath(path)
    header, offset, seen = {}, 0, set()
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, code, shape, raw in tensors:
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise SafetensorsError("tensor name %r is not a usable name" % (name,))
        if name in seen:
            raise SafetensorsError("tensor %r written twice" % name)
        seen.add(name)
        if code not in ITEMSIZE:
            raise SafetensorsError("tensor %r: dtype %r is not one of %s"
                                   % (name, code, ", ".join(sorted(ITEMSIZE))))
        dims, n = _dims("tensor %r" % name, shape)
        if len(raw) != n * ITEMSIZE[code]:
            raise SafetensorsError("tensor %r: %d bytes for shape %s and dtype %s"
                                   % (name, len(raw), dims, code))
        header[name] = {"dtype": code, "shape": dims,
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)  # the data starts 8-byte aligned
    _check_target(path)  # before the work, so a refused target costs nothing
    directory, base = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=".%s.tmp-" % base, dir=directory or ".")
    done = False
    try:
        # mkstemp creates 0600; give the file the mode open() would have given it
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for _, _, _, raw in tensors:
                f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        _check_target(path)  # it may have appeared while we wrote
        os.replace(tmp, path)
        done = True
    finally:
        if fd >= 0:
            os.close(fd)
        if not done:
            os.unlink(tmp)  # ours: mkstemp created it, O_EXCL


def _open_regular(path):
    """A binary file object and the size of `path`, which must be a regular file; opened
    non-blocking so that a FIFO is reported instead of waiting for a writer."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | \
        getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise SafetensorsError("%s: cannot open: %s" % (path, e.strerror))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SafetensorsError("%s: not a regular file (%s)" % (path, _kind(st.st_mode)))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return f, st.st_size


def _check_header(path, header, data_size):
    """Raises SafetensorsError unless header has the shape the format requires and every tensor
    lies inside the data_size bytes after the header."""
    if not isinstance(header, dict):
        raise SafetensorsError("%s: the header is a JSON %s, not an object of tensors"
                               % (path, type(header).__name__.replace("dict", "object")))
    for name, entry in header.items():
        where = "%s: tensor %r" % (path, name)
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise SafetensorsError("%s: __metadata__ must be an object of strings" % path)
            continue
        if not isinstance(entry, dict):
            raise SafetensorsError("%s: the entry is a JSON %s, not an object with dtype, shape "
                                   "and data_offsets" % (where, type(entry).__name__))
        for key in ("dtype", "shape", "data_offsets"):
            if key not in entry:
                raise SafetensorsError("%s: no %r" % (where, key))
        dtype = entry["dtype"]
        if not isinstance(dtype, str):
            raise SafetensorsError("%s: dtype %r is not a string" % (where, dtype))
        if not isinstance(entry["shape"], list):
            raise SafetensorsError("%s: shape %r is not a list" % (where, entry["shape"]))
        _, n = _dims(where, entry["shape"])
        off = entry["data_offsets"]
        if not (isinstance(off, list) and len(off) == 2 and all(_is_int(o) for o in off)):
            raise SafetensorsError("%s: data_offsets %r is not a pair of integers" % (where, off))
        begin, end = off
        if not 0 <= begin <= end <= data_size:
            raise SafetensorsError("%s: data_offsets [%d, %d] outside the %d data bytes"
                                   % (where, begin, end, data_size))
        if dtype in ITEMSIZE and end - begin != n * ITEMSIZE[dtype]:
            raise SafetensorsError("%s: %d bytes for shape %s and dtype %s"
                                   % (where, end - begin, entry["shape"], dtype))


def read_header(path):
    """The header of a safetensors file as a dict (with "__metadata__" when present), checked:
    SafetensorsError names the file and what is wrong."""
    path = os.fspath(path)
    f, size = _open_regular(path)
    with f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError("%s: too short for a safetensors file" % path)
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise SafetensorsError("%s: header length %d is not plausible (at most %d)"
                                   % (path, n, MAX_HEADER))
        if n > size - 8:
            raise SafetensorsError("%s: header length %d but the file has %d bytes"
                                   % (path, n, size))
        text = f.read(n)
    if len(text) != n:
        raise SafetensorsError("%s: the file ended inside the header" % path)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SafetensorsError("%s: the header is not JSON: %s" % (path, e))
    except RecursionError:
        raise SafetensorsError("%s: the header is nested too deeply" % path)
    _check_header(path, header, size - 8 - n)
    return header
