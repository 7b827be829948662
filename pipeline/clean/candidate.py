"""`Candidate`: one file as discovery found it, before a worker reads it (a row of the listing)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.formats.labels import label_name
from pipeline.formats.vocabulary import Kind, Reason


@dataclass(slots=True)  # no __dict__: a part's worth are made at a time, and every one travels to a worker
class Candidate:
    source: str  # POSIX path relative to the input root (the link's own path for a link)
    path: str  # where its bytes are read in the INPUT folder (a link's target inside it)
    kind: Kind  # from the content
    fmt: str  # the format the magic bytes name
    label: str | None = None
    key: str = ""
    problem: Reason | None = None  # a reason decided while walking (OUTSIDE_ROOT, UNREADABLE, ...)
    detail: str = ""
    size: int | None = None  # bytes, when the walk saw it (a local regular file): how long it may take


def class_folder(source: str) -> str | None:
    """The folder whose name is a file's label when no labels file says (its first folder),
    or None: a file in the root, or a first folder named "", "." or ".." (an object key is any text)."""
    folder = source.split("/", 1)[0] if "/" in source else None
    return None if folder in (None, "", ".", "..") else folder


def label_of(source: str, labels: dict[str, str] | None = None) -> str | None:
    """A file's label: the labels file's (``labels``, by source), else its class folder's name
    (NFC: a macOS folder name is NFD). The listing codes the same labels (`ListingWriter`); a
    labels file's label given for either half of a caption pair is then the pair's."""
    if labels is not None:
        return labels.get(source)
    folder = class_folder(source)
    return None if folder is None else label_name(folder)
