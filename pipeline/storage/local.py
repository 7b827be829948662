"""A Folder on the local file system: pipe's crash-safe writes (a temporary name, then a rename),
a lock held for a whole run, and the rules for links a local input needs (`walk`)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from pipeline.core.files import STATE_DIR, atomic_copy, atomic_write_bytes, occupied, output_lock, tmp_name
from pipeline.storage.folder import (
    BROKEN_LINK,
    FOLDER_LINK,
    OUTSIDE_ROOT,
    SKIPPED_FOLDER,
    SPECIAL,
    UNREADABLE,
    UNREADABLE_FOLDER,
    Entries,
    Entry,
    Folder,
    Stream,
    TooLarge,
    check_rel,
    committed_by_another_run,
    sort_key,
)


class LocalFile(io.FileIO):
    """A local file opened for reading, whose ``stat()`` is its descriptor's (as an object's stream says its size)."""

    def stat(self) -> os.stat_result:
        return os.fstat(self.fileno())


class LocalFolder(Folder):
    exclusive = True

    def __init__(self, root: Path):
        self.root = Path(root)
        self.url = str(self.root)
        self.local_path = self.root

    def __reduce__(self):
        """Sent to another process (a worker, a Ray task elsewhere) as an absolute path: its
        working directory need not be this one's."""
        return (LocalFolder, (Path(os.path.abspath(self.root)),))

    def _path(self, rel: str) -> Path:
        return self.root / check_rel(rel)

    def list(self) -> Entries:
        """Regular files only, links not followed: what a link points to is the caller's rule
        (`walk` reports links)."""
        found = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            dirnames.sort()
            base = Path(dirpath)
            for name in filenames:
                st = os.lstat(base / name)
                if not stat.S_ISREG(st.st_mode):
                    continue
                rel = (base / name).relative_to(self.root).as_posix()
                found.append(Entry(rel=rel, size=st.st_size, version=str(st.st_mtime_ns), mtime_ns=st.st_mtime_ns))
        found.sort(key=lambda e: sort_key(e.rel))
        return found

    def read(self, rel: str, max_bytes: int | None = None) -> bytes:
        with open(self._path(rel), "rb") as f:
            if max_bytes is not None:
                size = os.fstat(f.fileno()).st_size
                if size > max_bytes:
                    raise TooLarge(rel, size)
            return f.read()

    def open(self, rel: str) -> Stream:
        return LocalFile(self._path(rel), "r")

    def upload(self, rel: str, path: Path) -> None:
        atomic_copy(path, self._path(rel))

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        fd = os.open(self._path(rel), os.O_RDONLY)
        try:
            return os.pread(fd, max(0, length), start)
        finally:
            os.close(fd)

    def write(self, rel: str, data: bytes, durable: bool = False) -> None:
        atomic_write_bytes(self._path(rel), data, fsync=durable)

    def write_if_absent(self, rel: str, data: bytes) -> bool:
        """Write a temporary file, then hard-link it to the final name: link() fails if the name
        exists, so of two runs exactly one creates it, and a reader never sees it half-written."""
        path = self._path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_name(path)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return _link(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def move(self, src: str, dest: str) -> None:
        target = self._path(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._path(src), target)

    def exists(self, rel: str) -> bool:
        return self._path(rel).is_file()

    def delete(self, rel: str) -> None:
        with contextlib.suppress(IsADirectoryError):  # a folder is no file: nothing to delete
            self._path(rel).unlink(missing_ok=True)

    def child(self, rel: str) -> LocalFolder:
        return LocalFolder(self._path(rel))

    # ---------------------------------------------------------------- where it is

    def state(self) -> str:
        if self.root.is_dir():
            return "folder"
        return "file" if self.root.exists() else "absent"

    def identity(self) -> str:
        return str(self.root.resolve())

    def contains(self, other: Folder) -> bool:
        if not isinstance(other, LocalFolder):
            return False
        mine, theirs = self.root.resolve(), other.root.resolve()
        return theirs == mine or mine in theirs.parents

    def contained(self, rel: str) -> bool:
        """The path leads to a file inside the folder, links followed."""
        try:
            root = self.root.resolve()
            return root in self._path(rel).resolve().parents
        except Exception:  # noqa: BLE001 - not a path inside (UsageError), a loop of links (RuntimeError, OSError)
            return False

    def read_contained(self, rel: str, max_bytes: int | None = None, head: int | None = None) -> bytes:
        """Checked before opening (a FIFO or a device outside is never opened) and again on the
        descriptor opened, so a link swapped in between reads nothing from outside."""
        if not self.contained(rel):
            raise PermissionError(f"{rel}: not a file inside {self.root}")
        path, root = self._path(rel), os.path.realpath(self.root)
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise PermissionError(f"{rel}: not a file inside {self.root}")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb", closefd=True) as f:
            st = os.fstat(fd)
            real = _opened_path(fd)
            if not stat.S_ISREG(st.st_mode) or (real is not None and not real.startswith(root.rstrip(os.sep) + os.sep)):
                raise PermissionError(f"{rel}: not a file inside {self.root}")
            if head is not None:
                return f.read(max(0, head))
            if max_bytes is not None and st.st_size > max_bytes:
                raise TooLarge(rel, st.st_size)
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
            if max_bytes is not None and len(data) > max_bytes:  # grew since
                raise TooLarge(rel, None)
            return data

    # ---------------------------------------------------------------- discovery

    def walk(self, skip: Callable[[str], bool] | None = None) -> Entries:
        """Every entry under the folder, sorted, by the rules of a local input: a link is followed
        only to a file inside the folder (``read_as`` says which); a link leading out is one entry
        (`OUTSIDE_ROOT`), never read; a link to a folder, a folder ``skip`` names, one that cannot
        be listed, a broken link and a FIFO, socket or device are one entry each, never walked."""
        root = os.path.abspath(self.root)
        root_real = os.path.realpath(root)
        found = list(_walk(root, root_real, "", skip))
        found.sort(key=lambda e: sort_key(e.rel))
        return found

    # ---------------------------------------------------------------- an output

    def lock(self, tool: str) -> contextlib.AbstractContextManager[None]:
        return output_lock(self.root, tool)

    def occupied(self) -> bool:
        if self.root.exists() and not self.root.is_dir():
            from pipeline.core.errors import UsageError

            raise UsageError(f"the output path {self.root} exists and is not a folder")
        return occupied(self.root)

    def clear_temporaries(self) -> None:
        """Temporary files (``.*.tmp``) and staging folders a killed run left: only a run holding
        the folder's lock may call this."""
        from pipeline.core.files import sweep_tmp

        if self.root.is_dir():
            for p in (self.root / STATE_DIR).glob("staging-*"):
                shutil.rmtree(p, ignore_errors=True)
            sweep_tmp(self.root)

    def commit(self, rel: str, source: bytes | Path) -> None:
        """The commit file made by a link (which fails where the name exists), from a file already
        on this file system when ``source`` is one (no copy): what a run holding the lock writes last."""
        if isinstance(source, bytes):
            return super().commit(rel, source)
        path = self._path(rel)
        _fsync(Path(source))
        if not _link(Path(source), path):
            raise committed_by_another_run(self, rel)
        Path(source).unlink(missing_ok=True)

    def sizes(self) -> _Stat:
        return _Stat(self.root)

    def stamps(self) -> Callable[[str], tuple[int, int, int] | None]:
        root = os.fspath(self.root)

        def stamp(rel: str) -> tuple[int, int, int] | None:
            try:
                st = os.stat(f"{root}/{rel}")
            except (OSError, ValueError):
                return None
            return st.st_size, st.st_mtime_ns, st.st_ctime_ns

        return stamp

    def sweep(self, prefix: str, keep: set[str]) -> None:
        """Remove what is under ``prefix`` and not kept (files and links), then the folders that
        leaves empty. Paths as strings from os.scandir: a Path per file (rglob, relative_to,
        is_file) was ~0.1 ms a file of the main process, after every run."""
        folder = self._path(prefix)
        if folder.is_dir():
            _sweep_in(str(folder), f"{prefix}/", keep)

    def put_file(self, rel: str, path: Path) -> None:
        """``path`` (on this file system: from `staging`) synced to the disk and renamed into place."""
        _fsync(Path(path))
        target = self._path(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)

    def put_stream(self, rel: str, stream: Stream) -> None:
        path = self._path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_name(path)
        try:
            with open(tmp, "wb") as out:
                shutil.copyfileobj(stream, out, 1 << 20)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise

    def copy_in(self, src: Folder, src_rel: str, rel: str) -> int:
        if isinstance(src, LocalFolder):
            path = src._path(src_rel)
            atomic_copy(path, self._path(rel))  # copyfile: the kernel copies (sendfile), no bytes through Python
            return self._path(rel).stat().st_size
        return super().copy_in(src, src_rel, rel)

    @contextlib.contextmanager
    def staging(self, purpose: str) -> Iterator[Path]:
        """A folder inside this one's ``.pipe/`` (the same file system: placing a file is a rename)."""
        import tempfile

        (self.root / STATE_DIR).mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=f"staging-{purpose}-", dir=self.root / STATE_DIR))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def local_view(self, rels) -> contextlib.AbstractContextManager[Path]:
        return contextlib.nullcontext(self.root)

    def appender(self, rel: str) -> FileAppender:
        return FileAppender(self._path(rel))


