"""Our boto3 Folder (`pipeline/storage/s3.py`) against the fsspec/s3fs prototype behind the same
interface (`pipeline/storage/fsspec_s3.py`), on one loopback `rclone serve s3` (tests/s3server.py).

What the stages ask of object storage, each timed on both, in rounds that alternate the two
(the best of ``--repeats`` counts; the machine this was written on has 2 cores shared with other
jobs: compare the ratios within one run, never absolutes):

* ranged reads as `pipe train` makes them: 8 MiB ranges of a 64 MiB object, one at a time and 4 in
  flight (the reader's merged reads and prefetch);
* heads: the first 1 KiB of many small objects (`pipe clean` discovering an s3:// INPUT);
* small writes and whole reads of them (cleaned outputs, part results);
* a listing of every object (a rerun's reuse check, `pipe check`);
* a conditional create (the commit) and a process's first call (import and client).

s3fs needs a botocore older than the one pipe installs, so run this in an environment where both
import, e.g. ``pip install --target /tmp/s3fs s3fs boto3`` and ``PYTHONPATH=.:/tmp/s3fs``:

    PYTHONPATH=.:/tmp/s3fs python bench/storage.py --quick   # fewer objects, 1 repeat
    PYTHONPATH=.:/tmp/s3fs python bench/storage.py           # 3 repeats
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BACKENDS = {"boto3": "pipeline.storage.s3:S3Folder", "fsspec": "pipeline.storage.fsspec_s3:FsspecS3Folder"}
MiB = 1 << 20


def folder(backend: str, url: str):
    import importlib

    module, _, name = BACKENDS[backend].partition(":")
    return getattr(importlib.import_module(module), name).from_url(url)


def ranged(f, big: str, ahead: int) -> float:
    """MB/s reading the object in 8 MiB ranges, ``ahead`` at a time."""
    size = 64 * MiB
    starts = list(range(0, size, 8 * MiB))
    t = time.perf_counter()
    if ahead <= 1:
        got = sum(len(f.read_range(big, s, 8 * MiB)) for s in starts)
    else:
        with ThreadPoolExecutor(ahead) as pool:
            got = sum(len(b) for b in pool.map(lambda s: f.read_range(big, s, 8 * MiB), starts))
    assert got == size
    return size / 1e6 / (time.perf_counter() - t)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def first_call(backend: str, url: str, env: dict) -> float:
    """Seconds for a fresh interpreter to import the backend and list a prefix (its first call)."""
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); t = time.perf_counter(); "
            f"sys.path.insert(0, {str(ROOT / 'bench')!r}); import storage; storage.folder({backend!r}, {url!r}).list(); "
            "print(time.perf_counter() - t)")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(p.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200 small objects, 1 repeat")
    ap.add_argument("--objects", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if a.quick:
        a.objects, a.repeats = 200, 1
    from tests import s3server

    backends = [b for b in BACKENDS if b == "boto3" or _imports("s3fs")]
    server = s3server.start_rclone(Path(tempfile.mkdtemp(prefix="bench-storage-")))
    try:
        os.environ.update(server.env)
        base = server.make_bucket("bench-storage")
        seed = folder("boto3", base)
        seed.write("big.bin", os.urandom(64 * MiB))
        best: dict[tuple[str, str], float] = {}

        def keep(backend: str, what: str, value: float, higher: bool) -> None:
            old = best.get((backend, what))
            best[(backend, what)] = value if old is None else (max(old, value) if higher else min(old, value))

        print(f"rclone serve s3 on {server.endpoint}; {a.objects} small objects; load {os.getloadavg()[0]:.1f}")
        for r in range(a.repeats):
            for backend in backends:
                f = folder(backend, f"{base}/{backend}-{r}")
                data = os.urandom(4096)
                rels = [f"small/{i:06d}" for i in range(a.objects)]
                keep(backend, "write 4 KiB (objects/s)", a.objects / timed(
                    lambda f=f, data=data, rels=rels: [f.write(rel, data) for rel in rels]), True)
                keep(backend, "read whole 4 KiB (objects/s)", a.objects / timed(
                    lambda f=f, rels=rels: [f.read(rel) for rel in rels]), True)
                keep(backend, "heads of 1 KiB, read_heads (objects/s)", a.objects / timed(
                    lambda f=f, rels=rels: list(f.read_heads(rels, 1024))), True)
                keep(backend, "list (objects/s)", a.objects / timed(f.list), True)
                keep(backend, "commit, write_if_absent (ms)", 1000 * timed(lambda f=f: f.write_if_absent("commit", b"x")), False)
                whole = folder(backend, base)
                keep(backend, "8 MiB ranges, 1 in flight (MB/s)", ranged(whole, "big.bin", 1), True)
                keep(backend, "8 MiB ranges, 4 in flight (MB/s)", ranged(whole, "big.bin", 4), True)
                keep(backend, "fresh process: import + first list (s)", first_call(backend, f"{base}/{backend}-{r}",
                                                                                   dict(os.environ)), False)
        whats = list(dict.fromkeys(w for _, w in best))
        for what in whats:
            line = ", ".join(f"{b} {best[(b, what)]:,.2f}" for b in backends)
            ratio = (f"; fsspec/boto3 {best[('fsspec', what)] / best[('boto3', what)]:.2f}" if "fsspec" in backends else "")
            print(f"{what}: {line}{ratio}")
        if "fsspec" not in backends:
            print("s3fs is not importable here: only boto3 was measured (see the docstring)")
    finally:
        server.stop()


def _imports(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    main()
