"""`pipe shard CLEAN_DIR -o SHARD_DIR`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.common import exits_cleanly, folder_arg
from pipeline.executors import HELP
from pipeline.storage import EXAMPLE_URL

EXECUTORS = HELP.replace("[", "\\[")  # (rich markup: "[ray]" is text here)


@exits_cleanly
def shard(
    ctx: typer.Context,
    input: Annotated[str, typer.Argument(help=f"CLEAN_DIR written by pipe clean, or {EXAMPLE_URL} (never modified).",
                                         show_default=False)],
    output: Annotated[str, typer.Option("--output", "-o", help=f"SHARD_DIR to write, or {EXAMPLE_URL}.", show_default=False)],
    val_fraction: Annotated[float, typer.Option(help="Share of each class for validation.")] = 0.1,
    max_count: Annotated[int, typer.Option(help="Most samples per shard.")] = 1000,
    max_size: Annotated[int, typer.Option(help="Most bytes per shard (tar headers and padding counted).")] = 1 << 30,
    seed: Annotated[int, typer.Option(help="Seed of the split and the shuffle.")] = 0,
    split_distance: Annotated[int, typer.Option(help="Images within this many perceptual-hash bits stay on one side of the split.")] = 6,
    expected_ranks: Annotated[int, typer.Option(help="Ranks you expect to train with (sizes the 'too few shards' warning).")] = 8,
    expected_workers: Annotated[int, typer.Option(help="Dataloader workers per rank you expect to train with.")] = 4,
    workers: Annotated[int, typer.Option(help="Processes that decode images to measure them (0 = one per core).")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace a SHARD_DIR pipe shard made from other input or settings.")] = False,
    executor: Annotated[str, typer.Option(help=f"Who writes the shards (one part each): {EXECUTORS}. On a cluster, a "
                                               "local CLEAN_DIR and SHARD_DIR must be on a file system every node "
                                               "mounts at the same path; object storage is read and written by the "
                                               "nodes themselves.")] = "local",
    ray_address: Annotated[str, typer.Option(help="The Ray cluster for --executor ray: auto or HOST:PORT.")] = "auto",
    config: Annotated[Path | None, typer.Option(help="TOML file whose \\[shard] table sets any of these flags.")] = None,
    json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON instead of a table.")] = False,
) -> None:
    """Write CLEAN_DIR's kept samples as deterministic webdataset shards plus index.json.

    Samples are split per class into train/val (near duplicates on one side), shuffled with
    --seed and cut by --max-count/--max-size. Kept samples without a label are left out and
    counted. The same CLEAN_DIR and settings give byte-identical shards; rerun into the same
    SHARD_DIR, shards an interrupted run finished are kept.
    """
    from pipeline.core import ui
    from pipeline.core.config import explicit_params, load_section, resolve
    from pipeline.shard import stage

    values = {k: v for k, v in locals().items() if k not in ("ctx", "config", "json", "stage", "ui")}
    values["input"], values["output"] = folder_arg(input), folder_arg(output)
    cfg = resolve(stage.ShardConfig, values, explicit_params(ctx), load_section(config, "shard"))
    from pipeline import executors

    summary = stage.run(cfg, show_progress=not json, executor=executors.get(cfg.executor, address=cfg.ray_address,
                                                                               workers=cfg.workers))
    if json:
        ui.print_json(summary)
        return
    rows = [("classes", summary["classes"]), ("image size", summary["image_size"] or "-"),
            ("train", f"{summary['train']} samples in {_shards(summary['train_shards'])}"),
            ("val", f"{summary['val']} samples in {_shards(summary['val_shards'])}"),
            ("left out: no label", summary["unlabelled"]),
            ("near-duplicate groups", summary["near_duplicate_groups"]),
            ("size", f"{summary['bytes'] / 1e6:.1f} MB"),
            ("time", f"{sum(summary['timings'].values()):.1f} s")]
    if summary["reused_shards"]:
        rows.append(("kept from an earlier run", f"{_shards(summary['reused_shards'])} (same plan, sha256 checked)"))
    ui.summary_table(f"pipe shard -> {cfg.output}", rows)
    for w in summary["warnings"]:
        sys.stderr.write(f"warning: {w}\n")


def _shards(n: int) -> str:
    return f"{n} shard" if n == 1 else f"{n} shards"
