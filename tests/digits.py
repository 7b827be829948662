"""Handwritten-digit-like SHARD_DIRs for the training drills (issue 23's "UCI digits").

scikit-learn's `load_digits` (what `bench/label_noise.py` uses) is not a dependency of pipe, so the
tests draw their own digits the way that set looks: 8x8 scans, ink levels 0-16, each digit's
strokes shifted, thickened and smudged per sample, upscaled to 32 px (`pipe clean` refuses
thumbnails). Ten classes ``digit0``..``digit9``, a caption per image; the same call gives
byte-identical shards, so several ranks can each build their own copy and agree on its hash.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.shard import stage
from tests.clean_dirs import Spec, make_clean_dir
from tests.factories import image_bytes

# 5 x 7 strokes of each digit (a seven-segment-like hand), drawn into an 8 x 8 scan
GLYPHS = {
    0: [".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."],
    1: ["..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."],
    2: [".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"],
    3: ["####.", "....#", "....#", ".###.", "....#", "....#", "####."],
    4: ["...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."],
    5: ["#####", "#....", "####.", "....#", "....#", "#...#", ".###."],
    6: ["..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."],
    7: ["#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."],
    8: [".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."],
    9: [".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."],
}


def scan(digit: int, seed: int) -> np.ndarray:
    """One 8 x 8 scan of ``digit``, ink 0-16 as in the UCI set: shifted, thickened, noisy."""
    rng = np.random.default_rng(seed)
    glyph = np.array([[c == "#" for c in row] for row in GLYPHS[digit]], dtype=float)
    img = np.zeros((8, 8))
    dy, dx = rng.integers(0, 2), rng.integers(0, 4)
    img[dy:dy + 7, dx:dx + 5] = glyph * rng.uniform(10, 16)
    if rng.random() < 0.5:  # a thicker pen: the strokes bleed one pixel to the right
        img[:, 1:] = np.maximum(img[:, 1:], img[:, :-1] * rng.uniform(0.3, 0.7))
    img += rng.normal(0, 1.5, size=img.shape)
    return np.clip(np.round(img), 0, 16)


def digit_image(digit: int, seed: int, size: int = 32) -> bytes:
    """The scan as a ``size`` px RGB JPEG (dark ink on paper, like a scan would be)."""
    grey = (255 - scan(digit, seed) * 255 / 16).astype(np.uint8)
    big = Image.fromarray(grey).resize((size, size), Image.Resampling.BILINEAR).convert("RGB")
    return image_bytes(big, "JPEG", quality=92)


def make_digit_shards(root: Path, n: int = 400, seed: int = 0, prefix: str = "d", size: int = 32,
                      val_fraction: float = 0.2, classes: int = 10) -> Path:
    """A SHARD_DIR of ``n`` digit scans (``classes`` digits, round robin) under ``root``; returns it."""
    names = [f"digit{d}" for d in range(classes)]
    specs = [Spec(key=f"{prefix}{i:05d}", label=names[i % classes], seed=seed * 1_000_003 + i, size=size,
                  text=f"a handwritten {i % classes}",
                  phash=((seed * 1_000_003 + i) * 0x9E3779B97F4A7C15) & (2**64 - 1)) for i in range(n)]
    clean = make_clean_dir(root / "clean", specs)
    for spec in specs:
        (clean / "data" / spec.label / f"{spec.key}.jpg").write_bytes(digit_image(names.index(spec.label), spec.seed, size))
    stage.run(stage.ShardConfig(clean, root / "shards", val_fraction=val_fraction, seed=seed, max_count=40),
              show_progress=False)
    return root / "shards"


def keys_by_position(shard_dir: Path, split: str = "train") -> dict[tuple[int, int], str]:
    """(shard number in the split, index) -> key, read with Python's tarfile (not our parser)."""
    import json
    import tarfile

    index = json.loads((Path(shard_dir) / "index.json").read_text())
    out = {}
    for n, shard in enumerate(s for s in index["shards"] if s["split"] == split):
        with tarfile.open(Path(shard_dir) / shard["name"]) as tf:
            keys = list(dict.fromkeys(m.name.split(".", 1)[0] for m in tf.getmembers()))
        out.update({(n, i): k for i, k in enumerate(keys)})
    return out
