"""`pipe shard`'s samples as columns: the kept, labelled rows of manifest.parquet, grouped by key
(an image and its caption are one sample) and sorted by shard key.

Held as arrays (Arrow strings and binaries, numpy numbers), not an object per sample: a few
hundred bytes a sample, not kilobytes of dicts and dataclasses. The manifest is read in column
batches (only the columns shard uses, only the kept rows kept); grouping, the checks and the
`.json` members are computed over whole columns with Arrow. Python visits a sample only to stat
its files, once each, here: their sizes decide the shard layout before any byte is copied. A
key that a check finds wrong is read row by row (`_check_rows`) for the message it always got.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import UsageError
from pipeline.formats.manifest_row import ADDED_LATER, NAMES
from pipeline.formats.sample import IMAGE_EXTS, shard_key
from pipeline.formats.vocabulary import Kind, Status

IMAGE_EXT = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".webp": "webp"}
ROW_BATCH = 10_000  # manifest rows read at a time
SAMPLE_BATCH = 8192  # samples whose columns are made at once
STAT_BATCH = 8192  # samples whose files are stat'ed at once
REQUIRED = (NAMES.key, NAMES.kind, NAMES.label, NAMES.status, NAMES.output, NAMES.source)
# the manifest columns pipe shard uses (the others, such as detail, are never read)
READ_COLUMNS = (NAMES.source, NAMES.key, NAMES.kind, NAMES.label, NAMES.status, NAMES.output, NAMES.caption,
                NAMES.width, NAMES.height, NAMES.encoding, NAMES.encoding_confidence, NAMES.phash, *ADDED_LATER)
NONE = -1  # in a size, mtime or extension column: the sample has no such file
UNRECORDED = -1  # in a pixel column: pipe clean recorded no numbers for the image (decode it to know)


@dataclass
class Samples:
    """Every labelled sample, in canonical order (sorted by shard key), one array per fact."""

    classes: list[str]
    key: Any  # pyarrow string array: the shard key (safe, unique)
    cls: np.ndarray  # int64: index into classes
    meta: Any  # pyarrow binary array: the .json member's bytes
    image: Any  # pyarrow string array: image path relative to CLEAN_DIR, null without one
    image_ext: np.ndarray  # int8: index into IMAGE_EXTS, NONE without an image
    image_size: np.ndarray  # int64: bytes at load, NONE without an image
    image_mtime: np.ndarray  # int64: mtime_ns at load
    text: Any  # pyarrow string array, null without a text
    text_size: np.ndarray
    text_mtime: np.ndarray
    phash: np.ndarray  # uint64: the image's perceptual hash (0 where has_phash is False)
    has_phash: np.ndarray  # bool
    pixels: np.ndarray  # int64 (n, 8): width, height, 3 sums, 3 sums of squares; UNRECORDED row: decode
    unlabelled: int  # kept samples without a label, left out
    unlabelled_examples: list[str]  # the first few of their keys
    spill: Any = None  # the `Spill` the large columns are mapped from (None: they are on the heap)

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

        cls_size = np.array([len(encode_class(i)) for i in range(len(self.classes))], dtype=np.int64)
        return sample_bytes(self.image_size, self.text_size, cls_size[self.cls], pc.binary_length(self.meta).to_numpy())


def load(clean_dir: Path, spill_dir: Path | None = None) -> tuple[Samples, str]:
    """The labelled samples of ``clean_dir``'s manifest, and the manifest's sha256. Their large
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
        cut = int(np.argmax(_mask(pc.equal(rows.column(NAMES.key), last))))  # the last key's first row
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
        import pyarrow as pa
        import pyarrow.compute as pc

        label = cols["label"]
        for name in pc.unique(label).to_pylist():
            self.labels.setdefault(name, len(self.labels))
        ids = pc.index_in(label, value_set=pa.array(list(self.labels), pa.string())).to_numpy()
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
        return Samples(classes, m["key"], rank[c["label"]], m["meta"], m["image"], c["image_ext"], c["image_size"],
                       m["image_mtime"], m["text"], c["text_size"], m["text_mtime"], c["phash"], c["has_phash"],
                       m["pixels"], self.unlabelled, self.examples, spill)


