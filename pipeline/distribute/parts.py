"""Parts: the unit of distributed work. Pure planning and the part results files; no Ray here.

A part is a contiguous range [begin, end) of the sorted candidate listing. Its name holds its
position and a fingerprint of what it covers (each candidate's source, key, kind, format and
walking problem, and the settings that change outputs), so a re-run with the same input and
settings finds the parts a killed run finished, and a part whose files changed is redone.
A part's per-file outputs are written first and its results file (an Arrow IPC file, one row
per file, in order) last and atomically: the file's presence means the part is complete, and a
retried or duplicated part rewrites the same bytes under the same name. Columns, not JSON lines,
so the driver of a run of millions reads only the columns `decide` needs (`read_table`) and the
rest part by part when it writes the manifest. Results files of another format (the JSON lines of
an earlier pipe) have another name and are never read: their parts are redone.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.clean.discover import Candidate
from pipeline.clean.records import FileResult
from pipeline.core.files import STATE_DIR, atomic_write_bytes
from pipeline.storage.folder import Folder

PARTS_DIR = f"{STATE_DIR}/parts"
PART_FILES = 1000  # files per part: a minute or so of one core on photos; what a killed run redoes at most
SUFFIX = ".arrow"
FORMAT = {b"pipe.part_results": b"2"}  # the results file's format (1: JSON lines, named .jsonl)


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


def fingerprint(candidates: Sequence[Candidate], settings: dict) -> str:
    """What a part's results depend on besides the files' bytes (those are checked on reuse)."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for c in candidates:
        h.update(json.dumps([c.source, c.key, str(c.kind), c.fmt, c.problem and str(c.problem), c.detail]).encode("utf-8",
                                                                                                                "surrogateescape"))
        h.update(b"\n")
    return h.hexdigest()


def plan(candidates: Sequence[Candidate], settings: dict, max_files: int = PART_FILES) -> list[Part]:
    """The parts of a listing: deterministic for the same candidates, settings and part size."""
    return [Part(i, b, e, fingerprint(candidates[b:e], settings)) for i, (b, e) in enumerate(cut(len(candidates), max_files))]


def write_results(clean_dir: Path | Folder, part: Part, results: Sequence[FileResult]) -> None:
    """The part's results file, atomically: written only after every output of the part. The
    same results give the same bytes (no time stamps in an Arrow IPC file). ``clean_dir``: a
    local (or shared) CLEAN_DIR, or a Folder (one PUT on object storage)."""
    import pyarrow as pa

    from pipeline.clean.columns import to_table

    table = to_table(results).replace_schema_metadata(FORMAT)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    data = sink.getvalue().to_pybytes()
    if isinstance(clean_dir, Folder):
        clean_dir.write(f"{PARTS_DIR}/{part.name}", data)
    else:
        atomic_write_bytes(clean_dir / PARTS_DIR / part.name, data, fsync=True)


def read_table(clean_dir: Path | Folder, part: Part, columns: Sequence[str] | None = None):
    """The part's results as an Arrow table (only ``columns``, when given), or None when it has
    no complete results file of this format and schema."""
    import pyarrow as pa

    from pipeline.clean.columns import RESULTS

    try:
        if isinstance(clean_dir, Folder):
            source = pa.BufferReader(clean_dir.read(f"{PARTS_DIR}/{part.name}"))
        else:
            source = pa.OSFile(str(clean_dir / PARTS_DIR / part.name))
        with source as f:
            fields = sorted(RESULTS.get_field_index(c) for c in columns) if columns is not None else range(len(RESULTS))
            reader = pa.ipc.open_file(f, options=pa.ipc.IpcReadOptions(included_fields=list(fields)))
            if reader.schema.metadata != FORMAT or not reader.schema.equals(pa.schema([RESULTS.field(i) for i in fields])):
                return None
            table = reader.read_all()
    except (OSError, pa.ArrowException):
        return None
    return table if table.num_rows == len(part) else None


def read_results(clean_dir: Path | Folder, part: Part) -> list[FileResult] | None:
    """The part's results, or None when it has no complete, readable results file."""
    from pipeline.clean.columns import iter_results

    table = read_table(clean_dir, part)
    return None if table is None else list(iter_results(table))


def sweep(clean_dir: Path | Folder, parts: Sequence[Part]) -> None:
    """Remove results files of parts that are not in this plan (an earlier run's other listing)."""
    keep = {p.name for p in parts}
    if isinstance(clean_dir, Folder):
        results = clean_dir.child(PARTS_DIR)
        for entry in results.list():
            if entry.rel not in keep:
                results.delete(entry.rel)
        return
    folder = clean_dir / PARTS_DIR
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for name in names:
        if name not in keep:
            (folder / name).unlink(missing_ok=True)
