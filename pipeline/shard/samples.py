"""`pipe shard`'s samples as columns: the kept rows of manifest.parquet, grouped by key (an image
and its caption are one sample), that are labelled or image-caption pairs, sorted by shard key.

Held as arrays (Arrow strings and binaries, numpy numbers), not an object per sample: a few
hundred bytes a sample, not kilobytes of dicts and dataclasses. The manifest is read in column
batches (only the columns shard uses, only the kept rows kept); grouping, the checks and the
`.json` members are computed over whole columns with Arrow (`grouping`). Python visits a sample
only to stat its files, once each: their sizes decide the shard layout before any byte is
copied. A key that a check finds wrong is read row by row (`_check_rows`) for the message it
always got.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import UsageError
from pipeline.formats.manifest_row import ADDED_LATER, NAMES
from pipeline.formats.vocabulary import Kind, Status
from pipeline.shard.grouping import IMAGE_EXT, Grouped, stat_outputs, to_mask, unique_keys

ROW_BATCH = 10_000  # manifest rows read at a time
SAMPLE_BATCH = 8192  # samples whose columns are made at once
REQUIRED = (NAMES.key, NAMES.kind, NAMES.label, NAMES.status, NAMES.output, NAMES.source)
# the manifest columns pipe shard uses (the others, such as detail, are never read)
READ_COLUMNS = (NAMES.source, NAMES.key, NAMES.kind, NAMES.label, NAMES.status, NAMES.output, NAMES.caption,
                NAMES.width, NAMES.height, NAMES.encoding, NAMES.encoding_confidence, NAMES.phash, *ADDED_LATER)


@dataclass
class Samples:
    """Every sample (labelled, or an image-caption pair without a label: class -1), in canonical
    order (sorted by shard key), one array per fact."""

    classes: list[str]
    key: Any  # pyarrow string array: the shard key (safe, unique)
    cls: np.ndarray  # int64: index into classes, -1 for a pair without a label
    meta: Any  # pyarrow binary array: the .json member's bytes
    image: Any  # pyarrow string array: image path relative to CLEAN_DIR, null without one
    image_ext: np.ndarray  # int8: index into IMAGE_EXTS, NONE (`grouping.NONE`) without an image
    image_size: np.ndarray  # int64: bytes at load, NONE without an image
    image_mtime: np.ndarray  # int64: mtime_ns at load
    text: Any  # pyarrow string array, null without a text
    text_size: np.ndarray
    text_mtime: np.ndarray
    phash: np.ndarray  # uint64: the image's perceptual hash (0 where has_phash is False)
    has_phash: np.ndarray  # bool
    pixels: np.ndarray  # int64 (n, 8): width, height, 3 sums, 3 sums of squares; `grouping.UNRECORDED` row: decode
    unlabelled: int  # kept samples without a label that are no image-caption pair, left out
    unlabelled_examples: list[str]  # the first few of their keys
    spill: Any = None  # the `Spill` the large columns are mapped from (None: they are on the heap)
    group: np.ndarray | None = None
    """int64, set once split: each sample's near-duplicate group as its first member's index, -1 for
    a sample alone (`pipeline.shard.plan.entry` records it in the .json member of a pair)."""

    def __len__(self) -> int:
        return len(self.cls)

    def release_pages(self, column: str | None = None) -> None:
        """Drop the pages of the mapped columns (of ``column`` alone, where named) read so far
        from the process (`spill.Spill.release`)."""
        if self.spill is not None:
            self.spill.release(column)

    def tar_bytes(self) -> np.ndarray:
        """Bytes each sample takes in a shard: its members' headers, data and padding."""
        import pyarrow.compute as pc

        from pipeline.formats.sample import encode_class, sample_bytes

        cls_size = np.array([len(encode_class(i)) for i in range(len(self.classes))] + [-1], dtype=np.int64)  # -1: none
        meta_size = pc.binary_length(self.meta).to_numpy()
        if self.group is not None:
            from pipeline.shard.plan import group_prefix_sizes

            meta_size = meta_size + group_prefix_sizes(self)
        return sample_bytes(self.image_size, self.text_size, cls_size[self.cls], meta_size)


