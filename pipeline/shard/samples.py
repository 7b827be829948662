"""`pipe shard`'s samples as columns: the kept, labelled rows of manifest.parquet, grouped by key
(an image and its caption are one sample) and sorted by shard key.

Held as arrays (Arrow strings and binaries, numpy numbers), not an object per sample: a
million samples are a few hundred bytes each, not kilobytes of dicts and dataclasses. The
manifest is read in column batches; only its kept rows are kept, and a Python value is made
of a cell only while its sample is built. Each output file is stat'ed once, here: its size
decides the shard layout before any byte is copied.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import UsageError
from pipeline.formats.manifest_row import ADDED_LATER, NAMES
from pipeline.formats.sample import IMAGE_EXTS, shard_key
from pipeline.formats.vocabulary import Kind, Status

IMAGE_EXT = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".webp": "webp"}
ROW_BATCH = 10_000  # manifest rows read at a time; also the rows turned into Python values at a time
REQUIRED = (NAMES.key, NAMES.kind, NAMES.label, NAMES.status, NAMES.output, NAMES.source)
# the manifest columns pipe shard uses (the others, such as detail, are never read)
READ_COLUMNS = (NAMES.source, NAMES.key, NAMES.kind, NAMES.label, NAMES.status, NAMES.output, NAMES.caption,
                NAMES.width, NAMES.height, NAMES.encoding, NAMES.encoding_confidence, NAMES.phash, *ADDED_LATER)
_META = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))  # `encode_meta`, made once
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
    phash: list[int | None]  # as the split takes them
    pixels: np.ndarray  # int64 (n, 8): width, height, 3 sums, 3 sums of squares; UNRECORDED row: decode
    unlabelled: int  # kept samples without a label, left out
    unlabelled_examples: list[str]  # the first few of their keys

    def __len__(self) -> int:
        return len(self.cls)

    def tar_bytes(self) -> np.ndarray:
        """Bytes each sample takes in a shard: its members' headers, data and padding."""
        import pyarrow.compute as pc

        from pipeline.formats.tarstream import member_sizes

        cls_digits = np.array([len(str(i)) for i in range(len(self.classes))], dtype=np.int64)
        n = member_sizes(cls_digits[self.cls]) + member_sizes(pc.binary_length(self.meta).to_numpy())
        n += np.where(self.image_size >= 0, member_sizes(self.image_size), 0)
        n += np.where(self.text_size >= 0, member_sizes(self.text_size), 0)
        return n


