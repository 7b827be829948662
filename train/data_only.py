"""`pipe train --data-only`: the data pipeline alone, under the real launcher.

Every rank reads its part of each epoch through `ShardReader` and a DataLoader exactly as
training would, but feeds no model: the rate it reaches is the most the data side can deliver,
which answers "is loading the bottleneck?". Rank 0 prints one line per rank per epoch.
With ``--record-keys`` each rank writes the keys it consumed, in order, to
``RUN_DIR/keys/epoch{E}-rank{R}.txt`` (the multi-process tests check exactly-once from them).
"""

from __future__ import annotations

import sys
import time

from pipeline.core.files import atomic_write_text
from train.config import TrainConfig
from train.models import families


def main(cfg: TrainConfig) -> dict:
    """One rank's run; returns its samples/s per epoch."""
    import torch.distributed as dist

    from pipeline.core.errors import StageFailed
    from train.components.wrapping import runs_channels_last
    from train.data import sources
    from train.data.device import DeviceFeed
    from train.data.reader import SampleDecodeError, ShardReader, close_loader, make_loader
    from train.distributed.group import process_group

    if cfg.batch_size is None:  # train/command.py's check resolves the batch arithmetic before any rank starts
        raise ValueError("data_only.main needs a config whose batch size is resolved")
    batch_size = cfg.batch_size
    index, _ = sources.read_index(cfg.shard_dir)
    counts = index["counts"]["train"]
    fields = tuple(f for f, n in (("image", counts["images"]), ("text", counts["texts"])) if n)  # what the data has
    # images at the size training would decode them: a built-in model's --resolution
    stored = index["image_size"]
    own = families.resolve(cfg.model).family.own_modules
    image_size = min(cfg.resolution, stored) if stored and "image" in fields and own else None
    with process_group(cfg.backend) as me:
        reader = ShardReader(cfg.shard_dir, "train", me.rank, me.world_size, batch_size=batch_size,
                             seed=cfg.seed, shuffle_buffer=cfg.shuffle_buffer, fields=fields, image_size=image_size,
                             cache_dir=cfg.cache_dir, cache_max_bytes=cfg.cache_max_bytes, normalize=False,
                             decode=cfg.decode if me.device.type == "cuda" else "cpu")
        loader = make_loader(reader, cfg.workers, persistent_workers=cfg.workers > 0, pin_memory=me.device.type == "cuda")
        # as training is fed (`train.data.loaders.open_shards`): uint8 from the workers, normalised by the rank
        feed = DeviceFeed(loader, me.device, reader, runs_channels_last(cfg, me.device))
        rates = []
        try:
            if me.rank == 0:
                _say(f"data only: {me.world_size} ranks x {cfg.workers} workers, batch {batch_size}, "
                     f"{reader.steps_per_epoch} steps per epoch, images at {reader.image_size} px ({me.backend})")
            for epoch in range(cfg.epochs):
                reader.set_epoch(epoch)
                n, keys, start = 0, [], time.perf_counter()
                try:
                    for batch in feed:
                        n += len(batch["key"])
                        if cfg.record_keys:
                            keys.extend(batch["key"])
                except SampleDecodeError as e:
                    raise StageFailed(str(e)) from None
                seconds = time.perf_counter() - start
                rates.append(n / seconds if seconds > 0 else 0.0)
                if cfg.record_keys:
                    atomic_write_text(cfg.output / "keys" / f"epoch{epoch}-rank{me.rank}.txt", "".join(k + "\n" for k in keys))
                _report(epoch, me, n, seconds, dist)
        finally:
            close_loader(loader)  # workers stop before the process group goes away
    return {"rank": me.rank, "samples_per_s": rates}


def _report(epoch: int, me, n: int, seconds: float, dist) -> None:
    gathered: list = [None] * me.world_size
    dist.all_gather_object(gathered, (me.rank, me.host, n, seconds))
    if me.rank != 0:
        return
    total = 0.0
    for rank, host, count, secs in gathered:
        rate = count / secs if secs > 0 else 0.0
        total += rate
        _say(f"epoch {epoch} rank {rank} ({host}): {count} samples in {secs:.2f} s = {rate:,.0f} samples/s")
    _say(f"epoch {epoch} all ranks: {total:,.0f} samples/s")


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
