"""`pipe report` at scale: a synthetic 1,000,000-row manifest (plus a shard index and a long
run's metrics.jsonl), the whole `pipe report` process timed, the page size printed.

Targets (issue 13): <= 60 s on 2 cores, page < 5 MiB. The naive way, timed in the same run: read
the whole manifest into Python rows (what a report built on `pq.read_table().to_pylist()` would
start with), against ours, which reads only the needed columns and keeps the work in Arrow.

    python bench/report.py [--rows 1000000] [--classes 100] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

REASONS = ["truncated", "corrupt", "unsupported_format", "too_small", "zero_bytes", "decompression_bomb",
           "garbled_text", "undecodable_text", "label_conflict"]
ENCODINGS = ["utf-8", "utf-8-sig", "gb18030", "cp932", "cp1252", "utf-16-le"]


def synth_manifest(n: int, classes: int, seed: int = 0) -> tuple[pa.Table, dict]:
    from pipeline.formats.manifest import COLUMNS

    rng = np.random.default_rng(seed)
    labels = np.array([f"class_{c:03d}" for c in range(classes)], dtype=object)[rng.integers(0, classes, n)]
    ids = np.arange(n)
    is_text = rng.random(n) < 0.1
    ext = np.where(is_text, ".txt", ".jpg")
    source = [f"{lab}/{i:07d}{e}" for lab, i, e in zip(labels, ids, ext)]
    roll = rng.random(n)
    status = np.where(roll < 0.05, "quarantined", np.where(roll < 0.10, "duplicate", "kept")).astype(object)
    reason = np.full(n, None, dtype=object)
    q = status == "quarantined"
    reason[q] = np.array(REASONS, dtype=object)[rng.integers(0, len(REASONS), q.sum())]
    d = status == "duplicate"
    reason[d] = np.where(rng.random(d.sum()) < 0.5, "exact_duplicate", "near_duplicate")
    kept_idx = np.flatnonzero(status == "kept")
    dup_of = np.full(n, None, dtype=object)
    src_arr = np.array(source, dtype=object)
    # duplicates gather in clusters of varying size around a few thousand kept files
    dup_of[d] = src_arr[kept_idx[rng.zipf(1.6, d.sum()) % min(5000, len(kept_idx))]]
    output = np.full(n, "", dtype=object)
    k_img = (status == "kept") & ~is_text
    output[k_img] = [f"data/{lab}/{i % 4}.jpg" for lab, i in zip(labels[k_img], ids[k_img])]
    k_txt = (status == "kept") & is_text
    output[k_txt] = [f"data/{lab}/t.txt" for lab in labels[k_txt]]
    sha = rng.bytes(32 * n).hex()
    phash = rng.bytes(8 * n).hex()
    width = np.where(is_text, 0, rng.integers(32, 4000, n))
    height = np.where(is_text, 0, (width * rng.uniform(0.5, 1.5, n)).astype(int))
    enc = np.array(ENCODINGS, dtype=object)[rng.choice(len(ENCODINGS), n, p=[0.6, 0.2, 0.08, 0.06, 0.04, 0.02])]
    cols = {
        "source": pa.array(source, pa.string()), "key": pa.array([s.replace("/", "__")[:-4] for s in source], pa.string()),
        "kind": pa.array(np.where(is_text, "text", "image"), pa.string()), "label": pa.array(labels, pa.string()),
        "status": pa.array(status, pa.string()), "reason": pa.array(reason, pa.string()),
        "detail": pa.array(np.where(q, "synthetic reason detail", ""), pa.string()),
        "duplicate_of": pa.array(dup_of, pa.string()), "output": pa.array(output, pa.string()),
        "caption": pa.array(np.full(n, "", dtype=object), pa.string()), "bytes": pa.array(rng.integers(1, 10**6, n)),
        "sha256": pa.array([sha[i * 64:(i + 1) * 64] for i in range(n)], pa.string()),
        "width": pa.array(np.where(is_text, None, width).tolist(), pa.int64()),
        "height": pa.array(np.where(is_text, None, height).tolist(), pa.int64()),
        "encoding": pa.array(np.where(is_text, enc, None), pa.string()),
        "encoding_confidence": pa.array(np.where(is_text, rng.uniform(0.3, 1.0, n), np.nan).tolist(), pa.float64()),
        "content_hash": pa.array([sha[i * 64:(i + 1) * 64] for i in range(n)], pa.string()),
        "phash": pa.array(np.where(is_text, None, np.array([phash[i * 16:(i + 1) * 16] for i in range(n)], dtype=object)), pa.string()),
    }
    for f in COLUMNS:  # columns the report does not read (output sizes, pixel sums): empty
        cols.setdefault(f.name, pa.nulls(n, f.type))
    table = pa.table({f.name: cols[f.name] for f in COLUMNS}).cast(COLUMNS)
    return table, {"labels": sorted(set(labels)), "status": status, "reason": reason, "kind": np.where(is_text, "text", "image")}


def counts(values) -> dict:
    u, c = np.unique(np.array([v for v in values if v is not None], dtype=str), return_counts=True)
    return {str(k): int(v) for k, v in sorted(zip(u, c), key=lambda kv: (-kv[1], kv[0]))}


def build(root: Path, n: int, classes: int) -> list[Path]:
    from PIL import Image

    t = time.perf_counter()
    clean = root / "clean"
    table, facts = synth_manifest(n, classes)
    clean.mkdir(parents=True)
    pq.write_table(table, clean / "manifest.parquet", compression="zstd", row_group_size=100_000)
    rng = np.random.default_rng(1)
    for lab in facts["labels"]:  # 4 real previews per class (every kept image row points at one)
        (clean / "data" / lab).mkdir(parents=True)
        for i in range(4):
            arr = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8).repeat(4, 0).repeat(4, 1)
            Image.fromarray(arr).save(clean / "data" / lab / f"{i}.jpg", quality=85)
        (clean / "data" / lab / "t.txt").write_text("a caption of this class\n", encoding="utf-8")
    conflicts = [{"files": [f"a/{i}.jpg", f"b/{i}.jpg"], "labels": {"a": 1, "b": 1}, "policy": "quarantine",
                  "action": "quarantined every copy", "kept": None} for i in range(2000)]
    by_status = {"kept": 0, "duplicate": 0, "quarantined": 0, **counts(facts["status"])}
    report = {"schema_version": 1, "tool": "pipe bench", "files": n, "by_status": by_status,
              "by_reason": counts(facts["reason"]), "by_kind": counts(facts["kind"]), "by_encoding": {}, "kept_by_label": {},
              "label_conflicts": conflicts, "settings": {"input": str(root / "gone")},
              "input": {"path": str(root / "gone"), "from_clean_dir": "../gone"}, "timings": {}}  # valid: the page checks it
    (clean / "report.json").write_text(json.dumps(report), encoding="utf-8")
    shards = root / "shards"
    shards.mkdir()
    per = {lab: int(c * 0.9) for lab, c in zip(facts["labels"], range(9000, 9000 + classes))}
    (shards / "index.json").write_text(json.dumps({  # schema-valid (the page shows nothing of an index that is not)
        "schema_version": 1, "created_by": "pipe bench", "manifest_sha256": "0" * 64,
        "settings": {"val_fraction": 0.1, "max_count": 1000, "max_size": 2**30, "seed": 0, "split_distance": 4,
                     "expected_ranks": 8, "expected_workers": 4},
        "classes": facts["labels"], "image_size": 512, "mean": [0.5] * 3, "std": [0.25] * 3, "shards": [],
        "excluded": {"unlabelled": 0}, "near_duplicate_groups": {"groups": 0, "samples": 0, "max_distance": 4},
        "counts": {"train": {"samples": sum(per.values()), "shards": 900, "per_class": per, "images": sum(per.values()), "texts": 0},
                   "val": {"samples": sum(per.values()) // 9, "shards": 100, "per_class": {k: v // 9 for k, v in per.items()},
                           "images": sum(per.values()) // 9, "texts": 0}}}),
        encoding="utf-8")
    run = root / "run"
    run.mkdir()
    with open(run / "metrics.jsonl", "w", encoding="utf-8") as f:
        for s in range(1, 20_001):
            f.write(json.dumps({"kind": "train", "step": s, "epoch": 1 + s // 2000, "loss": 3 / s ** 0.3,
                                "loss_per_rank": [3 / s ** 0.3 + r * 0.01 for r in range(8)], "lr": 1e-3,
                                "data_wait_share": 0.1, "data_wait_share_per_rank": [0.1] * 8}) + "\n")
            if s % 2000 == 0:
                f.write(json.dumps({"kind": "val", "step": s, "epoch": s // 2000, "val_loss": 1 / s ** 0.2, "val_acc": 0.8}) + "\n")
    print(f"synthesised {n:,} manifest rows, {classes} classes, 20,000 x 8-rank metrics windows in {time.perf_counter() - t:.1f} s")
    return [clean, shards, run]


def naive(clean: Path) -> float:
    t = time.perf_counter()
    rows = pq.read_table(clean / "manifest.parquet").to_pylist()
    assert rows
    return time.perf_counter() - t


def ours(dirs: list[Path], out: Path) -> float:
    cmd = [sys.executable, "-m", "pipeline", "report", *map(str, dirs), "-o", str(out)]
    if shutil.which("taskset") and len(os.sched_getaffinity(0)) > 2:
        cmd = ["taskset", "-c", "0,1", *cmd]  # the target is for 2 cores
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--keep", type=Path, help="build here and keep the folders (default: a temporary folder)")
    a = ap.parse_args()
    root = a.keep or Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        dirs = build(root / "in", a.rows, a.classes)
        out = root / "report.html"
        took = ours(dirs, out)
        size = out.stat().st_size
        again = root / "again.html"
        ours(dirs, again)
        same = again.read_bytes() == out.read_bytes()
        base = naive(dirs[0])
        print(f"pipe report (whole process, {a.rows:,} rows + shard index + run): {took:.1f} s (target <= 60 s)")
        print(f"page: {size / 2**20:.2f} MiB (target < 5 MiB), {out.read_text(encoding='utf-8').count('<img')} previews; "
              f"rerun byte-identical: {same}")
        print(f"naive: only loading the whole manifest as Python rows takes {base:.1f} s; "
              f"the whole pipe report process is {base / took:.2f}x faster than that first step alone")
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
