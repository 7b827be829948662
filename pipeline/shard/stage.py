"""`pipe shard`: a CLEAN_DIR becomes deterministic webdataset tar shards and an `index.json`.

1. load: the kept rows of `manifest.parquet`, grouped by key (an image and its caption are one
   sample). Samples without a label cannot be trained on as a class: they are left out, counted
   in index.json (`excluded.unlabeled`) and named in the summary, never dropped silently.
2. split: per class, seeded, near duplicates (by `phash`) kept on one side (`split.py`).
3. measure: every image's size must match the others, and the train images' exact pixel sums
   give the mean and std readers normalise with. pipe clean recorded both in the manifest
   (`pipeline.formats.pixels`); only images it has none for (a manifest of an older pipe) are
   decoded, once, in worker processes.
4. pack: each split shuffled (seeded) then cut into shards by `--max-count` and `--max-size`
   (bytes on disk, tar headers and padding included; only a single sample larger than the limit
   makes a shard larger).
5. write: each shard under a temporary name, fsynced, renamed; stale shards of an earlier run
   removed; `index.json` last, so no reader ever sees a half-written dataset. Shards that an
   interrupted run of the same plan finished are kept (`resume.py`).

Same CLEAN_DIR, same settings -> byte-identical shards and index.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import stat
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from pipeline import __version__
from pipeline.core.errors import StageFailed, UsageError
from pipeline.core.files import STATE_DIR, atomic_write_text, occupied, output_lock, read_marker, tmp_name
from pipeline.core.rng import rng_for
from pipeline.core.ui import progress
from pipeline.distribute.executors import require
from pipeline.formats import index as shard_index
from pipeline.formats import tarstream
from pipeline.formats.manifest_row import NAMES, ManifestRow
from pipeline.formats.pixels import ImagePixels
from pipeline.formats.sample import SampleParts, encode_meta, shard_key
from pipeline.formats.vocabulary import Kind, Status
from pipeline.shard.split import split

SPLITS = ("train", "val")
SHARD_NAME = re.compile(r"^(train|val)-\d{6}\.tar$")
IMAGE_EXT = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".webp": "webp"}
IN_PROCESS_BELOW = 256  # images; fewer are measured in-process (a pool costs more to start)
ROW_BATCH = 10_000  # manifest rows turned into Python objects at a time (only kept ones are kept)
# the manifest columns pipe shard uses (the others, such as detail, are never turned into Python objects)
READ_COLUMNS = (NAMES.source, NAMES.key, NAMES.kind, NAMES.label, NAMES.status, NAMES.output, NAMES.caption,
                NAMES.width, NAMES.height, NAMES.encoding, NAMES.encoding_confidence, NAMES.phash,
                NAMES.output_width, NAMES.output_height, NAMES.pixel_sums, NAMES.pixel_squares)


@dataclass
class ShardConfig:
    """Settings of `pipe shard` (flags of the same name; `[shard]` in a `--config` file)."""

    input: Path
    """CLEAN_DIR written by `pipe clean` (its manifest.parquet is read; nothing there is modified)."""
    output: Path
    """SHARD_DIR: {train,val}-NNNNNN.tar and index.json."""
    val_fraction: float = 0.1
    """Share of each class that goes to validation (at least one sample of every class with two or more)."""
    max_count: int = 1000
    """Most samples in one shard."""
    max_size: int = 1 << 30
    """Most bytes in one shard, tar headers and padding counted; only a single larger sample exceeds it."""
    seed: int = 0
    """Seed of the split and of the shuffle before sharding."""
    split_distance: int = 6
    """Images whose perceptual hashes differ in at most this many of 64 bits stay on one side of the split."""
    expected_ranks: int = 8
    """Ranks you expect to train with; with expected_workers, sizes the 'too few shards' warning."""
    expected_workers: int = 4
    """Dataloader workers per rank you expect to train with."""
    workers: int = 0
    """Processes that decode images to measure them; 0 = one per core."""
    overwrite: bool = False
    """Replace a SHARD_DIR pipe shard wrote from other input or settings instead of refusing."""
    executor: str = "local"
    """Where shards are written: local (this process) or ray (one Ray task per shard, the plan made here)."""
    ray_address: str = "auto"
    """The Ray cluster to join with --executor ray: auto (the one started on this machine, or RAY_ADDRESS) or HOST:PORT."""

    # settings that change what is written; a SHARD_DIR made with others is replaced only with --overwrite
    OUTPUT_SETTINGS = ("val_fraction", "max_count", "max_size", "seed", "split_distance")

    def marker(self) -> dict:
        """What `.pipe/state.json` says about a SHARD_DIR this run writes."""
        return {"schema_version": 1, "tool": "pipe shard", "version": __version__, "input": str(self.input.resolve()),
                "settings": {k: getattr(self, k) for k in self.OUTPUT_SETTINGS}}

    def as_dict(self) -> dict:
        return {f.name: (str(v) if isinstance(v, Path) else v)
                for f in dataclasses.fields(self) for v in [getattr(self, f.name)]}


@dataclass
class Sample:
    key: str  # shard key (safe, unique)
    label: str
    image: str | None = None  # path relative to CLEAN_DIR
    image_ext: str | None = None
    text: str | None = None
    phash: int | None = None
    pixels: ImagePixels | None = None  # as pipe clean recorded them; None: decode the image to know
    # the .json member: a dict while loading, then its JSON bytes once the keys are final (encoded
    # once, not per use, and a fraction of the dict's memory on a million samples)
    meta: dict | bytes = dataclasses.field(default_factory=dict)
    cls: int = -1
    tar_bytes: int = 0
    image_stat: tuple[int, int] | None = None  # size and mtime_ns of the image file, from the one stat at load
    text_stat: tuple[int, int] | None = None


def validate(cfg: ShardConfig) -> None:
    checks = [
        (0 <= cfg.val_fraction < 1, f"--val-fraction must be at least 0 and below 1, got {cfg.val_fraction}"),
        (cfg.max_count >= 1, f"--max-count must be at least 1, got {cfg.max_count}"),
        (cfg.max_size >= 4096, f"--max-size must be at least 4096 bytes, got {cfg.max_size}"),
        (0 <= cfg.split_distance <= 32, f"--split-distance must be between 0 and 32 bits, got {cfg.split_distance}"),
        (cfg.expected_ranks >= 1, f"--expected-ranks must be at least 1, got {cfg.expected_ranks}"),
        (cfg.expected_workers >= 0, f"--expected-workers must be 0 or more, got {cfg.expected_workers}"),
        (cfg.workers >= 0, f"--workers must be 0 (all cores) or more, got {cfg.workers}"),
        (cfg.seed >= 0, f"--seed must be 0 or more, got {cfg.seed}"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
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


# ---------------------------------------------------------------- 1. load


def load_samples(clean_dir: Path) -> tuple[list[Sample], list[str], str]:
    """Labelled samples sorted by key, the keys of unlabelled ones, and the manifest's sha256."""
    import pyarrow.parquet as pq

    path = clean_dir / "manifest.parquet"
    raw = path.read_bytes()
    try:
        # ParquetFile, not read_table: that imports pyarrow.dataset and with it pandas (seconds)
        manifest = pq.ParquetFile(path)
        names = set(manifest.schema_arrow.names)
        missing = {NAMES.key, NAMES.kind, NAMES.label, NAMES.status, NAMES.output, NAMES.source} - names
        if missing:
            raise UsageError(f"{path} lacks the columns {', '.join(sorted(missing))}: is it a pipe clean manifest?")
        rows = [ManifestRow.from_dict(r)
                for batch in manifest.iter_batches(ROW_BATCH, columns=[c for c in READ_COLUMNS if c in names])
                for r in batch.to_pylist() if r[NAMES.status] == Status.KEPT]
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - any Arrow failure means the same thing to the user
        raise UsageError(f"{path} is not a readable Parquet file: {e}") from None
    by_key: dict[str, list[ManifestRow]] = {}
    for r in rows:
        by_key.setdefault(r.key, []).append(r)
    samples, unlabelled = [], []
    for key in sorted(by_key):
        s = _sample(key, by_key[key], clean_dir)
        if s is None:
            unlabelled.append(key)
        else:
            samples.append(s)
    _unique_keys(samples)
    for s in samples:
        s.meta = encode_meta(_loading_meta(s))
    samples.sort(key=lambda s: s.key)
    return samples, unlabelled, hashlib.sha256(raw).hexdigest()


