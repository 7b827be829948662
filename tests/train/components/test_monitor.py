"""Watching a run: the drift alarm names the rank that strays, and the writers record the numbers."""

from __future__ import annotations

import io
import json
import math

import pytest

from tests.fake_data import fake_source, write_index
from tests.gloo import scenario_results
from train.components.monitor import DriftDetector
from train.config import TrainConfig

NORMAL_MEAN, NORMAL_STD = [0.02, -0.01, 0.0], [0.98, 1.01, 1.0]


def _feed(det: DriftDetector, windows: int, losses, means, stds) -> list[dict]:
    out = []
    for step in range(1, windows + 1):
        out += det.update(step * 10, losses, means, stds)
    return out


def test_two_ranks_one_differently_normalised_is_named():
    det = DriftDetector(2, ["node-a", "node-b"])
    warnings = _feed(det, 3, [1.0, 1.1], [NORMAL_MEAN, [1.0, 1.1, 0.9]], [NORMAL_STD, [3.0, 3.1, 2.9]])
    assert len(warnings) == 1  # named once, not at every window
    w = warnings[0]
    assert (w["rank"], w["host"], w["what"]) == (1, "node-b", "inputs")
    assert "rank 1 on node-b" in w["message"] and "3.000" in w["message"] and "1.000" in w["message"]


def test_ranks_with_the_same_statistics_raise_nothing():
    det = DriftDetector(4, ["a", "b", "c", "d"])
    means = [[0.05, -0.1, 0.0], [-0.05, 0.1, 0.02], [0.1, 0.0, -0.1], [0.0, 0.05, 0.05]]
    stds = [[0.9, 1.0, 1.1], [1.0, 1.05, 0.95], [1.1, 0.9, 1.0], [1.0, 1.0, 1.0]]
    assert _feed(det, 5, [1.2, 1.0, 1.1, 1.3], means, stds) == []


def test_a_rank_whose_loss_runs_away_is_named_among_many():
    det = DriftDetector(4, ["a", "b", "c", "d"])
    warnings = _feed(det, 3, [0.5, 0.55, 2.5, 0.52], [NORMAL_MEAN] * 4, [NORMAL_STD] * 4)
    assert [(w["rank"], w["what"]) for w in warnings] == [(2, "loss")]
    assert "2.5000" in warnings[0]["message"]


def test_a_nan_loss_is_named_at_once():
    det = DriftDetector(2, ["a", "b"])
    warnings = det.update(10, [0.7, math.nan], None, None)
    assert [(w["rank"], w["what"]) for w in warnings] == [(1, "loss")]


def test_a_rank_that_recovers_and_drifts_again_is_named_again():
    det = DriftDetector(3, ["a", "b", "c"])
    bad = [NORMAL_MEAN, NORMAL_MEAN, [2.0, 2.0, 2.0]]
    assert len(_feed(det, 2, [1, 1, 1], bad, [NORMAL_STD] * 3)) == 1
    det.settings.ema = 1.0  # no memory: the next windows decide alone
    assert det.update(30, [1, 1, 1], [NORMAL_MEAN] * 3, [NORMAL_STD] * 3) == []
    assert len(det.update(40, [1, 1, 1], bad, [NORMAL_STD] * 3)) == 1


def drift_scenario(workdir):
    """A 2-rank training run in which rank 1 reads differently normalised images."""
    from rich.console import Console

    from train.loop import run

    write_index(workdir / "shards")
    cfg = TrainConfig(shard_dir=workdir / "shards", output=workdir / "run", epochs=1, batch_size=4, log_every=2,
                      workers=0, width=8, model="image")
    out = io.StringIO()
    run(cfg, open_data=fake_source(n_train=48, n_val=0, skew_rank=1), console=Console(file=out, width=300))
    return out.getvalue()


@pytest.mark.slow
def test_training_run_names_the_rank_with_differently_normalised_inputs():
    (printed0, printed1), workdir = scenario_results(drift_scenario)
    assert "drift: rank 1 on" in printed0 and "input statistics" in printed0
    assert "drift: rank 0" not in printed0
    assert printed1 == ""  # one voice: rank 0
    rows = [json.loads(line) for line in (workdir / "run" / "metrics.jsonl").read_text().splitlines()]
    drift = [r for r in rows if r["kind"] == "drift"]
    assert [(r["rank"], r["what"]) for r in drift] == [(1, "inputs")]
    train = [r for r in rows if r["kind"] == "train"]
    assert train and all(len(r["loss_per_rank"]) == 2 for r in train)
    # the numbers behind the warning are in the metrics: rank 1's channel std is ~3x rank 0's
    assert train[-1]["input_std_per_rank"][1][0] > 2 * train[-1]["input_std_per_rank"][0][0]
    assert {"samples_per_s", "data_wait_share", "memory_mb", "lr"} <= set(train[-1])
