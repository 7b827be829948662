"""The byte side of the streaming reader: a rank's samples, undecoded, in the plan's order.

No torch here (like `train/data/plan.py`), so the read path can be used, tested and benchmarked on
its own (`bench/loader.py` compares it with `cat`) without paying for torch's import.
`train/data/reader.py`'s `ShardReader` is a `SampleReader` that also decodes and collates.

A worker reads its piece of the epoch (from the plan) block by block (`SampleReader.reads`):
one read per contiguous run of samples in a shard, from index.json's offsets (never a whole
shard for a few samples). The read maps the bytes from the page cache rather than copying
them (`read_range`); the tar members are then parsed in place (`parse_samples`), each member's
bytes a view into the read, and the block is emitted in its seeded shuffle order.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from pipeline.formats import index as shard_index
from pipeline.formats import tarstream
from pipeline.formats.sample import RawSample, split_name
from train.data.plan import Block, EpochPlan, Segment, batches_done, epoch_plan, worker_blocks, worker_spans

ALIGN = 64  # bytes: where buffers of large plain reads start (a cache line)
MAP_FROM = 4 << 20  # bytes: ranges this large are mapped, smaller ones read (measured crossover)
_CAN_MAP = hasattr(mmap, "MAP_SHARED")  # POSIX
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: read and map every page at once


class SampleDecodeError(RuntimeError):
    """A sample in a shard could not be read or decoded; the message names the shard and key."""


class SampleReader:
    """One rank's view of a split of a shard folder, as undecoded samples (see the module docstring)."""

    def __init__(self, shard_dir: str | os.PathLike, split: str = "train", rank: int = 0, world_size: int = 1,
                 batch_size: int = 32, seed: int = 0, shuffle_buffer: int = 512):
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.shard_dir = Path(shard_dir)
        self.index = shard_index.load(self.shard_dir)
        self.split, self.rank, self.world_size = split, rank, world_size
        self.batch_size, self.seed, self.shuffle_buffer = batch_size, seed, shuffle_buffer
        self.shards = [s for s in self.index["shards"] if s["split"] == split]
        self.counts = [s["count"] for s in self.shards]

    def plan(self, epoch: int) -> EpochPlan:
        return epoch_plan(self.counts, self.world_size, self.batch_size, self.seed, epoch, train=self.split == "train")

    def samples(self, epoch: int, consumed: int = 0, worker: int = 0, workers: int = 1) -> Iterator[tuple[bool, RawSample]]:
        """(valid, undecoded sample) that dataloader worker ``worker`` of ``workers`` reads in
        ``epoch``, in order, once the rank consumed ``consumed`` samples (whole batches)."""
        for block, views in self.reads(epoch, consumed, worker, workers):
            read = [(seg.valid, s) for seg, view in zip(block.segments, views)
                    for s in parse_samples(view, self.shards[seg.shard], seg.begin, seg.end)]
            for o in block.order:
                yield read[o]

    def reads(self, epoch: int, consumed: int = 0, worker: int = 0, workers: int = 1) -> Iterator[tuple[Block, list[memoryview]]]:
        """The byte path under `samples`: each block of the worker's piece with the bytes of its
        segments (one read each), in reading order, nothing parsed."""
        plan = self.plan(epoch)
        steps_done = consumed // self.batch_size
        # the DataLoader restarts its round-robin at worker 0 on resume: worker 0 takes the piece
        # whose turn comes next, so batches keep the order they had before the interruption
        logical = (worker + steps_done) % workers
        piece = worker_spans(plan.spans[self.rank], plan.steps, self.batch_size, workers)[logical]
        skip = batches_done(steps_done, logical, workers) * self.batch_size
        block = self.shuffle_buffer if self.split == "train" else 0
        files: dict[int, BinaryIO] = {}
        try:
            for b in worker_blocks(piece, block, (self.seed, epoch, self.rank, logical), skip):
                yield b, [self._read_segment(seg, files) for seg in b.segments]
        finally:
            for f in files.values():
                f.close()

    def _read_segment(self, seg: Segment, files: dict[int, BinaryIO]) -> memoryview:
        f = files.get(seg.shard)
        if f is None:
            f = files[seg.shard] = open(self.shard_dir / self.shards[seg.shard]["name"], "rb", buffering=0)
        return read_span(f, self.shards[seg.shard], seg.begin, seg.end)


