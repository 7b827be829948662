"""`pipe clean`: every input file ends with exactly one status in the manifest.

Three phases:

1. process: each file is read once in a worker (`process.process`), judged, and its cleaned
   output written under ``data/``; its `FileResult` is appended to the journal. Results whose
   input is unchanged since a previous (possibly killed) run are reused from the journal.
2. decide: duplicates, caption pairs and label conflicts, over all results (`decide`).
3. finalize: outputs of files that did not end kept are removed, rejected inputs are copied to
   ``quarantine/<reason>/``, stale files are swept, then ``report.json`` and, last,
   ``manifest.parquet`` are written. The manifest's presence means the folder is complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import threading
import time
from pathlib import Path

from pipeline import __version__
from pipeline.clean import WORKER_MODULES
from pipeline.clean.config import CleanConfig
from pipeline.clean.discover import Candidate, discover
from pipeline.clean.journal import STATE_DIR, Journal
from pipeline.clean.process import WorkerSettings, crashed, init_worker, output_path, process, timed_out
from pipeline.clean.records import FileResult
from pipeline.clean.report import ReportBuilder
from pipeline.core.config import parse_byte_size
from pipeline.core.cores import worker_count
from pipeline.core.errors import StageFailed, UsageError
from pipeline.core.executor import OrderedPool
from pipeline.core.files import LOCK_NAME, atomic_copy, atomic_write_bytes, atomic_write_text, occupied, output_lock, read_marker, sweep_tmp
from pipeline.core.settings import check as check_settings
from pipeline.distribute.executors import require
from pipeline.formats.vocabulary import Kind, Reason, Status
from pipeline.media.image.clean import BACKGROUNDS, ImageSettings
from pipeline.media.image.window import parse_window
from pipeline.media.text.clean import TextSettings
from pipeline.storage import is_remote, open_folder

OWNED = ("data", "quarantine", "manifest.parquet", "report.json", STATE_DIR)
# Links, FIFOs and unreadable files have nothing (or nothing of ours) to copy into quarantine/.
NO_COPY_REASONS = {Reason.OUTSIDE_ROOT, Reason.UNREADABLE}
# Small files go to the workers BATCH_FILES to a message: a message per file cost the main
# process ~0.2-0.3 ms of CPU, as much as a small text's whole judging in the worker
BATCH_FILES, BATCH_BYTES = 16, 256 * 1024
# Outputs of files that did not end kept (duplicates) wait here, so a re-run where they become
# kept (their better copy was removed) need not decode them again.
PARKED = f"{STATE_DIR}/parked"


def parse_colour(value: str) -> tuple[int, int, int]:
    v = value.strip().lower()
    if v in BACKGROUNDS:
        return BACKGROUNDS[v]
    if v.startswith("#") and len(v) == 7:
        try:
            return tuple(int(v[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]
        except ValueError:
            pass
    raise UsageError(f"--background {value!r} is not a colour: use white, black, grey or #rrggbb")


def validate(cfg: CleanConfig) -> CleanConfig:
    """Check the operator's choices; every problem is one sentence and exit 2."""
    if is_remote(cfg.input) or is_remote(cfg.output):  # object storage (an S3 INPUT is listed when discovered)
        from pipeline.clean.remote import check_folders

        check_folders(cfg.input, cfg.output)
    if not is_remote(cfg.input):
        if not cfg.input.exists():
            raise UsageError(f"input folder not found: {cfg.input}")
        if not cfg.input.is_dir():
            raise UsageError(f"input is not a folder: {cfg.input}")
    if not (is_remote(cfg.input) or is_remote(cfg.output)):
        src, dst = cfg.input.resolve(), cfg.output.resolve()
        if dst == src or src in dst.parents:
            raise UsageError(f"the output folder {cfg.output} is inside the input folder {cfg.input}; pipe never writes into its input")
    check_settings(cfg)  # the declared ranges and choices (clean/config.py)
    require(cfg.executor)
    parse_colour(cfg.background)
    try:
        cfg.window = str(parse_window(cfg.window))  # one spelling of each window ("0.5, 99.5" -> "0.5,99.5")
    except ValueError as e:
        raise UsageError(str(e)) from None
    cfg.max_text_bytes = parse_byte_size(cfg.max_text_bytes, "--max-text-bytes")
    if cfg.labels is not None and not cfg.labels.is_file():
        raise UsageError(f"labels file not found: {cfg.labels}")
    return cfg


