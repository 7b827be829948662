"""`pipe labels RUN_DIR [--shards DIR]`. Thin, like `train/command.py`: `pipe --help` imports no numpy;
the analysis is `train/labels.py` (no torch either)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.common import exits_cleanly


@exits_cleanly
def labels(
    run_dir: Annotated[Path, typer.Argument(help="RUN_DIR written by pipe train.", show_default=False)],
    shards: Annotated[Path | None, typer.Option(
        "--shards", help="The run's SHARD_DIR, if it moved (default: from RUN_DIR/config.json).")] = None,
) -> None:
    """Rank the samples whose labels are probably wrong (writes RUN_DIR/label_issues.parquet).

    Train samples by their area under the margin over the epochs pipe train recorded, val samples
    by confident learning on the out-of-sample predictions, as many as the estimated noise rate
    says. Nothing is removed: review the file, then pass corrected labels to pipe clean --labels.
    """
    from train import labels as analysis

    findings = analysis.run(run_dir, shards)
    analysis.print_findings(findings, run_dir)
