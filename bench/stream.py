"""The streaming reader over a loopback S3 server against the same shards on local disk, one run.

The same SHARD_DIR (`bench/loader.py`'s data: seeded 512x512 JPEGs through `pipe clean` and
`pipe shard`) is read twice per round: from local disk (page cache warm) and from a real
`rclone serve s3` on 127.0.0.4 holding the same objects (tests/s3server.py's server, listing
cache on). Two measurements, each as samples/s and the S3 / local ratio:

1. Training's view, what issue 11's target is about (the reader's samples/s as `pipe train` gets
   them; target >= 0.8): `ShardReader` batches through `make_loader` with ``--workers`` forked,
   persistent dataloader workers, images decoded at ``--image-size`` (as `pipe train` decodes
   for a 64 px built-in model); ``--epochs`` epochs timed after a first one (worker start-up and
   each worker's S3 client are paid once per run, as in training).
2. Bytes only, a diagnostic: `SampleReader.samples` in this process, no decode, ``--passes``
   epochs: the reader's own cost (merged ranged GETs of up to 8 MiB, 4 in flight) with nothing
   to hide it. Local bytes are mapped from the page cache, never copied; every S3 byte is served
   by rclone and copied through HTTP on the same cores, so this ratio says how much the transport
   costs, not what training sees (it was printed against the target until 2026-12-02: 0.20-0.21
   on a quiet machine).

Rounds alternate local and S3; the fastest of ``--repeats`` counts for each. The machine this was
written on has 2 cores shared with other jobs: compare ratios within one run, never absolutes.

    python bench/stream.py --quick      # a sanity run (300 images, 1 repeat)
    python bench/stream.py              # 1500 images, 3 repeats
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # first: bench/train.py would shadow the train package


def _loader_module():
    """bench/loader.py (this script's folder is on sys.path, after the repo: see above), whose
    data this bench reads; imported by its plain name so its pool's workers can find it."""
    import loader

    return loader


def start_server(work: Path):
    """rclone serve s3 on loopback (`tests.s3server`'s, as the tests start it)."""
    from tests import s3server

    return s3server.start_rclone(work)


def upload(server, shards: Path, bucket: str, prefix: str) -> str:
    client = server.client()
    server.make_bucket(bucket)
    for p in sorted(x for x in shards.iterdir() if x.is_file()):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{p.name}", Body=p.read_bytes())
    return f"s3://{bucket}/{prefix}"


def decoded(where: str, batch: int, workers: int, image_size: int, seed: int, epochs: int) -> tuple[int, float]:
    """Samples and seconds of ``epochs`` epochs after a first, unmeasured one: persistent workers,
    as `pipe train` runs them, so starting a worker (and its S3 client) is paid once per run,
    not counted per epoch."""
    from train.data.reader import ShardReader, close_loader, make_loader

    reader = ShardReader(where, "train", 0, 1, batch_size=batch, seed=seed, fields=("image",), image_size=image_size)
    loader = make_loader(reader, workers, persistent_workers=True)
    try:
        reader.set_epoch(0)
        sum(len(b["key"]) for b in loader)
        t = time.perf_counter()
        n = 0
        for e in range(1, epochs + 1):
            reader.set_epoch(e)
            n += sum(len(b["key"]) for b in loader)
        return n, time.perf_counter() - t
    finally:
        close_loader(loader)


def raw(where: str, batch: int, passes: int, seed: int) -> tuple[int, float]:
    from train.data.stream import SampleReader

    reader = SampleReader(where, "train", 0, 1, batch_size=batch, seed=seed)
    t = time.perf_counter()
    n = sum(1 for e in range(passes) for _ in reader.samples(e))
    return n, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="300 images, 1 repeat")
    ap.add_argument("--images", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2, help="measured epochs of decoded batches (after one unmeasured)")
    ap.add_argument("--passes", type=int, default=3, help="epochs of the bytes-only measurement")
    ap.add_argument("--max-count", type=int, default=250, help="pipe shard --max-count")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="build (or reuse) the data here")
    a = ap.parse_args()
    if a.quick:
        a.images, a.repeats, a.max_count = 300, 1, 60
    loader = _loader_module()
    work = a.keep or Path(tempfile.mkdtemp(prefix="bench-stream-"))
    work.mkdir(parents=True, exist_ok=True)
    _, shards = loader.build(work, a.images, 10, 0, 2, a.max_count)
    loader.warm(loader.train_shards(shards))
    server = start_server(Path(tempfile.mkdtemp(prefix="bench-rclone-")))
    try:
        os.environ.update(server.env)
        url = upload(server, shards, "bench-stream", "shards")
        size = json.loads((shards / "index.json").read_text())["shards"]
        print(f"{a.images} images, {len(size)} shards, {sum(s['bytes'] for s in size) / 1e6:.0f} MB; "
              f"S3: rclone serve s3 on {server.endpoint}; load {os.getloadavg()[0]:.1f}")
        decoded_name = f"decoded batches (ShardReader, {a.workers} persistent workers, {a.image_size} px, {a.epochs} epochs after one)"
        for name, fn, target in ((decoded_name, lambda w: decoded(w, a.batch_size, a.workers, a.image_size, 0, a.epochs),
                                  "target >= 0.8"),
                                 (f"bytes only (SampleReader.samples, {a.passes} epochs)",
                                  lambda w: raw(w, a.batch_size, a.passes, 0), "diagnostic: the transport's cost")):
            best: dict[str, float] = {}
            counts = set()
            for _ in range(a.repeats):
                for side, where in (("local", str(shards)), ("s3", url)):
                    n, seconds = fn(where)
                    counts.add(n)
                    best[side] = max(best.get(side, 0.0), n / seconds)
            assert len(counts) == 1, counts  # the same samples from both
            print(f"{name}: local {best['local']:,.0f} samples/s, S3 {best['s3']:,.0f} samples/s, "
                  f"S3/local {best['s3'] / best['local']:.2f} ({target})")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
