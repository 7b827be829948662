"""The listing: every file discovery found, sorted by path, kept on the driver's disk.

A `Candidate` costs ~390 bytes as Python objects, and the driver needs a file's candidate only
twice: when its part is planned (a fingerprint over the part's candidates) and when the part is
handed to the executor. So discovery hands them over a batch at a time (`ListingWriter.add`) to
an unnamed Arrow IPC file in the staging folder, and a part's candidates are read back when they
are needed (`Listing[b:e]`). What needs every file at once is done on fixed-width arrays: keys
(slugs that collide are found by an 8-byte digest per file, then settled on the slugs), label
codes, and which image and caption form one sample (``lead``: the pair's first row), which the
driver takes for each part as its results come in (`Listing.labels`, `Listing.leads`).

Read with ordinary reads, not a memory map: every page of a map the driver touches stays in its
resident memory until the map goes, and the driver reads the whole listing more than once.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.clean.candidate import Candidate, class_folder
from pipeline.clean.columns import KINDS, digest
from pipeline.clean.keys import group_keys, slug
from pipeline.formats.labels import label_name
from pipeline.formats.vocabulary import Kind, Reason

BATCH = 8192  # files in one record batch of the listing file (about a megabyte)

# path and detail as bytes: a name that is not UTF-8 is read by its own bytes (escaped as Python escapes them)
_FILE = [("source", pa.string()), ("path", pa.binary()), ("kind", pa.int8()), ("fmt", pa.string()),
         ("label", pa.int32()), ("problem", pa.string()), ("detail", pa.binary()), ("size", pa.int64())]
_RAW = pa.schema([*_FILE, ("slug", pa.string())])  # as discovery hands the files over
SCHEMA = pa.schema([*_FILE, ("key", pa.string()), ("lead", pa.int64())])  # the listing, keys assigned
_KIND = {k: i for i, k in enumerate(KINDS)}


def _unnamed(where: Path | None):
    """A file of the staging folder's disk that is gone when closed, or when the process ends, however."""
    return tempfile.TemporaryFile(dir=str(where) if where is not None and Path(where).is_dir() else None,
                                  prefix=".pipe-listing-")