def load(clean_dir: Path) -> tuple[Samples, str]:
    """The labelled samples of ``clean_dir``'s manifest, and the manifest's sha256."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = clean_dir / "manifest.parquet"
    try:
        # ParquetFile, not read_table: that imports pyarrow.dataset and with it pandas (seconds)
        manifest = pq.ParquetFile(path)
        names = set(manifest.schema_arrow.names)
        missing = set(REQUIRED) - names
        if missing:
            raise UsageError(f"{path} lacks the columns {', '.join(sorted(missing))}: is it a pipe clean manifest?")
        kept = pa.Table.from_batches([_kept(batch) for batch in manifest.iter_batches(
            ROW_BATCH, columns=[c for c in READ_COLUMNS if c in names])], schema=_schema())
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - any Arrow failure means the same thing to the user
        raise UsageError(f"{path} is not a readable Parquet file: {e}") from None
    samples = _build(kept, clean_dir)
    return samples, _sha256(path)


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

    batch = batch.filter(pc.equal(batch.column(NAMES.status).cast(pa.string()), Status.KEPT.value))
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


class _Columns:
    """Samples as they are built: Python lists of one batch at a time, then arrays."""

    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []
        self._fresh()

    def _fresh(self) -> None:
        self.key: list[str] = []
        self.label: list[str] = []
        self.meta: list[bytes] = []
        self.image: list[str | None] = []
        self.image_ext: list[int] = []
        self.image_stat: list[tuple[int, int]] = []
        self.text: list[str | None] = []
        self.text_stat: list[tuple[int, int]] = []
        self.phash: list[int | None] = []
        self.pixels: list[tuple[int, ...]] = []

    def seal(self) -> None:
        """Turn the lists built so far into arrays (Python values are kept for one batch only)."""
        import pyarrow as pa

        if not self.key:
            return
        istat, tstat = np.array(self.image_stat, dtype=np.int64), np.array(self.text_stat, dtype=np.int64)
        self.done.append({
            "key": pa.array(self.key, pa.string()), "label": pa.array(self.label, pa.string()),
            "meta": pa.array(self.meta, pa.binary()), "image": pa.array(self.image, pa.string()),
            "image_ext": np.array(self.image_ext, dtype=np.int8), "image_size": istat[:, 0], "image_mtime": istat[:, 1],
            "text": pa.array(self.text, pa.string()), "text_size": tstat[:, 0], "text_mtime": tstat[:, 1],
            "phash": self.phash, "pixels": np.array(self.pixels, dtype=np.int64).reshape(-1, 8),
        })
        self._fresh()


def _build(kept, clean_dir: Path) -> Samples:
    import pyarrow.compute as pc

    if kept.num_rows and kept.column(NAMES.key).null_count:
        source = kept.filter(pc.is_null(kept.column(NAMES.key))).column(NAMES.source)[0].as_py()
        raise UsageError(f"manifest row for {source!r} is kept but has no key: is the manifest from pipe clean?")
    kept = kept.take(pc.sort_indices(kept, [(NAMES.key, "ascending")]))  # stable: rows of one key stay in order
    cols, unlabelled, examples = _Columns(), 0, list[str]()
    root = os.open(clean_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for key, rows in _groups(kept):
            if not _sample(key, rows, clean_dir, root, cols):
                unlabelled += 1
                if len(examples) < 3:
                    examples.append(key)
            if len(cols.key) >= ROW_BATCH:
                cols.seal()
    finally:
        os.close(root)
    cols.seal()
    del kept
    if not cols.done:
        return _empty(unlabelled, examples)
    columns = {name: _joined([p[name] for p in cols.done]) for name in cols.done[0]}
    del cols
    columns["key"] = _unique_keys(columns["key"])
    return _in_key_order(columns, unlabelled, examples)


def _joined(parts: list) -> Any:
    """One column from its batches' pieces."""
    import pyarrow as pa

    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    if isinstance(parts[0], list):
        return [x for p in parts for x in p]
    return pa.concat_arrays(parts)


def _empty(unlabelled: int, examples: list[str]) -> Samples:
    import pyarrow as pa

    none = np.empty(0, dtype=np.int64)
    return Samples([], pa.array([], pa.string()), none, pa.array([], pa.binary()), pa.array([], pa.string()),
                   np.empty(0, dtype=np.int8), none, none, pa.array([], pa.string()), none, none, [],
                   np.empty((0, 8), dtype=np.int64), unlabelled, examples)


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
        if isinstance(a, list):
            return [a[i] for i in order.tolist()]
        return a.take(pa.array(order))

    labels = take(c["label"])
    classes = sorted(pc.unique(labels).to_pylist())
    cls = pc.index_in(labels, value_set=pa.array(classes, pa.string())).to_numpy().astype(np.int64)
    return Samples(classes, take(c["key"]), cls, take(c["meta"]), take(c["image"]), take(c["image_ext"]),
                   take(c["image_size"]), take(c["image_mtime"]), take(c["text"]), take(c["text_size"]),
                   take(c["text_mtime"]), take(c["phash"]), take(c["pixels"]), unlabelled, examples)


