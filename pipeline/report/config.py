"""The settings of `pipe report`: `ReportConfig`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class ReportConfig:
    """Settings of `pipe report`."""

    dirs: list[Path]
    """Clean, shard and run dirs, in the order the page shows them."""
    output: Path = Path("report.html")
    """The HTML file to write."""
    thumbnails: bool = True
    """Previews of images (and snippets of texts) in the page; off for data that must not be copied."""