def load(clean_dir: Path, spill_dir: Path | None = None) -> tuple[Samples, str]:
    """The samples of ``clean_dir``'s manifest (`Samples`), and the manifest's sha256. Their large
    columns are kept in unnamed files in ``spill_dir`` (default: the system's temporary folder)
    when the manifest is one pipe clean writes (`_streamed`)."""
    import pyarrow as pa

    path = clean_dir / "manifest.parquet"
    # Arrow's default allocator (mimalloc) keeps the pages it freed: the temporaries of reading and
    # grouping stayed in the process, 30 MiB more at 30,000 samples. The system allocator gives
    # them back; arrays made here keep working whichever allocator is the default afterwards.
    default_pool = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        return _load(path, clean_dir, spill_dir)
    finally:
        pa.set_memory_pool(default_pool)
        give_back_freed()


def give_back_freed() -> None:
    """Hand the heap memory freed so far back to the system (glibc's malloc_trim; other C
    libraries: nothing): blocks freed in between live ones otherwise stay part of the process,
    and the peak grows with every batch. (A fixed mmap threshold, for the same blocks, saved
    8 MiB of the peak at 100k samples for 140,000 more page faults, ~0.4 s of system time: not done.)"""
    _trim()()


@functools.cache
def _trim() -> Callable[[], None]:
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return lambda: libc.malloc_trim(0) and None
    except (OSError, AttributeError):
        return lambda: None


def _load(path: Path, clean_dir: Path, spill_dir: Path | None) -> tuple[Samples, str]:
    try:
        samples = _streamed(path, clean_dir, spill_dir)
    except Exception:  # noqa: BLE001 - anything unusual: the whole-table reading, which says what is wrong
        kept = [_read_kept(path)]  # handed over in a list that `_build` empties: the table is freed once used
        samples = _build(kept, clean_dir)
    return samples, _sha256(path)


class _NotStreamable(Exception):
    """The manifest is not one `_streamed` reads: `_build` reads it whole (and says what is wrong, if anything)."""


_SPILLED_STRINGS = ("key", "meta", "image", "text")
_SPILLED_NUMBERS = ("image_mtime", "text_mtime", "pixels")


