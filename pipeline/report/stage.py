"""`pipe report DIR... -o report.html`: recognise each folder, gather its facts, write the page.

Folders are recognised as `pipe check` recognises them (a clean dir has manifest.parquet, a shard
dir index.json), plus run dirs (metrics.jsonl from `pipe train`). The page is written atomically.

What the page reads is bounded by the command line: files inside the folders given (and the raw
inputs given with --input), each opened and checked to be inside; a path in report.json, the
manifest or an index is only ever looked up inside one of those.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core import files
from pipeline.core.errors import UsageError
from pipeline.report.config import ReportConfig
from pipeline.storage import Folder, Location, local_path, open_folder

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


def gather(dirs: list[Location], thumbnails: bool = True, inputs: Sequence[Location] = ()) -> list[tuple[str, Facts]]:
    """(kind, facts) for each folder, in order. Files are read only inside ``dirs`` and ``inputs``
    (the raw folders of the clean dirs): never where a folder's own files say."""
    from pipeline.report import clean, run, shard

    kinds = [(d, detect(d)) for d in dirs]  # a bad folder stops us before any work
    given = [_input_folder(i) for i in inputs]
    cleans = [open_folder(d) for d, kind in kinds if kind == "clean"]
    raw = dict(zip(cleans, clean.match_inputs(cleans, given)))
    out: list[tuple[str, Facts]] = []
    for d, kind in kinds:
        if kind == "clean":
            folder = open_folder(d)
            out.append((kind, clean.gather(folder, thumbnails, *raw[folder])))
        elif kind == "shard":
            out.append((kind, shard.gather(d, thumbnails)))
        else:
            out.append((kind, run.gather(d)))
    if thumbnails:
        _label_issue_previews(out, [(c, raw[c][0]) for c in cleans])
    return out


def _input_folder(where: Location) -> Folder:
    folder = open_folder(where)
    if folder.state() != "folder":
        raise UsageError(f"--input {folder.url} is not a folder")
    return folder


def _label_issue_previews(facts: list[tuple[str, Facts]], cleans: list[tuple[Folder, Folder | None]]) -> None:
    """`pipe labels`' candidates are samples a person must look at: their images come from the
    clean dirs given (the kept output of the sample with that key and source)."""
    from pipeline.report import clean
    from pipeline.report.run import RunFacts

    for _kind, f in facts:
        if not isinstance(f, RunFacts) or not f.label_issues:
            continue
        wanted = {str(r["key"]): str(r.get("source") or "") for r in f.label_issues}
        found: dict = {}
        for folder, raw in cleans:
            missing = {k: v for k, v in wanted.items() if k not in found}
            if missing:
                found.update(clean.previews_by_key(folder, raw, missing))
        f.previews = {k: found[k] for k in wanted if k in found}
        f.previews_from = len(cleans)


def build(dirs: list[Location], thumbnails: bool = True, check: dict | None = None,
          inputs: Sequence[Location] = ()) -> str:
    from pipeline.report import render

    return render.page(gather(dirs, thumbnails, inputs), check=check)


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
    data_dirs += list(cfg.input)  # nothing is ever written into an input
    refuse_output_inside(cfg.output, [p for p in map(local_path, data_dirs) if p is not None])
    return write(build(cfg.dirs, cfg.thumbnails, inputs=cfg.input), cfg.output)
