"""The settings of `pipe shard`: `ShardConfig`, each declared once (`pipeline.core.settings`):
its flag, its `[shard]` key in a `--config` file, its schema and its range or choices."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline import __version__
from pipeline.core import settings
from pipeline.core.settings import setting
from pipeline.executors import EXECUTORS, HELP, address_setting, keep_warm_setting
from pipeline.storage import EXAMPLE_URL, Location, open_folder

TOOL = "pipe shard"
# the layout the 'too few shards' warning assumes when nobody said how they will train
DEFAULT_RANKS, DEFAULT_WORKERS = 8, 4


@dataclass
class ShardConfig:
    """Settings of `pipe shard` (flags of the same name; `[shard]` in a `--config` file)."""

    input: Location = setting(help=f"CLEAN_DIR written by pipe clean, or {EXAMPLE_URL} (its manifest.parquet is read; "
                               "never modified).", argument=True, required=True, remote=True, toml=False)
    output: Location = setting(help=f"SHARD_DIR to write ({{train,val}}-NNNNNN.tar and index.json), or {EXAMPLE_URL}.",
                           flags=("--output", "-o"), required=True, remote=True, toml=False)
    val_fraction: float = setting(0.1, "Share of each class for validation (at least one sample of every class with "
                                       "two or more).", minimum=0, below=1)
    max_count: int = setting(1000, "Most samples per shard.", minimum=1)
    max_size: int = setting(1 << 30, "Most bytes per shard, tar headers and padding counted; only a single larger "
                                     "sample exceeds it.", minimum=4096, unit="bytes")
    seed: int = setting(0, "Seed of the split and of the shuffle before sharding.", minimum=0)
    pairs_only: bool = setting(
        False, "Keep only image-caption pairs (what pipe train --objective contrastive reads): an image or a text alone "
               "is left out, labelled or not, and counted in index.json (excluded.not_pairs).", flags=("--pairs-only",))
    split_distance: int = setting(
        6, "Images within this many perceptual-hash bits (of 64) stay on one side of the split. Its cost grows with "
           "the square of the image count over 2^(64/(d+1)): about 1 s per 100k images at 6, 10 s at 8.",
        minimum=0, maximum=32, unit="bits")
    expected_ranks: int = setting(DEFAULT_RANKS, "Ranks you expect to train with (sizes the 'too few shards' warning, "
                                                 "which the defaults give only for a large train split).", minimum=1)
    expected_workers: int = setting(DEFAULT_WORKERS, "Dataloader workers per rank you expect to train with (for the "
                                                     "same warning).", minimum=0)
    workers: int = setting(0, "Processes that write shards (from 16 shards on: this one and helpers) and "
                                "decode images to measure them (0 = one per core).", minimum=0)
    overwrite: bool = setting(False, "Replace a SHARD_DIR that pipe shard made from other input or settings (its "
                                     ".pipe/state.json says so); a folder pipe shard did not write is refused regardless.")
    executor: str = setting(
        "local", f"Who writes the shards (one part each): {HELP}. On a cluster, a local CLEAN_DIR and SHARD_DIR must "
                 "be on a file system every node mounts at the same path; object storage is read and written by the "
                 "nodes themselves.", choices=tuple(EXECUTORS))
    ray_address: str = address_setting()
    ray_keep_warm: float = keep_warm_setting()

    # settings that change what is written; a SHARD_DIR made with others is replaced only with --overwrite
    OUTPUT_SETTINGS = ("val_fraction", "max_count", "max_size", "seed", "split_distance")
    # ... and those recorded (marker, index.json) only where they differ from this: a SHARD_DIR made without
    # them keeps the bytes it always had, and one made before they existed still resumes
    OPTED_IN = {"pairs_only": False}

    def marker(self) -> dict:
        """What `.pipe/state.json` says about a SHARD_DIR this run writes."""
        return {"schema_version": 1, "tool": TOOL, "version": __version__, "input": open_folder(self.input).identity(),
                "settings": {k: getattr(self, k) for k in self.OUTPUT_SETTINGS} | self.opted_in()}

    def opted_in(self) -> dict:
        """The `OPTED_IN` settings given other values than their default (--pairs-only), as recorded."""
        return {k: getattr(self, k) for k, off in self.OPTED_IN.items() if getattr(self, k) != off}

    def as_dict(self) -> dict:
        return settings.as_dict(self)
