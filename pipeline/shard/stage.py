"""`pipe shard`: a CLEAN_DIR becomes deterministic webdataset tar shards and an `index.json`.

1. load: the kept rows of `manifest.parquet`, grouped by key (an image and its caption are one
   sample), held as columns (`samples.py`). An image-caption pair without a label is a sample
   (no .cls member: data for contrastive training); an image or a text alone without a label is
   of use to no objective: left out, counted in index.json (`excluded.unlabelled`) and named in
   the summary, never dropped silently.
2. split: per class (the pairs without a label as one more), seeded, near duplicates (by `phash`)
   kept on one side (`split.py`); a pair in a group records it in its .json member (`plan.entry`).
3. measure: every image's size must match the others, and the train images' exact pixel sums
   give the mean and std readers normalise with. pipe clean recorded both in the manifest
   (`pipeline.formats.pixels`); only images it has none for (a manifest of an older pipe) are
   decoded, once, in worker processes, and the summary says so in one line.
4. plan: each split shuffled (seeded) then cut into shards by `--max-count` and `--max-size`
   (`plan.py`: a pure function of the samples and the settings).
5. write: each shard from its plan entry alone (`write.py`), under a temporary name, fsynced,
   renamed; stale shards of an earlier run removed; `index.json` last, so no reader ever sees a
   half-written dataset. Shards that an interrupted run of the same plan finished are kept
   (`resume.py`).

Same CLEAN_DIR, same settings -> byte-identical shards and index.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import __version__
from pipeline.core.errors import StageFailed, UsageError
from pipeline.core.files import STATE_DIR, atomic_write_text, occupied, output_lock, read_marker
from pipeline.core.settings import check as check_settings
from pipeline.core.ui import progress
from pipeline.distribute.executors import require
from pipeline.formats import index as shard_index
from pipeline.formats.pixels import ImagePixels
from pipeline.shard.config import ShardConfig
from pipeline.shard.plan import SPLITS, Span, entry, make_plan
from pipeline.shard.samples import IMAGE_EXT, Samples, give_back_freed, load
from pipeline.shard.split import split_arrays
from pipeline.shard.write import start_shard
from pipeline.storage import is_remote

SHARD_NAME = re.compile(r"^(train|val)-\d{6}\.tar$")
IN_PROCESS_BELOW = 256  # images; fewer are measured in-process (a pool costs more to start)
MEASURE_ROWS = 8192  # images whose recorded numbers are added up at once (a few hundred KiB of temporaries)


def validate(cfg: ShardConfig) -> None:
    check_settings(cfg)  # the declared ranges and choices (shard/config.py)
    require(cfg.executor)
    if not cfg.input.is_dir():
        raise UsageError(f"CLEAN_DIR not found: {cfg.input}")
    if not (cfg.input / "manifest.parquet").is_file():
        raise UsageError(f"{cfg.input} has no manifest.parquet: run pipe clean first (or let it finish)")
    src, dst = cfg.input.resolve(), cfg.output.resolve()
    if dst == src or src in dst.parents:
        raise UsageError(f"the output folder {cfg.output} is inside CLEAN_DIR {cfg.input}; choose another folder")
    if cfg.output.exists() and not cfg.output.is_dir():
        raise UsageError(f"the output path {cfg.output} exists and is not a folder")
    if cfg.output.is_dir():
        foreign = sorted(p.name for p in cfg.output.iterdir() if not _ours(p.name))
        if foreign:
            raise UsageError(f"{cfg.output} holds files pipe shard did not write ({', '.join(foreign[:3])}); choose an empty folder")
    refuse_foreign(cfg.output)


def _ours(name: str) -> bool:
    return (bool(SHARD_NAME.match(name)) or name in (shard_index.INDEX_NAME, STATE_DIR)
            or (name.startswith(".") and name.endswith(".tmp")))


def refuse_foreign(out: Path) -> None:
    """A folder of shard-like names without pipe shard's marker is not ours to replace, --overwrite or not."""
    state = read_marker(out)
    if occupied(out) and (state is None or state.get("tool") != "pipe shard"):
        raise UsageError(f"{out} holds shards that pipe shard did not write (it has no .pipe/state.json of pipe shard's); "
                         "choose an empty folder (--overwrite replaces only a folder pipe shard wrote)")


