"""Where a shard folder's bytes come from: a local folder, object storage, or a local cache of either.

Every source answers ``read_range(rel, start, length)`` (the reader's only call, see
`train/data/ranges.py`), says which of its failures are worth retrying (``transient``), names
a shard for messages (``url``: never a credential) and has a read cap (``cap``: how large a
merged read may grow) and a prefetch depth (``ahead``: reads in flight on threads).

* `LocalSource`: a folder on disk. Large ranges are mapped from the page cache, small ones read
  (`read_range`); one read may be large (64 MiB) and nothing is prefetched: the kernel's
  read-ahead already overlaps the disk with the decoding.
* `train.data.remote.FolderSource`: any other `pipeline.storage.Folder` (object storage: its
  client is imported only when such a folder is opened, so a local run never imports it):
  ranged reads, merged to 8 MiB, 4 in flight.
* `CachedSource`: whole shards kept in a local folder under a size cap, least recently used
  evicted, for sources that are slow or billed per read.

No torch here (`train/data/stream.py` is importable without it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import threading
from pathlib import Path

import numpy as np

from train.data.ranges import DEFAULT_RETRY, MiB, Read, Retry, ShardReadError, read_with_retries

ALIGN = 64  # bytes: where buffers of large plain reads start (a cache line)
MAP_FROM = 4 << 20  # bytes: ranges this large are mapped, smaller ones read (measured crossover)
_CAN_MAP = hasattr(mmap, "MAP_SHARED")  # POSIX
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: read and map every page at once


def open_source(location: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                cache_max_bytes: int | None = None, shards: dict[str, tuple[int, str]] | None = None):
    """The source for a shard folder (a local path or a URL, `pipeline.storage`): a folder on this
    machine is read as files, any other through its Folder; with ``cache_dir``, wrapped in a
    `CachedSource` (``shards``: rel -> (size, sha256) from index.json)."""
    from pipeline.storage import open_folder

    folder = open_folder(location)
    source: LocalSource | object
    if folder.local_path is not None:
        source = LocalSource(folder.local_path)
    else:
        from train.data.remote import FolderSource

        source = FolderSource(folder)
    if cache_dir is None:
        return source
    return CachedSource(source, Path(cache_dir), cache_max_bytes, shards or {})


def read_index(location: str | os.PathLike) -> tuple[dict, bytes]:
    """index.json of a shard folder, schema-checked (UsageError, one line, otherwise), and its raw
    bytes (whose hash is the dataset's fingerprint). Read from the same storage as the shards."""
    from pipeline.formats import index as shard_index

    return shard_index.load_bytes(location)


class LocalSource:
    """A shard folder on local disk; one descriptor per shard per process, closed by `close`."""

    cap = 64 * MiB
    ahead = 0

    def __init__(self, root: Path):
        self.root = Path(root)
        self._fds: dict[str, int] = {}
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        """For a spawned dataloader worker: the folder only (descriptors and the lock are per process)."""
        return {"root": self.root}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["root"])  # type: ignore[misc]

    def url(self, rel: str) -> str:
        return rel  # a local shard is named by its file name, as every message did before

    def transient(self, exc: BaseException) -> bool:
        return False  # a local file that fails to read will fail again

    def read_range(self, rel: str, start: int, length: int) -> memoryview:
        return read_range(self._fd(rel), start, length)

    def _fd(self, rel: str) -> int:
        with self._lock:
            if self._pid != os.getpid():  # a forked worker: the parent's descriptors are the parent's to close
                self._fds, self._pid = {}, os.getpid()
            fd = self._fds.get(rel)
            if fd is None:
                fd = self._fds[rel] = os.open(self.root / rel, os.O_RDONLY)
            return fd

    def close(self) -> None:
        with self._lock:
            fds, self._fds = (self._fds if self._pid == os.getpid() else {}), {}
        for fd in fds.values():
            os.close(fd)


