"""The streaming reader vs the machine's limit, its peers and the naive ways, same data, same run, as ratios.

0. The limit (issue 26, item 1): the training reader's decoded samples per CPU second, all its
   processes counted (512 px JPEG shards -> 224 px normalised float batches, 2 dataloader workers,
   fed as `pipe train` feeds them on this CPU with a built-in model: uint8 from the workers,
   `train.data.device.DeviceFeed` normalising a batch at once, into channels-last float batches as
   the model runs channels-last on a CPU, `train.components.wrapping.runs_channels_last`) against
   one process decoding and resizing the same bytes in a tight loop with the same decoder and
   resizer (`train.data.reader.decode_at`: DCT-domain scaling, then Lanczos-3; uint8 out). Target:
   ours >= 0.85 of the limit. In the same rounds: the reader as it was (float normalised per image
   in the workers), the stock webdataset `WebLoader` and LitData's `StreamingDataLoader` over the
   same samples with the same decode and per-sample normalisation (peers are skipped, said so, when
   they do not import: ``--install-peers`` puts them in ``--peers DIR`` with pip, outside the venv;
   LitData reads its own chunks, converted from the same bytes before timing). CPU seconds are each
   child's own accounting of its read loop (its workers included: read from /proc while they run,
   and once they are waited for), so interpreter start and imports are not counted. Each run reads
   ``--epochs`` epochs (3) with persistent workers, as `pipe train` reads (`train.data.loaders`),
   the peers' loaders alike: these 2000 images are an unrealistically short epoch, over which
   forking the workers and first touching their memory would weigh as they never do in training;
   that start-up is printed apart (the first epoch's CPU beyond a later one's).
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

    python bench/loader.py --only limit --install-peers   # item 1 alone: the limit, peers, ratios
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
    """Ours: `ShardReader` batches (images only) through `make_loader`'s forked workers, fed as
    pipe train feeds them (uint8 from the workers, `DeviceFeed` normalising on this CPU)."""
    import torch

    from train.data.device import DeviceFeed
    from train.data.reader import ShardReader, close_loader, make_loader

    reader = ShardReader(shards, "train", 0, 1, batch_size=batch, seed=seed, fields=("image",), normalize=False)
    loader = make_loader(reader, workers)
    feed = DeviceFeed(loader, torch.device("cpu"), reader)
    reader.set_epoch(0)
    t = time.perf_counter()
    n = 0
    for b in feed:
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


# ---------------------------------------------------------------- 0. the limit and the peers (child processes)

LIMIT_SIZE = 224  # the model's side: 512 px shards decoded smaller, as pipe train decodes them


def _cpu() -> float:
    """CPU seconds of this process and all its children: those that ended (dataloader workers, once
    joined) and those still running (persistent workers, read from /proc where there is one)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + _live_children_cpu(os.getpid())


def _live_children_cpu(pid: int) -> float:
    """CPU seconds of the running descendants of ``pid`` (0 without /proc)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            try:  # utime and stime: fields 14 and 15, after the command's closing parenthesis
                fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # it ended meanwhile: RUSAGE_CHILDREN counts it once it is waited for
            total += (int(fields[11]) + int(fields[12])) / tick + _live_children_cpu(child)
    return total


def _norm(shards: str) -> tuple:
    """(stored side, per-image scale [3,1,1], shift [3,1,1]): the reader's own normalisation."""
    from train.data.reader import ShardReader

    reader = ShardReader(shards, "train", 0, 1, batch_size=1, fields=("image",), image_size=LIMIT_SIZE)
    scale, shift = reader.normalization()
    return reader.stored_size, scale[0], shift[0]


def child_limit(shards: str, batch: int, workers: int, seed: int, epochs: int) -> dict:
    """The limit: the same JPEG bytes decoded and resized by `decode_at` in a tight loop, uint8 out,
    ``epochs`` times over."""
    import numpy as np
    import torch

    from train.data.reader import decode_at
    from train.data.stream import SampleReader

    torch.set_num_threads(1)
    data = [bytes(s.fields["jpg"]) for _, s in SampleReader(shards, "train", 0, 1, batch_size=batch, seed=seed).samples(0)]
    stored, _, _ = _norm(shards)
    out = np.empty((LIMIT_SIZE, LIMIT_SIZE, 3), dtype=np.uint8)
    decode_at(data[0], "jpg", stored, LIMIT_SIZE, out=out)  # decoder and resizer loaded before the clock starts

    def epoch(_: int):
        for b in data:
            decode_at(b, "jpg", stored, LIMIT_SIZE, out=out)
            yield None

    return _counted(epoch, epochs, count=lambda _: 1)


