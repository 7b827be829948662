"""`pipe clean` on images vs the naive loop, as whole processes, same data, same run.

    python bench/clean_images.py            # the full run (300 + 300 JPEGs, 100 vs 1000 images)
    python bench/clean_images.py --quick    # a sanity run in a few minutes (30 images per size)
    python bench/clean_images.py --profile  # where the time goes: start-up, then per function
    python bench/clean_images.py --small 100000   # also the 100,000-small-file run (issue 15)
    python bench/clean_images.py --small 100000 --only-small  # that run alone
    python bench/clean_images.py --floor    # the least that 100,000-file run can cost here (issue 15)

The naive way is the loop everyone writes first: for each file, open, convert("RGB"),
resize(LANCZOS) to 512x512, save as JPEG q90. Ours is `pipe clean --workers 1`, which does more
per file than the loop: sha256 of the input, strict decode, colour and orientation, the pixel
hash and the perceptual hash, atomic writes, the journal, the manifest. It runs in both
--resize-mode stretch (the naive loop's geometry, so the outputs can be compared pixel for
pixel) and pad (the default, what users run).

Printed, each with the load average when it was measured:
* time naive / time ours, per size (2048x1536 "camera" and 1024x768 JPEGs; targets >= 3x and
  >= 2x) and per mode;
* mean PSNR of our stretch outputs against the naive ones (target: >= 35 dB);
* the same ratio per image, from CPU time in one process (best of --repeat passes): what the
  whole-process ratio tends to as the image count grows, and much less disturbed by other load;
* the fixed cost: start-up + 1 image, ours and naive (it is what keeps small runs below the
  per-image ratio);
* start-up: the time from launching `pipe clean --workers 1` to its first output file on disk
  (target < 0.3 s; that includes the first 2048x1536 image's own ~10-20 ms), and the naive
  loop's, median of 5, interleaved (noisy on a shared machine: the spread is printed too, and the
  CPU time all of its processes had used by then);
* the speed-up from --workers 1 to --workers 2 (target: >= 1.8x; needs two idle cores);
* with --small N: `pipe clean --workers 2` on N small files as a new user has them (3 in 4 a
  96x96 JPEG, the rest a short text; bench/shard.py's generator), with pipe clean's defaults
  unless --small-args says otherwise (target for 100,000: under 2 minutes on 2 cores);
* peak memory (all processes together, sampled from /proc) for 100 and 1000 images: it must
  not grow with the number of images.

Inputs are synthetic photos (gradients, shapes, edges, texture, sensor noise), seeded, cached
in bench-out/data. Each process is timed from the outside; the median of --repeat runs counts (CPU: the least).
pipe runs with its bytecode cached (compiled first), as an installed pipe has it.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

REPO = Path(__file__).resolve().parent.parent
# one file the naive way; NAIVE runs it as a whole process, PER_IMAGE in-process
NAIVE_ONE = 'Image.open(p).convert("RGB").resize((512, 512), Image.Resampling.LANCZOS).save(dst / (p.stem + ".jpg"), "JPEG", quality=90)'
NAIVE = f"""
import sys
from pathlib import Path
from PIL import Image
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True, exist_ok=True)
for p in sorted(src.rglob("*.jpg")):
    {NAIVE_ONE}
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


