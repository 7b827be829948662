"""Which samples go into which shard, in which order: a pure function of the samples and the settings.

Each split is shuffled with its own seeded stream, then cut into shards by `--max-count` and
`--max-size` (bytes on disk, tar headers, padding and the end-of-archive blocks counted; only a
single sample larger than the limit makes a shard larger). Train comes first. The plan is a few
arrays (sample indices and where they are cut), never an object per sample; `entry` turns one
shard of it into a `ShardPlan`, a self-contained description of that shard that
`pipeline.shard.write.write_shard` writes with no other state (so a worker process or a Ray
task can write it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.rng import rng_for
from pipeline.formats.sample import IMAGE_EXTS
from pipeline.formats.tarstream import END_OF_ARCHIVE

SPLITS = ("train", "val")


@dataclass(frozen=True)
class Span:
    """One shard of the plan: its file name, split, and its samples (indices, in shard order)."""

    name: str
    split: str
    samples: np.ndarray


@dataclass
class ShardPlan:
    """Everything one shard's bytes are made of, its samples in order, as columns (Arrow strings
    and binaries, numpy numbers: no object per sample): for each, the shard key, class index,
    .json member, and the image and text files (paths relative to CLEAN_DIR, null when absent,
    with the size and mtime_ns they had at load: another size stops the write)."""

    name: str
    split: str
    keys: Any  # pyarrow string array
    cls: np.ndarray  # int64
    meta: Any  # pyarrow binary array: each sample's .json member
    images: Any  # pyarrow string array, null without an image
    image_exts: np.ndarray  # int8: index into IMAGE_EXTS, -1 without an image
    image_sizes: np.ndarray  # int64
    image_mtimes: np.ndarray
    texts: Any  # pyarrow string array, null without a text
    text_sizes: np.ndarray
    text_mtimes: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    def digest(self, clean_dir: Path | str, version: str) -> str:
        """sha256 of everything the shard's bytes follow from: pipe's version (the tar layout), the
        CLEAN_DIR, the shard's name and, per sample in order, its key, class, .json member and files
        (path, size and mtime, so a file pipe clean rewrote since counts as changed). CLEAN_DIR as a
        path (resolved) or as its folder's identity (`Folder.identity`: the same text). Hashed from
        the columns' buffers, the bytes as they always were: each string column joined with NULs
        (null as "\1"; no path holds a NUL) after its length, the numbers as int64 rows, the
        .json members one after another."""
        import pyarrow as pa

        where = clean_dir.resolve() if isinstance(clean_dir, Path) else clean_dir
        h = hashlib.sha256(f"{version}\0{where}\0{self.name}\n".encode())
        exts = pa.array(IMAGE_EXTS, pa.string()).take(pa.array(self.image_exts, mask=self.image_exts < 0))
        for strings in (self.keys, exts, self.images, self.texts):
            raw = _joined(strings)
            h.update(len(raw).to_bytes(8, "little") + raw)
        meta_at, meta = values(self.meta)
        numbers = [self.cls, self.image_sizes, self.image_mtimes, self.text_sizes, self.text_mtimes, np.diff(meta_at)]
        h.update(np.array(numbers, dtype=np.int64).reshape(len(numbers), len(self)).tobytes())
        h.update(meta.tobytes())
        return h.hexdigest()


def values(arr) -> tuple[np.ndarray, np.ndarray]:
    """A string or binary Arrow array's value offsets (int64, n + 1, from 0) and its values'
    bytes (uint8, one after another), read from its buffers: no Python object per value. Null
    values read as empty (fill them first where they mean something)."""
    import pyarrow as pa

    n = len(arr)
    if arr.null_count:
        arr = _nulls_empty(arr)
    _, offsets_buf, data_buf = arr.buffers()[:3]
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    kind = np.dtype(np.int64 if wide else np.int32)
    if offsets_buf is None or n == 0:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.uint8)
    offsets = np.frombuffer(offsets_buf, dtype=kind, count=n + 1, offset=arr.offset * kind.itemsize).astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, dtype=np.uint8)
    return offsets - offsets[0], data[offsets[0] : offsets[-1]]


def _nulls_empty(arr):
    """``arr`` with its nulls made empty values (the format lets a null slot span bytes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    empty = b"" if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type) else ""
    return pc.fill_null(arr, pa.scalar(empty, arr.type))