def prepare_output(cfg: CleanConfig) -> Journal:
    """Resume a matching CLEAN_DIR, refuse a foreign one, or clear ours with --overwrite."""
    out = cfg.output
    refuse_foreign(out)
    journal = Journal(out)
    state = journal.read_state()
    if occupied(out):
        if cfg.overwrite:
            _remove_owned(out)
            state = None
        elif state is None:  # refuse_foreign let an occupied folder through only with pipe clean's marker
            raise AssertionError(f"{out} has no readable marker")
        elif state.get("input") != input_id(cfg):
            raise UsageError(f"{out} was cleaned from {state.get('input')}, not {input_id(cfg)}; pass --overwrite to replace it")
        elif state.get("settings") != cfg.fingerprint():
            changed = ", ".join(f"--{k.replace('_', '-')} {state['settings'].get(k)} -> {v}"
                                for k, v in cfg.fingerprint().items() if state["settings"].get(k) != v)
            raise UsageError(f"{out} was made with other settings ({changed}); pass --overwrite to redo it")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".pipe-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write to the output folder {out}: {e.strerror or e}") from None
    journal.write_state(marker(cfg))
    return journal


def marker(cfg: CleanConfig) -> dict:
    """What `.pipe/state.json` says about a CLEAN_DIR this run writes."""
    return {"schema_version": 1, "tool": "pipe clean", "version": __version__, "input": input_id(cfg),
            "settings": cfg.fingerprint()}


def input_id(cfg: CleanConfig) -> str:
    """The INPUT as the marker records it: the resolved local path, or the s3:// URL."""
    return open_folder(str(cfg.input)).url if is_remote(cfg.input) else str(cfg.input.resolve())


def refuse_foreign(out: Path) -> None:
    """Refuse a folder that is not empty unless pipe clean's marker says pipe clean wrote it:
    --overwrite deletes data/, quarantine/ and report.json, which may be someone's own files."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"the output path {out} exists and is not a folder")
    state = read_marker(out)
    if occupied(out) and (state is None or state.get("tool") != "pipe clean"):
        raise UsageError(f"{out} is not empty and was not written by pipe clean (it has no .pipe/state.json of pipe clean's); "
                         "choose an empty folder (--overwrite replaces only a folder pipe clean wrote)")


def _remove_owned(out: Path) -> None:
    """--overwrite on a folder pipe clean wrote: remove what it writes there (keeping the lock held now)."""
    for name in OWNED:
        p = out / name
        if name == STATE_DIR and p.is_dir():
            for q in p.iterdir():
                if q.name != LOCK_NAME:
                    shutil.rmtree(q) if q.is_dir() else q.unlink()
        else:
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)


def reusable_result(old: FileResult | None, c: Candidate) -> bool:
    """What a journal line or part result must be to stand for ``c`` again, files aside."""
    if old is None or c.problem or old.key != c.key or old.kind != c.kind or old.reason == Reason.TIMEOUT:
        return False
    # an image written by a pipe that did not measure its outputs is redone, so the manifest has the sums
    return not (old.output and old.kind == Kind.IMAGE and old.pixel_sums is None)


def input_unchanged(old: FileResult, c: Candidate) -> bool:
    """A local input file has the size and times it had when ``old`` was made."""
    try:
        st = os.stat(c.path)
    except OSError:
        return False
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns) == (old.bytes, old.mtime_ns, old.ctime_ns)


def _reusable(old: FileResult | None, c: Candidate, out: Path) -> bool:
    if old is None or not reusable_result(old, c) or not input_unchanged(old, c):
        return False
    if old.output:
        for place in (out / old.output, out / PARKED / old.output):
            try:
                if place.stat().st_size == old.output_bytes:
                    return True
            except OSError:
                pass
        return False
    return True


def run(cfg: CleanConfig, show_progress: bool = True) -> dict:
    """Run the whole stage; return the report (also written to report.json).

    The output folder is locked for the whole run (a second run into it stops at once), and
    only after it is known to be empty or pipe clean's: the lock file is the first thing written."""
    if is_remote(cfg.output):
        from pipeline.clean.remote import run_to_object_storage

        return run_to_object_storage(cfg, show_progress)
    validate(cfg)
    if cfg.executor == "ray":  # Ray tasks run in other working directories, on other machines
        cfg = dataclasses.replace(cfg, output=cfg.output.resolve(),
                                  input=cfg.input if is_remote(cfg.input) else cfg.input.resolve())
    refuse_foreign(cfg.output)
    with output_lock(cfg.output, "pipe clean"), _cluster(cfg):
        return _run(cfg, show_progress)


