"""The interface every storage backend offers, and the checks they share."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline.core.errors import UsageError


@dataclass(frozen=True)
class Entry:
    """One object or file: its path relative to the folder ("/"-separated), size and version
    (an S3 ETag, a local file's mtime in ns): enough to tell a changed input from the same one."""

    rel: str
    size: int
    version: str
    mtime_ns: int = 0  # when it was last written (an object's Last-Modified): what a re-run compares


class Stream(Protocol):
    """What `Folder.open` returns: a binary stream to read and close (a file, or an object's body)."""

    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...

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


def sort_key(rel: str) -> bytes:
    """Bytewise order of the UTF-8 names, the order S3 lists in, so both backends agree."""
    return rel.encode("utf-8", "surrogateescape")


class Folder(abc.ABC):
    """A folder of files addressed by relative paths. Implementations: LocalFolder, S3Folder."""

    url: str  # for display and for manifests/reports: never a secret
    local_path: Path | None  # the directory for a local folder, None for object storage

    @abc.abstractmethod
    def list(self) -> list[Entry]:
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
    def write(self, rel: str, data: bytes) -> None:
        """Replace ``rel`` with ``data`` atomically: a reader sees the old or the new bytes."""

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
