"""Results as columns: what the driver holds of every file between processing and the manifest.

A run of ten million files cannot hold a `FileResult` per file (~1.3 KB of Python objects), nor
its strings: results stay with their parts (each part's results file, `parts.py`) and the driver
keeps only what deciding across parts needs, as fixed-width NumPy arrays (`Columns`, ~33 bytes a
file): kind, reason, label code, the row of the first file with the same key (pairs an image
with its caption), the input's pixel area, an 8-byte digest of the content hash, the perceptual
hash and which of them a file has. Row order is path order (the listing is sorted), so "the
first path" is the smaller row.

Everything else is read back from the parts when it is needed (`Rows`: a row's part is known
from its index, parts being contiguous ranges): the full content hashes of the few files whose
digests say "equal" (two files are duplicates only when the full hashes agree), the sources a
duplicate names, the outputs near duplicates are confirmed on, and each part whole when the
manifest is written. Texts' MinHash band keys wait on the driver's disk (`Bands`), a band
read at a time by the near-duplicate search.

`RESULTS` is the Arrow schema of a `FileResult` (a part's results file, a local run's results).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import pipeline.formats.manifest  # noqa: F401 - first: pyarrow's pandas probe answered before any conversion here
from pipeline.clean.records import Decision, FileResult
from pipeline.formats.vocabulary import Kind, Reason, Status

KINDS: tuple[Kind, ...] = tuple(Kind)
REASONS: tuple[Reason, ...] = tuple(Reason)
STATUSES: tuple[Status, ...] = tuple(Status)
IMAGE, TEXT = KINDS.index(Kind.IMAGE), KINDS.index(Kind.TEXT)
KEPT, DUPLICATE, QUARANTINED = (STATUSES.index(s) for s in (Status.KEPT, Status.DUPLICATE, Status.QUARANTINED))

_ARROW = {"str": pa.string(), "Kind": pa.string(), "Reason": pa.string(), "int": pa.int64(), "float": pa.float64(),
          "list[str]": pa.list_(pa.string()), "list[int]": pa.list_(pa.int64())}
_FIELDS = dataclasses.fields(FileResult)
NAMES: tuple[str, ...] = tuple(f.name for f in _FIELDS)
# phash is 64 unsigned bits; every other field by its Python type (an optional one is a nullable column)
RESULTS = pa.schema([(f.name, pa.uint64() if f.name == "phash" else _ARROW[str(f.type).removesuffix(" | None")])
                     for f in _FIELDS])
# what the driver reads of each file's result to decide (`compact`); the rest waits in the part files
GATHER = ("kind", "reason", "width", "height", "content_hash", "phash", "minhash")

ON_DISK = {"area": np.int64, "chash": np.uint64, "phash": np.uint64}  # `Columns`' columns on the driver's disk
# which of its hashes a file has (`Columns.flags`)
HAS_CHASH, HAS_PHASH, HAS_MINHASH = 1, 2, 4
# what a part hands the driver of each file: fixed-width columns and, for a text, its band keys
COMPACT = pa.schema([("kind", pa.int8()), ("reason", pa.int8()), ("area", pa.int64()), ("chash", pa.uint64()),
                     ("phash", pa.uint64()), ("flags", pa.uint8()), ("minhash", pa.binary())])


def to_table(results: Sequence[FileResult]) -> pa.Table:
    return pa.Table.from_pylist([vars(r) for r in results], schema=RESULTS)


_KIND, _REASON = NAMES.index("kind"), NAMES.index("reason")


def iter_results(table: pa.Table) -> Iterator[FileResult]:
    """The table's rows (all of `RESULTS`' columns) as `FileResult`s, a batch at a time (never all
    of them at once); column by column, which is several times faster than row dicts."""
    for batch in table.select(NAMES).to_batches(max_chunksize=4096):
        columns = [column.to_pylist() for column in batch.columns]
        columns[_KIND] = [Kind(k) for k in columns[_KIND]]
        columns[_REASON] = [None if r is None else Reason(r) for r in columns[_REASON]]
        for values in zip(*columns):
            yield FileResult(*values)


def index_type(n: int) -> type[np.signedinteger]:
    """The narrowest signed integer that numbers ``n`` rows (and -1): 4 bytes up to two billion files."""
    return np.int32 if n < 2**31 - 1 else np.int64


def code_type(n: int) -> type[np.signedinteger]:
    """The narrowest signed integer for ``n`` codes and -1 (labels: a few, or one per file)."""
    return np.int16 if n < 2**15 - 1 else index_type(n)


def _codes(column, words: Sequence[str]) -> np.ndarray:
    """Each value's position in ``words``; -1 for null."""
    idx = pc.index_in(column, value_set=pa.array(list(map(str, words)), pa.string()))
    return np.asarray(pc.fill_null(idx, -1).to_numpy(zero_copy_only=False), dtype=np.int8)