def _joined(strings) -> bytes:
    """A string column's values joined with NULs, a null as "\1": what the digest hashes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if strings.null_count:
        strings = pc.fill_null(strings, pa.scalar("\1", strings.type))
    at, data = values(strings)
    if len(at) <= 2:
        return data.tobytes()
    return np.insert(data, at[1:-1], 0).tobytes()


def make_plan(tar_bytes: np.ndarray, is_val: np.ndarray, seed: int, max_count: int, max_size: int) -> list[Span]:
    """Every shard, train first: each split's samples (in canonical order) shuffled with its own
    seeded stream, then cut by ``max_count`` samples and ``max_size`` bytes. Deterministic."""
    spans = []
    for stream, split in enumerate(SPLITS, start=2):
        part = np.flatnonzero(is_val == (split == "val"))
        part = part[rng_for(seed, stream).permutation(len(part))]
        for n, (b, e) in enumerate(pack(tar_bytes[part], max_count, max_size)):
            spans.append(Span(f"{split}-{n:06d}.tar", split, part[b:e]))
    return spans


def pack(sizes: np.ndarray, max_count: int, max_size: int) -> list[tuple[int, int]]:
    """Cut a sequence of sample sizes into [begin, end) runs: at most max_count samples and
    max_size bytes each (the end-of-archive blocks counted), unless one sample alone is larger.
    Each run is the longest that fits, found by bisection on the running total."""
    ends = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))  # ends[i]: bytes of samples [0, i)
    runs, begin, n = [], 0, len(sizes)
    room = max_size - len(END_OF_ARCHIVE)
    while begin < n:
        fit = int(np.searchsorted(ends, ends[begin] + room, side="right")) - 1  # the most samples whose bytes fit
        end = max(begin + 1, min(fit, begin + max_count, n))
        runs.append((begin, end))
        begin = end
    return runs


GROUP_FIELD = '"group":"'  # the .json member's first key, where it has one (keys sorted: before "image")


def _grouped(samples, idx: np.ndarray) -> np.ndarray:
    """Which of the samples ``idx`` record their near-duplicate group: image-caption pairs in a
    group of two or more. A contrastive loss must not take such a pair's near copies for its
    negatives, and it can see only what the shard holds; a classifier needs none of it, so a
    dataset of images with labels keeps the bytes it always had."""
    group = samples.group
    if group is None:
        return np.zeros(len(idx), dtype=bool)
    return (group[idx] >= 0) & (samples.image_ext[idx] >= 0) & (samples.text_size[idx] >= 0)


def group_prefix_sizes(samples) -> np.ndarray:
    """Bytes `entry` adds to each sample's .json member: ``"group":"KEY",`` where it records one
    (KEY: the shard key of the group's first sample, in key order)."""
    import pyarrow.compute as pc

    everyone = np.arange(len(samples))
    out = np.zeros(len(samples), dtype=np.int64)
    grouped = np.flatnonzero(_grouped(samples, everyone))
    if len(grouped):
        import pyarrow as pa

        first = samples.group[grouped]
        out[grouped] = len(GROUP_FIELD) + 2 + pc.binary_length(samples.key.take(pa.array(first))).to_numpy()
    return out


def _with_groups(samples, idx: np.ndarray, meta):
    """The .json members of samples ``idx`` with ``"group":"KEY"`` first where `_grouped` says."""
    import pyarrow as pa

    mask = _grouped(samples, idx)
    if not mask.any():
        return meta
    at = np.flatnonzero(mask)
    firsts = samples.key.take(pa.array(samples.group[idx[at]])).to_pylist()
    # the few samples that record a group, one by one (Arrow's binary_slice failed on taken arrays)
    values = meta.to_pylist()
    for i, first in zip(at.tolist(), firsts):
        values[i] = b"{" + GROUP_FIELD.encode() + first.encode() + b'",' + values[i][1:]
    return pa.array(values, pa.binary())


def entry(samples, span: Span) -> ShardPlan:
    """The `ShardPlan` of one span of the plan, taken from the columns of `samples.Samples`."""
    import pyarrow as pa

    idx = span.samples
    at = pa.array(idx)

    def take(name: str, kind=None):
        # a column at a time, its pages let go at once where the columns are kept on disk
        # (`spill.py`): a shard's random samples touch a page each, of every column
        column = getattr(samples, name)
        out = column[idx] if isinstance(column, np.ndarray) else column.take(at).cast(kind)
        samples.release_pages(name)
        return out

    meta = _with_groups(samples, idx, take("meta", pa.binary()))
    return ShardPlan(span.name, span.split, take("key", pa.string()), samples.cls[idx], meta,
                     take("image", pa.string()), samples.image_ext[idx], samples.image_size[idx], take("image_mtime"),
                     take("text", pa.string()), samples.text_size[idx], take("text_mtime"))
