"""--record-keys in training: the keys the checkpointed model trained on, per epoch, rank and
attempt; what a killed attempt trained on after its last checkpoint does not stay in the record."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from tests.fake_data import fake_source, train_config
from train import loop
from train.components import checkpoint as ckpt
from train.components import keys
from train.config import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(tmp: Path, name: str, **over) -> TrainConfig:
    values = dict(epochs=2, batch_size=4, accum=2, model="image", checkpoint_every=4, record_keys=True, log_every=50)
    return train_config(tmp, name, **{**values, **over})


def _run(cfg: TrainConfig) -> None:
    loop.run(cfg, open_data=fake_source(), console=Console(file=io.StringIO(), width=200))


def _crash_after(*steps: int):
    def fault(run_dir, done, d):
        if done in steps and not (run_dir / f".crashed-{done}").exists():
            (run_dir / f".crashed-{done}").touch()
            raise KeyboardInterrupt  # no clean end: only the last checkpoint survives
    return fault


def test_names_say_epoch_rank_and_attempt():
    assert keys.key_file(2, 1, 0) == "epoch2-rank1.txt" and keys.key_file(2, 1, 3) == "epoch2-rank1-attempt3.txt"
    assert keys.parse_name("epoch2-rank1-attempt3.txt") == (2, 1, 3) and keys.parse_name("epoch0-rank0.txt") == (0, 0, 0)
    assert keys.parse_name("epoch0-rank0.txt.tmp") is None


def test_a_run_killed_twice_records_each_sample_once_per_epoch_in_the_uninterrupted_order(tmp_path, monkeypatch):
    """96 samples, 12 steps an epoch (batch 4 x accum 2), checkpoints every 4 steps: crashed after
    step 7 (checkpoint 4) and, resumed, after step 18 (checkpoint 16), resumed again to the end.
    Every epoch's record holds its 96 keys once, in the order an uninterrupted run trained on them;
    the 3 + 2 steps trained after the last checkpoints are gone from the record."""
    _run(_cfg(tmp_path, "whole"))
    real = loop._maybe_inject_fault
    monkeypatch.setattr(loop, "_maybe_inject_fault", _crash_after(7, 18))
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            _run(_cfg(tmp_path, "killed", resume=(tmp_path / "killed" / "last.pt").exists()))
    assert ckpt.load(tmp_path / "killed" / "last.pt")["step"] == 16
    monkeypatch.setattr(loop, "_maybe_inject_fault", real)
    _run(_cfg(tmp_path, "killed", resume=True))
    names = sorted(p.name for p in (tmp_path / "killed" / "keys").iterdir())
    assert names == ["epoch0-rank0-attempt1.txt", "epoch0-rank0.txt", "epoch1-rank0-attempt1.txt",
                     "epoch1-rank0-attempt2.txt"]
    for epoch in range(2):
        trained, skipped = keys.trained_keys(tmp_path / "killed", epoch)
        whole, _ = keys.trained_keys(tmp_path / "whole", epoch)
        assert skipped == [] and len(whole) == 96 and set(Counter(whole).values()) == {1}
        assert trained == whole
    lines = keys.read_epoch(tmp_path / "killed", 0)
    assert [len(v) for v in lines.values()] == [4 * 8, 8 * 8]  # attempt 0 up to its checkpoint at step 4


def test_a_fresh_run_starts_an_empty_record_and_a_resume_without_the_flag_cuts_it_to_the_checkpoint(tmp_path,
                                                                                              monkeypatch):
    stale = tmp_path / "run" / "keys" / "epoch0-rank0-attempt4.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("left by a killed run that never checkpointed\n")
    monkeypatch.setattr(loop, "_maybe_inject_fault", _crash_after(6))
    with pytest.raises(KeyboardInterrupt):
        _run(_cfg(tmp_path, "run", epochs=1, checkpoint_every=2))  # checkpoints at 2, 4 and 6, crashed right after 6
    assert not stale.exists()
    _run(_cfg(tmp_path, "run", epochs=1, checkpoint_every=2, resume=True, record_keys=False))
    assert [len(v) for v in keys.read_epoch(tmp_path / "run", 0).values()] == [6 * 8]  # 6 steps of 8 at the crash
    records = ckpt.load(tmp_path / "run" / "last.pt")["records"]
    assert (records["attempt"], records["files"]) == (1, {})