def _streamed(path: Path, clean_dir: Path, spill_dir: Path | None) -> Samples:
    """The samples of a manifest as pipe clean writes it (kept rows in key order, every key
    safe, every group right), read a batch at a time so that memory stays flat however many
    samples there are: each batch's complete groups (the last key's rows wait for the next
    batch) are checked, stat'ed and made columns exactly as `_build` makes them, the large
    columns appended to a `Spill`, the few numbers split, plan and index need held. Anything
    else (rows out of key order, a key made safe, a group or file found wrong) raises
    `_NotStreamable`: `_build` then reads the manifest whole, as it always did."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from pipeline.shard.spill import Spill

    manifest = pq.ParquetFile(path, pre_buffer=False)
    names = set(manifest.schema_arrow.names)
    if set(REQUIRED) - names:
        raise _NotStreamable
    spill, held = Spill(spill_dir), _Held(manifest.metadata.num_rows)
    pending, last = None, None
    for batch in manifest.iter_batches(ROW_BATCH, columns=[c for c in READ_COLUMNS if c in names], use_threads=False):
        batch = _kept(batch)
        if not len(batch):
            continue
        keys = batch.column(NAMES.key)
        if keys.null_count or (last is not None and pc.less(keys[0], last).as_py()):
            raise _NotStreamable
        if len(keys) > 1 and not pc.all(pc.less_equal(keys.slice(0, len(keys) - 1), keys.slice(1))).as_py():
            raise _NotStreamable
        last = keys[-1]
        rows = pa.Table.from_batches([pending, batch] if pending is not None else [batch])
        cut = int(np.argmax(to_mask(pc.equal(rows.column(NAMES.key), last))))  # the last key's first row
        _stream_unit(rows.slice(0, cut), clean_dir, spill, held)
        pending = rows.slice(cut).combine_chunks().to_batches()[0]
    if pending is not None:
        _stream_unit(pa.Table.from_batches([pending]), clean_dir, spill, held)
    if not held.n:
        return _empty(held.unlabelled, held.examples)
    return held.samples(spill)


class _Held:
    """What `_streamed` keeps on the heap: a few numbers per sample, the label names seen. The
    arrays are made once, for as many samples as the manifest has rows (pages never written
    are never part of the process): parts appended one by one would sit between each batch's
    temporaries, and the heap would grow batch by batch."""

    TYPES = {"label": np.int64, "image_ext": np.int8, "image_size": np.int64, "text_size": np.int64,
             "phash": np.uint64, "has_phash": bool}

    def __init__(self, rows: int) -> None:
        self.columns = {k: np.empty(rows, dtype=t) for k, t in self.TYPES.items()}
        self.n = 0
        self.labels: dict[str, int] = {}
        self.unlabelled = 0
        self.examples: list[str] = []

    def add(self, cols: dict[str, Any]) -> None:
        import pyarrow.compute as pc

        label = cols["label"]
        for name in pc.unique(label.drop_null()).to_pylist():
            self.labels.setdefault(name, len(self.labels))
        ids = _class_ids(label, list(self.labels))
        end = self.n + len(ids)
        for k, column in self.columns.items():
            column[self.n : end] = ids if k == "label" else cols[k]
        self.n = end

    def samples(self, spill) -> Samples:
        """The `Samples`, their large columns mapped from ``spill``, class indices by sorted label."""
        classes = sorted(self.labels)
        rank = np.empty(len(classes), dtype=np.int64)
        rank[[self.labels[c] for c in classes]] = np.arange(len(classes))
        c = {k: column[: self.n] for k, column in self.columns.items()}
        m = spill.finish()
        cls = np.where(c["label"] >= 0, rank[np.maximum(c["label"], 0)] if len(rank) else -1, -1)
        return Samples(classes, m["key"], cls, m["meta"], m["image"], c["image_ext"], c["image_size"],
                       m["image_mtime"], m["text"], c["text_size"], m["text_mtime"], c["phash"], c["has_phash"],
                       m["pixels"], self.unlabelled, self.examples, spill)


def _stream_unit(rows, clean_dir: Path, spill, held: _Held) -> None:
    """One batch's complete groups (in key order) into ``spill`` and ``held``."""
    import pyarrow.compute as pc

    if not rows.num_rows:
        return
    g = Grouped(rows.combine_chunks())
    if g.first_bad() is not None:
        raise _NotStreamable
    stats = stat_outputs(clean_dir, g.image_path, g.text_path)
    if stats.failed is not None:
        raise _NotStreamable
    unlabelled = np.flatnonzero(~g.taken & ~g.wrong)
    held.unlabelled += len(unlabelled)
    held.examples += g.keys.take(g.starts[unlabelled[: max(0, 3 - len(held.examples))]]).to_pylist()
    for lo in range(0, g.samples, SAMPLE_BATCH):
        part = slice(lo, lo + SAMPLE_BATCH)
        cols = g.columns(stats, part)
        if not pc.all(pc.equal(cols["key"], g.keys.take(g.starts[g.sample_groups[part]]))).as_py():
            raise _NotStreamable  # a key made safe can change the order and collide: `_build` sees to it
        for name in _SPILLED_STRINGS:
            spill.strings(name, cols[name])
        for name in _SPILLED_NUMBERS:
            spill.numbers(name, cols[name])
        held.add(cols)


