"""The interface every storage backend offers, and the checks they share.

A stage reads and writes its folders only through `Folder`: plain file operations (read, write,
ranged reads, listing, moves), and the few things a stage's output needs that differ between
a directory and an object store, each a method here with one meaning whatever the storage:

* `walk`: what discovery sees, with the local rules for links and special files reported as
  entries (`Entry.note`) rather than applied by the caller;
* `lock`, `commit`, `occupied`, `identity`: one run at a time where the storage can lock, and
  of two runs that meet anyway exactly one commits its output;
* `sizes`, `stamps`, `sweep`, `put_file`, `copy_in`, `staging`, `local_view`, `appender`: what
  finishing and resuming an output needs, done by each backend the way it is cheap there.
"""

from __future__ import annotations

import abc
import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline.core.errors import StageFailed, UsageError
from pipeline.storage.lease import LOCK, held, hold, pipe_own  # noqa: F401 - LOCK: what callers import from here

# What `Entry.note` says of an entry that is no readable file (a stage maps these to its reasons)
OUTSIDE_ROOT = "outside_root"  # a link that leaves the folder: never read
BROKEN_LINK = "broken_link"
SPECIAL = "special"  # a FIFO, socket or device
UNREADABLE = "unreadable"  # the file could not be read (``detail`` says why)
UNREADABLE_FOLDER = "unreadable_folder"  # a folder that could not be listed (``detail`` says why)
FOLDER_LINK = "folder_link"  # a link to a folder inside the root: its files are listed there, under their own names
SKIPPED_FOLDER = "skipped_folder"  # a folder the caller asked not to enter (``files`` inside it)
BAD_NAME = "bad_name"  # an object key no file path can be (an empty, "." or ".." part)


@dataclass(frozen=True, slots=True)
class Entry:
    """One object or file: its path relative to the folder ("/"-separated), size and version
    (an S3 ETag, a local file's mtime in ns): enough to tell a changed input from the same one.

    From `Folder.walk` also an entry that is no readable file: ``note`` says what it is (one of
    this module's constants), ``detail`` says more, ``files`` counts a skipped folder's files;
    ``read_as`` is where a link inside the folder leads (the path to read), when it is a link."""

    rel: str
    size: int
    version: str
    mtime_ns: int = 0  # when it was last written (an object's Last-Modified): what a re-run compares
    note: str = ""
    detail: str = ""
    files: int = 0
    read_as: str = ""

    @property
    def target(self) -> str:
        """The path to read this entry's bytes from: the link's target for a link inside the folder."""
        return self.read_as or self.rel


class Stream(Protocol):
    """What `Folder.open` returns: a binary stream to read and close (a file, or an object's body);
    ``stat()`` gives its size and modification time (``st_size``, ``st_mtime_ns``, ``st_ctime_ns``)."""

    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...

    def stat(self) -> Any: ...

    def seekable(self) -> bool: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any, /) -> Any: ...


class TooLarge(ValueError):
    """``read(rel, max_bytes)`` refused a file larger than ``max_bytes`` without reading it all.

    A verdict about the data, for the caller to turn into a reason (never shown as an error)."""

    def __init__(self, rel: str, size: int | None):
        super().__init__(f"{rel}: {size if size is not None else 'more than the limit of'} bytes")
        self.rel, self.size = rel, size


def check_rel(rel: str) -> str:
    """A relative "/"-separated path that stays inside its folder: no leading "/", no "..", no
    empty parts. Every method takes such a path, so no caller can write outside the folder."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise UsageError(f"{rel!r} is not a path inside a folder")
    return rel


def safe_rel(rel: str) -> bool:
    """Whether ``rel`` is a path `check_rel` accepts."""
    try:
        check_rel(rel)
    except UsageError:
        return False
    return True


def bad_name_detail(e: Entry) -> str:
    """Why an object's key is no file path (`BAD_NAME`), in the words of its manifest row."""
    if e.rel.endswith("/"):
        return (f"an object key ending in '/' that holds {e.size} bytes: no file can have this name "
                "(a folder marker holds none)")
    return "an object key with an empty, '.' or '..' part is no file path"


def sort_key(rel: str) -> bytes:
    """Bytewise order of the UTF-8 names, the order S3 lists in, so both backends agree."""
    return rel.encode("utf-8", "surrogateescape")


Entries = list[Entry]  # (a name: in `Folder`'s body, ``list`` is the method)


