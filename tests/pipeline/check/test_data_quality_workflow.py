"""The CI workflow's `pipe` steps, run exactly as .github/workflows/data-quality.yml writes them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from tests.check_fixtures import build_raw
from tests.conftest import REPO
from tests.factories import write

WORKFLOW = REPO / ".github" / "workflows" / "data-quality.yml"


def workflow_steps() -> tuple[dict, list[dict]]:
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    (job,) = doc["jobs"].values()
    return doc.get("env", {}), [s for s in job["steps"] if str(s.get("run", "")).startswith("pipe ")]


def run_workflow(tmp_path: Path, dataset: Path) -> list[subprocess.CompletedProcess]:
    """Each `pipe` step in order, under bash -e as GitHub runs `run:`, stopping at the first failure."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pipe = bin_dir / "pipe"  # what `pip install` would put on PATH
    pipe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m pipeline "$@"\n')
    pipe.chmod(pipe.stat().st_mode | stat.S_IEXEC)
    env_vars, steps = workflow_steps()
    env = {**os.environ, **{k: str(v) for k, v in env_vars.items()}, "DATASET": str(dataset),
           "WORK": str(tmp_path / "work"), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(REPO)}
    done = []
    for step in steps:
        p = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        done.append(p)
        if p.returncode:
            break
    return done


def test_workflow_runs_clean_shard_check_with_the_committed_policy():
    env, steps = workflow_steps()
    assert [s["name"] for s in steps] == ["Clean", "Shard", "Check"]
    assert (REPO / env["POLICY"]).is_file()
    assert "--junit" in steps[-1]["run"]


def test_workflow_passes_a_good_dataset_and_writes_junit(tmp_path):
    done = run_workflow(tmp_path, build_raw(tmp_path / "raw"))
    assert [p.returncode for p in done] == [0, 0, 0], done[-1].stderr + done[-1].stdout
    root = ET.parse(tmp_path / "work" / "data-quality.xml").getroot()
    assert [s.get("name").split()[2] for s in root.findall("testsuite")] == ["clean", "shard"]
    assert root.get("failures") == "0" and int(root.get("tests")) >= 26


@pytest.mark.slow
def test_workflow_fails_the_job_when_the_data_breaks_the_policy(tmp_path):
    raw = build_raw(tmp_path / "raw")
    for i in range(14):  # 14 of 27 files quarantined: more than the policy's half
        write(raw / "dogs" / f"broken{i}.jpg", b"\xff\xd8\xff\xe0 not really a jpeg")
    done = run_workflow(tmp_path, raw)
    assert [p.returncode for p in done] == [0, 0, 1]
    assert "quarantined_fraction" in done[-1].stdout
    failed = ET.parse(tmp_path / "work" / "data-quality.xml").getroot().findall(".//testcase[failure]")
    assert [c.get("name") for c in failed] == ["quarantined_fraction"]


@pytest.mark.parametrize("path", [".github/data-quality.toml"])
def test_committed_policy_is_valid(path):
    from pipeline.check.policy import load

    assert load(REPO / path).max_leaked_samples == 0
