"""`pipe shard`: a CLEAN_DIR becomes deterministic webdataset tar shards and an `index.json`.

1. load: the kept rows of `manifest.parquet`, grouped by key (an image and its caption are one
   sample), held as columns (`samples.py`). An image-caption pair without a label is a sample
   (no .cls member: data for contrastive training); an image or a text alone without a label is
   of use to no objective: left out, counted in index.json (`excluded.unlabelled`) and named in
   the summary, never dropped silently. `--pairs-only` keeps the image-caption pairs alone (what
   --objective contrastive reads): a labelled image or text alone is left out the same way
   (`excluded.not_pairs`). The shards then hold exactly what training reads, so the reader's plan,
   exactly-once epochs and resume need nothing new.
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
import dataclasses
import re
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import __version__
from pipeline.core.errors import StageFailed, UsageError
from pipeline.core.files import STATE_DIR
from pipeline.core.settings import check as check_settings
from pipeline.core.ui import progress
from pipeline.executors import Executor, Later, require
from pipeline.formats import index as shard_index
from pipeline.formats.labels import similar_names_warning
from pipeline.formats.pixels import BEFORE_ENCODING, INDEX_FIELD, LOSSY_EXTS, MANIFEST_KEY, ImagePixels
from pipeline.formats.sample import IMAGE_EXTS
from pipeline.shard.config import DEFAULT_RANKS, DEFAULT_WORKERS, TOOL, ShardConfig
from pipeline.shard.plan import SPLITS, ShardPlan, Span, entry, make_plan
from pipeline.shard.samples import IMAGE_EXT, Samples, give_back_freed, load
from pipeline.shard.split import split_arrays
from pipeline.shard.write import start_shard
from pipeline.storage import EXAMPLE_URL, Folder, open_folder
from pipeline.storage import output as outputs

COMMIT_OF_CLEAN = "manifest.parquet"  # what says a CLEAN_DIR is complete
SHARD_NAME = re.compile(r"^(train|val)-\d{6}\.tar$")
IN_PROCESS_BELOW = 256  # images; fewer are measured in-process (a pool costs more to start)
# settings index.json does not record: where and how the run ran, and those named only where given (`opted_in`)
NOT_IN_INDEX = ("input", "output", "workers", "overwrite", "executor", "ray_address", "ray_keep_warm", "pairs_only")
PART_PRELOAD = ("pyarrow.compute",)  # what `write_part` needs beside this module (imported early by local helpers)
MEASURE_ROWS = 8192  # images whose recorded numbers are added up at once (a few hundred KiB of temporaries)


def validate(cfg: ShardConfig) -> None:
    check_settings(cfg)  # the declared ranges and choices (shard/config.py)
    require(cfg.executor)
    clean, out = open_folder(cfg.input), open_folder(cfg.output)
    if clean.state() != "folder":
        raise UsageError(f"CLEAN_DIR not found: {clean.url}")
    if not clean.exists(COMMIT_OF_CLEAN):
        raise UsageError(f"{clean.url} has no manifest.parquet: run pipe clean first (or let it finish)")
    if clean.contains(out):
        raise UsageError(f"the output folder {out.url} is inside CLEAN_DIR {clean.url}; choose another folder")
    if out.state() == "file":
        raise UsageError(f"the output path {out.url} exists and is not a folder")
    foreign = sorted({e.rel.split("/", 1)[0] for e in out.list() if not _ours(e.rel.split("/", 1)[0])})
    if foreign:
        raise UsageError(f"{out.url} holds files pipe shard did not write ({', '.join(foreign[:3])}); choose an empty folder")
    refuse_foreign(out)


def _ours(name: str) -> bool:
    return (bool(SHARD_NAME.match(name)) or name in (shard_index.INDEX_NAME, STATE_DIR)
            or (name.startswith(".") and name.endswith(".tmp")))


def refuse_foreign(out: Folder) -> None:
    """A folder of shard-like names without pipe shard's marker is not ours to replace, --overwrite or not."""
    outputs.refuse_foreign(out, TOOL, _REFUSED.format(out=out.url))


_REFUSED = ("{out} holds shards that pipe shard did not write (it has no .pipe/state.json of pipe shard's); "
            "choose an empty folder (--overwrite replaces only a folder pipe shard wrote)")


