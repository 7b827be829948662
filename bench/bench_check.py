"""pipe check's two costly steps, ours vs the naive way, same data, same run, as ratios.

1. Train/val leakage over 64-bit perceptual hashes: naive = every val hash against every train
   hash (numpy, blocked XOR + popcount); ours = `leakage.near_image_pairs` (pigeonhole ranges).
2. Manifest schema validation: naive = jsonschema on every row; ours = `validate.each_error`
   (compiled fastjsonschema filter, jsonschema only for rejected rows).

    python bench/bench_check.py [--train 200000] [--val 20000] [--rows 20000] [--distance 4]
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np


def naive_pairs(train: list[int], val: list[int], d: int, block: int = 256) -> list[tuple[int, int, int]]:
    t = np.array(train, dtype=np.uint64)
    out = []
    for lo in range(0, len(val), block):
        v = np.array(val[lo : lo + block], dtype=np.uint64)
        dist = np.bitwise_count(v[:, None] ^ t[None, :])
        best = dist.argmin(axis=1)
        for r, i in enumerate(best):
            if dist[r, i] <= d:
                out.append((lo + r, int(i), int(dist[r, i])))
    return out


def bench_leakage(n_train: int, n_val: int, d: int) -> None:
    from pipeline.check.leakage import near_image_pairs

    rng = random.Random(0)
    train = [rng.getrandbits(64) for _ in range(n_train)]
    val = [rng.getrandbits(64) for _ in range(n_val)]
    for k in range(0, n_val, 100):  # plant a near duplicate in every hundredth val sample
        val[k] = train[rng.randrange(n_train)] ^ (1 << rng.randrange(64)) ^ (1 << rng.randrange(64))
    t = time.perf_counter()
    naive = naive_pairs(train, val, d)
    t_naive = time.perf_counter() - t
    t = time.perf_counter()
    ours = near_image_pairs(train, val, d)
    t_ours = time.perf_counter() - t
    assert {(j, dist) for j, _, dist in ours} == {(j, dist) for j, _, dist in naive}, "results differ"
    print(f"leakage  {n_train} train x {n_val} val, d={d}: naive {t_naive:.2f} s, ours {t_ours:.3f} s, "
          f"{t_naive / t_ours:.0f}x faster, {len(ours)} leaks found by both")


def bench_validation(n_rows: int) -> None:
    from pipeline.check.validate import each_error
    from pipeline.core import schemas

    row = {"source": "cats/a.jpg", "key": "cats__a", "kind": "image", "label": "cats", "status": "kept", "reason": None,
           "detail": "", "duplicate_of": None, "output": "data/cats/cats__a.jpg", "bytes": 1234, "sha256": "a" * 64,
           "width": 640, "height": 480, "encoding": None, "encoding_confidence": None, "content_hash": "f" * 32,
           "phash": "0123456789abcdef", "caption": ""}
    assert not list(schemas.errors(row, "manifest_row")), "the bench's row no longer fits the schema: fix the row"
    rows = [{**row, "source": f"cats/{i}.jpg", "bytes": i} for i in range(n_rows)]
    rows[n_rows // 2]["sha256"] = "bad"
    t = time.perf_counter()
    naive = [(i, e) for i, r in enumerate(rows) for e in schemas.errors(r, "manifest_row")]
    t_naive = time.perf_counter() - t
    t = time.perf_counter()
    ours = list(each_error(rows, "manifest_row"))
    t_ours = time.perf_counter() - t
    assert ours == naive, "results differ"
    print(f"validate {n_rows} manifest rows: jsonschema {t_naive:.2f} s, ours {t_ours:.2f} s, "
          f"{t_naive / t_ours:.1f}x faster, {len(ours)} error(s) found by both")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", type=int, default=200_000)
    ap.add_argument("--val", type=int, default=20_000)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--distance", type=int, default=4)
    a = ap.parse_args()
    bench_leakage(a.train, a.val, a.distance)
    bench_validation(a.rows)