def _sample(key: str, rows: list[ManifestRow], clean_dir: Path) -> Sample | None:
    images = [r for r in rows if r.kind == Kind.IMAGE]
    texts = [r for r in rows if r.kind == Kind.TEXT]
    if len(images) > 1 or len(texts) > 1 or len(images) + len(texts) != len(rows):
        raise UsageError(f"manifest key {key!r} has {len(images)} kept images and {len(texts)} kept texts; "
                         "expected at most one of each: is the manifest from pipe clean?")
    labels = {r.label for r in rows}
    if len(labels) > 1:
        raise UsageError(f"manifest key {key!r} has rows with different labels {sorted(map(str, labels))}")
    label = labels.pop()
    if label is None or label == "":
        return None
    meta: dict = {"label": label, "sources": {}}
    s = Sample(key=shard_key(key), label=label, meta=meta)
    if key != s.key:
        meta["manifest_key"] = key
    for r in images:
        s.image, s.image_stat = _checked_output(clean_dir, r)
        ext = IMAGE_EXT.get(os.path.splitext(s.image)[1].lower())
        if ext is None:
            raise UsageError(f"{clean_dir / s.image}: not a .jpg, .png or .webp image")
        s.image_ext = ext
        s.phash = int(r.phash, 16) if r.phash else None
        s.pixels = recorded_pixels(r)
        meta["sources"]["image"] = r.source
        meta["image"] = {"width": r.width, "height": r.height}
        if r.caption and not texts:  # a caption from the labels file: no row of its own
            s.text, s.text_stat = _checked_output(clean_dir, dataclasses.replace(r, output=r.caption))
            meta["sources"]["text"] = f"{r.source} (labels file caption)"
    for r in texts:
        s.text, s.text_stat = _checked_output(clean_dir, r)
        meta["sources"]["text"] = r.source
        meta["text"] = {"encoding": r.encoding, "encoding_confidence": r.encoding_confidence}
    return s


