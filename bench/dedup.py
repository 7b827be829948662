"""Near-duplicate search over 64-bit perceptual hashes: our multi-index hashing against
comparing all pairs, and how time and memory grow with the number of hashes.

The hashes are like phash (exactly 32 of 64 bits set, so distances are even), with 1% planted
near copies 2-10 bits away. Each size runs in its own process so memory is measured cleanly:
time of `near_images.candidate_pairs` and the peak memory it allocates (tracemalloc, which
numpy reports to), per hash. All-pairs runs on the smallest size only, and both must find the
same pairs. The growth exponent is the slope of log(time) over log(n) from the smallest to the
largest size (1.0 is linear; all-pairs is 2.0).

    python bench/dedup.py              # 10k, 100k, 1M hashes
    python bench/dedup.py --quick      # 10k, 30k, 100k
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
MAX_DISTANCE = 8  # the default --near-image-distance


def make_hashes(n: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    out = np.empty(n, dtype=np.uint64)
    block = 200_000
    for start in range(0, n, block):  # in blocks: a bit matrix of a million rows is 64 MB
        m = min(block, n - start)
        bits = np.zeros((m, 64), dtype=bool)
        np.put_along_axis(bits, np.argsort(rng.random((m, 64)), axis=1)[:, :32], True, axis=1)
        out[start:start + m] = np.packbits(bits, axis=1).view(">u8").ravel()
    copies = max(1, n // 100)
    src = rng.integers(0, n - copies, copies)
    for t, s in zip(range(n - copies, n), src):  # near copies: swap f ones with f zeros
        h = int(out[s])
        ones = [b for b in range(64) if h >> b & 1]
        zeros = [b for b in range(64) if not h >> b & 1]
        f = int(rng.integers(1, 6))
        for b in rng.choice(ones, f, replace=False):
            h &= ~(1 << int(b))
        for b in rng.choice(zeros, f, replace=False):
            h |= 1 << int(b)
        out[t] = h
    return out


def worker(n: int, naive: bool) -> None:
    import tracemalloc

    from pipeline.similarity.near_images import all_pairs, candidate_pairs

    h = make_hashes(n)
    tracemalloc.start()
    t0 = time.perf_counter()
    pairs = candidate_pairs(h, MAX_DISTANCE)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    res = {"n": n, "seconds": seconds, "peak_bytes": peak, "pairs": len(pairs)}
    if naive:
        t0 = time.perf_counter()
        ref = all_pairs(h, MAX_DISTANCE)
        res["naive_seconds"] = time.perf_counter() - t0
        res["same_pairs"] = bool(len(ref) == len(pairs) and (ref == pairs).all())
    print(json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10k, 30k, 100k instead of 10k, 100k, 1M")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(int(args.worker[0]), args.worker[1] == "1")
        return
    sizes = [10_000, 30_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    rows = []
    for i, n in enumerate(sizes):
        proc = subprocess.run([sys.executable, __file__, "--worker", str(n), "1" if i == 0 else "0"], check=True,
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"near-duplicate search, Hamming distance <= {MAX_DISTANCE}, 64-bit hashes, 1% planted near copies")
    print(f"{'hashes':>10}{'seconds':>10}{'pairs':>9}{'peak MB':>10}{'bytes/hash':>12}")
    for r in rows:
        print(f"{r['n']:>10,}{r['seconds']:>10.2f}{r['pairs']:>9,}{r['peak_bytes'] / 1e6:>10.1f}{r['peak_bytes'] / r['n']:>12.0f}")
    first, last = rows[0], rows[-1]
    exponent = math.log(last["seconds"] / first["seconds"]) / math.log(last["n"] / first["n"])
    print(f"growth exponent (time, {first['n']:,} -> {last['n']:,}): {exponent:.2f}")
    print(f"all pairs on {first['n']:,}: {first['naive_seconds']:.2f} s vs ours {first['seconds']:.2f} s "
          f"-> {first['naive_seconds'] / first['seconds']:.1f}x; same pairs: {first['same_pairs']}")
    extrapolated = first["naive_seconds"] * (last["n"] / first["n"]) ** 2
    print(f"all pairs on {last['n']:,}, extrapolated (n^2): {extrapolated:,.0f} s vs ours {last['seconds']:.1f} s "
          f"-> {extrapolated / last['seconds']:,.0f}x")


if __name__ == "__main__":
    main()
