"""Find every input file: recursive, sorted, classified by content, never leaving the root.

Every path under INPUT becomes exactly one `Candidate`; nothing is skipped silently. Problems
found while walking (a link pointing outside the root, a broken link, a FIFO: the folder's own
rules, `pipeline.storage.Folder.walk`) travel with the candidate as a `problem` and end as a
quarantine row, so manifest rows equal files discovered.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.clean.candidate import Candidate, label_of
from pipeline.clean.keys import slug
from pipeline.formats.vocabulary import Kind, Reason
from pipeline.media.sniff import HEAD_BYTES, sniff
from pipeline.storage import Entry, Folder, Location, open_folder
from pipeline.storage import folder as storage

if TYPE_CHECKING:
    from pipeline.clean.listing import Listing

__all__ = ["Candidate", "discover", "display_path", "metadata_folder"]


def display_path(rel: str) -> str:
    """A relative path as valid UTF-8: bytes that are not UTF-8 in a file name become ``\\xNN``."""
    try:
        rel.encode("utf-8")
        return rel
    except UnicodeEncodeError:
        return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _looks_binary(head: bytes) -> bool:
    controls = sum(b < 9 or 13 < b < 32 for b in head)
    return b"\0" in head or controls > len(head) // 10


def _pillow_format(folder: Folder, rel: str) -> str | None:
    """The format Pillow identifies from the file's header (no pixels decoded), else None."""
    import io
    import warnings

    from PIL import Image

    try:
        with folder.open(rel) as f:
            source = f if f.seekable() else io.BytesIO(f.read())  # Pillow seeks in the header
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # DecompressionBombWarning: the worker judges size
                with Image.open(source) as im:
                    return im.format
    except Image.DecompressionBombError:
        return "image over Pillow's pixel limit"  # an image all the same: the worker judges it
    except Exception:  # noqa: BLE001 - any failure means "not an image Pillow knows"
        return None


def metadata_folder(name: str) -> bool:
    """Hidden folders (".git", ".ipynb_checkpoints", ".cache") and macOS archive leftovers
    ("__MACOSX"): read as classes, their copies of real files would become label conflicts."""
    return name.startswith(".") or name == "__MACOSX"


def hidden_folder_detail(n: int) -> str:
    """The detail of a hidden or tool folder's row (a local folder or an object-storage prefix)."""
    files = f"{n} file" if n == 1 else f"{n} files"
    return (f"a hidden or tool folder ({files} inside), not read: .git, .ipynb_checkpoints, __MACOSX and the like "
            "hold copies and metadata, not samples of a class")


def discover(root: Location | Folder, labels: dict[str, str] | None = None, exclude: set[str] | None = None,
             where: Path | None = None, first: Callable[[list[Candidate]], None] | None = None,
             first_files: int = 1) -> Listing:
    """Every file under ``root`` (a folder, local or in object storage), sorted by relative path,
    with kinds, labels and keys assigned, as a `Listing` on the disk at ``where`` (a local folder;
    None: the system's temporary folder). What the folder's rules make of an entry that is no
    readable file (a link out of a local root, a hidden folder, ...: `Folder.walk`) is a
    candidate with a problem, so manifest rows equal files discovered.

    Labels come from ``labels`` (relative path -> label) when given, else from the first folder
    of the path (``root/<label>/...``, NFC: `pipeline.formats.labels`); files directly in the
    root have none. With ``labels``, a label given for either half of an image and its caption
    is the pair's.

    The walk's entries are classified a batch at a time (their heads read together) and handed
    to the listing, so no run holds a candidate per file.

    ``first`` is given the first ``first_files`` files' candidates as soon as the walk is done,
    before the listing is made (importing pyarrow and numpy for it, keying every file: ~0.15 s of
    a `pipe clean`'s start-up), so that its workers can start on them meanwhile
    (`Executor.ahead`). Their keys are their slugs: the listing's, unless another file's slug is
    the same (then the listing's candidate differs, and the work started from it on is dropped).
    """
    folder = open_folder(root)
    entries: list[Entry | None] = list(folder.walk(skip=metadata_folder))
    if first is not None:
        _hand_first(folder, entries, labels, exclude, first, first_files)
    from pipeline.clean.listing import BATCH, ListingWriter

    writer = ListingWriter(where, labels)
    for begin in range(0, len(entries), BATCH):
        batch = [e for e in entries[begin:begin + BATCH] if e is not None and _wanted(e, exclude)]
        entries[begin:begin + BATCH] = [None] * min(BATCH, len(entries) - begin)  # (each entry freed once handed over)
        writer.extend(_candidates(folder, batch))
    return writer.finish()


