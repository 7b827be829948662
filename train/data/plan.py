"""Who reads which samples, in which order: the pure planning behind the streaming reader.

No I/O and no torch here, so every guarantee is a property test over random shard sizes, world
sizes, worker counts and batch sizes (tests/train/data/test_plan.py).

An epoch of the train split (`epoch_plan`):

1. The shards are put in an order drawn from (seed, epoch), and the sequence starts at a sample
   that moves every epoch (a golden-ratio stride through the dataset), so each rank sees other
   shards and other neighbours every epoch.
2. ``N mod (world x batch x accum)`` samples cannot fill an optimizer step and are left out. They are
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

With gradient accumulation an optimizer step is ``accum`` batches on every rank: the epoch is then
cut in whole *global* batches (``world x batch x accum`` samples, which `pipe train --resume`
keeps fixed), so the samples an epoch trains on do not depend on how the global batch is split.

Resume on another layout (`Generation`). A mid-epoch position "``k`` batches done" names other
samples in another layout (world size, per-rank batch, workers, shuffle buffer), so the epoch's
remaining samples are worked out from the layout they were planned in (`unread`: every
worker's piece after the batches it delivered, the partly read block's rest in stored order) and
cut afresh for the new one: spans per rank, pieces per worker, blocks, exactly as a fresh epoch.
An epoch can go through any number of such generations (a run resumed on 2, then 3, then 1
ranks): the samples trained in the epoch are still each exactly once, every rank of a
generation runs the same number of steps, and reads stay runs of a shard front to back. The next
epoch is planned for the layout alone, as a run started on it would plan it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipeline.core.rng import rng_for

GOLDEN = 0.6180339887498949
GENERATION_STREAM = 1 << 40  # keeps a later generation's shuffle keys apart from the first's


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
    steps: int  # per rank, the same on every rank (in this generation: what is left of the epoch)
    spans: tuple[tuple[Segment, ...], ...]  # per rank: steps x batch samples, in reading order
    dropped: tuple[tuple[int, int], ...]  # (shard, index) of the train samples left out this epoch
    generation: int = 0  # layouts the epoch went through before this one (`Generation`)


@dataclass(frozen=True)
class Generation:
    """A layout part of an epoch was read in, and how far: ``consumed`` samples per rank (whole
    batches) from the start of that generation. ``workers`` 0 reads as 1 (the rank itself);
    ``block`` is the shuffle buffer."""

    world: int
    batch: int
    workers: int
    block: int
    consumed: int

    def as_dict(self) -> dict:
        return {"world": self.world, "batch": self.batch, "workers": self.workers, "block": self.block,
                "consumed": self.consumed}


def block_key(seed: int, epoch: int, rank: int, generation: int = 0) -> tuple[int, ...]:
    """The shuffle key of a rank's blocks (`worker_blocks` appends the worker and block numbers).
    Generation 0 keeps the key every run had; a later generation draws other orders."""
    return (seed, epoch, rank) if generation == 0 else (seed, epoch, rank, GENERATION_STREAM, generation)


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


class Mixed(Protocol):
    """Several sources in one epoch (`train.data.mix.Mix`): what the epoch reads, in order."""

    def epoch_size(self, counts: list[int], per_step: int) -> int: ...
    def sequence(self, counts: list[int], per_step: int, seed: int, epoch: int) -> list[Segment]: ...


def epoch_plan(counts: list[int], world: int, batch: int, seed: int, epoch: int, train: bool = True,
               accum: int = 1, history: tuple[Generation, ...] = (), mix: Mixed | None = None) -> EpochPlan:
    """The whole epoch's assignment of samples to ranks (see the module docstring); with
    ``history`` (the layouts this epoch already ran in, `Generation`), the assignment of the
    samples those left unread, to this layout. With ``mix`` the epoch's sequence is the mix's
    (several sources by weight, nothing left out: `train.data.mix`), cut the same way."""
    if world < 1 or batch < 1 or accum < 1:
        raise ValueError(f"world size, batch size and accumulation must be at least 1, got {world}, {batch} and {accum}")
    counts = [int(c) for c in counts]
    cum = [0, *np.cumsum(counts).tolist()]
    total = cum[-1]
    if not train:
        return _eval_plan(counts, world, batch, epoch, total)
    per_step = world * batch * accum
    size = mix.epoch_size(counts, per_step) if mix is not None else total
    if size < per_step or total == 0:
        step = f"{world} ranks x batch {batch}" + (f" x accumulation {accum}" if accum > 1 else "")
        what = "train samples" if mix is None else "samples per epoch of the mix"
        raise ValueError(f"{size} {what} cannot fill one step of {step}; "
                         "use a smaller --batch-size or fewer ranks")
    if mix is not None:
        return layout(mix.sequence(counts, per_step, seed, epoch), (), world, batch, seed, epoch, history)
    kept, dropped = epoch_sequence(counts, cum, per_step, seed, epoch)
    return layout(kept, dropped, world, batch, seed, epoch, history)


def epoch_sequence(counts: list[int], cum: list[int], per_step: int, seed: int,
                    epoch: int) -> tuple[list[Segment], tuple[tuple[int, int], ...]]:
    """The epoch's train samples in reading order, a whole number of global batches
    (``per_step`` samples, at least one), and the (shard, index) of those left out."""
    total = cum[-1]
    steps = total // per_step
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
    dropped = tuple((s, i) for s, ranges in sorted(holes.items()) for b, e in ranges for i in range(b, e))
    return kept, dropped


def layout(kept: list[Segment], dropped: tuple[tuple[int, int], ...], world: int, batch: int, seed: int, epoch: int,
           history: tuple[Generation, ...] = ()) -> EpochPlan:
    """An epoch's train sequence ``kept`` (whole global batches) cut for ``world`` ranks of
    ``batch``, after the generations in ``history`` read what they read of it."""
    sequence = kept
    for g, gen in enumerate(history):
        before = _cut_spans(sequence, gen.world, gen.batch, epoch, dropped, g)
        sequence = unread(before, gen, seed)
    return _cut_spans(sequence, world, batch, epoch, dropped, len(history))


def _cut_spans(sequence: list[Segment], world: int, batch: int, epoch: int, dropped: tuple[tuple[int, int], ...],
               generation: int) -> EpochPlan:
    n = sum(len(s) for s in sequence)
    if n % (world * batch):
        raise ValueError(f"{n} samples left in epoch {epoch + 1} do not split into whole batches of {batch} on "
                         f"{world} ranks")
    steps = n // (world * batch)
    return EpochPlan(epoch, world, batch, steps, tuple(cut(sequence, [steps * batch] * world)), dropped, generation)


def unread(plan: EpochPlan, gen: Generation, seed: int) -> list[Segment]:
    """The samples of ``plan`` (read in layout ``gen``) that its ranks had not consumed after
    ``gen.consumed`` samples each, rank by rank and piece by piece: what is left of a worker's
    partly read block in stored order, then its later blocks whole."""
    if gen.consumed % gen.batch or not 0 <= gen.consumed <= plan.steps * gen.batch:
        raise ValueError(f"consumed={gen.consumed} is not a whole number of batches of {gen.batch} within "
                         f"the {plan.steps} steps of that layout")
    steps_done = gen.consumed // gen.batch
    w = max(1, gen.workers)
    out: list[Segment] = []
    for rank, span in enumerate(plan.spans):
        key = block_key(seed, plan.epoch, rank, plan.generation)
        for i, piece in enumerate(worker_spans(span, plan.steps, gen.batch, w)):
            skip = batches_done(steps_done, i, w) * gen.batch
            out.extend(_unread_piece(piece, gen.block, (*key, i), skip))
    return _merged(out)


def _unread_piece(piece: tuple[Segment, ...], block: int, key: tuple[int, ...], skip: int) -> list[Segment]:
    """The samples of a worker's piece after the first ``skip`` it emits (`worker_blocks`' order)."""
    size = max(1, block)
    total = sum(len(s) for s in piece)
    lengths = [min(size, total - b) for b in range(0, total, size)]
    first, rest = divmod(skip, size)
    blocks = cut(list(piece), lengths)
    out: list[Segment] = []
    if first < len(blocks) and rest:  # the block being read: its samples not yet emitted
        flat = [(seg.shard, seg.begin + k) for seg in blocks[first] for k in range(len(seg))]
        order = rng(*key, first).permutation(lengths[first]).tolist()
        out.extend(Segment(s, i, i + 1) for s, i in (flat[o] for o in sorted(order[rest:])))
        first += 1
    for b in blocks[first:]:
        out.extend(b)
    return out


def _merged(segments: list[Segment]) -> list[Segment]:
    """Adjacent segments of one shard joined (fewer, longer runs: the same samples in the same order)."""
    out: list[Segment] = []
    for seg in segments:
        if not len(seg):
            continue
        if out and out[-1].shard == seg.shard and out[-1].end == seg.begin and out[-1].valid == seg.valid:
            out[-1] = Segment(seg.shard, out[-1].begin, seg.end, seg.valid)
        else:
            out.append(seg)
    return out


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
