"""`pipe labels RUN_DIR [--shards DIR]`. Thin, like `train/command.py`: `pipe --help` imports no numpy;
the analysis is `train/labels.py` (no torch either)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from pipeline.cli import options
from pipeline.cli.common import exits_cleanly
from pipeline.core.settings import setting


@dataclass
class LabelsConfig:
    """Settings of `pipe labels` (flags of the same name; `[labels]` in a `--config` file)."""

    run_dir: Path = setting(help="RUN_DIR written by pipe train.", argument=True, required=True, toml=False)
    shards: Path | None = setting(None, "The run's SHARD_DIR, if it moved (default: from RUN_DIR/config.json).",
                                  flags=("--shards",))


@options.command(LabelsConfig, "labels")
@exits_cleanly
def labels(ctx: typer.Context, **given: Any) -> None:
    """Rank the samples whose labels are probably wrong (writes RUN_DIR/label_issues.parquet).

    Train samples by their area under the margin over the epochs pipe train recorded, val samples
    by confident learning on the out-of-sample predictions, as many as the estimated noise rate
    says. Nothing is removed: review the file, then pass corrected labels to pipe clean --labels.
    """
    from train import labels as analysis

    cfg = options.read(ctx, LabelsConfig, "labels", given)
    if analysis.objective_of(cfg.run_dir) == "contrastive":  # which captions sit on the wrong image
        from train import mismatched

        shards, index = analysis.open_run(cfg.run_dir, cfg.shards)
        findings = mismatched.run(cfg.run_dir, shards, index)
        analysis.write(cfg.run_dir, findings)
    else:
        findings = analysis.run(cfg.run_dir, cfg.shards)
    analysis.print_findings(findings, cfg.run_dir)
