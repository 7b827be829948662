"""The streaming reader vs the naive ways, same data, same run, whole processes, as ratios.

1. Decoded batches: our `ShardReader` (shards, `make_loader`) against the way most training
   scripts load images: one JPEG file per sample, a map-style Dataset, `DistributedSampler`
   (shuffled) and a DataLoader. Both run 2 dataloader workers (forked), the same batch size and
   the same work per sample: read the bytes, decode with `pipeline.formats.sample.decode_image`
   (simplejpeg), scale to 0-1 and normalize with index.json's mean/std (the loose side the
   textbook way, per sample, then default_collate). Target: ours at least as fast.
2. Raw reading, no decode: our reader's read path (`train.data.stream.SampleReader`, what
   `ShardReader` reads with, no torch import) against `cat` of the train shards, both reading
   about ``--raw-gb`` GB (that many passes / epochs over the same bytes, as an epoch of a real
   dataset would) so process start-up is a small part. Two levels of ours: the reads alone
   (`.reads`: the plan's blocks, one mapped read per run of samples) and the samples
   (`.samples`: tar headers parsed and checked, each sample's members located). Target: 70% of
   cat's rate or more.

The data: seeded, smooth-noise 512x512 JPEGs in class folders, run through `pipe clean` and
`pipe shard --val-fraction 0` in a temporary folder. The loose-file dataset is CLEAN_DIR's
`data/<class>/*.jpg`: byte for byte the images inside the shards.

Every measurement is a fresh `python` (or `cat`) process timed from launch to exit by this
script, so interpreter start, imports and worker start-up count on both sides; its CPU time
(user + system, children included) is printed too, which tells how much a busy machine slowed
it. The page cache is warmed first (every loose file and every shard read once), so every run
reads from memory; the runs alternate and the fastest of ``--repeats`` counts for each.

    python bench/loader.py --quick            # ~1-2 minutes: a sanity run (400 images)
    python bench/loader.py                    # the numbers: 2000 images, a few minutes on 2 cores
    python bench/loader.py --keep /tmp/loaderdata   # keep (and next time reuse) the built data
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# first, always: this folder holds a train.py that would otherwise shadow the train package
# (when PYTHONPATH already names the repo, it comes after this script's folder)
sys.path.insert(0, str(ROOT))

SIZE = 512


# ---------------------------------------------------------------- the data


def _jpeg(args: tuple[int, int]) -> bytes:
    """One seeded 512x512 JPEG of smooth random colours (compresses like a photo, unlike noise)."""
    import io

    import numpy as np
    from PIL import Image

    seed, quality = args
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(SIZE // 16, SIZE // 16, 3), dtype=np.uint8)
    im = Image.fromarray(small).resize((SIZE, SIZE), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def make_raw(raw: Path, images: int, classes: int, seed: int, workers: int) -> None:
    import multiprocessing as mp

    with mp.get_context("fork").Pool(workers) as pool:
        for i, data in enumerate(pool.imap(_jpeg, [(seed * 1_000_003 + i, 95) for i in range(images)], chunksize=32)):
            folder = raw / f"class{i % classes}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"img{i:06d}.jpg").write_bytes(data)


def pipe(*args: str) -> None:
    """Run a `pipe` command from this checkout; stop the benchmark with its output if it fails."""
    done = subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"pipe {' '.join(args)} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")


def build(work: Path, images: int, classes: int, seed: int, workers: int, max_count: int) -> tuple[Path, Path]:
    """CLEAN_DIR and SHARD_DIR under ``work`` (reused when a previous run built the same ones)."""
    clean, shards = work / "clean", work / "shards"
    stamp = work / "built.json"
    want = {"images": images, "classes": classes, "seed": seed, "max_count": max_count}
    if stamp.is_file() and json.loads(stamp.read_text()) == want and (shards / "index.json").is_file():
        return clean, shards
    for p in (work / "raw", clean, shards):
        shutil.rmtree(p, ignore_errors=True)
    t = time.perf_counter()
    make_raw(work / "raw", images, classes, seed, workers)
    pipe("clean", str(work / "raw"), "-o", str(clean), "--workers", str(workers), "--json")
    pipe("shard", str(clean), "-o", str(shards), "--val-fraction", "0", "--max-count", str(max_count),
         "--seed", str(seed), "--workers", str(workers), "--json")
    shutil.rmtree(work / "raw")
    stamp.write_text(json.dumps(want))
    print(f"built {images} images -> clean -> shards in {time.perf_counter() - t:.0f} s")
    return clean, shards


def loose_files(clean: Path) -> list[Path]:
    return sorted((clean / "data").glob("*/*.jpg"))


def train_shards(shards: Path) -> list[Path]:
    index = json.loads((shards / "index.json").read_text())
    return [shards / s["name"] for s in index["shards"] if s["split"] == "train"]


def warm(paths: list[Path]) -> int:
    """Read every file once so the page cache holds them all; the bytes read."""
    total = 0
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
    return total


# ---------------------------------------------------------------- the measured processes


def child_loose(clean: str, shards: str, batch: int, workers: int, seed: int) -> dict:
    """The naive way: one file per sample, DistributedSampler, per-sample decode + normalize."""
    import torch
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    from pipeline.formats.sample import decode_image

    index = json.loads((Path(shards) / "index.json").read_text())
    classes = {c: i for i, c in enumerate(index["classes"])}
    mean = torch.tensor(index["mean"]).view(3, 1, 1)
    std = torch.tensor(index["std"]).view(3, 1, 1)

    class LooseImages(Dataset):
        def __init__(self, root: Path):
            self.paths = sorted(root.glob("*/*.jpg"))  # what an ImageFolder-style dataset lists

        def __len__(self) -> int:
            return len(self.paths)

        def __getitem__(self, i: int):
            p = self.paths[i]
            with open(p, "rb") as f:
                arr = decode_image(f.read(), "jpg")
            x = torch.from_numpy(arr).permute(2, 0, 1).float().div_(255)
            return (x - mean) / std, classes[p.parent.name]

    ds = LooseImages(Path(clean) / "data")
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=seed, drop_last=True)
    sampler.set_epoch(0)
    loader = DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers, drop_last=True,
                        multiprocessing_context="fork" if workers else None)
    t = time.perf_counter()
    n = 0
    for x, y in loader:
        assert x.shape[1:] == (3, SIZE, SIZE)
        n += len(y)
    return {"samples": n, "loop_s": time.perf_counter() - t}


def child_ours(shards: str, batch: int, workers: int, seed: int) -> dict:
    """Ours: `ShardReader` batches (images only) through `make_loader`'s forked workers."""
    from train.data.reader import ShardReader, close_loader, make_loader

    reader = ShardReader(shards, "train", 0, 1, batch_size=batch, seed=seed, fields=("image",))
    loader = make_loader(reader, workers)
    reader.set_epoch(0)
    t = time.perf_counter()
    n = 0
    for b in loader:
        assert b["image"].shape[1:] == (3, SIZE, SIZE)
        n += len(b["key"])
    close_loader(loader)
    return {"samples": n, "loop_s": time.perf_counter() - t}


