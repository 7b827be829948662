"""A Folder on the local file system: today's behaviour, with pipe's crash-safe writes."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pipeline.core.files import atomic_copy, atomic_write_bytes, tmp_name
from pipeline.storage.folder import Entry, Folder, Stream, TooLarge, check_rel, sort_key


class LocalFolder(Folder):
    def __init__(self, root: Path):
        self.root = Path(root)
        self.url = str(self.root)
        self.local_path = self.root

    def _path(self, rel: str) -> Path:
        return self.root / check_rel(rel)

    def list(self) -> list[Entry]:
        """Regular files only, links not followed: what a link points to is the caller's rule
        (pipe clean's discovery decides about links itself)."""
        found = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            dirnames.sort()
            base = Path(dirpath)
            for name in filenames:
                st = os.lstat(base / name)
                if not _is_regular(st.st_mode):
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
        return open(self._path(rel), "rb")

    def upload(self, rel: str, path: Path) -> None:
        atomic_copy(path, self._path(rel))

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        with open(self._path(rel), "rb") as f:
            f.seek(start)
            return f.read(length)

    def write(self, rel: str, data: bytes) -> None:
        atomic_write_bytes(self._path(rel), data)

    def write_if_absent(self, rel: str, data: bytes) -> bool:
        """Write a temporary file, then hard-link it to the final name: link() fails if the name
        exists, so of two runs exactly one creates it, and a reader never sees it half-written."""
        path = self._path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_name(path)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return True

    def move(self, src: str, dest: str) -> None:
        target = self._path(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._path(src), target)

    def exists(self, rel: str) -> bool:
        return self._path(rel).is_file()

    def delete(self, rel: str) -> None:
        self._path(rel).unlink(missing_ok=True)

    def child(self, rel: str) -> LocalFolder:
        return LocalFolder(self._path(rel))


def _is_regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)

