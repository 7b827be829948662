"""A run that stops on purpose, every rank at the same step: a SIGTERM (a checkpoint at the next
step boundary, exit 143 and the --resume line) and a non-finite loss (stopped at the first such
step, before anything is saved). Real signals, in-process and through the launchers."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from pipeline.core.errors import StageFailed
from tests.conftest import REPO, pipe_env
from tests.fake_data import fake_source, train_config
from train import loop
from train.components import checkpoint as ckpt
from train.config import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(tmp: Path, name: str, **over) -> TrainConfig:
    return train_config(tmp, name, **{**dict(epochs=2, model="image", checkpoint_every=5, log_every=50), **over})


def _run(cfg: TrainConfig) -> tuple[dict, str]:
    out = io.StringIO()
    summary = loop.run(cfg, open_data=fake_source(), console=Console(file=out, width=300))
    return summary, out.getvalue()


def _sigterm_after(step: int):
    def fault(run_dir, done, d):
        if done == step and not (run_dir / ".terminated").exists():
            (run_dir / ".terminated").touch()
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal, to this process: the handler only sets a flag
    return fault


def test_a_sigterm_saves_at_the_next_step_boundary_and_the_resumed_run_ends_bit_identical(tmp_path, monkeypatch):
    """12 steps an epoch, checkpoints every 5: a SIGTERM right after step 7 (its flags already
    exchanged) stops every rank after step 8, the next boundary, with last.pt written there (not
    the step-5 one: nothing is trained twice); the run returns as interrupted (no closing table),
    the handler before the run is back; --resume ends with the weights of a run never stopped."""
    _run(_cfg(tmp_path, "whole"))
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(loop, "_maybe_inject_fault", _sigterm_after(7))
    summary, printed = _run(_cfg(tmp_path, "stopped"))
    assert summary["interrupted"] == "SIGTERM" and summary["steps"] == 8
    assert "SIGTERM (rank 0): every rank stopped after step 8 (epoch 1)" in printed and "last.pt holds it" in printed
    saved = ckpt.load(tmp_path / "stopped" / ckpt.LAST)
    assert (saved["step"], saved["epoch"], saved["step_in_epoch"]) == (8, 0, 8)
    assert signal.getsignal(signal.SIGTERM) is before
    summary, printed = _run(_cfg(tmp_path, "stopped", resume=True))
    assert summary["interrupted"] is None and "resumed from" in printed and "step 8" in printed
    a, b = ckpt.load(tmp_path / "whole" / ckpt.LAST), ckpt.load(tmp_path / "stopped" / ckpt.LAST)
    assert a["step"] == b["step"] == 24
    assert [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])] == []


def test_a_sigterm_at_an_epoch_end_validates_and_saves_that_epoch_first(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "_maybe_inject_fault", _sigterm_after(11))
    summary, printed = _run(_cfg(tmp_path, "stopped"))
    assert summary["interrupted"] == "SIGTERM" and "epoch 1: val loss" in printed
    saved = ckpt.load(tmp_path / "stopped" / ckpt.LAST)
    assert (saved["step"], saved["epoch"], saved["step_in_epoch"]) == (12, 1, 0)
    assert (tmp_path / "stopped" / ckpt.BEST).exists()


def test_a_diverging_run_stops_at_the_first_non_finite_loss_keeping_the_last_good_checkpoint(tmp_path):
    """--lr 1e30: the first step's update blows the weights up; the loss of a later step is not
    finite. The run stops at that step, naming it and the rank, before any save: last.pt is the
    checkpoint of the step before (every step here), finite, and no best.pt claims anything."""
    with pytest.raises(StageFailed) as e:
        _run(_cfg(tmp_path, "nan", lr=1e30, checkpoint_every=1, grad_clip=0))
    msg = str(e.value)
    step = int(re.search(r"at step (\d+) \(epoch 1\) on rank 0", msg).group(1))
    assert "stopped before saving" in msg and f"last.pt (step {step - 1}) is the last good checkpoint" in msg
    saved = ckpt.load(tmp_path / "nan" / ckpt.LAST)
    assert saved["step"] == step - 1
    assert all(torch.isfinite(t).all() for t in saved["model"].values() if t.is_floating_point())
    assert not (tmp_path / "nan" / ckpt.BEST).exists()


def test_a_non_finite_loss_names_the_keys_of_its_batch(tmp_path, monkeypatch):
    """One sample turns its batch's loss into NaN (here by a patched forward): the line names the
    keys of that micro-batch, and nothing was saved at that step."""
    from train.objectives import classify

    real = classify.forward

    def poisoned(wrapped, model, batch):
        logits = real(wrapped, model, batch)
        return logits * float("nan") if "train000042" in batch["key"] else logits

    monkeypatch.setattr(classify, "forward", poisoned)
    with pytest.raises(StageFailed, match=r"the loss became NaN at step \d+ \(epoch 1\) on rank 0, in a batch of keys "
                                          r"(train\d{6}, ){7}train\d{6}:") as e:
        _run(_cfg(tmp_path, "poisoned", checkpoint_every=1))
    assert "train000042" in str(e.value)
    step = int(re.search(r"at step (\d+)", str(e.value)).group(1))
    assert ckpt.load(tmp_path / "poisoned" / ckpt.LAST)["step"] == step - 1


# -- real processes: the launchers pass a SIGTERM on, every rank stops at one step -----------------

DRILL = ["--model", "image", "--width", "8", "--epochs", "2", "--batch-size", "8", "--checkpoint-every", "3",
         "--log-every", "5", "--workers", "1"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    from tests.digits import make_digit_shards

    return make_digit_shards(tmp_path_factory.mktemp("digits"), n=200)  # 160 train: 10 steps an epoch on 2 ranks


def _pipe_train(*args: str, env: dict | None = None, torchrun: bool = False) -> subprocess.CompletedProcess:
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"] if torchrun else [sys.executable]
    return subprocess.run([*head, "-m", "pipeline", "train", *args], capture_output=True, text=True,
                          env={**pipe_env(), **(env or {})}, cwd=REPO, timeout=600)


def _stopped_at(stderr: str) -> int:
    return int(re.search(r"every rank stopped after step (\d+)", stderr).group(1))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_sigterm_to_our_launcher_checkpoints_every_rank_at_one_step_and_resumes_bit_identical(digits, tmp_path):
    """pipe train --nproc-per-node 2; the launcher gets a SIGTERM (rank 1 sends it after step 4, as
    a scheduler would): its agent passes it on, both ranks stop after the same step with a
    checkpoint there, exit 143 with the --resume line; --resume ends equal to a run never stopped."""
    whole = _pipe_train(str(digits), "-o", str(tmp_path / "whole"), *DRILL, "--nproc-per-node", "2")
    assert whole.returncode == 0, whole.stderr[-3000:]
    run = tmp_path / "run"
    p = _pipe_train(str(digits), "-o", str(run), *DRILL, "--nproc-per-node", "2",
                    env={"PIPE_FAULT_TERM_LAUNCHER_AT_STEP": "4:1"})
    assert p.returncode == 143, p.stderr[-3000:]
    assert "interrupted: SIGTERM: run the same command with --resume" in p.stderr
    assert "internal error" not in p.stderr and "Traceback" not in p.stderr
    step = _stopped_at(p.stderr)
    assert 4 <= step < 20 and ckpt.load(run / ckpt.LAST)["step"] == step
    resumed = _pipe_train(str(digits), "-o", str(run), *DRILL, "--nproc-per-node", "2", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = ckpt.load(tmp_path / "whole" / ckpt.LAST), ckpt.load(run / ckpt.LAST)
    assert a["step"] == b["step"] == 20
    assert [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])] == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_ranks_sigterm_stops_every_rank_at_the_same_step(digits, tmp_path):
    """Only rank 1 gets the SIGTERM (right after step 4, mid-epoch): rank 0 stops after the same
    step, 5 (the ranks exchange their flags after every step), the checkpoint holds step 5, and
    the key record shows both ranks trained on the same number of batches."""
    run = tmp_path / "run"
    p = _pipe_train(str(digits), "-o", str(run), *DRILL, "--nproc-per-node", "2", "--record-keys",
                    env={"PIPE_FAULT_TERM_AT_STEP": "4:1"})
    assert p.returncode == 143, p.stderr[-3000:]
    assert "SIGTERM (rank 1): every rank stopped after step 5 (epoch 1)" in p.stderr
    assert ckpt.load(run / ckpt.LAST)["step"] == 5
    lines = [len((run / "keys" / f"epoch0-rank{r}.txt").read_text().splitlines()) for r in range(2)]
    assert lines == [5 * 8, 5 * 8]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_under_torchrun_a_sigterm_checkpoints_and_every_rank_says_interrupted(digits, tmp_path):
    """torchrun passes its SIGTERM on to its ranks' process groups (dataloader workers included:
    they outlive it until their rank closes them); each rank is `pipe train`, saves at the same
    step and ends with exit 143 and the --resume line (torchrun itself then reports the signal)."""
    run = tmp_path / "run"
    p = _pipe_train(str(digits), "-o", str(run), *DRILL, torchrun=True, env={"PIPE_FAULT_TERM_LAUNCHER_AT_STEP": "4:1"})
    assert p.returncode != 0
    assert p.stderr.count("interrupted: SIGTERM: run the same command with --resume") == 2, p.stderr[-3000:]
    assert "internal error" not in p.stderr and "DataLoader worker" not in p.stderr
    assert ckpt.load(run / ckpt.LAST)["step"] == _stopped_at(p.stderr)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_under_max_restarts_a_non_finite_loss_stops_once_instead_of_restarting_into_it(digits, tmp_path):
    """Both ranks see the NaN at the same step: a restart from last.pt would train into it again on
    the same data. With --max-restarts 2 the run still ends at once, exit 1, the line said once,
    no rank restarted (no "resumed from"), and last.pt is the step before the NaN."""
    run = tmp_path / "run"
    p = _pipe_train(str(digits), "-o", str(run), *DRILL, "--nproc-per-node", "2", "--max-restarts", "2",
                    "--lr", "1e30", "--checkpoint-every", "1")
    assert p.returncode == 1, p.stderr[-3000:]
    said = re.findall(r"the loss became \w+ at step (\d+)", p.stderr)
    assert len(said) == 1, p.stderr[-3000:]
    assert "resumed from" not in p.stderr + p.stdout and "Traceback" not in p.stderr
    assert ckpt.load(run / ckpt.LAST)["step"] == int(said[0]) - 1


# -- a full disk mid-run: one line, and the last checkpoint stays loadable ---------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs (root only: skipped where mounting is not allowed)."""
    where = tmp_path / "small"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_disk_that_fills_up_mid_run_stops_it_in_one_line_and_the_resume_continues(tmp_path, small_disk, monkeypatch):
    """RUN_DIR on a 4 MB disk; after the step-5 checkpoint something else fills the disk: the
    step-10 save (or the records written with it, whichever comes first) fails with one line naming
    the disk and the intact step-5 checkpoint; once there is room again, --resume continues."""
    filler = small_disk / "filler"

    def fill_after_6(run_dir, done, d):
        if done == 6 and not filler.exists():
            with open(filler, "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass

    monkeypatch.setattr(loop, "_maybe_inject_fault", fill_after_6)
    run = small_disk / "run"
    with pytest.raises(StageFailed) as e:
        _run(_cfg(tmp_path, "unused", output=run, model="image"))
    assert re.match(rf"no room to write .+? in {re.escape(str(run))} \(No space left on device, [\d.]+ MB free\)", str(e.value))
    assert f"the last checkpoint stays {run / ckpt.LAST} (step 5), intact" in str(e.value)
    assert ckpt.load(run / ckpt.LAST)["step"] == 5
    filler.unlink()
    monkeypatch.undo()
    summary, printed = _run(_cfg(tmp_path, "unused", output=run, model="image", resume=True))
    assert "resumed from" in printed and "step 5" in printed and summary["steps"] == 24
