"""The byte side of the streaming reader: a rank's samples, undecoded, in the plan's order.

No torch here (like `train/data/plan.py`), so the read path can be used, tested and benchmarked on
its own (`bench/loader.py` compares it with `cat`, `bench/stream.py` object storage with local
disk) without paying for torch's import. `train/data/reader.py`'s `ShardReader` is a
`SampleReader` that also decodes and collates.

A worker reads its piece of the epoch (from the plan) block by block. The samples it needs, each
a byte range at index.json's offsets, are merged into a few large reads (`train.data.ranges`:
adjacent samples of a shard in one read, up to the source's cap, never a whole shard for a few
samples), fetched from the folder's source (`train.data.sources`: local disk, object storage, a local
cache) a few ahead where the source is remote, retried while a failure looks transient. The tar
members are then parsed in place (`parse_samples`), each member's bytes a view into its read, and
each block is emitted in its seeded shuffle order.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.formats import tarstream
from pipeline.formats.sample import RawSample, split_name
from train.data import sources
from train.data.mix import Mix, Sources
from train.data.plan import Block, EpochPlan, Generation, batches_done, block_key, epoch_plan, worker_blocks, worker_spans
from train.data.ranges import DEFAULT_RETRY, Retry, SampleDecodeError, ShardReadError, Want, plan_reads, prefetched
from train.data.skips import BadSample, key_in_header
from train.data.sources import read_range

__all__ = ["SampleDecodeError", "SampleReader", "ShardReadError", "parse_samples", "read_samples", "read_span"]


@dataclass(frozen=True)
class Part:
    """Samples ``begin..end-1`` of split shard number ``shard``, as the bytes ``view`` (a slice of one read)."""

    shard: int
    begin: int
    end: int
    valid: bool
    view: memoryview


class SampleReader:
    """One rank's view of a split of a shard folder, as undecoded samples (see the module docstring).

    ``shard_dir``: a local folder or a URL (`pipeline.storage`); index.json is read from it.
    ``cache_dir``/``cache_max_bytes``: keep whole shards in a local folder, least recently used
    evicted past the cap (`train.data.sources.CachedSource`). ``source``: read the shards from
    this object instead (anything with `train.data.sources.LocalSource`'s methods). ``accum``:
    batches per optimizer step (the epoch is cut in whole global batches, `train.data.plan`).
    ``skip_bad``: a sample that cannot be read or parsed (a damaged header, a shard cut short)
    comes out as a `train.data.skips.BadSample` instead of ending the read (`SampleDecodeError`).
    ``dataset``: several SHARD_DIRs mixed by weight (`train.data.mix.Sources`; ``shard_dir`` is then
    only a name); ``only``: read just that source of it (its validation split, apart).
    """

    def __init__(self, shard_dir: str | os.PathLike, split: str = "train", rank: int = 0, world_size: int = 1,
                 batch_size: int = 32, seed: int = 0, shuffle_buffer: int = 512,
                 cache_dir: str | os.PathLike | None = None, cache_max_bytes: int | None = None, source=None,
                 retry: Retry = DEFAULT_RETRY, accum: int = 1, skip_bad: bool = False, dataset: Sources | None = None,
                 only: int | None = None):
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        from pipeline.storage import location

        self.shard_dir: str | Path = location(shard_dir if isinstance(shard_dir, Path) else os.fspath(shard_dir))
        self.split, self.rank, self.world_size = split, rank, world_size
        self.batch_size, self.seed, self.shuffle_buffer, self.accum = batch_size, seed, shuffle_buffer, accum
        self.retry, self.skip_bad = retry, skip_bad
        self.mix: Mix | None = None
        if dataset is not None:  # several SHARD_DIRs (`train.data.mix`): their merged index, one combined shard list
            self.index, self.fingerprint = dataset.index, dataset.fingerprint
            self.shards = dataset.shards(split, only)
            self.mix = dataset.mix(split) if split == "train" and only is None else None
            self.source = source if source is not None else dataset.open_source(cache_dir, cache_max_bytes)
        else:
            self.index, raw = sources.read_index(self.shard_dir)
            self.fingerprint = hashlib.sha256(raw).hexdigest()
            self.shards = [s for s in self.index["shards"] if s["split"] == split]
            self.source = source if source is not None else sources.open_source(
                self.shard_dir, cache_dir, cache_max_bytes,
                {s["name"]: (s["bytes"], s["sha256"]) for s in self.index["shards"]})
        self.counts = [s["count"] for s in self.shards]

    def plan(self, epoch: int) -> EpochPlan:
        """``epoch``'s plan for this layout: after the layouts it already ran in, if any (`history`)."""
        return epoch_plan(self.counts, self.world_size, self.batch_size, self.seed, epoch, train=self.split == "train",
                          accum=self.accum, history=self.history(epoch), mix=self.mix)

    def history(self, epoch: int) -> tuple[Generation, ...]:
        """The layouts ``epoch`` was read in before this one (a resume on another layout); none here."""
        return ()

    def samples(self, epoch: int, consumed: int = 0, worker: int = 0, workers: int = 1) -> Iterator[tuple[bool, RawSample]]:
        """(valid, undecoded sample) that dataloader worker ``worker`` of ``workers`` reads in
        ``epoch``, in order, once the rank consumed ``consumed`` samples (whole batches)."""
        for block, parts in self.parts(epoch, consumed, worker, workers):
            read = [(p.valid, s) for p in parts for s in self._parse(p)]
            for o in block.order:
                yield read[o]

    def _parse(self, p: Part) -> list[RawSample]:
        shard = self.shards[p.shard]
        try:
            return parse_samples(p.view, shard, p.begin, p.end)
        except SampleDecodeError:
            if not self.skip_bad:
                raise
            return parse_each(p.view, shard, p.begin, p.end)  # the damage confined to the samples it is in

    def reads(self, epoch: int, consumed: int = 0, worker: int = 0, workers: int = 1) -> Iterator[tuple[Block, list[memoryview]]]:
        """The byte path under `samples`: each block of the worker's piece with the bytes of its
        samples (views into the merged reads), in reading order, nothing parsed."""
        for block, parts in self.parts(epoch, consumed, worker, workers):
            yield block, [p.view for p in parts]

    def parts(self, epoch: int, consumed: int = 0, worker: int = 0, workers: int = 1) -> Iterator[tuple[Block, list[Part]]]:
        """Each block of the worker's piece with its samples' bytes, as runs of samples (`Part`)."""
        plan = self.plan(epoch)
        steps_done = consumed // self.batch_size
        # the DataLoader restarts its round-robin at worker 0 on resume: worker 0 takes the piece
        # whose turn comes next, so batches keep the order they had before the interruption
        logical = (worker + steps_done) % workers
        piece = worker_spans(plan.spans[self.rank], plan.steps, self.batch_size, workers)[logical]
        skip = batches_done(steps_done, logical, workers) * self.batch_size
        block = self.shuffle_buffer if self.split == "train" else 0
        blocks = worker_blocks(piece, block, (*block_key(self.seed, epoch, self.rank, plan.generation), logical), skip)
        try:
            yield from self._assemble(blocks)
        finally:
            self.source.close()

    def _assemble(self, blocks: Iterator[Block]) -> Iterator[tuple[Block, list[Part]]]:
        """Blocks with their parts, from the merged reads: a block is complete when the read
        holding its last sample arrives (reads come in the order their samples are needed)."""
        started: list[Block] = []  # blocks whose samples were handed to the planner, not yet emitted
        reads = plan_reads(self._wants(blocks, started), self.source.cap)
        parts: list[Part] = []
        done = 0  # blocks emitted
        # skipping bad samples, a shard cut short gives what it has; the samples past its end are bad
        for r, data in prefetched(self.source, reads, self.source.ahead, self.retry, exact=not self.skip_bad):
            view = memoryview(data)
            run: list[Want] = []
            for w in r.wants:
                if run and (w.tag[0] != run[0].tag[0] or w.tag[1] != run[0].tag[1]):
                    parts.append(self._part(started[run[0].tag[0] - done], run, view, r.start))
                    run = []
                run.append(w)
                if w.tag[4]:  # the block's last samples
                    parts.append(self._part(started[w.tag[0] - done], run, view, r.start))
                    run = []
                    yield started.pop(0), parts
                    done += 1
                    parts = []
            if run:
                parts.append(self._part(started[run[0].tag[0] - done], run, view, r.start))

    def _wants(self, blocks: Iterator[Block], started: list[Block]) -> Iterator[Want]:
        """The samples of every block, in reading order, as byte ranges: runs of adjacent samples
        up to the source's cap (`sample_runs`: the work is per run, not per sample); tag (block
        number, segment number, first sample, end sample, last run of its block)."""
        cap = self.source.cap
        for j, b in enumerate(blocks):
            started.append(b)
            last_seg = len(b.segments) - 1
            for k, seg in enumerate(b.segments):
                shard = self.shards[seg.shard]
                name, offsets = shard["name"], shard["offsets"]
                for i, e, start, stop in sample_runs(offsets, _end(shard), seg.begin, seg.end, cap):
                    yield Want(name, start, stop - start, (j, k, i, e, k == last_seg and e == seg.end))

    def _part(self, block: Block, run: list[Want], view: memoryview, read_start: int) -> Part:
        seg = block.segments[run[0].tag[1]]
        first, last = run[0], run[-1]
        return Part(seg.shard, first.tag[2], last.tag[3], seg.valid,
                    view[first.start - read_start : last.start + last.length - read_start])


def sample_runs(offsets: list[int], end: int, begin: int, stop: int, cap: int) -> Iterator[tuple[int, int, int, int]]:
    """Samples ``begin..stop-1`` of a shard (sample i spans ``offsets[i]`` to the next offset, the
    last one to ``end``) as runs (first, end sample, first byte, end byte) of at most ``cap``
    bytes each, a single sample where one is larger; found by bisection, not sample by sample."""
    count = len(offsets)

    def boundary(x: int) -> int:
        return offsets[x] if x < count else end

    i = begin
    while i < stop:
        top = min(stop, count - 1)  # candidate ends below the last sample are offsets
        e = bisect.bisect_right(offsets, offsets[i] + cap, i + 1, top + 1) - 1
        if stop == count and e == count - 1 and end - offsets[i] <= cap:
            e = count
        e = min(max(e, i + 1), stop)
        yield i, e, offsets[i], boundary(e)
        i = e


def _end(shard: dict) -> int:
    """Where the shard's last sample ends: before tar's end-of-archive blocks."""
    return shard["bytes"] - len(tarstream.END_OF_ARCHIVE)


def read_samples(f, shard: dict, begin: int, end: int) -> list[RawSample]:
    """Samples ``begin..end-1`` of one shard (an index.json entry) with one read; their fields
    are memoryviews into that read (no copy per member)."""
    return parse_samples(read_span(f, shard, begin, end), shard, begin, end)


def read_span(f, shard: dict, begin: int, end: int) -> memoryview:
    """The bytes of samples ``begin..end-1`` of one shard, from index.json's offsets."""
    offsets = shard["offsets"]
    start = offsets[begin]
    stop = offsets[end] if end < shard["count"] else _end(shard)
    try:
        view = read_range(f.fileno(), start, stop - start)
    except OSError as e:
        raise SampleDecodeError(f"{shard['name']}: cannot read bytes {start}-{stop}: {e}") from None
    if len(view) != stop - start:
        raise SampleDecodeError(f"{shard['name']}: the file is shorter than index.json says (wanted bytes {start}-{stop})")
    return view


def parse_each(view: memoryview, shard: dict, begin: int, end: int) -> list[RawSample]:
    """`parse_samples`, one sample at a time at index.json's offsets: a sample that does not parse
    (or that the bytes end before: a shard cut short) becomes a `BadSample`, the others are read."""
    offsets, name, count = shard["offsets"], shard["name"], shard["count"]
    base = offsets[begin]
    out: list[RawSample] = []
    for i in range(begin, end):
        lo, hi = offsets[i] - base, (offsets[i + 1] if i + 1 < count else _end(shard)) - base
        piece = view[lo:hi]
        if len(piece) < hi - lo:
            out.append(BadSample(key_in_header(piece, offsets[i]), {}, name, offsets[i],
                                 reason=f"the shard is cut short: it ends at byte {base + len(view)}, before this "
                                        f"sample's end at byte {base + hi} (index.json: {shard['bytes']} bytes)"))
            continue
        try:
            out.extend(parse_samples(piece, shard, i, i + 1))
        except SampleDecodeError as e:
            out.append(BadSample(key_in_header(piece, offsets[i]), {}, name, offsets[i],
                                 reason=str(e).removeprefix(f"{name}: ")))
    return out


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