class FileAppender:
    """`Folder.appender` of a local file: lines appended and flushed (no fsync: a line lost to a
    crash only means that work is done again)."""

    def __init__(self, path: Path):
        self.path = path
        self._f: TextIO | None = None

    def add(self, line: str) -> None:
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8")
        self._f.write(line)
        self._f.flush()

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class _Stat:
    """`Folder.sizes` of a local folder: the file system asked each time (no listing held)."""

    def __init__(self, root: Path):
        self.root = os.fspath(root)

    def get(self, rel: str) -> int | None:
        try:
            return os.stat(f"{self.root}/{rel}").st_size
        except (OSError, ValueError):
            return None

    def changed(self, rel: str, size: int | None) -> None:
        """(The file system already knows.)"""


def _link(tmp: Path, path: Path) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    return True


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _walk(root: str, root_real: str, rel: str, skip: Callable[[str], bool] | None) -> Iterator[Entry]:
    """The entries below ``rel``, by name. Every folder walked below the root is a real one
    (links to folders are entries, never walked), so a plain file's real path is the root's
    followed by its relative path, without a realpath per file (an lstat per component of its
    path: the most of discovery's system calls)."""
    here = os.path.join(root, rel) if rel else root
    try:
        entries = sorted(os.scandir(here), key=lambda e: e.name)
    except OSError as e:
        yield Entry(rel, 0, "", note=UNREADABLE_FOLDER, detail=f"{e.strerror or e}")
        return
    for entry in entries:
        child = f"{rel}/{entry.name}" if rel else entry.name
        try:
            is_dir = entry.is_dir(follow_symlinks=True)
        except OSError:
            is_dir = False
        if is_dir and entry.is_symlink():
            real = os.path.realpath(entry.path)
            if _within(real, root_real):
                yield Entry(child, 0, "", note=FOLDER_LINK, detail=os.path.relpath(real, root_real).replace(os.sep, "/"))
            else:
                yield Entry(child, 0, "", note=OUTSIDE_ROOT, detail=_readlink(entry.path))
        elif is_dir and skip is not None and skip(entry.name):
            yield Entry(child, 0, "", note=SKIPPED_FOLDER, files=sum(len(files) for _, _, files in os.walk(entry.path)))
        elif is_dir:
            yield from _walk(root, root_real, child, skip)
        else:
            yield _file(child, entry, root_real)


