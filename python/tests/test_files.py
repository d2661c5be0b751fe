"""The files the Python helper writes and reads, as a hostile user would plant them: links at
the output and at the temporary name the writer once used, FIFOs, directories, truncated and
malformed headers. Standard library only (no torch, no pytest, no binary), so CI runs it:
    PYTHONPATH=python python3 -m unittest discover -s python/tests -p 'test_files.py'
"""
import json
import os
import shutil
import stat
import struct
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import streambp  # noqa: E402
from streambp import _safetensors  # noqa: E402
from streambp import batch  # noqa: E402

TENSORS = [("a", "F32", (2, 3), bytes(range(24))), ("b", "I64", (1,), b"\x07" + b"\0" * 7)]


def snapshot(root):
    """{relative path: (kind, contents or link target, mode)} of everything under root."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[os.path.relpath(p, root)] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    out[os.path.relpath(p, root)] = ("file", f.read(), stat.S_IMODE(st.st_mode))
            else:
                out[os.path.relpath(p, root)] = ("other", stat.S_IFMT(st.st_mode))
    return out


def raw_file(path, header, data=b"", length=None):
    """A safetensors-like file with any JSON header (or raw header bytes)."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text) if length is None else length))
        f.write(text)
        f.write(data)


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="streambp-files-")
        self.addCleanup(shutil.rmtree, self.tmp)
        self.out = os.path.join(self.tmp, "out")  # where files are written
        self.outside = os.path.join(self.tmp, "outside")  # what must never change
        os.mkdir(self.out)
        os.mkdir(self.outside)
        self.victim = os.path.join(self.outside, "precious.txt")
        with open(self.victim, "wb") as f:
            f.write(b"do not touch\n")

    def call_with_timeout(self, fn, seconds=10):
        """fn() in a thread; fails the test (instead of hanging the run) when it blocks."""
        box = {}

        def run():
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: B902 - handed to the test thread
                box["error"] = e
        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(seconds)
        self.assertFalse(t.is_alive(), "blocked for more than %d s" % seconds)
        if "error" in box:
            raise box["error"]
        return box.get("value")


class Writer(Base):
    def test_round_trip(self):
        path = os.path.join(self.out, "g.safetensors")
        _safetensors.write(path, TENSORS, {"loss": "1.5"})
        h = _safetensors.read_header(path)
        self.assertEqual(h["a"], {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]})
        self.assertEqual(h["__metadata__"], {"loss": "1.5"})
        self.assertEqual(os.listdir(self.out), ["g.safetensors"])  # no temporary left
        umask = os.umask(0)
        os.umask(umask)
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o666 & ~umask)

    def test_link_at_old_temporary_name_is_not_followed(self):
        # the writer once opened "<path>.tmp-<pid>" with open(..., "wb"), following a link there
        path = os.path.join(self.out, "g.safetensors")
        planted = "%s.tmp-%d" % (path, os.getpid())
        os.symlink(self.victim, planted)
        before = snapshot(self.outside)
        _safetensors.write(path, TENSORS)
        self.assertEqual(snapshot(self.outside), before)
        self.assertTrue(os.path.islink(planted))  # not ours: left as it was
        st = os.lstat(path)
        self.assertTrue(stat.S_ISREG(st.st_mode))
        self.assertIn("a", _safetensors.read_header(path))

    def test_link_at_target_is_refused(self):
        path = os.path.join(self.out, "g.safetensors")
        os.symlink(self.victim, path)
        before, out_before = snapshot(self.outside), snapshot(self.out)
        with self.assertRaises(streambp.SafetensorsError) as cm:
            _safetensors.write(path, TENSORS)
        self.assertIn("symbolic link", str(cm.exception))
        self.assertIn(path, str(cm.exception))
        self.assertEqual(snapshot(self.outside), before)
        self.assertEqual(snapshot(self.out), out_before)  # the link stays, no temporary left

    def test_dangling_link_at_target_is_refused(self):
        path = os.path.join(self.out, "g.safetensors")
        target = os.path.join(self.outside, "created.safetensors")
        os.symlink(target, path)
        with self.assertRaises(streambp.SafetensorsError):
            _safetensors.write(path, TENSORS)
        self.assertFalse(os.path.lexists(target))
        self.assertEqual(os.listdir(self.out), ["g.safetensors"])

    def test_directory_and_fifo_at_target_are_refused(self):
        d = os.path.join(self.out, "dir.safetensors")
        os.mkdir(d)
        with open(os.path.join(d, "inside"), "w") as f:
            f.write("kept")
        fifo = os.path.join(self.out, "fifo.safetensors")
        os.mkfifo(fifo)
        before = snapshot(self.tmp)
        for path, kind in ((d, "a directory"), (fifo, "a FIFO")):
            with self.assertRaises(streambp.SafetensorsError) as cm:
                self.call_with_timeout(lambda: _safetensors.write(path, TENSORS))
            self.assertIn(kind, str(cm.exception))
        self.assertEqual(snapshot(self.tmp), before)

    def test_link_at_batch_output_is_refused(self):
        # a link planted where a batch is written: refused, and the linked file is untouched
        path = os.path.join(self.out, "batch.safetensors")
        os.symlink(self.victim, path)
        before = snapshot(self.outside)
        with self.assertRaises(streambp.SafetensorsError):
            batch.sft(path, [[1, 2, 3]])
        self.assertEqual(snapshot(self.outside), before)

    def test_existing_regular_target_is_replaced_atomically(self):
        path = os.path.join(self.out, "g.safetensors")
        with open(path, "wb") as f:
            f.write(b"old")
        hard = os.path.join(self.outside, "hardlink")
        os.link(path, hard)  # the old inode must keep its bytes (rename, not rewrite in place)
        _safetensors.write(path, TENSORS)
        with open(hard, "rb") as f:
            self.assertEqual(f.read(), b"old")
        self.assertIn("b", _safetensors.read_header(path))

    def test_bad_tensors_raise_own_error_and_write_nothing(self):
        path = os.path.join(self.out, "g.safetensors")
        for tensors in ([("a", "F33", (1,), b"\0" * 4)],
                        [("a", "F32", (-1,), b"")],
                        [("a", "F32", (1.5,), b"\0" * 4)],
                        [("a", "F32", (True,), b"\0" * 4)],
                        [("a", "F32", (2 ** 64,), b"")],
                        [("a", "F32", (1,), b"\0" * 3)],
                        [("a", "F32", (1,), b"\0" * 4)] * 2):
            with self.assertRaises(streambp.SafetensorsError, msg=repr(tensors)):
                _safetensors.write(path, tensors)
        self.assertEqual(os.listdir(self.out), [])