def _counted(epoch, epochs: int, close=None, count=None) -> dict:
    """Read ``epochs`` epochs (``epoch(e)``: epoch e's float [B,3,224,224] batches) to the end:
    samples, CPU seconds (workers included), wall, and each epoch's CPU seconds (the first one's
    excess over the later ones is the start-up: forking workers, first touches of shared memory)."""
    import torch

    def images(b) -> int:
        x = b["image"] if isinstance(b, dict) else b[0]
        assert x.dtype == torch.float32 and x.shape[1:] == (3, LIMIT_SIZE, LIMIT_SIZE), (x.dtype, x.shape)
        return len(x)

    count = count or images
    c, t, n, ends = _cpu(), time.perf_counter(), 0, []
    for e in range(epochs):
        for b in epoch(e):
            n += count(b)
        ends.append(_cpu())
    if close is not None:
        close()  # joins the workers: their CPU time is counted from here on
    cpu = _cpu() - c
    return {"samples": n, "cpu_s": cpu, "loop_s": time.perf_counter() - t,
            "epoch_cpu_s": [b - a for a, b in zip([c, *ends], ends)], "close_cpu_s": cpu - (ends[-1] - c)}


def child_reader(shards: str, mode: str, batch: int, workers: int, seed: int, epochs: int) -> dict:
    """Ours, as pipe train reads: persistent workers (`train.data.loaders`). "feed": uint8 from the
    workers, `DeviceFeed` normalising a batch at once on this CPU, channels-last as pipe train
    feeds a built-in model on a CPU (`train.components.wrapping.runs_channels_last`; the same
    values as NCHW); "float": as it read before (float normalised per image in the workers)."""
    import torch

    from train.data.device import DeviceFeed
    from train.data.reader import ShardReader, close_loader, make_loader

    torch.set_num_threads(1)  # a CPU rank's training threads are the model's; the reader gets none
    c0 = _cpu()
    reader = ShardReader(shards, "train", 0, 1, batch_size=batch, seed=seed, fields=("image",), image_size=LIMIT_SIZE,
                         normalize=mode == "float")
    loader = make_loader(reader, workers, persistent_workers=True)
    batches = DeviceFeed(loader, torch.device("cpu"), reader, channels_last=True) if mode == "feed" else loader

    def epoch(e: int):
        reader.set_epoch(e)
        return batches

    return {**_counted(epoch, epochs, lambda: close_loader(loader)), "setup_cpu_s": _cpu() - c0}


def _per_sample(shards: str):
    """What a peer runs per sample: the same decode and resize, normalised per image as ours did."""
    import torch

    from train.data.reader import decode_at

    stored, scale, shift = _norm(shards)

    def decode(data: bytes) -> torch.Tensor:
        arr = decode_at(data, "jpg", stored, LIMIT_SIZE)
        x = torch.empty((3, LIMIT_SIZE, LIMIT_SIZE), dtype=torch.float32)
        x.copy_(torch.from_numpy(arr).permute(2, 0, 1))
        return x.mul_(scale).add_(shift)

    return decode


def child_webloader(shards: str, _: str, batch: int, workers: int, seed: int, epochs: int) -> dict:
    """The stock webdataset `WebLoader`: shards split over the workers, a 512-sample shuffle
    buffer (as ours), per-sample decode, `batched` collation in the workers."""
    import torch
    import webdataset as wds

    torch.set_num_threads(1)
    decode = _per_sample(shards)
    urls = [str(p) for p in train_shards(Path(shards))]
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False).shuffle(512)
          .map(lambda s: (decode(s["jpg"]), int(s["cls"]))).batched(batch, partial=False))
    loader = wds.WebLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0,
                           multiprocessing_context="fork" if workers else None)
    return _counted(lambda e: loader, epochs, lambda: _shutdown(loader))


def child_litdata(shards: str, chunks: str, batch: int, workers: int, seed: int, epochs: int) -> dict:
    """LitData's `StreamingDataLoader` over its own chunks of the same bytes (converted before)."""
    import torch
    from litdata import StreamingDataLoader, StreamingDataset

    torch.set_num_threads(1)
    decode = _per_sample(shards)

    class Images(StreamingDataset):
        def __getitem__(self, index):
            s = super().__getitem__(index)
            return decode(s["jpg"]), s["cls"]

    ds = Images(chunks, shuffle=True, drop_last=True, seed=seed)
    loader = StreamingDataLoader(ds, batch_size=batch, num_workers=workers, drop_last=True,
                                 persistent_workers=workers > 0)
    return _counted(lambda e: loader, epochs, lambda: _shutdown(loader))


