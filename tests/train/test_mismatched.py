"""`pipe labels` on a contrastive run: the pairs whose caption fits other images better than its own.
End to end on captioned colours with 5% of the captions on pictures of another class (the real
pipe clean, pipe shard and a 2-rank pipe train), and the scoring on records made up here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, pipe_env
from train import mismatched
from train.labels import COLUMNS, ISSUES, record_name

TRAIN = ["--objective", "contrastive", "--model", "clip", "--nproc-per-node", "2", "--width", "16", "--resolution", "16",
         "--max-text-len", "32", "--batch-size", "16", "--epochs", "8", "--workers", "1", "--lr", "3e-3", "--log-every", "20"]


def _pipe(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], capture_output=True, text=True,
                          env=pipe_env(), cwd=REPO, timeout=900)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_captions_moved_to_pictures_of_another_class_are_found(tmp_path):
    from tests.captioned import make_shards

    shards, swapped = make_shards(tmp_path / "data", per_class=80, mismatched=0.05, seed=1,
                                  classes=("black", "blue", "green", "red", "yellow"))
    assert len(swapped) == 20
    p = _pipe("train", shards, "-o", tmp_path / "run", *TRAIN)
    assert p.returncode == 0, p.stderr[-3000:]
    p = _pipe("labels", tmp_path / "run")
    assert p.returncode == 0, p.stderr
    rows = pq.read_table(tmp_path / "run" / ISSUES).to_pylist()
    assert list(pq.read_schema(tmp_path / "run" / ISSUES).names) == ["rank", "key", "source", "split", "given",
                                                                       "suggested", "score"]
    flagged = {r["key"].split("__")[1] for r in rows}
    found = flagged & swapped
    precision, recall = len(found) / max(len(flagged), 1), len(found) / len(swapped)
    assert precision >= 0.8 and recall >= 0.8, (precision, recall, sorted(flagged - swapped), sorted(swapped - flagged))
    for r in rows:  # the image's source file, the caption it carries
        assert r["source"].endswith(".png") and r["given"]
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    summary = json.loads((tmp_path / "run" / "label_issues.json").read_text())
    assert summary["flagged"]["total"] == len(rows)


def _records(run: Path, split: str, step: int, keys: list[str], epoch: int, margins) -> None:
    (run / "margins").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"epoch": pa.array([epoch] * len(keys), pa.int32()), "key": keys,
                             "caption_margin": pa.array(np.asarray(margins, dtype=np.float32))}),
                   run / "margins" / record_name(split, 0, step))


def test_pairs_far_below_the_runs_typical_margin_are_flagged_most_first(tmp_path):
    rng = np.random.default_rng(0)
    keys = [f"k{i:03d}" for i in range(200)]
    for epoch in range(4):
        margins = rng.normal(-0.02, 0.02, 200)
        margins[[5, 17]] = [-0.6, -0.3]  # captions that fit other images far better
        margins[40] = 0.4  # far above: an outlier, but its caption fits its own image best
        _records(tmp_path, "train", epoch + 1, keys, epoch, margins)
    found = mismatched.analyse(mismatched._table(tmp_path, "train"), None)
    assert [r["key"] for r in found.rows] == ["k005", "k017"]
    assert found.rows[0]["score"] > found.rows[1]["score"] > mismatched.THRESHOLD
    assert found.train_samples == 200 and found.epochs == 4 and found.kind == "pairs"


def test_a_record_written_twice_counts_once_the_later_one(tmp_path):
    keys = [f"k{i}" for i in range(50)]
    _records(tmp_path, "train", 1, keys, 0, [-0.9] + [0.0] * 49)
    _records(tmp_path, "train", 2, keys[:1], 0, [0.0])  # the same epoch redone after a resume: it counts
    found = mismatched.analyse(mismatched._table(tmp_path, "train"), None)
    assert found.rows == []


def test_pipe_labels_on_a_contrastive_run_writes_the_label_issue_files(tmp_path):
    from tests.train_shards import make_shards

    shards = make_shards(tmp_path / "data", n=30, classes=3, size=32)
    index = json.loads((shards / "index.json").read_text())
    keys = []
    for shard in index["shards"]:
        import tarfile

        with tarfile.open(shards / shard["name"]) as tar:
            keys += sorted({m.name.split(".")[0] for m in tar.getmembers()})
    run = tmp_path / "run"
    (run).mkdir()
    (run / "config.json").write_text(json.dumps({"objective": "contrastive", "shard_dir": str(shards)}))
    _records(run, "train", 1, keys, 0, [-0.8] + [0.0] * (len(keys) - 1))
    p = _pipe("labels", run)
    assert p.returncode == 0, p.stderr
    rows = pq.read_table(run / ISSUES).to_pylist()
    assert list(rows[0]) == COLUMNS and rows[0]["key"] == keys[0]
    assert rows[0]["given"].startswith("a picture of") and rows[0]["source"].endswith(".jpg")
    assert "caption fits other images better" in p.stdout
