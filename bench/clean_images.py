"""`pipe clean` on images vs the naive loop, as whole processes, same data, same run.

    python bench/clean_images.py            # the full run (300 + 300 JPEGs, 100 vs 1000 images)
    python bench/clean_images.py --quick    # a sanity run in about a minute
    python bench/clean_images.py --profile  # where the time goes: start-up, then per image

The naive way is the loop everyone writes first: for each file, open, convert("RGB"),
resize(LANCZOS) to 512x512, save as JPEG q90. Ours is `pipe clean --workers 1 --resize-mode
stretch` (stretch so that both produce the same geometry and can be compared pixel for pixel),
which does more per file than the loop: sha256 of the input, strict decode, colour and
orientation, the pixel hash and the perceptual hash, atomic writes, the journal, the manifest.

Printed:
* time naive / time ours, for 2048x1536 ("camera") and 1024x768 JPEGs (targets: >= 3x, >= 2x);
* mean PSNR of our outputs against the naive ones (target: >= 35 dB);
* the speed-up from --workers 1 to --workers 2 (target: >= 1.7x; needs two idle cores);
* peak memory (all processes together, sampled from /proc) for 100 and 1000 images: it must
  not grow with the number of images.

Inputs are synthetic photos (gradients, shapes, edges, texture, sensor noise), seeded, cached
in bench-out/data. Each process is timed from the outside; the best of --repeat runs counts.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

REPO = Path(__file__).resolve().parent.parent
NAIVE = """
import sys
from pathlib import Path
from PIL import Image
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True, exist_ok=True)
for p in sorted(src.rglob("*.jpg")):
    im = Image.open(p).convert("RGB").resize((512, 512), Image.Resampling.LANCZOS)
    im.save(dst / (p.stem + ".jpg"), "JPEG", quality=90)