class CachedSource:
    """Whole shards of a slower source kept in ``folder``, at most ``max_bytes`` in all.

    A shard is fetched whole on its first read (in cap-sized ranged reads, retried like any
    read), checked against index.json's size and sha256, and renamed into place: a file in the
    cache is always complete and correct. Files are named by their sha256, so two datasets or a
    rewritten shard never mix. Several workers and ranks on one machine share the folder: one
    fetches a shard while holding its lock, the others read their ranges from the source
    meanwhile instead of waiting or fetching it twice. Least recently used shards (by mtime,
    touched on use) are evicted to make room; a shard larger than the cap is never cached.
    """

    def __init__(self, inner, folder: Path, max_bytes: int | None, shards: dict[str, tuple[int, str]],
                 retry: Retry = DEFAULT_RETRY):
        self.inner, self.folder, self.max_bytes, self.shards, self.retry = inner, Path(folder), max_bytes, shards, retry
        self.cap, self.ahead = inner.cap, inner.ahead
        self.local = LocalSource(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._touched: set[str] = set()

    def url(self, rel: str) -> str:
        return self.inner.url(rel)

    def transient(self, exc: BaseException) -> bool:
        return self.inner.transient(exc)

    def read_range(self, rel: str, start: int, length: int):
        name = self._name(rel)
        if name is None or not self._present(rel, name):
            return self.inner.read_range(rel, start, length)
        try:
            return self.local.read_range(name, start, length)
        except FileNotFoundError:  # evicted by another worker since we looked: the source still has it
            self._touched.discard(name)
            return self.inner.read_range(rel, start, length)

    def close(self) -> None:
        self.local.close()
        self.inner.close()
        self._touched.clear()

    def _name(self, rel: str) -> str | None:
        size, sha = self.shards.get(rel, (None, None))
        if size is None or (self.max_bytes is not None and size > self.max_bytes):
            return None
        return f"{sha}{Path(rel).suffix}"

    def _present(self, rel: str, name: str) -> bool:
        """Whether the shard is in the cache now (fetching it if nobody else is)."""
        path = self.folder / name
        if name in self._touched or self._use(path):
            return True
        with _try_lock(self.folder / f"{name}.lock") as mine:
            if not mine:
                return False  # another worker is fetching it: read from the source meanwhile
            if not self._use(path):
                self._fetch(rel, path)
            self._touched.add(name)
        return True

    def _use(self, path: Path) -> bool:
        try:
            os.utime(path)  # least recently used: by mtime
        except FileNotFoundError:
            return False
        self._touched.add(path.name)
        return True

    def _fetch(self, rel: str, path: Path) -> None:
        size, sha = self.shards[rel]
        digest = hashlib.sha256()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(tmp, "wb") as f:
                for at in range(0, size, self.cap):
                    data = read_with_retries(self.inner, Read(rel, at, min(self.cap, size - at), ()), self.retry)
                    digest.update(data)
                    f.write(data)
            if digest.hexdigest() != sha:
                raise ShardReadError(f"{self.inner.url(rel)}: does not match index.json's sha256 (it changed since "
                                     "pipe shard wrote it)")
            with _lock(self.folder / ".evict.lock"):
                self._make_room(size)
                os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _make_room(self, size: int) -> None:
        if self.max_bytes is None:
            return
        files = []
        for p in self.folder.iterdir():
            if p.name.startswith(".") or p.suffix == ".lock":
                continue
            with contextlib.suppress(FileNotFoundError):
                st = p.stat()
                files.append((st.st_mtime, p, st.st_size))
        used = sum(s for _, _, s in files)
        for _, p, s in sorted(files):  # oldest use first; an open descriptor keeps reading an evicted file
            if used + size <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            used -= s


@contextlib.contextmanager
def _try_lock(path: Path):
    """Yields True holding an exclusive lock on ``path`` (between processes), False if another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def _lock(path: Path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_range(fd: int, offset: int, n: int) -> memoryview:
    """Up to ``n`` bytes of the file at ``offset`` (fewer only where the file ends), as a view.

    A large range (a block of samples) is mapped from the page cache where the file system
    allows it: no copy (a read into fresh memory costs about twice the kernel time of `cat`,
    whose small buffer stays in the CPU cache), and every page is brought in and mapped now
    (MAP_POPULATE), so the bytes are read here, not on first touch. A small range (one
    validation sample, a block of short texts) is read plainly: below a few MiB setting up and
    tearing down a mapping costs more than the copy. So is any range where mapping fails
    (some network and FUSE file systems).
    """
    if n < MAP_FROM:
        return memoryview(os.pread(fd, n, offset))
    n = max(0, min(n, os.fstat(fd).st_size - offset))  # never map past the end: touching that is SIGBUS
    if n and _CAN_MAP:
        base = offset - offset % mmap.ALLOCATIONGRANULARITY
        try:
            mapped = mmap.mmap(fd, offset - base + n, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ, offset=base)
        except (OSError, ValueError):
            pass
        else:
            return memoryview(mapped)[offset - base : offset - base + n]
    return read_aligned(fd, offset, n)


def read_aligned(fd: int, offset: int, n: int) -> memoryview:
    """Up to ``n`` bytes at ``offset`` read into fresh, 64-byte aligned memory.

    Not `os.pread`: the kernel copies into a `bytes` object's buffer at whatever address malloc
    gave, measured up to twice as slow for some alignments, and its fresh 4 KiB pages fault one
    by one; numpy aligns large arrays better and asks for huge pages where the kernel has them.
    """
    raw = np.empty(n + ALIGN, dtype=np.uint8)
    skip = -raw.ctypes.data % ALIGN
    view = raw.data[skip : skip + n]  # the array's own memoryview
    got = 0
    while got < n:
        k = os.preadv(fd, [view[got:]], offset + got)
        if k == 0:
            break
        got += k
    return view[:got]