def _shutdown(loader) -> None:
    """A peer DataLoader's persistent workers stopped and joined now (their CPU time counted)."""
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()



def _litdata_sample(item: tuple[str, int]) -> dict:
    """One sample for `litdata.optimize`: a CLEAN_DIR JPEG (byte for byte the one in the shards) and its class."""
    path, cls = item
    return {"jpg": Path(path).read_bytes(), "cls": cls}


def child_litdata_build(clean: str, shards: str, chunks: str) -> dict:
    """LitData's own format of the same train samples (before any timing)."""
    from litdata import optimize

    classes = {c: i for i, c in enumerate(json.loads((Path(shards) / "index.json").read_text())["classes"])}
    items = [(str(p), classes[p.parent.name]) for p in loose_files(Path(clean))]
    optimize(fn=_litdata_sample, inputs=items, output_dir=chunks, chunk_bytes="64MB", num_workers=2, mode="overwrite")
    return {"samples": len(items)}


CHILDREN2 = {"limit": child_limit, "reader": child_reader, "webloader": child_webloader, "litdata": child_litdata}


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

    if a.only in (None, "limit"):
        compare_limit(a, clean, shards)
    if a.only in (None, "decode"):
        compare_decoded(a, clean, shards)
    if a.only in (None, "raw"):
        compare_raw(a, shards, tars, shard_bytes)
    print(f"load at the end: {load()}")


def peers_env(a: argparse.Namespace) -> dict:
    """The children's environment: ``--peers`` on their path (where ``--install-peers`` puts
    LitData, and webdataset when the venv lacks it: outside the venv, which stays as the project
    installs it)."""
    peers = str(a.peers)
    if a.install_peers:
        want = ["litdata", "lightning-utilities"]
        probe = subprocess.run([sys.executable, "-c", "import webdataset"], capture_output=True)
        want += ["webdataset", "braceexpand"] if probe.returncode else []
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", peers, *want],
                              capture_output=True, text=True)
        print(f"peers: pip install --target {peers} {' '.join(want)}: "
              f"{'ok' if not done.returncode else 'FAILED: ' + done.stderr.strip().splitlines()[-1]}")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH"), peers]))}


def importable(module: str, env: dict) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True).returncode == 0


