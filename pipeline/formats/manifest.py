"""`manifest.parquet`: one row per input file, written incrementally (row groups), atomically.

Columns are listed once here, with their Arrow types; the JSON Schema of a row is
``schemas/manifest_row.schema.json`` and a test keeps the two in step.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.clean.records import Decision, FileResult
from pipeline.formats.vocabulary import Status


class _NoPandas:
    """A meta-path finder that makes `import pandas` fail (used only around the probe below)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "pandas":
            raise ImportError("pandas is not needed to write the manifest")
        return None


def _skip_pandas_probe() -> None:
    """pyarrow's first conversion of a Python list imports pandas (0.5-1.5 s, more than the rest
    of a small `pipe clean`) only to ask whether the list is a pandas object. Let that probe find
    no pandas: pyarrow remembers the answer for conversions, and `to_pandas` still imports it."""
    if "pandas" in sys.modules:
        return
    sys.meta_path.insert(0, _NoPandas)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(_NoPandas)


_skip_pandas_probe()

COLUMNS = pa.schema([
    ("source", pa.string()),  # POSIX path relative to INPUT
    ("key", pa.string()),  # sample key (shared by an image and its caption)
    ("kind", pa.string()),  # image | text | other
    ("label", pa.string()),
    ("status", pa.string()),  # kept | duplicate | quarantined
    ("reason", pa.string()),  # null when kept
    ("detail", pa.string()),  # human-readable: the error message, what was repaired or noted
    ("duplicate_of", pa.string()),  # source of the kept copy
    ("output", pa.string()),  # path relative to CLEAN_DIR; empty unless kept
    ("caption", pa.string()),  # a kept image's caption from the labels file (path relative to CLEAN_DIR), else empty
    ("bytes", pa.int64()),
    ("sha256", pa.string()),  # of the input bytes
    ("width", pa.int64()),  # as found in the input (headers can claim absurd sizes)
    ("height", pa.int64()),
    ("encoding", pa.string()),
    ("encoding_confidence", pa.float64()),
    ("content_hash", pa.string()),  # exact-duplicate key: decoded pixels / normalized text
    ("phash", pa.string()),  # 64-bit perceptual hash of an image, 16 hex digits
])
ROW_GROUP = 10_000


def row(r: FileResult, d: Decision, caption: str = "") -> dict:
    kept = d.status == Status.KEPT
    detail = "; ".join(x for x in [d.detail or r.detail, *r.notes] if x)
    return {
        "source": r.source, "key": r.key, "kind": r.kind, "label": r.label,
        "status": d.status, "reason": d.reason, "detail": detail, "duplicate_of": d.duplicate_of,
        "output": r.output if kept else "", "caption": caption if kept else "", "bytes": r.bytes, "sha256": r.sha256,
        "width": r.width, "height": r.height, "encoding": r.encoding,
        "encoding_confidence": r.encoding_confidence, "content_hash": r.content_hash,
        "phash": None if r.phash is None else f"{r.phash:016x}",
    }


class ManifestWriter:
    """Collects rows and flushes them as row groups to a temporary file; `close` renames it."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self._writer = pq.ParquetWriter(self.tmp, COLUMNS, compression="zstd")
        self._rows: list[dict] = []
        self.count = 0

    def add(self, rec: dict) -> None:
        self._rows.append(rec)
        self.count += 1
        if len(self._rows) >= ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            self._writer.write_table(pa.Table.from_pylist(self._rows, schema=COLUMNS))
            self._rows = []

    def close(self) -> None:
        self._flush()
        self._writer.close()
        with open(self.tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(self.tmp, self.path)


def read(path: Path):
    """The manifest as a pandas DataFrame."""
    return pq.read_table(path).to_pandas()
