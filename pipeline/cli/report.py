"""`pipe report DIR... -o report.html [--no-thumbnails]`."""

from __future__ import annotations

from typing import Any

import typer

from pipeline.cli import options
from pipeline.cli.common import exits_cleanly
from pipeline.report.config import ReportConfig


@options.command(ReportConfig, "report")
@exits_cleanly
def report(ctx: typer.Context, **given: Any) -> None:
    """Write one self-contained HTML page about clean, shard and run folders.

    No script, nothing fetched: it opens offline in any browser. Shows what was quarantined and
    why, which copies were merged, label conflicts, classes, image sizes, text encodings, and a
    run's loss, learning rate, data-wait share and drift alarms.
    """
    from pipeline.core import ui
    from pipeline.report import stage

    cfg = options.read(ctx, ReportConfig, "report", given)
    size = stage.run(cfg)
    ui.out_console.print(f"wrote {ui.shown(cfg.output)} ({size / 2**20:.2f} MiB)", highlight=False, markup=False)
    if size > stage.MAX_PAGE_BYTES:
        ui.err_console.print(f"warning: the page is over {stage.MAX_PAGE_BYTES // 2**20} MiB; "
                             "--no-thumbnails makes it small", highlight=False, markup=False)
