"""What one input file became: its `FileResult` (found by a worker) and its `Decision` (by the stage).

`FileResult` is what processing one input file produces (in a worker process). It is plain
data, serialisable to one JSON line, so results can be journaled for resume and sent between
processes cheaply. Decisions that need every file (duplicates, caption pairs, label conflicts)
are made later, on these results, and end as a `status` in the manifest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pipeline.formats.manifest_row import ManifestRow
from pipeline.formats.vocabulary import Kind, Reason, Status


@dataclass
class FileResult:
    """What processing one input file found. One JSON line in the journal."""

    source: str  # POSIX path relative to INPUT
    key: str  # sample key; an image and its caption share it
    kind: Kind
    label: str | None = None
    bytes: int = 0
    sha256: str = ""
    mtime_ns: int = 0
    ctime_ns: int = 0  # changes with any write, even one that puts the old mtime back (resume compares both)
    reason: Reason | None = None  # per-file quarantine reason, None when the file passed
    detail: str = ""  # human-readable error message / what was done (notes)
    width: int | None = None  # as found in the input
    height: int | None = None
    encoding: str | None = None
    encoding_confidence: float | None = None
    content_hash: str | None = None  # exact-duplicate key: decoded pixels / normalized text
    phash: int | None = None  # 64-bit perceptual hash (images), for near duplicates
    minhash: str | None = None  # text LSH band keys, base64 of 16 x uint32 (pipeline.similarity.minhash), for near duplicates
    output: str = ""  # path relative to CLEAN_DIR of the cleaned file (written by the worker)
    output_bytes: int = 0
    notes: list[str] = field(default_factory=list)  # harmless oddities kept, repairs made
    # A caption given for an image in the --labels file's text column (normalised like a text
    # file), or why it was rejected. Set by the main process on every run, from the labels file.
    caption: str | None = None
    caption_reason: str | None = None
    # The output image as a reader decodes it (`pipeline.formats.pixels`), for pipe shard's
    # mean/std and size check without decoding every image again. None in a journal line of an
    # older pipe (such a line is redone, see `stage._reusable`) and for anything but a written image.
    output_width: int | None = None
    output_height: int | None = None
    pixel_sums: list[int] | None = None  # per channel (R, G, B): sum of the 0-255 values
    pixel_squares: list[int] | None = None  # per channel: sum of the squared values

    def to_json(self) -> str:
        # the fields are flat (notes: a list of str), so no deep copy (dataclasses.asdict: 5x slower)
        return json.dumps(vars(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> FileResult:
        """Raises ValueError (a journal line to redo) for a kind or reason outside the vocabulary."""
        r = cls(**json.loads(line))
        r.kind = Kind(r.kind)
        r.reason = None if r.reason is None else Reason(r.reason)
        return r


@dataclass(frozen=True)
class Decision:
    """The stage-level verdict on a file that passed its own checks."""

    status: Status
    reason: Reason | None = None
    duplicate_of: str | None = None
    detail: str = ""


def row(r: FileResult, d: Decision, caption: str = "") -> ManifestRow:
    """The manifest row one input file ends as: what the worker found, what the stage decided."""
    kept = d.status == Status.KEPT
    detail = "; ".join(x for x in [d.detail or r.detail, *r.notes] if x)
    return ManifestRow(
        source=r.source, key=r.key, kind=r.kind, label=r.label,
        status=d.status, reason=d.reason, detail=detail, duplicate_of=d.duplicate_of,
        output=r.output if kept else "", caption=caption if kept else "", bytes=r.bytes, sha256=r.sha256,
        width=r.width, height=r.height, encoding=r.encoding,
        encoding_confidence=r.encoding_confidence, content_hash=r.content_hash,
        phash=None if r.phash is None else f"{r.phash:016x}",
        **(_pixels(r) if kept else {}),
    )


def _pixels(r: FileResult) -> dict:
    """The output image's measurements (pipe shard's mean/std), for a kept row: they describe its output."""
    return {"output_width": r.output_width, "output_height": r.output_height,
            "pixel_sums": r.pixel_sums, "pixel_squares": r.pixel_squares}