class ListingWriter:
    """Candidates in, a batch at a time, in discovery's order (sorted by path); `finish` assigns
    keys and leads and returns the `Listing`. Labels (the labels file's, given as ``labels``, else
    each file's first folder) are coded as the files come in."""

    def __init__(self, where: Path | None = None, labels: dict[str, str] | None = None):
        self._where, self._labels = where, labels
        self._file = _unnamed(where)
        self._writer = pa.ipc.new_file(self._file, _RAW)
        self._pending: list[Candidate] = []
        self._codes: dict[str, int] = {}  # by label
        self._folders: dict[str, int] = {}  # by a class folder's name as found
        self.label_names: list[str] = []
        self._digests: list[np.ndarray] = []  # of the slugs: 8 bytes a file, all needed at once in the end
        self._last: tuple[str, bool] | None = None
        self._sorted = True
        self.n = 0

    def add(self, c: Candidate) -> None:
        self._pending.append(c)
        if len(self._pending) >= BATCH:
            self._flush()

    def extend(self, cs: Iterable[Candidate]) -> None:
        for c in cs:
            self.add(c)

    def _label(self, source: str) -> int:
        """The label's code: the labels file's label, else the first folder's name (NFC: a macOS
        folder name is NFD; none for "", "." or "..", an object key being any text)."""
        if self._labels is not None:
            label = self._labels.get(source)
            return -1 if label is None else self._code(label)
        folder = class_folder(source)
        if folder is None:
            return -1
        code = self._folders.get(folder)
        if code is None:
            code = self._folders[folder] = self._code(label_name(folder))
        return code

    def _code(self, label: str) -> int:
        code = self._codes.get(label)
        if code is None:
            code = self._codes[label] = len(self.label_names)
            self.label_names.append(label)
        return code

    def _flush(self) -> None:
        cs, self._pending = self._pending, []
        if not cs:
            return
        for c in cs:
            at = (c.source, c.problem is None)  # by path; a problem the walk found before a file of the same name
            if self._last is not None and at < self._last:
                self._sorted = False
            self._last = at
        slugs = [slug(c.source) for c in cs]
        self._writer.write_batch(pa.record_batch([
            pa.array([c.source for c in cs], pa.string()), _bytes([c.path for c in cs]),
            pa.array([_KIND[Kind(c.kind)] for c in cs], pa.int8()), pa.array([c.fmt for c in cs], pa.string()),
            pa.array([self._label(c.source) for c in cs], pa.int32()),
            pa.array([None if c.problem is None else str(c.problem) for c in cs], pa.string()),
            _bytes([c.detail for c in cs]), pa.array([c.size for c in cs], pa.int64()),
            pa.array(slugs, pa.string())], schema=_RAW))
        self._digests.append(digest(slugs))
        self.n += len(cs)

    def finish(self) -> Listing:
        """The listing, keys assigned (`keys.assign_keys`' keys, file for file), pairs led by
        their first file; with a labels file, a label given for either half of a pair is the
        pair's, when no other label is given for the other half."""
        self._flush()
        self._writer.close()
        raw = _Reader(self._file)
        order = None if self._sorted else _sort_order(raw)
        digests = np.concatenate(self._digests) if self._digests else np.zeros(0, dtype=np.uint64)
        self._digests = []
        if order is not None:
            digests = digests[order]
        keys = _Keys(raw, order, digests)
        del digests
        labels = keys.shared_labels() if self._labels is not None else {}
        out = _unnamed(self._where)
        with pa.ipc.new_file(out, SCHEMA) as writer:
            for begin in range(0, self.n, BATCH):
                end = min(begin + BATCH, self.n)
                t = raw.rows(begin, end, order)
                key: Any = t.column("slug")
                if any(begin <= i < end for i in keys.renamed):
                    key = pa.array([keys.renamed.get(i, k) for i, k in enumerate(key.to_pylist(), begin)], pa.string())
                label = t.column("label")
                if labels:
                    label = pa.array([labels.get(i, v) for i, v in enumerate(label.to_pylist(), begin)], pa.int32())
                lead = np.arange(begin, end, dtype=np.int64)
                at = np.searchsorted(keys.pair_rows, [begin, end])
                second = keys.pair_rows[at[0]:at[1]]
                lead[second - begin] = keys.pair_leads[at[0]:at[1]]
                columns = {n: t.column(n) for n in t.column_names}
                columns.update(key=key, label=label, lead=lead)
                (batch,) = pa.table([columns[n] for n in SCHEMA.names], schema=SCHEMA).combine_chunks().to_batches()
                writer.write_batch(batch)  # one record batch of BATCH files: row r is in batch r // BATCH
        raw.close()
        return Listing(out, self.label_names, self.n)


def _bytes(texts: list[str]) -> pa.Array:
    return pa.array([t.encode("utf-8", "surrogateescape") for t in texts], pa.binary())


def _text(values: list[bytes]) -> list[str]:
    return [v.decode("utf-8", "surrogateescape") for v in values]


