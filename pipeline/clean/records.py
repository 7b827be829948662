"""The vocabulary every stage shares: statuses, quarantine reasons, and the per-file result.

`FileResult` is what processing one input file produces (in a worker process). It is plain
data, serialisable to one JSON line, so results can be journaled for resume and sent between
processes cheaply. Decisions that need every file (duplicates, caption pairs, label conflicts)
are made later, on these results, and end as a `status` in the manifest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

KEPT = "kept"
DUPLICATE = "duplicate"
QUARANTINED = "quarantined"
STATUSES = (KEPT, DUPLICATE, QUARANTINED)

KIND_IMAGE = "image"
KIND_TEXT = "text"
KIND_OTHER = "other"

# The fixed reason vocabulary (documented in schemas/manifest_row.schema.json).
REASONS = {
    "zero_bytes": "the file is empty",
    "truncated": "the file ends before its data does",
    "corrupt": "the data is damaged (bad structure or damaged compressed data)",
    "unsupported_format": "not an image or text format pipe handles (archives, OS junk, unknown binaries, "
    "an image format without a decoder, a file named like an image that is not one)",
    "decompression_bomb": "more pixels (or decompressed metadata) than --max-pixels allows, judged from the header",
    "too_small": "smaller than --min-size on its short side",
    "undecodable_text": "no encoding decodes the bytes strictly",
    "binary_content": "text-like file whose bytes are binary (NUL bytes, control characters)",
    "empty_text": "nothing left after normalisation",
    "garbled_text": "mojibake or replacement characters that cannot be repaired with certainty",
    "exact_duplicate": "same normalized content as the kept copy (duplicate_of)",
    "near_duplicate": "perceptually the same as the kept copy (duplicate_of)",
    "label_conflict": "copies of the same content carry different labels",
    "unreadable": "the file could not be read (permissions, I/O error, broken link, decoder crash)",
    "outside_root": "a symbolic link that points outside the input folder; never followed",
    "pair_rejected": "the other half of an image+caption pair was rejected",
    "missing_label": "--labels names no label for this file",
    "timeout": "processing took longer than --file-timeout seconds (a pathological or hostile file); its worker was stopped",
}


@dataclass
class FileResult:
    """What processing one input file found. One JSON line in the journal."""

    source: str  # POSIX path relative to INPUT
    key: str  # sample key; an image and its caption share it
    kind: str  # image | text | other
    label: str | None = None
    bytes: int = 0
    sha256: str = ""
    mtime_ns: int = 0
    ctime_ns: int = 0  # changes with any write, even one that puts the old mtime back (resume compares both)
    reason: str | None = None  # per-file quarantine reason, None when the file passed
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

    def to_json(self) -> str:
        # the fields are flat (notes: a list of str), so no deep copy (dataclasses.asdict: 5x slower)
        return json.dumps(vars(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> "FileResult":
        return cls(**json.loads(line))


@dataclass(frozen=True)
class Decision:
    """The stage-level verdict on a file that passed its own checks."""

    status: str
    reason: str | None = None
    duplicate_of: str | None = None
    detail: str = ""
