"""`pipe report DIR... -o report.html [--no-thumbnails]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.common import exits_cleanly, folder_arg
from pipeline.storage import EXAMPLE_URL


@exits_cleanly
def report(
    ctx: typer.Context,
    dirs: Annotated[list[str], typer.Argument(help="Clean dirs (manifest.parquet), shard dirs (index.json) and/or run dirs "
                                                   f"(metrics.jsonl), local or {EXAMPLE_URL}.", show_default=False)],
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")] = Path("report.html"),
    thumbnails: Annotated[bool, typer.Option("--thumbnails/--no-thumbnails", help="Put image previews and text snippets in the "
                                             "page (off: for data that must not be copied).")] = True,
    config: Annotated[Path | None, typer.Option(help="TOML file whose \\[report] table sets any of these flags.")] = None,
) -> None:
    """Write one self-contained HTML page about clean, shard and run folders.

    No script, nothing fetched: it opens offline in any browser. Shows what was quarantined and
    why, which copies were merged, label conflicts, classes, image sizes, text encodings, and a
    run's loss, learning rate, data-wait share and drift alarms.
    """
    from pipeline.core import ui
    from pipeline.core.config import explicit_params, load_section, resolve
    from pipeline.report import stage

    values = {"dirs": [folder_arg(d) for d in dirs], "output": output, "thumbnails": thumbnails}
    cfg = resolve(stage.ReportConfig, values, explicit_params(ctx), load_section(config, "report"))
    size = stage.run(cfg)
    ui.out_console.print(f"wrote {cfg.output} ({size / 2**20:.2f} MiB)", highlight=False, markup=False)
    if size > stage.MAX_PAGE_BYTES:
        ui.err_console.print(f"warning: the page is over {stage.MAX_PAGE_BYTES // 2**20} MiB; "
                             "--no-thumbnails makes it small", highlight=False, markup=False)
