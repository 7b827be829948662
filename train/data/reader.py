"""The streaming reader: shards in, normalized batches out, every train sample once per epoch.

`ShardReader` is an `IterableDataset` that yields whole batches (the DataLoader runs with
``batch_size=None``), so a worker always hands over full batches of its own contiguous piece and
every rank runs exactly `steps_per_epoch` steps. Which samples a rank and worker read, and in
which order, is decided by the pure functions in `train/data/plan.py` (property-tested); the reading
is `train/data/stream.py`'s (no torch): merged ranged reads at index.json's offsets (local disk or object storage), the
tar members parsed in place (`pipeline.formats.tarstream`). This module decodes them through the codec
(`pipeline.formats.sample`) one image at a time straight into the batch tensor, normalized there with
the index's mean and std; inside a worker that tensor lives in shared memory, so the batch
reaches the training process without another copy.

Images are decoded at the size the model works at (``image_size``), not the stored size: a
JPEG is shrunk in the DCT domain while it is decoded, then resized with Lanczos-3 (`decode_at`).
A 512 px image is 3 MB as float32 to normalize and ship to the training process; at 64 px,
48 KB, and its decode is cheaper too.

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

import functools
import math
import multiprocessing as mp
import os
import platform
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from pipeline.formats.sample import DecodeError, RawSample, decode_class, decode_image
from pipeline.media.image.resize import dct_scale, fit, scaled_size
from train.config import DECODES  # where JPEGs are decoded: the workers, or the device (`train.data.device`)
from train.data.mix import Sources
from train.data.pairs import pair_ids
from train.data.plan import Generation, epoch_plan
from train.data.skips import BadSample, donors, text_problem
from train.data.stream import SampleDecodeError, SampleReader, read_samples

__all__ = ["FIELDS", "SampleDecodeError", "ShardReader", "close_loader", "make_loader", "read_samples"]

FIELDS = ("image", "text", "pairs")  # pairs: caption and group ids for a contrastive loss (`train.data.pairs`)
MAX_GENERATIONS = 64  # layouts one epoch can be continued in (a resume on another layout adds one)


class ShardReader(SampleReader, IterableDataset):
    """One rank's view of a split of a shard folder, as an iterable of collated batches.

    Each batch is a dict: ``image`` float32 [B,3,S,S] (uint8 with ``normalize=False``; S = ``image_size``: the index's unless
    given; normalized with the index's mean/std unless ``mean``/``std`` are given) and
    ``has_image`` bool [B] when "image" is in ``fields``; ``text`` int64 [B,L] (byte value + 1,
    0 = padding, L = ``max_text_len``) and ``text_len`` int64 [B] when "text" is (with a
    ``tokenize``: what it returns, e.g. ``input_ids`` and ``attention_mask``); always
    ``label`` int64 [B], ``valid`` bool [B] (False only for the repeats that top up the last
    validation batches) and ``key`` list[str]. With "pairs" in ``fields``: ``caption_id`` and
    ``group_id`` int64 [B] (`train.data.pairs`), and ``label`` -1 for a pair without a class.
    """

    def __init__(self, shard_dir: str | os.PathLike, split: str = "train", rank: int = 0, world_size: int = 1,
                 batch_size: int = 32, seed: int = 0, shuffle_buffer: int = 512,
                 fields: tuple[str, ...] = ("image", "text"), max_text_len: int = 256,
                 image_size: int | None = None, mean=None, std=None, tokenize=None,
                 cache_dir: str | os.PathLike | None = None, cache_max_bytes: int | None = None, accum: int = 1,
                 skip_bad: bool = False, dataset: Sources | None = None, only: int | None = None,
                 normalize: bool = True, decode: str = "cpu"):
        """``shard_dir``: a local folder or a URL (`pipeline.storage`); ``cache_dir``/``cache_max_bytes``:
        a local cache of whole shards (`train.data.stream.SampleReader`); ``accum``: batches per
        optimizer step (epochs are cut in whole global batches). ``skip_bad``: a sample that cannot
        be read or decoded is skipped (`train.data.skips`: its slot masked, named in ``skipped``)
        instead of ending the epoch with `SampleDecodeError`. ``dataset``/``only``: several
        SHARD_DIRs mixed by weight, or one of them (`train.data.stream.SampleReader`); classes are
        then the merged ones, and keys are prefixed with their source's name (``SOURCE:KEY``).
        ``image_size``: the side images are decoded at, e.g. the model's input size; at most
        the stored size (enlarging adds nothing). None: the stored size (index.json's).
        ``mean``/``std``: the normalisation the model was trained with (`train.models.norm`);
        None: the index's. ``tokenize``: texts -> a dict of [B, L] tensors (the model's
        tokenizer, e.g. ``input_ids`` and ``attention_mask``) put into the batch instead of byte
        ids; it runs here, in the dataloader workers. ``normalize``: False ships ``image`` as uint8
        [B,3,S,S] (a channels-last view of [B,S,S,3]: 4x fewer bytes to move and pin, no float per
        pixel in the worker) for `normalize_batch` to normalise a whole batch at once where it is
        cheapest (`train.data.device`: on the GPU). ``decode``: "gpu" leaves JPEGs undecoded
        (``jpeg``, ``jpeg_offsets``; headers checked here) for the device to decode
        (`train.data.device.decode_batch`, the CPU decoder its fallback); implies ``normalize=False``."""
        if decode not in DECODES:
            raise ValueError(f"decode must be one of {DECODES}, got {decode!r}")
        unknown = set(fields) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}; choose from {FIELDS}")
        SampleReader.__init__(self, shard_dir, split, rank, world_size, batch_size, seed, shuffle_buffer,
                              cache_dir=cache_dir, cache_max_bytes=cache_max_bytes, accum=accum, skip_bad=skip_bad,
                              dataset=dataset, only=only)
        # a mix: each shard's class numbers in the merged classes, and its keys' prefix
        self._label_maps = dataset.label_maps() if dataset is not None else {}
        self._key_prefix = dataset.key_prefixes() if dataset is not None else {}
        self.fields, self.max_text_len = tuple(fields), max_text_len
        self.num_classes = len(self.index["classes"])
        self.stored_size = self.index["image_size"]  # the side of every image in the shards
        if "image" in self.fields and self.stored_size is None:
            raise ValueError(f"{self.shard_dir} holds no images; read it with fields=('text',)")
        if image_size is not None and not 1 <= image_size <= (self.stored_size or image_size):
            raise ValueError(f"image_size {image_size} must be between 1 and the shards' image size "
                             f"{self.stored_size} (images are never enlarged)")
        self.image_size = image_size or self.stored_size
        mean = mean if mean is not None else (self.index["mean"] or [0.0, 0.0, 0.0])
        std = std if std is not None else (self.index["std"] or [1.0, 1.0, 1.0])
        self.mean = torch.tensor(list(mean), dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(list(std), dtype=torch.float32).clamp_min(1e-6).view(1, 3, 1, 1)
        self.tokenize = tokenize
        self.decode = decode
        self.normalize = normalize and decode == "cpu"
        # (x / 255 - mean) / std per image [3,S,S], folded into one multiply and one add per pixel
        self._scale, self._shift = (1.0 / (255.0 * self.std))[0], (-self.mean / self.std)[0]
        # the epoch's length in this layout: the sample count, world, batch and accumulation
        self.steps_per_epoch = epoch_plan(self.counts, world_size, batch_size, seed, 0, train=split == "train",
                                          accum=accum, mix=self.mix).steps
        # shared with the dataloader workers: the epoch, the samples this rank consumed in it in this
        # layout, the epoch the earlier layouts belong to and how many (rows of _generations)
        self._position = torch.zeros(4, dtype=torch.int64).share_memory_()
        self._position[2] = -1
        self._generations = torch.zeros((MAX_GENERATIONS, 5), dtype=torch.int64).share_memory_()
        self.num_workers = 0  # set by make_loader; the plan gives each worker a piece
        self.ring: Ring | None = None  # uint8 batch slots the workers and the training process share (`share_ring`)

    def share_ring(self, slots: int) -> Ring | None:
        """Give each dataloader worker ``slots`` batch-sized uint8 slots in shared memory, made now,
        before the workers fork, so the training process has them mapped too: a worker decodes into
        a free slot and ships only its number (``image_slot``); the consumer (`train.data.device.DeviceFeed`)
        reads the images from its own mapping and frees the slot. Without it every batch is new
        shared memory, which both processes fault in page by page (measured: ~0.5 ms of CPU a
        sample, as much as a third of a decode). A worker that finds no free slot (or a consumer
        that never frees one) gets new memory, as before. Only for uint8 images read by workers."""
        if self.normalize or "image" not in self.fields or self.num_workers < 1 or not _ORDERED_STORES:
            return None
        if self.ring is None:
            self.ring = Ring(self.num_workers, slots, (self.batch_size, self.image_size, self.image_size, 3))
        return self.ring

    def normalization(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, shift) [1,3,1,1]: a uint8 image ``x`` is normalised as ``x * scale + shift``,
        i.e. ``(x / 255 - mean) / std`` in the very float operations the workers use."""
        return self._scale[None], self._shift[None]

    # -- position ------------------------------------------------------------------------------

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Read ``epoch`` next, skipping the ``consumed`` samples this rank already trained on
        (a whole number of batches: ``steps_done * batch_size``). Call before iterating.

        After a resume on another layout (`load_state_dict`) ``consumed`` still counts the whole
        epoch as this layout would (optimizer steps x accum x batch): the earlier layouts' part of
        it is theirs, the rest this one's. ``consumed=0`` starts the epoch afresh in this layout."""
        if epoch < 0:
            raise ValueError(f"epoch must be 0 or more, got {epoch}")
        if consumed < 0 or consumed % self.batch_size or consumed > self.steps_per_epoch * self.batch_size:
            raise ValueError(f"consumed={consumed} must be a whole number of batches of {self.batch_size} "
                             f"between 0 and {self.steps_per_epoch * self.batch_size}")
        history = self.history(epoch) if consumed else ()
        before = self._earlier(history)
        if consumed < before:
            raise ValueError(f"consumed={consumed}, but the earlier layouts of epoch {epoch} consumed {before} "
                             "samples per rank of this one")
        self._position[0] = epoch
        self._position[1] = consumed - before
        self._set_history(epoch, history)

    @property
    def epoch(self) -> int:
        return int(self._position[0])

    def history(self, epoch: int) -> tuple[Generation, ...]:
        """The layouts ``epoch`` was read in before this one (after `load_state_dict` from another)."""
        if int(self._position[2]) != epoch:
            return ()
        rows = self._generations[: int(self._position[3])].tolist()
        return tuple(Generation(*row) for row in rows)

    def _set_history(self, epoch: int, history: tuple[Generation, ...]) -> None:
        if len(history) > MAX_GENERATIONS:
            raise ValueError(f"epoch {epoch + 1} was resumed on {len(history)} other layouts; at most "
                             f"{MAX_GENERATIONS} can be continued exactly")
        for i, g in enumerate(history):
            self._generations[i] = torch.tensor([g.world, g.batch, g.workers, g.block, g.consumed])
        self._position[2] = epoch if history else -1
        self._position[3] = len(history)

    def _earlier(self, history: tuple[Generation, ...]) -> int:
        """What the ``history`` layouts consumed, as samples per rank of this layout."""
        return sum(g.world * g.consumed for g in history) // self.world_size

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_size * self.accum

    def state_dict(self, steps_done: int) -> dict:
        """The reader's position after ``steps_done`` batches of the current epoch (the whole epoch
        counted in this layout, as `set_epoch` takes it), for a checkpoint."""
        return {"epoch": self.epoch, "consumed": steps_done * self.batch_size, "world_size": self.world_size,
                "batch_size": self.batch_size, "accum": self.accum, "num_workers": max(1, self.num_workers),
                "seed": self.seed, "shuffle_buffer": self.shuffle_buffer, "steps_per_epoch": self.steps_per_epoch,
                "fingerprint": self.fingerprint, "history": [g.as_dict() for g in self.history(self.epoch)]}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict`: at an epoch boundary anything may change; mid-epoch the
        same layout continues exactly where it was, and another one (world size, per-rank batch,
        accumulation, workers, shuffle buffer; the global batch kept) reads exactly the samples
        the epoch has not trained on yet (`train.data.plan.unread`). ValueError for what cannot
        continue exactly: another dataset, seed or global batch."""
        if state["fingerprint"] != self.fingerprint:
            raise ValueError("the saved reader position belongs to another dataset (index.json differs)")
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        if consumed >= state["steps_per_epoch"] * state["batch_size"]:  # the epoch was finished
            epoch, consumed = epoch + 1, 0
        if not consumed:
            self.set_epoch(epoch, 0)
            return
        saved = Generation(state["world_size"], state["batch_size"], max(1, state["num_workers"]), state["shuffle_buffer"], 0)
        history = self._continued(state, epoch, saved)
        self._set_history(epoch, history)
        # the epoch so far in this layout's units: optimizer steps done x accum x batch
        self.set_epoch(epoch, consumed * saved.world // self.world_size)

    def _continued(self, state: dict, epoch: int, saved: Generation) -> tuple[Generation, ...]:
        """The layouts ``epoch`` ran in before this run: the saved ones, and the saved run's own
        when it differs from this one (with what it consumed)."""
        if state["seed"] != self.seed:
            raise ValueError(f"cannot resume mid-epoch {epoch + 1} with changed seed {state['seed']} -> {self.seed}")
        accum = state.get("accum")
        now = (self.world_size, self.batch_size, max(1, self.num_workers), self.shuffle_buffer)
        if accum is None:  # written before epochs were cut in global batches: only the very same layout continues
            if (self.accum, now) != (1, (saved.world, saved.batch, saved.workers, saved.block)):
                raise ValueError(f"cannot resume mid-epoch {epoch + 1} on another layout from a checkpoint of an "
                                 "older pipe train: resume with its settings, or from an epoch's start")
            return ()
        saved_global = saved.world * saved.batch * int(accum)
        if saved_global != self.global_batch:
            changed = [f"{k} {a} -> {b}" for k, a, b in (("world_size", saved.world, self.world_size),
                                                         ("batch_size", saved.batch, self.batch_size),
                                                         ("accum", accum, self.accum)) if a != b]
            raise ValueError(f"cannot resume mid-epoch {epoch + 1} with changed global batch {saved_global} -> "
                             f"{self.global_batch} ({', '.join(changed)}): its samples were cut in global batches of "
                             f"{saved_global}; keep the global batch (--global-batch) to continue it on another layout")
        history = tuple(Generation(**h) for h in state.get("history", ()))
        if (saved.world, saved.batch, saved.workers, saved.block) == now:
            return history
        before = sum(g.world * g.consumed for g in history) // saved.world
        mine = int(state["consumed"]) - before
        return history + (Generation(saved.world, saved.batch, saved.workers, saved.block, mine),) if mine else history

    def __len__(self) -> int:
        return self.steps_per_epoch

    # -- iteration (runs in the dataloader worker) ---------------------------------------------

    def __iter__(self) -> Iterator[dict]:
        epoch, consumed = int(self._position[0]), int(self._position[1])
        samples = self.raw_samples(epoch, consumed)
        in_worker = get_worker_info() is not None
        while True:
            chunk = [s for _, s in zip(range(self.batch_size), samples)]
            if not chunk:
                return
            if len(chunk) < self.batch_size:  # the plan guarantees whole batches; this is a bug guard
                raise RuntimeError(f"internal error: a worker ended with a partial batch of {len(chunk)}")
            batch = self.collate(chunk)
            yield _by_value(batch) if in_worker else batch

    def raw_samples(self, epoch: int, consumed: int = 0) -> Iterator[tuple[bool, RawSample]]:
        """(valid, undecoded sample) this worker (or process, without workers) reads, in order."""
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        return self.samples(epoch, consumed, worker, workers)

    def collate(self, chunk: list[tuple[bool, RawSample]]) -> dict:
        samples = [s for _, s in chunk]
        bad: dict[int, str] = {}  # slot -> why it cannot be fed (with skip_bad; otherwise it raised)
        labels = [self._checked(i, s, bad) for i, s in enumerate(samples)]
        images = self._images(samples, bad) if "image" in self.fields else None
        # a bad slot carries a good sample of the same batch (`train.data.skips.donors`), masked
        fill = donors(len(samples), set(bad))
        fed = [s if i not in bad else samples[d] if (d := fill[i]) is not None else RawSample(s.key)
               for i, s in enumerate(samples)]
        batch: dict = {"key": [self._key_prefix.get(s.shard, "") + s.key for s in samples],
                       "valid": torch.tensor([v and i not in bad for i, (v, _) in enumerate(chunk)], dtype=torch.bool),
                       "label": torch.tensor([y if i not in bad else labels[d] if (d := fill[i]) is not None else 0
                                              for i, y in enumerate(labels)], dtype=torch.int64)}
        if images is not None:
            images.fill(fill)
            batch.update(images.fields())
        if "text" in self.fields and self.tokenize is not None:
            batch.update(self.tokenize([_text(s) for s in fed]))
        elif "text" in self.fields:
            batch["text"], batch["text_len"] = self._texts(fed)
        if bad:
            batch["skipped"] = [(i, samples[i].shard, samples[i].key, samples[i].offset, why) for i, why in sorted(bad.items())]
        if "pairs" in self.fields:
            captions, groups = pair_ids([s.fields for s in fed])
            batch["caption_id"], batch["group_id"] = torch.tensor(captions), torch.tensor(groups)
        return batch

    def _checked(self, i: int, s: RawSample, bad: dict[int, str]) -> int:
        """The sample's class; a sample that cannot be fed (unreadable, no class, with skip_bad a
        caption that is not UTF-8) raises, or with skip_bad goes into ``bad``."""
        try:
            if isinstance(s, BadSample):
                raise _error(s, s.reason)
            label = self._label(s)
            if self.skip_bad and "text" in self.fields and (problem := text_problem(s.fields.get("txt"))):
                raise _error(s, problem)
            return label
        except SampleDecodeError as e:
            self._bad(bad, i, s, e)
            return 0

    def _bad(self, bad: dict[int, str], i: int, s: RawSample, e: SampleDecodeError) -> None:
        if not self.skip_bad:
            raise e
        bad[i] = str(e).removeprefix(f"{s.shard}: sample {s.key} (byte offset {s.offset}): ")

    def _label(self, s: RawSample) -> int:
        if "cls" not in s.fields:
            if "pairs" in self.fields:  # an image-caption pair without a class (pipe shard writes no .cls)
                return -1
            raise _error(s, "has no .cls member")
        try:
            label = decode_class(s.fields["cls"])
        except DecodeError as e:
            raise _error(s, str(e)) from None
        table = self._label_maps.get(s.shard)
        classes = len(table) if table is not None else self.num_classes
        if not 0 <= label < classes:
            raise _error(s, f"class {label} is outside the index's {classes} classes")
        return table[label] if table is not None else label

    def _images(self, samples: list[RawSample], bad: dict[int, str]) -> _Images:
        """The batch's images: decoded here, one at a time straight into the batch tensor (float
        normalised, or uint8 for the device to normalise), or with ``decode="gpu"`` a JPEG's bytes
        passed on for the device to decode (its header checked here, so a bad one is skipped here)."""
        size, n = self.image_size, len(samples)
        ring_slot = None
        if self.normalize:  # float [B,3,S,S], normalised per image while it is in cache
            out = _batch_tensor((n, 3, size, size))
            pixels = np.empty((size, size, 3), dtype=np.uint8)
        elif (ring_slot := self._ring_slot(n)) is not None:  # uint8 into a slot of the shared ring
            out = self.ring.pixels[ring_slot]  # type: ignore[union-attr]
        else:  # uint8 [B,S,S,3]: each image decoded straight into its slot; [B,3,S,S] channels-last view
            out = _batch_tensor((n, size, size, 3), torch.uint8)
        images = _Images(out if self.normalize else out.permute(0, 3, 1, 2), torch.zeros(n, dtype=torch.bool),
                         [None] * n if self.decode == "gpu" else None, ring_slot)
        slots = None if self.normalize else out.numpy()  # each image's [S,S,3] as a numpy view, made once a batch
        for i, s in enumerate(samples):
            ext = s.image_ext
            if ext is None or i in bad:
                out[i].zero_()  # no image: the mean colour, i.e. zeros after normalization (the device's too)
                continue
            try:
                if images.encoded is not None and ext == "jpg":
                    images.encoded[i] = _checked_jpeg(s.fields[ext], self.stored_size)
                    images.has[i] = True
                    continue
                if slots is None:
                    arr = decode_at(s.fields[ext], ext, self.stored_size, size, out=pixels)
                else:
                    slot = slots[i]
                    arr = decode_at(s.fields[ext], ext, self.stored_size, size, out=slot)
                    if arr is not slot and not np.shares_memory(arr, slot):  # e.g. a PNG: decoded into a new array
                        slot[...] = arr
            except DecodeError as e:
                self._bad(bad, i, s, _error(s, str(e)))
                out[i].zero_()
                continue
            if self.normalize:
                # HWC uint8 -> CHW float in one strided copy, then normalize in place: the image stays
                # in cache (a whole-batch permute + normalize on the CPU is several times slower)
                x = out[i]
                x.copy_(torch.from_numpy(arr).permute(2, 0, 1))
                x.mul_(self._scale).add_(self._shift)
            images.has[i] = True
        return images

    def _ring_slot(self, n: int) -> tuple[int, int] | None:
        """A free ring slot of this worker for a batch of ``n`` (None: no ring here, or none free)."""
        info = get_worker_info()
        if self.ring is None or info is None or n != self.batch_size or info.id >= self.ring.busy.shape[0]:
            return None
        return self.ring.take(info.id)

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


SMALL = 1 << 16
"""A worker ships a tensor of at most this many bytes by value (as numpy, in the pickled batch) rather
than through a new shared-memory segment and a passed file descriptor each (labels, masks, lengths:
measured 0.3 ms of CPU a batch in the worker and 0.3 in the training process for three such tensors,
against a few microseconds pickled); `ShardLoader` makes them tensors again, so a batch reads the same."""


def _by_value(batch: dict) -> dict:
    """The worker's batch with its small CPU tensors as numpy arrays (see `SMALL`)."""
    return {k: v.numpy() if isinstance(v, torch.Tensor) and v.device.type == "cpu" and not v.requires_grad
            and v.nbytes <= SMALL and not v.is_shared() else v for k, v in batch.items()}


def _as_tensors(batch, pin: bool):
    """`_by_value` undone in the training process: numpy arrays back to tensors (pinned for a GPU's
    asynchronous copies, as the DataLoader pins the rest)."""
    if not isinstance(batch, dict):
        return batch
    return {k: (torch.from_numpy(v).pin_memory() if pin else torch.from_numpy(v)) if isinstance(v, np.ndarray) else v
            for k, v in batch.items()}


def _text(s: RawSample) -> str:
    """The sample's text for a tokenizer ("" without one). `pipe clean` stored it as UTF-8."""
    data = s.fields.get("txt")
    return bytes(data).decode("utf-8", errors="replace") if data is not None else ""


def _error(s: RawSample, what: str) -> SampleDecodeError:
    return SampleDecodeError(f"{s.shard}: sample {s.key} (byte offset {s.offset}): {what}")


def decode_at(data: bytes | memoryview, ext: str, stored: int, size: int, out: np.ndarray | None = None) -> np.ndarray:
    """A ``size`` x ``size`` x 3 uint8 RGB array of an image `pipe shard` stored at ``stored`` px.

    Written into ``out`` (an array of that shape) where it can be. Smaller, a JPEG is decoded
    already shrunk in the DCT domain (libjpeg-turbo's scaled IDCT, M/8) at the scale
    `pipeline.media.image.resize.dct_scale` picks (1.5x the target kept, so nothing aliases), then resized
    with Lanczos-3, the way `pipe clean` resizes. Raises `DecodeError` for a damaged image or one
    whose size is not the index's.
    """
    if size >= stored or ext != "jpg":
        arr = decode_image(data, ext, out=out)  # into out only when it has the stored size
        _check_stored(arr.shape[1], arr.shape[0], stored)
    else:
        import simplejpeg

        try:
            h, w = simplejpeg.decode_jpeg_header(data)[:2]
        except Exception as e:  # noqa: BLE001 - as pipeline.formats.sample.decode_image: one kind of error
            raise DecodeError(f"jpg image does not decode: {type(e).__name__}: {e}") from None
        _check_stored(w, h, stored)
        sw, sh = scaled_size(w, h, dct_scale(w, h, size, "stretch"))
        try:
            arr = simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True, min_width=sw, min_height=sh)
        except Exception as e:  # noqa: BLE001
            raise DecodeError(f"jpg image does not decode: {type(e).__name__}: {e}") from None
    if size >= stored:
        return arr
    small = np.asarray(fit(Image.fromarray(arr), size, "stretch", (0, 0, 0)))  # a read-only view of Pillow's pixels
    if out is None or out.shape != small.shape:
        return small.copy()
    out[...] = small
    return out


def _check_stored(w: int, h: int, stored: int) -> None:
    if (w, h) != (stored, stored):
        raise DecodeError(f"image is {w}x{h}, the index says {stored}x{stored}")


def _checked_jpeg(data: bytes | memoryview, stored: int) -> memoryview:
    """A JPEG's bytes for the device to decode, after the checks `decode_at` makes of its header
    (it parses, and has the index's size): a sample that fails them is skipped here, in the worker."""
    import simplejpeg

    try:
        h, w = simplejpeg.decode_jpeg_header(data)[:2]
    except Exception as e:  # noqa: BLE001 - as decode_at
        raise DecodeError(f"jpg image does not decode: {type(e).__name__}: {e}") from None
    _check_stored(w, h, stored)
    return memoryview(data)


@dataclass
class _Images:
    """A batch's images while it is assembled: pixels, which slots hold one, and (``decode="gpu"``)
    each slot's JPEG bytes still to decode (None: decoded here, or no image)."""

    pixels: torch.Tensor
    has: torch.Tensor
    encoded: list[memoryview | None] | None = None
    slot: tuple[int, int] | None = None
    """(worker, slot) of the `Ring` the pixels are in: shipped instead of the pixels."""

    def fill(self, fill: dict[int, int | None]) -> None:
        """Bad slots take a good sample's image (`train.data.skips.donors`), or none."""
        for i, d in fill.items():
            self.pixels[i] = self.pixels[d] if d is not None else 0
            self.has[i] = bool(self.has[d]) if d is not None else False
            if self.encoded is not None:
                self.encoded[i] = self.encoded[d] if d is not None else None

    def fields(self) -> dict[str, torch.Tensor]:
        """The batch's entries: ``image`` and ``has_image``; with JPEGs left to the device, also
        ``jpeg`` (their bytes, one uint8 tensor) and ``jpeg_offsets`` ([B+1]: slot i's are
        ``jpeg[off[i]:off[i+1]]``, empty where ``image`` already holds it)."""
        out: dict = {"image": self.pixels, "has_image": self.has} if self.slot is None else \
            {"image_slot": self.slot, "has_image": self.has}
        if self.encoded is not None:
            sizes = [len(e) if e is not None else 0 for e in self.encoded]
            offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
            np.cumsum(sizes, out=offsets[1:])
            total = int(offsets[-1])
            data = _batch_tensor((total,), torch.uint8) if total else torch.empty(0, dtype=torch.uint8)
            view = data.numpy()
            for e, a, b in zip(self.encoded, offsets[:-1], offsets[1:]):
                if e is not None:
                    view[a:b] = np.frombuffer(e, dtype=np.uint8)
            out.update(jpeg=data, jpeg_offsets=torch.from_numpy(offsets))
        return out


_ORDERED_STORES = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
"""The ring's slot flags are plain shared ints, no barrier: safe where stores are not reordered
before earlier loads (x86's total store order); elsewhere (ARM: Grace, Graviton) every batch is
new memory, as without the ring, rather than a slot freed before its reads are done."""


class Ring:
    """``slots`` uint8 batches [B,S,S,3] per dataloader worker in shared memory, and whether each is
    taken (see `ShardReader.share_ring`). A slot's flag is set only by its worker (free -> taken)
    and cleared only by the consumer (taken -> free), so neither needs a lock."""

    def __init__(self, workers: int, slots: int, batch: tuple[int, ...]):
        self.pixels = _shared((workers, slots, *batch), torch.uint8)
        self.busy = torch.zeros((workers, slots), dtype=torch.int32).share_memory_()

    def take(self, worker: int) -> tuple[int, int] | None:
        for j, taken in enumerate(self.busy[worker].tolist()):
            if not taken:
                self.busy[worker, j] = 1
                return worker, j
        return None

    def images(self, slot: tuple[int, int]) -> torch.Tensor:
        """The slot's images as uint8 [B,3,S,S] (a channels-last view); valid until `free`."""
        return self.pixels[slot].permute(0, 3, 1, 2)

    def free(self, slot: tuple[int, int]) -> None:
        self.busy[slot] = 0


def _shared(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized tensor in shared memory (no pages touched: `share_memory_` would copy)."""
    proto = torch.empty(0, dtype=dtype)
    storage = proto._typed_storage()._new_shared(math.prod(shape), device=proto.device)
    return proto.new(storage).resize_(shape)


def _batch_tensor(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialized tensor (float32 unless told); in a dataloader worker, allocated in shared memory.

    A worker's batch travels to the main process through shared memory: a tensor made there
    from the start is not copied on the way (a batch of 64 512x512 images is 200 MB). These
    are the calls torch's own default_collate makes for the same reason.
    """
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    return _shared(shape, dtype)


def make_loader(reader: ShardReader, num_workers: int, persistent_workers: bool = False,
                pin_memory: bool = False) -> DataLoader:
    """A DataLoader over ``reader``'s batches; decoding runs in ``num_workers`` processes.

    Workers are forked where the platform can (as under torchrun), also in ranks that the
    elastic launcher started with spawn: a spawned worker would import torch again first.
    """
    reader.num_workers = num_workers
    fork = num_workers > 0 and "fork" in mp.get_all_start_methods()
    closing = mp.get_context("fork" if fork else None).Event() if num_workers > 0 else None
    loader = ShardLoader(reader, batch_size=None, shuffle=False, num_workers=num_workers, collate_fn=_as_is,
                         persistent_workers=persistent_workers and num_workers > 0, pin_memory=pin_memory,
                         prefetch_factor=2 if num_workers > 0 else None,
                         multiprocessing_context="fork" if fork else None,
                         worker_init_fn=functools.partial(_sigterm_ends_worker_when, closing) if closing else None)
    loader.closing = closing
    return loader


def _as_is(batch):
    """The DataLoader's collate_fn: a batch stays as the reader made it. Its default (``batch_size=None``:
    ``default_convert``) makes numpy arrays tensors in the worker, so the small arrays `_by_value`
    ships by value went through new shared memory again, three segments and three file descriptors
    a batch: measured (bench/loader.py, 224 px, batch 64) ~0.04 ms of CPU a sample in all, the training
    process's own part 0.09-0.10 -> 0.07."""
    return batch


def _sigterm_ends_worker_when(closing, worker_id: int) -> None:
    """A worker outlives a SIGTERM until its rank closes the loader. torch's workers die of any
    SIGTERM not sent by their rank, and a preemption signals every process (Slurm signals the
    whole job step, torchrun the rank's process group): the rank, which stops at its next step
    boundary (`train.components.stopping`), would find its workers dead mid-step. The rank's own
    SIGTERM (DataLoader's terminate of a stuck worker at close) comes after `close_loader` set
    ``closing``, and still ends it."""
    import signal

    def on_sigterm(signum, frame) -> None:
        if closing.is_set():
            os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)


class ShardLoader(DataLoader):
    """A DataLoader whose sample errors read as one line (the shard, the key, what failed)
    instead of "Caught ... in DataLoader worker process N" and the worker's traceback, and whose
    batches' small tensors, shipped by value from the workers (`SMALL`), are tensors again."""

    def __iter__(self):
        return _OneLineErrors(super().__iter__(), self.pin_memory and torch.cuda.is_available())


class _OneLineErrors:
    def __init__(self, it, pin: bool = False):
        self.it, self.pin = it, pin

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.it)

    def __getattr__(self, name):  # everything else (e.g. _shutdown_workers) is the DataLoader iterator's
        return getattr(self.it, name)

    def __next__(self):
        try:
            return _as_tensors(next(self.it), self.pin)
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
    closing = getattr(loader, "closing", None)
    if closing is not None:  # from here on a SIGTERM ends a worker (`_sigterm_ends_worker_when`)
        closing.set()
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    loader._iterator = None
