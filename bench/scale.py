"""`--executor ray` against the local pool, and what the driver needs as runs grow.

1. whole runs (default): `pipe clean` + `pipe shard` of the same few thousand generated files,
   local with `--workers 2` against Ray with two one-CPU nodes on this machine (tests/raycluster.py:
   a real cluster, loopback only). Each pair of runs is timed back to back, as whole processes;
   Ray's throughput relative to local is local seconds / Ray seconds (the engine's overhead).
   Per command: wall, CPU of the driver (and what it waited for) and of the cluster's processes
   (`ClusterCPU`; the idle cluster's own daemons show in the local runs' figure), the stage's timings.
   First, the fixed cost per command, read directly: clean and shard of `FIXED_FILES` files, each
   round Ray cold (its warm workers ended first, as after `--ray-keep-warm` seconds idle: clean
   starts them, shard finds them), Ray warm (a second clean + shard) and local, rounds interleaved.
   Then two sizes by default, 2000 and 5000 files, on the warm workers the first part left (as the
   commands of one pipeline run after its first): each way's seconds per 1000 files and its fixed
   seconds per clean + shard come from the two sizes too.
2. driver (`--driver N [N ...]`): N synthetic rows written as part results files (Arrow IPC,
   as the tasks write them), then, in a fresh process each, what the driver does with them, with
   its own functions: hold the listing, gather (each part's decide columns), decide (exact +
   near duplicates, label conflicts) and the manifest, timed, with the peak RSS after each step.
   Memory per file is the slope between two sizes.

    .venv/bin/python bench/scale.py [--files 2000 5000] [--repeat 2] [--quick]
    .venv/bin/python bench/scale.py --files --repeat 4     # the fixed cost per command alone
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
import threading
import time
from dataclasses import dataclass
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


class ClusterCPU:
    """CPU seconds (user + system) of the cluster's processes while a command runs: every process
    in the cluster's network namespace outside this bench's session (the drivers run in it, and are
    counted as this process's children instead), polled every 0.2 s, so a process that ends
    between two polls loses at most that much. Nodes, raylets, GCS, Ray workers, their pools."""

    def __init__(self, cluster):
        self.net = os.readlink(f"/proc/{cluster.ns.holder.pid}/ns/net")
        self.session = os.getsid(0)
        self.seen: dict[tuple[str, str], int] = {}
        self.stop = threading.Event()
        self._poll()
        self.base = dict(self.seen)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{pid}/ns/net") != self.net:
                    continue
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, ValueError):
                continue
            if int(stat[3]) != self.session:
                self.seen[(pid, stat[19])] = int(stat[11]) + int(stat[12])  # utime + stime, by (pid, start)

    def _loop(self) -> None:
        while not self.stop.wait(0.2):
            self._poll()

    def seconds(self) -> float:
        self.stop.set()
        self.thread.join()
        self._poll()
        return sum(v - self.base.get(k, 0) for k, v in self.seen.items()) / os.sysconf("SC_CLK_TCK")


@dataclass
class Timed:
    wall: float
    cpu: float  # the driver and the processes it waited for (a local run's pool)
    cluster_cpu: float
    timings: dict


def timed(cmd: list, cluster) -> Timed:
    """Run ``pipe CMD --json`` to the end in the cluster's namespace: wall, CPU, the stage's timings."""
    cpu = _children_cpu()
    watch = ClusterCPU(cluster)
    t = time.perf_counter()
    p = cluster.pipe(cmd)
    wall = time.perf_counter() - t
    cluster_cpu = watch.seconds()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed: {p.stderr[-2000:]}")
    return Timed(wall, _children_cpu() - cpu, cluster_cpu, json.loads(p.stdout).get("timings", {}))


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def whole_runs(sizes: list[int], repeat: int, part_files: int) -> None:
    from tests.raycluster import start_cluster

    work = Path(tempfile.mkdtemp(prefix="scale-"))
    try:
        t = time.perf_counter()
        cluster = start_cluster()
        print(f"cluster of 2 one-CPU nodes up in {time.perf_counter() - t:.0f} s (not counted)")
        try:
            fixed_costs(work, repeat, cluster)
            means = {n: _runs_of(work, n, repeat, part_files, cluster) for n in sizes}
        finally:
            cluster.stop()
        _fixed_and_per_file(means)
    finally:
        shutil.rmtree(work, ignore_errors=True)


FIXED_FILES = 20  # files in the runs that show each command's fixed cost (their work is a few tens of ms)


def fixed_costs(work: Path, repeat: int, cluster) -> None:
    """Each command's wall on `FIXED_FILES` files: Ray cold (no warm workers: clean starts them,
    shard finds them), Ray warm, local; ``repeat`` rounds interleaved, then the means."""
    raw = work / "raw-fixed"
    make_input(raw, FIXED_FILES)
    ray_args = ["--executor", "ray", "--ray-address", cluster.address]
    walls: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}  # driver + cluster: what a loaded machine's wall hides
    for k in range(repeat):
        out = work / f"fixed{k}"
        ended = end_warm(cluster)
        runs = {}
        for way, extra in (("ray cold", ray_args), ("ray warm", ray_args), ("local", ["--workers", "2"])):
            runs[f"{way} clean"] = timed(["clean", raw, "-o", out / f"{way}-c", "--json", *extra], cluster)
            shard_extra = extra if extra is ray_args else []
            runs[f"{way} shard"] = timed(["shard", out / f"{way}-c", "-o", out / f"{way}-s", "--json", *shard_extra], cluster)
        for name, r in runs.items():
            walls.setdefault(name, []).append(r.wall)
            cpus.setdefault(name, []).append(r.cpu + r.cluster_cpu)
        print(f"fixed round {k} ({ended} warm workers ended first): "
              + ", ".join(f"{name} {r.wall:.2f} s (CPU {r.cpu + r.cluster_cpu:.2f})" for name, r in runs.items())
              + f"; load {os.getloadavg()[0]:.1f}")
        shutil.rmtree(out)
    mean = {name: sum(v) / len(v) for name, v in walls.items()}
    cpu = {name: sum(v) / len(v) for name, v in cpus.items()}
    print(f"fixed seconds per command ({FIXED_FILES} files, mean of {repeat}): "
          + ", ".join(f"{name} {v:.2f} (CPU {cpu[name]:.2f})" for name, v in mean.items()))
    for way in ("ray cold", "ray warm"):
        extra = [mean[f"{way} {c}"] - mean[f"local {c}"] for c in ("clean", "shard")]
        extra_cpu = [cpu[f"{way} {c}"] - cpu[f"local {c}"] for c in ("clean", "shard")]
        print(f"  {way} beyond local: clean +{extra[0]:.2f} s (CPU +{extra_cpu[0]:.2f}), shard +{extra[1]:.2f} s "
              f"(CPU +{extra_cpu[1]:.2f}); target: Ray's fixed cost <= 3 s a command")


def end_warm(cluster) -> int:
    """End the cluster's warm workers (from a driver in its namespace); how many there were."""
    code = "import sys; from pipeline.executors.ray import end_warm; print(end_warm(sys.argv[1]))"
    p = cluster.ns.run([sys.executable, "-c", code, cluster.address], env=cluster.env, cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    if p.returncode != 0:
        raise SystemExit(f"could not end the warm workers: {p.stderr[-2000:]}")
    time.sleep(1)  # their processes end
    return int(p.stdout.split()[-1])


def _runs_of(work: Path, files: int, repeat: int, part_files: int, cluster) -> tuple[float, float]:
    """``repeat`` pairs of whole runs on ``files`` generated files; the mean seconds (local, Ray)."""
    raw = work / f"raw{files}"
    make_input(raw, files)
    print(f"input: {files} files, {sum(p.stat().st_size for p in raw.rglob('*') if p.is_file()) / 1e6:.0f} MB")
    ratios, cpu_ratios, locals_, rays = [], [], [], []
    for k in range(repeat):
        out = work / f"run{k}"
        ray_args = ["--executor", "ray", "--ray-address", cluster.address]
        runs = {"local clean": timed(["clean", raw, "-o", out / "lc", "--workers", "2", "--json"], cluster),
                "local shard": timed(["shard", out / "lc", "-o", out / "ls", "--json"], cluster),
                "ray clean": timed(["clean", raw, "-o", out / "rc", "--part-files", part_files, "--json",
                                    *ray_args], cluster),
                "ray shard": timed(["shard", out / "rc", "-o", out / "rs", "--json", *ray_args], cluster)}
        for name, r in runs.items():
            print(f"  {name}: {r.wall:.1f} s, CPU {r.cpu:.1f} s driver + {r.cluster_cpu:.1f} s cluster; "
                  f"{', '.join(f'{key} {v:.2f}' for key, v in r.timings.items())}")
        local = runs["local clean"].wall + runs["local shard"].wall
        ray = runs["ray clean"].wall + runs["ray shard"].wall
        same = _same(out / "ls", out / "rs")
        # CPU of each way (driver + cluster, idle daemons included on both sides): on a loaded machine the
        # cluster's processes (sessions of their own) get a larger share of the cores than the local pool,
        # so the wall ratio flatters Ray there; this one does not depend on who got the cores
        cpu = {way: sum(runs[f"{way} {c}"].cpu + runs[f"{way} {c}"].cluster_cpu for c in ("clean", "shard"))
               for way in ("local", "ray")}
        cpu_ratios.append(cpu["local"] / cpu["ray"])
        ratios.append(local / ray)
        locals_.append(local)
        rays.append(ray)
        print(f"run {k}: local {local:.1f} s ({files / local:.0f} files/s), ray {ray:.1f} s ({files / ray:.0f} files/s), "
              f"ray/local throughput {local / ray:.2f}, CPU local/ray {cpu_ratios[-1]:.2f}, shards identical: {same}, "
              f"load {os.getloadavg()[0]:.1f}")
        shutil.rmtree(out)
    print(f"{files} files: ray/local throughput: {', '.join(f'{r:.2f}' for r in ratios)} (target >= 0.8); "
          f"CPU local/ray: {', '.join(f'{r:.2f}' for r in cpu_ratios)}")
    return sum(locals_) / repeat, sum(rays) / repeat


def _fixed_and_per_file(means: dict[int, tuple[float, float]]) -> None:
    """What the ratios are made of, from the smallest and the largest size: each way's seconds per
    1000 files and its fixed seconds per clean + shard pair (a straight line through the two)."""
    if len(means) < 2:
        return
    (n1, (l1, r1)), (n2, (l2, r2)) = min(means.items()), max(means.items())
    per_l, per_r = (l2 - l1) / (n2 - n1), (r2 - r1) / (n2 - n1)
    print(f"per 1000 files: local {1000 * per_l:.1f} s, ray {1000 * per_r:.1f} s (throughput ratio {per_l / per_r:.2f}); "
          f"fixed per clean + shard: local {l1 - per_l * n1:.1f} s, ray {r1 - per_r * n1:.1f} s")


def _same(a: Path, b: Path) -> bool:
    files = lambda d: {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}  # noqa: E731
    return files(a) == files(b)


# ---------------------------------------------------------------- 2. the driver


SETTINGS = {"size": 256}  # the part fingerprints' settings (any: the names only have to match the plan)


def listing_order(n: int):
    """The synthetic files' numbers in listing order (sorted by path: class0, class1, class10, ...)."""
    for c in sorted(range(min(n, 100)), key=lambda c: f"class{c}"):
        yield from range(c, n, 100)


def synthetic_candidate(i: int):
    """The i-th file of the synthetic listing, as discovery makes it (keys and labels are the listing's)."""
    from pipeline.clean.discover import Candidate
    from pipeline.formats.vocabulary import Kind

    source = f"class{i % 100}/f{i:09d}.jpg"
    return Candidate(source, f"/raw/{source}", Kind.IMAGE, "jpeg")


def synthetic_parts(clean_dir: Path, n: int, part_files: int) -> None:
    """n image rows as a finished run's part results files (one row in 50 an exact copy of another
    under another label), in `parts.write_results`' format (`RESULTS`, `FORMAT`). Made with
    Arrow compute a column at a time: FileResult objects made ten million rows in over an hour.
    Named with a dummy fingerprint: the child takes the parts from the folder, not from a plan."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.clean.columns import RESULTS
    from pipeline.clean.parts import FORMAT
    from pipeline.executors import parts as partlib

    rng = np.random.default_rng(n)
    folder = clean_dir / partlib.PARTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    order = np.fromiter(listing_order(n), dtype=np.int64, count=n)  # file number of each row
    for index, (b, e) in enumerate(partlib.cut(n, part_files)):
        m = e - b
        i = order[b:e]
        stem = pc.binary_join_element_wise("f", pc.utf8_lpad(pc.cast(pa.array(i), pa.string()), width=9, padding="0"), "")
        label = pc.binary_join_element_wise("class", pc.cast(pa.array(i % 100), pa.string()), "")
        source = pc.binary_join_element_wise(label, "/", stem, ".jpg", "")
        key = pc.binary_join_element_wise(label, "__", stem, "")  # the listing's key (`keys.slug`)
        raw = rng.bytes(32 * m)
        twin = np.where(i % 50 == 49, i - 1, i).tolist()

        def lists(a: int, b_: int, c: int, i=i, m=m) -> pa.Array:  # per channel: i * a, i * b_, i * c
            return pa.ListArray.from_arrays(np.arange(0, 3 * m + 1, 3, dtype=np.int32),
                                            pa.array(np.stack([i * a, i * b_, i * c], axis=1).ravel()))

        cols = {name: pa.nulls(m, RESULTS.field(name).type) for name in RESULTS.names}
        cols.update(
            source=source, key=key, kind=pa.array(["image"] * m), label=label, bytes=pa.array(50_000 + i % 1000),
            sha256=pa.array([raw[k:k + 32].hex() for k in range(0, 32 * m, 32)]),
            mtime_ns=pa.array(1_700_000_000 * 10**9 + i), ctime_ns=pa.array(1_700_000_000 * 10**9 + i),
            detail=pa.array([""] * m), width=pa.array(np.full(m, 640)), height=pa.array(np.full(m, 480)),
            content_hash=pa.array([f"{t:032x}" for t in twin]), phash=pa.array(rng.integers(0, 2**64, m, dtype=np.uint64)),
            output=pc.binary_join_element_wise("data/", source, ""), output_bytes=pa.array(np.full(m, 20_000)),
            notes=pa.array([[]] * m, pa.list_(pa.string())), output_width=pa.array(np.full(m, 256)),
            output_height=pa.array(np.full(m, 256)), pixel_sums=lists(3, 5, 7), pixel_squares=lists(11, 13, 17))
        table = pa.table(cols, schema=RESULTS).replace_schema_metadata(FORMAT)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        (folder / partlib.Part(index, b, e, "0" * 64).name).write_bytes(sink.getvalue().to_pybytes())


def _rss_kib() -> int:
    """This process's peak RSS: its memory's high-water mark (VmHWM). Not `ru_maxrss`, which a
    child keeps from its parent across exec: the 10M child started at the 188 MiB the parent
    had used making the part files, which the bytes a row over the imports then left out."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def driver_child(clean_dir: str, n: int, part_files: int) -> None:
    """What the driver of `pipe clean --executor ray` does around the parts, with its own
    functions: the listing (candidates handed over a batch at a time as discovery makes them, to
    the listing file on the driver's disk: `ListingWriter`), gather each part's compact columns,
    decide, and write the manifest and report from each part's whole results read back
    (`_finalize` without its per-file moves and journal, as before this bench's rows). Prints one
    JSON line a step, so a long run shows where it is and what it holds."""
    from pipeline.clean import parts
    from pipeline.clean.columns import manifest_table
    from pipeline.clean.decide import DecideSettings, Outputs, decide
    from pipeline.clean.listing import ListingWriter
    from pipeline.clean.report import ReportBuilder
    from pipeline.clean.stage import PARKED
    from pipeline.executors import parts as partlib
    from pipeline.formats.manifest import ManifestWriter
    from pipeline.storage import open_folder

    out = Path(clean_dir)
    step = {"rows": n, "base_kib": _rss_kib()}

    def done(name: str, t: float) -> None:
        step[f"{name}_s"] = time.perf_counter() - t
        step[f"{name}_kib"] = _rss_kib()
        print(json.dumps(step), flush=True)

    t = time.perf_counter()
    writer = ListingWriter(out)
    for i in listing_order(n):
        writer.add(synthetic_candidate(i))
    listing = writer.finish()
    done("listing", t)
    t = time.perf_counter()
    plan = [partlib.Part(i, b, e, "0" * 64) for i, (b, e) in enumerate(partlib.cut(n, part_files))]
    gathered = parts.gatherer(open_folder(out), plan, listing, out)
    if not all(parts.gather(out, p, listing, gathered) for p in plan):
        raise SystemExit("a part's results file is missing or unreadable")
    cols = gathered.finish()
    listing.close()  # as stage._run does once the parts are in
    done("gather", t)
    t = time.perf_counter()
    outcome = decide(cols, DecideSettings(), Outputs(open_folder(out), PARKED, "pad"))
    done("decide", t)
    t = time.perf_counter()
    report, manifest, offset = ReportBuilder(), ManifestWriter(out / "manifest.parquet"), 0
    twins = outcome.decisions.twins()
    for chunk in cols.chunks():
        rows = manifest_table(chunk, offset, cols, outcome.decisions, {}, twins)
        report.add_table(rows)
        manifest.add_table(rows)
        offset += chunk.num_rows
    manifest.close()
    step["by_status"] = report.build({}, {})["by_status"]
    step["label_conflicts"] = len(outcome.label_conflicts)
    done("manifest", t)


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
            print(f"{n:>10} rows: {mb:.0f} MB of part files, made in {made:.0f} s", flush=True)
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as child:
                assert child.stdout is not None
                for line in child.stdout:  # a line a step: see where a long run is
                    r = json.loads(line)
                    last = [k[:-2] for k in r if k.endswith("_s")][-1]
                    print(f"{n:>10} rows: {last} {r[last + '_s']:.1f} s, peak RSS so far {r[last + '_kib'] / 1024:.0f} MiB "
                          f"({(r[last + '_kib'] - r['base_kib']) * 1024 / n:.0f} B/row over the imports)", flush=True)
            if child.returncode != 0:
                raise SystemExit(f"the driver child failed ({child.returncode})")
            rows.append(r)
            print(f"{n:>10} rows: gather {r['gather_s']:.1f} s, decide {r['decide_s']:.1f} s, manifest {r['manifest_s']:.1f} s, "
                  f"peak RSS {r['manifest_kib'] / 1024:.0f} MiB, {r['by_status']}", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    for a, b in zip(rows, rows[1:]):
        slope = (b["manifest_kib"] - a["manifest_kib"]) * 1024 / (b["rows"] - a["rows"])
        print(f"driver memory per file between {a['rows']} and {b['rows']} rows: {slope:.0f} B")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, nargs="*", default=[2000, 5000],
                    help="input sizes, each measured (two or more: the fixed and per-file costs too; none: only "
                         "the fixed cost per command)")
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
        whole_runs([400] if a.quick else a.files, 1 if a.quick else a.repeat, a.part_files)


if __name__ == "__main__":
    main()