def recorded_pixels(row: ManifestRow) -> ImagePixels | None:
    """The image's size and pixel sums as pipe clean recorded them, or None when the manifest
    has none (a pipe before these columns) or they are not plausible numbers (a hand-made
    manifest): then the image is decoded and measured here, as it always was."""
    w, h, sums, squares = row.output_width, row.output_height, row.pixel_sums, row.pixel_squares
    if not (_count(w) and _count(h) and isinstance(sums, list) and isinstance(squares, list)):
        return None
    if len(sums) != 3 or len(squares) != 3 or not all(map(_count, sums + squares)):
        return None
    return ImagePixels(w, h, (sums[0], sums[1], sums[2]), (squares[0], squares[1], squares[2]))


def _count(v: object) -> TypeGuard[int]:
    return type(v) is int and v >= 0  # not a bool, not a float


def _checked_output(clean_dir: Path, row: ManifestRow) -> tuple[str, tuple[int, int]]:
    """The row's output path, if it is a file inside CLEAN_DIR, and its size and mtime_ns (the
    only stat of it in the run; string operations, not pathlib: this runs for every kept file)."""
    rel = row.output or ""
    if not rel or ".." in rel.split("/") or rel.startswith("/"):
        raise UsageError(f"manifest row for {row.source!r} is kept but has no usable output path ({rel!r})")
    try:
        st = os.stat(os.path.join(clean_dir, rel))
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{clean_dir / rel} is listed as kept in the manifest but is missing: was CLEAN_DIR changed? re-run pipe clean")
    return rel, (st.st_size, st.st_mtime_ns)


def _unique_keys(samples: list[Sample]) -> None:
    seen: set[str] = set()
    for s in sorted(samples, key=lambda s: _loading_meta(s).get("manifest_key", s.key)):
        while s.key in seen:  # only possible after shortening long keys
            s.key = shard_key(f"{s.key}-{hashlib.sha1(s.key.encode()).hexdigest()[:8]}")
        seen.add(s.key)


def _loading_meta(s: Sample) -> dict:
    """The sample's .json member while it is still a dict: it becomes bytes only once the keys are final."""
    if not isinstance(s.meta, dict):
        raise AssertionError(f"sample {s.key}: its meta was encoded before the keys were final")
    return s.meta


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


