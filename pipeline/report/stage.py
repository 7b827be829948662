"""`pipe report DIR... -o report.html`: recognise each folder, gather its facts, write the page.

Folders are recognised as `pipe check` recognises them (a clean dir has manifest.parquet, a shard
dir index.json), plus run dirs (metrics.jsonl from `pipe train`). The page is written atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core import files
from pipeline.core.errors import UsageError
from pipeline.report.config import ReportConfig
from pipeline.storage import Location, local_path, open_folder

if TYPE_CHECKING:  # the facts modules import pyarrow: only when a report is made
    from pipeline.report.render import Facts

MAX_PAGE_BYTES = 5 * 2**20  # the target; a bigger page is still written, with a warning


def detect(path: Location) -> str:
    """``clean``, ``shard`` or ``run``; anything else is a UsageError that says what the folder lacks."""
    from pipeline.check.stage import detect as check_detect

    folder = open_folder(path)
    try:
        return check_detect(folder)
    except UsageError as e:
        if folder.exists("metrics.jsonl"):
            return "run"
        if folder.state() == "folder":
            raise UsageError(f"{e} nor a run dir (metrics.jsonl from pipe train)") from None
        raise


def gather(dirs: list[Location], thumbnails: bool = True) -> list[tuple[str, Facts]]:
    """(kind, facts) for each folder, in order."""
    from pipeline.report import clean, run, shard

    kinds = [(d, detect(d)) for d in dirs]  # a bad folder stops us before any work
    out: list[tuple[str, Facts]] = []
    for d, kind in kinds:
        if kind == "clean":
            out.append((kind, clean.gather(d, thumbnails)))
        elif kind == "shard":
            out.append((kind, shard.gather(d, thumbnails)))
        else:
            out.append((kind, run.gather(d)))
    return out


def build(dirs: list[Location], thumbnails: bool = True, check: dict | None = None) -> str:
    from pipeline.report import render

    return render.page(gather(dirs, thumbnails), check=check)


def refuse_output_inside(path: Path, folders: list[Path], flag: str = "-o") -> None:
    """The page must not be a folder, nor land in a folder being reported on."""
    files.refuse_output_inside(path, folders, flag, "HTML", "reported on")


def write(html: str, path: Path) -> int:
    """Write the page atomically; returns its size in bytes."""
    from pipeline.core.files import atomic_write_text

    data = html.encode("utf-8")
    try:
        atomic_write_text(path, html)
    except OSError as e:
        raise UsageError(f"cannot write the report {path}: {e.strerror or e}") from None
    return len(data)


def run(cfg: ReportConfig) -> int:
    if not cfg.dirs:
        raise UsageError("give at least one folder to report on")
    data_dirs = [d for d in cfg.dirs if detect(d) != "run"]  # a run dir may hold its own report
    refuse_output_inside(cfg.output, [p for p in map(local_path, data_dirs) if p is not None])
    return write(build(cfg.dirs, cfg.thumbnails), cfg.output)
