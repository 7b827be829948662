"""Real SHARD_DIRs for the training tests, built the way `pipe shard` builds them (from a CLEAN_DIR
made by `tests.clean_dirs`), with images a model can learn: each class has its own colour
pattern under noise, and captions name the class. Deterministic: the same call gives
byte-identical shards (so several ranks can each build their own copy and agree on the index hash).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.shard import stage
from tests.clean_dirs import Spec, make_clean_dir
from tests.factories import image_bytes

PALETTE = [(200, 40, 40), (40, 170, 60), (40, 60, 210), (210, 190, 40), (150, 40, 170)]


def class_image(label: int, seed: int, size: int) -> bytes:
    rng = np.random.default_rng(seed)
    img = rng.normal(110, 30, size=(size, size, 3))
    colour = np.array(PALETTE[label % len(PALETTE)], dtype=float)
    h = size // 2
    quadrant = (slice((label // 2 % 2) * h, (label // 2 % 2 + 1) * h), slice((label % 2) * h, (label % 2 + 1) * h))
    img[quadrant] = 0.4 * img[quadrant] + 0.6 * colour
    return image_bytes(np.clip(img, 0, 255).astype(np.uint8), "JPEG", quality=90)


def make_shards(root: Path, n: int = 60, classes: int = 3, size: int = 32, seed: int = 0, prefix: str = "s",
                val_fraction: float = 0.2) -> Path:
    """A SHARD_DIR of ``n`` labelled image+caption samples under ``root``; returns its path."""
    names = [f"{prefix}class{c}" for c in range(classes)]
    specs = [Spec(key=f"{prefix}{i:05d}", label=names[i % classes], seed=seed * 100_000 + i, size=size,
                  text=f"a picture of {names[i % classes]}, number {i}",
                  phash=((seed * 100_000 + i) * 0x9E3779B97F4A7C15) & (2**64 - 1)) for i in range(n)]
    clean = make_clean_dir(root / "clean", specs)
    for spec in specs:  # class-coloured pictures in place of the builder's noise
        (clean / "data" / spec.label / f"{spec.key}.jpg").write_bytes(class_image(names.index(spec.label), spec.seed, size))
    stage.run(stage.ShardConfig(clean, root / "shards", val_fraction=val_fraction, seed=seed), show_progress=False)
    return root / "shards"