def digest(values: Sequence[str]) -> np.ndarray:
    """A 64-bit digest of each string: equal strings, equal digests (the other way round only
    almost surely: `Columns.confirmed` settles it on the full strings)."""
    import xxhash

    return np.fromiter((xxhash.xxh3_64_intdigest(v.encode("utf-8", "surrogatepass")) for v in values),
                       dtype=np.uint64, count=len(values))


def compact(table: pa.Table) -> pa.Table:
    """What the driver keeps of a part's files (its results' `GATHER` columns), as `COMPACT`:
    made where the part ran, so the driver copies fixed-width columns and hashes nothing."""
    col = {n: table.column(n).combine_chunks() if isinstance(table.column(n), pa.ChunkedArray) else table.column(n)
           for n in GATHER}
    kind, reason = _codes(col["kind"], KINDS), _codes(col["reason"], REASONS)
    w = np.maximum(pc.fill_null(col["width"], -1).to_numpy(zero_copy_only=False), 0).astype(np.int64)
    h = np.maximum(pc.fill_null(col["height"], -1).to_numpy(zero_copy_only=False), 0).astype(np.int64)
    chash = col["content_hash"]
    has_chash = pc.fill_null(pc.greater(pc.utf8_length(chash), 0), False).to_numpy(zero_copy_only=False)
    digests = np.zeros(len(chash), dtype=np.uint64)
    rows = np.flatnonzero(has_chash)
    digests[rows] = digest(chash.take(pa.array(rows)).to_pylist())
    phash = col["phash"]
    has_phash = phash.is_valid().to_numpy(zero_copy_only=False)
    minhash = col["minhash"]
    has_minhash = pc.fill_null(pc.greater(pc.utf8_length(minhash), 0), False).to_numpy(zero_copy_only=False)
    flags = (has_chash * HAS_CHASH + has_phash * HAS_PHASH + has_minhash * HAS_MINHASH).astype(np.uint8)
    keys: list[bytes | None] = [None] * len(minhash)
    if has_minhash.any():
        import base64

        texts = minhash.to_pylist()
        for i in np.flatnonzero(has_minhash).tolist():
            keys[i] = base64.b64decode(texts[i])
    return pa.table({"kind": kind, "reason": reason, "area": w * h, "chash": digests,
                     "phash": pc.fill_null(phash, 0), "flags": flags, "minhash": pa.array(keys, pa.binary())},
                    schema=COMPACT)


# ------------------------------------------------------------------ reading rows back


