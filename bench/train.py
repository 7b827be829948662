"""pipe train's throughput on CPU: samples/s with 1 and 2 gloo ranks and the share of step time
spent waiting for data, next to the naive ways, on the same shards in the same run, as ratios.

Every number comes from whole `pipe train` processes (launcher, ranks, dataloader workers), the
way a user runs them; training samples/s and data-wait are read from RUN_DIR/metrics.jsonl,
leaving out the first logging window (process start, first batches).

What is compared:

* data only (`--data-only`, 1 rank): images decoded at the model's 64 px in the workers (ours)
  against decoding them at the stored size and shipping that to the model, which resizes
  (the naive way; `--resolution` = the stored size makes the reader do exactly that);
* training, 1 and 2 ranks, ours;
* training, 1 rank, with one compute thread per core (`OMP_NUM_THREADS` = cores, what a rank
  used before) against ours (cores per rank less one per dataloader worker).

    python bench/train.py --quick       # ~2-4 min on 2 shared cores: 160 images of 512 px
    python bench/train.py [--images 320] [--size 512] [--epochs 3] [--workers 1] [--model image]

``--resnet`` compares, instead, a torchvision ResNet-18 at 224 px on 2 CPU ranks (needs
torchvision): `pipe train --model torchvision:resnet18` against the naive way, a plain torchrun
script (this file, ``--naive-rank``) with ``ImageFolder`` over the same images as loose JPEGs,
``Resize(224)`` + ``ToTensor`` + ``Normalize`` in the workers and a ``DistributedSampler``; same
model, batch, workers, optimizer. Samples/s and the share of step time spent waiting for data,
first two steps of each run left out, in one run; and the CPU seconds per sample of each run's
whole process tree (launcher, ranks, workers) over the same steps, polled from /proc, which does
not depend on how much of a shared machine a run was given. `pipe train` runs twice: with its own
launcher, and as ranks under the same torchrun as the naive script. The difference matters on a
loaded Linux machine: torchrun starts each rank in a session of its own, and with the kernel's
autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``, on by default on desktop
distributions) CPU time is shared fairly between sessions, so each naive rank gets as much CPU as
a whole other user's session, while `pipe train`'s ranks share the one session they were started
in. Rounds are interleaved, the order reversed every other round; medians are printed:

    python bench/train.py --resnet --quick [--rounds 2]   # ~6-15 min a round on 2 shared cores

The load average (`uptime`) is printed before and after: on a shared machine only the ratios
within one run mean anything. With fewer cores than ranks x (1 + workers), two ranks cannot be
twice as fast as one: the table says how many cores there were.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parent.parent


def make_raw(root: Path, images: int, size: int, classes: int = 4) -> Path:
    """Class folders of JPEGs with a per-class colour pattern under noise, and a caption for half."""
    rng = np.random.default_rng(0)
    for i in range(images):
        label = i % classes
        img = rng.normal(110, 35, size=(size, size, 3))
        h = size // 2
        img[(label // 2) * h:(label // 2 + 1) * h, (label % 2) * h:(label % 2 + 1) * h] += 60
        folder = root / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(folder / f"img{i:05d}.jpg", quality=90)
        if i % 2 == 0:
            (folder / f"img{i:05d}.txt").write_text(f"picture {i} of class {label}\n", encoding="utf-8")
    return root


def pipe(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=full_env)
    p.seconds = time.perf_counter() - t  # type: ignore[attr-defined]
    if p.returncode != 0:
        sys.exit(f"pipe {' '.join(args[:3])} ... failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p


def steady(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    use = train[1:] or train  # the first window holds process start and the first batches
    return {"samples_per_s": statistics.mean(r["samples_per_s"] for r in use),
            "data_wait": statistics.mean(r["data_wait_share"] for r in use),
            "memory_mb": max(r["memory_mb"] for r in train), "windows": len(use)}


def data_rate(p: subprocess.CompletedProcess) -> float:
    """The best epoch's samples/s of a --data-only run (all ranks)."""
    rates = [float(x.replace(",", "")) for x in re.findall(r"all ranks: ([\d,.]+) samples/s", p.stdout)]
    return max(rates) if rates else float("nan")


def load() -> str:
    try:
        return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "load average unknown"


