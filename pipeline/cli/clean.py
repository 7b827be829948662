"""`pipe clean INPUT -o CLEAN_DIR`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.common import exits_cleanly, folder_arg
from pipeline.executors import HELP
from pipeline.storage import EXAMPLE_URL

EXECUTORS = HELP.replace("[", "\\[")  # (rich markup: "[ray]" is text here)


@exits_cleanly
def clean(
    ctx: typer.Context,
    input: Annotated[str, typer.Argument(help=f"The raw dataset folder, or {EXAMPLE_URL} (never modified).", show_default=False)],
    output: Annotated[str, typer.Option("--output", "-o", help=f"CLEAN_DIR to write, or {EXAMPLE_URL}.", show_default=False)],
    size: Annotated[int, typer.Option(help="Side of the square output images, in pixels.")] = 512,
    resize_mode: Annotated[str, typer.Option(help="pad (letterbox), crop (centre) or stretch.")] = "pad",
    format: Annotated[str, typer.Option("--format", help="Output image format: jpg, png or webp.")] = "jpg",
    quality: Annotated[int, typer.Option(help="JPEG/WebP quality, 1-100.")] = 90,
    min_size: Annotated[int, typer.Option(help="Quarantine images whose short side is below this (px).")] = 32,
    max_pixels: Annotated[int, typer.Option(help="Decompression-bomb limit, from the header, before decoding.")] = 178_956_970,
    background: Annotated[str, typer.Option(
        help="Colour under transparency and padding: white, black, grey, #rrggbb. Artwork it would erase (white on "
             "transparency under white) goes on the contrasting colour instead.")] = "white",
    max_text_bytes: Annotated[str, typer.Option(
        help="Quarantine text files larger than this as too_large, from their size before reading (bytes, or 16MiB, "
             "200MB...). 16 MiB is five long novels; above that a .txt is a log or a dump, and judging it takes a "
             "few times its size in memory per worker.")] = "16MiB",
    labels: Annotated[Path | None, typer.Option(help="labels.csv|jsonl with path,label[,text] instead of class folders.")] = None,
    label_conflicts: Annotated[str, typer.Option(help="Same content, different labels: quarantine, majority or first.")] = "quarantine",
    near_dedup: Annotated[bool, typer.Option(help="Find near duplicates too (perceptual hash + pixels, MinHash + Jaccard).")] = True,
    near_image_distance: Annotated[int, typer.Option(
        help="Perceptual-hash bits apart for two images to be compared on pixels (0-12).")] = 8,
    near_text_jaccard: Annotated[float, typer.Option(
        help="Shingle Jaccard similarity from which texts are near duplicates (0.5-1).")] = 0.8,
    workers: Annotated[int, typer.Option(help="Worker processes (0 = one per core).")] = 0,
    file_timeout: Annotated[float, typer.Option(
        help="Seconds one file may take before it is quarantined as timeout (0 = no limit).")] = 120.0,
    overwrite: Annotated[bool, typer.Option(help="Replace a CLEAN_DIR made from other input or settings.")] = False,
    executor: Annotated[str, typer.Option(help=f"Who processes the files: {EXECUTORS}. On a cluster, a local INPUT "
                                               "and CLEAN_DIR must be on a file system every node mounts at the same "
                                               "path; object storage is read and written by the nodes themselves.")] = "local",
    ray_address: Annotated[str, typer.Option(help="The Ray cluster for --executor ray: auto or HOST:PORT.")] = "auto",
    part_files: Annotated[int, typer.Option(help="Files per part (one Ray task) with --executor ray.")] = 1000,
    config: Annotated[Path | None, typer.Option(help="TOML file whose \\[clean] table sets any of these flags.")] = None,
    json: Annotated[bool, typer.Option("--json", help="Print the report as JSON instead of a table.")] = False,
) -> None:
    """Validate, normalise and deduplicate INPUT into CLEAN_DIR; every file gets a status.

    Images become RGB at --size x --size; texts become UTF-8 NFC; duplicates and broken files are
    set aside with a reason in manifest.parquet. Re-running resumes; exit 0 whenever it finished.
    """
    from pipeline.clean import stage
    from pipeline.core.config import explicit_params, load_section, resolve

    values = {k: v for k, v in locals().items() if k not in ("ctx", "config", "json", "stage", "ui")}
    values["input"], values["output"] = folder_arg(input), folder_arg(output)
    cfg = resolve(stage.CleanConfig, values, explicit_params(ctx), load_section(config, "clean"))
    from pipeline import executors

    report = stage.run(cfg, show_progress=not json, executor=executors.get(cfg.executor, address=cfg.ray_address,
                                                                              workers=cfg.workers))
    from pipeline.core import ui  # rich: imported while the workers start, not before

    if json:
        ui.print_json(report)
    else:
        _summary(report, cfg)


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