"""


# -- data -----------------------------------------------------------------------------------

def base_photo(w: int, h: int, seed: int) -> np.ndarray:
    """A synthetic photo: smooth light, soft shapes, hard edges, fine texture, sensor noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    arr = np.empty((h, w, 3), np.float32)
    for c in range(3):
        a, b, d = rng.uniform(-1, 1, 3)
        arr[..., c] = 128 + 60 * np.sin(xx / w * np.pi * (1 + 2 * abs(a)) + d) * np.cos(yy / h * np.pi * (1 + 2 * abs(b)))
    im = Image.fromarray(arr.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(40):
        x, y, r = int(rng.integers(0, w)), int(rng.integers(0, h)), int(rng.integers(w // 40, w // 6))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        draw.ellipse([x - r, y - r, x + r, y + r], fill=fill)
    for _ in range(60):
        pts = [int(v) for v in (rng.integers(0, w), rng.integers(0, h), rng.integers(0, w), rng.integers(0, h))]
        draw.line(pts, fill=tuple(int(v) for v in rng.integers(0, 256, 3)), width=int(rng.integers(1, 4)))
    arr = np.asarray(im.filter(ImageFilter.GaussianBlur(1.2))).astype(np.float32)
    tex = np.asarray(Image.fromarray(rng.normal(0, 1, (h // 4, w // 4)).astype(np.float32), "F").resize((w, h), Image.Resampling.BICUBIC))
    arr += 10 * tex[..., None] + rng.normal(0, 2.5, (h, w, 3))
    return arr.clip(0, 255).astype(np.uint8)


def make_set(folder: Path, n: int, w: int, h: int, seed: int) -> Path:
    """n distinct JPEGs (q92) in folder/photos: crops of a few big base photos, each with its own
    colour and flip. Returns the photos folder; kept between runs."""
    stamp, photos = folder / "complete.txt", folder / "photos"
    if stamp.exists() and stamp.read_text() == f"{n} {w} {h} {seed}":
        return photos
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "photos").mkdir(parents=True)
    rng = np.random.default_rng(seed)
    bases = [base_photo(w * 5 // 4, h * 5 // 4, seed + k) for k in range(4)]
    for i in range(n):
        b = bases[i % len(bases)]
        y, x = int(rng.integers(0, b.shape[0] - h + 1)), int(rng.integers(0, b.shape[1] - w + 1))
        crop = b[y : y + h, x : x + w].astype(np.float32) * rng.uniform(0.8, 1.2, 3)
        crop = crop[:, ::-1] if rng.random() < 0.5 else crop
        buf = io.BytesIO()
        Image.fromarray(crop.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=92)
        (folder / "photos" / f"img_{i:05d}.jpg").write_bytes(buf.getvalue())
    stamp.write_text(f"{n} {w} {h} {seed}")
    return photos


# -- running and measuring ------------------------------------------------------------------

class PeakRSS:
    """Peak resident memory of a process and all its descendants, summed, sampled every 20 ms."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    children.setdefault(ppid, []).append(int(d))
                except (OSError, ValueError, IndexError):
                    pass
        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            out.append(p)
            todo += children.get(p, [])
        return out

    def _rss(self, pid: int) -> int:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(self._rss(p) for p in self._tree()))
            self._stop.wait(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def timed(cmd: list[str], memory: bool = False) -> tuple[float, int]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = PeakRSS(p.pid) if memory else None
    _, err = p.communicate()
    elapsed = time.perf_counter() - t
    peak = sampler.stop() if sampler else 0
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{err.decode(errors='replace')[-2000:]}")
    return elapsed, peak


def naive(src: Path, dst: Path) -> float:
    shutil.rmtree(dst, ignore_errors=True)
    return timed([sys.executable, "-c", NAIVE, str(src), str(dst)])[0]


def ours(src: Path, dst: Path, workers: int, memory: bool = False) -> tuple[float, int]:
    shutil.rmtree(dst, ignore_errors=True)
    return timed([sys.executable, "-m", "pipeline", "clean", str(src), "-o", str(dst), "--workers", str(workers),
                  "--resize-mode", "stretch", "--json"], memory)


def best(fn, repeat: int):
    return min((fn() for _ in range(repeat)), key=lambda r: r if isinstance(r, float) else r[0])


def mean_psnr(clean_dir: Path, naive_dir: Path) -> float:
    import pyarrow.parquet as pq

    values = []
    for r in pq.read_table(clean_dir / "manifest.parquet").to_pylist():
        if r["status"] != "kept":
            continue
        a = np.asarray(Image.open(clean_dir / r["output"]).convert("RGB"), np.float64)
        b = np.asarray(Image.open(naive_dir / (Path(r["source"]).stem + ".jpg")).convert("RGB"), np.float64)
        mse = np.mean((a - b) ** 2)
        values.append(10 * np.log10(255**2 / max(mse, 1e-10)))
    return float(np.mean(values))


# -- where the time goes ----------------------------------------------------------------------

PROFILE = """
import cProfile, pstats, sys, time
from pathlib import Path
from pipeline.clean import WorkerSettings
from pipeline.discover import discover
from pipeline.images import ImageSettings
from pipeline.process import init_worker, process
from pipeline.text import TextSettings

cands = discover(Path(sys.argv[1]))
init_worker(WorkerSettings(sys.argv[2], ImageSettings(resize_mode="stretch"), TextSettings()))
process(cands[0])
prof = cProfile.Profile()
t = time.perf_counter()
prof.enable()
for c in cands:
    process(c)
prof.disable()
print(f"per image, in one worker: {(time.perf_counter() - t) / len(cands) * 1000:.1f} ms; by function (tottime):")
pstats.Stats(prof).sort_stats("tottime").print_stats(12)
"""


def profile(src: Path, work: Path) -> None:
    """Fixed costs (interpreter + CLI, worker start-up) and the per-image breakdown in a worker."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for what, code in (("python + pipe CLI imports", "import pipeline.cli, pipeline.clean"),
                       ("worker start-up (imports the decoders)", "import pipeline.process; from pipeline.images import preload; preload(); import simplejpeg, xxhash")):
        t = min(_wall([sys.executable, "-c", code], env) for _ in range(3))
        print(f"{what}: {t:.2f} s")
    shutil.rmtree(work / "profile", ignore_errors=True)
    subprocess.run([sys.executable, "-c", PROFILE, str(src), str(work / "profile")], env=env, check=True)


def _wall(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True)
    return time.perf_counter() - t


# -- the benchmark --------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sets, one repeat: does it work?")
    ap.add_argument("--repeat", type=int, default=None, help="runs per measurement, the best counts (default 3; quick 1)")
    ap.add_argument("--out", type=Path, default=REPO / "bench-out", help="data and outputs (default bench-out/)")
    ap.add_argument("--profile", action="store_true", help="only show where the time goes (fixed costs, per image)")
    args = ap.parse_args()
    n, mem_sizes, repeat = (30, (32, 128), 1) if args.quick else (300, (100, 1000), 3)
    if args.profile:
        return profile(make_set(args.out / "data" / "2048x1536-30", 30, 2048, 1536, seed=2048), args.out)
    repeat = args.repeat or repeat
    work = args.out
    print(f"pipe clean vs the naive loop ({'quick' if args.quick else 'full'}: {n} images per size, best of {repeat}); "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    results: dict = {"quick": args.quick, "sizes": {}}
    rows = []
    for (w, h), target in (((2048, 1536), 3.0), ((1024, 768), 2.0)):
        src = make_set(work / "data" / f"{w}x{h}-{n}", n, w, h, seed=w)
        t_naive = best(lambda: naive(src, work / "naive"), repeat)
        t_ours, _ = best(lambda: ours(src, work / "ours", 1), repeat)
        psnr = mean_psnr(work / "ours", work / "naive")
        ratio = t_naive / t_ours
        results["sizes"][f"{w}x{h}"] = {"naive_s": t_naive, "ours_s": t_ours, "ratio": ratio, "psnr_db": psnr}
        rows.append((f"{w}x{h}", f"{t_naive:.2f} s", f"{t_ours:.2f} s", f"{ratio:.2f}x (target {target:g}x)",
                     f"{psnr:.1f} dB (target 35)"))
        print(f"  {rows[-1]}", flush=True)
    src = make_set(work / "data" / f"2048x1536-{n}", n, 2048, 1536, seed=2048)
    t1 = results["sizes"]["2048x1536"]["ours_s"]
    t2, _ = best(lambda: ours(src, work / "ours2", 2), repeat)
    results["workers"] = {"1": t1, "2": t2, "speedup": t1 / t2}
    peaks = {}
    for count in mem_sizes:
        src = make_set(work / "data" / f"mem-{count}", count, 1024, 768, seed=7)
        _, peaks[count] = ours(src, work / f"mem{count}", 2, memory=True)
    results["peak_rss_bytes"] = peaks
    a, b = mem_sizes
    print()
    print(f"{'size':<11} {'naive':>9} {'ours':>9}  {'naive/ours':<24} {'PSNR vs naive'}")
    for r in rows:
        print(f"{r[0]:<11} {r[1]:>9} {r[2]:>9}  {r[3]:<24} {r[4]}")
    print(f"workers 1 -> 2 (2048x1536): {t1:.2f} s -> {t2:.2f} s = {t1 / t2:.2f}x (target 1.7x)")
    print(f"peak memory, all processes (--workers 2, 1024x768): {a} images {peaks[a] / 2**20:.0f} MiB, "
          f"{b} images {peaks[b] / 2**20:.0f} MiB ({peaks[b] / peaks[a]:.2f}x for {b // a}x the images)")
    (work / "clean_images.json").write_text(json.dumps(results, indent=2))
    print(f"(numbers in {work / 'clean_images.json'})")


if __name__ == "__main__":
    main()
