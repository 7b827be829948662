"""Write one shard from its `ShardPlan`: a plain function of (plan entry, paths) -> index entry.

The shard's layout is known before a byte is copied (every file was stat'ed at load): which
member each payload is and its name come from the sample format (`pipeline.formats.sample`:
`layout`, `name_rows`), so the headers of all its members are made at once (`tarstream.headers`) and the bytes are assembled
in a reused window of a few MiB: headers placed with one array operation, each file read
straight into its place (one ``readv``, no intermediate bytes), small members copied in, the
padding left zero. Each full window is hashed and written in one call: sha256 while writing,
no file read twice, memory bounded by the window whatever the shard's size. A member larger
than the window is streamed through it.

The shard file is written with direct I/O (``O_DIRECT``) where the file system takes it: the
window (page-aligned memory, whole 512-byte tar blocks) goes from this buffer to the disk, not
through the page cache. The shard is fsynced before its rename anyway, so the bytes had to reach
the disk before the shard counted; through the page cache each byte was also copied into a page
allocated for it, and a shard is three times the bytes of its files (a header and padding per
member). On the 2-core VM the benches run on that copy cost more CPU than everything else the
write does (1.7-2.9 s of system time for 400 MB, against ~0.1 s direct; a new page there is
faulted in from the host). A write direct I/O refuses (EINVAL: a file system without it, or a
piece not aligned, as a member streamed through the window can leave) goes through the page
cache instead, for the rest of that shard: the same bytes either way.

The shard is written under a temporary name, fsynced, then renamed (`start_shard` returns the
last two as a call of their own, for a thread); a failed write removes the temporary file (left
behind on a full disk, it would keep the disk full).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mmap
import os
from pathlib import Path

import numpy as np

from pipeline.core.errors import StageFailed, UsageError
from pipeline.core.files import tmp_name
from pipeline.formats import index as shard_index
from pipeline.formats import sample, tarstream
from pipeline.shard.plan import ShardPlan, values

BLOCK = tarstream.BLOCK
WINDOW = 4 << 20  # bytes assembled before one hash update and one write
STREAM_CHUNK = 1 << 20  # a file larger than the window goes through in pieces of this size
_SPARE: list[mmap.mmap] = []  # the window of the last shard written, reused by the next
FILE, TEXT, SMALL = 0, 1, 2  # what a member's data is: an image file, a text file (checked UTF-8), bytes in the plan


def write_shard(plan: ShardPlan, clean_dir: Path, out_dir: Path) -> shard_index.ShardEntry:
    """Write ``plan``'s shard into ``out_dir`` (atomically), reading its files from ``clean_dir``;
    return its index entry (sample offsets, size, sha256)."""
    entry, finish = start_shard(plan, clean_dir, out_dir)
    finish()
    return entry


def start_shard(plan: ShardPlan, clean_dir: Path, out_dir: Path) -> tuple[shard_index.ShardEntry, Unfinished]:
    """`write_shard` in two steps: write the shard's bytes under its temporary name and return
    its index entry with the `Unfinished` shard, whose call finishes it (fsync, then rename into
    place). The finishing call waits for the disk and barely needs the CPU: pipe shard runs it
    on a thread while it writes the next shard."""
    path = out_dir / plan.name
    tmp = tmp_name(path)
    try:
        entry = _write(plan, clean_dir, tmp)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return entry, Unfinished(tmp, path)


class Unfinished:
    """A shard whose bytes are written under a temporary name: called, it is fsynced and renamed
    into place (the temporary file removed if that fails); `discard` removes it instead."""

    def __init__(self, tmp: Path, path: Path):
        self.tmp, self.path = tmp, path

    def __call__(self) -> None:
        try:
            fd = os.open(self.tmp, os.O_RDONLY)
            try:
                os.fsync(fd)  # the data written through the writer's descriptor, closed by now
            finally:
                os.close(fd)
            os.replace(self.tmp, self.path)
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.tmp.unlink()


class _Members:
    """The shard's members in order: names, data sizes and what each member's data is (FILE, TEXT
    or SMALL, `kinds`), with the files' paths (`paths`, in member order, at `file_members`) and
    the small members' bytes in one blob (`blob`, in member order, the member `small_members[k]`
    at `blob[small_at[k]:small_at[k + 1]]`): a window places all its small members with one
    array operation, and only files take a step in Python."""

    def __init__(self, plan: ShardPlan):
        import pyarrow as pa
        import pyarrow.compute as pc

        has_image = plan.image_exts >= 0
        has_text = np.asarray(pc.is_valid(plan.texts).to_numpy(zero_copy_only=False), dtype=bool)
        has_class = plan.cls >= 0  # an image-caption pair without a class has no .cls member
        lay = sample.layout(has_image, has_text, has_class)
        self.firsts = lay.firsts  # each sample's first member
        n = lay.count
        self.count = n
        codes = pa.array([sample.encode_class(c) for c in range(int(plan.cls.max(initial=-1)) + 1)] + [b""], pa.binary())
        cls = codes.take(pa.array(np.where(has_class, plan.cls, len(codes) - 1)))  # b"" where there is no class
        meta_at, _ = values(plan.meta)
        kinds, sizes = np.full(n, SMALL, dtype=np.int8), np.empty(n, dtype=np.int64)
        kinds[lay.image], kinds[lay.text] = FILE, TEXT
        sizes[lay.image] = plan.image_sizes[has_image]
        sizes[lay.text] = plan.text_sizes[has_text]
        sizes[lay.cls] = np.diff(values(cls)[0])[has_class]
        sizes[lay.meta] = np.diff(meta_at)
        key_at, key_bytes = values(plan.keys)
        try:
            self.name_rows = sample.name_rows(key_at, key_bytes, lay, plan.image_exts)
        except ValueError as e:
            raise ValueError(f"{e} in {plan.name}") from None
        self.kinds = kinds
        self.sizes = sizes
        self.file_members = np.flatnonzero(kinds != SMALL)
        paths = np.empty(n, dtype=object)
        paths[lay.image] = plan.images.filter(pa.array(has_image)).to_pylist()
        paths[lay.text] = plan.texts.filter(pa.array(has_text)).to_pylist()
        self.paths: list[str] = paths[self.file_members].tolist()
        self.small_members = np.sort(np.concatenate([lay.cls, lay.meta]))  # each sample's .cls (if any), then its .json
        self.small_at = np.concatenate(([0], np.cumsum(sizes[self.small_members])))
        self.blob = values(pc.binary_join_element_wise(cls, plan.meta.cast(pa.binary()), b""))[1]  # .cls, .json, .cls, ...
        self.spans = tarstream.member_sizes(sizes)  # header + data + padding
        self.starts = np.concatenate(([0], np.cumsum(self.spans)))  # offset of each member; the last: where the end goes

    def small(self, member: int) -> bytes:
        """A SMALL member's bytes."""
        k = int(np.searchsorted(self.small_members, member))
        return self.blob[self.small_at[k] : self.small_at[k + 1]].tobytes()

    def path(self, member: int) -> str:
        """A FILE or TEXT member's path, relative to CLEAN_DIR."""
        return self.paths[int(np.searchsorted(self.file_members, member))]


