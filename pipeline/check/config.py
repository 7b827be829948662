"""The settings of `pipe check`: `CheckConfig`, each declared once (`pipeline.core.settings`):
its flag, its `[check]` key in a `--config` file, its schema and its range."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core.settings import setting
from pipeline.storage import EXAMPLE_URL, Location


@dataclass
class CheckConfig:
    """Settings of `pipe check` (flags of the same name; `[check]` in a `--config` file)."""

    dirs: list[Location] = setting(help="Clean dirs (manifest.parquet) and/or shard dirs (index.json), local or "
                                        f"{EXAMPLE_URL}; each is checked on its own.",
                               argument=True, required=True, remote=True, toml=False)
    policy: Path | None = setting(None, "TOML file of thresholds and severities (schemas/policy.schema.json); "
                                        "default: the policy's defaults.")
    deep: bool = setting(False, "Decode every image in every output and shard (and parse every member), not only "
                                "headers.", flags=("--deep",))
    input: Location | None = setting(None, f"Raw input folder (or {EXAMPLE_URL}) of a clean dir, when not where its "
                                       "report.json says.", remote=True)
    workers: int = setting(0, "Processes reading shards and, with --deep, decoding a clean dir's images and signing its "
                              "many texts (0 = one per core).", minimum=0)
