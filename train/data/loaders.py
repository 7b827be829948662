"""What the training loop needs from the data side: the dataset's index and fingerprint, and the
readers of its train and val splits with the DataLoaders that turn them into batches.

`open_shards` is the real one (`train.data.reader.ShardReader` over SHARD_DIR); the loop takes it
as a parameter, so its tests put a stand-in with the same signature in its place
(`tests/fake_data.py`), and `DataSource` is the contract both keep.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import UsageError
from train.config import BatchPlan, TrainConfig
from train.distributed.group import Dist

if TYPE_CHECKING:
    from train.data.mix import Sources


@dataclass
class DataSource:
    """Readers for the train and val splits and how to turn a reader into batches.

    A reader is `train.data.reader.ShardReader`'s interface: ``steps_per_epoch`` (per-rank batches
    per epoch, equal on every rank), ``image_size`` (the side images are decoded at),
    ``set_epoch(epoch, consumed=0)``, ``state_dict(steps_done)`` (its position, for a checkpoint)
    and ``load_state_dict(state)`` (ValueError when that position cannot be continued exactly);
    the loader yields dicts (on the rank's device): ``image`` [B,3,S,S] float normalised,
    ``text`` [B,L] int64 byte ids, ``text_len`` [B] (or, for a model with a ``tokenize``, what it
    returns: ``input_ids`` and ``attention_mask`` [B,L]), ``label`` [B], ``key`` list[str], and for
    validation ``valid`` [B] bool (False for the repeats that fill the last batches so that
    every rank runs the same number of steps; they are not counted).
    """

    train: Any
    val: Any | None
    loader: Callable[[Any], Iterable[dict]]
    close: Callable[[], None]
    """Stop the loaders' worker processes (before the process group goes away)."""
    errors: tuple[type[BaseException], ...]
    """What the loader raises for bad data (a sample that does not decode); it ends the run as a
    one-line failure naming the shard and key, not as an internal error."""
    val_parts: dict[str, Any] | None = None
    """Several SHARD_DIRs mixed (`train.data.mix`): each one's val reader, by source name, validated
    apart and added up (``val`` is then None)."""


def read_index(shard_dir: str | Path, need_classes: bool = True) -> tuple[dict, str]:
    """index.json (schema-checked; from a folder or object storage) and its fingerprint (the hash every
    rank must agree on). ``need_classes``: a dataset without classes is refused (a classifier's)."""
    from train.data import sources

    index, raw = sources.read_index(shard_dir)
    if need_classes and not index["classes"]:
        raise UsageError(f"{shard_dir}/index.json lists no classes: there is nothing to classify")
    return index, hashlib.sha256(raw).hexdigest()[:16]


def read_dataset(cfg: TrainConfig) -> tuple[dict, str]:
    """`read_index` of the run's data: SHARD_DIR's, or the merged index of several mixed and the
    fingerprint that covers them all, the weights and the epoch size (`train.data.mix.Sources`)."""
    if len(cfg.shard_dirs) < 2:
        return read_index(cfg.shard_dir)
    dataset = mixed(cfg)
    if not dataset.index["classes"]:
        raise UsageError(f"{', '.join(cfg.shard_dirs)} list no classes: there is nothing to classify")
    return dataset.index, dataset.fingerprint[:16]


def mixed(cfg: TrainConfig) -> Sources:
    """The SHARD_DIRs of ``cfg`` as one `train.data.mix.Sources` (with its --mix and --epoch-samples)."""
    from train.data.mix import Sources, parse_weights

    return Sources(cfg.shard_dirs, parse_weights(cfg.mix, len(cfg.shard_dirs)), cfg.epoch_samples)


def open_shards(cfg: TrainConfig, d: Dist, plan: BatchPlan, fields: tuple[str, ...], index: dict,
                image_size: int | None = None, mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                tokenize: Callable[..., dict] | None = None, channels_last: bool = False) -> DataSource:
    """The real readers over SHARD_DIR (`train.data.reader`); images decoded at ``image_size`` (the
    model's input size) in the dataloader workers, not at the stored size, and normalised with
    ``mean``/``std`` when the model brings its own (else the index's); texts through the model's
    ``tokenize`` when it has one, there too. The workers ship images as uint8 and `DeviceFeed`
    puts each batch on the rank's device, normalised there a batch at once (on a GPU: pinned,
    copied one step ahead; with --decode gpu, its JPEGs decoded there). ``channels_last``: the model
    runs channels-last (`train.components.wrapping.Placement`): a CPU rank's images are normalised
    into that layout (`DeviceFeed`)."""
    from train.data.device import DeviceFeed
    from train.data.reader import SampleDecodeError, ShardReader, close_loader, make_loader

    if "image" in fields and index.get("image_size") is None:
        raise UsageError(f"{cfg.shard_dir} holds no images, but --model {cfg.model} reads them: use --model text")
    dataset = mixed(cfg) if len(cfg.shard_dirs) > 1 else None
    decode = cfg.decode if d.device.type == "cuda" else "cpu"  # no GPU: the workers decode, as always

    def reader(split: str, only: int | None = None) -> ShardReader:
        return ShardReader(cfg.shard_dir, split=split, rank=d.rank, world_size=d.world_size, batch_size=plan.batch_size,
                           seed=cfg.seed, shuffle_buffer=cfg.shuffle_buffer, fields=fields, max_text_len=cfg.max_text_len,
                           image_size=image_size, mean=mean, std=std, tokenize=tokenize,
                           cache_dir=cfg.cache_dir, cache_max_bytes=cfg.cache_max_bytes,
                           accum=plan.accum if split == "train" else 1, skip_bad=True, dataset=dataset, only=only,
                           normalize=False, decode=decode)

    def has_val(shards: list[dict]) -> bool:
        return any(s.get("split") == "val" and s.get("count", 0) > 0 for s in shards)

    train = reader("train")
    if dataset is None:
        val, parts = (reader("val") if has_val(index.get("shards", [])) else None), {}
    else:  # each source's val split apart: metrics per source, and added up
        val, parts = None, {name: reader("val", i) for i, (name, source) in enumerate(zip(dataset.names, dataset.indexes))
                            if has_val(source["shards"])}
    readers = [train, *([val] if val is not None else []), *parts.values()]
    # one DataLoader per reader, made now (the reader's resume position depends on its worker
    # count) and kept: persistent workers survive from epoch to epoch
    loaders = {id(r): make_loader(r, cfg.workers, persistent_workers=cfg.workers > 0,
                                  pin_memory=d.device.type == "cuda")  # page-locked: async copies to the GPU
               for r in readers}

    feeds = {id(r): DeviceFeed(loaders[id(r)], d.device, r, channels_last) for r in readers}  # before the workers start

    def close() -> None:
        for ld in loaders.values():
            close_loader(ld)

    return DataSource(train=train, val=val, loader=lambda r: feeds[id(r)], close=close,
                      errors=(SampleDecodeError,), val_parts=parts or None)