def run_child2(spec: dict, env: dict) -> dict | None:
    """A fresh `python bench/loader.py --child2 SPEC`: what it reported (None, said, when it failed)."""
    done = subprocess.run([sys.executable, __file__, "--child2", json.dumps(spec)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"  {spec['kind']} {spec.get('arg', '')} failed (exit {done.returncode}): {tail}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def litdata_chunks(clean: Path, shards: Path, env: dict) -> Path | None:
    """LitData's chunks of the train samples next to SHARD_DIR (made once)."""
    chunks = shards.parent / "litdata"
    if (chunks / "index.json").is_file():
        return chunks
    t = time.perf_counter()
    made = run_child2({"kind": "litdata-build", "clean": str(clean), "shards": str(shards), "chunks": str(chunks)}, env)
    if made is None:
        return None
    print(f"litdata: {made['samples']} samples -> {chunks} in {time.perf_counter() - t:.0f} s (not timed below)")
    return chunks


def compare_limit(a: argparse.Namespace, clean: Path, shards: Path) -> None:
    env = peers_env(a)
    common = {"shards": str(shards), "batch": a.batch_size, "workers": a.workers, "seed": a.seed, "epochs": a.epochs}
    ways = {"limit": ("the limit: decode_at in a loop", {"kind": "limit"}),
            "ours": ("ours, as pipe train reads", {"kind": "reader", "arg": "feed"}),
            "before": ("ours before (float in workers)", {"kind": "reader", "arg": "float"})}
    for module, name, what in (("webdataset", "webloader", "webdataset WebLoader"),
                               ("litdata", "litdata", "LitData StreamingDataLoader")):
        if not importable(module, env):
            print(f"  {what}: skipped: {module} does not import (--install-peers puts it in {a.peers})")
            continue
        chunks = litdata_chunks(clean, shards, env) if name == "litdata" else None
        if name == "litdata" and chunks is None:
            continue
        ways[name] = (what, {"kind": name, "arg": str(chunks or "")})
    runs: dict[str, list[dict]] = {n: [] for n in ways}
    for _ in range(a.repeats):  # interleaved rounds: a burst of load elsewhere hits every way alike
        for n, (_, spec) in ways.items():
            got = run_child2({**common, **spec}, env)
            if got is not None:
                runs[n].append(got)
    print(f"decoded 224 px float batches from 512 px JPEG shards (batch {a.batch_size}, {a.workers} persistent workers, "
          f"{a.epochs} epochs a run, {a.repeats} interleaved rounds, the least CPU a sample of each; load {load()}):")
    ms: dict[str, float] = {}
    for n, (what, _) in ways.items():
        if not runs[n]:
            continue
        best = min(runs[n], key=lambda r: r["cpu_s"] / r["samples"])
        ms[n] = best["cpu_s"] / best["samples"] * 1e3
        spread = [r["cpu_s"] / r["samples"] * 1e3 for r in runs[n]]
        print(f"  {what + ':':38s} {best['samples']} samples, {ms[n]:.3f} ms CPU a sample = {1e3 / ms[n]:6.0f} samples per "
              f"CPU second (rounds {', '.join(f'{x:.2f}' for x in spread)} ms); wall {best['samples'] / best['loop_s']:6.0f}/s")
        print(f"  {'':38s} {startup(best)}")
    if "limit" in ms and "ours" in ms:
        r = ms["limit"] / ms["ours"]
        print(f"  ours / the limit, per core = {r:.2f}  (target >= 0.85: {'meets' if r >= 0.85 else 'MISSES'})")
    for n in ("before", "webloader", "litdata"):
        if n in ms and "ours" in ms:
            print(f"  ours / {ways[n][0]}, per CPU second = {ms[n] / ms['ours']:.2f}"
                  + ("  (target > 1: " + ("beats)" if ms[n] > ms["ours"] else "DOES NOT beat)") if n != "before" else ""))


def startup(run: dict) -> str:
    """The run's start-up apart: its first epoch's CPU beyond a later epoch's (forking the workers,
    first touches of shared memory and fresh buffers), and the later epochs' CPU a sample."""
    per_epoch = run["epoch_cpu_s"]
    if len(per_epoch) < 2:
        return f"one epoch: start-up not told apart (--epochs 2 or more); closing {run['close_cpu_s'] * 1e3:.0f} ms"
    later = sum(per_epoch[1:]) / (len(per_epoch) - 1)
    each = run["samples"] / len(per_epoch)
    extra = per_epoch[0] - later
    return (f"start-up {f'{extra * 1e3:.0f} ms CPU once' if extra > 0 else 'none seen (load noise is larger)'} "
            f"(epoch 1 {per_epoch[0] * 1e3:.0f} ms, later "
            f"ones {later * 1e3:.0f} ms = {later / each * 1e3:.3f} ms a sample), closing {run['close_cpu_s'] * 1e3:.0f} ms")


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
    ap.add_argument("--epochs", type=int, default=3,
                    help="epochs each run of the limit comparison reads, with persistent workers as pipe train "
                         "reads: a real epoch is far longer than these 2000 images, so the workers' start-up "
                         "is spread as in training (and printed apart)")
    ap.add_argument("--max-count", type=int, default=1000, help="pipe shard --max-count (1000: its default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("limit", "decode", "raw"), help="run one of the three comparisons")
    ap.add_argument("--peers", type=Path, default=Path(tempfile.gettempdir()) / "pipe-bench-peers",
                    help="a folder put on the children's path for the peers (LitData; webdataset if the venv lacks it)")
    ap.add_argument("--install-peers", action="store_true", help="pip install the peers into --peers first (no deps: "
                    "they run on the venv's torch), never into the venv")
    ap.add_argument("--child2", help=argparse.SUPPRESS)
    ap.add_argument("--keep", type=Path, help="build (or reuse) the data here instead of a temporary folder")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child2:
        spec = json.loads(a.child2)
        if spec["kind"] == "litdata-build":
            print(json.dumps(child_litdata_build(spec["clean"], spec["shards"], spec["chunks"])))
            return
        fn2 = CHILDREN2[spec["kind"]]
        args2 = [spec["shards"], *([spec.get("arg", "")] if spec["kind"] != "limit" else []),
                 spec["batch"], spec["workers"], spec["seed"], spec["epochs"]]
        print(json.dumps(fn2(*args2)))
        return
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