def _stream_unit(rows, clean_dir: Path, spill, held: _Held) -> None:
    """One batch's complete groups (in key order) into ``spill`` and ``held``."""
    import pyarrow.compute as pc

    if not rows.num_rows:
        return
    g = _Grouped(rows.combine_chunks())
    if g.first_bad() is not None:
        raise _NotStreamable
    stats = _stat_outputs(clean_dir, g.image_path, g.text_path)
    if stats.failed is not None:
        raise _NotStreamable
    unlabelled = np.flatnonzero(~g.labelled)
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
        columns.append(col.cast(want))
    return pa.RecordBatch.from_arrays(columns, schema=_schema())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- rows -> samples


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
    g = _Grouped(kept)
    bad = g.first_bad()
    stop = g.samples if bad is None else int(np.searchsorted(g.sample_groups, bad))
    stats = _stat_outputs(clean_dir, g.image_path.slice(0, stop), g.text_path.slice(0, stop))
    if stats.failed is not None:
        bad = int(g.sample_groups[stats.failed])
    if bad is not None:
        _explain(g, bad, clean_dir)
    unlabelled = np.flatnonzero(~g.labelled)
    examples = g.keys.take(g.starts[unlabelled[:3]]).to_pylist()
    if not g.samples:
        return _empty(len(unlabelled), examples)
    parts = [g.columns(stats, slice(lo, lo + SAMPLE_BATCH)) for lo in range(0, g.samples, SAMPLE_BATCH)]
    del kept, g
    columns = {name: _joined([p.pop(name) for p in parts]) for name in list(parts[0])}  # each part's piece freed once joined
    del parts
    columns["key"] = _unique_keys(columns["key"])
    return _in_key_order(columns, len(unlabelled), examples)


