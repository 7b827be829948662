"""The preflight: one table on rank 0, and every rank stops (exit 1) when ranks disagree."""

from __future__ import annotations

import io

import pytest

from pipeline.core.errors import StageFailed
from tests.gloo import scenario_results
from train.distributed import preflight


def _report(rank: int, host: str = "node-a", **over) -> dict:
    base = {"rank": rank, "host": host, "torch": "2.13.0", "cuda": "12.4", "cudnn": "90100", "nccl": "2.21.5",
            "device": "NVIDIA H100", "free_mem": "70.1/79.6 GiB", "dataset": "aaaa", "config": "cccc"}
    return {**base, **over}


def test_agreeing_ranks_pass():
    assert preflight.disagreements([_report(0), _report(1, "node-b", free_mem="3.0 GiB", device="NVIDIA A100")]) == []


def test_disagreement_names_ranks_hosts_and_values():
    reports = [_report(0), _report(1), _report(2, "node-b", nccl="2.18.1"), _report(3, "node-b", nccl="2.18.1", dataset="bbbb")]
    problems = preflight.disagreements(reports)
    assert len(problems) == 2
    nccl = next(p for p in problems if p.startswith("nccl"))
    assert "ranks 0,1 (node-a) nccl=2.21.5" in nccl and "ranks 2,3 (node-b) nccl=2.18.1" in nccl
    dataset = next(p for p in problems if p.startswith("dataset"))
    assert "rank 3 (node-b) dataset=bbbb" in dataset


def mismatch_scenario(d, workdir):
    """Rank 1 was started with another config (e.g. a different --lr on one node)."""
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, width=200)
    try:
        preflight.run(d, "fp-same", "cfg-a" if d.rank == 0 else "cfg-b", console)
        return {"raised": None, "printed": out.getvalue()}
    except preflight.PreflightFailed as e:
        return {"raised": str(e), "is_stage_failed": isinstance(e, StageFailed), "printed": out.getvalue()}


@pytest.mark.slow
def test_every_rank_stops_when_configs_differ():
    ranks, _ = scenario_results(mismatch_scenario)
    for r in ranks:
        assert r["raised"] and r["is_stage_failed"]  # StageFailed: exit code 1
        assert "config differs" in r["raised"] and "rank 0" in r["raised"] and "rank 1" in r["raised"]
    table = ranks[0]["printed"]
    assert "preflight" in table and "cfg-a" in table and "cfg-b" in table and "fp-same" in table
    assert ranks[1]["printed"] == ""  # one table, from rank 0