def scene(w: int, h: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A picture's own large soft shapes (its composition): colours and their opacity, (h, w, 3)
    and (h, w, 1) float32. Drawn at 1/8 size and enlarged, so the edges are soft."""
    sw, sh = max(8, w // 8), max(8, h // 8)
    layer = Image.new("RGBA", (sw, sh), (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    for _ in range(12):
        x, y = int(rng.integers(0, sw)), int(rng.integers(0, sh))
        rx, ry = int(rng.integers(sw // 12, sw // 3)), int(rng.integers(sh // 12, sh // 3))
        fill = (*(int(v) for v in rng.integers(0, 256, 3)), int(rng.integers(150, 256)))
        (draw.ellipse if rng.random() < 0.6 else draw.rectangle)([x - rx, y - ry, x + rx, y + ry], fill=fill)
    big = np.asarray(layer.resize((w, h), Image.Resampling.BILINEAR), dtype=np.float32)
    return big[..., :3], big[..., 3:] / 255


def make_set(folder: Path, n: int, w: int, h: int, seed: int) -> Path:
    """n distinct pictures as JPEGs (q92) in folder/photos: each its own composition of soft
    shapes (`scene`) over the light, texture and sensor noise of a crop of one of a few big base
    photos, with its own colour and flip. Distinct like a folder of camera photos: near-duplicate
    candidates are rare (crops of a few photos alone made ~1.2 per image, and the pixel check of
    each, not the images, then dominated the run). Returns the photos folder; kept between runs."""
    stamp, photos = folder / "complete.txt", folder / "photos"
    want = f"{n} {w} {h} {seed} scenes"
    if stamp.exists() and stamp.read_text() == want:
        return photos
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "photos").mkdir(parents=True)
    rng = np.random.default_rng(seed)
    bases = [base_photo(w * 5 // 4, h * 5 // 4, seed + k) for k in range(4)]
    for i in range(n):
        b = bases[i % len(bases)]
        y, x = int(rng.integers(0, b.shape[0] - h + 1)), int(rng.integers(0, b.shape[1] - w + 1))
        crop = b[y : y + h, x : x + w].astype(np.float32)
        colours, alpha = scene(w, h, rng)
        # the base's detail (texture, noise) shows through the shapes
        crop = (crop * (1 - alpha) + (colours + (crop - crop.mean())) * alpha) * rng.uniform(0.8, 1.2, 3)
        crop = crop[:, ::-1] if rng.random() < 0.5 else crop
        buf = io.BytesIO()
        Image.fromarray(crop.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=92)
        (folder / "photos" / f"img_{i:05d}.jpg").write_bytes(buf.getvalue())
    stamp.write_text(want)
    return photos


# -- running and measuring ------------------------------------------------------------------

class PeakRSS:
    """Peak resident memory of a process and all its descendants, summed, sampled every 20 ms."""

    def __init__(self, pid: int, sample: bool = True):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if sample:
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


@dataclass
class Run:
    wall: float  # seconds, start to exit
    cpu: float  # user + system seconds of the process and every worker it waited for
    peak: int = 0  # bytes, when sampled
    load: float = 0.0  # load average (1 min) just before the run


def _env(**extra: str) -> dict:
    """The environment of every process measured: this checkout first on the path, and its
    modules' bytecode cached as an installed pipe has it (compiled once by `main`), not compiled
    from source in every process (~0.2-0.4 s of start-up where PYTHONDONTWRITEBYTECODE is set)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _compile() -> None:
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "pipeline")], env=_env(), check=False,
                   stdout=subprocess.DEVNULL)


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(cmd: list[str], memory: bool = False) -> Run:
    env = _env()
    load, cpu = os.getloadavg()[0], _children_cpu()
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = PeakRSS(p.pid) if memory else None
    _, err = p.communicate()
    elapsed = time.perf_counter() - t
    peak = sampler.stop() if sampler else 0
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{err.decode(errors='replace')[-2000:]}")
    return Run(elapsed, _children_cpu() - cpu, peak, load)


def naive(src: Path, dst: Path) -> Run:
    shutil.rmtree(dst, ignore_errors=True)
    return timed([sys.executable, "-c", NAIVE, str(src), str(dst)])


def ours(src: Path, dst: Path, workers: int, mode: str = "pad", memory: bool = False) -> Run:
    shutil.rmtree(dst, ignore_errors=True)
    return timed([sys.executable, "-m", "pipeline", "clean", str(src), "-o", str(dst), "--workers", str(workers),
                  "--resize-mode", mode, "--json"], memory)


