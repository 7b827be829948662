"""`manifest.parquet`: one `ManifestRow` per input file, written incrementally (row groups), atomically.

The columns and their Arrow types come from `ManifestRow`'s fields; the JSON Schema of a row is
``schemas/manifest_row.schema.json`` and a test keeps the two in step.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.formats.manifest_row import ManifestRow


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

# Arrow type of each field's Python type (an optional field is a nullable column, as they all are)
_ARROW = {"str": pa.string(), "Kind": pa.string(), "Status": pa.string(), "Reason": pa.string(),
          "int": pa.int64(), "float": pa.float64(), "list[int]": pa.list_(pa.int64())}
COLUMNS = pa.schema([(f.name, _ARROW[str(f.type).removesuffix(" | None")]) for f in dataclasses.fields(ManifestRow)])
ROW_GROUP = 10_000


class ManifestWriter:
    """Collects rows and flushes them as row groups to a temporary file; `close` renames it."""

    def __init__(self, path: Path, metadata: dict[bytes, bytes] | None = None):
        """``metadata``: the file's key-value metadata (what pipe clean says of its rows, such as
        `pipeline.formats.pixels.MANIFEST_KEY`)."""
        self.path = path
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        schema = COLUMNS.with_metadata(metadata) if metadata else COLUMNS
        self._writer = pq.ParquetWriter(self.tmp, schema, compression="zstd")
        self._rows: list[dict] = []
        self._tables: list[pa.Table] = []  # rows given as tables (`add_table`), not yet a whole row group
        self.count = 0

    def add(self, rec: ManifestRow) -> None:
        self._rows.append(rec.as_dict())
        self.count += 1
        if len(self._rows) >= ROW_GROUP:
            self._flush()

    def add_table(self, table: pa.Table) -> None:
        """Rows as a table of `COLUMNS` (a million-file manifest made without a `ManifestRow` per
        file): the same row groups, so the same bytes, as the rows added one by one."""
        if self._rows:
            raise AssertionError("rows and tables are not mixed in one manifest")
        self._tables.append(table)
        self.count += table.num_rows
        while sum(t.num_rows for t in self._tables) >= ROW_GROUP:
            self._flush_tables(ROW_GROUP)

    def _flush_tables(self, rows: int) -> None:
        pending = pa.concat_tables(self._tables)
        self._writer.write_table(pending.slice(0, rows).combine_chunks())
        rest = pending.slice(rows)
        self._tables = [rest] if rest.num_rows else []

    def _flush(self) -> None:
        if self._tables:
            self._flush_tables(sum(t.num_rows for t in self._tables))
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