def locate(starts: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The part of each row, parts being the contiguous ranges [starts[k], starts[k + 1])."""
    return np.searchsorted(starts, rows, side="right") - 1


class Rows:
    """Every file's whole result, where it stays: in its part (rows [starts[k], starts[k + 1])
    are part k's), read back a part at a time by ``read(k, columns)``."""

    def __init__(self, starts: Sequence[int], read: Callable[[int, Sequence[str] | None], pa.Table]):
        self.starts = np.asarray(starts, dtype=np.int64)
        self._read_part = read
        # rows the stage changed after their parts were written (the folder prior, `pipeline.clean.prior`):
        # {row: {field: value}}, laid over every read, so the parts stay what the workers found
        self.overlay: dict[int, dict[str, Any]] = {}

    def patch(self, row: int, values: dict[str, Any]) -> None:
        """Read ``row``'s fields ``values`` (`FileResult` fields, as its Python values) from now on."""
        self.overlay.setdefault(int(row), {}).update(values)

    def _read(self, k: int, columns: Sequence[str] | None) -> pa.Table:
        table = self._read_part(k, columns)
        if not self.overlay:
            return table
        begin, end = int(self.starts[k]), int(self.starts[k + 1])
        mine = {r - begin: v for r, v in self.overlay.items() if begin <= r < end}
        for name in sorted({f for v in mine.values() for f in v} & set(table.column_names)):
            values = table.column(name).to_pylist()
            for at, v in mine.items():
                if name in v:
                    values[at] = v[name]
            table = table.set_column(table.column_names.index(name), name, pa.array(values, table.schema.field(name).type))
        return table

    def __len__(self) -> int:
        return int(self.starts[-1]) if len(self.starts) else 0

    def chunks(self) -> Iterator[pa.Table]:
        """Every part whole, in order (one part held at a time)."""
        for k in range(len(self.starts) - 1):
            yield self._read(k, None)

    def fetch(self, rows: Sequence[int] | np.ndarray, columns: Sequence[str]) -> pa.Table:
        """``columns`` of ``rows`` (any order, repeats allowed), in that order: each part that
        holds some of them read once."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            return pa.table({n: pa.array([], RESULTS.field(n).type) for n in columns})
        order = np.argsort(rows, kind="stable")
        ordered = rows[order]
        part = locate(self.starts, ordered)
        edges = np.flatnonzero(np.r_[True, part[1:] != part[:-1], True])
        pieces = []
        for b, e in zip(edges[:-1].tolist(), edges[1:].tolist()):
            k = int(part[b])
            table = self._read(k, columns)
            pieces.append(table.select(list(columns)).take(pa.array(ordered[b:e] - self.starts[k])))
        back = np.empty(len(rows), dtype=np.int64)
        back[order] = np.arange(len(rows))
        return pa.concat_tables(pieces).take(pa.array(back))


class Strings:
    """Strings of a few rows (the sources duplicates name), held as one Arrow array beside the
    sorted rows: a few bytes each instead of a dict of Python strings."""

    def __init__(self, rows: np.ndarray, values: pa.Array):
        self.rows, self.values = rows, values

    @classmethod
    def of(cls, source: Rows, rows: np.ndarray, column: str) -> Strings:
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        return cls(rows, source.fetch(rows, [column]).column(0).combine_chunks())

    def take(self, rows: np.ndarray) -> pa.Array:
        """The value of each row (null where a row is -1)."""
        rows = np.asarray(rows, dtype=np.int64)
        at = np.searchsorted(self.rows, rows) if len(self.rows) else np.zeros(len(rows), dtype=np.int64)
        missing = rows < 0
        return self.values.take(pa.array(np.where(missing, 0, at), mask=missing))


# ------------------------------------------------------------------ texts' band keys, on disk


class Bands:
    """The MinHash band keys of every text that has them (64 bytes a text), on the driver's disk:
    a file of rows and one per band (`pipeline.shard.spill.Spill`), mapped back and read a band
    at a time by the near-duplicate search (`of`), so a corpus of texts costs no memory for them."""

    def __init__(self, where: Path | None = None):
        from pipeline.shard.spill import Spill

        self._spill = Spill(where)
        self._mapped: dict[str, Any] | None = None
        self.count = 0

    def add(self, rows: np.ndarray, keys: Sequence[bytes]) -> None:
        """The band keys (``keys``: `minhash.encode_keys`' bytes, BANDS x uint32) of files ``rows``
        (a row given again, as the folder prior does: its later keys replace its earlier ones)."""
        from pipeline.similarity.minhash import BANDS

        if not len(rows):
            return
        if self._mapped is not None:
            raise AssertionError("band keys are added before they are read")
        m = np.frombuffer(b"".join(keys), dtype="<u4").reshape(len(rows), BANDS)
        self._spill.numbers("rows", np.asarray(rows, dtype=np.int64))
        for b in range(BANDS):
            self._spill.numbers(f"band{b}", np.ascontiguousarray(m[:, b]))
        self.count += len(rows)

    def of(self, rows: np.ndarray) -> BandKeys:
        """The band keys of ``rows`` (each one that `add` was given), as `minhash.candidate_pairs` reads them."""
        if self._mapped is None:
            self._mapped = self._spill.finish() if self.count else {}
        if not len(rows):
            return BandKeys(self._spill, {}, np.zeros(0, dtype=np.int64))
        have = self._mapped["rows"]
        order = np.argsort(have, kind="stable")
        at = order[np.searchsorted(have, rows, side="right", sorter=order) - 1]  # a row added again: its last keys
        self._spill.release("rows")
        return BandKeys(self._spill, self._mapped, at)


class BandKeys:
    """An (n, BANDS) array's worth of band keys that is never all in memory: ``keys[:, b]`` reads
    band b of the members from the disk and lets its pages go (what `minhash.candidate_pairs` does)."""

    def __init__(self, spill, mapped: dict[str, Any], at: np.ndarray):
        from pipeline.similarity.minhash import BANDS

        self._spill, self._mapped, self._at = spill, mapped, at
        self.shape = (len(at), BANDS)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: tuple[slice, int]) -> np.ndarray:
        rows, band = index
        if rows != slice(None):
            raise IndexError("band keys are read a whole band at a time")
        out = np.asarray(self._mapped[f"band{band}"][self._at]) if len(self._at) else np.zeros(0, dtype="<u4")
        self._spill.release(f"band{band}")
        return out


# ------------------------------------------------------------------ columns that wait on disk


class OnDisk:
    """Fixed-width columns of every file kept on the driver's disk, not in its memory: written a
    part at a time at their rows' place (parts end in any order), read back by the one step of
    decide that needs each (`take`), a slice at a time."""

    SLICE = 1 << 18  # rows read at once (2 MB of a column)

    def __init__(self, n: int, dtypes: dict[str, Any], where: Path | None = None):
        import tempfile

        self.n = n
        self._dtypes = {name: np.dtype(t) for name, t in dtypes.items()}
        self._files = {}
        for name, t in self._dtypes.items():
            f = tempfile.TemporaryFile(dir=str(where) if where is not None and Path(where).is_dir() else None,
                                       prefix=f".pipe-{name}-")
            f.truncate(n * t.itemsize)
            self._files[name] = f

    def write(self, name: str, begin: int, values: np.ndarray) -> None:
        import os

        data = np.ascontiguousarray(values, dtype=self._dtypes[name]).tobytes()
        at = begin * self._dtypes[name].itemsize
        while data:
            done = os.pwrite(self._files[name].fileno(), data, at)
            data, at = data[done:], at + done

    def read(self, name: str, begin: int, end: int) -> np.ndarray:
        """Rows begin .. end of column ``name``."""
        import os

        t = self._dtypes[name]
        out = np.empty(end - begin, dtype=t)
        view, at = out.view(np.uint8).data, begin * t.itemsize
        while len(view):
            got = os.preadv(self._files[name].fileno(), [view], at)
            if not got:
                raise OSError(f"the column {name} on the driver's disk is shorter than it was written")
            view, at = view[got:], at + got
        return out

    def take(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Column ``name`` at ``rows`` (any order), read a slice of the column at a time."""
        out = np.empty(len(rows), dtype=self._dtypes[name])
        for lo in range(0, self.n, self.SLICE):
            hi = min(self.n, lo + self.SLICE)
            at = np.flatnonzero((rows >= lo) & (rows < hi))
            if len(at):
                out[at] = self.read(name, lo, hi)[rows[at] - lo]
        return out

    def drop(self, name: str) -> None:
        f = self._files.pop(name, None)
        if f is not None:
            f.close()


# ------------------------------------------------------------------ the columns


class Columns:
    """Every file's result as decide needs it, in listing order (row i = the i-th file).

    Fixed-width arrays (`Gatherer` fills them a part at a time): in memory the ones most steps
    read, 9 bytes a file; on the driver's disk (`OnDisk`, read with `take` by the one step that
    needs each) the input's pixel ``area`` (width x height, 0: unknown), the content hash's
    ``chash`` (`digest`) and the perceptual ``phash``, 24 bytes a file. Decide frees each
    column once it is done with it (`drop`). ``label`` and the sparse ``caption``/``caption_reason``
    (from the labels file) are what the manifest needs of them afterwards; everything else is read
    back from the parts (``rows``: `Rows`)."""

    def __init__(self, arrays: dict[str, np.ndarray], disk: OnDisk, label_names: list[str], rows: Rows, bands: Bands,
                 where: Path | None = None):
        self.kind: np.ndarray = arrays["kind"]
        self.reason: np.ndarray = arrays["reason"]
        self.label: np.ndarray = arrays["label"]
        self.lead: np.ndarray = arrays["lead"]  # the first row with this row's key (itself, mostly)
        self.flags: np.ndarray = arrays["flags"]  # which hashes a file has (HAS_CHASH, ...)
        self.disk = disk
        self.n = len(self.kind)
        self.label_names = label_names
        self.rows, self.bands = rows, bands
        self.where = where  # a folder on the driver's disk for what waits there (None: the system's temporary one)
        self.caption: dict[int, str] = {}
        self.caption_reason: dict[int, str] = {}

    @classmethod
    def from_results(cls, results: Sequence[FileResult] | pa.Table, where: Path | None = None) -> Columns:
        """Results held whole (tests, a small run): one part, keys and labels from the results."""
        table = results if isinstance(results, pa.Table) else to_table(results)
        n = table.num_rows
        label = pc.dictionary_encode(table.column("label").combine_chunks())
        codes = pc.fill_null(label.indices, -1).to_numpy(zero_copy_only=False).astype(code_type(len(label.dictionary)))
        g = Gatherer(n, Rows([0, n], lambda k, columns: table if columns is None else table.select(list(columns))),
                     label.dictionary.to_pylist(), where)
        g.add(0, compact(table), codes, leads(table.column("key").combine_chunks()))
        c = g.finish()
        c.caption = _sparse(table.column("caption").combine_chunks())
        c.caption_reason = _sparse(table.column("caption_reason").combine_chunks())
        return c

    def __len__(self) -> int:
        return self.n

    def drop(self, *names: str) -> None:
        """Free columns decide is done with (a run of millions frees each as soon as it can)."""
        for name in names:
            if name in ON_DISK:
                self.disk.drop(name)
            else:
                setattr(self, name, None)

    def take(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Column ``name`` (one of `ON_DISK`) of ``rows``."""
        return self.disk.take(name, rows)

    def chunks(self) -> Iterator[pa.Table]:
        """Every file's whole result again, in order, a part at a time (for the manifest)."""
        return self.rows.chunks()

    def fetch(self, rows, columns: Sequence[str]) -> pa.Table:
        return self.rows.fetch(rows, columns)

    def source(self, i: int) -> str:
        return self.fetch([i], ["source"]).column(0)[0].as_py()

    def content_hashes(self, rows: np.ndarray) -> list[str | None]:
        """The full content hashes of ``rows``, in order (None: the file has none)."""
        values = self.fetch(rows, ["content_hash"]).column(0).to_pylist()
        return [v or None for v in values]

    def labels(self, begin: int = 0, end: int | None = None) -> list[str | None]:
        names = self.label_names
        return [None if c < 0 else names[c] for c in self.label[begin:end].tolist()]

    def views(self, rows: Sequence[int]) -> dict[int, OutputRef]:
        """What `decide.Outputs` needs to read files ``rows``' outputs back, by row."""
        rows = sorted(set(rows))
        t = self.fetch(rows, ["source", "output", "width", "height"])
        return {r: OutputRef(s, o, w, h) for r, s, o, w, h in zip(rows, *(t.column(k).to_pylist() for k in range(4)))}


def _sparse(column: pa.Array) -> dict[int, str]:
    rows = np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
    return dict(zip(rows.tolist(), column.take(pa.array(rows)).to_pylist()))


def leads(keys: pa.Array) -> np.ndarray:
    """For each row, the first row with the same key (equal keys: one sample)."""
    codes = pc.fill_null(pc.dictionary_encode(keys).indices, -1).to_numpy(zero_copy_only=False)
    n = len(codes)
    idx = index_type(n)
    first = np.full(int(codes.max()) + 2 if n else 1, n, dtype=idx)  # (a null key, -1: the last slot)
    np.minimum.at(first, codes, np.arange(n, dtype=idx))
    return first[codes]


class Gatherer:
    """`Columns` made a part at a time, in any order (parts end in any order on a cluster): each
    part's `compact` table, label codes and leads copied into arrays allocated once."""

    def __init__(self, n: int, rows: Rows, label_names: list[str], where: Path | None = None):
        idx = index_type(n)
        self.arrays = {"kind": np.full(n, -1, dtype=np.int8), "reason": np.full(n, -1, dtype=np.int8),
                       "label": np.full(n, -1, dtype=code_type(len(label_names))), "lead": np.zeros(n, dtype=idx),
                       "flags": np.zeros(n, dtype=np.uint8)}
        self.disk = OnDisk(n, ON_DISK, where)
        self.label_names, self.rows = label_names, rows
        self.bands, self.where = Bands(where), where
        self.filled = 0

    def add(self, begin: int, part: pa.Table, labels: np.ndarray, lead: np.ndarray) -> None:
        end = begin + part.num_rows
        a = self.arrays
        for name in ("kind", "reason", "flags"):
            a[name][begin:end] = part.column(name).to_numpy(zero_copy_only=False)
        for name in ON_DISK:
            self.disk.write(name, begin, part.column(name).to_numpy(zero_copy_only=False))
        a["label"][begin:end] = labels
        a["lead"][begin:end] = lead
        has = np.flatnonzero(a["flags"][begin:end] & HAS_MINHASH)
        if len(has):
            self.bands.add(has + begin, part.column("minhash").take(pa.array(has)).to_pylist())
        self.filled += part.num_rows

    def finish(self) -> Columns:
        """The columns, handed over (the gatherer keeps no reference: decide frees them one by one)."""
        n = len(self.arrays["kind"])
        if self.filled != n:
            raise AssertionError(f"{self.filled} of {n} files gathered")
        arrays, self.arrays = self.arrays, {}
        return Columns(arrays, self.disk, self.label_names, self.rows, self.bands, self.where)


@dataclasses.dataclass(frozen=True)
class OutputRef:
    source: str
    output: str
    width: int | None
    height: int | None


class Decisions(Sequence[Decision]):
    """One `Decision` per file, as columns: status, reason, the row it duplicates, and the few
    details decide wrote (by row; a file quarantined by its own checks keeps its own detail)."""

    def __init__(self, cols: Columns):
        self.cols = cols
        self.status = np.where(cols.reason >= 0, QUARANTINED, KEPT).astype(np.int8)
        self.reason = cols.reason.copy()
        self.twin = np.full(cols.n, -1, dtype=index_type(cols.n))
        self.detail: dict[int, str] = {}

    def __len__(self) -> int:
        return self.cols.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        r, t = int(self.reason[i]), int(self.twin[i])
        detail = self.detail.get(i, "")
        if not detail and self.cols.reason[i] >= 0:  # its own checks' detail, from its part
            detail = self.cols.fetch([i], ["detail"]).column(0)[0].as_py()
        return Decision(STATUSES[self.status[i]], None if r < 0 else REASONS[r], None if t < 0 else self.cols.source(t),
                        detail)

    def twins(self) -> Strings:
        """The sources the duplicates name, read once from their parts (for the manifest)."""
        return Strings.of(self.cols.rows, self.twin[self.twin >= 0], "source")


def manifest_table(chunk: pa.Table, offset: int, c: Columns, d: Decisions, captions: dict[int, str],
                   twins: Strings | None = None) -> pa.Table:
    """The manifest rows of files offset .. offset + len(chunk), as `records.row` makes one: what
    the worker found (``chunk``: those files' whole results), what the stage decided (``d``;
    ``twins``: `Decisions.twins`, read here when not given), the kept images' captions written
    from the labels file (``captions``, by file)."""
    from pipeline.formats.manifest import COLUMNS

    n = chunk.num_rows
    rows = slice(offset, offset + n)
    kept = d.status[rows] == KEPT
    keep = pa.array(kept)
    col = {name: chunk.column(name).combine_chunks() for name in chunk.column_names}

    def words(codes: np.ndarray, vocab) -> pa.Array:
        return pa.array([str(w) for w in vocab], pa.string()).take(pa.array(codes, mask=codes < 0))

    def unless_kept(name: str) -> pa.Array:
        return pc.if_else(keep, col[name], pa.scalar(None, col[name].type))

    notes = col["notes"].to_pylist()
    own = [d.detail.get(i, "") for i in range(offset, offset + n)] if d.detail else [""] * n
    detail = ["; ".join(x for x in [mine or found, *more] if x)
              for mine, found, more in zip(own, col["detail"].to_pylist(), notes)]
    twin = d.twin[rows]
    if twins is None:
        twins = Strings.of(c.rows, twin[twin >= 0], "source")
    label = np.asarray(c.label[rows])
    return pa.table({
        "source": col["source"], "key": col["key"], "kind": col["kind"],
        "label": pa.array(c.label_names, pa.string()).take(pa.array(label, mask=label < 0)),
        "status": words(d.status[rows], STATUSES), "reason": words(d.reason[rows], REASONS),
        "detail": pa.array(detail, pa.string()),
        "duplicate_of": twins.take(twin),
        "output": pc.if_else(keep, col["output"], ""),
        "caption": pa.array([captions.get(i, "") if k else "" for i, k in zip(range(offset, offset + n), kept.tolist())],
                            pa.string()),
        "bytes": col["bytes"], "sha256": col["sha256"], "width": col["width"], "height": col["height"],
        "encoding": col["encoding"], "encoding_confidence": col["encoding_confidence"], "content_hash": col["content_hash"],
        "phash": pa.array([None if h is None else f"{h:016x}" for h in col["phash"].to_pylist()], pa.string()),
        "output_width": unless_kept("output_width"), "output_height": unless_kept("output_height"),
        "pixel_sums": unless_kept("pixel_sums"), "pixel_squares": unless_kept("pixel_squares"),
    }, schema=COLUMNS)
