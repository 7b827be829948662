"""`pipe clean`: every input file ends with exactly one status in the manifest.

Three phases, whatever the storage (`pipeline.storage.Folder`: INPUT and CLEAN_DIR local or in
object storage) and the executor (`pipeline.executors`: this machine's processes or a cluster's):

1. process: the sorted candidates are cut into parts (`parts.py`); each file is read once in a
   worker (`process.process`), judged, and its cleaned output written under ``data/``; each
   part's results are written last, where it ran. Results whose input is unchanged since a
   previous (possibly killed) run are reused from those results files.
2. decide: duplicates, caption pairs and label conflicts, over all results (`decide`).
3. finalize: outputs of files that did not end kept are parked, rejected inputs are copied to
   ``quarantine/<reason>/``, stale files are swept, then ``report.json`` and, last,
   ``manifest.parquet`` are written (`finalize.py`). The manifest's presence means the folder
   is complete.

Settings and their checks are in `config.py`; CLEAN_DIR's claiming, resuming and changing in
`output.py`.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from pathlib import Path

from pipeline.clean import WORKER_MODULES
from pipeline.clean.config import (  # noqa: F401 - the stage's settings, as callers have always imported them
    CONFLICT_POLICIES,
    FORMATS,
    MAX_SIZE,
    PART_FILES,
    RESIZE_MODES,
    CleanConfig,
    parse_colour,
    validate,
)
from pipeline.clean.discover import Candidate, discover
from pipeline.clean.output import COMMIT, PARKED, TOOL, CleanDir, marker  # noqa: F401 - PARKED, marker: where they always were
from pipeline.clean.process import WorkerSettings, crashed, init_worker, process, timed_out
from pipeline.core.errors import StageFailed
from pipeline.executors import Executor, Items
from pipeline.media.image.clean import ImageSettings
from pipeline.media.image.window import parse_window
from pipeline.media.text.clean import TextSettings
from pipeline.storage import open_folder
from pipeline.storage.output import committed_by_another_run, refuse_foreign

# Small files go to the workers BATCH_FILES to a message: a message per file cost the main
# process ~0.2-0.3 ms of CPU, as much as a small text's whole judging in the worker
BATCH_FILES, BATCH_BYTES = 16, 256 * 1024
# The first files a new CLEAN_DIR's workers start on while the driver lists the rest (`discover`'s
# ``first``): enough to keep two workers busy through the listing's ~0.15-0.3 s with camera JPEGs
# (and past a stray first file, a text or a marker, that sorts before the photos)
AHEAD_FILES = 8


def run(cfg: CleanConfig, show_progress: bool = True, executor: Executor | None = None) -> dict:
    """Run the whole stage on ``executor`` (default: the one ``cfg`` names); return the report
    (also written to report.json).

    CLEAN_DIR is locked for the whole run where its storage can lock (a second run into it stops
    at once), and only after it is known to be empty or pipe clean's: the lock file is the first
    thing written."""
    from pipeline import executors

    validate(cfg)
    if executor is None:
        executor = executors.get(cfg.executor, address=cfg.ray_address, workers=cfg.workers, keep_warm=cfg.ray_keep_warm)
    out, inp = open_folder(cfg.output), open_folder(cfg.input)
    refuse_foreign(out, TOOL)
    with out.lock(TOOL):
        CleanDir.claim(cfg, out)
        with out.staging("clean") as staging:
            place = CleanDir(cfg, out, inp, Path(staging))
            work, fresh = items(cfg), place.fresh()
            with executor.session(items=work, warm=fresh):
                try:
                    # a new CLEAN_DIR's first files are its first part's first items: the workers start on them while the rest is listed
                    return _run(cfg, place, executor, show_progress, partial(executor.ahead, work) if fresh else None)
                except StageFailed:
                    if place.committed_elsewhere():  # (and cleared what this run still needed: say why it stopped)
                        raise committed_by_another_run(out, COMMIT) from None
                    raise


def items(cfg: CleanConfig, start=None, finish=None) -> Items:
    """The per-file work: `process.process` in workers set up with this run's settings; a part
    begins with ``start`` and ends with ``finish`` (`parts.start_part`, `parts.finish_part`)."""
    inp = open_folder(cfg.input)
    return Items(process, partial(crashed, inp), initializer=init_worker, initargs=(worker_settings(cfg),),
                 timeout=cfg.file_timeout or None, on_timeout=partial(timed_out, inp), batch=BATCH_FILES, batchable=small,
                 start=start, finish=finish, name="clean_part", preload=WORKER_MODULES)


def _run(cfg: CleanConfig, place: CleanDir, executor: Executor, show_progress: bool, first=None) -> dict:
    """The stage in its session; ``first``: what `discover` hands the first files it finds to."""
    from pipeline.clean.parts import finish_part, process_in_parts, start_part

    timings: dict[str, float] = {}
    t = time.perf_counter()
    listing, lab, label_notes = _candidates(cfg, place, first)
    timings["discover_s"] = time.perf_counter() - t

    t = time.perf_counter()
    results, reused, parts_report = process_in_parts(cfg, listing, executor, place, items(cfg, start_part, finish_part),
                                                     show_progress, _warm_up_manifest_writer)
    _attach_captions(cfg, lab, results, label_notes, listing)
    prior = _folder_prior(cfg, results, listing, place)
    listing.close()  # the listing is not needed any more (its file on the staging disk goes)
    timings["process_s"] = time.perf_counter() - t
    return _decide_and_finalize(cfg, results, lab, label_notes, reused, parts_report, timings, place, prior)


def _folder_prior(cfg: CleanConfig, results, listing, place: CleanDir) -> dict:
    """Texts whose folder's others say which code page they are in (`pipeline.clean.prior`): the
    report's "folder_prior" (files and folders it decided)."""
    from pipeline.clean.prior import apply

    return apply(results, listing, place, TextSettings(max_bytes=cfg.text_limit()))


