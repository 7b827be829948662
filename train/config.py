"""`pipe train`'s settings: one typed dataclass, a docstring per field.

Precedence: command line > the ``[train]`` table of ``--config`` (schemas/config.schema.json)
> these defaults. Imports no torch, so `pipe --help` stays fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass
class LaunchConfig:
    """How the ranks are started and find each other (torchrun's flags of the same name)."""

    nproc_per_node: int = 1
    """Local ranks to start, through torch's elastic launcher; ignored under an external torchrun."""
    nnodes: int = 1
    """Machines taking part; each runs the same command with its own --node-rank."""
    node_rank: int = 0
    """This machine's number, 0..nnodes-1 (static rendezvous)."""
    master_addr: str = "127.0.0.1"
    """Address of node 0, reachable from every node."""
    master_port: int = 0
    """Rendezvous port on node 0; 0 picks a free one (single node only)."""
    backend: str = "auto"
    """Process-group backend: auto (nccl with CUDA, else gloo), nccl or gloo."""
    max_restarts: int = 0
    """Times the elastic agent restarts the ranks after a failure."""
    rdzv_timeout: int = 900
    """Seconds to wait for every node to join the rendezvous."""


@dataclass
class TrainConfig(LaunchConfig):
    """Settings of `pipe train` (flags of the same name; `[train]` in a `--config` file)."""

    shard_dir: Path = Path(".")
    """SHARD_DIR written by pipe shard (its index.json is the entry point)."""
    output: Path = Path("run")
    """RUN_DIR: keys/, and later checkpoints, metrics and TensorBoard logs."""
    data_only: bool = False
    """Run only the data pipeline (no model) and report samples/s per rank."""
    epochs: int = 1
    """Passes over the train split."""
    batch_size: int = 32
    """Samples per step on each rank."""
    workers: int = 2
    """Dataloader worker processes per rank (0 = read in the training process)."""
    seed: int = 0
    """Seed of the per-epoch shard order and the shuffle buffer."""
    shuffle_buffer: int = 512
    """Samples each worker shuffles at a time (memory: this many undecoded samples per worker)."""
    record_keys: bool = False
    """Write the keys each rank consumed, per epoch, to RUN_DIR/keys/epoch{E}-rank{R}.txt."""

    def launch_config(self) -> LaunchConfig:
        return LaunchConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LaunchConfig)})

    def as_dict(self) -> dict:
        return {f.name: (str(v) if isinstance(v, Path) else v)
                for f in dataclasses.fields(self) for v in [getattr(self, f.name)]}