class Sizes(Protocol):
    """What is in a folder now, by size (`Folder.sizes`): asked file by file, told what changed."""

    def get(self, rel: str) -> int | None: ...

    def changed(self, rel: str, size: int | None) -> None: ...


class Folder(abc.ABC):
    """A folder of files addressed by relative paths. Implementations: LocalFolder, S3Folder."""

    url: str  # for display and for manifests/reports: never a secret
    local_path: Path | None  # the directory for a local folder, None for object storage
    exclusive: bool = False  # a run can hold it alone (`lock`): a rerun into it may take it over

    # ---------------------------------------------------------------- files

    @abc.abstractmethod
    def list(self) -> Entries:
        """Every file under the folder, recursively, sorted by ``rel`` bytewise."""

    @abc.abstractmethod
    def read(self, rel: str, max_bytes: int | None = None) -> bytes:
        """The whole file; raises TooLarge past ``max_bytes`` (without reading it all) and
        FileNotFoundError when it does not exist."""

    @abc.abstractmethod
    def open(self, rel: str) -> Stream:
        """The file as a stream read in chunks (hashing a huge file never holds it whole); the
        stream's ``stat()`` gives its size. FileNotFoundError when it does not exist."""

    @abc.abstractmethod
    def upload(self, rel: str, path: Path) -> None:
        """Copy the local file ``path`` to ``rel`` (large files in parts on S3), atomically."""

    @abc.abstractmethod
    def read_range(self, rel: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (fewer at the end of the file)."""

    @abc.abstractmethod
    def write(self, rel: str, data: bytes, durable: bool = False) -> None:
        """Replace ``rel`` with ``data`` atomically: a reader sees the old or the new bytes.
        ``durable``: on the disk before the call returns (a local file is synced; an object is
        stored once written anyway)."""

    @abc.abstractmethod
    def write_if_absent(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` only if nothing is there; False if something was (then nothing changes).
        Of two concurrent callers exactly one gets True: this is how a run commits its output."""

    @abc.abstractmethod
    def move(self, src: str, dest: str) -> None:
        """Rename ``src`` to ``dest`` (replacing it); FileNotFoundError when ``src`` is absent. On S3
        a server-side copy then a delete: a reader may see both names for a moment, never neither."""

    @abc.abstractmethod
    def exists(self, rel: str) -> bool:
        """Whether a file ``rel`` exists."""

    @abc.abstractmethod
    def delete(self, rel: str) -> None:
        """Remove ``rel``; an absent file is no error."""

    @abc.abstractmethod
    def child(self, rel: str) -> Folder:
        """The folder ``rel`` inside this one."""

    def __str__(self) -> str:
        return self.url

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Folder) and type(other) is type(self) and other.url == self.url

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.url))

    # ---------------------------------------------------------------- where it is

    def state(self) -> str:
        """"folder" (a directory, or a prefix holding objects), "file" (a file stands at its path)
        or "absent"."""
        return "folder" if self.list() else "absent"

    def identity(self) -> str:
        """The folder as a marker records it (a resolved path, a URL): the same folder, the same text."""
        return self.url

    def contains(self, other: Folder) -> bool:
        """Whether ``other`` is this folder or lies inside it (pipe never writes into its input)."""
        return type(other) is type(self) and (other.url == self.url or other.url.startswith(self.url.rstrip("/") + "/"))

    def contained(self, rel: str) -> bool:
        """Whether reading ``rel`` reads a file inside this folder (a local link may lead out)."""
        return safe_rel(rel)

    def read_contained(self, rel: str, max_bytes: int | None = None, head: int | None = None) -> bytes:
        """`read` for a reader led by paths someone else wrote (pipe report's previews): the file
        read is a regular file inside this folder, checked on what was opened (a link swapped in
        after a check leads nowhere), else PermissionError; ``head``: only its first bytes.
        Object storage has no links: any object under the prefix is inside."""
        if not self.contained(rel):
            raise PermissionError(f"{rel}: leaves its folder")
        return self.read_range(rel, 0, head) if head is not None else self.read(rel, max_bytes)

    # ---------------------------------------------------------------- discovery

    def list_all(self) -> Entries:
        """`list`, and also what holds bytes under a name no file path can be (an object key ending
        in "/" with content): what a stage that must account for every input lists. Sorted."""
        return self.list()

    def walk(self, skip: Callable[[str], bool] | None = None) -> Entries:
        """What a stage reading every input finds, sorted: every file, and every folder ``skip``
        names (by its last component) as one entry (`SKIPPED_FOLDER`, with its file count)
        instead of its files; a name no path can be is an entry too (`BAD_NAME`), judged first: a
        ``../`` key is no hidden folder. Object storage has no links; `LocalFolder` adds its
        rules for them."""
        skipped: dict[str, int] = {}
        found = []
        for e in self.list_all():
            parts = e.rel.split("/")
            at = next((i for i, p in enumerate(parts[:-1]) if skip is not None and skip(p)), None)
            if not safe_rel(e.rel):
                found.append(Entry(e.rel, e.size, e.version, e.mtime_ns, note=BAD_NAME, detail=bad_name_detail(e)))
            elif at is not None:
                name = "/".join(parts[: at + 1])
                skipped[name] = skipped.get(name, 0) + 1
            else:
                found.append(e)
        found += [Entry(name, 0, "", note=SKIPPED_FOLDER, files=n) for name, n in skipped.items()]
        found.sort(key=lambda e: sort_key(e.rel))
        return found

    def read_heads(self, rels: Iterable[str], n: int) -> Iterator[bytes | OSError]:
        """The first ``n`` bytes of each file, in order (an OSError where one cannot be read)."""
        for rel in rels:
            try:
                yield self.read_range(rel, 0, n)
            except OSError as e:
                yield e

    # ---------------------------------------------------------------- an output

    def lock(self, tool: str) -> contextlib.AbstractContextManager[None]:
        """Hold the folder for one run (a second run stops at once with StageFailed), where the
        storage can. Object storage is asked once whether its server honours conditional writes:
        where it does, runs meet at `commit` instead; where it does not, the run holds a lease
        (`lease.py`)."""
        return hold(self, tool)

    def occupied(self) -> bool:
        """Whether the folder holds anything but pipe's own lock (a lock file, lease claims)."""
        return any(not pipe_own(e.rel) for e in self.list())

    def clear_temporaries(self) -> None:  # noqa: B027 - nothing to do where writes are whole or absent
        """Remove what a killed run left half-written (a local folder's temporary files)."""

    def commit(self, rel: str, source: bytes | Path) -> None:
        """Write the file that says the folder is complete, only if no other run has: StageFailed
        (one line) when one did. ``source``: the bytes, or a local file holding them. Under a
        lease (a server without conditional writes) the lease is confirmed, then the file written."""
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        lease = held(self)
        if lease is not None:
            lease.confirm()
            self.write(rel, data)
        elif not self.write_if_absent(rel, data):
            raise committed_by_another_run(self, rel)

    def sizes(self) -> Sizes:
        """What is in the folder now, by size, for work over many of its files (finishing an
        output): listed once here; `LocalFolder` asks the file system each time instead."""
        return _Listed(self)

    def stamps(self) -> Callable[[str], tuple[int, int, int] | None]:
        """A function: a file's (size, mtime_ns, ctime_ns) now, None when absent (what a rerun
        compares with what an earlier run recorded); object storage lists once, ctime is 0."""
        listed = {e.rel: (e.size, e.mtime_ns, 0) for e in self.list()}
        return listed.get

    def sweep(self, prefix: str, keep: set[str]) -> None:
        """Remove every file under ``prefix/`` whose path is not in ``keep`` (an earlier run's);
        the lease claims of runs holding the folder stay (`lease.pipe_own`)."""
        stale = [rel for e in self.child(prefix).list() for rel in [f"{prefix}/{e.rel}"]
                 if rel not in keep and not pipe_own(rel)]
        parallel(self.delete, stale)

    def put_file(self, rel: str, path: Path) -> None:
        """Place the finished local file ``path`` (from `staging`) at ``rel``; ``path`` is gone after."""
        try:
            self.upload(rel, path)
        finally:
            Path(path).unlink(missing_ok=True)

    def put_stream(self, rel: str, stream: Stream) -> None:
        """Copy a stream (read in chunks: it may be huge) to ``rel``, atomically."""
        with self.staging("copy") as tmp:
            path = tmp / "stream"
            with open(path, "wb") as out:
                shutil.copyfileobj(stream, out, 1 << 20)
            self.put_file(rel, path)

    def copy_in(self, src: Folder, src_rel: str, rel: str) -> int:
        """Copy ``src``'s file ``src_rel`` to ``rel`` here; return its size. FileNotFoundError
        when it is gone."""
        with src.open(src_rel) as f:
            size = int(f.stat().st_size)
            self.put_stream(rel, f)
        return size

    @contextlib.contextmanager
    def staging(self, purpose: str) -> Iterator[Path]:
        """A local folder for files bound for this one (`put_file`, `commit`), removed after."""
        path = Path(tempfile.mkdtemp(prefix=f"pipe-{purpose}-"))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def local_view(self, rels: Iterable[str]) -> contextlib.AbstractContextManager[Path]:
        """A local directory where the files ``rels`` can be read as files (code that maps pages or
        reads with ``readv``): a local folder is its own; object storage is copied there, the
        copies keeping their objects' modification times."""
        return _mirror(self, list(rels))

    def appender(self, rel: str) -> Appender | FileAppendable:
        """A text file grown line by line (a journal): local ones are appended to; on object
        storage the whole text is written again, at most every few seconds and on close."""
        return Appender(self, rel)