class _Reader:
    """An Arrow IPC file of record batches of `BATCH` rows, read a batch at a time (the last two
    kept: the executor takes a part's files while the driver labels another part's results)."""

    def __init__(self, file):
        file.seek(0)
        self._file = file
        self._ipc = pa.ipc.open_file(file)
        self._kept: dict[int, Any] = {}

    def batch(self, i: int) -> pa.RecordBatch:
        got = self._kept.pop(i, None)
        if got is None:
            got = self._ipc.get_batch(i)
            while len(self._kept) >= 2:
                del self._kept[next(iter(self._kept))]
        self._kept[i] = got  # (the most recent last)
        return got

    def rows(self, begin: int, end: int, order: np.ndarray | None = None) -> pa.Table:
        """Rows begin .. end (of the sorted listing: through ``order`` when the file is not sorted)."""
        if order is not None:
            want = order[begin:end]
            return self.take(want)
        pieces = []
        for b in range(begin // BATCH, (end - 1) // BATCH + 1) if end > begin else ():
            lo = b * BATCH
            batch = self.batch(b)
            pieces.append(batch.slice(max(begin - lo, 0), min(end, lo + batch.num_rows) - max(begin, lo)))
        return pa.Table.from_batches(pieces, schema=self._ipc.schema) if pieces else self._ipc.schema.empty_table()

    def take(self, rows: np.ndarray) -> pa.Table:
        """Any rows of the file, in the order given (each batch holding some read once)."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return self._ipc.schema.empty_table()
        order = np.argsort(rows, kind="stable")
        ordered = rows[order]
        pieces = []
        for b in np.unique(ordered // BATCH).tolist():
            lo, hi = np.searchsorted(ordered, [b * BATCH, (b + 1) * BATCH])
            pieces.append(pa.Table.from_batches([self.batch(b)]).take(pa.array(ordered[lo:hi] - b * BATCH)))
        back = np.empty(len(rows), dtype=np.int64)
        back[order] = np.arange(len(rows))
        return pa.concat_tables(pieces).take(pa.array(back))

    def column(self, name: str) -> pa.ChunkedArray:
        return pa.chunked_array([self.batch(i).column(name) for i in range(self._ipc.num_record_batches)],
                                self._ipc.schema.field(name).type)

    def close(self) -> None:
        self._kept.clear()
        self._file.close()


def _sort_order(raw: _Reader) -> np.ndarray:
    """The sorted order of a listing handed over out of order (names that are not UTF-8 sort by
    their bytes in the walk, by their escaped form here): by source, a walk's problem before a
    file of the same name, else in the order handed over (what sorting the candidates did)."""
    source = raw.column("source")
    table = pa.table({"source": source, "file": pc.is_null(raw.column("problem")),
                      "at": pa.array(np.arange(len(source), dtype=np.int64))})
    return pc.sort_indices(table, [("source", "ascending"), ("file", "ascending"), ("at", "ascending")]).to_numpy()


class _Keys:
    """The keys that are not a file's own slug (``renamed``, by row: files whose slugs collide
    and are no caption pair) and the caption pairs (``pair_rows``: each pair's second row,
    sorted, ``pair_leads``: its first), found among the files whose slug digests collide."""

    def __init__(self, raw: _Reader, order: np.ndarray | None, digests: np.ndarray):
        self._raw, self._order = raw, order
        self.renamed: dict[int, str] = {}
        by_digest = np.argsort(digests, kind="stable")
        self._sorted = digests[by_digest]
        self._by_digest = by_digest
        same = self._sorted[1:] == self._sorted[:-1]
        grouped = np.zeros(len(digests), dtype=bool)
        grouped[1:] |= same
        grouped[:-1] |= same
        rows = np.sort(by_digest[grouped])  # files whose slug digest another file has
        del same, grouped
        self.rows = rows
        t = self._table(rows, ["slug", "source", "kind", "label"])
        groups: dict[str, list[int]] = {}
        for i, s in enumerate(t.column("slug").to_pylist()):
            groups.setdefault(s, []).append(i)
        sources, kinds = t.column("source").to_pylist(), t.column("kind").to_pylist()
        self._labels = t.column("label").to_pylist()
        taken = _Taken(self)
        firsts, seconds = [], []
        self._pairs: list[tuple[int, int]] = []  # (first, second) positions in ``rows``
        for base, members in groups.items():  # in order of each slug's first file, as assign_keys goes
            if len(members) == 1:
                continue
            keys = group_keys(base, [(sources[i], KINDS[kinds[i]]) for i in members], taken)
            if keys[0] == base and len(members) == 2:  # a caption pair: one key
                a, b = members
                firsts.append(int(rows[a]))
                seconds.append(int(rows[b]))
                self._pairs.append((a, b))
                continue
            for i, key in zip(members, keys):
                self.renamed[int(rows[i])] = key
        order_ = np.argsort(np.asarray(seconds, dtype=np.int64), kind="stable")
        self.pair_rows = np.asarray(seconds, dtype=np.int64)[order_]
        self.pair_leads = np.asarray(firsts, dtype=np.int64)[order_]

    def _table(self, rows: np.ndarray, columns: list[str]) -> pa.Table:
        """``columns`` of rows of the sorted listing."""
        file_rows = self._order[rows] if self._order is not None else rows
        return self._raw.take(file_rows).select(columns)

    def is_slug(self, key: str) -> bool:
        """Whether some file's slug is ``key`` (its digest looked up, the slugs compared)."""
        d = digest([key])[0]
        lo, hi = np.searchsorted(self._sorted, d, side="left"), np.searchsorted(self._sorted, d, side="right")
        if lo == hi:
            return False
        return key in self._table(np.sort(self._by_digest[lo:hi]), ["slug"]).column(0).to_pylist()

    def shared_labels(self) -> dict[int, int]:
        """An image and its caption are one sample: a label given for one half is the other's too."""
        out = {}
        for a, b in self._pairs:
            la, lb = self._labels[a], self._labels[b]
            if (la < 0) != (lb < 0):
                label = max(la, lb)
                out[int(self.rows[a])] = out[int(self.rows[b])] = label
        return out


