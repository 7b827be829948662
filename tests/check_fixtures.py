"""Small datasets for `pipe check` tests: a good one that passes TEST_POLICY, and helpers to
break exactly one thing in it. Built with the real `pipe clean` (and `pipe shard`)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
from PIL import Image

from pipeline.check.stage import CheckConfig, run
from pipeline.clean import stage as clean
from tests.factories import photo, write

# Thresholds the good dataset meets with little room, so each broken variant trips exactly one.
TEST_POLICY = """\
max_quarantined_fraction = 0.1
max_duplicate_fraction = 0.1
min_samples_per_class = 4
max_class_imbalance = 3.0

[severity]
class_imbalance = "error"
"""
SIZE = 64  # small outputs keep the tests fast


def build_raw(root: Path, classes: dict[str, int] | None = None, seed: int = 0) -> Path:
    """Class folders of distinct photos (80x60), and one caption beside the first cat."""
    classes = classes or {"cats": 6, "dogs": 6}
    for ci, (label, n) in enumerate(sorted(classes.items())):
        for i in range(n):
            photo(root / label / f"{label}{i:02d}.jpg", 80, 60, seed=seed + 1000 * ci + i + 1)
    if "cats" in classes:
        write(root / "cats" / "cats00.txt", "a grey cat on a sofa")
    return root


def run_clean(raw: Path, out: Path) -> Path:
    clean.run(clean.CleanConfig(raw, out, workers=1, size=SIZE), show_progress=False)
    return out


def policy_file(tmp: Path, text: str = TEST_POLICY) -> Path:
    p = tmp / "policy.toml"
    p.write_text(text, encoding="utf-8")
    return p


def check(folder: Path, policy: Path, **kw):
    return run(CheckConfig([folder], policy, **kw))


def failing(report) -> set[str]:
    """Names of the checks that failed (any severity)."""
    return {r.name for r in report.results if r.status == "fail"}


def result(report, name: str):
    return next(r for r in report.results if r.name == name)


def copy_dir(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest


def manifest_rows(clean_dir: Path) -> list[dict]:
    return pq.read_table(clean_dir / "manifest.parquet").to_pylist()


def write_manifest(clean_dir: Path, rows: list[dict]) -> None:
    import pyarrow as pa

    from pipeline.formats.manifest import COLUMNS

    pq.write_table(pa.Table.from_pylist(rows, schema=COLUMNS), clean_dir / "manifest.parquet")


def kept_output(clean_dir: Path, kind: str = "image", label: str = "dogs") -> Path:
    row = next(r for r in manifest_rows(clean_dir) if r["status"] == "kept" and r["kind"] == kind and r["label"] == label)
    return clean_dir / row["output"]


def zero_middle(data: bytes, n: int = 200) -> bytes | None:
    """``data`` with ``n`` bytes zeroed in its middle, when that damage is what `pipe clean`'s strict
    JPEG decode calls corrupt yet Pillow's ``load()`` accepts; None when it is not (Huffman codes
    resynchronise on some files: `pipeline/media/image/jpeg.py`'s known limit)."""
    from pipeline.media.image import jpeg
    from pipeline.media.reject import Reject

    bad = bytearray(data)
    mid = len(bad) // 2
    bad[mid : mid + n] = bytes(n)
    bad = bytes(bad)
    try:
        jpeg.decode(jpeg.read_header(bad))
        return None
    except Reject as r:
        if r.reason != "corrupt":
            return None
    try:
        Image.open(io.BytesIO(bad)).load()  # the damage Pillow hides: what the check must not trust
    except Exception:  # noqa: BLE001
        return None
    return bad


def edit_json(path: Path, fn) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    fn(doc)
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")


# ---- shard dirs: built with the real `pipe shard`, broken by rewriting a shard like another tool would


def run_shard(clean_dir: Path, out: Path) -> Path:
    from pipeline.shard import stage as shard

    shard.run(shard.ShardConfig(clean_dir, out, val_fraction=0.1, max_count=4, seed=0, workers=1), show_progress=False)
    return out


def read_samples(tar_path: Path) -> list[tuple[str, dict[str, bytes]]]:
    """[(key, {ext: bytes})] in shard order."""
    import tarfile

    out: list[tuple[str, dict[str, bytes]]] = []
    with tarfile.open(tar_path) as tar:
        for m in tar:
            key, _, ext = m.name.partition(".")
            if not out or out[-1][0] != key:
                out.append((key, {}))
            out[-1][1][ext] = tar.extractfile(m).read()
    return out


def rewrite_shard(shard_dir: Path, name: str, fn) -> None:
    """Replace shard ``name`` by ``fn(samples)`` written with Python's tarfile, then reindex so
    sizes, checksums, counts and offsets agree again: only the content change remains."""
    import io
    import tarfile

    samples = fn(read_samples(shard_dir / name))
    with tarfile.open(shard_dir / name, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    reindex(shard_dir)


def reindex(shard_dir: Path) -> None:
    """Recompute every shard's bytes, sha256, count and offsets, and the split totals, in index.json."""
    import hashlib
    import tarfile
    from collections import Counter

    index = json.loads((shard_dir / "index.json").read_text())
    per_split = {"train": Counter(), "val": Counter()}
    for e in index["shards"]:
        path = shard_dir / e["name"]
        data = path.read_bytes()
        offsets, keys = [], []
        with tarfile.open(path) as tar:
            for m in tar:
                key = m.name.partition(".")[0]
                if not keys or keys[-1] != key:
                    keys.append(key)
                    offsets.append(m.offset)
                raw = tar.extractfile(m).read() if m.name.endswith(".cls") else b""
                if raw.strip().isdigit():
                    cls = int(raw)
                    if cls < len(index["classes"]):
                        per_split[e["split"]][index["classes"][cls]] += 1
        e.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), count=len(keys), offsets=offsets)
    for split, c in per_split.items():
        index["counts"][split]["samples"] = sum(e["count"] for e in index["shards"] if e["split"] == split)
        index["counts"][split]["per_class"] = {name: c.get(name, 0) for name in index["classes"]}
    (shard_dir / "index.json").write_text(json.dumps(index, indent=1))


def shard_names(shard_dir: Path, split: str) -> list[str]:
    return [e["name"] for e in json.loads((shard_dir / "index.json").read_text())["shards"] if e["split"] == split]
