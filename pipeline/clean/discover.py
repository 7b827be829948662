"""Find every input file: recursive, sorted, classified by content, never leaving the root.

Every path under INPUT becomes exactly one `Candidate`; nothing is skipped silently. Problems
found while walking (a link pointing outside the root, a broken link, a FIFO) travel with the
candidate as a `problem` and end as a quarantine row, so manifest rows equal files discovered.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from pipeline.clean.keys import assign_keys
from pipeline.formats.vocabulary import Kind, Reason
from pipeline.media.sniff import HEAD_BYTES, sniff


@dataclass(slots=True)  # no __dict__: the driver of a ten-million-file run holds every one (~100 B less each)
class Candidate:
    source: str  # POSIX path relative to the input root (the link's own path for a link)
    path: str  # absolute path to read
    kind: Kind  # from the content
    fmt: str  # the format the magic bytes name
    label: str | None = None
    key: str = ""
    problem: Reason | None = None  # a reason decided while walking (OUTSIDE_ROOT, UNREADABLE, ...)
    detail: str = ""
    size: int | None = None  # bytes, when the walk saw it (a local regular file): how long it may take


def display_path(rel: str) -> str:
    """A relative path as valid UTF-8: bytes that are not UTF-8 in a file name become ``\\xNN``."""
    try:
        rel.encode("utf-8")
        return rel
    except UnicodeEncodeError:
        return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _read_head(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(HEAD_BYTES + 512)


def _classify(rel: str, abspath: str, root_real: str, link: bool = True) -> Candidate:
    """``link``: False when the walk knows the entry is no symbolic link. Every folder walked
    below the root is a real one (links to folders are rows, never walked), so such a file's
    real path is the root's followed by its relative path, without a realpath per file (an
    lstat per component of its path: the most of discovery's system calls)."""
    name = rel.rsplit("/", 1)[-1]
    try:
        real = os.path.realpath(abspath) if link else os.path.join(root_real, rel)
        if link and os.path.islink(abspath) and not _within(real, root_real):
            return Candidate(rel, abspath, Kind.OTHER, "link", problem=Reason.OUTSIDE_ROOT,
                             detail=f"symbolic link to {os.readlink(abspath)} leaves the input folder")
        st = os.stat(abspath)
        if not stat.S_ISREG(st.st_mode):
            return Candidate(rel, abspath, Kind.OTHER, "special file", problem=Reason.UNSUPPORTED_FORMAT,
                             detail="not a regular file (FIFO, socket or device)")
        head = _read_head(abspath)
    except FileNotFoundError:
        return Candidate(rel, abspath, Kind.OTHER, "link", problem=Reason.UNREADABLE, detail="broken symbolic link")
    except OSError as e:
        return Candidate(rel, abspath, Kind.OTHER, "?", problem=Reason.UNREADABLE, detail=f"{type(e).__name__}: {e.strerror or e}")
    kind, fmt = sniff(head, name)
    if kind == Kind.TEXT and _looks_binary(head):
        fmt = _pillow_format(real) or fmt  # one of the many formats Pillow knows by content (FLI, BLP, SGI...)
        kind = Kind.IMAGE if fmt != "text?" else kind
    return Candidate(rel, real, kind, fmt, size=st.st_size)


def _looks_binary(head: bytes) -> bool:
    controls = sum(b < 9 or 13 < b < 32 for b in head)
    return b"\0" in head or controls > len(head) // 10


def _pillow_format(path: str) -> str | None:
    """The format Pillow identifies from the file's header (no pixels decoded), else None."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DecompressionBombWarning: the worker judges size
            with Image.open(path) as im:
                return im.format
    except Image.DecompressionBombError:
        return "image over Pillow's pixel limit"  # an image all the same: the worker judges it
    except Exception:  # noqa: BLE001 - any failure means "not an image Pillow knows"
        return None


def _walk(root: str, root_real: str, rel: str):
    """Yield (relative path, absolute path, problem, link) of every non-directory entry and of
    every link to a folder; ``problem`` is (reason, detail) when the walk itself decided one,
    ``link`` False for an entry known to be no symbolic link.

    A link to a folder is never walked: one inside the root points at a folder that is read
    under its own name (its files keep their own folder's label, and are listed once), one
    outside the root must not be read at all. Either way the link is one row of its own."""
    here = os.path.join(root, rel) if rel else root
    try:
        entries = sorted(os.scandir(here), key=lambda e: e.name)
    except OSError as e:
        yield rel, here, (Reason.UNREADABLE, f"directory not readable: {e.strerror or e}"), True
        return
    for entry in entries:
        child = f"{rel}/{entry.name}" if rel else entry.name
        try:
            is_dir = entry.is_dir(follow_symlinks=True)
        except OSError:
            is_dir = False
        if is_dir and entry.is_symlink():
            real = os.path.realpath(entry.path)
            inside = os.path.relpath(real, root_real).replace(os.sep, "/") if _within(real, root_real) else None
            yield child, entry.path, None if inside is None else (
                Reason.UNSUPPORTED_FORMAT, f"a link to the folder {display_path(inside) if inside != '.' else 'INPUT itself'}, "
                                      "whose files are read there, under their own folder's label"), True
        elif is_dir and _metadata_folder(entry.name):
            yield child, entry.path, (Reason.UNSUPPORTED_FORMAT, hidden_folder_detail(_count_files(entry.path))), True
        elif is_dir:
            yield from _walk(root, root_real, child)
        else:
            yield child, entry.path, None, _is_link(entry)


def _is_link(entry: os.DirEntry) -> bool:
    try:
        return entry.is_symlink()
    except OSError:
        return True  # not known: treated as a link, which is always safe


def _metadata_folder(name: str) -> bool:
    """Hidden folders (".git", ".ipynb_checkpoints", ".cache") and macOS archive leftovers
    ("__MACOSX"): read as classes, their copies of real files would become label conflicts."""
    return name.startswith(".") or name == "__MACOSX"


def _count_files(path: str) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def hidden_folder_detail(n: int) -> str:
    """The detail of a hidden or tool folder's row (a local folder or an object-storage prefix)."""
    files = f"{n} file" if n == 1 else f"{n} files"
    return (f"a hidden or tool folder ({files} inside), not read: .git, .ipynb_checkpoints, __MACOSX and the like "
            "hold copies and metadata, not samples of a class")


def discover(root: Path, labels: dict[str, str] | None = None, exclude: set[str] | None = None) -> list[Candidate]:
    """Every file under ``root``, sorted by relative path, with kinds, labels and keys assigned.

    Labels come from ``labels`` (relative path -> label) when given, else from the first folder
    of the path (``root/<label>/...``); files directly in the root have none.
    """
    root_s = os.path.abspath(root)
    root_real = os.path.realpath(root_s)
    out: list[Candidate] = []
    for rel, abspath, problem, link in _walk(root_s, root_real, ""):
        if exclude and rel in exclude:
            continue
        if problem:
            out.append(Candidate(display_path(rel) or ".", abspath, Kind.OTHER, "directory", problem=problem[0], detail=problem[1]))
            continue
        cand = _classify(rel, abspath, root_real, link)
        cand.source = display_path(rel)
        out.append(cand)
    return labelled(out, labels)


def labelled(out: list[Candidate], labels: dict[str, str] | None) -> list[Candidate]:
    """Sorted by source, with labels (from ``labels``, else the first folder) and keys assigned."""
    out.sort(key=lambda c: c.source)
    for c in out:
        if labels is not None:
            c.label = labels.get(c.source)
        elif "/" in c.source:
            c.label = c.source.split("/", 1)[0]
    assign_keys(out)
    return out
