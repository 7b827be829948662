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
    """Everything one shard's bytes are made of, its samples in order: for each, the shard key,
    class index, .json member, and the image and text files (paths relative to CLEAN_DIR, None
    when absent, with the size and mtime_ns they had at load: another size stops the write)."""

    name: str
    split: str
    keys: list[str]
    cls: list[int]
    meta: list[bytes]
    images: list[str | None]
    image_exts: list[str | None]
    image_sizes: list[int]
    image_mtimes: list[int]
    texts: list[str | None]
    text_sizes: list[int]
    text_mtimes: list[int]

    def __len__(self) -> int:
        return len(self.keys)

    def digest(self, clean_dir: Path, version: str) -> str:
        """sha256 of everything the shard's bytes follow from: pipe's version (the tar layout), the
        CLEAN_DIR, the shard's name and, per sample in order, its key, class, .json member and files
        (path, size and mtime, so a file pipe clean rewrote since counts as changed)."""
        h = hashlib.sha256(f"{version}\0{clean_dir.resolve()}\0{self.name}\n".encode())
        for strings in (self.keys, self.image_exts, self.images, self.texts):  # None as "\1"; no path holds a NUL
            raw = "\0".join(["\1" if x is None else x for x in strings]).encode("utf-8", "surrogatepass")
            h.update(len(raw).to_bytes(8, "little") + raw)
        numbers = [self.cls, self.image_sizes, self.image_mtimes, self.text_sizes, self.text_mtimes, [len(m) for m in self.meta]]
        h.update(np.array(numbers, dtype=np.int64).tobytes())
        for m in self.meta:
            h.update(m)
        return h.hexdigest()


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


def entry(samples, span: Span) -> ShardPlan:
    """The `ShardPlan` of one span of the plan, taken from the columns of `samples.Samples`."""
    import pyarrow as pa

    idx = span.samples
    at = pa.array(idx)
    exts = samples.image_ext[idx]
    return ShardPlan(
        span.name, span.split, samples.key.take(at).to_pylist(), samples.cls[idx].tolist(), samples.meta.take(at).to_pylist(),
        samples.image.take(at).to_pylist(), [IMAGE_EXTS[e] if e >= 0 else None for e in exts.tolist()],
        samples.image_size[idx].tolist(), samples.image_mtime[idx].tolist(),
        samples.text.take(at).to_pylist(), samples.text_size[idx].tolist(), samples.text_mtime[idx].tolist())