def _run(cfg: CleanConfig, show_progress: bool) -> dict:
    timings: dict[str, float] = {}
    t = time.perf_counter()
    journal = prepare_output(cfg)
    (cfg.output / "manifest.parquet").unlink(missing_ok=True)  # no manifest until this run is complete
    # a fresh run decodes everything: start the workers now, their start-up overlaps discovery
    fresh = not journal.path.exists() and cfg.executor == "local"
    pool = _pool(cfg, worker_count(cfg.workers)).start() if fresh else None
    try:
        sweep_tmp(cfg.output)
        candidates, lab, label_notes = _candidates(cfg)
        timings["discover_s"] = time.perf_counter() - t

        t = time.perf_counter()
        parts_report = None
        if cfg.executor == "ray":
            from pipeline.distribute.clean import process_in_parts

            results, reused, parts_report = process_in_parts(
                cfg, candidates, _worker_settings(cfg), lambda old, c: _reusable(old, c, cfg.output), show_progress, cfg.output)
        else:
            files, reused = _process_all(cfg, candidates, journal, show_progress, pool)
            # imported only now (pyarrow, numpy: 0.2-0.4 s), in the warm-up thread's wake: imported
            # before the loop, it held up the first file's submission by as much
            from pipeline.clean.columns import Columns

            results = Columns.from_results(files)
            del files
        del candidates  # the listing is not needed any more: a run of millions frees its memory before decide
        _attach_captions(cfg, lab, results, label_notes)
        timings["process_s"] = time.perf_counter() - t
    finally:
        if pool is not None:
            pool.close()
    return _decide_and_finalize(cfg, results, lab, label_notes, reused, parts_report, timings, LocalCleanDir(cfg, journal))


def run_in_parts(cfg: CleanConfig, place, show_progress: bool) -> dict:
    """--executor ray into a CLEAN_DIR that is no local folder (``place``: object storage, see
    `pipeline.clean.objects.ObjectCleanDir`): the Ray tasks write outputs and part results there,
    and the driver decides and finalizes there, exactly as `_run` does on a folder."""
    from pipeline.distribute.clean import process_in_parts

    timings: dict[str, float] = {}
    with _cluster(cfg):
        t = time.perf_counter()
        candidates, lab, label_notes = _candidates(cfg)
        timings["discover_s"] = time.perf_counter() - t
        t = time.perf_counter()
        results, reused, parts_report = process_in_parts(cfg, candidates, _worker_settings(cfg), place.reusable,
                                                         show_progress, place.folder)
        del candidates  # as in `_run`: the listing is freed before decide
        _attach_captions(cfg, lab, results, label_notes)
        timings["process_s"] = time.perf_counter() - t
        return _decide_and_finalize(cfg, results, lab, label_notes, reused, parts_report, timings, place)


def _cluster(cfg: CleanConfig):
    """--executor ray: the stage's Ray session, its workers readied (imports, decode pools) while
    this process discovers and plans, as a local run starts its pool first (`_run`); local: nothing."""
    if cfg.executor != "ray":
        return contextlib.nullcontext()
    from pipeline.distribute.ray_executor import ready_for_clean, warmed_up

    return warmed_up(cfg.ray_address, ready_for_clean, _worker_settings(cfg))