class Reader(Base):
    def bad(self, header, want, data=b"", length=None):
        path = os.path.join(self.out, "bad.safetensors")
        raw_file(path, header, data, length)
        with self.assertRaises(streambp.SafetensorsError, msg=repr(header)) as cm:
            _safetensors.read_header(path)
        self.assertIn(path, str(cm.exception))
        self.assertIn(want, str(cm.exception))
        # the audit wrapper turns it into its own error before running anything
        with self.assertRaises(streambp.StreamBPError) as cm2:
            streambp.audit(self.out, "unused.safetensors", path,
                           binary=os.path.join(self.tmp, "no-such-binary"))
        self.assertIn(path, str(cm2.exception))
        return cm.exception

    def test_wrong_json_shapes(self):
        self.bad([1, 2], "not an object")
        self.bad("text", "not an object")
        self.bad({"w": [1]}, "not an object with dtype")
        self.bad({"w": {"shape": [1], "data_offsets": [0, 4]}}, "'dtype'")
        self.bad({"w": {"dtype": "F32", "data_offsets": [0, 4]}}, "'shape'")
        self.bad({"w": {"dtype": "F32", "shape": [1]}}, "'data_offsets'")
        self.bad({"w": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}}, "not a string")
        self.bad({"w": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}}, "not a list")
        self.bad({"w": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}}, "size")
        self.bad({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, "size")
        self.bad({"w": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, "size")
        self.bad({"w": {"dtype": "F32", "shape": [2 ** 40, 2 ** 40], "data_offsets": [0, 4]}},
                 "2^63")
        self.bad({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, "pair")
        self.bad({"w": {"dtype": "F32", "shape": [1], "data_offsets": ["0", 4]}}, "pair")
        self.bad({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, "outside",
                 data=b"\0\0")
        self.bad({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, "4 bytes for",
                 data=b"\0" * 4)
        self.bad({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, "outside",
                 data=b"\0" * 4)
        self.bad({"__metadata__": ["x"]}, "__metadata__")
        self.bad({"__metadata__": {"k": 1}}, "__metadata__")

    def test_bad_header_bytes(self):
        self.bad(b"{not json", "not JSON")
        self.bad(b"\xff\xfe", "not JSON")
        self.bad(b"[" * 100000 + b"]" * 100000, "")
        self.bad(b"{}", "header length", length=2 ** 64 - 1)
        self.bad(b"{}", "header length", length=50)

    def test_short_file(self):
        path = os.path.join(self.out, "short.safetensors")
        with open(path, "wb") as f:
            f.write(b"\1\0")
        with self.assertRaises(streambp.SafetensorsError):
            _safetensors.read_header(path)

    def test_not_regular_inputs(self):
        fifo = os.path.join(self.out, "fifo.safetensors")
        os.mkfifo(fifo)
        with self.assertRaises(streambp.SafetensorsError) as cm:
            self.call_with_timeout(lambda: _safetensors.read_header(fifo))
        self.assertIn("a FIFO", str(cm.exception))
        with self.assertRaises(streambp.SafetensorsError) as cm:
            _safetensors.read_header(self.out)
        self.assertIn("a directory", str(cm.exception))
        if os.path.exists("/dev/zero"):
            with self.assertRaises(streambp.SafetensorsError) as cm:
                self.call_with_timeout(lambda: _safetensors.read_header("/dev/zero"))
            self.assertIn("character device", str(cm.exception))
        with self.assertRaises(streambp.SafetensorsError):
            _safetensors.read_header(os.path.join(self.out, "absent"))

    def test_good_file_reads(self):
        path = os.path.join(self.out, "good.safetensors")
        raw_file(path, {"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                        "__metadata__": {"k": "v"}}, b"\0" * 4)
        self.assertEqual(_safetensors.read_header(path)["w"]["dtype"], "BF16")


class BatchValues(Base):
    def test_out_of_range_and_non_numbers_are_value_errors(self):
        path = os.path.join(self.out, "b.safetensors")
        for ids in ([[float("inf")]], [[float("nan")]], [[1.5]], [[2 ** 63]], [[-2 ** 63 - 1]],
                    [["3"]], [[None]], [[True]]):
            with self.assertRaises(ValueError, msg=repr(ids)) as cm:
                batch.sft(path, ids)
            self.assertIn("input_ids", str(cm.exception))
        for adv in ([None, 1.0], ["x", 1.0], [10 ** 400, 1.0]):
            with self.assertRaises(ValueError, msg=repr(adv)):
                batch.grpo(path, input_ids=[[1, 2], [3, 4]], completion_mask=[[0, 1], [0, 1]],
                           advantages=adv)
        for g in (1.5, "2", float("inf"), 0, -1):
            with self.assertRaises(ValueError, msg=repr(g)):
                batch.grpo(path, input_ids=[[1, 2], [3, 4]], completion_mask=[[0, 1], [0, 1]],
                           rewards=[1.0, 2.0], group_size=g)
        self.assertEqual(os.listdir(self.out), [])
        batch.sft(path, [[1.0, 2, 2 ** 63 - 1]])
        self.assertEqual(_safetensors.read_header(path)["input_ids"]["shape"], [1, 3])


class Reports(unittest.TestCase):
    """AuditResult.report() prints names and diagnosis lines that come from files."""

    def test_report_not_forged(self):
        raw = {"pass": False, "truth": "ref/ float64 oracle",
               "rows": [{"tensor": "x\nPASS forged", "verdict": "MISSING"},
                        {"tensor": "\x1b[1A\x1b[2K\rPASS", "verdict": "OVER BUDGET",
                         "rel_l2": 1.0, "budget": 0.1},
                        {"tensor": "rlo\u202e\u009b31m", "verdict": "SHAPE"}],
               "diagnosis": [{"rule": "metadata", "text": "says objective x\nPASS"}]}
        text = streambp.AuditResult(raw, 1, ["streambp"]).report()
        for line in text.split("\n"):
            self.assertFalse(line.lstrip(" -").startswith("PASS"), text)
        for c in text:
            self.assertTrue(c == "\n" or c.isprintable(), "%r in %r" % (c, text))
        self.assertIn("x\\nPASS forged", text)
        self.assertIn("\\x1B[1A\\x1B[2K\\rPASS", text)
        self.assertTrue(text.startswith("streambp audit: FAIL"))


class Imports(unittest.TestCase):
    def test_importable_without_torch(self):
        # the batch writer and the file checks must not need torch
        self.assertTrue(hasattr(streambp, "SafetensorsError"))
        self.assertTrue(issubclass(streambp.SafetensorsError, ValueError))


if __name__ == "__main__":
    unittest.main()