def claim_output(cfg: ShardConfig) -> None:
    """Resume a SHARD_DIR whose marker says pipe shard made it from the same input and settings
    (shards it finished are kept, the rest written: `resume.py`); replace one made with others
    only with --overwrite."""
    out = cfg.output
    refuse_foreign(out)
    if not occupied(out) or cfg.overwrite:
        return
    state, want = read_marker(out), cfg.marker()
    if state is None:  # refuse_foreign let an occupied folder through only with pipe shard's marker
        raise AssertionError(f"{out} has no readable marker")
    if state.get("input") != want["input"]:
        raise UsageError(f"{out} was sharded from {state.get('input')}, not {want['input']}; pass --overwrite to replace it")
    settings = state.get("settings")
    old = settings if isinstance(settings, dict) else {}
    if old != want["settings"]:
        changed = ", ".join(f"--{k.replace('_', '-')} {old.get(k)} -> {v}" for k, v in want["settings"].items() if old.get(k) != v)
        raise UsageError(f"{out} was made with other settings ({changed}); pass --overwrite to replace it")


# ---------------------------------------------------------------- 3. measure


def measure_image(path: str) -> ImagePixels | tuple[str, str]:
    """The decoded image's size and pixel sums, or ("error", message)."""
    from pipeline.formats.pixels import measure
    from pipeline.formats.sample import DecodeError

    ext = IMAGE_EXT.get(Path(path).suffix.lower(), "")
    try:
        with open(path, "rb") as f:
            return measure(f.read(), ext)
    except (OSError, DecodeError) as e:
        return ("error", str(e))


def _measure_crashed(path: str, exc: BaseException) -> tuple:
    return ("error", f"the decoder crashed ({type(exc).__name__})")


def measure(cfg: ShardConfig, samples: Samples, is_val: np.ndarray, show_progress: bool) -> tuple[shard_index.PixelStats, int | None, int]:
    """Exact train pixel stats, the one image size (errors are UsageError) and how many images
    were decoded: the numbers come from what pipe clean recorded in the manifest, added up as
    arrays; only images it recorded none for (an older pipe's manifest) are decoded."""
    px = samples.pixels
    is_image = samples.image_ext >= 0
    recorded = is_image & (px[:, 0] >= 0)
    stats, sizes = shard_index.PixelStats(), Counter[tuple[int, int]]()
    for lo in range(0, len(px), MEASURE_ROWS):  # a part at a time: no copy of every image's numbers
        part = slice(lo, lo + MEASURE_ROWS)
        rows = px[part]
        sizes.update(_size_counts(rows[recorded[part], :2]))  # (a size first seen in an earlier part keeps its place)
        train = rows[recorded[part] & ~is_val[part]]
        stats.add(_exact_sum(train[:, 0], train[:, 1]), [_exact_sum(train[:, 2 + c]) for c in range(3)],
                  [_exact_sum(train[:, 5 + c]) for c in range(3)])
        samples.release_pages()
    todo = np.flatnonzero(is_image & ~recorded)
    _decode_unmeasured(cfg, [samples.image[int(i)].as_py() for i in todo], is_val[todo].tolist(), show_progress, stats, sizes)
    if len(sizes) > 1 or any(w != h for w, h in sizes):
        seen = ", ".join(f"{w}x{h} ({n} images)" for (w, h), n in sizes.most_common(3))
        raise UsageError(f"images in {cfg.input} are not all one square size ({seen}); re-run pipe clean with one --size")
    size = next(iter(sizes))[0] if sizes else None
    return stats, size, len(todo)


def _size_counts(wh: np.ndarray) -> Counter:
    """(width, height) -> images, in the order each size first appears (the order the message
    on mixed sizes lists ties in), counted as arrays."""
    if not len(wh):
        return Counter()
    found, first, counts = np.unique(wh, axis=0, return_index=True, return_counts=True)
    order = np.argsort(first)
    return Counter({(int(w), int(h)): int(n) for (w, h), n in zip(found[order].tolist(), counts[order].tolist())})