# -- ResNet-18 at 224 px: pipe train against a plain torchrun script --------------------------------


def naive_rank(data: Path, epochs: int, batch: int, workers: int, out: Path) -> None:
    """One rank of the naive way, as a tutorial writes it (run by torchrun)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler
    from torchvision import transforms

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tf = transforms.Compose([transforms.Resize((224, 224)), transforms.ToTensor(),
                             transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    ds = torchvision.datasets.ImageFolder(str(data), transform=tf)
    sampler = DistributedSampler(ds, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers, drop_last=True,
                        persistent_workers=workers > 0)
    torch.manual_seed(0)
    model = DDP(torchvision.models.resnet18(weights=None, num_classes=len(ds.classes)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps, busy, waited, started = 0, 0.0, 0.0, None
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        t = time.perf_counter()
        for x, y in loader:
            got = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done = time.perf_counter()
            steps += 1
            if steps == 2:  # process start, worker start and the first batches left out, as for pipe
                started = done
                since = time.time()
            elif steps > 2:
                busy, waited = busy + (done - t), waited + (got - t)
            t = done
    if rank == 0 and started is not None:
        measured = steps - 2
        out.write_text(json.dumps({"samples_per_s": measured * batch * world / max(busy, 1e-9),
                                   "data_wait": waited / max(busy, 1e-9), "steps": measured,
                                   "span": [since, time.time()], "samples": measured * batch * world}))
    dist.destroy_process_group()


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) so far of ``root`` and every live process below it (Linux /proc)."""
    tick, total, todo = os.sysconf("SC_CLK_TCK"), 0.0, [root]
    while todo:
        pid = todo.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in os.listdir(f"/proc/{pid}/task"):
                todo += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return total


def run_polled(cmd: list[str], env: dict | None = None) -> tuple[float, list[tuple[float, float]]]:
    """Run ``cmd`` to the end; its wall seconds and (time.time(), CPU seconds of its process tree)
    every 0.25 s: CPU per sample is then independent of how much of the machine the run got."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, **(env or {})})
    polls: list[tuple[float, float]] = []
    err: list[str] = []
    import threading

    drain = threading.Thread(target=lambda: err.append(p.stderr.read() if p.stderr else ""), daemon=True)
    drain.start()
    while p.poll() is None:
        polls.append((time.time(), tree_cpu(p.pid)))
        time.sleep(0.25)
    drain.join()
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd[:6])} ... failed ({p.returncode}):\n{''.join(err)[-2000:]}")
    return time.perf_counter() - t, polls


def cpu_between(polls: list[tuple[float, float]], start: float, end: float) -> float:
    """The tree's CPU seconds between two wall-clock instants, read off the polls (linear in between)."""
    times, cpus = [t for t, _ in polls], [c for _, c in polls]
    return float(np.interp(end, times, cpus) - np.interp(start, times, cpus))


def pipe_measured(run: Path, wall: float, polls) -> dict:
    """Samples/s and data-wait of a pipe train run (metrics.jsonl, first window left out) and its
    CPU seconds per sample over the same windows."""
    rows = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    global_batch = json.loads((run / "config.json").read_text())["global_batch"]
    samples = (rows[-1]["step"] - rows[0]["step"]) * global_batch
    return {**steady(run), "wall": wall, "cpu_per_sample": cpu_between(polls, rows[0]["time"], rows[-1]["time"]) / samples}


