"""Write one shard from its `ShardPlan`: a plain function of (plan entry, paths) -> index entry.

The shard's layout is known before a byte is copied (every file was stat'ed at load), so the
headers of all its members are made at once (`tarstream.headers`) and the bytes are assembled
in a reused window of a few MiB: headers placed with one array operation, each file read
straight into its place (one ``readv``, no intermediate bytes), small members copied in, the
padding left zero. Each full window is hashed and written in one call: sha256 while writing,
no file read twice, memory bounded by the window whatever the shard's size. A member larger
than the window is streamed through it.

The shard is written under a temporary name, fsynced, then renamed; a failed write removes the
temporary file (left behind on a full disk, it would keep the disk full).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import StageFailed, UsageError
from pipeline.core.files import tmp_name
from pipeline.formats import index as shard_index
from pipeline.formats import tarstream
from pipeline.shard.plan import ShardPlan

BLOCK = tarstream.BLOCK
WINDOW = 4 << 20  # bytes assembled before one hash update and one write
STREAM_CHUNK = 1 << 20  # a file larger than the window goes through in pieces of this size
FILE, TEXT, SMALL = 0, 1, 2  # what a member's data is: an image file, a text file (checked UTF-8), bytes in the plan


def write_shard(plan: ShardPlan, clean_dir: Path, out_dir: Path) -> shard_index.ShardEntry:
    """Write ``plan``'s shard into ``out_dir`` (atomically), reading its files from ``clean_dir``;
    return its index entry (sample offsets, size, sha256)."""
    path = out_dir / plan.name
    tmp = tmp_name(path)
    try:
        entry = _write(plan, clean_dir, tmp)
        os.replace(tmp, path)
        return entry
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class _Members:
    """The shard's members in order, as parallel lists and arrays: name, data size, what the data
    is (FILE, TEXT or SMALL), and the path or bytes it comes from."""

    def __init__(self, plan: ShardPlan):
        names: list[str] = []
        sizes: list[int] = []
        kinds: list[int] = []
        data: list[Any] = []  # a path (str) or the bytes themselves
        firsts: list[int] = []
        for i, key in enumerate(plan.keys):
            firsts.append(len(names))
            image, text = plan.images[i], plan.texts[i]
            if image is not None:
                names.append(f"{key}.{plan.image_exts[i]}")
                sizes.append(plan.image_sizes[i])
                kinds.append(FILE)
                data.append(image)
            if text is not None:
                names.append(f"{key}.txt")
                sizes.append(plan.text_sizes[i])
                kinds.append(TEXT)
                data.append(text)
            cls, meta = str(plan.cls[i]).encode("ascii"), plan.meta[i]
            names += (f"{key}.cls", f"{key}.json")
            sizes += (len(cls), len(meta))
            kinds += (SMALL, SMALL)
            data += (cls, meta)
        self.names, self.kinds, self.data = names, kinds, data
        self.sizes = np.array(sizes, dtype=np.int64)
        self.spans = tarstream.member_sizes(self.sizes)  # header + data + padding
        self.starts = np.concatenate(([0], np.cumsum(self.spans)))  # offset of each member; the last: where the end goes
        self.firsts = np.array(firsts, dtype=np.int64)


def _write(plan: ShardPlan, clean_dir: Path, tmp: Path) -> shard_index.ShardEntry:
    m = _Members(plan)
    heads = tarstream.headers(m.names, m.sizes)
    digest = hashlib.sha256()
    root = os.open(clean_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with open(tmp, "wb", buffering=0) as f:
            window = _Window(f, digest)
            first = 0
            while first < len(m.names):
                first = window.fill(m, heads, first, root, clean_dir)
            window.put_end()
            window.flush()
            os.fsync(f.fileno())
    finally:
        os.close(root)
    total = int(m.starts[-1]) + len(tarstream.END_OF_ARCHIVE)
    if window.written != total:
        raise AssertionError(f"{plan.name}: wrote {window.written} bytes, planned {total}")
    return shard_index.ShardEntry(plan.name, plan.split, len(plan), total, digest.hexdigest(), m.starts[m.firsts].tolist())


class _Window:
    """A reused buffer of WINDOW bytes (plus a block: a file read one byte past its size, to see
    it grew, may spill over), flushed through sha256 into the shard file."""

    def __init__(self, f, digest):
        self.f, self.digest = f, digest
        self.buf = bytearray(WINDOW + BLOCK)
        self.view = memoryview(self.buf)
        self.array = np.frombuffer(self.buf, dtype=np.uint8)
        self.used = 0  # bytes of the window filled
        self.written = 0  # bytes of the shard written

    def fill(self, m: _Members, heads: np.ndarray, first: int, root: int, clean_dir: Path) -> int:
        """Lay out the members from ``first`` on that fit in the window (at least one: a member
        larger than the window is streamed), flush, and return the next member's index."""
        starts = m.starts
        last = int(np.searchsorted(starts, starts[first] + WINDOW, side="right")) - 1  # members [first, last) fit
        if last <= first:
            self._stream(m, heads, first, root, clean_dir)
            return first + 1
        base = int(starts[first])
        span = int(starts[last]) - base
        self.array[:span] = 0  # padding, and what an earlier window left
        blocks = (starts[first:last] - base) // BLOCK
        self.array[: WINDOW].reshape(-1, BLOCK)[blocks] = heads[first:last]
        view, kinds, data, sizes = self.view, m.kinds, m.data, m.sizes
        for i, at in zip(range(first, last), (starts[first:last] - base + BLOCK).tolist()):
            kind = kinds[i]
            if kind == SMALL:
                d = data[i]
                view[at : at + len(d)] = d
            else:
                size = int(sizes[i])
                _read_into(root, data[i], view[at : at + size + 1], size, clean_dir)
                if kind == TEXT:
                    _check_utf8(view[at : at + size], clean_dir / data[i])
        self.used = span
        self.flush()
        return last

    def _stream(self, m: _Members, heads: np.ndarray, i: int, root: int, clean_dir: Path) -> None:
        """One member larger than the window: its header, then its file in pieces, then its padding."""
        self._emit(heads[i].tobytes())
        size, rel = int(m.sizes[i]), m.data[i]
        if m.kinds[i] == SMALL:
            self._emit(rel)  # the bytes themselves
            self._emit(bytes(tarstream.padded(size) - size))
            return
        fd = _open(root, rel, clean_dir)
        try:
            done = 0
            text_check = _Utf8Check(clean_dir / rel) if m.kinds[i] == TEXT else None
            while done <= size:  # one byte past the size: a file that grew shows
                chunk = os.read(fd, min(STREAM_CHUNK, size + 1 - done))
                if not chunk:
                    break
                done += len(chunk)
                if done > size:
                    break
                if text_check is not None:
                    text_check.feed(chunk)
                self._emit(chunk)
        finally:
            os.close(fd)
        if done != size:
            raise _changed(clean_dir, rel, size, done)
        if text_check is not None:
            text_check.finish()
        self._emit(bytes(tarstream.padded(size) - size))

    def put_end(self) -> None:
        self._emit(tarstream.END_OF_ARCHIVE)

    def _emit(self, data: bytes) -> None:
        if self.used + len(data) > WINDOW:
            self.flush()
        if len(data) > WINDOW:
            self._out(memoryview(data))
            return
        self.view[self.used : self.used + len(data)] = data
        self.used += len(data)

    def flush(self) -> None:
        if self.used:
            self._out(self.view[: self.used])
            self.used = 0

    def _out(self, data: memoryview) -> None:
        self.digest.update(data)
        done = 0
        while done < len(data):
            done += self.f.write(data[done:])
        self.written += len(data)