def measure(cfg: ShardConfig, samples: list[Sample], is_val: list[bool], show_progress: bool) -> tuple[shard_index.PixelStats, int | None]:
    """Exact train pixel stats and the one image size (errors are UsageError), from the numbers
    pipe clean recorded in the manifest; only images it recorded none for are decoded."""
    stats, sizes = shard_index.PixelStats(), Counter[tuple[int, int]]()
    for s, val in zip(samples, is_val):
        if s.pixels is not None:
            _count_image(s.pixels, val, stats, sizes)
    _decode_unmeasured(cfg, samples, is_val, show_progress, stats, sizes)
    if len(sizes) > 1 or any(w != h for w, h in sizes):
        seen = ", ".join(f"{w}x{h} ({n} images)" for (w, h), n in sizes.most_common(3))
        raise UsageError(f"images in {cfg.input} are not all one square size ({seen}); re-run pipe clean with one --size")
    size = next(iter(sizes))[0] if sizes else None
    return stats, size


def _count_image(px: ImagePixels, val: bool, stats: shard_index.PixelStats, sizes: Counter) -> None:
    sizes[(px.width, px.height)] += 1
    if not val:
        stats.add(px.count, px.sums, px.squares)


def _decode_unmeasured(cfg: ShardConfig, samples: list[Sample], is_val: list[bool], show_progress: bool,
                       stats: shard_index.PixelStats, sizes: Counter) -> None:
    """Decode (in worker processes when there are many) the images the manifest has no numbers for."""
    from pipeline.core.cores import worker_count
    from pipeline.core.executor import OrderedPool

    todo = [(s.image, v) for s, v in zip(samples, is_val) if s.image is not None and s.pixels is None]
    if not todo:
        return
    paths = [str(cfg.input / image) for image, _ in todo]
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
            for (image, val), res in zip(todo, results):
                if not isinstance(res, ImagePixels):
                    raise UsageError(f"{cfg.input / image} does not decode ({res[1]}): was CLEAN_DIR changed? re-run pipe clean")
                _count_image(res, val, stats, sizes)
                advance(True)
    finally:
        if pool is not None:
            pool.close()


# ---------------------------------------------------------------- 4. pack


def sample_tar_bytes(s: Sample) -> int:
    """Bytes the sample takes in a shard (its files' sizes as found at load)."""
    parts = SampleParts(s.key, s.cls, s.meta, image=None, text=None)
    n = sum(tarstream.member_size(len(data)) for _, data in parts.members())
    for st in (s.image_stat, s.text_stat):
        if st is not None:
            n += tarstream.member_size(st[0])
    return n


def pack(sizes: list[int], max_count: int, max_size: int) -> list[tuple[int, int]]:
    """Cut a sequence of sample sizes into [begin, end) runs: at most max_count samples and
    max_size bytes each (the end-of-archive blocks counted), unless one sample alone is larger."""
    runs, begin, used = [], 0, len(tarstream.END_OF_ARCHIVE)
    for i, n in enumerate(sizes):
        full = i - begin >= max_count or used + n > max_size
        if full and i > begin:
            runs.append((begin, i))
            begin, used = i, len(tarstream.END_OF_ARCHIVE)
        used += n
    if begin < len(sizes):
        runs.append((begin, len(sizes)))
    return runs


# ---------------------------------------------------------------- 5. write


def write_shard(path: Path, samples: list[Sample], clean_dir: Path) -> shard_index.ShardEntry:
    """Write one shard atomically; return its index entry (offsets, size, sha256).

    A failed write (disk full) removes its temporary tar: left behind, it would keep the disk full."""
    tmp = tmp_name(path)
    try:
        return _write_shard(tmp, path, samples, clean_dir)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _size(file_stat: tuple[int, int] | None) -> int:
    """The size a file had at load: `_checked_output` stats every output path a sample has."""
    if file_stat is None:
        raise AssertionError("a sample's output file was not stat'ed at load")
    return file_stat[0]


