"""`pipe clean INPUT -o CLEAN_DIR`."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import typer

from pipeline.clean.config import CleanConfig
from pipeline.cli import options
from pipeline.cli.common import exits_cleanly
from pipeline.core.settings import setting


@dataclass
class CleanFlags:
    """What `pipe clean` reads that is no setting of the stage (not a `[clean]` key)."""

    json: bool = setting(False, "Print the report as JSON instead of a table.", flags=("--json",), toml=False)


@options.command(CleanConfig, "clean", CleanFlags)
@exits_cleanly
def clean(ctx: typer.Context, **given: Any) -> None:
    """Validate, normalise and deduplicate INPUT into CLEAN_DIR; every file gets a status.

    Images become RGB at --size x --size; texts become UTF-8 NFC; duplicates and broken files are
    set aside with a reason in manifest.parquet. Re-running resumes; exit 0 whenever it finished.
    """
    from pipeline.clean import stage

    cfg = options.read(ctx, CleanConfig, "clean", given)
    from pipeline import executors

    report = stage.run(cfg, show_progress=not given["json"],
                       executor=executors.get(cfg.executor, address=cfg.ray_address, workers=cfg.workers,
                                          keep_warm=cfg.ray_keep_warm))
    from pipeline.core import ui  # rich: imported while the workers start, not before

    if given["json"]:
        ui.print_json(report)
    else:
        _summary(report, cfg)
        for w in report.get("warnings", ()):
            sys.stderr.write(f"warning: {w}\n")


def _summary(report: dict, cfg) -> None:
    from pipeline.core import ui
    from pipeline.formats.vocabulary import Status

    st = report["by_status"]
    rows = [("files", report["files"])]
    for status in Status:
        rows.append((status.value, st[status]))
        rows += [(f"  {reason}", n) for reason, n in report["by_reason"].items() if _status_of(reason) == status]
    rows += _label_rows(report.get("labels") or {})
    rows.append(("time", f"{sum(report['timings'].values()):.1f} s"))
    ui.summary_table(f"pipe clean -> {cfg.output}", rows)


def _status_of(reason: str):
    """The status a reason's files have: the two duplicate reasons are duplicates, every other
    reason quarantines (decide.py gives no other combination)."""
    from pipeline.formats.vocabulary import Reason, Status

    return Status.DUPLICATE if reason in (Reason.EXACT_DUPLICATE, Reason.NEAR_DUPLICATE) else Status.QUARANTINED


# what --labels did not fit, as report.json's "labels" names it -> how the console says it
LABEL_NOTES = {
    "rows_naming_missing_files": "rows naming missing files",
    "files_without_label": "files no row names",
    "rows_without_label": "rows without a label",
    "conflicting_rows": "re-labelled rows (first kept)",
    "captions_rejected": "captions rejected",
    "captions_ignored_for_a_caption_file": "captions ignored (caption file wins)",
}


def _label_rows(notes: dict) -> list[tuple[str, object]]:
    """The labels file's problems as counts, so they are seen without opening report.json
    (which lists the first rows of each)."""
    found = [(f"  {text}", notes[name]["count"]) for name, text in LABEL_NOTES.items() if name in notes]
    return [("labels file (see report.json)", ""), *found] if found else []
