"""`pipe shard` vs GNU `tar` writing the same CLEAN_DIR, as whole processes, same data, same run.

    python bench/shard.py                 # 10,000, 30,000 and 100,000 samples, 3 rounds each
    python bench/shard.py --sizes 10000   # one size only
    python bench/shard.py --repeat 5      # more rounds (the median is printed)
    python bench/shard.py --quick         # 2,000 samples: a sanity run in a minute or two
    python bench/shard.py --baseline /work/main   # also that checkout's pipe shard, same rounds, outputs compared

The data is what a new user shards (issue 15): a CLEAN_DIR written by the real `pipe clean`
from a raw folder of small JPEGs (75%) and short texts (25%) in 10 class folders, each image
its own picture (a smooth random 8x8 colour field scaled to 96x96, so neither exact nor near
duplicates), generated fast and cached in bench-out/shard/. Then, each a fresh process into a
fresh folder:

* ours: `pipe shard CLEAN_DIR -o OUT` (defaults: 1000 samples a shard, val 10%), which reads the
  manifest, splits, adds up the pixel sums pipe clean recorded, and copies every file's bytes
  into tar shards (sha256 of each shard, fsync, rename, index.json);
* tar: `tar -cf OUT/data.tar -C CLEAN_DIR data` (GNU tar, no fsync): the same files, one archive.

Printed, with the load average when measured: the wall time of each (median of --repeat
rounds, tar and pipe shard alternating), the median of the rounds' ratios ours / tar (target:
at most 3x), their CPU time (user + sys: what load disturbs least; pipe shard's wall time also
holds an fsync per shard, tar's none), and the peak memory of the whole pipe shard process
(ru_maxrss from wait4; median of the rounds) at every size (target: flat from 10k to 100k
samples). The machine is shared: only ratios within one run count.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench-out" / "shard"
CLASSES = 10
WORDS = "the a cat dog sat on mat under tree near river over hill with small red blue old new".split()


def make_raw(root: Path, n: int, seed: int = 0) -> None:
    """n samples: 3 in 4 a 96x96 JPEG, the rest a text of 10-40 words; class folders c0..c9."""
    if (root / ".done").exists():
        return
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(seed)
    for c in range(CLASSES):
        (root / f"c{c}").mkdir(parents=True)
    for i in range(n):
        folder = root / f"c{i % CLASSES}"
        if i % 4 == 3:
            words = rng.choice(WORDS, size=int(rng.integers(10, 40)))
            (folder / f"t{i:06d}.txt").write_text(f"sample {i}: " + " ".join(words) + "\n")
            continue
        field = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
        im = Image.fromarray(field).resize((96, 96), Image.Resampling.BILINEAR)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=85)
        (folder / f"i{i:06d}.jpg").write_bytes(buf.getvalue())
    (root / ".done").write_text("")


def make_clean(raw: Path, clean: Path, size: int) -> float:
    """The CLEAN_DIR, by the real pipe clean (cached: a finished one is reused)."""
    if (clean / "manifest.parquet").exists():
        return 0.0
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipeline", "clean", str(raw), "-o", str(clean), "--size", str(size),
                    "--no-near-dedup", "--json"], check=True, stdout=subprocess.DEVNULL, env=_env())
    return time.perf_counter() - t


def _env(code: Path = REPO) -> dict:
    env = dict(os.environ)
    # as an installed pipe runs: its modules' bytecode cached (compiled on the first round), not
    # compiled from source in every process (~0.2-0.4 s of start-up where the variable is set)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = str(code) + os.pathsep + env.get("PYTHONPATH", "")
    # `python -m` puts the current folder first on sys.path: run from a checkout, that checkout's
    # pipeline would be timed whatever PYTHONPATH says (--baseline timed this branch twice)
    env["PYTHONSAFEPATH"] = "1"
    return env


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every file pipe shard wrote (its lock and marker aside: they name the run)."""
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in ("lock", "state.json")}


