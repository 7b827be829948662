"""The streaming reader: shards in, normalized batches out, every train sample once per epoch.

`ShardReader` is an `IterableDataset` that yields whole batches (the DataLoader runs with
``batch_size=None``), so a worker always hands over full batches of its own contiguous piece and
every rank runs exactly `steps_per_epoch` steps. Which samples a rank and worker read, and in
which order, is decided by the pure functions in `train/plan.py` (property-tested); this module
does the I/O: seek to a sample's offset from index.json, read a block of samples in one
sequential read, parse the tar members (`pipeline.tarstream`), decode them through the codec
(`pipeline.codec`), normalize with the index's mean and std, and collate.

Epoch and resume position live in a small shared-memory tensor, so `set_epoch` reaches the
workers whether they are persistent (they re-read it when the next epoch's iterator starts),
re-created every epoch, or absent (``num_workers=0``).

Usage::

    reader = ShardReader(shard_dir, "train", rank, world, batch_size=64, seed=0)
    loader = make_loader(reader, num_workers=4, persistent_workers=True)
    for epoch in range(start_epoch, epochs):
        reader.set_epoch(epoch, consumed=steps_done * 64 if epoch == start_epoch else 0)
        for batch in loader:
            ...  # batch["image"], batch["text"], batch["text_len"], batch["label"], batch["key"]
    close_loader(loader)
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from pipeline import shard_index, tarstream
from pipeline.codec import DecodeError, RawSample, decode_class, decode_image, split_name
from train.plan import Block, EpochPlan, batches_done, epoch_plan, worker_blocks, worker_spans

FIELDS = ("image", "text")


class SampleDecodeError(RuntimeError):
    """A sample in a shard could not be read or decoded; the message names the shard and key."""


class ShardReader(IterableDataset):
    """One rank's view of a split of a shard folder, as an iterable of collated batches.

    Each batch is a dict: ``image`` float32 [B,3,S,S] (normalized with the index's mean/std) and
    ``has_image`` bool [B] when "image" is in ``fields``; ``text`` int64 [B,L] (byte value + 1,
    0 = padding, L = ``max_text_len``) and ``text_len`` int64 [B] when "text" is; always
    ``label`` int64 [B], ``valid`` bool [B] (False only for the repeats that top up the last
    validation batches) and ``key`` list[str].
    """

    def __init__(self, shard_dir: str | os.PathLike, split: str = "train", rank: int = 0, world_size: int = 1,
                 batch_size: int = 32, seed: int = 0, shuffle_buffer: int = 512,
                 fields: tuple[str, ...] = ("image", "text"), max_text_len: int = 256):
        super().__init__()
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        unknown = set(fields) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}; choose from {FIELDS}")
        self.shard_dir = Path(shard_dir)
        self.index = shard_index.load(self.shard_dir)
        self.fingerprint = hashlib.sha256((self.shard_dir / shard_index.INDEX_NAME).read_bytes()).hexdigest()
        self.split, self.rank, self.world_size = split, rank, world_size
        self.batch_size, self.seed, self.shuffle_buffer = batch_size, seed, shuffle_buffer
        self.fields, self.max_text_len = tuple(fields), max_text_len
        self.shards = [s for s in self.index["shards"] if s["split"] == split]
        self.counts = [s["count"] for s in self.shards]
        self.num_classes = len(self.index["classes"])
        self.image_size = self.index["image_size"]
        if "image" in self.fields and self.image_size is None:
            raise ValueError(f"{self.shard_dir} holds no images; read it with fields=('text',)")
        self.mean = torch.tensor(self.index["mean"] or [0.0, 0.0, 0.0], dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(self.index["std"] or [1.0, 1.0, 1.0], dtype=torch.float32).clamp_min(1e-6).view(1, 3, 1, 1)
        self.steps_per_epoch = self.plan(0).steps  # depends only on the sample count, world and batch
        # epoch and samples already consumed this epoch, shared with the dataloader workers
        self._position = torch.zeros(2, dtype=torch.int64).share_memory_()
        self.num_workers = 0  # set by make_loader; the plan gives each worker a piece

    # -- position ------------------------------------------------------------------------------

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Read ``epoch`` next, skipping the ``consumed`` samples this rank already trained on
        (a whole number of batches: ``steps_done * batch_size``). Call before iterating."""
        if epoch < 0:
            raise ValueError(f"epoch must be 0 or more, got {epoch}")
        if consumed < 0 or consumed % self.batch_size or consumed > self.steps_per_epoch * self.batch_size:
            raise ValueError(f"consumed={consumed} must be a whole number of batches of {self.batch_size} "
                             f"between 0 and {self.steps_per_epoch * self.batch_size}")
        self._position[0] = epoch
        self._position[1] = consumed

    @property
    def epoch(self) -> int:
        return int(self._position[0])

    def state_dict(self, steps_done: int) -> dict:
        """The reader's position after ``steps_done`` steps of the current epoch, for a checkpoint."""
        return {"epoch": self.epoch, "consumed": steps_done * self.batch_size, "world_size": self.world_size,
                "batch_size": self.batch_size, "num_workers": max(1, self.num_workers), "seed": self.seed,
                "shuffle_buffer": self.shuffle_buffer, "steps_per_epoch": self.steps_per_epoch,
                "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict`: mid-epoch exactly (same world size, batch, workers, seed
        and shuffle buffer required, or samples would repeat or be skipped: ValueError says
        which changed); at an epoch boundary anything may change."""
        if state["fingerprint"] != self.fingerprint:
            raise ValueError("the saved reader position belongs to another dataset (index.json differs)")
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        if consumed >= state["steps_per_epoch"] * state["batch_size"]:  # the epoch was finished
            epoch, consumed = epoch + 1, 0
        if consumed:
            now = self.state_dict(0)
            changed = [f"{k} {state[k]} -> {now[k]}" for k in ("world_size", "batch_size", "num_workers", "seed", "shuffle_buffer")
                       if state[k] != now[k]]
            if changed:
                raise ValueError(f"cannot resume mid-epoch {epoch} with changed {', '.join(changed)}: resume with the "
                                 "saved settings, or from the start of an epoch")
        self.set_epoch(epoch, consumed)

    def plan(self, epoch: int) -> EpochPlan:
        return epoch_plan(self.counts, self.world_size, self.batch_size, self.seed, epoch, train=self.split == "train")

    def __len__(self) -> int:
        return self.steps_per_epoch

    # -- iteration (runs in the dataloader worker) ---------------------------------------------

    def __iter__(self) -> Iterator[dict]:
        epoch, consumed = int(self._position[0]), int(self._position[1])
        samples = self.raw_samples(epoch, consumed)
        while True:
            chunk = [s for _, s in zip(range(self.batch_size), samples)]
            if not chunk:
                return
            if len(chunk) < self.batch_size:  # the plan guarantees whole batches; this is a bug guard
                raise RuntimeError(f"internal error: a worker ended with a partial batch of {len(chunk)}")
            yield self.collate(chunk)

    def raw_samples(self, epoch: int, consumed: int = 0) -> Iterator[tuple[bool, RawSample]]:
        """(valid, undecoded sample) this worker (or process, without workers) reads, in order."""
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        plan = self.plan(epoch)
        steps_done = consumed // self.batch_size
        # the DataLoader restarts its round-robin at worker 0 on resume: worker 0 takes the piece
        # whose turn comes next, so batches keep the order they had before the interruption
        logical = (worker + steps_done) % workers
        piece = worker_spans(plan.spans[self.rank], plan.steps, self.batch_size, workers)[logical]
        skip = batches_done(steps_done, logical, workers) * self.batch_size
        block = self.shuffle_buffer if self.split == "train" else 0
        files: dict[int, object] = {}
        try:
            for b in worker_blocks(piece, block, (self.seed, epoch, self.rank, logical), skip):
                read = self._read_block(b, files)
                for o in b.order:
                    yield read[o]
        finally:
            for f in files.values():
                f.close()

    def _read_block(self, block: Block, files: dict) -> list[tuple[bool, RawSample]]:
        out = []
        for seg in block.segments:
            meta = self.shards[seg.shard]
            f = files.get(seg.shard)
            if f is None:
                f = files[seg.shard] = open(self.shard_dir / meta["name"], "rb", buffering=0)
            out.extend((seg.valid, s) for s in read_samples(f, meta, seg.begin, seg.end))
        return out

    def collate(self, chunk: list[tuple[bool, RawSample]]) -> dict:
        batch: dict = {"key": [s.key for _, s in chunk],
                       "valid": torch.tensor([v for v, _ in chunk], dtype=torch.bool),
                       "label": torch.tensor([self._label(s) for _, s in chunk], dtype=torch.int64)}
        if "image" in self.fields:
            batch["image"], batch["has_image"] = self._images([s for _, s in chunk])
        if "text" in self.fields:
            batch["text"], batch["text_len"] = self._texts([s for _, s in chunk])
        return batch

    def _label(self, s: RawSample) -> int:
        if "cls" not in s.fields:
            raise _error(s, "has no .cls member")
        try:
            label = decode_class(s.fields["cls"])
        except DecodeError as e:
            raise _error(s, str(e)) from None
        if not 0 <= label < self.num_classes:
            raise _error(s, f"class {label} is outside the index's {self.num_classes} classes")
        return label

    def _images(self, samples: list[RawSample]) -> tuple[torch.Tensor, torch.Tensor]:
        size = self.image_size
        pixels = np.zeros((len(samples), size, size, 3), dtype=np.uint8)
        has = torch.zeros(len(samples), dtype=torch.bool)
        for i, s in enumerate(samples):
            ext = s.image_ext
            if ext is None:
                continue
            try:
                arr = decode_image(s.fields[ext], ext)
            except DecodeError as e:
                raise _error(s, str(e)) from None
            if arr.shape != (size, size, 3):
                raise _error(s, f"image is {arr.shape[1]}x{arr.shape[0]}, the index says {size}x{size}")
            pixels[i] = arr
            has[i] = True
        x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float().div_(255)
        x = (x - self.mean) / self.std
        x[~has] = 0.0  # no image: the mean colour, i.e. zeros after normalization
        return x.contiguous(), has

    def _texts(self, samples: list[RawSample]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = np.zeros((len(samples), self.max_text_len), dtype=np.int64)
        lengths = np.zeros(len(samples), dtype=np.int64)
        for i, s in enumerate(samples):
            data = s.fields.get("txt")
            if data is None:
                continue
            raw = np.frombuffer(data, dtype=np.uint8)[: self.max_text_len]
            ids[i, : len(raw)] = raw.astype(np.int64) + 1
            lengths[i] = len(raw)
        return torch.from_numpy(ids), torch.from_numpy(lengths)


def _error(s: RawSample, what: str) -> SampleDecodeError:
    return SampleDecodeError(f"{s.shard}: sample {s.key} (byte offset {s.offset}): {what}")


def read_samples(f, shard: dict, begin: int, end: int) -> list[RawSample]:
    """Samples ``begin..end-1`` of one shard with a single positioned read (never the whole shard)."""
    offsets = shard["offsets"]
    start = offsets[begin]
    stop = offsets[end] if end < shard["count"] else shard["bytes"] - len(tarstream.END_OF_ARCHIVE)
    name = shard["name"]
    try:
        buf = os.pread(f.fileno(), stop - start, start)
    except OSError as e:
        raise SampleDecodeError(f"{name}: cannot read bytes {start}-{stop}: {e}") from None
    if len(buf) != stop - start:
        raise SampleDecodeError(f"{name}: the file is shorter than index.json says (wanted bytes {start}-{stop})")
    samples: list[RawSample] = []
    try:
        for member, at, data in tarstream.iter_members(buf):
            key, ext = split_name(member)
            if not samples or samples[-1].key != key:
                samples.append(RawSample(key, {}, name, start + at))
            samples[-1].fields[ext] = bytes(data)
    except (tarstream.TarFormatError, ValueError) as e:
        where = f" after sample {samples[-1].key}" if samples else ""
        raise SampleDecodeError(f"{name}: damaged at samples {begin}-{end - 1}{where}: {e}") from None
    if len(samples) != end - begin or any(s.offset != offsets[begin + i] for i, s in enumerate(samples)):
        raise SampleDecodeError(f"{name}: samples {begin}-{end - 1} do not match index.json's offsets "
                                "(the shard was changed after pipe shard wrote it)")
    return samples


def make_loader(reader: ShardReader, num_workers: int, persistent_workers: bool = False, pin_memory: bool = False,
                prefetch_factor: int = 2, multiprocessing_context=None) -> DataLoader:
    """A DataLoader over ``reader``'s batches; decoding runs in ``num_workers`` processes.

    Workers are forked where the platform can (as under torchrun), also in ranks that the
    elastic launcher started with spawn: a spawned worker would import torch again first.
    """
    reader.num_workers = num_workers
    if multiprocessing_context is None and num_workers > 0 and "fork" in mp.get_all_start_methods():
        multiprocessing_context = "fork"
    return ShardLoader(reader, batch_size=None, shuffle=False, num_workers=num_workers,
                      persistent_workers=persistent_workers and num_workers > 0, pin_memory=pin_memory,
                      prefetch_factor=prefetch_factor if num_workers > 0 else None,
                      multiprocessing_context=multiprocessing_context if num_workers > 0 else None)


class ShardLoader(DataLoader):
    """A DataLoader whose sample errors read as one line (the shard, the key, what failed)
    instead of "Caught ... in DataLoader worker process N" and the worker's traceback."""

    def __iter__(self):
        return _OneLineErrors(super().__iter__())


class _OneLineErrors:
    def __init__(self, it):
        self.it = it

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.it)

    def __getattr__(self, name):  # everything else (e.g. _shutdown_workers) is the DataLoader iterator's
        return getattr(self.it, name)

    def __next__(self):
        try:
            return next(self.it)
        except SampleDecodeError as e:
            raise SampleDecodeError(original_message(e)) from None


def original_message(e: BaseException) -> str:
    """The worker's own message inside a DataLoader re-raise (its traceback's last line)."""
    text = str(e)
    if "Original Traceback" not in text:
        return text
    last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), text)
    name = type(e).__name__
    return last.split(f"{name}: ", 1)[1] if f"{name}: " in last else last


def close_loader(loader: DataLoader) -> None:
    """Stop the loader's worker processes now (persistent ones included), not at garbage collection."""
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    loader._iterator = None
