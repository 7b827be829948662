"""How far the dataset mean/std pipe shard gets from pipe clean's recorded pixel sums are from the
exact figures of the images a reader decodes (issue 26: the sums of a JPEG or WebP output are
taken from its pixels before the lossy encode, so nothing decodes the output again).

    python bench/pixel_stats.py                          # data_samples/ and 30 synthetic 2048x1536 photos
    python bench/pixel_stats.py --folder PATH [PATH...]  # your own folders of images (read only)

Each folder goes through the real `pipe clean` (default settings: 512 px, JPEG q90; `--resize-mode`, pad by default) into a
temporary CLEAN_DIR; then, over every kept image, the per-channel mean and std on the 0-1 scale
are computed twice: from the manifest's `pixel_sums` / `pixel_squares` (what pipe shard adds up)
and from each output file decoded (`pipeline.formats.pixels.measure`, the reader's pixels). The
differences are printed: the mean's in absolute terms, the std's also as a share of itself.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def stats(sums: list[int], squares: list[int], n: int) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of 0-255 values, on the 0-1 scale."""
    mean = [s / n for s in sums]
    std = [math.sqrt(max(q / n - m * m, 0.0)) for q, m in zip(squares, mean)]
    return [m / 255 for m in mean], [s / 255 for s in std]


def compare(folder: Path, work: Path, mode: str) -> dict:
    """`pipe clean` on ``folder``; the recorded and the decoded figures of its kept images."""
    import pyarrow.parquet as pq

    from pipeline.formats.pixels import measure

    out = work / "clean"
    subprocess.run([sys.executable, "-m", "pipeline", "clean", str(folder), "-o", str(out), "--resize-mode", mode, "--json"],
                   check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    rows = pq.read_table(out / "manifest.parquet", columns=["output", "status", "pixel_sums", "pixel_squares"]).to_pylist()
    rec_s, rec_q, dec_s, dec_q, n, images = [0] * 3, [0] * 3, [0] * 3, [0] * 3, 0, 0
    for r in rows:
        if r["status"] != "kept" or not r["pixel_sums"]:
            continue
        path = out / r["output"]
        px = measure(path.read_bytes(), path.suffix[1:])
        n, images = n + px.count, images + 1
        for c in range(3):
            rec_s[c] += r["pixel_sums"][c]
            rec_q[c] += r["pixel_squares"][c]
            dec_s[c] += px.sums[c]
            dec_q[c] += px.squares[c]
    (rm, rs), (dm, ds) = stats(rec_s, rec_q, n), stats(dec_s, dec_q, n)
    return {"images": images, "mean_diff": max(abs(a - b) for a, b in zip(rm, dm)),
            "std_diff": max(abs(a - b) for a, b in zip(rs, ds)),
            "std_share": max(abs(a - b) / b for a, b in zip(rs, ds))}


def synthetic(work: Path, n: int) -> Path:
    """``n`` noisy synthetic 2048x1536 camera-like photos (`bench/clean_images.make_set`)."""
    sys.path.insert(0, str(REPO / "bench"))
    from clean_images import make_set

    return make_set(work / "photos", n, 2048, 1536, seed=2048)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--folder", type=Path, nargs="*", help="folders of images (default: data_samples/ and synthetic photos)")
    ap.add_argument("--resize-mode", default="pad", help="pipe clean's --resize-mode (default pad)")
    ap.add_argument("--photos", type=int, default=30, help="synthetic 2048x1536 photos (default 30; 0: none)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pixel-stats-") as tmp:
        folders = a.folder or [REPO / "data_samples", *([synthetic(Path(tmp), a.photos)] if a.photos else [])]
        print(f"--resize-mode {a.resize_mode}: recorded (before the encode) vs decoded outputs, worst channel, 0-1 scale:")
        for i, folder in enumerate(folders):
            r = compare(folder, Path(tmp) / f"run{i}", a.resize_mode)
            print(f"  {folder}: {r['images']} kept images: mean within {r['mean_diff']:.1e}, "
                  f"std within {r['std_diff']:.1e} ({100 * r['std_share']:.2f}% of itself)", flush=True)


if __name__ == "__main__":
    main()