class _Grouped:
    """The kept rows (sorted by key) as groups, one per key; the labelled groups are the samples."""

    def __init__(self, kept):
        import pyarrow.compute as pc

        self.kept, n = kept, kept.num_rows
        self.keys = kept.column(NAMES.key).combine_chunks()
        new = np.ones(n, dtype=bool)
        if n > 1:
            new[1:] = _mask(pc.not_equal(self.keys.slice(1), self.keys.slice(0, n - 1)))
        self.starts = np.flatnonzero(new)  # the first row of each group
        self.groups = len(self.starts)
        self.group = np.cumsum(new) - 1  # each row's group
        kind = kept.column(NAMES.kind)
        is_image, is_text = _mask(pc.equal(kind, Kind.IMAGE.value)), _mask(pc.equal(kind, Kind.TEXT.value))
        images, texts = (np.bincount(self.group[rows], minlength=self.groups) for rows in (is_image, is_text))
        misshapen = (images > 1) | (texts > 1) | (images + texts != np.bincount(self.group, minlength=self.groups))
        label = kept.column(NAMES.label)
        first = label.take(self.starts[self.group])
        same = pc.or_kleene(pc.equal(label, first), pc.and_(pc.is_null(label), pc.is_null(first)))
        self.wrong = misshapen.copy()  # groups pipe clean never writes: `_explain` says what is wrong
        np.logical_or.at(self.wrong, self.group, ~_mask(same))
        group_label = label.take(self.starts)
        self.labelled = ~_mask(pc.or_kleene(pc.is_null(group_label), pc.equal(group_label, ""))) & ~self.wrong
        self.sample_groups = np.flatnonzero(self.labelled)
        self.samples = len(self.sample_groups)
        self.label = group_label.take(self.sample_groups)
        self.image_row, self.text_row = self._row_of(is_image), self._row_of(is_text)
        caption = kept.column(NAMES.caption)
        captioned = _mask(pc.greater(pc.utf8_length(pc.fill_null(caption, "")), 0))
        # a caption from the labels file (no row of its own) is the text of an image without a text row
        self.caption_row = np.where((self.text_row < 0) & (self.image_row >= 0), self.image_row, -1)
        self.caption_row[self.caption_row >= 0] = np.where(captioned[self.caption_row[self.caption_row >= 0]],
                                                           self.caption_row[self.caption_row >= 0], -1)
        output = kept.column(NAMES.output)
        self.image_path = _rows(output, self.image_row)
        self.text_path = pc.coalesce(_rows(output, self.text_row), _rows(caption, self.caption_row))
        self.image_ext, bad_ext = _exts(self.image_path)
        self.bad = (bad_ext | _bad_paths(self.image_path, self.image_row >= 0)
                    | _bad_paths(self.text_path, (self.text_row >= 0) | (self.caption_row >= 0)))

    def _row_of(self, rows: np.ndarray) -> np.ndarray:
        """Each sample's row among ``rows`` (its image, or its text), -1 for none."""
        at = np.full(self.groups, -1, dtype=np.int64)
        at[self.group[rows]] = np.flatnonzero(rows)
        return at[self.sample_groups]

    def first_bad(self) -> int | None:
        """The first group (in key order) that a check finds wrong, before any file is stat'ed."""
        wrong = np.flatnonzero(self.wrong)
        bad = self.sample_groups[self.bad]
        found = [int(a[0]) for a in (wrong, bad) if len(a)]
        return min(found) if found else None

    def columns(self, stats: _Stats, part: slice) -> dict[str, Any]:
        """The columns of a ``part`` of the samples (in manifest-key order) as `Samples` holds them:
        made a part at a time, so the temporaries of the .json assembly stay small."""
        import pyarrow as pa
        import pyarrow.compute as pc

        kept = self.kept
        image_row, text_row, caption_row = self.image_row[part], self.text_row[part], self.caption_row[part]
        keys = self.keys.take(self.starts[self.sample_groups[part]])
        skeys = _shard_keys(keys)
        phash, has_phash = _phashes(_rows(kept.column(NAMES.phash), image_row), keys)
        source = kept.column(NAMES.source)
        label = self.label[part]
        meta = _meta(
            label=label, manifest_key=pc.if_else(pc.equal(keys, skeys), pa.scalar(None, pa.string()), keys),
            width=_rows(kept.column(NAMES.width), image_row), height=_rows(kept.column(NAMES.height), image_row),
            has_image=image_row >= 0, image_source=_rows(source, image_row),
            text_source=pc.coalesce(_rows(source, text_row),
                                    pc.binary_join_element_wise(_rows(source, caption_row), " (labels file caption)", "")),
            has_text_row=text_row >= 0, encoding=_rows(kept.column(NAMES.encoding), text_row),
            confidence=_rows(kept.column(NAMES.encoding_confidence), text_row))
        return {"key": skeys, "label": label, "meta": meta, "image": self.image_path[part], "image_ext": self.image_ext[part],
                "image_size": stats.image_size[part], "image_mtime": stats.image_mtime[part], "text": self.text_path[part],
                "text_size": stats.text_size[part], "text_mtime": stats.text_mtime[part], "phash": phash, "has_phash": has_phash,
                "pixels": recorded_pixels(*(_rows(kept.column(c), image_row) for c in ADDED_LATER))}


def _mask(bools) -> np.ndarray:
    """An Arrow boolean array as numpy (null: False)."""
    import pyarrow.compute as pc

    return np.asarray(pc.fill_null(bools, False).to_numpy(zero_copy_only=False), dtype=bool)


def _rows(column, rows: np.ndarray):
    """``column``'s cells at ``rows`` (an array; null where the row is -1)."""
    import pyarrow as pa

    return column.take(pa.array(np.maximum(rows, 0), mask=rows < 0)).combine_chunks()


def _bad_paths(paths, present: np.ndarray) -> np.ndarray:
    """Paths that name no file inside CLEAN_DIR (empty, absolute, or with a '..' part), where present."""
    import pyarrow.compute as pc

    escapes = _mask(pc.match_substring_regex(paths, r"^/|(^|/)\.\.(/|$)"))
    return present & (escapes | ~_mask(pc.greater(pc.utf8_length(pc.fill_null(paths, "")), 0)))


