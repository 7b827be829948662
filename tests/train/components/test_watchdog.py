"""A rank whose batches stop coming ends the run within --stall-timeout, naming rank, host and
shard; the other ranks name it too; under --max-restarts the run resumes exactly."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, pipe_env
from train.components import checkpoint as ckpt
from train.components import watchdog
from train.distributed.group import COLLECTIVE_TIMEOUT_S, Dist


def _dist(rank: int) -> Dist:
    return Dist(rank, 2, rank, 2, "gloo", torch.device("cpu"), "node-a")


def test_a_wait_past_the_timeout_stops_the_rank_and_leaves_a_note_the_others_read(tmp_path):
    stalled: list[str] = []
    dog = watchdog.Watchdog(tmp_path, _dist(1), 0.2, on_stall=stalled.append)
    with dog.waiting(lambda: "its next batch (epoch 1, from shard train-000003.tar)"):
        time.sleep(0.05)  # a batch in time: nothing happens
    assert stalled == []
    with dog.waiting(lambda: "its next batch (epoch 1, from shard train-000003.tar)"):
        deadline = time.monotonic() + 10
        while not stalled and time.monotonic() < deadline:
            time.sleep(0.05)
    dog.close()
    assert stalled and stalled[0].startswith("rank 1 on node-a waited 0 s for its next batch (epoch 1, from shard "
                                             "train-000003.tar): a read that does not return")
    assert "--stall-timeout 0.2" in stalled[0]
    peer = watchdog.Watchdog(tmp_path, _dist(0), 0)  # another rank of the same run
    assert peer.peer_note() == stalled[0]
    assert dog.peer_note() is None  # its own note is no news to the stalled rank


def test_no_timeout_no_thread_and_collectives_wait_longer_than_a_stalled_rank():
    dog = watchdog.Watchdog(Path("."), _dist(0), 0)
    assert dog._thread is None and not any(t.name == "pipe-stall-watchdog" for t in threading.enumerate() if t.is_alive()
                                           and t is dog._thread)
    assert watchdog.collective_timeout(0) == COLLECTIVE_TIMEOUT_S
    assert watchdog.collective_timeout(600) == 900 and watchdog.collective_timeout(5) == COLLECTIVE_TIMEOUT_S


DRILL = ["--model", "image", "--width", "8", "--epochs", "2", "--batch-size", "8", "--checkpoint-every", "3",
         "--log-every", "5", "--workers", "1", "--nproc-per-node", "2"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    from tests.digits import make_digit_shards

    return make_digit_shards(tmp_path_factory.mktemp("digits"), n=200)  # 160 train: 10 steps an epoch on 2 ranks


def _pipe_train(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", "train", *args], capture_output=True, text=True,
                          env={**pipe_env(), **(env or {})}, cwd=REPO, timeout=600)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_stalled_dataloader_worker_ends_the_run_naming_it_and_a_restart_resumes_exactly(digits, tmp_path):
    """Rank 1's dataloader worker is stopped (SIGSTOP) after step 4: its batches stop coming. With
    --stall-timeout 5 the run stops within seconds, not at the collective timeout: rank 1 names
    itself, its host and the shards it waits for; rank 0 names rank 1; no process is left. Under
    --max-restarts 1 the agent restarts the ranks, which resume from the step-3 checkpoint and end
    with the weights of a run that never stalled, bit for bit."""
    stalled = _pipe_train(str(digits), "-o", str(tmp_path / "stalled"), *DRILL, "--stall-timeout", "5",
                          env={"PIPE_FAULT_STALL_AT_STEP": "4:1"})
    assert stalled.returncode == 1, stalled.stderr[-3000:]
    line = next(ln for ln in stalled.stderr.splitlines() if ln.startswith("pipe: failed: rank 1 on "))
    assert "waited 5 s for its next batch (epoch 1, from shard train-0000" in line and "--stall-timeout 5" in line
    # rank 0 names rank 1 when its collective fails first; when the launcher, seeing rank 1 gone, ends
    # rank 0 before that, rank 0 says nothing: either way no other cause is given
    zero = [ln for ln in stalled.stderr.splitlines() if ln.startswith("pipe: rank 0 failed:")]
    assert all("rank 0 stopped with the others: rank 1 on " in ln for ln in zero), stalled.stderr[-3000:]
    assert "internal error" not in stalled.stderr and "Traceback" not in stalled.stderr
    assert subprocess.run(["pgrep", "-f", str(tmp_path / "stalled")], capture_output=True).stdout == b""

    whole = _pipe_train(str(digits), "-o", str(tmp_path / "whole"), *DRILL)
    assert whole.returncode == 0, whole.stderr[-3000:]
    restarted = _pipe_train(str(digits), "-o", str(tmp_path / "restarted"), *DRILL, "--stall-timeout", "5",
                            "--max-restarts", "1", env={"PIPE_FAULT_STALL_AT_STEP": "4:1"})
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "waited 5 s for its next batch" in restarted.stderr and "resumed from" in restarted.stderr
    a, b = ckpt.load(tmp_path / "whole" / ckpt.LAST), ckpt.load(tmp_path / "restarted" / ckpt.LAST)
    assert a["step"] == b["step"] == 20
    assert [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])] == []
