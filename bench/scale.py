"""`--executor ray` against the local pool, and what the driver needs as runs grow.

1. whole runs (default): `pipe clean` + `pipe shard` of the same few thousand generated files,
   local with `--workers 2` against Ray with two one-CPU nodes on this machine (tests/raycluster.py:
   a real cluster, loopback only). Each pair of runs is timed back to back, as whole processes;
   Ray's throughput relative to local is local seconds / Ray seconds (the engine's overhead).
2. driver (`--driver N [N ...]`): N synthetic `FileResult` rows written as part results files,
   then, in a fresh process each, what the driver does with them: gather (read every part),
   decide (exact + near duplicates, label conflicts) and the manifest rows, timed, with the
   process's peak RSS. Memory per file is the slope between two sizes.

    .venv/bin/python bench/scale.py [--files 2000] [--repeat 2] [--quick]
    .venv/bin/python bench/scale.py --driver 10000 50000 200000 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


# ---------------------------------------------------------------- 1. whole runs


def make_input(root: Path, n: int) -> None:
    """n files: photos of a few sizes in 10 classes, one in 20 an exact copy, one in 10 a text."""
    from tests.factories import photo, write

    rng = random.Random(0)
    for i in range(n):
        cls = root / f"class{i % 10}"
        if i % 10 == 9:
            write(cls / f"t{i:05d}.txt", f"text {i} " + " ".join(rng.choice("abcdefgh") * 3 for _ in range(200)))
        elif i % 20 == 3 and i > 20:
            shutil.copyfile(root / f"class{(i - 20) % 10}" / f"p{i - 20:05d}.jpg", cls / f"p{i:05d}.jpg")
        else:
            photo(cls / f"p{i:05d}.jpg", rng.choice((320, 480, 640)), rng.choice((240, 360, 480)), seed=i)


def timed(cmd: list, runner) -> float:
    t = time.perf_counter()
    p = runner(cmd)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed: {p.stderr[-2000:]}")
    return time.perf_counter() - t


def whole_runs(files: int, repeat: int, part_files: int) -> None:
    from tests.raycluster import start_cluster

    work = Path(tempfile.mkdtemp(prefix="scale-"))
    try:
        make_input(work / "raw", files)
        print(f"input: {files} files, {sum(p.stat().st_size for p in (work / 'raw').rglob('*') if p.is_file()) / 1e6:.0f} MB")
        t = time.perf_counter()
        cluster = start_cluster()
        print(f"cluster of 2 one-CPU nodes up in {time.perf_counter() - t:.0f} s (not counted)")
        try:
            run = cluster.pipe
            ratios = []
            for k in range(repeat):
                out = work / f"run{k}"
                local = timed(["clean", work / "raw", "-o", out / "lc", "--workers", "2", "--json"], run)
                local += timed(["shard", out / "lc", "-o", out / "ls", "--json"], run)
                ray_args = ["--executor", "ray", "--ray-address", cluster.address]
                ray = timed(["clean", work / "raw", "-o", out / "rc", "--part-files", part_files, "--json", *ray_args], run)
                ray += timed(["shard", out / "rc", "-o", out / "rs", "--json", *ray_args], run)
                same = _same(out / "ls", out / "rs")
                ratios.append(local / ray)
                print(f"run {k}: local {local:.1f} s ({files / local:.0f} files/s), ray {ray:.1f} s ({files / ray:.0f} files/s), "
                      f"ray/local throughput {local / ray:.2f}, shards identical: {same}")
                shutil.rmtree(out)
            print(f"ray/local throughput: {', '.join(f'{r:.2f}' for r in ratios)} (target >= 0.8)")
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _same(a: Path, b: Path) -> bool:
    files = lambda d: {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}  # noqa: E731
    return files(a) == files(b)


# ---------------------------------------------------------------- 2. the driver


def synthetic_parts(clean_dir: Path, n: int, part_files: int) -> None:
    """n image rows as a finished run's part results files (one in 50 an exact copy of another)."""
    from pipeline.clean.records import FileResult
    from pipeline.distribute import parts as partlib
    from pipeline.formats.vocabulary import Kind

    rng = random.Random(n)
    folder = clean_dir / partlib.PARTS_DIR
    folder.mkdir(parents=True)
    for index, (b, e) in enumerate(partlib.cut(n, part_files)):
        lines = []
        for i in range(b, e):
            twin = i - 1 if i % 50 == 49 else i
            key = f"f{i:09d}"
            r = FileResult(f"class{i % 100}/{key}.jpg", key, Kind.IMAGE, f"class{i % 100}", bytes=50_000 + i % 1000,
                           sha256=f"{rng.getrandbits(256):064x}", mtime_ns=1_700_000_000 * 10**9 + i, ctime_ns=1_700_000_000 * 10**9 + i,
                           width=640, height=480, content_hash=f"{twin:032x}", phash=rng.getrandbits(64),
                           output=f"data/class{i % 100}/{key}.jpg", output_bytes=20_000, output_width=256, output_height=256,
                           pixel_sums=[i * 3, i * 5, i * 7], pixel_squares=[i * 11, i * 13, i * 17])
            lines.append(r.to_json() + "\n")
        (folder / f"{index:06d}.{'0' * 16}{partlib.SUFFIX}").write_text("".join(lines), encoding="utf-8")


