"""`Candidate`: one file as discovery found it, before a worker reads it (a row of the listing)."""

from __future__ import annotations

from dataclasses import dataclass

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