def _headers(m: _Members) -> np.ndarray:
    """Every member's tar header, one 512-byte row each (`tarstream.header_rows`); a size the
    USTAR field cannot hold goes through `tarstream.headers`, which says why."""
    if len(m.sizes) and (m.sizes.min() < 0 or m.sizes.max() >= 8**11):
        names = [row.tobytes().rstrip(b"\0").decode("ascii") for row in m.name_rows]
        return tarstream.headers(names, m.sizes)
    return tarstream.header_rows(m.name_rows, m.sizes)


def _write(plan: ShardPlan, clean_dir: Path, tmp: Path) -> shard_index.ShardEntry:
    m = _Members(plan)
    heads = _headers(m)
    digest = hashlib.sha256()
    root = os.open(clean_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        out = _Output(tmp)
        try:
            window = _Window(out, digest, int(m.starts[-1]))
            try:
                first = 0
                while first < m.count:
                    first = window.fill(m, heads, first, root, clean_dir)
                window.put_end()
                window.flush()
            finally:
                window.release()
        finally:
            out.close()
    finally:
        os.close(root)
    total = int(m.starts[-1]) + len(tarstream.END_OF_ARCHIVE)
    if window.written != total:
        raise AssertionError(f"{plan.name}: wrote {window.written} bytes, planned {total}")
    return shard_index.ShardEntry(plan.name, plan.split, len(plan), total, digest.hexdigest(), m.starts[m.firsts].tolist())


class _Output:
    """The shard file, opened for direct I/O where the file system allows it (see the module
    docstring); a write direct I/O refuses is made through the page cache, and so is the rest."""

    def __init__(self, path: Path):
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        self.direct = getattr(os, "O_DIRECT", 0)
        if self.direct:
            try:
                self.fd = os.open(path, flags | self.direct, 0o666)
                return
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: this file system has no direct I/O
                    raise
                self.direct = 0
        self.fd = os.open(path, flags, 0o666)

    def write(self, data: memoryview) -> int:
        try:
            return os.write(self.fd, data)
        except OSError as e:
            if not (self.direct and e.errno == errno.EINVAL):
                raise
        import fcntl

        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~self.direct)  # (nothing was written)
        self.direct = 0
        return os.write(self.fd, data)

    def close(self) -> None:
        os.close(self.fd)


