"""Sample columns kept on disk, not on the heap: what flat memory from 10k to 1M samples needs.

`pipe shard` needs every sample's key, `.json` member, file paths, mtimes and pixel sums only
twice: once when a shard of the plan takes its samples' values (`plan.entry`), once when the
pixel sums are added up. Holding them (~300 bytes a sample) made the peak grow with the
dataset. Instead each column is appended, a part at a time as the manifest is read, to an
unnamed file (gone when the process ends, however it ends) and read back memory-mapped: Arrow
string arrays and numpy arrays over the mapped bytes, the same values. The pages a shard's
samples touch are dropped from the process after each shard (`release`: they stay in the page
cache), so what is resident is one shard's worth, whatever the number of samples.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

_OFFSETS, _DATA = "offsets", "data"


class Spill:
    """Columns written a part at a time (`strings`, `numbers`), then mapped back (`finish`)."""

    def __init__(self, where: Path | None = None):
        self._where = str(where) if where is not None and where.is_dir() else None
        self._files: dict[str, Any] = {}
        self._valid: dict[str, list[np.ndarray]] = {}
        self._ends: dict[str, int] = {}  # bytes of a string column's data written so far
        self._numbers: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        self._text: dict[str, bool] = {}  # string column (else binary)?
        self._maps: dict[str, list[mmap.mmap]] = {}  # column -> its mappings

    def _file(self, name: str):
        f = self._files.get(name)
        if f is None:
            f = self._files[name] = tempfile.TemporaryFile(dir=self._where, prefix=".pipe-shard-")
        return f

    def strings(self, name: str, arr) -> None:
        """Append an Arrow string or binary array (nulls kept)."""
        import pyarrow as pa

        from pipeline.shard.plan import values

        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        self._text.setdefault(name, pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type))
        at, data = values(arr)
        end = self._ends.get(name, 0)
        if name not in self._ends:
            self._file(name + _OFFSETS).write(np.zeros(1, dtype=np.int64).tobytes())
        self._file(name + _OFFSETS).write((at[1:] + end).tobytes())
        self._file(name + _DATA).write(data.tobytes())
        self._ends[name] = end + len(data)
        valid = np.ones(len(arr), dtype=bool) if not arr.null_count else arr.is_valid().to_numpy(zero_copy_only=False)
        self._valid.setdefault(name, []).append(np.asarray(valid, dtype=bool))

    def numbers(self, name: str, a: np.ndarray) -> None:
        """Append the rows of a numpy array (same dtype and row shape every time)."""
        self._numbers.setdefault(name, (a.dtype, a.shape[1:]))
        self._file(name).write(np.ascontiguousarray(a).tobytes())

    def finish(self) -> dict[str, Any]:
        """Every column, mapped: strings as Arrow large_string (``binary``: large_binary) arrays,
        numbers as read-only numpy arrays."""
        import pyarrow as pa

        out: dict[str, Any] = {}
        for name, parts in self._valid.items():
            valid = np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
            n = len(valid)
            bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
            offsets = self._map(name, name + _OFFSETS)
            kind = pa.large_string() if self._text[name] else pa.large_binary()
            out[name] = pa.Array.from_buffers(kind, n, [bitmap, offsets, self._map(name, name + _DATA)],
                                              null_count=int(n - np.count_nonzero(valid)))
        for name, (dtype, row) in self._numbers.items():
            buf = self._map(name, name)
            out[name] = np.frombuffer(buf, dtype=dtype).reshape(-1, *row)
        for f in self._files.values():
            f.close()  # (a mapping keeps its file)
        self._files.clear()
        return out

    def _map(self, column: str, name: str):
        import pyarrow as pa

        f = self._files[name]
        f.flush()
        size = os.fstat(f.fileno()).st_size
        if not size:
            return pa.py_buffer(b"")
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        self._maps.setdefault(column, []).append(m)
        return pa.py_buffer(m)

    def release(self, column: str | None = None) -> None:
        """Drop the mapped pages (of one column, or all) from this process (re-read from the page
        cache when touched again)."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        for name, maps in self._maps.items():
            if column is None or name == column:
                for m in maps:
                    m.madvise(mmap.MADV_DONTNEED)
