"""The words every stage shares: a file's status, its kind and its quarantine reason.

They are string-valued enums: each member *is* its string (``Status.KEPT == "kept"``), so the
manifest, report.json, the journal and folder names such as ``quarantine/<reason>/`` hold the
same bytes as plain strings would, and a value read back from disk (a plain ``str``) compares,
hashes and sorts like the member. The JSON Schema of a manifest row
(``schemas/manifest_row.schema.json``) lists the same words; a test keeps the two in step.
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A string-valued enum member that prints and formats as its plain value (it compares and
    hashes as it already, being a ``str``).

    Without these, ``str(Status.KEPT)`` and f-strings give ``"Status.KEPT"`` (Python 3.11+).
    """

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


class Status(Word):
    """How a file ended: every input file has exactly one."""

    KEPT = "kept"
    DUPLICATE = "duplicate"
    QUARANTINED = "quarantined"


class Kind(Word):
    """What a file's content is, from its bytes (not its name)."""

    IMAGE = "image"
    TEXT = "text"
    OTHER = "other"  # a known non-image, non-text format, or something unreadable


class Reason(Word):
    """Why a file was not kept; ``description`` is what it means to a user."""

    description: str

    def __new__(cls, value: str, description: str = "") -> Reason:  # Reason("corrupt") looks a member up
        member = str.__new__(cls, value)
        member._value_ = value
        member.description = description
        return member

    ZERO_BYTES = "zero_bytes", "the file is empty"
    TRUNCATED = "truncated", "the file ends before its data does"
    CORRUPT = "corrupt", "the data is damaged (bad structure or damaged compressed data)"
    UNSUPPORTED_FORMAT = ("unsupported_format", "not an image or text format pipe handles (archives, OS junk, "
                          "unknown binaries, an image format without a decoder, a file named like an image that is not one)")
    DECOMPRESSION_BOMB = ("decompression_bomb",
                          "more pixels (or decompressed metadata) than --max-pixels allows, judged from the header")
    TOO_SMALL = "too_small", "smaller than --min-size on its short side"
    BLANK_IMAGE = ("blank_image", "the cleaned image would show (almost) nothing: one flat colour, whatever the "
                   "background under its transparency")
    TOO_LARGE = ("too_large", "a text file (or a labels-file caption) larger than --max-text-bytes, judged from its "
                 "size before reading it")
    UNDECODABLE_TEXT = "undecodable_text", "no encoding decodes the bytes strictly"
    BINARY_CONTENT = "binary_content", "text-like file whose bytes are binary (NUL bytes, control characters)"
    EMPTY_TEXT = "empty_text", "nothing left after normalisation"
    GARBLED_TEXT = "garbled_text", "mojibake or replacement characters that cannot be repaired with certainty"
    EXACT_DUPLICATE = "exact_duplicate", "same normalized content as the kept copy (duplicate_of)"
    NEAR_DUPLICATE = "near_duplicate", "perceptually the same as the kept copy (duplicate_of)"
    LABEL_CONFLICT = "label_conflict", "copies of the same content carry different labels"
    UNREADABLE = "unreadable", "the file could not be read (permissions, I/O error, broken link, decoder crash)"
    OUTSIDE_ROOT = "outside_root", "a symbolic link that points outside the input folder; never followed"
    PAIR_REJECTED = "pair_rejected", "the other half of an image+caption pair was rejected"
    MISSING_LABEL = "missing_label", "--labels names no label for this file"
    TIMEOUT = ("timeout", "processing took longer than --file-timeout seconds (a pathological or hostile file); "
               "its worker was stopped")