def _file(rel: str, entry: os.DirEntry, root_real: str) -> Entry:
    """One non-folder entry: a regular file (through a link only if it stays inside the root)."""
    try:
        link = entry.is_symlink()
    except OSError:
        link = True  # not known: treated as a link, which is always safe
    read_as = ""
    try:
        if link:
            real = os.path.realpath(entry.path)
            if os.path.islink(entry.path) and not _within(real, root_real):
                return Entry(rel, 0, "", note=OUTSIDE_ROOT, detail=_readlink(entry.path))
            inside = os.path.relpath(real, root_real).replace(os.sep, "/")
            read_as = "" if inside == rel else inside
        st = os.stat(entry.path)
    except FileNotFoundError:
        return Entry(rel, 0, "", note=BROKEN_LINK)
    except OSError as e:
        return Entry(rel, 0, "", note=UNREADABLE, detail=f"{type(e).__name__}: {e.strerror or e}")
    if not stat.S_ISREG(st.st_mode):
        return Entry(rel, 0, "", note=SPECIAL)
    return Entry(rel, st.st_size, str(st.st_mtime_ns), st.st_mtime_ns, read_as=read_as)


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def _sweep_in(path: str, prefix: str, keep: set[str]) -> None:
    """`LocalFolder.sweep` below ``path`` (``prefix``: its path relative to the folder, with a "/")."""
    with os.scandir(path) as it:
        entries = list(it)
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            _sweep_in(e.path, f"{prefix}{e.name}/", keep)
            if not os.listdir(e.path):
                os.rmdir(e.path)
        elif (e.is_file() or e.is_symlink()) and prefix + e.name not in keep:
            os.unlink(e.path)


def _opened_path(fd: int) -> str | None:
    """The path the kernel says an open descriptor is (Linux's /proc), None where it cannot say."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
