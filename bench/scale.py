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
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
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


SETTINGS = {"size": 256}  # the part fingerprints' settings (any: the names only have to match the plan)


def synthetic_candidate(i: int):
    """The i-th file of the synthetic listing, as discovery makes it."""
    from pipeline.clean.discover import Candidate
    from pipeline.formats.vocabulary import Kind

    key = f"f{i:09d}"
    return Candidate(f"class{i % 100}/{key}.jpg", f"/raw/class{i % 100}/{key}.jpg", Kind.IMAGE, "jpeg", f"class{i % 100}", key)


def synthetic_parts(clean_dir: Path, n: int, part_files: int) -> None:
    """n image rows as a finished run's part results files, named as the driver's plan names
    them (one row in 50 an exact copy of another under another label). Made a column at a time
    (FileResult objects made ten million rows in half an hour); the same format as
    `parts.write_results`, which a test reads back."""
    import pyarrow as pa

    from pipeline.clean.columns import RESULTS
    from pipeline.distribute import parts as partlib

    rng = random.Random(n)
    for index, (b, e) in enumerate(partlib.cut(n, part_files)):
        cands = [synthetic_candidate(i) for i in range(b, e)]
        rows = range(b, e)
        m = e - b
        cols = {name: pa.nulls(m, RESULTS.field(name).type) for name in RESULTS.names}
        cols.update(
            source=[c.source for c in cands], key=[c.key for c in cands], kind=["image"] * m, label=[c.label for c in cands],
            bytes=[50_000 + i % 1000 for i in rows], sha256=[f"{rng.getrandbits(256):064x}" for _ in rows],
            mtime_ns=[1_700_000_000 * 10**9 + i for i in rows], ctime_ns=[1_700_000_000 * 10**9 + i for i in rows],
            detail=[""] * m, width=[640] * m, height=[480] * m,
            content_hash=[f"{i - 1 if i % 50 == 49 else i:032x}" for i in rows], phash=[rng.getrandbits(64) for _ in rows],
            output=[f"data/{c.source}" for c in cands], output_bytes=[20_000] * m, notes=[[]] * m,
            output_width=[256] * m, output_height=[256] * m,
            pixel_sums=[[i * 3, i * 5, i * 7] for i in rows], pixel_squares=[[i * 11, i * 13, i * 17] for i in rows])
        table = pa.table({k: pa.array(v, RESULTS.field(k).type) if isinstance(v, list) else v for k, v in cols.items()},
                         schema=RESULTS).replace_schema_metadata(partlib.FORMAT)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        part = partlib.Part(index, b, e, partlib.fingerprint(cands, SETTINGS))
        (clean_dir / partlib.PARTS_DIR).mkdir(parents=True, exist_ok=True)
        (clean_dir / partlib.PARTS_DIR / part.name).write_bytes(sink.getvalue().to_pybytes())


def _rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def driver_child(clean_dir: str, n: int, part_files: int) -> None:
    """What the driver of `pipe clean --executor ray` does from the listing on, with the same
    functions: plan the parts, gather each finished part's decide columns, free the listing,
    decide, and finalize (each part's results read back, the journal compacted, the manifest and
    report written; the outputs' moves find no file here). Prints one JSON line."""
    from pipeline.clean.decide import DecideSettings, Outputs, decide
    from pipeline.clean.journal import Journal
    from pipeline.clean.stage import PARKED, CleanConfig, _finalize
    from pipeline.distribute import parts as partlib
    from pipeline.distribute.clean import as_columns, gather

    out = Path(clean_dir)
    base = _rss_kib()
    t = time.perf_counter()
    candidates = [synthetic_candidate(i) for i in range(n)]  # the listing, held from discovery on
    listing_s = time.perf_counter() - t
    listed = _rss_kib()
    t = time.perf_counter()
    plan = partlib.plan(candidates, SETTINGS, part_files)
    plan_s = time.perf_counter() - t
    t = time.perf_counter()
    tables = [gather(out, p, candidates) for p in plan]
    if any(x is None for x in tables):
        raise SystemExit("a part's results file is missing or unreadable")
    cols = as_columns(out, plan, tables)
    gather_s = time.perf_counter() - t
    gathered = _rss_kib()
    del candidates  # as stage._run does once the parts are in
    t = time.perf_counter()
    outcome = decide(cols, DecideSettings(), Outputs(out, PARKED, "pad"))
    decide_s = time.perf_counter() - t
    decided = _rss_kib()
    t = time.perf_counter()
    cfg = CleanConfig(input=Path("/raw"), output=out, executor="ray")
    report = _finalize(cfg, cols, outcome.decisions, Journal(out), {}, {})
    manifest_s = time.perf_counter() - t
    print(json.dumps({"rows": n, "listing_s": listing_s, "plan_s": plan_s, "gather_s": gather_s, "decide_s": decide_s,
                      "manifest_s": manifest_s, "base_kib": base, "listed_kib": listed, "gathered_kib": gathered,
                      "decided_kib": decided, "peak_kib": _rss_kib(), "by_status": report["by_status"]}))


def driver(sizes: list[int], part_files: int) -> None:
    rows = []
    for n in sizes:
        work = Path(tempfile.mkdtemp(prefix="scale-driver-"))
        try:
            t = time.perf_counter()
            synthetic_parts(work, n, part_files)
            made = time.perf_counter() - t
            mb = sum(p.stat().st_size for p in (work / ".pipe" / "parts").iterdir()) / 1e6
            cmd = [sys.executable, __file__, "--driver-child", str(work), "--rows", str(n), "--part-files", str(part_files)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"the driver child failed: {p.stderr[-3000:]}")
            r = json.loads(p.stdout.strip().splitlines()[-1])
            rows.append(r)
            mib = lambda k, r=r: f"{r[k] / 1024:.0f}"  # noqa: E731
            print(f"{n:>10} rows ({mb:.0f} MB of part files, made in {made:.0f} s): listing {r['listing_s']:.1f} s, "
                  f"plan {r['plan_s']:.1f} s, gather {r['gather_s']:.1f} s, decide {r['decide_s']:.1f} s, "
                  f"finalize {r['manifest_s']:.1f} s; RSS MiB: imports {mib('base_kib')}, listed {mib('listed_kib')}, "
                  f"gathered {mib('gathered_kib')}, decided {mib('decided_kib')}, peak {mib('peak_kib')} "
                  f"({(r['peak_kib'] - r['base_kib']) * 1024 / n:.0f} B/row over the imports), {r['by_status']}", flush=True)
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
    ap.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.driver_child:
        driver_child(a.driver_child, a.rows, a.part_files)
    elif a.driver:
        driver(a.driver, 1000)
    else:
        whole_runs(400 if a.quick else a.files, 1 if a.quick else a.repeat, a.part_files)


if __name__ == "__main__":
    main()