def timed(cmd: list[str], out: Path, code: Path = REPO) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, the child's own peak RSS in bytes) of one process writing into a fresh ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    exe = shutil.which(cmd[0]) or cmd[0]
    with open(out.parent / f"{out.name}.stderr", "wb") as err:
        t = time.perf_counter()
        # posix_spawn, not fork: a forked child's peak RSS would start at this (bigger) process's
        pid = os.posix_spawn(exe, cmd, _env(code), file_actions=[(os.POSIX_SPAWN_DUP2, err.fileno(), 2),
                                                            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)])
        _, status, usage = os.wait4(pid, 0)
        wall = time.perf_counter() - t
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed ({code}): {(out.parent / f'{out.name}.stderr').read_text()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def bench(n: int, size: int, repeat: int, baseline: Path | None = None) -> dict:
    raw, clean = OUT / f"raw-{n}", OUT / f"clean-{n}-{size}"
    t = time.perf_counter()
    make_raw(raw, n)
    gen_s = time.perf_counter() - t
    clean_s = make_clean(raw, clean, size)
    data_bytes = sum(p.stat().st_size for p in (clean / "data").rglob("*") if p.is_file())
    ours_cmd = [sys.executable, "-m", "pipeline", "shard", str(clean), "-o", str(OUT / "ours"), "--json"]
    tar_cmd = ["tar", "-cf", str(OUT / "tar" / "data.tar"), "-C", str(clean), "data"]
    base_cmd = [sys.executable, "-m", "pipeline", "shard", str(clean), "-o", str(OUT / "base"), "--json"]
    ours, tar, base = [], [], []
    for _ in range(repeat):  # alternate, so all see the same page cache and the same load
        tar.append(timed(tar_cmd, OUT / "tar"))
        if baseline is not None:
            base.append(timed(base_cmd, OUT / "base", baseline))
        ours.append(timed(ours_cmd, OUT / "ours"))
    shards_bytes = sum(p.stat().st_size for p in (OUT / "ours").glob("*.tar"))
    med = statistics.median
    extra = {}
    if baseline is not None:
        extra = {"base_s": med(w for w, _, _ in base), "base_cpu": med(c for _, c, _ in base),
                 "base_rss": med(m for _, _, m in base), "base_ratio": med(b[0] / t[0] for b, t in zip(base, tar)),
                 "same_bytes": digests(OUT / "base") == digests(OUT / "ours")}
    return {**extra, "n": n, "gen_s": gen_s, "clean_s": clean_s, "data_mb": data_bytes / 1e6, "shards_mb": shards_bytes / 1e6,
            "ours_s": med(w for w, _, _ in ours), "tar_s": med(w for w, _, _ in tar),
            "ratio": med(o[0] / t[0] for o, t in zip(ours, tar)), "ratios": [o[0] / t[0] for o, t in zip(ours, tar)],
            "ours_cpu": med(c for _, c, _ in ours), "tar_cpu": med(c for _, c, _ in tar),
            "ours_rss": med(m for _, _, m in ours), "tar_rss": med(m for _, _, m in tar), "load": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    ap.add_argument("--size", type=int, default=64, help="--size of pipe clean (output images are size x size)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--baseline", type=Path, help="a checkout of pipe (e.g. main) whose pipe shard runs in the same "
                    "rounds, between tar and this one; its outputs are compared with this one's by sha256")
    args = ap.parse_args()
    sizes = [2000] if args.quick else args.sizes
    for code in [REPO, *([args.baseline] if args.baseline else [])]:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(code / "pipeline"), str(code / "train")], env=_env(code),
                       check=False, stdout=subprocess.DEVNULL)  # the bytecode every round then finds (see `_env`)
    rows = []
    for n in sizes:
        r = bench(n, args.size, args.repeat, args.baseline)
        rows.append(r)
        print(f"{n:>7} samples ({r['data_mb']:.0f} MB of data/, shards {r['shards_mb']:.0f} MB; generated in {r['gen_s']:.0f} s, "
              f"pipe clean {r['clean_s']:.0f} s): pipe shard {r['ours_s']:.2f} s, tar {r['tar_s']:.2f} s, "
              f"ratio {r['ratio']:.2f}x (rounds: {', '.join(f'{x:.2f}' for x in r['ratios'])}; target <= 3x); "
              f"CPU (user+sys) pipe shard {r['ours_cpu']:.2f} s, "
              f"tar {r['tar_cpu']:.2f} s; peak RSS pipe shard {r['ours_rss'] / 2**20:.0f} MiB, "
              f"tar {r['tar_rss'] / 2**20:.0f} MiB; load {' '.join(f'{x:.1f}' for x in r['load'])}", flush=True)
        if args.baseline:
            print(f"{'':>7} baseline {args.baseline}: pipe shard {r['base_s']:.2f} s, ratio {r['base_ratio']:.2f}x, "
                  f"CPU {r['base_cpu']:.2f} s, peak RSS {r['base_rss'] / 2**20:.0f} MiB; "
                  f"outputs {'byte-identical' if r['same_bytes'] else 'DIFFERENT'}", flush=True)
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        curve = " -> ".join(f"{r['ours_rss'] / 2**20:.0f}" for r in rows)
        print(f"peak memory of pipe shard at {', '.join(str(r['n']) for r in rows)} samples: {curve} MiB "
              f"({b['ours_rss'] / a['ours_rss']:.2f}x for {b['n'] / a['n']:.0f}x the samples)")
        if args.baseline:
            curve = " -> ".join(f"{r['base_rss'] / 2**20:.0f}" for r in rows)
            print(f"baseline's: {curve} MiB ({b['base_rss'] / a['base_rss']:.2f}x)")


if __name__ == "__main__":
    main()