def resnet_bench(a) -> None:
    images, epochs = (128, 1) if a.quick else (a.images, a.epochs)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"before: {load()} on {cores} cores")
    with tempfile.TemporaryDirectory() as tmp:
        root = a.keep or Path(tmp)
        make_raw(root / "raw", images, a.size)
        for caption in (root / "raw").rglob("*.txt"):
            caption.unlink()  # ImageFolder reads images only: both sides see the same samples
        pipe("clean", str(root / "raw"), "-o", str(root / "clean"), "--size", str(a.size), "--workers", "2")
        pipe("shard", str(root / "clean"), "-o", str(root / "shards"), "--val-fraction", "0")
        print(f"data: {images} JPEGs of {a.size} px; ResNet-18 at 224 px, 2 ranks, batch {a.batch_size} per rank, "
              f"{a.workers} worker(s) per rank, {epochs} epoch(s)")
        env = {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        train_args = ["--model", "torchvision:resnet18", "--epochs", str(epochs), "--batch-size", str(a.batch_size),
                      "--workers", str(a.workers), "--log-every", "2", "--checkpoint-every", "0", "--precision", "fp32"]

        def ours(name: str, under_torchrun: bool) -> dict:
            run = root / name
            launcher = [*torchrun, "-m", "pipeline"] if under_torchrun else [sys.executable, "-m", "pipeline"]
            more = [] if under_torchrun else ["--nproc-per-node", "2"]
            wall, polls = run_polled([*launcher, "train", str(root / "shards"), "-o", str(run), *more, *train_args], env)
            return pipe_measured(run, wall, polls)

        def naive(name: str) -> dict:
            out = root / f"{name}.json"
            wall, polls = run_polled([*torchrun, __file__, "--naive-rank", "--data", str(root / "raw"), "--epochs",
                                      str(epochs), "--batch-size", str(a.batch_size), "--workers", str(a.workers),
                                      "--out", str(out)])
            r = json.loads(out.read_text())
            return {**r, "wall": wall, "cpu_per_sample": cpu_between(polls, *r["span"]) / r["samples"]}

        ways = {"pipe train": lambda i: ours(f"ours{i}", False),
                "pipe train under torchrun": lambda i: ours(f"ours-torchrun{i}", True),
                "naive torchrun + ImageFolder": lambda i: naive(f"naive{i}")}
        results: dict[str, list[dict]] = {name: [] for name in ways}
        for i in range(a.rounds):  # interleaved, the order reversed every other round
            for name in (list(ways) if i % 2 == 0 else list(reversed(ways))):
                results[name].append(ways[name](i))
                r = results[name][-1]
                print(f"  round {i + 1}: {name}: {r['samples_per_s']:.2f} samples/s, {r['cpu_per_sample']:.3f} CPU s "
                      f"per sample, {r['wall']:.0f} s wall ({load()})", flush=True)
    print(f"after: {load()}")
    print(f"\n{'ResNet-18, 224 px, 2 ranks':>30} {'samples/s':>10} {'CPU s/sample':>13} {'data wait':>10} {'wall s':>8}"
          f"   (medians of {a.rounds} round(s))")
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("samples_per_s", "cpu_per_sample", "data_wait", "wall")}
           for name, rs in results.items()}
    for name, r in med.items():
        print(f"{name:>30} {r['samples_per_s']:>10.2f} {r['cpu_per_sample']:>13.3f} {r['data_wait']:>10.1%} "
              f"{r['wall']:>8.1f}")
    base = med["naive torchrun + ImageFolder"]
    for name in ("pipe train", "pipe train under torchrun"):
        r = med[name]
        print(f"\n{name} / naive: {r['samples_per_s'] / base['samples_per_s']:.2f}x samples/s, "
              f"{base['cpu_per_sample'] / r['cpu_per_sample']:.2f}x samples per CPU second "
              f"(target >= 1.2x, data wait under 5% of step time: {r['data_wait']:.1%})")
    print("(samples/s on a loaded machine: torchrun starts each rank in a session of its own, and with the kernel's "
          f"autogroup scheduling ({autogroup()} here) each session gets an equal share of the CPU: 'pipe train' "
          "starts its ranks in its own session, one share for all of them; under torchrun both get the same)")


def autogroup() -> str:
    try:
        return "on" if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1" else "off"
    except OSError:
        return "unknown"