def _open(root: int, rel: str, clean_dir: Path) -> int:
    try:
        return os.open(rel, os.O_RDONLY, dir_fd=root)
    except FileNotFoundError:
        raise StageFailed(f"{clean_dir} changed while sharding ({rel} is gone); run pipe shard again") from None


def _read_into(root: int, rel: str, into: memoryview, size: int, clean_dir: Path) -> None:
    """Read the file (``size`` bytes at load) straight into ``into`` (size + 1 bytes long: the
    byte more shows a file that grew; it lands in padding or the next header, both written after)."""
    fd = _open(root, rel, clean_dir)
    try:
        got = os.readv(fd, [into])  # all of a regular file, up to its end, in one call
        while got < size:  # a short read (rare on a local disk), or a file that shrank
            more = os.readv(fd, [into[got:]])
            if not more:
                break
            got += more
    finally:
        os.close(fd)
    if got != size:
        raise _changed(clean_dir, rel, size, got)


def _changed(clean_dir: Path, rel: str, size: int, got: int) -> StageFailed:
    now = "more" if got > size else got
    return StageFailed(f"{clean_dir} changed while sharding ({rel} was {size} bytes, now {now}); run pipe shard again")


def _check_utf8(data: memoryview, path: Path) -> None:
    try:
        str(data, "utf-8")
    except UnicodeDecodeError as e:
        raise _not_utf8(path, e) from None


def _not_utf8(path: Path, e: UnicodeDecodeError) -> UsageError:
    return UsageError(f"{path} is not UTF-8 ({e.reason} at byte {e.start}): was CLEAN_DIR changed? re-run pipe clean")


class _Utf8Check:
    """UTF-8 validity of a text read in pieces (a character may straddle two)."""

    def __init__(self, path: Path):
        import codecs

        self.path, self.decoder, self.at = path, codecs.getincrementaldecoder("utf-8")(), 0

    def feed(self, chunk: bytes, final: bool = False) -> None:
        try:
            self.decoder.decode(chunk, final)
        except UnicodeDecodeError as e:
            raise _not_utf8(self.path, UnicodeDecodeError(e.encoding, e.object, self.at + e.start, self.at + e.end, e.reason)) from None
        self.at += len(chunk)

    def finish(self) -> None:
        self.feed(b"", final=True)
