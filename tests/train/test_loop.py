"""The training loop end to end on a stand-in reader: it learns, writes what it promises, resumes
exactly (also after a real SIGKILL under torchrun --max-restarts), and fails with clear messages."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from pipeline.core.errors import StageFailed, UsageError
from tests.conftest import REPO, pipe_env
from tests.fake_data import fake_source, train_config, write_index
from tests.gloo import scenario_results
from train import loop
from train.components import checkpoint as ckpt
from train.config import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(tmp: Path, name: str = "run", **over) -> TrainConfig:
    return train_config(tmp, name, **{**dict(epochs=2, log_every=3, model="image-text", lr=5e-3), **over})


def _run(cfg: TrainConfig, **data) -> tuple[dict, str]:
    out = io.StringIO()
    summary = loop.run(cfg, open_data=fake_source(**data), console=Console(file=out, width=300))
    return summary, out.getvalue()


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _same_tensors(a: dict, b: dict) -> list[str]:
    return [k for k in a if not torch.equal(a[k], b[k])]


def test_a_run_learns_and_writes_checkpoints_metrics_and_tensorboard(tmp_path):
    cfg = _cfg(tmp_path)
    summary, printed = _run(cfg)
    assert summary["steps"] == 2 * (96 // 8) and summary["epochs"] == 2
    assert summary["val_acc"] > 0.8  # three separable classes: chance is 1/3
    assert "global batch 8 = 8 per rank x 1 rank x 1 accumulation step" in printed
    state = ckpt.load(cfg.output / "last.pt")
    for key in ("model", "optimizer", "scheduler", "scaler", "epoch", "step", "reader", "rng", "config",
                "dataset_fingerprint"):
        assert key in state, key
    assert state["reader"] == {"epoch": 2, "consumed": 0, "world_size": 1, "batch_size": 8}
    assert state["config"]["global_batch"] == 8 and state["config"]["precision"] == "fp32"
    assert (cfg.output / "best.pt").exists()
    rows = _metrics(cfg.output)
    assert [r["epoch"] for r in rows if r["kind"] == "val"] == [1, 2]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert train_rows[-1]["loss"] < train_rows[0]["loss"]
    assert list((cfg.output / "tb").glob("events.out.tfevents.*"))
    assert json.loads((cfg.output / "config.json").read_text())["world_size"] == 1


def _crash_after(step: int):
    def fault(run_dir, done, d):
        if done == step:
            raise KeyboardInterrupt  # dies like Ctrl-C would: no clean end, only the last checkpoint
    return fault


def test_resume_after_a_crash_mid_epoch_ends_bit_identical(tmp_path, monkeypatch):
    whole = _cfg(tmp_path, "whole", checkpoint_every=4, accum=2, batch_size=4)
    _run(whole)
    crashed = _cfg(tmp_path, "crashed", checkpoint_every=4, accum=2, batch_size=4)
    real_fault_hook = loop._maybe_inject_fault
    monkeypatch.setattr(loop, "_maybe_inject_fault", _crash_after(7))  # checkpoint at step 4; steps 5-7 lost
    with pytest.raises(KeyboardInterrupt):
        _run(crashed)
    assert ckpt.load(crashed.output / "last.pt")["step"] == 4
    monkeypatch.setattr(loop, "_maybe_inject_fault", real_fault_hook)
    _, printed = _run(_cfg(tmp_path, "crashed", checkpoint_every=4, accum=2, batch_size=4, resume=True))
    assert "resumed from" in printed and "step 4" in printed
    a, b = ckpt.load(whole.output / "last.pt"), ckpt.load(crashed.output / "last.pt")
    assert a["step"] == b["step"] == 24
    assert _same_tensors(a["model"], b["model"]) == []
    # metrics.jsonl holds each step once: lines the crashed run wrote past step 4 were dropped
    steps = [r["step"] for r in _metrics(crashed.output) if r["kind"] == "train"]
    assert steps == sorted(set(steps)) == [r["step"] for r in _metrics(whole.output) if r["kind"] == "train"]


def test_an_existing_run_needs_resume_and_resume_needs_a_run(tmp_path):
    cfg = _cfg(tmp_path, max_steps=2)
    with pytest.raises(UsageError, match="no last.pt"):
        _run(_cfg(tmp_path, resume=True))
    _run(cfg)
    with pytest.raises(UsageError, match="add --resume"):
        _run(cfg)
    write_index(tmp_path / "other", tag="another dataset")
    with pytest.raises(UsageError, match="another dataset"):
        _run(_cfg(tmp_path, shard_dir=tmp_path / "other", resume=True))


def test_max_steps_stops_mid_epoch_and_a_resume_keeps_the_schedule(tmp_path):
    summary, _ = _run(_cfg(tmp_path, max_steps=5))
    state = ckpt.load(tmp_path / "run" / "last.pt")
    assert (summary["steps"], state["step"], state["epoch"], state["step_in_epoch"]) == (5, 5, 0, 5)
    assert state["reader"]["consumed"] == 5 * 8
    # the cosine ended at step 5: continuing to 8 would train at the floor while claiming max_steps 8
    with pytest.raises(UsageError, match=r"made with --max-steps 5 --lr 0.005; got --max-steps 8 --lr 0.1"):
        _run(_cfg(tmp_path, max_steps=8, lr=0.1, resume=True))
    summary, printed = _run(_cfg(tmp_path, max_steps=5, resume=True, workers=0, log_every=7))  # same run: nothing left
    assert "resumed from" in printed and summary["steps"] == 5


def test_a_finished_run_goes_on_for_more_epochs_on_the_schedule_of_the_longer_run(tmp_path):
    """2 epochs (24 steps) finished; --resume --epochs 4 trains 24 more, saying so, and from step 24
    on its learning rate is, step for step, that of a run of 4 epochs from the start (the warmup
    given in steps: the same in both); fewer epochs than the run has are refused."""
    _run(_cfg(tmp_path, "short", warmup=2, log_every=1))
    summary, printed = _run(_cfg(tmp_path, "short", warmup=2, log_every=1, epochs=4, resume=True))
    assert summary["steps"] == 48 and summary["epochs"] == 4
    assert "resume: the run goes on from 2 to 4 epochs (24 -> 48 optimizer steps): the cosine schedule now ends at " \
           "step 48, so from step 24 the learning rate is" in printed
    _run(_cfg(tmp_path, "long", warmup=2, log_every=1, epochs=4))
    lr = {name: {r["step"]: r["lr"] for r in _metrics(tmp_path / name) if r["kind"] == "train"} for name in ("short", "long")}
    assert [lr["short"][s] for s in range(25, 49)] == [lr["long"][s] for s in range(25, 49)]
    assert lr["short"][24] < lr["short"][25]  # the floor it had decayed to, then back up the longer cosine
    assert ckpt.load(tmp_path / "short" / "last.pt")["config"]["epochs"] == 4
    with pytest.raises(UsageError, match="made with --epochs 4; got --epochs 3"):
        _run(_cfg(tmp_path, "short", warmup=2, epochs=3, resume=True))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_trains_on_cpu(tmp_path, precision):
    cfg = _cfg(tmp_path, precision=precision, epochs=1, model="image")
    summary, printed = _run(cfg)
    assert f"precision {precision}" in printed
    assert summary["val_loss"] is not None and summary["val_loss"] == summary["val_loss"]  # finite, not NaN
    scaler = ckpt.load(cfg.output / "last.pt")["scaler"]
    assert bool(scaler) == (precision == "fp16")  # a grad scaler for fp16 only


def test_finetune_from_a_checkpoint_with_freeze_then_unfreeze(tmp_path):
    _run(_cfg(tmp_path, "base", epochs=1, model="image"))
    base = ckpt.load(tmp_path / "base" / "last.pt")["model"]
    write_index(tmp_path / "four", classes=["a", "b", "c", "d"])
    ft = dict(shard_dir=tmp_path / "four", model="image", init_from=tmp_path / "base" / "last.pt", freeze=0.7,
              unfreeze_at="2")
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), pytest.MonkeyPatch.context() as m:  # a crash early in epoch 2
        m.setattr(loop, "_maybe_inject_fault", _crash_after(96 // 8 + 1))
        loop.run(_cfg(tmp_path, "ft", epochs=2, **ft), open_data=fake_source(), console=Console(file=out, width=300))
    printed = out.getvalue()
    assert "head re-initialised" in printed and "file has 3 classes, this dataset 4" in printed
    assert "epoch 1: frozen 4 of 6 blocks (70% asked)" in printed
    assert ckpt.load(tmp_path / "ft" / "last.pt")["epoch"] == 1  # the checkpoint at the end of epoch 1
    epoch1 = ckpt.load(tmp_path / "ft" / "last.pt")["model"]
    frozen = [k for k in base if k.startswith(("image.stem", "image.blocks.0.", "image.blocks.1.", "image.blocks.2."))]
    trained = [k for k in base if k.startswith(("image.blocks.3.", "image.blocks.4."))]
    assert frozen and trained
    assert _same_tensors({k: base[k] for k in frozen}, epoch1) == []  # frozen: untouched in epoch 1
    assert len(_same_tensors({k: base[k] for k in trained}, epoch1)) == len(trained)
    _, printed = _run(_cfg(tmp_path, "ft", epochs=2, resume=True, **ft))
    assert "epoch 2: frozen 0 of 6 blocks" in printed
    epoch2 = ckpt.load(tmp_path / "ft" / "last.pt")["model"]
    assert len(_same_tensors({k: epoch1[k] for k in frozen}, epoch2)) == len(frozen)  # unfrozen: they train


def test_an_epoch_shorter_than_one_step_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="fewer than one optimizer step"):
        _run(_cfg(tmp_path, batch_size=8, accum=4), n_train=24)


def test_out_of_memory_in_a_step_names_the_settings_to_change(tmp_path, monkeypatch):
    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr("train.objectives.classify.forward", oom)  # what the loop's step calls (its objective's loss)
    with pytest.raises(StageFailed) as e:
        _run(_cfg(tmp_path, batch_size=8))
    msg = str(e.value)
    for part in ("per-rank batch 8", "precision fp32", "gradient checkpointing off", "--auto-micro-batch", "--accum"):
        assert part in msg


# -- two ranks on real shards: SIGKILL, restarted by the elastic agent, resumed by itself ---------

RUN_FLAGS = {"model": "image-text", "width": 8, "epochs": 2, "batch_size": 4, "accum": 2, "checkpoint_every": 2,
             "workers": 1, "log_every": 1}


def _real_shards(root: Path) -> Path:
    from tests.train_shards import make_shards

    # 48 train samples: 24 per rank = 6 batches of 4 = 3 optimizer steps (accum 2) per epoch; 12 val
    return make_shards(root, n=60, classes=3, size=32)


def reference_run_scenario(workdir):
    """The uninterrupted 2-rank run the killed one must match (each rank builds its own,
    byte-identical copy of the shards, so the preflight's dataset hashes agree)."""
    import torch.distributed as dist

    shards = _real_shards(workdir / f"data-rank{os.environ['RANK']}")
    loop.run(TrainConfig(shard_dir=shards, output=workdir / "whole", **RUN_FLAGS), console=Console(file=io.StringIO()))
    assert not dist.is_initialized()
    return str(shards)


def _flags(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in (f"--{k.replace('_', '-')}", str(v))]


@pytest.mark.slow
def test_sigkill_restart_resumes_by_itself_and_ends_bit_identical(tmp_path):
    """pipe train --nproc-per-node 2 --max-restarts 1; rank 1 SIGKILLs itself after step 5 (the last
    checkpoint is step 4, mid-epoch 2): the elastic agent restarts both ranks, they resume from
    last.pt mid-epoch (dataloader workers and all), and the weights end equal, bit for bit."""
    _, workdir = scenario_results(reference_run_scenario)
    shards = _real_shards(tmp_path)
    env = {**pipe_env(), "PIPE_FAULT_KILL_AT_STEP": "5:1"}
    p = subprocess.run([sys.executable, "-m", "pipeline", "train", str(shards), "-o", str(tmp_path / "killed"),
                        "--nproc-per-node", "2", "--max-restarts", "1", *_flags(RUN_FLAGS)],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "killed" / ".fault-injected").exists()
    assert "resumed from" in p.stderr and "epoch 2, step 4" in p.stderr  # the last checkpoint before the kill
    assert "terminate called" not in p.stderr
    a, b = ckpt.load(workdir / "whole" / "last.pt"), ckpt.load(tmp_path / "killed" / "last.pt")
    assert a["step"] == b["step"] == 6
    assert _same_tensors(a["model"], b["model"]) == []
    for pa, pb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(pa["exp_avg"], pb["exp_avg"]) and torch.equal(pa["exp_avg_sq"], pb["exp_avg_sq"])


@pytest.mark.slow
def test_validation_is_exact_across_ranks():
    """2 ranks, 12 val samples in batches of 4: the reader tops the ranks' last batches up with
    repeats marked invalid; they are not counted, and the all-reduced loss and accuracy equal one
    process's over the whole val split."""
    from train.data.reader import ShardReader
    from train.models.builtin import build_model

    shards, workdir = scenario_results(reference_run_scenario)
    val = [r for r in _metrics(workdir / "whole") if r["kind"] == "val"][-1]
    reader = ShardReader(shards[0], "val", 0, 1, batch_size=12, fields=("image", "text"))
    assert val["val_samples"] == reader.steps_per_epoch * 12 == 12
    model = build_model("image-text", 3, width=8)
    model.load_state_dict(ckpt.load(workdir / "whole" / "last.pt")["model"])  # saved right after that validation
    model.eval()
    batch = next(iter(reader))
    with torch.no_grad():
        logits = model(image=batch["image"], text=batch["text"], text_len=batch["text_len"])
    assert val["val_loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, batch["label"]).item(), rel=1e-5)
    assert val["val_acc"] == pytest.approx((logits.argmax(1) == batch["label"]).float().mean().item())


# -- issue 23's drills on digit scans, 2 CPU ranks: killed and resumed, on other world sizes --------

DRILL = {"model": "image", "width": 8, "epochs": 2, "checkpoint_every": 3, "log_every": 5}


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    from tests.digits import make_digit_shards

    return make_digit_shards(tmp_path_factory.mktemp("digits"), n=200)  # 160 train, 40 val


def _pipe_train(shards: Path, run: Path, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", "train", str(shards), "-o", str(run), *flags],
                          capture_output=True, text=True, env={**pipe_env(), **(env or {})}, cwd=REPO, timeout=600)


def _full_state(run: Path) -> dict:
    """The run's last model and optimizer state, whole: last.pt, or a last.dcp gathered into one file."""
    if not (run / ckpt.LAST_DCP).exists():
        return ckpt.load(run / ckpt.LAST)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = run / "gathered.pt"
    dcp_to_torch_save(os.path.realpath(run / ckpt.LAST_DCP), out)
    return torch.load(out, weights_only=False)


def _once_per_epoch(run: Path, epochs: int, expect: int) -> list[list[str]]:
    """Each epoch's trained keys over every rank and attempt; each sample once, ``expect`` of them."""
    from train.components import keys

    out = []
    for epoch in range(epochs):
        trained, skipped = keys.trained_keys(run, epoch)
        assert skipped == [] and len(trained) == expect and len(set(trained)) == expect, (epoch, len(trained))
        out.append(trained)
    return out


def _per_rank(run: Path, epoch: int) -> dict[int, list[str]]:
    from train.components import keys

    out: dict[int, list[str]] = {}
    for (_, rank), lines in keys.read_epoch(run, epoch).items():  # attempt order
        out.setdefault(rank, []).extend(lines)
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_killed_twice_with_2_workers_a_rank_resumes_twice_to_identical_weights(digits, tmp_path, strategy):
    """2 ranks x 2 dataloader workers, 10 steps an epoch, checkpoints every 3: rank 1 SIGKILLed after
    step 4 and, restarted by the elastic agent, after step 13 (mid-epoch both times, the second in
    the other epoch): the run resumes twice by itself and ends with the uninterrupted run's weights
    and AdamW moments, bit for bit; the key record holds every epoch's 160 samples once, over the
    three attempts' files (what the killed attempts trained past their checkpoints cut off)."""
    flags = [*_flags({**DRILL, "batch_size": 8, "workers": 2, "strategy": strategy}), "--record-keys",
             "--nproc-per-node", "2"]
    whole = _pipe_train(digits, tmp_path / "whole", *flags)
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = _pipe_train(digits, tmp_path / "killed", *flags, "--max-restarts", "2",
                         env={"PIPE_FAULT_KILL_AT_STEP": "4,13:1"})
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert (tmp_path / "killed" / ".fault-injected").read_text().count("SIGKILL") == 2
    assert killed.stderr.count("resumed from") == 2 and "terminate called" not in killed.stderr
    a, b = _full_state(tmp_path / "whole"), _full_state(tmp_path / "killed")
    assert _same_tensors(a["model"], b["model"]) == []
    for name, moments in a["optimizer"]["state"].items():
        for k, v in moments.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(b["optimizer"]["state"][name][k])), (name, k)
    _once_per_epoch(tmp_path / "whole", 2, 160), _once_per_epoch(tmp_path / "killed", 2, 160)
    for epoch in range(2):  # and rank by rank in the same order, the attempts' files one after the other
        assert _per_rank(tmp_path / "killed", epoch) == _per_rank(tmp_path / "whole", epoch)
    attempts = {p.name.rpartition("-attempt")[2] for p in (tmp_path / "killed" / "keys").glob("*-attempt*.txt")}
    assert attempts == {"1.txt", "2.txt"}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("strategy,before,after", [("ddp", 2, 1), ("fsdp", 2, 3)])
def test_resumed_on_another_world_size_each_sample_once_and_the_next_epoch_as_that_size_plans_it(
        digits, tmp_path, strategy, before, after):
    """Global batch 12 on 2 ranks (160 samples: 13 steps an epoch, 4 left out), rank 1 SIGKILLed
    after step 5 (checkpoint 3); resumed on ``after`` ranks: the rest of epoch 1 is the samples it
    had not trained on, each once (the key record over both attempts: 156 distinct keys, the 4
    left out not among them), every new rank the same steps; epoch 2 is exactly what a run
    started on ``after`` ranks reads in its epoch 2."""
    from tests.digits import keys_by_position
    from train.components import keys
    from train.data.plan import block_key, epoch_plan, rank_stream

    flags = [*_flags({**DRILL, "global_batch": 12, "workers": 1, "strategy": strategy}), "--record-keys"]
    run = tmp_path / "run"
    first = _pipe_train(digits, run, *flags, "--nproc-per-node", str(before), env={"PIPE_FAULT_KILL_AT_STEP": "5:1"})
    assert first.returncode != 0 and "SIGKILL rank 1 after step 5" in (run / ".fault-injected").read_text()
    resumed = _pipe_train(digits, run, *flags, "--nproc-per-node", str(after), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "epoch 1, step 3" in resumed.stderr
    assert "continues on another layout" in resumed.stderr and "the 120 samples it has not trained on yet" in resumed.stderr
    epoch1, _ = _once_per_epoch(run, 2, 156)
    names = keys_by_position(digits)
    counts = [s["count"] for s in json.loads((digits / "index.json").read_text())["shards"] if s["split"] == "train"]
    left_out = epoch_plan(counts, before, 12 // before, 0, 0).dropped
    assert set(epoch1) == set(names.values()) - {names[x] for x in left_out}
    lines = keys.read_epoch(run, 0)
    assert {len(v) for (attempt, _), v in lines.items() if attempt == 1} == {120 // after}  # equal steps per rank
    later = epoch_plan(counts, after, 12 // after, 0, 1)
    for rank in range(after):
        want = [names[(s, i)] for s, i, _ in rank_stream(later, rank, 1, 512, block_key(0, 1, rank))]
        assert keys.read_epoch(run, 1)[(1, rank)] == want
