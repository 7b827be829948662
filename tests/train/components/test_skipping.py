"""A bad sample mid-stream is skipped, not fatal: named in the log and skipped.jsonl, left out of
the loss and the key record's trained keys, bounded by --max-skipped (exit 1 past it); a resume
does not record a skip twice."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console

from pipeline.core.errors import StageFailed
from tests.digits import make_digit_shards
from train import loop
from train.components import checkpoint as ckpt
from train.components import keys
from train.components.skipping import SKIPPED, masked_loss
from train.config import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_batch_without_skips_takes_the_plain_loss_and_a_skipped_slot_adds_nothing():
    logits = torch.randn(4, 3, requires_grad=True)
    labels = torch.tensor([0, 2, 1, 1])
    plain = {"label": labels, "valid": torch.ones(4, dtype=torch.bool)}
    assert torch.equal(masked_loss(logits, plain), F.cross_entropy(logits, labels))
    skipped = {"label": labels, "valid": torch.tensor([True, False, True, True]),
               "skipped": [(1, "train-000000.tar", "k1", 0, "jpg image does not decode")]}
    loss = masked_loss(logits, skipped)
    want = F.cross_entropy(logits[[0, 2, 3]], labels[[0, 2, 3]], reduction="sum") / 4  # the mean over the batch's 4
    torch.testing.assert_close(loss, want)
    loss.backward()
    assert torch.count_nonzero(logits.grad[1]) == 0 and torch.count_nonzero(logits.grad[0]) > 0


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """Digit shards with one image zeroed inside a valid shard (same size, not a JPEG any more)."""
    root = tmp_path_factory.mktemp("damaged")
    shards = make_digit_shards(root / "good", n=120)
    copy = root / "shards"
    shutil.copytree(shards, copy)
    target = copy / "train-000001.tar"
    with tarfile.open(target) as tf:
        victim = [m for m in tf.getmembers() if m.name.endswith(".jpg")][3]
    data = bytearray(target.read_bytes())
    data[victim.offset_data : victim.offset_data + victim.size] = bytes(victim.size)
    target.write_bytes(bytes(data))
    return copy, victim.name.split(".")[0]


def _cfg(shards: Path, out: Path, **over) -> TrainConfig:
    values = dict(shard_dir=shards, output=out, epochs=2, batch_size=8, workers=0, width=8, model="image",
                  record_keys=True, log_every=50, checkpoint_every=2)
    return TrainConfig(**{**values, **over})


def _run(cfg: TrainConfig) -> tuple[dict, str]:
    out = io.StringIO()
    summary = loop.run(cfg, console=Console(file=out, width=400))
    return summary, out.getvalue()


def test_a_zeroed_image_is_skipped_named_and_recorded_and_the_run_finishes(damaged, tmp_path):
    shards, key = damaged
    summary, printed = _run(_cfg(shards, tmp_path / "run"))
    assert summary["steps"] == 2 * 96 // 8 and summary["skipped"] == 1
    assert f"train-000001.tar: sample {key} (byte offset" in printed and "jpg image does not decode" in printed
    rows = [json.loads(line) for line in (tmp_path / "run" / SKIPPED).read_text().splitlines()]
    assert [(r["shard"], r["key"], r["split"], r["epoch"]) for r in rows] == [("train-000001.tar", key, "train", 1),
                                                                          ("train-000001.tar", key, "train", 2)]
    assert all(r["rank"] == 0 and 1 <= r["step"] <= 24 and "does not decode" in r["reason"] for r in rows)
    for epoch in range(2):
        trained, skipped = keys.trained_keys(tmp_path / "run", epoch)
        assert skipped == [key] and key not in trained and len(trained) == 95  # in the record as skipped, not trained


def test_past_max_skipped_the_run_stops_naming_the_sample(damaged, tmp_path):
    shards, key = damaged
    with pytest.raises(StageFailed, match=rf"--max-skipped 0 \(0 samples\) exceeded: 1 train sample could not be "
                                          rf"read or decoded: train-000001.tar:{key} \(jpg image does not decode"):
        _run(_cfg(shards, tmp_path / "run", max_skipped="0"))
    assert key in (tmp_path / "run" / SKIPPED).read_text()


def test_a_resume_does_not_record_a_skip_twice(damaged, tmp_path, monkeypatch):
    """Killed right after the step that met the bad sample (its row already in skipped.jsonl, the
    last checkpoint one step before): the resumed run cuts the file back and meets it once more."""
    shards, key = damaged
    _run(_cfg(shards, tmp_path / "whole", epochs=1))
    step = json.loads((tmp_path / "whole" / SKIPPED).read_text())["step"]
    assert step >= 3  # deterministic (seed 0); a checkpoint every step - 1 steps falls just before it

    def crash(run_dir, done, d):
        if done == step and not (run_dir / ".crashed").exists():
            (run_dir / ".crashed").touch()
            raise KeyboardInterrupt

    real = loop._maybe_inject_fault
    monkeypatch.setattr(loop, "_maybe_inject_fault", crash)
    with pytest.raises(KeyboardInterrupt):
        _run(_cfg(shards, tmp_path / "run", epochs=1, checkpoint_every=step - 1))
    assert key in (tmp_path / "run" / SKIPPED).read_text()
    saved = ckpt.load(tmp_path / "run" / "last.pt")
    assert saved["step"] == step - 1 and saved["records"]["skipped"] == {"bytes": 0, "samples": []}
    monkeypatch.setattr(loop, "_maybe_inject_fault", real)
    summary, _ = _run(_cfg(shards, tmp_path / "run", epochs=1, checkpoint_every=step - 1, resume=True))
    rows = [json.loads(line) for line in (tmp_path / "run" / SKIPPED).read_text().splitlines()]
    assert [(r["key"], r["step"]) for r in rows] == [(key, step)] and summary["skipped"] == 1
    assert keys.trained_keys(tmp_path / "run", 0) == keys.trained_keys(tmp_path / "whole", 0)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_ranks_finish_naming_the_zeroed_image_and_stop_with_exit_1_under_max_skipped_0(damaged, tmp_path):
    """The issue's drill on 2 CPU ranks (pipe train --nproc-per-node 2, 2 workers each): the zeroed
    image is skipped and named, the run finishes; with --max-skipped 0 it stops, exit 1, naming it."""
    import subprocess
    import sys

    from tests.conftest import REPO, pipe_env

    shards, key = damaged
    flags = ["--model", "image", "--width", "8", "--epochs", "2", "--batch-size", "8", "--workers", "2",
             "--nproc-per-node", "2", "--record-keys"]

    def train(out: Path, *more: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipeline", "train", str(shards), "-o", str(out), *flags, *more],
                              capture_output=True, text=True, env=pipe_env(), cwd=REPO, timeout=500)

    p = train(tmp_path / "run")
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"train-000001.tar: sample {key} (byte offset" in p.stderr and "samples skipped" in p.stdout
    rows = [json.loads(line) for line in (tmp_path / "run" / SKIPPED).read_text().splitlines()]
    assert sorted(r["epoch"] for r in rows) == [1, 2] and {r["key"] for r in rows} == {key}
    assert [keys.trained_keys(tmp_path / "run", e)[1] for e in range(2)] == [[key], [key]]
    p = train(tmp_path / "strict", "--max-skipped", "0")
    assert p.returncode == 1, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    # every rank reached the verdict at the same step: said once, by the launcher, for all of them
    assert last.startswith("pipe: failed: --max-skipped 0 (0 samples) exceeded") and p.stderr.count("exceeded") == 1
    assert f"train-000001.tar:{key}" in last and "terminate called" not in p.stderr