def _wanted(e: Entry, exclude: set[str] | None) -> bool:
    return not (exclude and e.rel in exclude)


def _candidates(folder: Folder, batch: list[Entry]) -> list[Candidate]:
    """Each entry as a candidate: the files' heads read in one call, then sniffed."""
    heads = iter(folder.read_heads([e.target for e in batch if not e.note], HEAD_BYTES + 512))
    return [_problem(e) if e.note else _classify(folder, e, next(heads)) for e in batch]


def _hand_first(folder: Folder, entries: list[Entry | None], labels: dict[str, str] | None,
                exclude: set[str] | None, first: Callable[[list[Candidate]], None], n: int) -> None:
    """``first`` given the first ``n`` entries' candidates, labelled and keyed as the listing most
    likely has them (see `discover`); nothing when every entry is excluded."""
    some = list(itertools.islice((e for e in entries if e is not None and _wanted(e, exclude)), n))
    if not some:
        return
    cands = _candidates(folder, some)
    for c in cands:
        c.label, c.key = label_of(c.source, labels), slug(c.source)
    first(cands)


def _problem(e: Entry) -> Candidate:
    """An entry that is no readable file, as a candidate with its reason."""
    source = display_path(e.rel) or "."
    fmt, reason, detail = {
        storage.UNREADABLE_FOLDER: ("directory", Reason.UNREADABLE, f"directory not readable: {e.detail}"),
        storage.FOLDER_LINK: ("directory", Reason.UNSUPPORTED_FORMAT,
                              f"a link to the folder {display_path(e.detail) if e.detail != '.' else 'INPUT itself'}, "
                              "whose files are read there, under their own folder's label"),
        storage.SKIPPED_FOLDER: ("directory", Reason.UNSUPPORTED_FORMAT, hidden_folder_detail(e.files)),
        storage.OUTSIDE_ROOT: ("link", Reason.OUTSIDE_ROOT, f"symbolic link to {e.detail} leaves the input folder"),
        storage.BROKEN_LINK: ("link", Reason.UNREADABLE, "broken symbolic link"),
        storage.SPECIAL: ("special file", Reason.UNSUPPORTED_FORMAT, "not a regular file (FIFO, socket or device)"),
    }.get(e.note, ("?", Reason.UNREADABLE, e.detail))
    return Candidate(source, e.rel, Kind.OTHER, fmt, problem=reason, detail=detail)


def _classify(folder: Folder, e: Entry, head: bytes | OSError) -> Candidate:
    """A file by its first bytes (magic bytes first; Pillow asked about a text that looks binary)."""
    source = display_path(e.rel)
    if isinstance(head, OSError):
        why = "gone since it was listed" if isinstance(head, FileNotFoundError) else (head.strerror or head)
        return Candidate(source, e.target, Kind.OTHER, "?", problem=Reason.UNREADABLE, detail=f"{type(head).__name__}: {why}")
    kind, fmt = sniff(head, e.rel.rsplit("/", 1)[-1])
    if kind == Kind.TEXT and _looks_binary(head):
        fmt = _pillow_format(folder, e.target) or fmt  # one of the many formats Pillow knows by content (FLI, BLP, SGI...)
        kind = Kind.IMAGE if fmt != "text?" else kind
    return Candidate(source, e.target, kind, fmt, size=e.size)
