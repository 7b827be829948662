"""`pipe shard CLEAN_DIR -o SHARD_DIR`."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import typer

from pipeline.cli import options
from pipeline.cli.common import exits_cleanly
from pipeline.core.settings import setting
from pipeline.shard.config import ShardConfig


@dataclass
class ShardFlags:
    """What `pipe shard` reads that is no setting of the stage (not a `[shard]` key)."""

    json: bool = setting(False, "Print the summary as JSON instead of a table.", flags=("--json",), toml=False)


@options.command(ShardConfig, "shard", ShardFlags)
@exits_cleanly
def shard(ctx: typer.Context, **given: Any) -> None:
    """Write CLEAN_DIR's kept samples as deterministic webdataset shards plus index.json.

    Samples are split per class into train/val (near duplicates on one side), shuffled with
    --seed and cut by --max-count/--max-size. Image-caption pairs without a label are samples too
    (for pipe train --objective contrastive); an image or a text alone without a label is left out
    and counted. The same CLEAN_DIR and settings give byte-identical shards; rerun into the same
    SHARD_DIR, shards an interrupted run finished are kept.
    """
    from pipeline.core import ui
    from pipeline.shard import stage

    json = given["json"]
    cfg = options.read(ctx, ShardConfig, "shard", given)
    from pipeline import executors

    summary = stage.run(cfg, show_progress=not json,
                        executor=executors.get(cfg.executor, address=cfg.ray_address, workers=cfg.workers,
                                           keep_warm=cfg.ray_keep_warm))
    if json:
        ui.print_json(summary)
        return
    rows = [("classes", summary["classes"]), ("image size", summary["image_size"] or "-"),
            ("train", f"{summary['train']} samples in {_shards(summary['train_shards'])}"),
            ("val", f"{summary['val']} samples in {_shards(summary['val_shards'])}"),
            ("left out: no label, no pair", summary["unlabelled"]),
            ("near-duplicate groups", summary["near_duplicate_groups"]),
            ("size", f"{summary['bytes'] / 1e6:.1f} MB"),
            ("time", f"{sum(summary['timings'].values()):.1f} s")]
    if summary["reused_shards"]:
        rows.append(("kept from an earlier run", f"{_shards(summary['reused_shards'])} (same plan, sha256 checked)"))
    ui.summary_table(f"pipe shard -> {cfg.output}", rows)
    for w in summary["warnings"]:
        sys.stderr.write(f"warning: {ui.shown(w)}\n")


def _shards(n: int) -> str:
    return f"{n} shard" if n == 1 else f"{n} shards"
