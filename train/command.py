"""`pipe train SHARD_DIR -o RUN_DIR`. Imports no torch at module level: `pipe --help` stays fast.

The command is thin: flags -> `TrainConfig` (command line > TOML > defaults) -> checks that
need no torch (exit 2 on a mistake) -> `launch(config, entry, config)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.commands.common import exits_cleanly


@exits_cleanly
def train(
    ctx: typer.Context,
    shard_dir: Annotated[Path, typer.Argument(help="SHARD_DIR written by pipe shard.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="RUN_DIR to write.", show_default=False)],
    data_only: Annotated[bool, typer.Option("--data-only", help="Run only the data pipeline and print samples/s per rank.")] = False,
    epochs: Annotated[int, typer.Option(help="Passes over the train split.")] = 1,
    batch_size: Annotated[int, typer.Option(help="Samples per step on each rank.")] = 32,
    workers: Annotated[int, typer.Option(help="Dataloader workers per rank (0 = in the training process).")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the shard order and the shuffle.")] = 0,
    shuffle_buffer: Annotated[int, typer.Option(help="Samples each worker shuffles at a time.")] = 512,
    record_keys: Annotated[bool, typer.Option("--record-keys", help="Write RUN_DIR/keys/epoch{E}-rank{R}.txt.")] = False,
    nproc_per_node: Annotated[int, typer.Option(help="Local ranks to start (torch's elastic launcher).")] = 1,
    nnodes: Annotated[int, typer.Option(help="Machines taking part.")] = 1,
    node_rank: Annotated[int, typer.Option(help="This machine's number, 0..nnodes-1.")] = 0,
    master_addr: Annotated[str, typer.Option(help="Address of node 0.")] = "127.0.0.1",
    master_port: Annotated[int, typer.Option(help="Rendezvous port on node 0 (0 = a free one, single node).")] = 0,
    backend: Annotated[str, typer.Option(help="auto (nccl with CUDA, else gloo), nccl or gloo.")] = "auto",
    max_restarts: Annotated[int, typer.Option(help="Restarts of failed ranks by the elastic agent.")] = 0,
    rdzv_timeout: Annotated[int, typer.Option(help="Seconds to wait for every node to join.")] = 900,
    config: Annotated[Optional[Path], typer.Option(help="TOML file whose [train] table sets any of these flags.")] = None,
) -> None:
    """Train on SHARD_DIR with DDP (torchrun, or --nproc-per-node local ranks).

    --data-only runs just the streaming data pipeline under the same launcher and prints
    samples/s per rank; --record-keys writes the keys each rank consumed per epoch.
    """
    from pipeline.config import explicit_params, load_section, resolve
    from pipeline.errors import UsageError
    from train.config import TrainConfig

    values = {k: v for k, v in locals().items() if k not in ("ctx", "config")}
    cfg = resolve(TrainConfig, values, explicit_params(ctx), load_section(config, "train"))
    check(cfg)
    if not cfg.data_only:
        raise UsageError("model training is not built yet: run with --data-only")
    from train import data_only
    from train.launch import launch

    launch(cfg.launch_config(), data_only.main, cfg)


def check(cfg) -> None:
    """Mistakes found before any rank starts: one line, exit 2."""
    from pipeline import shard_index
    from pipeline.errors import UsageError
    from train.launch import validate, world_size
    from train.plan import epoch_plan

    validate(cfg.launch_config())
    for ok, message in [
        (cfg.epochs >= 1, f"--epochs must be at least 1, got {cfg.epochs}"),
        (cfg.batch_size >= 1, f"--batch-size must be at least 1, got {cfg.batch_size}"),
        (cfg.workers >= 0, f"--workers must be 0 or more, got {cfg.workers}"),
        (cfg.shuffle_buffer >= 0, f"--shuffle-buffer must be 0 or more, got {cfg.shuffle_buffer}"),
    ]:
        if not ok:
            raise UsageError(message)
    index = shard_index.load(cfg.shard_dir)
    counts = [s["count"] for s in index["shards"] if s["split"] == "train"]
    try:
        epoch_plan(counts, world_size(cfg.launch_config()), cfg.batch_size, cfg.seed, 0)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        cfg.output.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create RUN_DIR {cfg.output}: {e.strerror or e}") from None
