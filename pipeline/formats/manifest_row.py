"""`ManifestRow`: one row of ``manifest.parquet``, the file `pipe clean` writes and `pipe shard`
and `pipe check` read.

The row's fields are the manifest's columns, in order; the Arrow schema
(`pipeline.formats.manifest.COLUMNS`) is made from them, and a test keeps them in step with
``schemas/manifest_row.schema.json``. This module does not import pyarrow, so code that only
names the columns (pipe check's checks, the clean report) starts without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.formats.vocabulary import Kind, Reason, Status, Word


@dataclass  # not frozen: a frozen __init__ costs 3x as much, seconds on a million-file clean
class ManifestRow:
    """One input file's line in the manifest (field order is the column order)."""

    source: str  # POSIX path relative to INPUT
    key: str  # sample key (shared by an image and its caption)
    kind: Kind
    label: str | None
    status: Status
    reason: Reason | None  # null when kept
    detail: str  # human-readable: the error message, what was repaired or noted
    duplicate_of: str | None  # source of the kept copy
    output: str  # path relative to CLEAN_DIR; empty unless kept
    caption: str  # a kept image's caption from the labels file (path relative to CLEAN_DIR), else empty
    bytes: int
    sha256: str  # of the input bytes
    width: int | None  # as found in the input (headers can claim absurd sizes)
    height: int | None
    encoding: str | None
    encoding_confidence: float | None
    content_hash: str | None  # exact-duplicate key: decoded pixels / normalized text
    phash: str | None  # 64-bit perceptual hash of an image, 16 hex digits
    # A kept image's output as a reader decodes it (`pipeline.formats.pixels`): pipe shard's
    # mean/std and size check come from these. Manifests of an older pipe lack the columns
    # (they read as None, and pipe shard decodes the image instead).
    output_width: int | None = None
    output_height: int | None = None
    pixel_sums: list[int] | None = None  # per channel (R, G, B): sum of the 0-255 values
    pixel_squares: list[int] | None = None  # per channel: sum of the squared values

    def as_dict(self) -> dict[str, Any]:
        """Column name -> value, in column order (a copy, so the row and the dict stay apart)."""
        return dict(vars(self))  # the fields are flat: no deep copy (dataclasses.asdict: several times slower)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ManifestRow:
        """A row as Arrow reads it (``Table.to_pylist``). A column the file lacks reads as None, as
        ``dict.get`` did; a word outside the vocabulary (a hand-made or damaged manifest) stays the
        string it is, for the reader to judge (pipe shard names the key, pipe check the schema)."""
        get: Callable[[str], Any] = d.get  # a cell is Any until judged: a hand-made file may hold anything
        row = cls(*map(get, FIELDS))  # positional, in C: pipe shard reads a million rows
        for name, vocab in WORDS.items():
            setattr(row, name, _word(vocab, getattr(row, name)))
        return row


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ManifestRow))


class _ColumnNames:
    """Each column's name as an attribute (``NAMES.status == "status"``), made from `ManifestRow`'s
    fields: for code that reads the manifest as plain dicts or Arrow columns rather than
    `ManifestRow` objects (pipe check validates a million raw rows against the schema), so it
    still names columns through the row type, and a name that is no field fails at once
    instead of reading None."""

    def __init__(self, names: tuple[str, ...]):
        self.__dict__.update({name: name for name in names})

    def __getattr__(self, name: str) -> str:  # reached only for a name that is no column
        raise AttributeError(f"the manifest has no column {name!r}")


NAMES = _ColumnNames(FIELDS)

ADDED_LATER: tuple[str, ...] = (NAMES.output_width, NAMES.output_height, NAMES.pixel_sums, NAMES.pixel_squares)
"""Columns a manifest written by an older pipe clean lacks. Its readers take them as null: pipe
shard then decodes the images to measure them, pipe check judges the rest of the row."""

WORDS: dict[str, type[Word]] = {f.name: vocab for f in dataclasses.fields(ManifestRow) for vocab in (Kind, Status, Reason)
                                if str(f.type).removesuffix(" | None") == vocab.__name__}
"""The columns whose values are words of the vocabulary (kind, status, reason), from the field types."""


def _word(vocab: type[Word] | None, value: Any) -> Any:
    if vocab is None or value is None:
        return value
    try:
        return vocab(value)
    except ValueError:
        return value