def claim_output(cfg: ShardConfig, out: Folder) -> None:
    """Resume a SHARD_DIR whose marker says pipe shard made it from the same input and settings
    (shards it finished are kept, the rest written: `resume.py`); replace one made with others
    only with --overwrite. The marker is written at once: until it was (after the split and the
    measuring, minutes on a large set), a second run took the folder this one holds for someone
    else's (exit 2, "did not write") instead of a busy one, and a run killed meanwhile left a
    folder no later run would take."""
    outputs.claim(out, TOOL, shard_index.INDEX_NAME, cfg.overwrite, lambda state: _differs(cfg, state),
                  owned=(shard_index.INDEX_NAME,), refused=_REFUSED.format(out=out.url))
    try:
        outputs.write_marker(out, cfg.marker())
    except OSError as e:
        raise UsageError(f"cannot write to the output folder {out.url}: {e.strerror or e}") from None


def _differs(cfg: ShardConfig, state: dict) -> str | None:
    want = cfg.marker()
    if state.get("input") != want["input"]:
        return f"was sharded from {state.get('input')}, not {want['input']}; pass --overwrite to replace it"
    settings = state.get("settings")
    old, new = (_with_defaults(d) for d in (settings if isinstance(settings, dict) else {}, want["settings"]))
    if old != new:
        changed = ", ".join(f"--{k.replace('_', '-')} {old.get(k)} -> {new.get(k)}" for k in [*new, *(k for k in old if k not in new)]
                            if old.get(k) != new.get(k))
        return f"was made with other settings ({changed}); pass --overwrite to replace it"
    return None


def _with_defaults(settings: dict) -> dict:
    """A marker's settings with the `ShardConfig.OPTED_IN` ones it does not name (not given) as their defaults."""
    return settings | {k: off for k, off in ShardConfig.OPTED_IN.items() if k not in settings}


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


def measure(cfg: ShardConfig, samples: Samples, is_val: np.ndarray,
            show_progress: bool) -> tuple[shard_index.PixelStats, int | None, int, bool]:
    """Exact train pixel stats, the one image size (errors are UsageError), how many images
    were decoded, and whether the stats hold numbers pipe clean took before a lossy encode (its
    manifest says so, `pipeline.formats.pixels.MANIFEST_KEY`, and a train JPEG or WebP has
    them): the numbers come from what pipe clean recorded in the manifest, added up as arrays;
    only images it recorded none for (an older pipe's manifest) are decoded."""
    px = samples.pixels
    is_image = samples.image_ext >= 0
    recorded = is_image & (px[:, 0] >= 0)
    lossy = np.isin(samples.image_ext, [IMAGE_EXTS.index(e) for e in LOSSY_EXTS])
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
    lossy_recorded = bool(np.any(recorded & ~is_val & lossy))  # a train JPEG or WebP with recorded numbers
    return stats, size, len(todo), lossy_recorded and _before_encoding(Path(cfg.input))  # (its footer read only then)


def _before_encoding(clean_dir: Path) -> bool:
    """Whether pipe clean's manifest says its lossy outputs' numbers are of the pixels before encoding."""
    import pyarrow.parquet as pq

    metadata = pq.read_schema(clean_dir / "manifest.parquet").metadata or {}
    return metadata.get(MANIFEST_KEY) == BEFORE_ENCODING.encode()


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

    root = Path(cfg.input)  # (CLEAN_DIR on this machine: `run` hands `measure` its local view)
    paths = [str(root / image) for image in images]
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
                    raise UsageError(f"{root / image} does not decode ({res[1]}): was CLEAN_DIR changed? re-run pipe clean")
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


# Below this many train bytes per expected reader, idle readers cost nothing worth a line: any
# reader takes the whole split in moments, and shards cut smaller only to feed 32 of them would be
# tiny (the old warning advised --max-count 5 for 167 samples).
READER_BYTES_WORTH_A_WARNING = 16 << 20