def _candidates(cfg: CleanConfig):
    """The sorted, labelled candidates, the labels file read (or None) and its notes."""
    lab = _labels(cfg)
    candidates = _discover(cfg, lab.labels if lab else None, lab.exclude if lab else None)
    label_notes = {}
    if lab is not None:
        from pipeline.clean.labels import check_against, share_within_samples

        share_within_samples(candidates)
        label_notes = {**lab.notes, **check_against(lab, candidates)}
    return candidates, lab, label_notes


def _attach_captions(cfg: CleanConfig, lab, results, label_notes: dict) -> None:
    if lab is not None:
        from pipeline.clean.labels import attach_captions

        label_notes.update(attach_captions(results, lab.captions, cfg.text_limit()))


def _decide_and_finalize(cfg: CleanConfig, results, lab, label_notes: dict, reused: int,
                         parts_report: dict | None, timings: dict, place) -> dict:
    t = time.perf_counter()
    from pipeline.clean.decide import DecideSettings, decide  # numpy: not before the workers start

    settings = DecideSettings(label_conflicts=cfg.label_conflicts, near_dedup=cfg.near_dedup,
                              near_image_distance=cfg.near_image_distance, near_text_jaccard=cfg.near_text_jaccard,
                              labels_required=lab is not None, resize_mode=cfg.resize_mode)
    outcome = decide(results, settings, place.outputs())
    timings["decide_s"] = time.perf_counter() - t

    t = time.perf_counter()
    extra = {"reused": reused, **({"labels": label_notes} if label_notes else {}),
             "label_conflicts": outcome.label_conflicts, "near_duplicate_search": outcome.near,
             **({"parts": parts_report} if parts_report is not None else {})}
    report = _finalize(cfg, results, outcome.decisions, place, extra, timings)
    timings["finalize_s"] = time.perf_counter() - t
    return report


def _after_first(results, then):
    """``results``, calling ``then()`` once the first has come: by then every worker has its
    first files, and ``then`` no longer holds up the start (the main thread's discovery and
    first submissions, which a thread importing modules slows down: they share the GIL)."""
    for i, r in enumerate(results):
        yield r
        if i == 0:
            then()


def _warm_up_manifest_writer() -> None:
    """Importing pyarrow, numpy and the decide stage takes 0.2-0.5 s: let that happen on a spare
    core while the workers decode, instead of after them, before the manifest is written."""

    def load() -> None:
        import pyarrow

        import pipeline.clean.decide  # noqa: F401
        import pipeline.formats.manifest  # noqa: F401

        pyarrow.array([0])

    threading.Thread(target=load, name="pipe-warm-up", daemon=True).start()


def _discover(cfg: CleanConfig, labels: dict[str, str] | None, exclude: set[str] | None) -> list[Candidate]:
    if is_remote(cfg.input):
        from pipeline.clean.remote import discover_remote

        return discover_remote(str(cfg.input), labels, exclude)
    return discover(cfg.input, labels, exclude)


def _labels(cfg: CleanConfig):
    """The --labels file, read (None: labels come from class folders)."""
    if cfg.labels is None:
        return None
    from pipeline.clean.labels import read_labels

    return read_labels(cfg.labels, Path(cfg.input))


def _worker_settings(cfg: CleanConfig) -> WorkerSettings:
    return WorkerSettings(
        output=str(cfg.output),
        image=ImageSettings(cfg.size, cfg.resize_mode, cfg.format, cfg.quality, cfg.min_size, cfg.max_pixels,
                            parse_colour(cfg.background), parse_window(cfg.window)),
        text=TextSettings(max_bytes=cfg.text_limit()),
        input_url=open_folder(str(cfg.input)).url if is_remote(cfg.input) else "",
    )


def _pool(cfg: CleanConfig, workers: int) -> OrderedPool:
    return OrderedPool(process, workers, initializer=init_worker, initargs=(_worker_settings(cfg),),
                        preload=WORKER_MODULES)


