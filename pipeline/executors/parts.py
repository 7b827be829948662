"""Parts: the unit of a stage's work, and of resuming it. Pure planning and the parts' results
files (through a `Folder`); no executor here.

A part is a contiguous range [begin, end) of a stage's sorted items. Its name holds its position
and a fingerprint of what it covers (each item as the stage describes it, and the settings that
change its results), so a rerun with the same items and settings finds the parts an interrupted
run finished, and a part whose items changed is redone. A part's results file (an Arrow IPC
file, one row per item, in order) is written after everything else the part writes, atomically:
its presence means the part is complete, and a retried or duplicated part rewrites the same
bytes under the same name. Columns, not JSON lines, so a driver of millions of items reads only
the columns it needs (`read_table`) and the rest part by part.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.core.files import STATE_DIR
from pipeline.storage import Folder, Location, open_folder

PARTS_DIR = f"{STATE_DIR}/parts"
SUFFIX = ".arrow"


@dataclass(frozen=True)
class Part:
    index: int
    begin: int
    end: int
    fingerprint: str

    @property
    def name(self) -> str:
        """The part's results file name: position first, so a listing sorts in part order."""
        return f"{self.index:06d}.{self.fingerprint[:16]}{SUFFIX}"

    def __len__(self) -> int:
        return self.end - self.begin


def cut(n: int, max_files: int, sizes: Sequence[int] | None = None, max_bytes: int | None = None) -> list[tuple[int, int]]:
    """Contiguous [begin, end) ranges covering 0..n in order: at most ``max_files`` items each and,
    when ``sizes`` is given, at most ``max_bytes`` of them (a single larger item is a part alone)."""
    if max_files < 1:
        raise ValueError(f"max_files must be at least 1, got {max_files}")
    if sizes is not None and len(sizes) != n:
        raise ValueError("sizes must give one size per item")
    ranges, begin, used = [], 0, 0
    for i in range(n):
        size = sizes[i] if sizes is not None else 0
        full = i - begin >= max_files or (max_bytes is not None and used + size > max_bytes)
        if full and i > begin:
            ranges.append((begin, i))
            begin, used = i, 0
        used += size
    if begin < n:
        ranges.append((begin, n))
    return ranges


def fingerprint(items: Sequence[Any], settings: dict, describe: Callable[[Any], list]) -> str:
    """What a part's results depend on besides its items' bytes (those are checked on reuse)."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for item in items:
        h.update(json.dumps(describe(item)).encode("utf-8", "surrogateescape"))
        h.update(b"\n")
    return h.hexdigest()


def plan(items: Sequence[Any], settings: dict, max_items: int, describe: Callable[[Any], list]) -> list[Part]:
    """The parts of a listing: deterministic for the same items, settings and part size."""
    return [Part(i, b, e, fingerprint(items[b:e], settings, describe)) for i, (b, e) in enumerate(cut(len(items), max_items))]


def write_table(where: Location | Folder, part: Part, table: Any, fmt: dict[bytes, bytes]) -> None:
    """The part's results file, atomically (synced to a local disk), written after every other
    file of the part: the same results give the same bytes (no time stamps in an Arrow IPC file)."""
    import pyarrow as pa

    table = table.replace_schema_metadata(fmt)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    open_folder(where).write(f"{PARTS_DIR}/{part.name}", sink.getvalue().to_pybytes(), durable=True)


def read_table(where: Location | Folder, part: Part, schema: Any, fmt: dict[bytes, bytes],
               columns: Sequence[str] | None = None) -> Any:
    """The part's results as an Arrow table (only ``columns``, when given), or None when it has
    no complete results file of this format and schema."""
    table = read_file(where, part.name, schema, fmt, columns)
    return table if table is not None and table.num_rows == len(part) else None


def others(where: Location | Folder, parts: Sequence[Part]) -> list[str]:
    """The names of results files that are not this plan's (an earlier run's, of another listing)."""
    keep = {p.name for p in parts}
    return [e.rel for e in open_folder(where).child(PARTS_DIR).list() if e.rel.endswith(SUFFIX) and e.rel not in keep]


def read_file(where: Location | Folder, name: str, schema: Any, fmt: dict[bytes, bytes],
              columns: Sequence[str] | None = None) -> Any:
    """The results file ``name`` as an Arrow table (only ``columns``, when given), or None when
    it is no complete results file of this format and schema."""
    import pyarrow as pa

    try:
        source = pa.BufferReader(open_folder(where).read(f"{PARTS_DIR}/{name}"))
        fields = sorted(schema.get_field_index(c) for c in columns) if columns is not None else range(len(schema))
        reader = pa.ipc.open_file(source, options=pa.ipc.IpcReadOptions(included_fields=list(fields)))
        if reader.schema.metadata != fmt or not reader.schema.equals(pa.schema([schema.field(i) for i in fields])):
            return None
        return reader.read_all()
    except (OSError, pa.ArrowException):
        return None


def sweep(where: Location | Folder, parts: Sequence[Part]) -> None:
    """Remove results files of parts that are not in this plan (an earlier run's other listing)."""
    folder = open_folder(where)
    keep = {f"{PARTS_DIR}/{p.name}" for p in parts}
    folder.sweep(PARTS_DIR, keep)


def remove_all(where: Location | Folder) -> None:
    """Every results file gone (an output that is final needs none: nothing will resume it)."""
    open_folder(where).sweep(PARTS_DIR, set())
