"""Checkpoints: never half-written, best.pt survives later saves, RNG states round-trip."""

from __future__ import annotations

import errno
import os
import random

import numpy as np
import pytest
import torch

from pipeline.core.errors import StageFailed, UsageError
from train.components import checkpoint as ckpt


def _state(value: float) -> dict:
    return {"format": ckpt.CHECKPOINT_FORMAT, "model": {"w": torch.full((3,), value)}, "step": int(value)}


def test_a_save_that_dies_midway_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    ckpt.save_atomic(_state(1), tmp_path / ckpt.LAST)

    def dies(obj, f, *a, **k):
        f.write(b"half a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", dies)
    with pytest.raises(OSError):
        ckpt.save_atomic(_state(2), tmp_path / ckpt.LAST)
    monkeypatch.undo()
    assert ckpt.load(tmp_path / ckpt.LAST)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == [ckpt.LAST]  # no temporary file left behind


def test_a_full_disk_says_so_in_one_line_and_the_last_checkpoint_stays_loadable(tmp_path, monkeypatch):
    """torch.save's own error for a write that found no room is an assertion about zip offsets;
    the save says what happened and what stays, and leaves no partial file taking the space."""
    ckpt.save_atomic(_state(3), tmp_path / ckpt.LAST)
    real = ckpt._Writes.write

    def full_after_100_bytes(self, data):
        self.written = getattr(self, "written", 0) + len(data)
        if self.written > 100:
            self.error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            raise self.error
        return real(self, data)

    monkeypatch.setattr(ckpt._Writes, "write", full_after_100_bytes)
    with pytest.raises(StageFailed) as e:
        ckpt.save_atomic({**_state(4), "model": {"w": torch.zeros(10_000)}}, tmp_path / ckpt.LAST)
    monkeypatch.undo()
    msg = str(e.value)
    assert msg.startswith(f"no room to write the checkpoint last.pt in {tmp_path} (No space left on device, ")
    assert f"the last checkpoint stays {tmp_path / ckpt.LAST} (step 3), intact" in msg and "--resume" in msg
    assert ckpt.load(tmp_path / ckpt.LAST)["step"] == 3
    assert [p.name for p in tmp_path.iterdir()] == [ckpt.LAST]


def test_best_keeps_its_version_when_last_moves_on(tmp_path):
    ckpt.save_atomic(_state(1), tmp_path / ckpt.LAST)
    ckpt.mark_best(tmp_path)
    ckpt.save_atomic(_state(2), tmp_path / ckpt.LAST)
    assert ckpt.load(tmp_path / ckpt.BEST)["step"] == 1
    assert ckpt.load(tmp_path / ckpt.LAST)["step"] == 2


def test_load_refuses_files_that_are_not_pipe_checkpoints(tmp_path):
    torch.save({"w": torch.zeros(1)}, tmp_path / "plain.pt")
    with pytest.raises(UsageError, match="not written by pipe train"):
        ckpt.load(tmp_path / "plain.pt")
    (tmp_path / "cut.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(UsageError, match="not a readable checkpoint"):
        ckpt.load(tmp_path / "cut.pt")


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    ckpt.save_atomic({"format": ckpt.CHECKPOINT_FORMAT, "rng": [ckpt.rng_state()]}, tmp_path / ckpt.LAST)
    expected = (torch.rand(4), random.random(), np.random.rand(2))
    ckpt.set_rng_state(ckpt.load(tmp_path / ckpt.LAST)["rng"][0])  # loads with weights_only=True
    got = (torch.rand(4), random.random(), np.random.rand(2))
    assert torch.equal(expected[0], got[0]) and expected[1] == got[1] and np.array_equal(expected[2], got[2])