def _process_all(cfg: CleanConfig, candidates: list[Candidate], journal: Journal, show_progress: bool,
                 pool: OrderedPool | None = None) -> tuple[list[FileResult], int]:
    from pipeline.core.ui import progress

    old = journal.load()
    reuse = {c.source: old[c.source] for c in candidates if _reusable(old.get(c.source), c, cfg.output)}
    todo = [c for c in candidates if c.source not in reuse]
    if pool is None:
        pool = _pool(cfg, min(worker_count(cfg.workers), max(1, len(todo))))
    results: list[FileResult] = []
    with progress("clean", len(candidates), show_progress) as advance:
        computed = pool.map(todo, on_crash=crashed, timeout=cfg.file_timeout, on_timeout=timed_out,
                            batch=BATCH_FILES, batchable=_small) if todo else iter(())
        computed = _after_first(computed, _warm_up_manifest_writer) if todo else computed
        if not todo:
            _warm_up_manifest_writer()
        try:
            for c in candidates:
                r = reuse.get(c.source)
                if r is None:
                    r = next(computed)
                    journal.append(r)
                else:
                    r.label = c.label
                results.append(r)
                advance(r.reason is None, c.source in reuse)
        except OSError as e:
            raise StageFailed(f"could not write the cleaned output: {e}") from None
        finally:
            pool.close()
            journal.close()
    return results, len(reuse)


def _small(c: Candidate) -> bool:
    """A file judged in far less than any --file-timeout (a 256 KiB JPEG: tens of ms), so it
    may travel to a worker with others (`OrderedPool.map`'s batch)."""
    return c.problem is not None or (c.size is not None and c.size <= BATCH_BYTES)


def _finalize(cfg, results, decisions, place, extra: dict, timings: dict) -> dict:
    """Outputs moved where their status says, quarantined inputs copied, stale files swept, the
    journal compacted, report.json, and the manifest last (``place``: CLEAN_DIR as a folder,
    `LocalCleanDir`, or on object storage, `pipeline.clean.objects.ObjectCleanDir`). The files'
    whole results are read back a part at a time (`Columns.chunks`), so no run holds them all."""
    from pipeline.clean.columns import iter_results, manifest_table
    from pipeline.formats.manifest import ManifestWriter  # pyarrow: only needed now, at the end

    keep_outputs: set[str] = set()
    keep_quarantine: set[str] = set()
    keep_parked: set[str] = set()
    report = ReportBuilder()
    writer = ManifestWriter(place.manifest_path())
    labels = results.labels()
    try:
        offset = 0
        with place.rewrite_journal() as journal_line:
            for chunk in results.chunks():
                captions: dict[int, str] = {}
                for i, r in enumerate(iter_results(chunk), offset):
                    r.label, r.caption, r.caption_reason = labels[i], results.caption.get(i), results.caption_reason.get(i)
                    cap = _finalize_file(place, r, decisions[i], keep_outputs, keep_parked, keep_quarantine)
                    if cap:
                        captions[i] = cap
                        decisions.detail[i] = f"{decisions.detail[i]}: {cap}"
                    journal_line(r)
                rows = manifest_table(chunk, offset, results, decisions, captions)
                report.add_table(rows)
                writer.add_table(rows)
                offset += chunk.num_rows
        place.sweep("data", keep_outputs)
        place.sweep("quarantine", keep_quarantine)
        place.sweep(PARKED, keep_parked)
        doc = report.build(cfg.as_dict(), {k: round(v, 3) for k, v in timings.items()}, extra)
        place.finish(json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=False) + "\n", writer)
    except OSError as e:
        raise StageFailed(f"could not finish writing {place}: {e}") from None
    return doc