def readers_warning(train_shards: int, n_train: int, cfg: ShardConfig, train_bytes: int | None = None) -> str | None:
    """Warn when per-shard readers (stock webdataset: one shard per worker; pipe train's reader
    does not) would sit idle. With the default layout (--expected-ranks 8, --expected-workers 4:
    nobody said how they will train) only where the train split is large enough for that to cost
    time (`READER_BYTES_WORTH_A_WARNING` per reader; ``train_bytes`` None: large enough); with a
    layout the user gave, always: they asked."""
    workers = max(1, cfg.expected_workers)
    readers = cfg.expected_ranks * workers
    if train_shards >= readers or n_train == 0:
        return None
    defaults = (cfg.expected_ranks, cfg.expected_workers) == (DEFAULT_RANKS, DEFAULT_WORKERS)
    if defaults and train_bytes is not None and train_bytes < readers * READER_BYTES_WORTH_A_WARNING:
        return None
    said = " (--expected-ranks/--expected-workers: how you will train)" if defaults else ""
    what = (f"only {train_shards} train shard{'s' * (train_shards != 1)} for {cfg.expected_ranks} ranks x "
            f"{workers} workers = {readers} readers{said}")
    if n_train < readers:
        return f"{what}, and only {n_train} train samples: readers that take whole shards will sit idle (pipe train's reader does not)"
    fix = max(1, n_train // readers)
    return f"{what}: readers that take whole shards will sit idle (pipe train's reader does not); --max-count {fix} gives {readers} or more"


# ---------------------------------------------------------------- the stage


def run(cfg: ShardConfig, show_progress: bool = True, executor: Executor | None = None) -> dict:
    """Run the whole stage on ``executor`` (default: the one ``cfg`` names); return a summary
    (what index.json says, in counts, plus warnings).

    SHARD_DIR is locked for the whole run where its storage can lock (a second run into it stops
    at once), and only after `validate` found nothing in it that pipe shard did not write: the
    lock is the first thing written."""
    from pipeline import executors

    validate(cfg)
    if executor is None:
        executor = executors.get(cfg.executor, address=cfg.ray_address, workers=cfg.workers, keep_warm=cfg.ray_keep_warm)
    clean, out = open_folder(cfg.input), open_folder(cfg.output)
    with out.lock(TOOL):
        claim_output(cfg, out)
        with executor.session(part_fn=write_part), out.staging("shard") as scratch, clean.local_view(_read_by_shard(clean)) as root:
            # ``local``: the same settings with CLEAN_DIR as files on this machine (itself, when it is local)
            local = dataclasses.replace(cfg, input=Path(root))
            return _run(cfg, local, clean, out, executor, Path(scratch), show_progress)


def _read_by_shard(clean: Folder) -> Iterator[str]:
    """What pipe shard reads of CLEAN_DIR: its manifest and kept outputs (listed only if asked)."""
    yield COMMIT_OF_CLEAN
    for e in clean.child("data").list():
        yield f"data/{e.rel}"


def _run(cfg: ShardConfig, local: ShardConfig, clean: Folder, out: Folder, executor: Executor, scratch: Path,
         show_progress: bool) -> dict:
    timings: dict[str, float] = {}
    t = time.perf_counter()
    samples, manifest_sha = load(Path(local.input), scratch, cfg.pairs_only)
    if not len(samples):
        why = f" ({samples.unlabelled} kept samples have no label and are images or texts alone)" if samples.unlabelled else ""
        if cfg.pairs_only:
            raise UsageError(f"{clean.url} has no kept image-caption pairs to shard with --pairs-only"
                             f"{why or f' ({samples.not_pairs} kept samples are images or texts alone)'}")
        raise UsageError(f"{clean.url} has no kept, labelled samples and no image-caption pairs to shard{why}")
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
    stats, image_size, decoded, before_encoding = measure(local, samples, is_val, show_progress)
    mean, std = stats.mean_std()
    timings["measure_s"] = time.perf_counter() - t

    t = time.perf_counter()
    spans = make_plan(samples.tar_bytes(), is_val, cfg.seed, cfg.max_count, cfg.max_size)
    give_back_freed()  # the plan's temporaries: handed back before shards are written
    entries, resumed, parts = _write_all(cfg, clean, out, executor, samples, spans, show_progress)
    timings["write_s"] = time.perf_counter() - t

    counts = {sp: _split_counts(samples, is_val == (sp == "val"), sum(e.split == sp for e in entries)) for sp in SPLITS}
    warnings = []
    if decoded:
        warnings.append(decoded_notice(decoded, int(np.count_nonzero(samples.image_ext >= 0))))
    if samples.unlabelled:
        warnings.append(f"{samples.unlabelled} kept samples have no label and were left out (images or texts alone, no "
                        f"image-caption pairs; e.g. {', '.join(samples.unlabelled_examples)})")
    if samples.not_pairs:
        warnings.append(f"{samples.not_pairs} kept labelled samples are an image or a text alone and were left out "
                        f"(--pairs-only; e.g. {', '.join(samples.not_pair_examples)})")
    if similar := similar_names_warning(classes):
        warnings.append(similar)
    if res.classes_without_val:
        warnings.append(f"classes with no validation sample (their samples are near duplicates of each other): "
                        f"{', '.join(res.classes_without_val[:5])}")
    w = readers_warning(counts["train"]["shards"], counts["train"]["samples"], cfg,
                        sum(e.bytes for e in entries if e.split == "train"))
    if w:
        warnings.append(w)
    doc: dict[str, Any] = {
        "schema_version": shard_index.SCHEMA_VERSION,
        "created_by": f"pipe shard {__version__}",
        "manifest_sha256": manifest_sha,
        "settings": {k: v for k, v in cfg.as_dict().items() if k not in NOT_IN_INDEX} | cfg.opted_in(),
        "classes": classes,
        "image_size": image_size,
        "mean": mean,
        "std": std,
        # absent: the decoded images' numbers, exact (an older pipe clean's manifest, PNG outputs)
        **({INDEX_FIELD: BEFORE_ENCODING} if before_encoding else {}),
        "counts": counts,
        "excluded": {"unlabelled": samples.unlabelled, **({"not_pairs": samples.not_pairs} if cfg.pairs_only else {})},
        "near_duplicate_groups": {"groups": res.groups, "samples": res.grouped_samples,
                                  "max_distance": cfg.split_distance},
        "shards": [e.as_dict() for e in entries],
    }
    try:
        outputs.commit(out, shard_index.INDEX_NAME, shard_index.dumps(doc).encode("utf-8"))
    except OSError as e:
        raise StageFailed(f"could not write {out.url}/{shard_index.INDEX_NAME}: {e}") from None
    return {"output": out.url, "classes": len(classes), "image_size": image_size,
            "train": counts["train"]["samples"], "val": counts["val"]["samples"],
            "train_shards": counts["train"]["shards"], "val_shards": counts["val"]["shards"],
            "bytes": sum(e.bytes for e in entries), "unlabelled": samples.unlabelled,
            **({"not_pairs": samples.not_pairs} if cfg.pairs_only else {}),
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


def _write_all(cfg: ShardConfig, clean: Folder, out: Folder, executor: Executor, samples: Samples, spans: list[Span],
               show_progress: bool) -> tuple[list[shard_index.ShardEntry], int, dict | None]:
    """Write every shard of the plan that an interrupted run of the same plan did not finish
    (`resume.py`), one part each on the executor (`write_part`); return their entries in plan
    order, how many were kept, and what the executor says of how the parts ran. A shard's plan
    entry is made only as its part is handed out: the plan itself is a few arrays. Its digest
    (what the journal records) is taken from that same entry, and beforehand only for the
    shards the journal names (made once, not twice)."""
    from pipeline.shard.resume import WrittenShards

    _prepare_output(cfg, out)
    journal = WrittenShards(out)
    slots: list[tuple[shard_index.ShardEntry, str] | None] = [None] * len(spans)
    todo: list[tuple[int, str | None]] = []  # (plan index, digest: None until its part is handed out)
    runs: list[dict] = []
    identity = clean.identity()
    try:
        with progress("write shards", len(spans), show_progress, counts=False) as advance:
            for i, span in enumerate(spans):
                if span.name not in journal.recorded:
                    todo.append((i, None))
                    continue
                digest = entry(samples, span).digest(identity, __version__)
                found = journal.reusable(span.name, digest)
                if found is not None:
                    slots[i] = (found, digest)
                    advance(True)
                else:
                    todo.append((i, digest))

            def handed_out(k: int) -> tuple[ShardPlan, Folder, Folder]:
                i, digest = todo[k]
                plan = entry(samples, spans[i])
                if digest is None:
                    todo[k] = (i, plan.digest(identity, __version__))
                return plan, clean, out

            def finished(k: int, written: shard_index.ShardEntry, run) -> None:
                i, digest = todo[k]
                assert digest is not None  # (set when its part was handed out)
                journal.add(written, digest)
                slots[i] = (written, digest)
                if run is not None:
                    runs.append(run.as_dict())
                advance(True)

            t = time.perf_counter()
            if todo:
                executor.run_parts(write_part, Calls(len(todo), handed_out), finished)
            seconds = time.perf_counter() - t
    finally:
        journal.close()
    done = [s for s in slots if s is not None]
    try:
        written = {e.name for e, _ in done}
        stale = [e.rel for e in out.list() if "/" not in e.rel and SHARD_NAME.match(e.rel) and e.rel not in written]
        for rel in stale:  # shards of an earlier run with more shards
            out.delete(rel)
        journal.finish(done)
    except OSError as err:
        raise StageFailed(f"could not finish writing {out.url}: {err}") from None
    parts = executor.summary(parts=len(spans), reused_parts=len(spans) - len(todo), redone_parts=len(todo),
                             samples_per_s=(round(sum(r["files"] for r in runs) / seconds, 2) if todo and seconds > 0
                                            else None),
                             runs=sorted(runs, key=lambda r: r["part"]))
    return [e for e, _ in done], len(spans) - len(todo), parts


class Calls:
    """``count`` calls made one at a time as they are taken (``make(k)``), their count the
    length hint an executor may size its work by (the local one shares many parts among
    processes) without the calls being made ahead."""

    def __init__(self, count: int, make: Callable[[int], tuple]):
        self.count, self.make = count, make

    def __iter__(self) -> Iterator[tuple]:
        return map(self.make, range(self.count))

    def __length_hint__(self) -> int:
        return self.count


def write_part(plan: ShardPlan, clean: Folder, out: Folder) -> Later:
    """One part: one shard, from its plan entry alone, wherever it runs. Its bytes are written
    under a temporary name (`start_shard`, reading CLEAN_DIR's files where they can be read as
    files: `Folder.local_view`); the `Later` puts it in place (synced and renamed, or uploaded:
    `Folder.put_file`), a step an executor may overlap with the next shard."""
    if not clean.exists(COMMIT_OF_CLEAN) or outputs.read_marker(out) is None:
        raise UsageError(f"CLEAN_DIR {clean.url} or SHARD_DIR {out.url} is not visible where this part runs "
                         f"({socket.gethostname()}): a local folder must be a shared file system mounted at the same "
                         f"path on every node the parts run on; or use object storage ({EXAMPLE_URL})")
    files = [p for p in (*plan.images.to_pylist(), *plan.texts.to_pylist()) if p is not None]
    stack = contextlib.ExitStack()
    try:
        scratch = Path(stack.enter_context(out.staging("shard")))
        with clean.local_view(files) as root:
            written, unfinished = start_shard(plan, Path(root), scratch)
    except OSError as err:
        stack.close()
        raise StageFailed(f"could not write {out.url}/{plan.name}: {err}") from None
    except BaseException:
        stack.close()
        raise

    def finish() -> None:
        try:
            out.put_file(plan.name, unfinished.tmp)
        except OSError as err:
            raise StageFailed(f"could not write {out.url}/{plan.name}: {err}") from None
        finally:
            unfinished.discard()
            stack.close()

    def discard() -> None:
        unfinished.discard()
        stack.close()

    return Later(written, finish, discard)


def _prepare_output(cfg: ShardConfig, out: Folder) -> None:
    """No index.json until this run is complete, the marker written, temporaries of a killed run gone."""
    try:
        out.delete(shard_index.INDEX_NAME)
        outputs.write_marker(out, cfg.marker())
        out.clear_temporaries()
    except OSError as e:
        raise UsageError(f"cannot write to the output folder {out.url}: {e.strerror or e}") from None