def _unique_keys(keys):
    """Shard keys made unique: only keys shortened or made safe can collide; those are given a
    hash tail, in manifest-key order, as they always were."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pc.count_distinct(keys).as_py() == len(keys):
        return keys
    seen: set[str] = set()
    out = []
    for k in keys.to_pylist():
        while k in seen:
            k = shard_key(f"{k}-{hashlib.sha1(k.encode()).hexdigest()[:8]}")
        seen.add(k)
        out.append(k)
    return pa.array(out, pa.string())


def _groups(kept) -> Iterator[tuple[str, list[tuple]]]:
    """(manifest key, its rows as tuples in READ_COLUMNS order) for each key, in key order; the
    table is turned into Python values a batch at a time."""
    key_at = READ_COLUMNS.index(NAMES.key)
    current: str | None = None
    rows: list[tuple] = []
    for batch in kept.to_batches(ROW_BATCH):
        for r in zip(*(batch.column(name).to_pylist() for name in READ_COLUMNS)):
            if r[key_at] != current:
                if rows:
                    yield current, rows  # type: ignore[misc]
                current, rows = r[key_at], []
            rows.append(r)
    if rows:
        yield current, rows  # type: ignore[misc]


_SOURCE, _KEY, _KIND, _LABEL, _STATUS, _OUTPUT, _CAPTION, _WIDTH, _HEIGHT, _ENCODING, _CONFIDENCE, _PHASH = range(12)
_PIXELS = slice(12, 16)
_NO_FILE = (NONE, NONE)
NOT_RECORDED = (UNRECORDED,) * 8


def _sample(key: str, rows: list[tuple], clean_dir: Path, root: int, cols: _Columns) -> bool:
    """Add the sample of one manifest key to ``cols``; False when it has no label (left out)."""
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
        return False
    skey = shard_key(key)
    meta: dict[str, Any] = {"label": label, "sources": {}}
    if key != skey:
        meta["manifest_key"] = key
    image = text = None
    image_ext, image_stat, text_stat, phash = NONE, _NO_FILE, _NO_FILE, None
    pixels: tuple[int, ...] = NOT_RECORDED
    for r in images:
        image, image_stat = _checked_output(clean_dir, root, r[_OUTPUT], r[_SOURCE])
        ext = IMAGE_EXT.get(os.path.splitext(image)[1].lower())
        if ext is None:
            raise UsageError(f"{clean_dir / image}: not a .jpg, .png or .webp image")
        image_ext = IMAGE_EXTS.index(ext)
        phash = _phash(key, r[_PHASH])
        pixels = recorded_pixels(*r[_PIXELS])
        meta["sources"]["image"] = r[_SOURCE]
        meta["image"] = {"width": r[_WIDTH], "height": r[_HEIGHT]}
        if r[_CAPTION] and not texts:  # a caption from the labels file: no row of its own
            text, text_stat = _checked_output(clean_dir, root, r[_CAPTION], r[_SOURCE])
            meta["sources"]["text"] = f"{r[_SOURCE]} (labels file caption)"
    for r in texts:
        text, text_stat = _checked_output(clean_dir, root, r[_OUTPUT], r[_SOURCE])
        meta["sources"]["text"] = r[_SOURCE]
        meta["text"] = {"encoding": r[_ENCODING], "encoding_confidence": r[_CONFIDENCE]}
    cols.key.append(skey)
    cols.label.append(label)
    cols.meta.append(_META.encode(meta).encode("utf-8"))
    cols.image.append(image)
    cols.image_ext.append(image_ext)
    cols.image_stat.append(image_stat)
    cols.text.append(text)
    cols.text_stat.append(text_stat)
    cols.phash.append(phash)
    cols.pixels.append(pixels)
    return True


def _phash(key: str, value: str | None) -> int | None:
    if not value:
        return None
    try:
        h = int(value, 16)
    except ValueError:
        h = -1
    if not 0 <= h < 1 << 64:
        raise UsageError(f"manifest key {key!r} has a phash that is not 16 hex digits ({value!r}): is the manifest from pipe clean?")
    return h


def recorded_pixels(width: int | None, height: int | None, sums: list | None, squares: list | None) -> tuple[int, ...]:
    """The image's size and pixel sums as pipe clean recorded them (width, height, 3 sums, 3
    sums of squares), or UNRECORDED ones when the manifest has none (a pipe before these
    columns) or they are not plausible numbers (a hand-made manifest): then the image is
    decoded and measured, as it always was."""
    if width is None or height is None or width < 0 or height < 0 or sums is None or squares is None:
        return NOT_RECORDED
    if len(sums) != 3 or len(squares) != 3 or None in sums or None in squares or min(sums + squares) < 0:
        return NOT_RECORDED
    return (width, height, *sums, *squares)


def _checked_output(clean_dir: Path, root: int, rel: str | None, source: str) -> tuple[str, tuple[int, int]]:
    """The row's output path, if it is a file inside CLEAN_DIR, and its size and mtime_ns (the
    only stat of it in the run; relative to CLEAN_DIR's descriptor: no path joined per file)."""
    rel = rel or ""
    if not rel or ".." in rel.split("/") or rel.startswith("/"):
        raise UsageError(f"manifest row for {source!r} is kept but has no usable output path ({rel!r})")
    try:
        st = os.stat(rel, dir_fd=root)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{clean_dir / rel} is listed as kept in the manifest but is missing: was CLEAN_DIR changed? re-run pipe clean")
    return rel, (st.st_size, st.st_mtime_ns)