class _Window:
    """A reused buffer of WINDOW bytes (plus a block: a file read one byte past its size, to see
    it grew, may spill over), flushed through sha256 into the shard file. Its memory is an
    anonymous mapping: page-aligned, as direct I/O needs (a bytearray's is not)."""

    def __init__(self, f: _Output, digest, shard_bytes: int):
        self.f, self.digest = f, digest
        self.size = min(WINDOW, shard_bytes + BLOCK - 1) // BLOCK * BLOCK or BLOCK  # no bigger than the shard needs
        spare = _SPARE.pop() if _SPARE else None
        self.buf = spare if spare is not None and len(spare) >= self.size + BLOCK else mmap.mmap(-1, self.size + BLOCK)
        self.view = memoryview(self.buf)[: self.size + BLOCK]
        self.array = np.frombuffer(self.buf, dtype=np.uint8, count=self.size + BLOCK)
        self.used = 0  # bytes of the window filled
        self.written = 0  # bytes of the shard written

    def fill(self, m: _Members, heads: np.ndarray, first: int, root: int, clean_dir: Path) -> int:
        """Lay out the members from ``first`` on that fit in the window (at least one: a member
        larger than the window is streamed), flush, and return the next member's index."""
        starts = m.starts
        last = int(np.searchsorted(starts, starts[first] + self.size, side="right")) - 1  # members [first, last) fit
        if last <= first:
            self._stream(m, heads, first, root, clean_dir)
            return first + 1
        base = int(starts[first])
        span = int(starts[last]) - base
        self.array[:span] = 0  # padding, and what an earlier window left
        blocks = (starts[first:last] - base) // BLOCK
        self.array[: self.size].reshape(-1, BLOCK)[blocks] = heads[first:last]
        self._place_small(m, first, last, base)
        lo, hi = np.searchsorted(m.file_members, (first, last))
        files = m.file_members[lo:hi]
        view, rel = self.view, None
        try:
            for d, kind, size, at in zip(m.paths[lo:hi], m.kinds[files].tolist(), m.sizes[files].tolist(),
                                         (starts[files] - base + BLOCK).tolist()):
                rel = d  # the loop's hot path: one open, one readv (size + 1 bytes: a file that grew shows), one close
                fd = os.open(d, os.O_RDONLY, dir_fd=root)
                try:
                    got = os.readv(fd, [view[at : at + size + 1]])
                    if got < size:
                        got = _read_rest(fd, view[at : at + size + 1], got, size)
                finally:
                    os.close(fd)
                if got != size:
                    raise _changed(clean_dir, d, size, got)
                if kind == TEXT:
                    str(view[at : at + size], "utf-8")
        except FileNotFoundError:
            raise StageFailed(f"{clean_dir} changed while sharding ({rel} is gone); run pipe shard again") from None
        except UnicodeDecodeError as e:
            raise _not_utf8(clean_dir / str(rel), e) from None
        self.used = span
        self.flush()
        return last

    def _place_small(self, m: _Members, first: int, last: int, base: int) -> None:
        """Copy the data of the SMALL members among [first, last) into the window, all at once: one
        run of the blob, each byte sent to its member's offset (the window starts at ``base``)."""
        lo, hi = np.searchsorted(m.small_members, (first, last))
        if lo == hi:
            return
        at = m.small_at[lo : hi + 1]
        shift = m.starts[m.small_members[lo:hi]] - base + BLOCK - (at[:-1] - at[0])  # blob position -> window position
        positions = np.arange(at[-1] - at[0], dtype=np.int64) + np.repeat(shift, np.diff(at))
        self.array[positions] = m.blob[at[0] : at[-1]]

    def _stream(self, m: _Members, heads: np.ndarray, i: int, root: int, clean_dir: Path) -> None:
        """One member larger than the window: its header, then its file in pieces, then its padding."""
        self._emit(heads[i].tobytes())
        size = int(m.sizes[i])
        if m.kinds[i] == SMALL:
            self._emit(m.small(i))
            self._emit(bytes(tarstream.padded(size) - size))
            self.flush()
            return
        rel = m.path(i)
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
        self.flush()  # `fill` lays the next members out from the window's start

    def release(self) -> None:
        """Keep the buffer for the next shard (its pages stay mapped: a new one faults them in again)."""
        _SPARE[:] = [max([self.buf, *_SPARE], key=len)]

    def put_end(self) -> None:
        self._emit(tarstream.END_OF_ARCHIVE)

    def _emit(self, data: bytes) -> None:
        if self.used + len(data) > self.size:
            self.flush()
        if len(data) > self.size:
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


def _read_rest(fd: int, into: memoryview, got: int, size: int) -> int:
    """After a short read (rare on a local disk, or a file that shrank): read on until the end."""
    while got < size:
        more = os.readv(fd, [into[got:]])
        if not more:
            break
        got += more
    return got


def _changed(clean_dir: Path, rel: str, size: int, got: int) -> StageFailed:
    now = "more" if got > size else got
    return StageFailed(f"{clean_dir} changed while sharding ({rel} was {size} bytes, now {now}); run pipe shard again")


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