def _exts(paths) -> tuple[np.ndarray, np.ndarray]:
    """Each image's extension (index into IMAGE_EXTS; NONE without an image) and which are no
    image extension. The extension is what os.path.splitext finds, lower-cased: the name's last
    dot, unless the name (after its leading dots) has no other."""
    import pyarrow.compute as pc

    found = np.full(len(paths), -2, dtype=np.int8)
    lower = pc.ascii_lower(paths)  # (no other character lower-cases to one of these letters)
    for suffix, ext in IMAGE_EXT.items():
        found[_mask(pc.match_substring_regex(lower, rf"(^|/)\.*[^/.][^/]*\{suffix}$"))] = IMAGE_EXTS.index(ext)
    found[~_mask(pc.is_valid(paths))] = NONE
    bad = found == -2
    found[bad] = NONE
    return found, bad


@dataclass
class _Stats:
    image_size: np.ndarray
    image_mtime: np.ndarray
    text_size: np.ndarray
    text_mtime: np.ndarray
    failed: int | None  # the first sample with a file that is missing or no regular file


def _stat_outputs(clean_dir: Path, images, texts) -> _Stats:
    """Size and mtime_ns of every sample's files (``images``, ``texts``: Arrow string columns,
    null where a sample has none; NONE then): the only stat of each file in the run, relative
    to CLEAN_DIR's descriptor (no path joined per file), a batch of samples at a time (its
    paths as str only while it is stat'ed). Stops at the first sample whose file is not there."""
    n = len(images)
    out = np.full((n, 4), NONE, dtype=np.int64)
    root = os.open(clean_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for lo in range(0, n, STAT_BATCH):
            size = min(STAT_BATCH, n - lo)
            failed = _stat_batch(root, images.slice(lo, size), texts.slice(lo, size), out[lo : lo + size])
            if failed is not None:
                return _Stats(out[:, 0], out[:, 1], out[:, 2], out[:, 3], lo + failed)
    finally:
        os.close(root)
    return _Stats(out[:, 0], out[:, 1], out[:, 2], out[:, 3], None)


def _stat_batch(root: int, images, texts, out: np.ndarray) -> int | None:
    """Fill ``out`` (size, mtime of the image; size, mtime of the text) for a batch: each column's
    files stat'ed in one C-level map, their numbers read the same way. A batch with a file that
    is missing or no regular file is gone through sample by sample (`_first_failed`): the
    first such sample, its image before its text, as the run has always reported it."""
    from functools import partial
    from operator import attrgetter

    at = partial(os.stat, dir_fd=root)
    found = []
    try:
        for col, paths in ((0, images), (2, texts)):
            present = np.flatnonzero(_mask(paths.is_valid()))
            found.append((col, present, list(map(at, paths.drop_null().to_pylist()))))
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return _first_failed(root, images.to_pylist(), texts.to_pylist())
    for col, present, stats in found:
        modes = np.fromiter(map(attrgetter("st_mode"), stats), dtype=np.int64, count=len(stats))
        if np.any((modes & 0o170000) != stat.S_IFREG):  # (stat.S_ISREG, of the whole column)
            return _first_failed(root, images.to_pylist(), texts.to_pylist())
        out[present, col] = np.fromiter(map(attrgetter("st_size"), stats), dtype=np.int64, count=len(stats))
        out[present, col + 1] = np.fromiter(map(attrgetter("st_mtime_ns"), stats), dtype=np.int64, count=len(stats))
    return None


def _first_failed(root: int, images: list[str | None], texts: list[str | None]) -> int:
    """The first sample of a batch with a file that is missing or no regular file."""
    for i, (image, text) in enumerate(zip(images, texts)):
        for rel in (image, text):
            if rel is None:
                continue
            try:
                st = os.stat(rel, dir_fd=root)
            except (OSError, ValueError):
                return i
            if not stat.S_ISREG(st.st_mode):
                return i
    raise AssertionError("a file of the batch was missing, and then there")


def _shard_keys(keys):
    """`shard_key` of every key: keys already safe and short (all that pipe clean writes) are
    their own; only the others go through Python."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.formats.sample import KEY_PATTERN, MAX_KEY

    safe = _mask(pc.and_(pc.match_substring_regex(keys, KEY_PATTERN), pc.less_equal(pc.utf8_length(keys), MAX_KEY)))
    if safe.all():
        return keys
    out = keys.to_pylist()
    for i in np.flatnonzero(~safe).tolist():
        out[i] = shard_key(out[i])
    return pa.array(out, pa.string())


def _phashes(hexes, keys) -> tuple[np.ndarray, np.ndarray]:
    """The images' perceptual hashes (16 hex digits) as uint64, and which samples have one."""
    import pyarrow.compute as pc

    n = len(hexes)
    has = _mask(pc.greater(pc.utf8_length(pc.fill_null(hexes, "")), 0))
    values = np.zeros(n, dtype=np.uint64)
    plain = _mask(pc.match_substring_regex(hexes, "^[0-9a-fA-F]{16}$"))
    if plain.any():  # the digits of all at once: a table from ASCII to digit value
        from pipeline.shard.plan import values as string_values

        digits = string_values(hexes.filter(_pa_mask(plain)))[1]  # 16 bytes each, one after another
        values[plain] = (_HEX[digits].reshape(-1, 16).astype(np.uint64) << _NIBBLES).sum(axis=1, dtype=np.uint64)
    for i in np.flatnonzero(has & ~plain).tolist():  # written otherwise (a hand-made manifest): as Python reads it
        values[i] = _phash(keys[i].as_py(), hexes[i].as_py())
    return values, has


_HEX = np.zeros(256, dtype=np.uint8)
for _d in "0123456789abcdef":
    _HEX[ord(_d)] = _HEX[ord(_d.upper())] = int(_d, 16)
_NIBBLES = np.arange(60, -1, -4, dtype=np.uint64)


def _phash(key: str, value: str) -> int:
    try:
        h = int(value, 16)
    except ValueError:
        h = -1
    if not 0 <= h < 1 << 64:
        raise UsageError(f"manifest key {key!r} has a phash that is not 16 hex digits ({value!r}): is the manifest from pipe clean?")
    return h


def recorded_pixels(width, height, sums, squares) -> np.ndarray:
    """(n, 8) int64: width, height, 3 sums, 3 sums of squares as pipe clean recorded them, or
    UNRECORDED rows where the manifest has none (a pipe before these columns) or not plausible
    numbers (a hand-made manifest): those images are decoded and measured, as they always were."""
    import pyarrow.compute as pc

    n = len(width)
    out = np.full((n, 8), UNRECORDED, dtype=np.int64)
    ok = _mask(pc.and_(pc.is_valid(width), pc.is_valid(height)))
    for lists in (sums, squares):
        ok &= _mask(pc.equal(pc.list_value_length(lists), 3))
    if not ok.any():
        return out
    at = np.flatnonzero(ok)
    got = np.empty((len(at), 8), dtype=np.int64)
    got[:, 0] = pc.fill_null(width, -1).to_numpy(zero_copy_only=False)[at]
    got[:, 1] = pc.fill_null(height, -1).to_numpy(zero_copy_only=False)[at]
    for col, lists in ((2, sums), (5, squares)):
        three = pc.list_flatten(lists.filter(_pa_mask(ok)))
        got[:, col : col + 3] = pc.fill_null(three, -1).to_numpy(zero_copy_only=False).reshape(-1, 3)
    plausible = (got >= 0).all(axis=1)  # no negative and no missing number
    out[at[plausible]] = got[plausible]
    return out


def _pa_mask(mask: np.ndarray):
    import pyarrow as pa

    return pa.array(mask, pa.bool_())


def _json_strings(values):
    """Each string as JSON text, as `encode_meta` writes it (null: "null"): quoted, and escaped
    where it has a quote, a backslash or a control character (rare: those go through Python)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pc.any(pc.match_substring_regex(values, r'[\x00-\x1f"\\]')).as_py():
        return pa.array(["null" if v is None else encode_basestring(v) for v in values.to_pylist()], pa.string())
    return pc.fill_null(pc.binary_join_element_wise('"', values, '"', ""), "null")


def _json_numbers(values):
    """Each number as JSON text (null: "null"); floats as Python writes them (repr, NaN, Infinity)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_integer(values.type):
        return pc.fill_null(pc.cast(values, pa.string()), "null")
    return pa.array(["null" if v is None else _float_json(v) for v in values.to_pylist()], pa.string())


def _float_json(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "Infinity" if v > 0 else "-Infinity"
    return float.__repr__(v)


def _meta(*, label, manifest_key, width, height, has_image: np.ndarray, image_source, text_source,
          has_text_row: np.ndarray, encoding, confidence):
    """Every sample's .json member, byte for byte what `encode_meta` makes of its dict (keys
    sorted, no spaces, UTF-8 as is), assembled from whole columns:

        {"image":{"height":H,"width":W},"label":L,"manifest_key":K,"sources":{"image":S,"text":T},
         "text":{"encoding":E,"encoding_confidence":C}}

    with "image" and sources.image only for a sample with an image, "manifest_key" only where
    the shard key differs from it, sources.text for any text (a labels-file caption included),
    "text" only for a text with a row of its own."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def when(mask: np.ndarray, *parts):
        return pc.if_else(_pa_mask(mask), pc.binary_join_element_wise(*parts, ""), "")

    has_text = _mask(pc.is_valid(text_source))
    has_key = _mask(pc.is_valid(manifest_key))
    pieces = [
        when(has_image, '{"image":{"height":', _json_numbers(height), ',"width":', _json_numbers(width), '},"label":'),
        when(~has_image, '{"label":'),
        _json_strings(label),
        when(has_key, ',"manifest_key":', _json_strings(manifest_key)),
        pa.scalar(',"sources":{'),
        when(has_image, '"image":', _json_strings(image_source)),
        when(has_image & has_text, ","),
        when(has_text, '"text":', _json_strings(text_source)),
        pa.scalar("}"),
        when(has_text_row, ',"text":{"encoding":', _json_strings(encoding), ',"encoding_confidence":', _json_numbers(confidence), "}"),
        pa.scalar("}"),
    ]
    return pc.binary_join_element_wise(*pieces, "").cast(pa.binary())


def _explain(g: _Grouped, group: int, clean_dir: Path) -> None:
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
    classes = sorted(pc.unique(labels).to_pylist())
    cls = pc.index_in(labels, value_set=pa.array(classes, pa.string())).to_numpy().astype(np.int64)
    return Samples(classes, take(c["key"]), cls, take(c["meta"]), take(c["image"]), take(c["image_ext"]),
                   take(c["image_size"]), take(c["image_mtime"]), take(c["text"]), take(c["text_size"]),
                   take(c["text_mtime"]), take(c["phash"]), take(c["has_phash"]), take(c["pixels"]), unlabelled, examples)


def _unique_keys(keys):
    """Shard keys made unique: only keys shortened or made safe can collide; those are given a
    hash tail, in manifest-key order, as they always were."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(keys)
    if n < 2 or _mask(pc.less(keys.slice(0, n - 1), keys.slice(1))).all():
        return keys  # strictly ascending (the manifest's keys, each safe: the usual case) is unique, and cheap to see
    if pc.count_distinct(keys).as_py() == n:
        return keys
    seen: set[str] = set()
    out = []
    for k in keys.to_pylist():
        while k in seen:
            k = shard_key(f"{k}-{hashlib.sha1(k.encode()).hexdigest()[:8]}")
        seen.add(k)
        out.append(k)
    return pa.array(out, pa.string())


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
    if label is None or label == "":
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