def _read_kept(path: Path):
    """The manifest's kept rows, the columns shard reads (`_kept`), as one table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # ParquetFile, not read_table: that imports pyarrow.dataset and with it pandas (seconds)
        manifest = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering holds whole row groups: 10 MiB more at 100k rows
        names = set(manifest.schema_arrow.names)
        missing = set(REQUIRED) - names
        if missing:
            raise UsageError(f"{path} lacks the columns {', '.join(sorted(missing))}: is it a pipe clean manifest?")
        # one thread: Arrow's reader threads each keep their own allocator arenas, tens of MiB that
        # stay part of the process (and a manifest's few columns decode fast enough without them)
        return pa.Table.from_batches([_kept(batch) for batch in manifest.iter_batches(
            ROW_BATCH, columns=[c for c in READ_COLUMNS if c in names], use_threads=False)], schema=_schema())
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - any Arrow failure means the same thing to the user
        raise UsageError(f"{path} is not a readable Parquet file: {e}") from None


def _schema():
    import pyarrow as pa

    from pipeline.formats.manifest import COLUMNS

    return pa.schema([COLUMNS.field(name) for name in READ_COLUMNS])


def _kept(batch):
    """The batch's kept rows, every column this module reads present (a manifest of an older
    pipe lacks the pixel columns: they read as null) and of the type pipe clean writes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.formats.manifest import COLUMNS

    kept = pc.fill_null(pc.equal(batch.column(NAMES.status).cast(pa.string()), Status.KEPT.value), False)
    if not pc.all(kept).as_py():  # (a copy only when some rows are not kept)
        batch = batch.filter(kept)
    columns = []
    for name in READ_COLUMNS:
        want = COLUMNS.field(name).type
        if name not in batch.schema.names:
            columns.append(pa.nulls(len(batch), want))
            continue
        col = batch.column(name)
        if name in ADDED_LATER and col.type != want:
            col = pa.nulls(len(batch), want)  # not numbers pipe clean wrote (a hand-made manifest): measure instead
        col = col.cast(want)
        if name == NAMES.label:  # NFC, as pipe clean writes labels (an older or hand-made manifest may not)
            col = pc.utf8_normalize(col, form="NFC")
        columns.append(col)
    return pa.RecordBatch.from_arrays(columns, schema=_schema())


def _class_ids(labels, classes: list[str]) -> np.ndarray:
    """Each label's index in ``classes``; -1 for none (a pair without a label)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    found = pc.index_in(labels, value_set=pa.array(classes, pa.string()))
    return np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), dtype=np.int64)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _build(tables: list, clean_dir: Path) -> Samples:
    """The samples of the kept rows (the one table in ``tables``, taken out of it so that no
    reference outlives its use), as arrays. Every check runs over whole columns; only a sample
    found wrong is looked at row by row (`_explain`), for the exact message the row by row
    reading always gave; the one loop over samples in Python stats their files."""
    import pyarrow.compute as pc

    kept = tables.pop()
    if kept.num_rows and kept.column(NAMES.key).null_count:
        source = kept.filter(pc.is_null(kept.column(NAMES.key))).column(NAMES.source)[0].as_py()
        raise UsageError(f"manifest row for {source!r} is kept but has no key: is the manifest from pipe clean?")
    order = pc.sort_indices(kept, [(NAMES.key, "ascending")]).to_numpy()  # stable: rows of one key stay in order
    # one chunk per column (a batch each as read): a take from many chunks costs several times more
    kept = kept.take(order) if np.any(order[1:] < order[:-1]) else kept.combine_chunks()
    del order
    g = Grouped(kept)
    bad = g.first_bad()
    stop = g.samples if bad is None else int(np.searchsorted(g.sample_groups, bad))
    stats = stat_outputs(clean_dir, g.image_path.slice(0, stop), g.text_path.slice(0, stop))
    if stats.failed is not None:
        bad = int(g.sample_groups[stats.failed])
    if bad is not None:
        _explain(g, bad, clean_dir)
    unlabelled = np.flatnonzero(~g.taken & ~g.wrong)
    examples = g.keys.take(g.starts[unlabelled[:3]]).to_pylist()
    if not g.samples:
        return _empty(len(unlabelled), examples)
    parts = [g.columns(stats, slice(lo, lo + SAMPLE_BATCH)) for lo in range(0, g.samples, SAMPLE_BATCH)]
    del kept, g
    columns = {name: _joined([p.pop(name) for p in parts]) for name in list(parts[0])}  # each part's piece freed once joined
    del parts
    columns["key"] = unique_keys(columns["key"])
    return _in_key_order(columns, len(unlabelled), examples)


def _joined(parts: list) -> Any:
    """One column from its parts' pieces."""
    import pyarrow as pa

    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    return pa.concat_arrays([c for p in parts for c in (p.chunks if isinstance(p, pa.ChunkedArray) else [p])])


def _empty(unlabelled: int, examples: list[str]) -> Samples:
    import pyarrow as pa

    none = np.empty(0, dtype=np.int64)
    return Samples([], pa.array([], pa.string()), none, pa.array([], pa.binary()), pa.array([], pa.string()),
                   np.empty(0, dtype=np.int8), none, none, pa.array([], pa.string()), none, none,
                   np.empty(0, dtype=np.uint64), np.empty(0, dtype=bool), np.empty((0, 8), dtype=np.int64), unlabelled, examples)


