"""The settings of `pipe check`: `CheckConfig`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class CheckConfig:
    """Settings of `pipe check`."""

    dirs: list[Path]
    """Clean dirs and/or shard dirs to check, each on its own."""
    policy: Path | None = None
    """TOML file of thresholds and severities (schemas/policy.schema.json); None: the defaults."""
    deep: bool = False
    """Decode every image (and parse every member) instead of reading headers only."""
    input: Path | None = None
    """The raw input folder a clean dir was made from, when it is not where report.json says."""
    workers: int = 0
    """Processes that read shards, (with --deep) decode a clean dir's images and sign its many texts; 0: one per core."""
