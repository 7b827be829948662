"""Build CLEAN_DIRs directly (files + manifest.parquet), as `pipe clean` would leave them.

Faster than running `pipe clean` and lets a test choose exactly what the manifest says (labels,
perceptual hashes, captions, missing labels). One end-to-end test runs the real `pipe clean`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.formats.manifest import COLUMNS
from tests.factories import image_bytes, noise_rgb


@dataclass
class Spec:
    key: str
    label: str | None
    image: bool = True
    text: str | None = None
    phash: int | None = None
    seed: int = 0
    size: int = 32
    fmt: str = "jpg"


def _row(**kw) -> dict:
    base = {name: None for name in COLUMNS.names}
    base.update(status="kept", reason=None, detail="", duplicate_of=None, bytes=1, sha256="0" * 64)
    base.update(kw)
    return base


def make_clean_dir(root: Path, specs: list[Spec], extra_rows: list[dict] = ()) -> Path:
    rows = []
    for s in specs:
        folder = s.label or "unlabelled"
        if s.image:
            out = f"data/{folder}/{s.key}.{s.fmt}"
            data = image_bytes(noise_rgb(s.size, s.size, s.seed), "JPEG" if s.fmt == "jpg" else s.fmt.upper(),
                               **({"quality": 90} if s.fmt == "jpg" else {}))
            (root / out).parent.mkdir(parents=True, exist_ok=True)
            (root / out).write_bytes(data)
            ph = None if s.phash is None else f"{s.phash:016x}"
            rows.append(_row(source=f"{folder}/{s.key}.jpg", key=s.key, kind="image", label=s.label, output=out,
                             width=s.size * 2, height=s.size, phash=ph))
        if s.text is not None:
            out = f"data/{folder}/{s.key}.txt"
            (root / out).parent.mkdir(parents=True, exist_ok=True)
            (root / out).write_bytes(s.text.encode("utf-8"))
            rows.append(_row(source=f"{folder}/{s.key}.txt", key=s.key, kind="text", label=s.label, output=out,
                             encoding="utf-8", encoding_confidence=1.0))
    rows.extend(extra_rows)
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=COLUMNS), root / "manifest.parquet")
    return root


def simple_specs(n: int, classes: int = 3, text_every: int = 2, size: int = 32) -> list[Spec]:
    """n labelled samples over ``classes`` classes; every ``text_every``-th has a caption."""
    return [Spec(key=f"s{i:05d}", label=f"c{i % classes}", seed=i, size=size,
                 text=f"caption {i} ✓" if text_every and i % text_every == 0 else None,
                 phash=(i * 0x9E3779B97F4A7C15) & (2**64 - 1)) for i in range(n)]