def _in_key_order(c: dict[str, Any], unlabelled: int, examples: list[str]) -> Samples:
    """The columns sorted by shard key (making a key safe can change its order), labels made class indices."""
    import pyarrow as pa
    import pyarrow.compute as pc

    order: np.ndarray | None = pc.sort_indices(c["key"]).to_numpy()
    if order is not None and np.all(order[1:] > order[:-1]):
        order = None  # already in order (keys pipe clean wrote are safe): no copies

    def take(a: Any) -> Any:
        if order is None:
            return a
        if isinstance(a, np.ndarray):
            return a[order]
        return a.take(pa.array(order))

    labels = take(c["label"])
    classes = sorted(pc.unique(labels.drop_null()).to_pylist())
    cls = _class_ids(labels, classes)
    return Samples(classes, take(c["key"]), cls, take(c["meta"]), take(c["image"]), take(c["image_ext"]),
                   take(c["image_size"]), take(c["image_mtime"]), take(c["text"]), take(c["text_size"]),
                   take(c["text_mtime"]), take(c["phash"]), take(c["has_phash"]), take(c["pixels"]), unlabelled, examples)


def _explain(g: Grouped, group: int, clean_dir: Path) -> None:
    """Raise the UsageError that reading ``group``'s rows one by one gives (a check found it wrong)."""
    kept = g.kept
    end = g.starts[group + 1] if group + 1 < g.groups else kept.num_rows
    part = kept.slice(int(g.starts[group]), int(end - g.starts[group]))
    rows = list(zip(*(part.column(name).to_pylist() for name in READ_COLUMNS)))
    root = os.open(clean_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _check_rows(rows[0][_KEY], rows, clean_dir, root)
    finally:
        os.close(root)
    raise AssertionError(f"manifest key {rows[0][_KEY]!r} was found wrong, and then right")


_SOURCE, _KEY, _KIND, _LABEL, _STATUS, _OUTPUT, _CAPTION, _WIDTH, _HEIGHT, _ENCODING, _CONFIDENCE, _PHASH = range(12)


def _check_rows(key: str, rows: list[tuple], clean_dir: Path, root: int) -> None:
    """The checks of one key's rows (tuples in READ_COLUMNS order), one by one, in the order
    they have always been made: the first that fails raises its UsageError."""
    images = [r for r in rows if r[_KIND] == Kind.IMAGE]
    texts = [r for r in rows if r[_KIND] == Kind.TEXT]
    if len(images) > 1 or len(texts) > 1 or len(images) + len(texts) != len(rows):
        raise UsageError(f"manifest key {key!r} has {len(images)} kept images and {len(texts)} kept texts; "
                         "expected at most one of each: is the manifest from pipe clean?")
    labels = {r[_LABEL] for r in rows}
    if len(labels) > 1:
        raise UsageError(f"manifest key {key!r} has rows with different labels {sorted(map(str, labels))}")
    label = labels.pop()
    caption = bool(images and (texts or images[0][_CAPTION]))
    if (label is None or label == "") and not caption:  # left out: no class, and no image-caption pair
        return
    for r in images:
        image = _checked_output(clean_dir, root, r[_OUTPUT], r[_SOURCE])
        if IMAGE_EXT.get(os.path.splitext(image)[1].lower()) is None:
            raise UsageError(f"{clean_dir / image}: not a .jpg, .png or .webp image")
        if r[_CAPTION] and not texts:  # a caption from the labels file: no row of its own
            _checked_output(clean_dir, root, r[_CAPTION], r[_SOURCE])
    for r in texts:
        _checked_output(clean_dir, root, r[_OUTPUT], r[_SOURCE])


def _checked_output(clean_dir: Path, root: int, rel: str | None, source: str) -> str:
    """The row's output path, if it is a file inside CLEAN_DIR."""
    rel = rel or ""
    if not rel or ".." in rel.split("/") or rel.startswith("/"):
        raise UsageError(f"manifest row for {source!r} is kept but has no usable output path ({rel!r})")
    try:
        st = os.stat(rel, dir_fd=root)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{clean_dir / rel} is listed as kept in the manifest but is missing: was CLEAN_DIR changed? re-run pipe clean")
    return rel
