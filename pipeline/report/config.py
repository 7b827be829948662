"""The settings of `pipe report`: `ReportConfig`, each declared once (`pipeline.core.settings`):
its flag, its `[report]` key in a `--config` file and its schema."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core.settings import setting
from pipeline.storage import EXAMPLE_URL, Location


@dataclass
class ReportConfig:
    """Settings of `pipe report` (flags of the same name; `[report]` in a `--config` file)."""

    dirs: list[Location] = setting(help="Clean dirs (manifest.parquet), shard dirs (index.json) and/or run dirs "
                                        f"(metrics.jsonl), local or {EXAMPLE_URL}, in the order the page shows them.",
                                   argument=True, required=True, remote=True, toml=False)
    output: Path = setting(Path("report.html"), "The HTML file to write.", flags=("-o", "--output"))
    thumbnails: bool = setting(True, "Put image previews and text snippets in the page (off: for data that must not be "
                                     "copied).", flags=("--thumbnails/--no-thumbnails",))
    input: tuple[Location, ...] = setting((), "The raw folder a clean dir was made from (again for each clean dir): "
                                              "previews of files that are only there (duplicates) come from it. Pages "
                                              "read files only inside the folders named on the command line, never "
                                              "where a folder's own files point.", remote=True, toml=False)
