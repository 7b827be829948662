"""Who reads which samples, in which order: the pure planning behind the streaming reader.

No I/O and no torch here, so every guarantee is a property test over random shard sizes, world
sizes, worker counts and batch sizes (tests/train/data/test_plan.py).

An epoch of the train split (`epoch_plan`):

1. The shards are put in an order drawn from (seed, epoch), and the sequence starts at a sample
   that moves every epoch (a golden-ratio stride through the dataset), so each rank sees other
   shards and other neighbours every epoch.
2. ``N mod (world x batch)`` samples cannot fill a step on every rank and are left out. They are
   a window in the *stored* order that advances by its own length each epoch: never the same
   samples two epochs running, and over the epochs every sample is left out equally often.
3. The rest is cut into ``world`` equal contiguous spans of ``steps x batch`` samples (so every
   rank runs the same number of steps: no DDP hang), and each span into one contiguous piece per
   dataloader worker, a whole number of batches each (`worker_spans`).

The validation split (`epoch_plan(..., train=False)`) is read whole, in stored order; the last
batches are topped up with repeats marked ``valid=False`` so every rank still has equal steps.

A worker reads its piece front to back in blocks of ``shuffle_buffer`` samples and emits each
block in a seeded random order (`worker_blocks`): a bounded shuffle buffer that can also skip
straight to any point, which is what makes resume from (epoch, consumed) exact and cheap. A
DataLoader takes batches from its workers round-robin, so after ``k`` steps worker ``w`` has
delivered ``k // W + (w < k % W)`` batches (`batches_done`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pipeline.core.rng import rng_for

GOLDEN = 0.6180339887498949


@dataclass(frozen=True)
class Segment:
    """Samples ``begin..end-1`` of shard number ``shard`` (its position in the split's list)."""

    shard: int
    begin: int
    end: int
    valid: bool = True  # False: a repeat that only tops up the last batches (validation)

    def __len__(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class EpochPlan:
    epoch: int
    world: int
    batch: int
    steps: int  # per rank, the same on every rank
    spans: tuple[tuple[Segment, ...], ...]  # per rank: steps x batch samples, in reading order
    dropped: tuple[tuple[int, int], ...]  # (shard, index) of the train samples left out this epoch


def rng(seed: int, *stream: int) -> np.random.Generator:
    """`rng_for`, with the seed folded to 63 bits as the plan always has (a seed of 2**63 or more
    gives the order it gave before)."""
    return rng_for(seed & (2**63 - 1), *stream)


def _locate(cum: list[int], g: int) -> tuple[int, int]:
    """Global stored-order position -> (shard, index in shard)."""
    s = int(np.searchsorted(cum, g, side="right")) - 1
    return s, g - cum[s]


def _window(counts: list[int], cum: list[int], start: int, length: int) -> dict[int, list[tuple[int, int]]]:
    """The stored-order window [start, start+length) (cyclic), as intervals per shard."""
    total = cum[-1]
    out: dict[int, list[tuple[int, int]]] = {}
    pos, left = start % total if total else 0, length
    while left > 0:
        s, i = _locate(cum, pos)
        take = min(left, counts[s] - i)
        out.setdefault(s, []).append((i, i + take))
        left -= take
        pos = (pos + take) % total
    return out


def _subtract(seg: Segment, holes: list[tuple[int, int]]) -> list[Segment]:
    pieces, at = [], seg.begin
    for b, e in sorted(holes):
        b, e = max(b, seg.begin), min(e, seg.end)
        if b >= e:
            continue
        if b > at:
            pieces.append(Segment(seg.shard, at, b, seg.valid))
        at = max(at, e)
    if at < seg.end:
        pieces.append(Segment(seg.shard, at, seg.end, seg.valid))
    return pieces


def cut(segments: list[Segment], lengths: list[int]) -> list[tuple[Segment, ...]]:
    """Cut a sequence of segments into consecutive pieces of the given lengths (in samples)."""
    out, it, current = [], iter(segments), None
    for n in lengths:
        piece = []
        while n > 0:
            if current is None or len(current) == 0:
                current = next(it)
                continue
            take = min(n, len(current))
            piece.append(Segment(current.shard, current.begin, current.begin + take, current.valid))
            current = Segment(current.shard, current.begin + take, current.end, current.valid)
            n -= take
        out.append(tuple(piece))
    return out


def epoch_plan(counts: list[int], world: int, batch: int, seed: int, epoch: int, train: bool = True) -> EpochPlan:
    """The whole epoch's assignment of samples to ranks (see the module docstring)."""
    if world < 1 or batch < 1:
        raise ValueError(f"world size and batch size must be at least 1, got {world} and {batch}")
    counts = [int(c) for c in counts]
    cum = [0, *np.cumsum(counts).tolist()]
    total = cum[-1]
    per_step = world * batch
    if not train:
        return _eval_plan(counts, world, batch, epoch, total)
    steps = total // per_step
    if steps == 0:
        raise ValueError(f"{total} train samples cannot fill one step of {world} ranks x batch {batch}; "
                         "use a smaller --batch-size or fewer ranks")
    drop = total - steps * per_step
    holes = _window(counts, cum, int(rng(seed, 1).integers(total)) + epoch * drop, drop) if drop else {}
    stride = max(1, int(total * GOLDEN + 0.5)) if total > 1 else 0
    first = (int(rng(seed, 2).integers(total)) + epoch * stride) % total
    start_shard, start_at = _locate(cum, first)
    order = [int(s) for s in rng(seed, 3, epoch).permutation(len(counts)) if counts[int(s)] > 0]
    k = order.index(start_shard)
    sequence = [Segment(start_shard, start_at, counts[start_shard])]
    sequence += [Segment(s, 0, counts[s]) for s in order[k + 1 :] + order[:k]]
    sequence.append(Segment(start_shard, 0, start_at))
    kept = [piece for seg in sequence if len(seg) for piece in _subtract(seg, holes.get(seg.shard, []))]
    spans = cut(kept, [steps * batch] * world)
    dropped = tuple((s, i) for s, ranges in sorted(holes.items()) for b, e in ranges for i in range(b, e))
    return EpochPlan(epoch, world, batch, steps, tuple(spans), dropped)


def _eval_plan(counts: list[int], world: int, batch: int, epoch: int, total: int) -> EpochPlan:
    per_step = world * batch
    steps = -(-total // per_step)
    sequence = [Segment(s, 0, c) for s, c in enumerate(counts) if c]
    pad = steps * per_step - total
    while pad > 0:  # repeats of the first samples, marked invalid, top up the last batches
        for s, c in enumerate(counts):
            if pad == 0:
                break
            take = min(pad, c)
            if take:
                sequence.append(Segment(s, 0, take, valid=False))
                pad -= take
    spans = cut(sequence, [steps * batch] * world)
    return EpochPlan(epoch, world, batch, steps, tuple(spans), ())


def worker_spans(span: tuple[Segment, ...], steps: int, batch: int, workers: int) -> list[tuple[Segment, ...]]:
    """A rank's span cut into one contiguous piece per worker, a whole number of batches each;
    the first ``steps % W`` workers get one batch more (the DataLoader's round-robin order)."""
    w = max(1, workers)
    return cut(list(span), [(steps // w + (i < steps % w)) * batch for i in range(w)])


def batches_done(steps_done: int, worker: int, workers: int) -> int:
    """Batches worker ``worker`` delivered once the rank consumed ``steps_done`` batches."""
    w = max(1, workers)
    return steps_done // w + (worker < steps_done % w)


@dataclass(frozen=True)
class Block:
    """One read: these segments front to back, then the samples emitted in ``order``."""

    segments: tuple[Segment, ...]
    order: tuple[int, ...]  # positions within the block, in emission order (maybe cut by a resume)


def worker_blocks(piece: tuple[Segment, ...], block: int, key: tuple[int, ...], skip: int = 0) -> Iterator[Block]:
    """A worker's reads, in order, after skipping the first ``skip`` samples it would emit.

    ``block`` <= 1 means no shuffling (stored order). Whole blocks before ``skip`` are not read.
    """
    size = max(1, block)
    total = sum(len(s) for s in piece)
    lengths = [min(size, total - b) for b in range(0, total, size)]
    first = skip // size
    rest = skip - first * size
    blocks = cut(list(piece), lengths)
    for j in range(first, len(blocks)):
        n = lengths[j]
        order = rng(*key, j).permutation(n).tolist() if size > 1 else list(range(n))
        if j == first and rest:
            order = order[rest:]
        yield Block(blocks[j], tuple(order))


def rank_stream(plan: EpochPlan, rank: int, workers: int, block: int, key: tuple[int, ...],
                consumed: int = 0) -> list[tuple[int, int, bool]]:
    """The (shard, index, valid) this rank consumes, in order, from ``consumed`` samples on:
    exactly what `train.data.reader.ShardReader` under a DataLoader yields (a simulation for tests)."""
    if consumed % plan.batch:
        raise ValueError(f"consumed={consumed} is not a whole number of batches of {plan.batch}")
    steps_done = consumed // plan.batch
    w = max(1, workers)
    streams = []
    for i, piece in enumerate(worker_spans(plan.spans[rank], plan.steps, plan.batch, w)):
        skip = batches_done(steps_done, i, w) * plan.batch
        samples: list[tuple[int, int, bool]] = []
        for b in worker_blocks(piece, block, (*key, i), skip):
            flat = [(seg.shard, seg.begin + k, seg.valid) for seg in b.segments for k in range(len(seg))]
            samples.extend(flat[o] for o in b.order)
        streams.append(iter(samples))
    out: list[tuple[int, int, bool]] = []
    for t in range(steps_done, plan.steps):
        out.extend(next(streams[t % w]) for _ in range(plan.batch))
    return out