class _Taken:
    """``taken`` for `keys.group_keys`: every slug (asked of the digests) and every key given."""

    def __init__(self, keys: _Keys):
        self._keys = keys
        self._given: set[str] = set()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (key in self._given or self._keys.is_slug(key))

    def add(self, key: str) -> None:
        self._given.add(key)


class Listing(Sequence[Candidate]):
    """The sorted candidates on the driver's disk: ``listing[i]`` and ``listing[b:e]`` read
    them back (a record batch at a time, the last one kept), iteration reads every one."""

    def __init__(self, file, label_names: list[str], n: int):
        self._reader = _Reader(file)
        self.label_names = label_names
        self._n = n

    @classmethod
    def of(cls, candidates: Iterable[Candidate], where: Path | None = None,
           labels: dict[str, str] | None = None) -> Listing:
        """A listing of candidates in sorted order (a labels file's ``labels``, else class folders)."""
        writer = ListingWriter(where, labels)
        writer.extend(candidates)
        return writer.finish()

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> Candidate: ...

    @overload
    def __getitem__(self, i: slice) -> list[Candidate]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            begin, end, step = i.indices(self._n)
            if step != 1:
                return [self[k] for k in range(begin, end, step)]
            return self._candidates(self.table(begin, end))
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._candidates(self.table(i, i + 1))[0]

    def __iter__(self) -> Iterator[Candidate]:
        for begin in range(0, self._n, BATCH):
            yield from self._candidates(self.table(begin, min(begin + BATCH, self._n)))

    def table(self, begin: int, end: int) -> pa.Table:
        """Files begin .. end as a table of `SCHEMA`."""
        return self._reader.rows(begin, end)

    def columns(self, names: Sequence[str]) -> Iterator[tuple[int, pa.Table]]:
        """Every file's ``names``, a batch at a time: (first row, table)."""
        for begin in range(0, self._n, BATCH):
            yield begin, self.table(begin, min(begin + BATCH, self._n)).select(list(names))

    def labels(self, begin: int, end: int) -> np.ndarray:
        """The label codes (in ``label_names``; -1: none) of files begin .. end."""
        return self.table(begin, end).column("label").to_numpy()

    def leads(self, begin: int, end: int) -> np.ndarray:
        """For files begin .. end, the first file of each one's key (an image's caption file has its image's)."""
        return self.table(begin, end).column("lead").to_numpy()

    def _candidates(self, t: pa.Table) -> list[Candidate]:
        names = self.label_names
        cols = [t.column(n).to_pylist() for n in ("source", "path", "kind", "fmt", "label", "key", "problem", "detail", "size")]
        cols[1], cols[7] = _text(cols[1]), _text(cols[7])
        return [Candidate(s, p, KINDS[k], f, None if lab < 0 else names[lab], key, None if pr is None else Reason(pr), d, size)
                for s, p, k, f, lab, key, pr, d, size in zip(*cols)]

    def close(self) -> None:
        self._reader.close()
