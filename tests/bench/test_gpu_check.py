"""bench/gpu_check.sh on a CPU: what of it can run without a GPU does (its syntax, the honest skip,
the dependency check, the tables from made-up runs); the GPU steps themselves run only on a GPU."""

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.sh"


def _run(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})})


@pytest.mark.parametrize("name", ["gpu_check.sh", "gpu_wheels.sh"])
def test_scripts_parse(name):
    subprocess.run(["bash", "-n", str(REPO / "bench" / name)], check=True)


@pytest.mark.skipif(sys.platform != "linux", reason="bash, timeout and mktemp as on Linux")
def test_without_a_gpu_it_says_skipped_and_builds_nothing(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the check would run")
    work = tmp_path / "work"
    done = _run(env={"GPU_CHECK_DIR": str(work), "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert "gpu_check: skipped: no GPU" in done.stdout
    assert list(work.iterdir()) == []  # no data built, no runs


def test_preflight_finds_every_dependency_of_this_python(tmp_path):
    # no wheels to install (a checkout's .whl/ holds the GPU machine's, for its Python)
    done = _run("--preflight", env={"GPU_CHECK_DIR": str(tmp_path), "GPU_CHECK_WHEELS": str(tmp_path / "none")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dependencies: ok" in done.stdout


def _smi(t: float, u: str) -> str:
    """A line as `nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits` writes it."""
    return f"{datetime.fromtimestamp(t).strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]}, {u}"


def test_summary_reads_nvidia_smis_own_timestamps_within_the_steady_windows(tmp_path):
    t0 = 1_800_000_000.0
    run = tmp_path / "run-resnet50-decode-cpu"
    run.mkdir()
    rows = [{"kind": "train", "step": 10 * (i + 1), "epoch": 0, "time": t0 + 10 * i, "samples_per_s": 100.0,
             "data_wait_share": 0.02, "memory_mb": 1000} for i in range(3)]
    run.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # before the first row (start-up) idle; within the windows (t0, t0 + 20] 95%; one sample unreadable
    lines = [_smi(t0 - 5 + 0.2 * i, "0") for i in range(20)] + [_smi(t0 + 0.5 + i, "95") for i in range(19)]
    lines.insert(25, "2026/12/05 11:00:00.000, [N/A]")
    (tmp_path / "gpu-run-resnet50-decode-cpu.txt").write_text("\n".join(lines) + "\n")
    done = _run("--summary", str(tmp_path))
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if "resnet50-decode-cpu" in x)
    assert " 95% " in line and "2.0%" in line and "meets" in line, done.stdout
    assert "runs missing a goal: none" in done.stdout


def test_summary_leaves_out_the_windows_across_an_epochs_end(tmp_path):
    """The window that holds the wait for a new epoch's first batches is not the steady state."""
    run = tmp_path / "run-vit_b_16-decode-gpu"
    run.mkdir()
    rows = [{"kind": "train", "step": s, "epoch": e, "time": 1_800_000_000.0 + s, "samples_per_s": sps,
             "data_wait_share": w, "memory_mb": 1000}
            for s, e, sps, w in [(10, 1, 50.0, 0.5), (20, 1, 100.0, 0.01), (30, 1, 100.0, 0.03),
                                 (40, 2, 20.0, 0.6), (50, 2, 100.0, 0.02)]]
    run.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = _run("--summary", str(tmp_path))
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if "vit_b_16-decode-gpu" in x)
    assert " 100.0 " in line and " 2.0%" in line, done.stdout  # rows 20, 30 and 50
    assert "n/a" in line and "MISSES" in line  # no utilisation samples: busy unknown, the goal not shown met


@pytest.mark.slow
def test_data_mode_builds_both_sets_on_a_cpu(tmp_path):
    """--data: the steps before the GPU ones (pipe clean and shard with the script's flags, under
    its timeouts), so a flag they no longer take fails here, not in the one GPU session."""
    done = _run("--data", env={"GPU_CHECK_DIR": str(tmp_path), "GPU_CHECK_WHEELS": str(tmp_path / "none"),
                               "IMAGES": "24"}, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "data built" in done.stdout
    for shards in (tmp_path / "data" / "shards", tmp_path / "captioned"):
        assert json.loads((shards / "index.json").read_text())["shards"]


def test_every_pipe_train_flag_the_script_passes_is_one_pipe_train_takes(cli):
    import re

    text = SCRIPT.read_text()
    runs = text[text.index("train() {"):]
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", runs)) - {"--query-gpu", "--format"}  # not nvidia-smi's
    assert {"--decode", "--backend", "--precision", "--max-steps", "--objective", "--strategy"} <= flags
    usage = cli("train", "--help").stdout
    assert flags and not {f for f in flags if f not in usage}, sorted(f for f in flags if f not in usage)