def best(fn, repeat: int) -> Run:
    """The median wall time and the least CPU time of ``repeat`` runs (the load: of the median
    run). The median, not the best: on a shared machine the best of a few is luck."""
    runs = sorted((fn() for _ in range(repeat)), key=lambda r: r.wall)
    middle = runs[len(runs) // 2]
    return Run(statistics.median(r.wall for r in runs), min(r.cpu for r in runs), max(r.peak for r in runs), middle.load)


def mean_psnr(clean_dir: Path, naive_dir: Path) -> float:
    import pyarrow.parquet as pq

    values = []
    for r in pq.read_table(clean_dir / "manifest.parquet").to_pylist():
        if r["status"] != "kept":
            continue
        a = np.asarray(Image.open(clean_dir / r["output"]).convert("RGB"), np.float64)
        b = np.asarray(Image.open(naive_dir / (Path(r["source"]).stem + ".jpg")).convert("RGB"), np.float64)
        mse = float(np.mean((a - b) ** 2))
        values.append(10 * np.log10(255**2 / max(mse, 1e-10)))
    return float(np.mean(values))


# -- per image, in one process ----------------------------------------------------------------

PER_IMAGE = f"""
import json, sys, time
from pathlib import Path
from PIL import Image
from pipeline.clean.discover import discover
from pipeline.media.image.clean import ImageSettings
from pipeline.clean.process import WorkerSettings, init_worker, process
from pipeline.media.text.clean import TextSettings
from pipeline.storage import open_folder

src, dst, repeat = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
dst.mkdir(parents=True, exist_ok=True)
cands = discover(src)

def naive(c):
    p = src / c.path
    {NAIVE_ONE}

def per_image(fn):
    fn(cands[0])  # imports, caches
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        for c in cands:
            fn(c)
        best = min(best, (time.process_time() - t) / len(cands))
    return best * 1000

res = {{"naive": per_image(naive)}}
for mode in ("stretch", "pad"):
    init_worker(WorkerSettings(open_folder(dst / mode), ImageSettings(resize_mode=mode), TextSettings(), open_folder(src)))
    res[mode] = per_image(process)
print(json.dumps(res))
"""


def per_image(src: Path, work: Path, repeat: int) -> dict:
    """CPU ms per image, naive and ours (stretch, pad), in one process: best of ``repeat`` passes."""
    shutil.rmtree(work, ignore_errors=True)
    env = _env(OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", PER_IMAGE, str(src), str(work), str(repeat)], env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# -- where the time goes ----------------------------------------------------------------------

PROFILE = """
import cProfile, pstats, sys, time
from pathlib import Path
from pipeline.clean.discover import discover
from pipeline.media.image.clean import ImageSettings
from pipeline.clean.process import WorkerSettings, init_worker, process
from pipeline.media.text.clean import TextSettings
from pipeline.storage import open_folder

cands = discover(Path(sys.argv[1]))
for mode in ("stretch", "pad"):
    init_worker(WorkerSettings(open_folder(sys.argv[2] + "/" + mode), ImageSettings(resize_mode=mode), TextSettings(),
                               open_folder(sys.argv[1])))
    process(cands[0])
    prof = cProfile.Profile(time.process_time)
    t = time.process_time()
    prof.enable()
    for c in cands:
        process(c)
    prof.disable()
    print(f"{mode}: per image, in one worker: {(time.process_time() - t) / len(cands) * 1000:.1f} ms CPU; by function (tottime):")
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)
"""


def profile(src: Path, work: Path) -> None:
    """Fixed costs (interpreter + CLI, worker start-up) and the per-image breakdown in a worker."""
    env = _env(OPENBLAS_NUM_THREADS="1")
    for what, code in (("python + pipe CLI imports", "import pipeline.cli.app, pipeline.clean.stage"),
                       ("worker start-up (imports the decoders)",
                        "import pipeline.clean.process; from pipeline.media.image.clean import preload; preload(); "
                        "import simplejpeg, xxhash")):
        t = min(_wall([sys.executable, "-c", code], env) for _ in range(3))
        print(f"{what}: {t:.2f} s")
    one = work / "data" / "one"
    if not (one / "photo.jpg").exists():
        one.mkdir(parents=True, exist_ok=True)
        shutil.copy(next(iter(sorted(src.glob("*.jpg")))), one / "photo.jpg")
    t_ours = min(ours(one, work / "one-ours", 1).wall for _ in range(3))
    t_naive = min(naive(one, work / "one-naive").wall for _ in range(3))
    print(f"start-up + 1 image (wall, best of 3): pipe clean {t_ours:.2f} s, naive {t_naive:.2f} s")
    shutil.rmtree(work / "profile", ignore_errors=True)
    subprocess.run([sys.executable, "-c", PROFILE, str(src), str(work / "profile")], env=env, check=True)


def _wall(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True)
    return time.perf_counter() - t


# -- the benchmark --------------------------------------------------------------------------

SIZES = (((2048, 1536), 3.5), ((1024, 768), 2.0))
PSNR_TARGET, WORKERS_TARGET, STARTUP_TARGET, SMALL_TARGET = 35.0, 1.8, 0.3, 120.0


# -- start-up: launch to the first output file ----------------------------------------------

def first_output(cmd: list[str], out: Path) -> tuple[float, float, float]:
    """Seconds from launching ``cmd`` to the first .jpg under ``out`` (polled every ms), and to
    its exit; and the CPU seconds its processes had used when that file appeared (user +
    system of every process of its tree then, from /proc: less disturbed by other load)."""
    env = _env()
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first, cpu = None, float("nan")
    while p.poll() is None:
        if first is None and _has_jpg(out):
            first = time.perf_counter() - t
            cpu = _tree_cpu(p.pid)
        time.sleep(0.001)
    end = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return (first if first is not None else end), end, cpu


def _tree_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every live descendant (and what they reaped)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for q in PeakRSS(pid, sample=False)._tree():
        try:
            with open(f"/proc/{q}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(v) for v in fields[11:15]) / tick  # utime, stime, cutime, cstime
        except (OSError, ValueError, IndexError):
            pass
    return total


def _has_jpg(folder: Path) -> bool:
    """Any finished .jpg below ``folder`` (os.scandir: cheap enough to poll every millisecond)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            if _has_jpg(Path(e.path)):
                return True
        elif e.name.endswith(".jpg"):
            return True
    return False


def startup(src: Path, work: Path, repeat: int) -> dict:
    """Time to the first output file, ours (--workers 1) and naive, interleaved: median, min and
    max of ``repeat``, and the CPU time used by then (median)."""
    cmds = {"ours": [sys.executable, "-m", "pipeline", "clean", str(src), "-o", str(work / "first-ours"), "--workers", "1",
                     "--json"],
            "naive": [sys.executable, "-c", NAIVE, str(src), str(work / "first-naive")]}
    runs: dict[str, list] = {name: [] for name in cmds}
    for _ in range(repeat):
        for name, cmd in cmds.items():
            first, _end, cpu = first_output(cmd, work / f"first-{name}")
            runs[name].append((first, cpu))
    res = {}
    for name, got in runs.items():
        times = sorted(t for t, _ in got)
        res[name] = {"median": statistics.median(times), "min": times[0], "max": times[-1], "runs": times,
                     "cpu_median": statistics.median(c for _, c in got), "load": os.getloadavg()[0]}
    return res


# -- the 100,000-small-file run -----------------------------------------------------------------

def small_run(n: int, work: Path, args: list[str]) -> dict:
    """`pipe clean --workers 2` on n small files (bench/shard.py's generator, cached)."""
    sys.path.insert(0, str(REPO / "bench"))
    from shard import make_raw

    raw = work / "data" / f"small-{n}"
    t = time.perf_counter()
    make_raw(raw, n)
    made = time.perf_counter() - t
    out = work / "small-out"
    shutil.rmtree(out, ignore_errors=True)
    r = timed([sys.executable, "-m", "pipeline", "clean", str(raw), "-o", str(out), "--workers", "2", "--json", *args])
    report = json.loads((out / "report.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return {"files": n, "args": args, **vars(r), "stages_s": report["timings"], "by_status": report["by_status"],
            "generated_s": made}


def print_small(s: dict) -> None:
    n = s["files"]
    print(f"{n} small files (75% 96x96 JPEGs, 25% short texts), pipe clean --workers 2 {' '.join(s['args'])}: "
          f"{s['wall']:.1f} s wall, {s['cpu']:.1f} s CPU ({s['cpu'] / n * 1000:.2f} ms CPU a file; target for 100,000: "
          f"{SMALL_TARGET:g} s" + (f": {verdict(s['wall'] < SMALL_TARGET)}" if n >= 100_000 else "") + f") (load {s['load']:.1f})")
    print("  stages: " + ", ".join(f"{k} {v:.1f}" for k, v in s["stages_s"].items()) + f"; statuses {s['by_status']}")


def floor(work: Path, n: int = 400, passes: int = 3) -> None:
    """The least CPU the 100,000-small-file run can cost on this machine, whatever pipe clean did
    around it: only the steps the contract asks of each file, each with the fastest tool we have,
    timed in one process (CPU time, best of ``passes`` over bench/shard.py's small files). Per
    96x96 JPEG: read it, decode it in full (DESIGN: a full decode, not verify()), resize it to
    512x512 (DESIGN's output size; fast_image_resize's Lanczos-3, 3-4x Pillow's), encode JPEG q90,
    write it atomically (a temporary name, then the rename), and take its pixel sums for shard's
    mean/std (from the pixels encoded, issue 26; until then the output was decoded once more).
    Per text: read, strict UTF-8 decode, atomic write. Nothing else pipe clean does (hashes,
    the perceptual hash, the blank test, journal, manifest, dedup, start-up) is counted."""
    sys.path.insert(0, str(REPO / "bench"))
    from shard import make_raw

    from pipeline.core.files import atomic_write_bytes
    from pipeline.media.image.clean import _measure, encode
    from pipeline.media.image.resize import fit

    raw = work / "data" / f"small-{n}"
    make_raw(raw, n)
    images, texts = sorted(raw.rglob("*.jpg")), sorted(raw.rglob("*.txt"))
    out = work / "floor-out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    def image_steps(path: Path, t: dict) -> None:
        c = time.process_time()
        data = path.read_bytes()
        im = Image.open(io.BytesIO(data))
        im.load()
        c = _lap(t, "read + full decode", c)
        big = fit(im.convert("RGB"), 512, "pad", (0, 0, 0))
        c = _lap(t, "resize to 512", c)
        jpeg = encode(big, "jpg", 90)
        c = _lap(t, "encode q90", c)
        atomic_write_bytes(out / path.name, jpeg)
        c = _lap(t, "atomic write", c)
        _measure(big)
        _lap(t, "pixel sums (before encoding)", c)

    def text_steps(path: Path, t: dict) -> None:
        c = time.process_time()
        text = path.read_bytes().decode("utf-8")
        atomic_write_bytes(out / path.name, text.encode())
        _lap(t, "text: read, decode, atomic write", c)

    best_ms: dict[str, float] = {}
    for _ in range(passes):
        t: dict[str, float] = {}
        for path in images:
            image_steps(path, t)
        for path in texts:
            text_steps(path, t)
        for step, seconds in t.items():
            per = 1000 * seconds / (len(texts) if step.startswith("text") else len(images))
            best_ms[step] = min(best_ms.get(step, per), per)
    shutil.rmtree(out, ignore_errors=True)
    image_ms = sum(v for k, v in best_ms.items() if not k.startswith("text"))
    text_ms = best_ms["text: read, decode, atomic write"]
    cores = len(os.sched_getaffinity(0))
    least = (75_000 * image_ms + 25_000 * text_ms) / 1000 / cores
    print(f"the least CPU a small file costs (CPU time in one process, best of {passes} over {len(images)} 96x96 JPEGs and "
          f"{len(texts)} texts; load {os.getloadavg()[0]:.1f}):")
    for step, ms in best_ms.items():
        print(f"  {step:<34} {ms:6.3f} ms")
    print(f"  an image in all {image_ms:6.3f} ms; without the pixel sums {image_ms - best_ms['pixel sums (before encoding)']:.3f} ms")
    print(f"100,000 small files (75,000 images, 25,000 texts) on {cores} cores, nothing else counted: at least "
          f"{least:.0f} s (target {SMALL_TARGET:g} s: {verdict(least < SMALL_TARGET)}; without the pixel sums "
          f"{least - 75 * best_ms['pixel sums (before encoding)'] / cores:.0f} s)")


def _lap(t: dict, step: str, since: float) -> float:
    now = time.process_time()
    t[step] = t.get(step, 0.0) + now - since
    return now


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sets, one repeat: does it work?")
    ap.add_argument("--images", type=int, default=None, help="JPEGs per size (default 300; quick 30)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per measurement, the median counts (default 3; quick 1)")
    ap.add_argument("--out", type=Path, default=REPO / "bench-out", help="data and outputs (default bench-out/)")
    ap.add_argument("--profile", action="store_true", help="only show where the time goes (fixed costs, per function)")
    ap.add_argument("--small", type=int, default=0, metavar="N", help="also run pipe clean on N small files (issue 15: 100000)")
    ap.add_argument("--small-args", default="", help="extra pipe clean flags for --small (default: none, a new user's run)")
    ap.add_argument("--only-small", action="store_true", help="only the --small run")
    ap.add_argument("--floor", action="store_true",
                    help="only the least CPU the 100,000-small-file run can cost here: the contract's steps, nothing else")
    args = ap.parse_args()
    _compile()
    n, mem_sizes, repeat = (30, (32, 128), 1) if args.quick else (300, (100, 1000), 3)
    n, repeat, work = args.images or n, args.repeat or repeat, args.out
    if args.floor:
        return floor(work)
    if args.profile:
        return profile(make_set(work / "data" / "2048x1536-30", 30, 2048, 1536, seed=2048), work)
    small = small_run(args.small, work, shlex.split(args.small_args)) if args.small else None
    if args.only_small:
        if small is None:
            sys.exit("--only-small needs --small N")
        return print_small(small)
    print(f"pipe clean vs the naive loop ({n} images per size, median of {repeat}); {os.cpu_count()} CPUs", flush=True)
    results: dict = {"images": n, "repeat": repeat, "sizes": {}}
    lines = []
    for (w, h), target in SIZES:
        src = make_set(work / "data" / f"{w}x{h}-{n}", n, w, h, seed=w)
        nv = best(functools.partial(naive, src, work / "naive"), repeat)
        size = results["sizes"][f"{w}x{h}"] = {"target": target, "naive": vars(nv)}
        lines.append(f"{w}x{h}  naive          {nv.wall:7.2f} s wall {nv.cpu:7.2f} s CPU{'':54}(load {nv.load:.1f})")
        for mode in ("stretch", "pad"):
            r = best(functools.partial(ours, src, work / f"ours-{mode}", 1, mode), repeat)
            report = json.loads((work / f"ours-{mode}" / "report.json").read_text())
            size[mode] = {**vars(r), "ratio": nv.wall / r.wall, "cpu_ratio": nv.cpu / r.cpu,
                          "stages_s": report["timings"], "near_duplicate_search": report["near_duplicate_search"]}
            lines.append(f"{w}x{h}  ours, {mode:<7}  {r.wall:7.2f} s wall {r.cpu:7.2f} s CPU   naive/ours "
                         f"{nv.wall / r.wall:5.2f}x wall {nv.cpu / r.cpu:5.2f}x CPU (target {target:g}x: "
                         f"{verdict(nv.wall / r.wall >= target)})  (load {r.load:.1f})")
        size["psnr_db"] = mean_psnr(work / "ours-stretch", work / "naive")
        sample = make_set(work / "data" / f"{w}x{h}-30", 30, w, h, seed=w)
        load = os.getloadavg()[0]
        size["per_image_ms"] = per_image(sample, work / "per-image", max(repeat, 3))
        size["per_image_load"] = load
        print("\n".join(lines[-3:]), flush=True)
    src = make_set(work / "data" / f"2048x1536-{n}", n, 2048, 1536, seed=2048)
    one_worker = results["sizes"]["2048x1536"]["pad"]["wall"]
    two = best(lambda: ours(src, work / "ours2", 2), repeat)
    results["workers"] = {"1": one_worker, "2": two.wall, "speedup": one_worker / two.wall, "load": two.load}
    peaks = {}
    for count in mem_sizes:
        src = make_set(work / "data" / f"mem-{count}", count, 1024, 768, seed=7)
        peaks[count] = ours(src, work / f"mem{count}", 2, memory=True).peak
    results["peak_rss_bytes"] = peaks
    one = work / "data" / "one"
    one.mkdir(parents=True, exist_ok=True)
    shutil.copy(make_set(work / "data" / "1024x768-30", 30, 1024, 768, seed=1024) / "img_00000.jpg", one / "photo.jpg")
    fixed_ours = best(lambda: ours(one, work / "one-ours", 1), repeat)
    fixed_naive = best(lambda: naive(one, work / "one-naive"), repeat)
    results["fixed"] = {"ours": vars(fixed_ours), "naive": vars(fixed_naive)}
    first = results["startup"] = startup(make_set(work / "data" / f"2048x1536-{n}", n, 2048, 1536, seed=2048), work,
                                         max(5, repeat))
    if small is not None:
        results["small"] = small

    print()
    print("whole processes (pipe clean --workers 1); CPU: user + system of all its processes, a bound")
    print("on the wall time of a quiet machine (where main process and worker overlap):")
    print("\n".join(lines))
    print("stages of the last pad run (report.json): " + "; ".join(
        f"{k} " + ", ".join(f"{n} {t:.2f}" for n, t in v["pad"]["stages_s"].items())
        + f" (near-duplicate candidates {v['pad']['near_duplicate_search']['candidates']})"
        for k, v in results["sizes"].items()))
    print("PSNR of ours (stretch) vs naive, mean: " + ", ".join(
        f"{k} {v['psnr_db']:.1f} dB" for k, v in results["sizes"].items())
        + f" (target {PSNR_TARGET:g} dB: {verdict(all(v['psnr_db'] >= PSNR_TARGET for v in results['sizes'].values()))})")
    print("per image, CPU time in one process (30 images, best of passes; what the ratio tends to with many images):")
    for k, v in results["sizes"].items():
        pi = v["per_image_ms"]
        print(f"  {k}: naive {pi['naive']:.1f} ms; ours stretch {pi['stretch']:.1f} ms ({pi['naive'] / pi['stretch']:.2f}x), "
              f"pad {pi['pad']:.1f} ms ({pi['naive'] / pi['pad']:.2f}x) (target {v['target']:g}x) (load {v['per_image_load']:.1f})")
    print(f"fixed cost, start-up + 1 image: pipe clean {fixed_ours.wall:.2f} s wall {fixed_ours.cpu:.2f} s CPU, "
          f"naive {fixed_naive.wall:.2f} s wall {fixed_naive.cpu:.2f} s CPU (load {fixed_ours.load:.1f})")
    print(f"workers 1 -> 2 (2048x1536, pad): {one_worker:.2f} s -> {two.wall:.2f} s = {one_worker / two.wall:.2f}x "
          f"(target {WORKERS_TARGET:g}x: {verdict(one_worker / two.wall >= WORKERS_TARGET)}) (load {two.load:.1f})")
    fo, fn = first["ours"], first["naive"]
    print(f"start-up, launch to the first output file (2048x1536, --workers 1), median of {len(fo['runs'])}: pipe clean "
          f"{fo['median']:.3f} s (min {fo['min']:.3f}, max {fo['max']:.3f}; target {STARTUP_TARGET:g} s: "
          f"{verdict(fo['median'] < STARTUP_TARGET)}; CPU of its processes by then {fo['cpu_median']:.2f} s), naive {fn['median']:.3f} s "
          f"(min {fn['min']:.3f}; CPU {fn['cpu_median']:.2f} s) (load {fo['load']:.1f})")
    a, b = mem_sizes
    print(f"peak memory, all processes (--workers 2, 1024x768): {a} images {peaks[a] / 2**20:.0f} MiB, "
          f"{b} images {peaks[b] / 2**20:.0f} MiB ({peaks[b] / peaks[a]:.2f}x for {b // a}x the images)")
    if small is not None:
        print_small(small)
    (work / "clean_images.json").write_text(json.dumps(results, indent=2))
    print(f"(numbers in {work / 'clean_images.json'})")


if __name__ == "__main__":
    main()