def committed_by_another_run(folder: Folder, rel: str) -> StageFailed:
    """The one line a run says when another run committed the output it was writing."""
    return StageFailed(f"{folder.url}/{rel} was committed by another run while this one worked; that run's output "
                       "stands and this run's was not committed")




class FileAppendable(Protocol):
    """What `Folder.appender` returns: lines added, then closed."""

    def add(self, line: str) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class Appender:
    """`Folder.appender` where files cannot grow: the text rewritten whole, now and then."""

    EVERY_S = 5.0

    def __init__(self, folder: Folder, rel: str):
        import time

        self.folder, self.rel, self._time = folder, rel, time.monotonic
        try:
            self.text = folder.read(rel).decode("utf-8", "replace")
        except FileNotFoundError:
            self.text = ""
        self._written = self._time()
        self._dirty = False

    def add(self, line: str) -> None:
        self.text += line
        self._dirty = True
        if self._time() - self._written >= self.EVERY_S:
            self.flush()

    def flush(self) -> None:
        if self._dirty:
            self.folder.write(self.rel, self.text.encode("utf-8"))
            self._written, self._dirty = self._time(), False

    def close(self) -> None:
        self.flush()


class _Listed:
    """`Folder.sizes` from one listing, kept up to date by the caller's changes."""

    def __init__(self, folder: Folder):
        self._sizes = {e.rel: e.size for e in folder.list()}

    def get(self, rel: str) -> int | None:
        return self._sizes.get(rel)

    def changed(self, rel: str, size: int | None) -> None:
        if size is None:
            self._sizes.pop(rel, None)
        else:
            self._sizes[rel] = size