def _finalize_file(place, r: FileResult, d, keep_outputs: set, keep_parked: set, keep_quarantine: set) -> str:
    """One file's output and quarantine copy where its decision says; its caption file's path
    when it is a kept image with a caption from the labels file (written now), else ""."""
    cap = ""
    if d.status == Status.KEPT and r.caption is not None:  # a caption from the labels file
        cap = output_path(r.source, r.key, "txt")
        place.write_if_changed(cap, r.caption.encode("utf-8"))
        keep_outputs.add(cap)
    if d.status == Status.KEPT:
        keep_outputs.add(r.output)
        place.move(f"{PARKED}/{r.output}", r.output)
    elif r.output:
        keep_parked.add(f"{PARKED}/{r.output}")
        place.move(r.output, f"{PARKED}/{r.output}")
    if d.status == Status.QUARANTINED and d.reason not in NO_COPY_REASONS and r.bytes > 0 and r.sha256:
        rel = f"quarantine/{d.reason}/{r.source}"
        keep_quarantine.add(rel)
        if not place.has(rel, r.bytes):
            try:
                place.copy_input(r.source, rel)
            except FileNotFoundError:  # gone since, or a name that is not UTF-8
                keep_quarantine.discard(rel)
    return cap


class LocalCleanDir:
    """CLEAN_DIR as a folder (this machine's, or one every Ray node mounts): what deciding and
    finalizing read from and do to it. Paths as strings where it is per file: pathlib's joins
    cost more than the rest of a file's finalizing."""

    def __init__(self, cfg: CleanConfig, journal: Journal):
        self.cfg, self.root, self.journal = cfg, cfg.output, journal
        self._root = os.fspath(cfg.output)

    def __str__(self) -> str:
        return str(self.root)

    def outputs(self):
        from pipeline.clean.decide import Outputs

        return Outputs(self.root, PARKED, self.cfg.resize_mode)

    def manifest_path(self) -> Path:
        return self.root / "manifest.parquet"

    def rewrite_journal(self):
        """The journal rewritten with exactly this run's records, fed one at a time."""
        return self.journal.rewrite()

    def write_if_changed(self, rel: str, data: bytes) -> None:
        _write_if_changed(self.root / rel, data)

    def move(self, src: str, dest: str) -> None:
        """``src`` to ``dest`` if it is there (it is not when a re-run finds it moved already)."""
        _move_if_there(f"{self._root}/{src}", f"{self._root}/{dest}")

    def has(self, rel: str, size: int) -> bool:
        try:
            return os.stat(f"{self._root}/{rel}").st_size == size
        except FileNotFoundError:
            return False

    def copy_input(self, source: str, rel: str) -> None:
        _copy_input(self.cfg, source, self.root / rel)

    def sweep(self, folder: str, keep: set[str]) -> None:
        _sweep(self.root / folder, keep, self.root)

    def finish(self, report_text: str, writer) -> None:
        atomic_write_text(self.root / "report.json", report_text)
        writer.close()  # the manifest last: its presence means the folder is complete


def _copy_input(cfg: CleanConfig, source: str, dest: Path) -> None:
    if is_remote(cfg.input):
        from pipeline.clean.remote import copy_input

        copy_input(str(cfg.input), source, dest)
    else:
        atomic_copy(cfg.input / source, dest)


def _write_if_changed(path: Path, data: bytes) -> None:
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    atomic_write_bytes(path, data)


def _move_if_there(src: str, dest: str) -> None:
    if os.path.exists(src):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.replace(src, dest)


def _sweep(folder: Path, keep: set[str], root: Path) -> None:
    """Remove files under ``folder`` that this run did not produce (left by earlier runs), and
    the folders that leaves empty. Paths as strings from os.scandir: a Path per file (rglob,
    relative_to, is_file) was ~0.1 ms a file of the main process, after every run."""
    if folder.exists():
        _sweep_in(str(folder), folder.relative_to(root).as_posix() + "/", keep)


def _sweep_in(path: str, prefix: str, keep: set[str]) -> None:
    """`_sweep` below ``path`` (``prefix``: its path relative to the output folder, with a "/")."""
    with os.scandir(path) as it:
        entries = list(it)
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            _sweep_in(e.path, f"{prefix}{e.name}/", keep)
            if not os.listdir(e.path):
                os.rmdir(e.path)
        elif (e.is_file() or e.is_symlink()) and prefix + e.name not in keep:
            os.unlink(e.path)