def main() -> None:
    if "--naive-rank" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--naive-rank", action="store_true")
        for flag in ("--data", "--out"):
            ap.add_argument(flag, type=Path, required=True)
        for flag in ("--epochs", "--batch-size", "--workers"):
            ap.add_argument(flag, type=int, required=True)
        r = ap.parse_args()
        naive_rank(r.data, r.epochs, r.batch_size, r.workers, r.out)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small and short: 160 images, 2 epochs")
    ap.add_argument("--images", type=int, default=320)
    ap.add_argument("--size", type=int, default=512, help="side of the cleaned images, in pixels (pipe clean's default)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1, help="dataloader workers per rank")
    ap.add_argument("--batch-size", type=int, default=16, help="per rank")
    ap.add_argument("--model", default="image")
    ap.add_argument("--resolution", type=int, default=64, help="the side the built-in model works at")
    ap.add_argument("--keep", type=Path, help="keep the data and runs here instead of a temporary folder")
    ap.add_argument("--resnet", action="store_true", help="torchvision ResNet-18 at 224 px, 2 ranks: pipe train vs torchrun")
    ap.add_argument("--rounds", type=int, default=1, help="--resnet: rounds of the three runs, interleaved")
    a = ap.parse_args()
    if a.resnet:
        if a.batch_size == 16:
            a.batch_size = 8
        resnet_bench(a)
        return
    if a.quick:
        a.images, a.epochs = 160, 2
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"before: {load()} on {cores} cores")
    with tempfile.TemporaryDirectory() as tmp:
        root = a.keep or Path(tmp)
        t = time.perf_counter()
        make_raw(root / "raw", a.images, a.size)
        pipe("clean", str(root / "raw"), "-o", str(root / "clean"), "--size", str(a.size), "--workers", "2")
        pipe("shard", str(root / "clean"), "-o", str(root / "shards"), "--val-fraction", "0.1")
        print(f"data: {a.images} images of {a.size} px through pipe clean + pipe shard in {time.perf_counter() - t:.1f} s; "
              f"model {a.model} at {a.resolution} px, batch {a.batch_size} per rank, {a.workers} worker(s) per rank")

        shards = str(root / "shards")
        common = ["--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--workers", str(a.workers)]
        data = {"ours": pipe("train", shards, "-o", str(root / "data-ours"), "--data-only", "--resolution",
                             str(a.resolution), *common),
                "naive": pipe("train", shards, "-o", str(root / "data-naive"), "--data-only", "--resolution",
                              str(a.size), *common)}
        ceiling = {k: data_rate(p) for k, p in data.items()}

        def train(name: str, ranks: int, env: dict | None = None) -> dict:
            run = root / name
            p = pipe("train", shards, "-o", str(run), "--nproc-per-node", str(ranks), "--model", a.model,
                     "--resolution", str(a.resolution), "--log-every", "2", "--checkpoint-every", "0", *common, env=env)
            threads = re.search(r"(\d+) compute threads? per rank", p.stderr)
            return {**steady(run), "wall": p.seconds, "threads": threads.group(1) if threads else "?"}

        results = {"train, 1 rank": train("train-1", 1), "train, 2 ranks": train("train-2", 2),
                   "train, 1 rank, naive threads": train("train-1-naive", 1, {"OMP_NUM_THREADS": str(cores)})}
    print(f"after: {load()}")

    print(f"\n{'':>30} {'samples/s':>10} {'data wait':>10} {'threads':>8} {'peak MB':>9} {'wall s':>8}")
    print(f"{f'data only, {a.resolution} px (ours)':>30} {ceiling['ours']:>10.1f} {'-':>10} {'-':>8} {'-':>9} "
          f"{data['ours'].seconds:>8.1f}")
    print(f"{f'data only, {a.size} px (naive)':>30} {ceiling['naive']:>10.1f} {'-':>10} {'-':>8} {'-':>9} "
          f"{data['naive'].seconds:>8.1f}")
    for name, r in results.items():
        print(f"{name:>30} {r['samples_per_s']:>10.1f} {r['data_wait']:>10.0%} {r['threads']:>8} {r['memory_mb']:>9.0f} "
              f"{r['wall']:>8.1f}")
    one, two = results["train, 1 rank"]["samples_per_s"], results["train, 2 ranks"]["samples_per_s"]
    naive_threads = results["train, 1 rank, naive threads"]["samples_per_s"]
    print(f"\ndata only: decoding at {a.resolution} px / at {a.size} px: {ceiling['ours'] / ceiling['naive']:.1f}x samples/s")
    print(f"train, 1 rank: our threads / one thread per core: {one / naive_threads:.1f}x samples/s")
    print(f"2 ranks / 1 rank: {two / one:.2f}x samples/s ({cores} cores for 2 ranks x (1 + {a.workers} workers))")
    print(f"training (1 rank) / data ceiling (1 rank): {one / ceiling['ours']:.2f} "
          f"-> {'the model' if one < 0.8 * ceiling['ours'] else 'data loading'} is the bottleneck")


if __name__ == "__main__":
    main()