def driver_child(clean_dir: str) -> None:
    """What the driver does after the parts: gather, decide, manifest rows. Prints one JSON line."""
    from pipeline.clean.decide import DecideSettings, Outputs, decide
    from pipeline.clean.discover import Candidate
    from pipeline.clean.records import FileResult, row
    from pipeline.distribute import parts as partlib
    from pipeline.formats.manifest import ManifestWriter

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    folder = Path(clean_dir) / partlib.PARTS_DIR
    t = time.perf_counter()
    results: list[FileResult] = []
    for name in sorted(os.listdir(folder)):
        results.extend(FileResult.from_json(line) for line in (folder / name).read_text(encoding="utf-8").splitlines())
    gather = time.perf_counter() - t
    # the listing the driver holds all run long (discovery's candidates), as the real driver does
    candidates = [Candidate(r.source, f"/raw/{r.source}", r.kind, "jpeg", r.label, r.key) for r in results]
    gathered = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    outcome = decide(results, DecideSettings(), Outputs(Path(clean_dir), ".pipe/parked", "pad"))
    decide_s = time.perf_counter() - t
    t = time.perf_counter()
    writer = ManifestWriter(Path(clean_dir) / "manifest.parquet")
    for r, d in zip(results, outcome.decisions):
        writer.add(row(r, d, ""))
    writer.close()
    manifest_s = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rows": len(results), "gather_s": gather, "decide_s": decide_s, "manifest_s": manifest_s,
                      "base_kib": base, "gathered_kib": gathered, "peak_kib": peak,
                      "candidates": len(candidates), "by_status": dict(Counter(str(d.status.value) for d in outcome.decisions))}))


def driver(sizes: list[int], part_files: int) -> None:
    rows = []
    for n in sizes:
        work = Path(tempfile.mkdtemp(prefix="scale-driver-"))
        try:
            t = time.perf_counter()
            synthetic_parts(work, n, part_files)
            made = time.perf_counter() - t
            mb = sum(p.stat().st_size for p in (work / ".pipe" / "parts").iterdir()) / 1e6
            p = subprocess.run([sys.executable, __file__, "--driver-child", str(work)], capture_output=True, text=True, check=True)
            r = json.loads(p.stdout.strip().splitlines()[-1])
            rows.append(r)
            print(f"{n:>10} rows ({mb:.0f} MB of part files, made in {made:.0f} s): gather {r['gather_s']:.1f} s, "
                  f"decide {r['decide_s']:.1f} s, manifest {r['manifest_s']:.1f} s; peak RSS {r['peak_kib'] / 1024:.0f} MiB "
                  f"({(r['peak_kib'] - r['base_kib']) * 1024 / n:.0f} B/row over the imports), {r['by_status']}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    for a, b in zip(rows, rows[1:]):
        slope = (b["peak_kib"] - a["peak_kib"]) * 1024 / (b["rows"] - a["rows"])
        print(f"driver memory per file between {a['rows']} and {b['rows']} rows: {slope:.0f} B")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--part-files", type=int, default=250)
    ap.add_argument("--quick", action="store_true", help="400 files, one pair of runs")
    ap.add_argument("--driver", type=int, nargs="+", metavar="N", help="measure the driver on N synthetic rows instead")
    ap.add_argument("--driver-child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.driver_child:
        driver_child(a.driver_child)
    elif a.driver:
        driver(a.driver, 1000)
    else:
        whole_runs(400 if a.quick else a.files, 1 if a.quick else a.repeat, a.part_files)


if __name__ == "__main__":
    main()