def read_samples(f, shard: dict, begin: int, end: int) -> list[RawSample]:
    """Samples ``begin..end-1`` of one shard (an index.json entry) with one read; their fields
    are memoryviews into that read (no copy per member)."""
    return parse_samples(read_span(f, shard, begin, end), shard, begin, end)


def read_span(f, shard: dict, begin: int, end: int) -> memoryview:
    """The bytes of samples ``begin..end-1`` of one shard, from index.json's offsets."""
    offsets = shard["offsets"]
    start = offsets[begin]
    stop = offsets[end] if end < shard["count"] else shard["bytes"] - len(tarstream.END_OF_ARCHIVE)
    try:
        view = read_range(f.fileno(), start, stop - start)
    except OSError as e:
        raise SampleDecodeError(f"{shard['name']}: cannot read bytes {start}-{stop}: {e}") from None
    if len(view) != stop - start:
        raise SampleDecodeError(f"{shard['name']}: the file is shorter than index.json says (wanted bytes {start}-{stop})")
    return view


def parse_samples(view: memoryview, shard: dict, begin: int, end: int) -> list[RawSample]:
    """The samples in ``view`` (the bytes of samples ``begin..end-1``, as `read_span` gives them),
    checked against index.json's offsets."""
    name, start = shard["name"], shard["offsets"][begin]
    samples: list[RawSample] = []
    last = None
    try:
        for member, at, size in tarstream.members(view):
            key, ext = split_name(member)
            if last is None or key != last.key:
                last = RawSample(key, {}, name, start + at)
                samples.append(last)
            last.fields[ext] = view[at + tarstream.BLOCK : at + tarstream.BLOCK + size]
    except (tarstream.TarFormatError, ValueError) as e:
        raise SampleDecodeError(f"{name}: damaged at samples {begin}-{end - 1}: {e}") from None
    if [s.offset for s in samples] != shard["offsets"][begin:end]:
        raise SampleDecodeError(f"{name}: samples {begin}-{end - 1} do not match index.json's offsets "
                                "(the shard was changed after pipe shard wrote it)")
    return samples


def read_range(fd: int, offset: int, n: int) -> memoryview:
    """Up to ``n`` bytes of the file at ``offset`` (fewer only where the file ends), as a view.

    A large range (a block of samples) is mapped from the page cache where the file system
    allows it: no copy (a read into fresh memory costs about twice the kernel time of `cat`,
    whose small buffer stays in the CPU cache), and every page is brought in and mapped now
    (MAP_POPULATE), so the bytes are read here, not on first touch. A small range (one
    validation sample, a block of short texts) is read plainly: below a few MiB setting up and
    tearing down a mapping costs more than the copy. So is any range where mapping fails
    (some network and FUSE file systems).
    """
    if n < MAP_FROM:
        return memoryview(os.pread(fd, n, offset))
    n = max(0, min(n, os.fstat(fd).st_size - offset))  # never map past the end: touching that is SIGBUS
    if n and _CAN_MAP:
        base = offset - offset % mmap.ALLOCATIONGRANULARITY
        try:
            mapped = mmap.mmap(fd, offset - base + n, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ, offset=base)
        except (OSError, ValueError):
            pass
        else:
            return memoryview(mapped)[offset - base : offset - base + n]
    return read_aligned(fd, offset, n)


def read_aligned(fd: int, offset: int, n: int) -> memoryview:
    """Up to ``n`` bytes at ``offset`` read into fresh, 64-byte aligned memory.

    Not `os.pread`: the kernel copies into a `bytes` object's buffer at whatever address malloc
    gave, measured up to twice as slow for some alignments, and its fresh 4 KiB pages fault one
    by one; numpy aligns large arrays better and asks for huge pages where the kernel has them.
    """
    raw = np.empty(n + ALIGN, dtype=np.uint8)
    skip = -raw.ctypes.data % ALIGN
    view = raw.data[skip : skip + n]  # the array's own memoryview
    got = 0
    while got < n:
        k = os.preadv(fd, [view[got:]], offset + got)
        if k == 0:
            break
        got += k
    return view[:got]