def _write_shard(tmp: Path, path: Path, samples: list[Sample], clean_dir: Path) -> shard_index.ShardEntry:
    digest, offsets, pos, root = hashlib.sha256(), [], 0, os.fspath(clean_dir)
    with open(tmp, "wb") as f:
        for s in samples:
            offsets.append(pos)
            parts = SampleParts(s.key, s.cls, s.meta, image_ext=s.image_ext)
            if s.image is not None:
                parts.image = _read(root, s.image, _size(s.image_stat))
            if s.text is not None:
                parts.text = _read(root, s.text, _size(s.text_stat))
                _check_utf8(parts.text, clean_dir / s.text)
            chunk = b"".join(tarstream.member(name, data) for name, data in parts.members())  # one write per sample
            if len(chunk) != s.tar_bytes:
                raise StageFailed(f"{clean_dir} changed while sharding (sample {s.key}); run pipe shard again")
            f.write(chunk)
            digest.update(chunk)
            pos += len(chunk)
        f.write(tarstream.END_OF_ARCHIVE)
        digest.update(tarstream.END_OF_ARCHIVE)
        pos += len(tarstream.END_OF_ARCHIVE)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    split_name = path.name.split("-", 1)[0]
    return shard_index.ShardEntry(path.name, split_name, len(samples), pos, digest.hexdigest(), offsets)


def _read(root: str, rel: str, size: int) -> bytes:
    """The file's bytes, in one read call for a file of the size found at load (a buffered
    ``read()`` makes four system calls a file; small files are most of a shard's cost). One byte
    more is asked for, so a file that grew since shows: any other size stops the run."""
    fd = os.open(os.path.join(root, rel), os.O_RDONLY)
    try:
        chunks, want = [], size + 1
        while want > 0 and (chunk := os.read(fd, want)):
            chunks.append(chunk)
            want -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)  # one chunk: that very object, no copy
    if len(data) != size:
        raise StageFailed(f"{root} changed while sharding ({rel} was {size} bytes, now {'more' if len(data) > size else len(data)}); "
                          "run pipe shard again")
    return data


def _check_utf8(data: bytes, path: Path) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 ({e.reason} at byte {e.start}): was CLEAN_DIR changed? re-run pipe clean") from None


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


def run(cfg: ShardConfig, show_progress: bool = True) -> dict:
    """Run the whole stage; return a summary (what index.json says, in counts, plus warnings).

    SHARD_DIR is locked for the whole run (a second run into it stops at once), and only after
    `validate` found nothing in it that pipe shard did not write: the lock is the first thing written."""
    validate(cfg)
    with output_lock(cfg.output, "pipe shard"):
        claim_output(cfg)
        return _run(cfg, show_progress)


def _run(cfg: ShardConfig, show_progress: bool) -> dict:
    timings: dict[str, float] = {}
    t = time.perf_counter()
    samples, unlabelled, manifest_sha = load_samples(cfg.input)
    if not samples:
        why = f" ({len(unlabelled)} kept samples have no label)" if unlabelled else ""
        raise UsageError(f"{cfg.input} has no kept, labelled samples to shard{why}")
    classes = sorted({s.label for s in samples})
    class_index = {c: i for i, c in enumerate(classes)}
    for s in samples:
        s.cls = class_index[s.label]
    timings["load_s"] = time.perf_counter() - t

    t = time.perf_counter()
    res = split([s.label for s in samples], [s.phash for s in samples], cfg.val_fraction, cfg.seed, cfg.split_distance)
    timings["split_s"] = time.perf_counter() - t

    t = time.perf_counter()
    stats, image_size = measure(cfg, samples, res.is_val, show_progress)
    mean, std = stats.mean_std()
    timings["measure_s"] = time.perf_counter() - t

    t = time.perf_counter()
    entries, resumed = _write_all(cfg, samples, res.is_val, show_progress)
    timings["write_s"] = time.perf_counter() - t

    by_split = {sp: [s for s, v in zip(samples, res.is_val) if v == (sp == "val")] for sp in SPLITS}
    warnings = []
    if unlabelled:
        warnings.append(f"{len(unlabelled)} kept samples have no label and were left out (e.g. {', '.join(unlabelled[:3])})")
    if res.classes_without_val:
        warnings.append(f"classes with no validation sample (their samples are near duplicates of each other): "
                        f"{', '.join(res.classes_without_val[:5])}")
    w = readers_warning(sum(e.split == "train" for e in entries), len(by_split["train"]), cfg)
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
        "counts": {
            sp: {"samples": len(by_split[sp]), "shards": sum(e.split == sp for e in entries),
                 "per_class": dict(sorted(Counter(s.label for s in by_split[sp]).items())),
                 "images": sum(s.image is not None for s in by_split[sp]),
                 "texts": sum(s.text is not None for s in by_split[sp])}
            for sp in SPLITS
        },
        "excluded": {"unlabelled": len(unlabelled)},
        "near_duplicate_groups": {"groups": res.groups, "samples": res.grouped_samples,
                                  "max_distance": cfg.split_distance},
        "shards": [e.as_dict() for e in entries],
    }
    try:
        atomic_write_text(cfg.output / shard_index.INDEX_NAME, shard_index.dumps(doc), fsync=True)
    except OSError as e:
        raise StageFailed(f"could not write {cfg.output / shard_index.INDEX_NAME}: {e}") from None
    return {"output": str(cfg.output), "classes": len(classes), "image_size": image_size,
            "train": len(by_split["train"]), "val": len(by_split["val"]),
            "train_shards": doc["counts"]["train"]["shards"], "val_shards": doc["counts"]["val"]["shards"],
            "bytes": sum(e.bytes for e in entries), "unlabelled": len(unlabelled),
            "near_duplicate_groups": res.groups, "reused_shards": resumed, "warnings": warnings,
            "timings": {k: round(v, 3) for k, v in timings.items()}}