def _exact_sum(values: np.ndarray, times: np.ndarray | None = None) -> int:
    """The exact sum of non-negative int64 ``values`` (of ``values * times`` where given) as a
    Python int, added up as arrays: the high and low 32 bits summed apart can not overflow
    (under 2**31 items). Products that might not fit 63 bits are added up in Python."""
    if times is not None:
        if not len(values) or int(values.max()) * int(times.max()) >= 1 << 62:
            return sum(a * b for a, b in zip(values.tolist(), times.tolist()))
        values = values * times
    return (int(np.sum(values >> 32, dtype=np.int64)) << 32) + int(np.sum(values & 0xFFFFFFFF, dtype=np.int64))


def _count_image(px: ImagePixels, val: bool, stats: shard_index.PixelStats, sizes: Counter) -> None:
    sizes[(px.width, px.height)] += 1
    if not val:
        stats.add(px.count, px.sums, px.squares)


def _decode_unmeasured(cfg: ShardConfig, images: list[str], is_val: list[bool], show_progress: bool,
                       stats: shard_index.PixelStats, sizes: Counter) -> None:
    """Decode (in worker processes when there are many) the images the manifest has no numbers for."""
    if not images:
        return  # (the usual case: the process pool's modules are not even imported)
    from pipeline.core.cores import worker_count
    from pipeline.core.executor import OrderedPool

    paths = [str(cfg.input / image) for image in images]
    workers = min(worker_count(cfg.workers), max(1, len(paths) // 64))
    results: Iterator[ImagePixels | tuple[str, str]]
    pool: OrderedPool | None
    if len(paths) < IN_PROCESS_BELOW or workers <= 1:
        results = map(measure_image, paths)
        pool = None
    else:
        pool = OrderedPool(measure_image, workers)
        results = pool.map(paths, on_crash=_measure_crashed)
    try:
        with progress("measure images", len(paths), show_progress) as advance:
            for image, val, res in zip(images, is_val, results):
                if not isinstance(res, ImagePixels):
                    raise UsageError(f"{cfg.input / image} does not decode ({res[1]}): was CLEAN_DIR changed? re-run pipe clean")
                _count_image(res, val, stats, sizes)
                advance(True)
    finally:
        if pool is not None:
            pool.close()


def decoded_notice(decoded: int, images: int) -> str:
    """One line on a CLEAN_DIR of an older pipe clean, whose manifest has no pixel sums: shard
    decoded the images itself (same index, more time), and how to make it only copy bytes."""
    share = "its" if decoded == images else f"{decoded} of its {images}"
    return (f"manifest.parquet has no pixel sums for {share} images (written by an older pipe clean), so pipe shard "
            "decoded them to measure the mean and std; re-run pipe clean to record them and shard without decoding")


# ---------------------------------------------------------------- 5. write


def readers_warning(train_shards: int, n_train: int, cfg: ShardConfig) -> str | None:
    """Warn when per-shard readers (stock webdataset: one shard per worker) would sit idle."""
    readers = cfg.expected_ranks * max(1, cfg.expected_workers)
    if train_shards >= readers or n_train == 0:
        return None
    what = (f"only {train_shards} train shard{'s' * (train_shards != 1)} for {cfg.expected_ranks} ranks x "
            f"{max(1, cfg.expected_workers)} workers = {readers} readers")
    if n_train < readers:
        return f"{what}, and only {n_train} train samples: readers that take whole shards will sit idle (pipe train's reader does not)"
    fix = max(1, n_train // readers)
    return f"{what}: readers that take whole shards will sit idle (pipe train's reader does not); --max-count {fix} gives {readers} or more"


# ---------------------------------------------------------------- the stage


def run(cfg: ShardConfig, show_progress: bool = True, task_dirs: tuple[str, str] | None = None) -> dict:
    """Run the whole stage; return a summary (what index.json says, in counts, plus warnings).

    SHARD_DIR is locked for the whole run (a second run into it stops at once), and only after
    `validate` found nothing in it that pipe shard did not write: the lock is the first thing written.
    ``task_dirs``: with --executor ray, (CLEAN_DIR, SHARD_DIR) as the Ray tasks reach them when
    not as ``cfg`` names them (s3:// URLs whose driver-side copies ``cfg`` names, `remote.py`)."""
    if is_remote(cfg.input) or is_remote(cfg.output):
        from pipeline.shard import remote

        return remote.run(cfg, show_progress)
    validate(cfg)
    with output_lock(cfg.output, "pipe shard"):
        claim_output(cfg)
        with _cluster(cfg):
            return _run(cfg, show_progress, task_dirs or (str(cfg.input.resolve()), str(cfg.output.resolve())))


def _cluster(cfg: ShardConfig):
    """--executor ray: the stage's Ray session, its workers started and their imports done while
    this process loads and plans; local: nothing."""
    if cfg.executor != "ray":
        return contextlib.nullcontext()
    from pipeline.distribute.ray_executor import ready_for_shard, warmed_up

    return warmed_up(cfg.ray_address, ready_for_shard)


def _run(cfg: ShardConfig, show_progress: bool, task_dirs: tuple[str, str]) -> dict:
    timings: dict[str, float] = {}
    t = time.perf_counter()
    samples, manifest_sha = load(cfg.input, cfg.output / STATE_DIR)
    if not len(samples):
        why = f" ({samples.unlabelled} kept samples have no label and are images or texts alone)" if samples.unlabelled else ""
        raise UsageError(f"{cfg.input} has no kept, labelled samples and no image-caption pairs to shard{why}")
    classes = samples.classes
    timings["load_s"] = time.perf_counter() - t

    t = time.perf_counter()
    res = split_arrays(*_split_classes(samples), samples.phash, samples.has_phash, cfg.val_fraction, cfg.seed,
                       cfg.split_distance)
    is_val = np.array(res.is_val, dtype=bool)
    samples.group = res.group
    res.is_val = []  # (a list of every sample's side: is_val holds it)
    give_back_freed()  # the split's tables, freed in between what stays: handed back before the next step
    timings["split_s"] = time.perf_counter() - t

    t = time.perf_counter()
    stats, image_size, decoded = measure(cfg, samples, is_val, show_progress)
    mean, std = stats.mean_std()
    timings["measure_s"] = time.perf_counter() - t

    t = time.perf_counter()
    spans = make_plan(samples.tar_bytes(), is_val, cfg.seed, cfg.max_count, cfg.max_size)
    give_back_freed()  # the plan's temporaries: handed back before shards are written
    entries, resumed, parts = _write_all(cfg, samples, spans, show_progress, task_dirs)
    timings["write_s"] = time.perf_counter() - t

    counts = {sp: _split_counts(samples, is_val == (sp == "val"), sum(e.split == sp for e in entries)) for sp in SPLITS}
    warnings = []
    if decoded:
        warnings.append(decoded_notice(decoded, int(np.count_nonzero(samples.image_ext >= 0))))
    if samples.unlabelled:
        warnings.append(f"{samples.unlabelled} kept samples have no label and were left out (images or texts alone, no "
                        f"image-caption pairs; e.g. {', '.join(samples.unlabelled_examples)})")
    if res.classes_without_val:
        warnings.append(f"classes with no validation sample (their samples are near duplicates of each other): "
                        f"{', '.join(res.classes_without_val[:5])}")
    w = readers_warning(counts["train"]["shards"], counts["train"]["samples"], cfg)
    if w:
        warnings.append(w)
    doc: dict[str, Any] = {
        "schema_version": shard_index.SCHEMA_VERSION,
        "created_by": f"pipe shard {__version__}",
        "manifest_sha256": manifest_sha,
        "settings": {k: v for k, v in cfg.as_dict().items() if k not in ("input", "output", "workers", "overwrite", "executor",
                                                                           "ray_address")},
        "classes": classes,
        "image_size": image_size,
        "mean": mean,
        "std": std,
        "counts": counts,
        "excluded": {"unlabelled": samples.unlabelled},
        "near_duplicate_groups": {"groups": res.groups, "samples": res.grouped_samples,
                                  "max_distance": cfg.split_distance},
        "shards": [e.as_dict() for e in entries],
    }
    try:
        atomic_write_text(cfg.output / shard_index.INDEX_NAME, shard_index.dumps(doc), fsync=True)
    except OSError as e:
        raise StageFailed(f"could not write {cfg.output / shard_index.INDEX_NAME}: {e}") from None
    return {"output": str(cfg.output), "classes": len(classes), "image_size": image_size,
            "train": counts["train"]["samples"], "val": counts["val"]["samples"],
            "train_shards": counts["train"]["shards"], "val_shards": counts["val"]["shards"],
            "bytes": sum(e.bytes for e in entries), "unlabelled": samples.unlabelled,
            "near_duplicate_groups": res.groups, "reused_shards": resumed, "warnings": warnings,
            "timings": {k: round(v, 3) for k, v in timings.items()}, **({"parts": parts} if parts else {})}


def _split_counts(samples: Samples, mask: np.ndarray, shards: int) -> dict:
    """index.json's counts of one split: samples, shards, samples per class (by name), images, texts."""
    cls = samples.cls[mask]
    per_class = np.bincount(cls[cls >= 0], minlength=len(samples.classes)).tolist()  # pairs without a label: in samples only
    return {"samples": int(np.count_nonzero(mask)), "shards": shards,
            "per_class": {c: n for c, n in zip(samples.classes, per_class) if n},
            "images": int(np.count_nonzero(samples.image_ext[mask] >= 0)),
            "texts": int(np.count_nonzero(samples.text_size[mask] >= 0))}


NO_LABEL = "(no label)"  # the pairs without a label, as the split's one more class (named in its messages)


def _split_classes(samples: Samples) -> tuple[np.ndarray, list[str]]:
    """The class of every sample as the split takes it: the pairs without a label as one more
    class, split like the others (only where there are any: a labelled dataset splits as it did)."""
    if not (samples.cls < 0).any():
        return samples.cls, samples.classes
    return np.where(samples.cls >= 0, samples.cls, len(samples.classes)), [*samples.classes, NO_LABEL]


def _write_all(cfg: ShardConfig, samples: Samples, spans: list[Span], show_progress: bool,
               task_dirs: tuple[str, str]) -> tuple[list[shard_index.ShardEntry], int, dict | None]:
    """Write every shard of the plan (keeping those an interrupted run of the same plan finished,
    `resume.py`); return their entries, how many were kept and, on Ray, the summary's "parts"
    section. One shard's plan entry is made at a time: the plan itself is a few arrays."""
    from pipeline.shard.resume import WrittenShards

    out = cfg.output
    _prepare_output(cfg)
    journal = WrittenShards(out)
    done: list[tuple[shard_index.ShardEntry, str]] = []
    resumed, parts = 0, None
    try:
        with progress("write shards", len(spans), show_progress, counts=False) as advance:
            if cfg.executor == "ray":
                resumed, parts = _write_on_ray(cfg, samples, spans, journal, done, advance, task_dirs)
            else:
                resumed = _write_here(cfg, samples, spans, journal, done, advance)
    finally:
        journal.close()
    try:
        written = {e.name for e, _ in done}
        for p in out.iterdir():  # shards of an earlier run with more shards
            if SHARD_NAME.match(p.name) and p.name not in written:
                p.unlink()
        journal.finish(done)
    except OSError as err:
        raise StageFailed(f"could not finish writing {out}: {err}") from None
    return [e for e, _ in done], resumed, parts


def _write_here(cfg: ShardConfig, samples: Samples, spans: list[Span], journal, done: list, advance) -> int:
    """Write (or keep, `resume.py`) every shard in this process, filling ``done`` in plan order;
    return how many were kept. A shard's fsync and rename (`start_shard`'s second step: waiting
    for the disk, ~17 ms for 4 MiB on a busy one) run on a thread while the next shard is
    written; it is recorded in the journal once it is in place. Interrupted, the shard already
    written is still finished and recorded, so a rerun keeps it."""
    from concurrent.futures import Future, ThreadPoolExecutor

    out = cfg.output
    resumed = 0
    behind: tuple[Future, shard_index.ShardEntry, str, str] | None = None  # (finishing, entry, digest, name)

    def settle() -> None:
        nonlocal behind
        if behind is None:
            return
        finishing, written, digest, name = behind
        behind = None
        try:
            finishing.result()
        except OSError as err:
            raise StageFailed(f"could not write {out / name}: {err}") from None
        journal.add(written, digest)

    with ThreadPoolExecutor(1, thread_name_prefix="pipe-shard-fsync") as finisher:
        try:
            for span in spans:
                plan = entry(samples, span)
                digest = plan.digest(cfg.input, __version__)
                found = journal.reusable(out / span.name, digest)
                resumed += found is not None
                if found is None:
                    try:
                        found, finish = start_shard(plan, cfg.input, out)
                    except OSError as err:
                        raise StageFailed(f"could not write {out / span.name}: {err}") from None
                    try:
                        settle()  # the previous shard in place and recorded before this one is handed over
                    except BaseException:
                        finish.discard()
                        raise
                    behind = (finisher.submit(finish), found, digest, span.name)
                done.append((found, digest))
                advance(True)
            settle()
        finally:
            if behind is not None:  # interrupted: the shard already written still goes in place, recorded
                with contextlib.suppress(Exception):
                    settle()
    return resumed


def _write_on_ray(cfg: ShardConfig, samples: Samples, spans: list[Span], journal, done: list,
                  advance, task_dirs: tuple[str, str]) -> tuple[int, dict]:
    """--executor ray: one Ray task writes each shard the journal cannot reuse, with the same
    `write_shard` (`pipeline.distribute.ray_executor`); fill ``done`` in plan order (index.json's
    order); return how many shards were reused and the summary's "parts" section (per task:
    shard, samples, seconds, node). Plans are made as tasks are handed out."""
    from pipeline.distribute.ray_executor import write_shards

    slots: list[tuple[shard_index.ShardEntry, str] | None] = [None] * len(spans)
    todo: list[tuple[int, str]] = []
    for i, span in enumerate(spans):
        digest = entry(samples, span).digest(cfg.input, __version__)
        found = journal.reusable(cfg.output / span.name, digest)
        if found is not None:
            slots[i] = (found, digest)
            advance(True)
        else:
            todo.append((i, digest))

    runs: list[dict] = []
    t = time.perf_counter()

    def finished(k: int, result: tuple[shard_index.ShardEntry, Any]) -> None:
        written, run = result
        i, digest = todo[k]
        journal.add(written, digest)
        slots[i] = (written, digest)
        runs.append(run.as_dict())
        advance(True)

    if todo:
        plans = (entry(samples, spans[i]) for i, _ in todo)
        write_shards(cfg.ray_address, plans, task_dirs[0], task_dirs[1], finished)
    done.extend(s for s in slots if s is not None)
    seconds = time.perf_counter() - t
    written_samples = sum(r["files"] for r in runs)
    parts = {"executor": "ray", "parts": len(spans), "reused_parts": len(spans) - len(todo), "redone_parts": len(todo),
             "samples_per_s": round(written_samples / seconds, 2) if todo and seconds > 0 else None,
             "runs": sorted(runs, key=lambda r: r["part"])}
    return len(spans) - len(todo), parts


def _prepare_output(cfg: ShardConfig) -> None:
    """No index.json until this run is complete, the marker written, temporaries of a killed run gone."""
    out = cfg.output
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / shard_index.INDEX_NAME).unlink(missing_ok=True)
        atomic_write_text(out / STATE_DIR / "state.json", json.dumps(cfg.marker(), indent=2, sort_keys=True))
        for p in out.iterdir():
            if p.name.startswith(".") and p.name.endswith(".tmp"):
                p.unlink()
    except OSError as e:
        raise UsageError(f"cannot write to the output folder {out}: {e.strerror or e}") from None

