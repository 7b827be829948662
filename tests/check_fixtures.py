"""Small datasets for `pipe check` tests: a good one that passes TEST_POLICY, and helpers to
break exactly one thing in it. Built with the real `pipe clean` (and `pipe shard`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from pipeline import clean
from pipeline.check import CheckConfig, run
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

    from pipeline.manifest import COLUMNS

    pq.write_table(pa.Table.from_pylist(rows, schema=COLUMNS), clean_dir / "manifest.parquet")


def kept_output(clean_dir: Path, kind: str = "image", label: str = "dogs") -> Path:
    row = next(r for r in manifest_rows(clean_dir) if r["status"] == "kept" and r["kind"] == kind and r["label"] == label)
    return clean_dir / row["output"]


def edit_json(path: Path, fn) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    fn(doc)
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