def child_raw(shards: str, level: str, batch: int, passes: int, seed: int) -> dict:
    """Our reader's read path without decoding, ``passes`` epochs, through `train.data.stream`
    (what `ShardReader` reads with, importable without torch). ``level`` "bytes": the reads
    alone (`SampleReader.reads`: each block's segments, in the plan's order); "samples": also
    parsed into samples (`SampleReader.samples`: tar headers checked, members located)."""
    from train.data.stream import SampleReader

    reader = SampleReader(shards, "train", 0, 1, batch_size=batch, seed=seed)
    extent = {}  # (shard name, offset) -> bytes the sample takes in its shard
    for sh in reader.shards:
        ends = [*sh["offsets"][1:], sh["bytes"] - 1024]
        extent.update({(sh["name"], o): e - o for o, e in zip(sh["offsets"], ends)})
    t = time.perf_counter()
    n = nbytes = 0
    for epoch in range(passes):
        if level == "bytes":
            for block, views in reader.reads(epoch):
                n += len(block.order)
                nbytes += sum(len(v) for v in views)
        else:
            for _, s in reader.samples(epoch):
                n += 1
                nbytes += extent[(s.shard, s.offset)]
    return {"samples": n, "bytes": nbytes, "loop_s": time.perf_counter() - t}


# ---------------------------------------------------------------- the comparison


def timed(cmd: list[str], **kw) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run a process to its end: (wall seconds, CPU seconds of it and its children, result)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, **kw)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, done


