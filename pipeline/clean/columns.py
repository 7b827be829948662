"""Results as columns: what the driver holds of every file between processing and the manifest.

A `FileResult` object costs ~1.3 KB of Python objects (27 fields, each string and list its own
object); a run of ten million files cannot hold ten million of them. `Columns` holds only what
`decide` needs, as NumPy arrays of codes and Arrow strings (~110 B a file), and reads the rest
back part by part when the manifest is written (`Columns.chunks`). Local and Ray runs both go
through it, so decide and the manifest have one implementation each.

`RESULTS` is the Arrow schema of a `FileResult` (a part's results file, a local run's results).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

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
# what decide reads of each file; the rest (hashes, timestamps, pixel sums) waits in the part files
DECIDE = ("source", "key", "kind", "label", "reason", "detail", "width", "height", "content_hash", "phash", "minhash",
          "output", "caption", "caption_reason")


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


def _codes(column, words: Sequence[str]) -> np.ndarray:
    """Each value's position in ``words``; -1 for null."""
    idx = pc.index_in(column, value_set=pa.array(list(map(str, words)), pa.string()))
    return np.asarray(pc.fill_null(idx, -1).to_numpy(zero_copy_only=False), dtype=np.int16)


def _dense(column: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Equal values get equal codes (in order of first appearance); -1 for null."""
    enc = pc.dictionary_encode(column)
    return np.asarray(pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int32), enc.dictionary


def _sparse(column: pa.Array) -> dict[int, str]:
    rows = np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
    return dict(zip(rows.tolist(), column.take(pa.array(rows)).to_pylist()))


class Columns:
    """Every file's result as decide needs it, in candidate order (row i = the i-th file)."""

    def __init__(self, table: dict[str, pa.ChunkedArray | pa.Array], chunks: Callable[[], Iterator[pa.Table]]):
        """``table``: the `DECIDE` columns of every row, by name, taken out one at a time (a run of
        millions holds each only until it is converted); ``chunks``: every row's full result
        again, in order, as tables (read back when the manifest is written)."""
        def take(name: str):
            column = table.pop(name)
            return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column

        self.chunks = chunks
        self.kind = _codes(take("kind"), KINDS)
        self.n = len(self.kind)
        self.reason = _codes(take("reason"), REASONS)
        self.key, _ = _dense(take("key"))
        self.label, labels = _dense(take("label"))
        self.label_names: list[str] = labels.to_pylist()
        self.width = pc.fill_null(take("width"), -1).to_numpy(zero_copy_only=False)
        self.height = pc.fill_null(take("height"), -1).to_numpy(zero_copy_only=False)
        chash = take("content_hash")
        chash = pc.if_else(pc.equal(chash, ""), pa.scalar(None, pa.string()), chash)
        self.chash, hashes = _dense(chash)
        del chash
        # content hashes as strings only where a caption may be compared with one: text files
        self._hashes = hashes if (self.kind == TEXT).any() else None
        phash = take("phash")
        self.phash_valid = phash.is_valid().to_numpy(zero_copy_only=False)
        self.phash = pc.fill_null(phash, 0).to_numpy(zero_copy_only=False)
        del phash
        self._minhash = take("minhash")
        self.minhash_valid = pc.fill_null(pc.greater(pc.utf8_length(self._minhash), 0), False).to_numpy(zero_copy_only=False)
        self._source, self._output, self._detail = take("source"), take("output"), take("detail")
        self.caption: dict[int, str] = _sparse(take("caption"))
        self.caption_reason: dict[int, str] = _sparse(take("caption_reason"))

    @classmethod
    def from_results(cls, results: Sequence[FileResult]) -> Columns:
        table = to_table(results)
        return cls({name: table.column(name) for name in DECIDE}, lambda: iter((table,)))

    def __len__(self) -> int:
        return self.n

    def source(self, i: int) -> str:
        return self._source[i].as_py()

    def detail(self, i: int) -> str:
        return self._detail[i].as_py()

    def minhash(self, i: int) -> str | None:
        return self._minhash[i].as_py()

    def content_hash(self, i: int) -> str | None:
        if self.chash[i] < 0:
            return None
        if self._hashes is None:
            raise AssertionError("content hashes as strings are kept only when there are texts")
        return self._hashes[int(self.chash[i])].as_py()

    def labels(self) -> list[str | None]:
        names = self.label_names
        return [None if c < 0 else names[c] for c in self.label.tolist()]

    def view(self, i: int) -> OutputRef:
        """What `decide.Outputs` needs to read file i's output back."""
        w, h = int(self.width[i]), int(self.height[i])
        return OutputRef(self.source(i), self._output[i].as_py(), None if w < 0 else w, None if h < 0 else h)


@dataclasses.dataclass(frozen=True)
class OutputRef:
    source: str
    output: str
    width: int | None
    height: int | None


class Decisions(Sequence[Decision]):
    """One `Decision` per file, as columns: status, reason, the row it duplicates, detail."""

    def __init__(self, cols: Columns):
        self.cols = cols
        failed = np.flatnonzero(cols.reason >= 0)
        self.status = np.full(cols.n, KEPT, dtype=np.int8)
        self.status[failed] = QUARANTINED
        self.reason = cols.reason.copy()
        self.twin = np.full(cols.n, -1, dtype=np.int64)
        self.detail = np.full(cols.n, "", dtype=object)
        if len(failed):
            self.detail[failed] = cols._detail.take(pa.array(failed)).to_pylist()

    def __len__(self) -> int:
        return self.cols.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        r, t = int(self.reason[i]), int(self.twin[i])
        return Decision(STATUSES[self.status[i]], None if r < 0 else REASONS[r], None if t < 0 else self.cols.source(t),
                        self.detail[i])


def sources(c: Columns, batch: int = 65536) -> Iterator[str]:
    """Every file's source, in order, a batch of Python strings at a time."""
    for start in range(0, c.n, batch):
        yield from c._source.slice(start, batch).to_pylist()


def manifest_table(chunk: pa.Table, offset: int, c: Columns, d: Decisions, captions: dict[int, str]) -> pa.Table:
    """The manifest rows of files offset .. offset + len(chunk), as `records.row` makes one: what
    the worker found (``chunk``: those files' whole results), what the stage decided (``d``),
    the kept images' captions written from the labels file (``captions``, by file)."""
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
    detail = ["; ".join(x for x in [own or found, *more] if x)
              for own, found, more in zip(d.detail[rows].tolist(), col["detail"].to_pylist(), notes)]
    twin = d.twin[rows]
    label = np.asarray(c.label[rows])
    return pa.table({
        "source": col["source"], "key": col["key"], "kind": col["kind"],
        "label": pa.array(c.label_names, pa.string()).take(pa.array(label, mask=label < 0)),
        "status": words(d.status[rows], STATUSES), "reason": words(d.reason[rows], REASONS),
        "detail": pa.array(detail, pa.string()),
        "duplicate_of": c._source.take(pa.array(twin, mask=twin < 0)),
        "output": pc.if_else(keep, col["output"], ""),
        "caption": pa.array([captions.get(i, "") if k else "" for i, k in zip(range(offset, offset + n), kept.tolist())],
                            pa.string()),
        "bytes": col["bytes"], "sha256": col["sha256"], "width": col["width"], "height": col["height"],
        "encoding": col["encoding"], "encoding_confidence": col["encoding_confidence"], "content_hash": col["content_hash"],
        "phash": pa.array([None if h is None else f"{h:016x}" for h in col["phash"].to_pylist()], pa.string()),
        "output_width": unless_kept("output_width"), "output_height": unless_kept("output_height"),
        "pixel_sums": unless_kept("pixel_sums"), "pixel_squares": unless_kept("pixel_squares"),
    }, schema=COLUMNS)
