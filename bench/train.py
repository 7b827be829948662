"""pipe train's throughput on CPU: samples/s with 1 and 2 gloo ranks, the share of step time spent
waiting for data, and the data pipeline's own ceiling (--data-only), on the same shards in the
same run, printed as ratios.

Every number comes from whole `pipe train` processes (launcher, ranks, dataloader workers), the
way a user runs them; samples/s and data-wait are read from RUN_DIR/metrics.jsonl, leaving out
the first logging window (process start, first batches).

    python bench/train.py --quick                  # ~1-2 min on 2 cores: 160 images of 128 px
    python bench/train.py [--images 640] [--size 256] [--epochs 2] [--workers 1] [--model image]

On a machine with fewer cores than ranks x (1 + workers), two ranks cannot be twice as fast: the
table says how many cores there were.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small and short: 160 images of 128 px, 2 epochs")
    ap.add_argument("--images", type=int, default=640)
    ap.add_argument("--size", type=int, default=256, help="side of the cleaned images, in pixels")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1, help="dataloader workers per rank")
    ap.add_argument("--batch-size", type=int, default=16, help="per rank")
    ap.add_argument("--model", default="image")
    ap.add_argument("--keep", type=Path, help="keep the data and runs here instead of a temporary folder")
    a = ap.parse_args()
    if a.quick:
        a.images, a.size = 160, 128
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with tempfile.TemporaryDirectory() as tmp:
        root = a.keep or Path(tmp)
        t = time.perf_counter()
        make_raw(root / "raw", a.images, max(a.size, 64))
        pipe("clean", str(root / "raw"), "-o", str(root / "clean"), "--size", str(a.size), "--workers", "2")
        pipe("shard", str(root / "clean"), "-o", str(root / "shards"), "--val-fraction", "0.1")
        print(f"data: {a.images} images of {a.size} px through pipe clean + pipe shard in {time.perf_counter() - t:.1f} s; "
              f"{cores} cores; model {a.model}, batch {a.batch_size} per rank, {a.workers} worker(s) per rank")

        common = ["--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--workers", str(a.workers)]
        data = pipe("train", str(root / "shards"), "-o", str(root / "data-only"), "--data-only", *common)
        rates = [float(x.replace(",", "")) for x in re.findall(r"all ranks: ([\d,.]+) samples/s", data.stdout)]
        ceiling = max(rates) if rates else float("nan")

        results = {}
        for ranks in (1, 2):
            run = root / f"train-{ranks}"
            p = pipe("train", str(root / "shards"), "-o", str(run), "--nproc-per-node", str(ranks), "--model", a.model,
                     "--log-every", "2", *common)
            results[ranks] = {**steady(run), "wall": p.seconds}

    print(f"\n{'':>22} {'samples/s':>10} {'data wait':>10} {'peak MB':>9} {'wall s':>8}")
    print(f"{'data only, 1 rank':>22} {ceiling:>10.1f} {'-':>10} {'-':>9} {data.seconds:>8.1f}")
    for ranks, r in results.items():
        print(f"{f'train, {ranks} rank' + ('s' if ranks > 1 else ''):>22} {r['samples_per_s']:>10.1f} "
              f"{r['data_wait']:>10.0%} {r['memory_mb']:>9.0f} {r['wall']:>8.1f}")
    one, two = results[1]["samples_per_s"], results[2]["samples_per_s"]
    print(f"\n2 ranks / 1 rank: {two / one:.2f}x samples/s ({cores} cores for 2 ranks x (1 + {a.workers} workers))")
    print(f"training (1 rank) / data ceiling (1 rank): {one / ceiling:.2f} "
          f"-> {'the model' if one < 0.8 * ceiling else 'data loading'} is the bottleneck")


if __name__ == "__main__":
    main()
