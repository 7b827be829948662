"""The settings of `pipe shard`: `ShardConfig`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pipeline import __version__


@dataclass
class ShardConfig:
    """Settings of `pipe shard` (flags of the same name; `[shard]` in a `--config` file)."""

    input: Path
    """CLEAN_DIR written by `pipe clean` (its manifest.parquet is read; nothing there is modified)."""
    output: Path
    """SHARD_DIR: {train,val}-NNNNNN.tar and index.json."""
    val_fraction: float = 0.1
    """Share of each class that goes to validation (at least one sample of every class with two or more)."""
    max_count: int = 1000
    """Most samples in one shard."""
    max_size: int = 1 << 30
    """Most bytes in one shard, tar headers and padding counted; only a single larger sample exceeds it."""
    seed: int = 0
    """Seed of the split and of the shuffle before sharding."""
    split_distance: int = 6
    """Images whose perceptual hashes differ in at most this many of 64 bits stay on one side of the split."""
    expected_ranks: int = 8
    """Ranks you expect to train with; with expected_workers, sizes the 'too few shards' warning."""
    expected_workers: int = 4
    """Dataloader workers per rank you expect to train with."""
    workers: int = 0
    """Processes that decode images to measure them; 0 = one per core."""
    overwrite: bool = False
    """Replace a SHARD_DIR pipe shard wrote from other input or settings instead of refusing."""
    executor: str = "local"
    """Where shards are written: local (this process) or ray (one Ray task per shard, the plan made here)."""
    ray_address: str = "auto"
    """The Ray cluster to join with --executor ray: auto (the one started on this machine, or RAY_ADDRESS) or HOST:PORT."""

    # settings that change what is written; a SHARD_DIR made with others is replaced only with --overwrite
    OUTPUT_SETTINGS = ("val_fraction", "max_count", "max_size", "seed", "split_distance")

    def marker(self) -> dict:
        """What `.pipe/state.json` says about a SHARD_DIR this run writes."""
        return {"schema_version": 1, "tool": "pipe shard", "version": __version__, "input": str(self.input.resolve()),
                "settings": {k: getattr(self, k) for k in self.OUTPUT_SETTINGS}}

    def as_dict(self) -> dict:
        return {f.name: (str(v) if isinstance(v, Path) else v)
                for f in dataclasses.fields(self) for v in [getattr(self, f.name)]}