def _write_all(cfg: ShardConfig, samples: list[Sample], is_val: list[bool],
               show_progress: bool) -> tuple[list[shard_index.ShardEntry], int]:
    """Write every shard (keeping those an interrupted run of the same plan finished, `resume.py`);
    return their entries and how many were kept."""
    from pipeline.shard.resume import WrittenShards, plan_digest

    out = cfg.output
    _prepare_output(cfg)
    journal = WrittenShards(out)
    done: list[tuple[shard_index.ShardEntry, str]] = []
    resumed = 0
    try:
        with progress("write shards", len(samples), show_progress) as advance:
            jobs = list(_plan(cfg, samples, is_val))
            plans = [plan_digest(path.name, cfg.input, part) for path, part in jobs]
            kept = [journal.reusable(path, plan) for (path, _), plan in zip(jobs, plans)]
            on_ray = _write_on_ray(cfg, jobs, plans, kept, journal, advance) if cfg.executor == "ray" else {}
            for (path, part), plan, entry in zip(jobs, plans, kept):
                resumed += entry is not None
                entry = entry or on_ray.get(path.name)
                if entry is None:
                    try:
                        entry = write_shard(path, part, cfg.input)
                        journal.add(entry, plan)
                    except OSError as err:
                        raise StageFailed(f"could not write {path}: {err}") from None
                done.append((entry, plan))
                for _ in part if path.name not in on_ray else ():
                    advance(True)
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
    return [e for e, _ in done], resumed


def _write_on_ray(cfg: ShardConfig, jobs: list[tuple[Path, list[Sample]]], plans: list[str],
                  kept: list[shard_index.ShardEntry | None], journal, advance) -> dict[str, shard_index.ShardEntry]:
    """--executor ray: one Ray task writes each shard the journal cannot reuse, with the same
    `write_shard` (`pipeline.distribute.ray_executor`); return the entries by shard name."""
    from pipeline.distribute.ray_executor import write_shards

    todo = [i for i, entry in enumerate(kept) if entry is None]
    written: dict[str, shard_index.ShardEntry] = {}

    def done(k: int, entry: shard_index.ShardEntry) -> None:
        path, part = jobs[todo[k]]
        journal.add(entry, plans[todo[k]])
        written[path.name] = entry
        for _ in part:
            advance(True)

    if todo:
        write_shards(cfg.ray_address, [jobs[i] for i in todo], cfg.input, done)
    return written


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


def _plan(cfg: ShardConfig, samples: list[Sample], is_val: list[bool]):
    """(shard path, its samples in order) for every shard, train first: each split shuffled with
    its own seeded stream, then cut by --max-count and --max-size. Deterministic."""
    for sp, stream in ((sp, i + 2) for i, sp in enumerate(SPLITS)):
        part = [s for s, v in zip(samples, is_val) if v == (sp == "val")]
        order = rng_for(cfg.seed, stream).permutation(len(part))
        part = [part[int(i)] for i in order]
        for s in part:
            s.tar_bytes = sample_tar_bytes(s)
        for n, (b, e) in enumerate(pack([s.tar_bytes for s in part], cfg.max_count, cfg.max_size)):
            yield cfg.output / f"{sp}-{n:06d}.tar", part[b:e]