def _candidates(cfg: CleanConfig, place: CleanDir, first=None):
    """The sorted, labelled candidates (a `Listing` on the staging disk), the labels file read
    (or None) and its notes; ``first``: `discover`'s."""
    lab = _labels(cfg, place)
    listing = discover(place.inp, lab.labels if lab else None, lab.exclude if lab else None, place.staging, first,
                       AHEAD_FILES)
    label_notes = {}
    if lab is not None:
        from pipeline.clean.labels import check_against

        label_notes = {**lab.notes, **check_against(lab, listing)}
    return listing, lab, label_notes


def _attach_captions(cfg: CleanConfig, lab, results, label_notes: dict, listing) -> None:
    if lab is not None:
        from pipeline.clean.labels import attach_captions

        label_notes.update(attach_captions(results, lab.captions, listing, cfg.text_limit()))


def _decide_and_finalize(cfg: CleanConfig, results, lab, label_notes: dict, reused: int,
                         parts_report: dict | None, timings: dict, place: CleanDir, prior: dict | None = None) -> dict:
    from pipeline.clean.finalize import finalize

    t = time.perf_counter()
    from pipeline.clean.decide import DecideSettings, decide  # numpy: not before the workers start

    settings = DecideSettings(label_conflicts=cfg.label_conflicts, near_dedup=cfg.near_dedup,
                              near_image_distance=cfg.near_image_distance, near_text_jaccard=cfg.near_text_jaccard,
                              labels_required=lab is not None, resize_mode=cfg.resize_mode)
    outcome = decide(results, settings, place.outputs())
    timings["decide_s"] = time.perf_counter() - t

    t = time.perf_counter()
    extra = {"reused": reused, "kept_samples": outcome.kept_samples, **({"labels": label_notes} if label_notes else {}),
             **({"folder_prior": prior} if prior else {}),
             "label_conflicts": outcome.label_conflicts, "near_duplicate_search": outcome.near,
             **({"parts": parts_report} if parts_report is not None else {})}
    report = finalize(cfg, results, outcome.decisions, place, extra, timings)
    timings["finalize_s"] = time.perf_counter() - t
    return report


def _warm_up_manifest_writer() -> None:
    """Importing pyarrow, numpy and the decide stage takes 0.2-0.5 s: let that happen on a spare
    core while the workers decode, instead of after them, before the manifest is written. So do
    the modules the run's tail imports after the last result (the prior, the near-duplicate
    search and its pixel check with Pillow, finalize): ~15-30 ms of the tail on 2048x1536 photos.
    And Pillow's common plugins, which its first Image.open imports (the pixel check's first
    output read back: ~8-9 ms of the tail)."""

    def load() -> None:
        import pyarrow
        from PIL import Image

        import pipeline.clean.decide  # noqa: F401
        import pipeline.clean.finalize  # noqa: F401
        import pipeline.clean.prior  # noqa: F401
        import pipeline.formats.manifest  # noqa: F401
        import pipeline.similarity.near_images  # noqa: F401
        import pipeline.similarity.perceptual  # noqa: F401

        pyarrow.array([0])
        Image.preinit()

    threading.Thread(target=load, name="pipe-warm-up", daemon=True).start()


def _labels(cfg: CleanConfig, place: CleanDir):
    """The --labels file, read (None: labels come from class folders)."""
    if cfg.labels is None:
        return None
    from pipeline.clean.labels import read_labels

    return read_labels(cfg.labels, place.inp.local_path)


def worker_settings(cfg: CleanConfig) -> WorkerSettings:
    return WorkerSettings(
        output=open_folder(cfg.output),
        image=ImageSettings(cfg.size, cfg.resize_mode, cfg.format, cfg.quality, cfg.min_size, cfg.max_pixels,
                            parse_colour(cfg.background), parse_window(cfg.window)),
        text=TextSettings(max_bytes=cfg.text_limit()),
        input=open_folder(cfg.input),
    )


def small(c: Candidate) -> bool:
    """A file judged in far less than any --file-timeout (a 256 KiB JPEG: tens of ms), so it
    may travel to a worker with others (`OrderedPool.map`'s batch)."""
    return c.problem is not None or (c.size is not None and c.size <= BATCH_BYTES)