def run_child(*args: str) -> tuple[float, float, dict]:
    """A fresh `python bench/loader.py --child ...`: wall seconds, CPU seconds, what it reported."""
    wall, cpu, done = timed([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"child {args[0]} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return wall, cpu, json.loads(done.stdout.strip().splitlines()[-1])


def run_cat(paths: list[Path], passes: int) -> tuple[float, float]:
    with open(os.devnull, "wb") as null:
        wall, cpu, _ = timed(["cat", *map(str, paths * passes)], stdout=null, check=True)
    return wall, cpu


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def fastest(runs: list[tuple]) -> tuple:
    return min(runs, key=lambda r: r[0])


def compare(a: argparse.Namespace, clean: Path, shards: Path) -> None:
    files, tars = loose_files(clean), train_shards(shards)
    train = json.loads((shards / "index.json").read_text())["counts"]["train"]["samples"]
    if train != len(files):
        sys.exit(f"the shards hold {train} train samples but CLEAN_DIR {len(files)} images: not the same data")
    loose_bytes, shard_bytes = warm(files), warm(tars)
    print(f"data: {len(files)} loose JPEGs ({loose_bytes / 1e6:.0f} MB), {len(tars)} train shards "
          f"({shard_bytes / 1e6:.0f} MB); page cache warmed (every file read once); load {load()}")

    if a.only != "raw":
        compare_decoded(a, clean, shards)
    if a.only != "decode":
        compare_raw(a, shards, tars, shard_bytes)
    print(f"load at the end: {load()}")


def compare_decoded(a: argparse.Namespace, clean: Path, shards: Path) -> None:
    common = [str(a.batch_size), str(a.workers), str(a.seed)]
    runs: dict[str, list] = {"loose": [], "ours": []}
    for _ in range(a.repeats):  # alternate, so a burst of load elsewhere hits both sides alike
        runs["loose"].append(run_child("loose", str(clean), str(shards), *common))
        runs["ours"].append(run_child("ours", str(shards), *common))
    print(f"decoded batches (batch {a.batch_size}, {a.workers} workers, best of {a.repeats}, whole processes):")
    rates = {}
    for name, what in (("loose", "loose files + DistributedSampler"), ("ours", "ours (ShardReader)")):
        wall, cpu, res = fastest(runs[name])
        rates[name] = res["samples"] / wall
        print(f"  {what + ':':34s} {res['samples']} samples in {wall:5.2f} s (cpu {cpu:5.2f} s) = {rates[name]:6.1f} samples/s;"
              f" loop alone {res['samples'] / res['loop_s']:.1f}/s")
    ratio = rates["ours"] / rates["loose"]
    print(f"  ratio ours/loose = {ratio:.2f}  (target >= 1.00: {'meets' if ratio >= 1 else 'MISSES'})")


def compare_raw(a: argparse.Namespace, shards: Path, tars: list[Path], shard_bytes: int) -> None:
    passes = max(1, math.ceil(a.raw_gb * 1e9 / shard_bytes))
    runs = {"cat": [], "bytes": [], "samples": []}
    for _ in range(a.repeats):
        runs["cat"].append(run_cat(tars, passes))
        for level in ("bytes", "samples"):
            runs[level].append(run_child("raw", str(shards), level, str(a.batch_size), str(passes), str(a.seed)))
    wall, cpu = fastest(runs["cat"])
    cat_rate = shard_bytes * passes / wall
    print(f"raw reading, no decode ({passes} passes over the train shards, best of {a.repeats}, whole processes):")
    print(f"  {'cat:':34s} {shard_bytes * passes / 1e6:6.0f} MB in {wall:5.2f} s (cpu {cpu:5.2f} s) = {cat_rate / 1e6:5.0f} MB/s")
    for level, what in (("bytes", "ours, reads (SampleReader.reads)"), ("samples", "ours, samples (.samples)")):
        wall, cpu, res = fastest(runs[level])
        rate = res["bytes"] / wall
        print(f"  {what + ':':34s} {res['bytes'] / 1e6:6.0f} MB in {wall:5.2f} s (cpu {cpu:5.2f} s) = {rate / 1e6:5.0f} MB/s;"
              f" start-up {wall - res['loop_s']:.2f} s, then {res['bytes'] / res['loop_s'] / 1e6:.0f} MB/s"
              f" ({res['loop_s'] / res['samples'] * 1e6:.1f} us/sample)")
        print(f"  {'':34s} ratio ours/cat = {rate / cat_rate:.2f}  (target >= 0.70: {'meets' if rate >= 0.7 * cat_rate else 'MISSES'})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small sanity run (400 images, 1 repeat)")
    ap.add_argument("--images", type=int, default=2000, help="generated 512x512 JPEGs")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2, help="dataloader workers on both sides")
    ap.add_argument("--raw-gb", type=float, default=8.0,
                    help="GB each side reads in the raw comparison (passes over the shards): enough that starting "
                         "Python, numpy and the index check (~0.3 s) is a small part, as in an epoch of a real dataset")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each measurement; the fastest counts")
    ap.add_argument("--max-count", type=int, default=1000, help="pipe shard --max-count (1000: its default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("decode", "raw"), help="run one of the two comparisons")
    ap.add_argument("--keep", type=Path, help="build (or reuse) the data here instead of a temporary folder")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, *args = a.child
        fn = {"loose": child_loose, "ours": child_ours, "raw": child_raw}[kind]
        print(json.dumps(fn(*args[:-3], *map(int, args[-3:]))))  # paths first, then three integers
        return
    if a.quick:
        a.images, a.repeats, a.raw_gb, a.max_count = 400, 1, 0.5, 100
    print(f"bench/loader.py: {a.images} images, batch {a.batch_size}, {a.workers} workers, seed {a.seed}; load {load()}")
    if a.keep:
        a.keep.mkdir(parents=True, exist_ok=True)
        compare(a, *build(a.keep, a.images, a.classes, a.seed, a.workers, a.max_count))
        return
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        compare(a, *build(Path(tmp), a.images, a.classes, a.seed, a.workers, a.max_count))


if __name__ == "__main__":
    main()