_MIRRORS: dict[str, tuple[Path, int]] = {}  # folder URL -> (local copy, users): nested views share one copy


@contextlib.contextmanager
def _mirror(folder: Folder, rels: list[str]) -> Iterator[Path]:
    """A local copy of ``rels`` of ``folder`` under TMPDIR, shared by nested views in this
    process (a stage's whole view, then a part's); removed when the outermost view ends."""
    import hashlib

    key = folder.url
    found = _MIRRORS.get(key)
    if found is None:
        root = Path(tempfile.gettempdir()) / f"pipe-view-{hashlib.sha256(key.encode()).hexdigest()[:16]}-{os.getpid()}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        found = (root, 0)
    root = found[0]
    _MIRRORS[key] = (root, found[1] + 1)
    try:
        wanted = {rel for rel in rels if not (root / rel).is_file()}
        if wanted:
            times = {e.rel: e.mtime_ns for e in folder.list() if e.rel in wanted} if len(wanted) > 1 else {}
            parallel(lambda rel: _fetch(folder, rel, root / rel, times.get(rel)), sorted(wanted))
        yield root
    finally:
        root, users = _MIRRORS[key]
        if users <= 1:
            del _MIRRORS[key]
            shutil.rmtree(root, ignore_errors=True)
        else:
            _MIRRORS[key] = (root, users - 1)


def _fetch(folder: Folder, rel: str, path: Path, mtime_ns: int | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with folder.open(rel) as f, open(tmp, "wb") as out:
        shutil.copyfileobj(f, out, 1 << 20)
        if mtime_ns is None:
            mtime_ns = int(getattr(f.stat(), "st_mtime_ns", 0))
    if mtime_ns:
        os.utime(tmp, ns=(mtime_ns, mtime_ns))  # what a rerun compares: the object's time, not the copy's
    os.replace(tmp, path)


THREADS = 16  # storage calls in flight at once: objects are small, the round trip is the cost


def parallel(fn: Callable[[str], Any], items: list[str]) -> None:
    """``fn`` on every item, THREADS at a time (each is one round trip); the first error stops it."""
    if not items:
        return
    if len(items) == 1:
        fn(items[0])
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(THREADS, len(items))) as pool:
        for _ in pool.map(fn, items):
            pass
