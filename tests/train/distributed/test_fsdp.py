"""--strategy fsdp on real gloo ranks: it trains the same weights as DDP, accumulates like one big
batch, leaves frozen blocks alone, and its checkpoints resume on another world size.

Tolerances: FSDP reduce-scatters what DDP all-reduces (other summation orders), so gradients agree
to float32 rounding, not bit for bit, and AdamW divides by the root of the squared gradient, which
magnifies that rounding where a gradient is near zero: after 4 steps of lr 5e-3 (at most 2e-2 of
movement per weight) the weights agree within 5e-4 absolute (measured: 1.1e-4 in the worst tensor,
under 2e-5 in all others). A restored checkpoint is exact on any world size (DCP copies the saved
values into the new shards).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import os
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from rich.console import Console

from tests.fake_data import open_fake, train_config
from tests.gloo import random_batch, run_world, tiny_model
from train import loop
from train.components import checkpoint as ckpt
from train.components.wrapping import no_sync
from train.config import TrainConfig
from train.distributed import fsdp
from train.labels import record_files
from train.models.builtin import build_model, forward
from train.models.finetune import Freezer

pytestmark = pytest.mark.usefixtures("one_thread")

ACCUM, MICRO, WORLD = 3, 2, 2
RUN = dict(model="image-text", width=8, lr=5e-3, workers=0, log_every=2, seed=0, checkpoint_every=0)
FROM_ENV = "PIPE_TEST_FSDP_FROM"  # the interrupted run a continue scenario copies (other world sizes)

# The scenarios run in worlds of their own, not tests.gloo's shared one: 2-rank processes that had
# already made three or four FSDP process groups in turn hung in a later one's first step (gloo,
# torch 2.13; not seen in fresh processes); one world per group of scenarios keeps that out.
# One loop.run per scenario: each scenario gets its own rendezvous port (a second group on the port
# of one just destroyed failed to connect once).
WORLDS = {"fsdp_accumulation_scenario": 0, "ddp_run_scenario": 0, "fsdp_run_scenario": 0,
          "fsdp_stopped_scenario": 1, "fsdp_resume_scenario": 1, "fsdp_bf16_unfreeze_scenario": 2}
JOINS_ITSELF = {"ddp_run_scenario", "fsdp_run_scenario", "fsdp_stopped_scenario", "fsdp_resume_scenario"}


@functools.cache
def _world(number: int) -> tuple[str, list[dict]]:
    workdir = Path(tempfile.mkdtemp(prefix="pipe-fsdp-"))
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    specs = [f"{__name__}:{name}" for name, w in WORLDS.items() if w == number]
    return str(workdir), run_world(specs, {f"{__name__}:{name}" for name in JOINS_ITSELF}, workdir, timeout=600.0)


def scenario_results(fn) -> tuple[list, Path]:
    """Like `tests.gloo.scenario_results`, in this module's own worlds."""
    workdir, ranks = _world(WORLDS[fn.__name__])
    spec = f"{__name__}:{fn.__name__}"
    return [r[spec] for r in ranks], Path(workdir) / spec.replace(":", ".")


def _saved(path: Path) -> dict:
    """A checkpoint's full model and optimizer state: last.pt as it is, a DCP folder gathered into
    one process (``dcp_to_torch_save``: no process group needed)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    if not ckpt.is_sharded(path):
        return ckpt.load(path)
    out = Path(os.path.realpath(path)).with_suffix(".gathered.pt")
    if not out.exists():
        dcp_to_torch_save(os.path.realpath(path), out)
    return torch.load(out, weights_only=False)


# -- accumulation: micro-steps without a reduce-scatter, one big batch's gradient -----------------


def fsdp_accumulation_scenario(d, workdir):
    model = fsdp.shard(tiny_model(), d, "fp32")
    x, y = random_batch(WORLD * ACCUM * MICRO)
    per_rank = ACCUM * MICRO
    x, y = x[d.rank * per_rank:(d.rank + 1) * per_rank], y[d.rank * per_rank:(d.rank + 1) * per_rank]
    reduced_early = []
    for i in range(ACCUM):
        sl = slice(i * MICRO, (i + 1) * MICRO)
        with no_sync(model, skip=i < ACCUM - 1):
            (F.cross_entropy(forward(model, model, {"image": x[sl]}), y[sl]) / ACCUM).backward()
        if i < ACCUM - 1:  # a reduce-scatter would have put sharded gradients on the parameters
            reduced_early.append(any(p.grad is not None for p in model.parameters()))
    return {"grads": {n: p.grad.full_tensor() for n, p in model.named_parameters()}, "reduced_early": reduced_early}


@pytest.mark.slow
@pytest.mark.timeout(900)  # starts this module's first world: three scenarios, two training runs
def test_fsdp_micro_batches_equal_one_big_batch_and_reduce_once():
    ranks, _ = scenario_results(fsdp_accumulation_scenario)
    model = tiny_model()
    x, y = random_batch(WORLD * ACCUM * MICRO)
    F.cross_entropy(model(image=x), y).backward()
    for r in ranks:
        assert r["reduced_early"] == [False] * (ACCUM - 1)
        for name, p in model.named_parameters():
            torch.testing.assert_close(r["grads"][name], p.grad, rtol=1e-5, atol=1e-6, msg=name)


# -- bf16: a block frozen at the first forward, unfrozen later --------------------------------------


@contextlib.contextmanager
def _reduce_scatter_dtypes():
    """The dtype of every gradient reduce-scatter FSDP2 issues meanwhile (it calls
    ``torch.distributed.reduce_scatter_single`` through the module, so a wrapper sees each one)."""
    import torch.distributed as dist

    dtypes: list[torch.dtype] = []
    reduce_scatter = dist.reduce_scatter_single

    def recording(*args, **kwargs):
        dtypes.append(kwargs["input"].dtype if "input" in kwargs else args[1].dtype)
        return reduce_scatter(*args, **kwargs)

    dist.reduce_scatter_single = recording
    try:
        yield dtypes
    finally:
        dist.reduce_scatter_single = reduce_scatter


def fsdp_bf16_unfreeze_scenario(d, workdir):
    """--precision bf16's policy: 2 steps with half the blocks frozen (wholly frozen units at FSDP2's
    first forward), then those unfrozen as the loop does (Freezer, `fsdp.refresh_after_freeze`) for 2."""
    model = fsdp.shard(tiny_model(), d, "bf16")
    freezer = Freezer(model)
    freezer.apply(0.5)
    fsdp.refresh_after_freeze(model)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    x, y = random_batch(WORLD * 4 * MICRO)
    x, y = x[d.rank::WORLD], y[d.rank::WORLD]

    def two_steps(first: int) -> list[torch.dtype]:
        with _reduce_scatter_dtypes() as dtypes:
            for i in range(first, first + 2):
                sl = slice(i * MICRO, (i + 1) * MICRO)
                F.cross_entropy(forward(model, model, {"image": x[sl]}).float(), y[sl]).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        return dtypes

    frozen_dtypes = two_steps(0)
    before = {n: p.full_tensor() for n, p in model.named_parameters()}
    freezer.apply(0.0)
    fsdp.refresh_after_freeze(model)
    unfrozen_dtypes = two_steps(2)
    after = {n: p.full_tensor() for n, p in model.named_parameters()}
    return {"frozen": frozen, "before": before, "after": after,
            "dtypes": {"frozen": frozen_dtypes, "unfrozen": unfrozen_dtypes}}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fsdp_bf16_a_block_unfrozen_later_trains_with_fp32_reduction_and_ranks_agree():
    """--precision bf16 under FSDP: blocks wholly frozen at the first forward and unfrozen later
    train (their weights move), every gradient reduce-scatter runs in the policy's reduce dtype
    (fp32, not the bf16 compute dtype), master weights stay fp32, and both ranks end identical."""
    ranks, _ = scenario_results(fsdp_bf16_unfreeze_scenario)
    first = ranks[0]
    assert first["frozen"], "the test needs blocks frozen at the first forward"
    assert first["dtypes"]["frozen"] and set(first["dtypes"]["frozen"]) == {torch.float32}
    assert len(first["dtypes"]["unfrozen"]) > len(first["dtypes"]["frozen"])  # the unfrozen units reduce too
    assert set(first["dtypes"]["unfrozen"]) == {torch.float32}
    for name in first["frozen"]:
        assert not torch.equal(first["after"][name], first["before"][name]), name
    for name, value in first["after"].items():
        assert value.dtype == torch.float32, name
        assert torch.equal(ranks[1]["after"][name], value), name


# -- the loop: DDP and FSDP side by side ------------------------------------------------------------


def _cfg(workdir: Path, name: str, **over) -> TrainConfig:
    return train_config(workdir, name, **{"batch_size": None, **RUN, **over})  # (None: from --global-batch, as a user's)


def _run(cfg: TrainConfig, open_data=open_fake) -> dict:
    return loop.run(cfg, open_data=open_data, console=Console(file=io.StringIO(), width=200))


def _same_run(workdir: Path, strategy: str) -> str:
    """The same run (4 steps of 2 ranks x batch 4 x accum 2, half the blocks frozen) under ``strategy``;
    both strategies' runs share one folder (the ddp scenario's)."""
    workdir = workdir.parent / "tests.train.distributed.test_fsdp.ddp_run_scenario"
    workdir.mkdir(exist_ok=True)
    _run(_cfg(workdir, strategy, strategy=strategy, epochs=1, max_steps=4, batch_size=4, accum=2, freeze=0.5))
    return str(workdir)


def ddp_run_scenario(workdir):
    return _same_run(workdir, "ddp")


def fsdp_run_scenario(workdir):
    return _same_run(workdir, "fsdp")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fsdp_trains_the_weights_ddp_trains_and_leaves_frozen_blocks_alone():
    _, workdir = scenario_results(ddp_run_scenario)
    scenario_results(fsdp_run_scenario)
    ddp, sharded = _saved(workdir / "ddp" / ckpt.LAST), _saved(workdir / "fsdp" / ckpt.LAST_DCP)
    assert not (workdir / "fsdp" / ckpt.LAST).exists()  # one checkpoint format per strategy
    torch.manual_seed(0)
    initial = build_model("image-text", 3, width=8)
    Freezer(initial).apply(0.5)
    frozen = {n for n, p in initial.named_parameters() if not p.requires_grad}
    assert frozen and set(sharded["model"]) == set(ddp["model"])
    for name, p in initial.named_parameters():
        torch.testing.assert_close(sharded["model"][name], ddp["model"][name], rtol=0, atol=5e-4)
        if name in frozen:  # bit-identical: a frozen block gets no gradient and no update
            assert torch.equal(sharded["model"][name], p.detach()), name
    trained = [n for n, p in initial.named_parameters() if n not in frozen]
    assert all(not torch.equal(sharded["model"][n], initial.state_dict()[n]) for n in trained)


# -- resume on another world size ----------------------------------------------------------------------


class Interrupted(Exception):
    """Stands for a run that stopped after epoch 1 (its epoch-end checkpoint written)."""


def _stopping_after_epoch_1(cfg, d, plan, fields, index, image_size=None, **kw):
    data = open_fake(cfg, d, plan, fields, index, image_size)
    set_epoch = data.train.set_epoch

    def stop_at_epoch_2(epoch: int, consumed: int = 0) -> None:
        if epoch == 1:
            raise Interrupted
        set_epoch(epoch, consumed)

    data.train.set_epoch = stop_at_epoch_2
    return data


RESUME = dict(strategy="fsdp", epochs=2, global_batch=8, freeze=0.5, unfreeze_at="2")


def _continue(cfg: TrainConfig) -> dict:
    """Resume ``cfg``; the full state right after the restore and at the end (rank 0), and the summary."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from train.distributed import group as distributed

    with distributed.process_group("gloo") as d:
        trainer = loop.Trainer(cfg, d, open_fake, Console(file=io.StringIO(), width=200))
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        # copies: the optimizer's step counters (and a plain model's weights) are updated in place
        model_sd, optim_sd = _copied(get_state_dict(trainer.model, trainer.optimizer, options=full))
        summary = trainer.fit()
        final, _ = get_state_dict(trainer.model, trainer.optimizer, options=full)
    return {"restored": {"model": model_sd, "optimizer": optim_sd}, "final": final, "summary": summary,
            "world": d.world_size}


def _copied(tree):
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {k: _copied(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_copied(v) for v in tree)
    return tree


def _shared(workdir: Path) -> Path:
    return workdir.parent / "tests.train.distributed.test_fsdp.fsdp_resume_scenario"


def fsdp_stopped_scenario(workdir):
    """2 ranks: a run stopped after epoch 1 (written where the resume scenario continues it)."""
    workdir = _shared(workdir)
    workdir.mkdir(exist_ok=True)
    try:
        _run(_cfg(workdir, "stopped", **RESUME), open_data=_stopping_after_epoch_1)
    except Interrupted:
        pass
    return str(workdir)


def fsdp_resume_scenario(workdir):
    """2 ranks: the stopped run continued on 2 ranks (the reference)."""
    if os.environ["RANK"] == "0":
        shutil.copytree(workdir / "stopped", workdir / "copying", symlinks=True)
        (workdir / "copying").rename(workdir / "on2")
    while not (workdir / "on2").exists():  # the other rank copies
        time.sleep(0.1)
    return _continue(_cfg(workdir, "on2", resume=True, **RESUME))


def fsdp_continue_scenario(workdir):
    """Continue the run named by FROM_ENV (a copy made for this world size)."""
    run = Path(os.environ[FROM_ENV])
    return _continue(TrainConfig(shard_dir=run.parent / "shards", output=run, resume=True, **{**RUN, **RESUME}))


def _train_keys(run_dir: Path, epoch: int) -> list[str]:
    """The train keys of ``epoch`` (from 0) in the order the ranks consumed them, rank after rank."""
    files = sorted((rank, step, path) for split, rank, step, path in record_files(run_dir) if split == "train")
    return [k for _, _, path in files for k, e in zip(*pq.read_table(path, columns=["key", "epoch"]).to_pydict().values())
            if e == epoch]


def _assert_same_state(restored: dict, saved: dict) -> None:
    assert restored["model"].keys() == saved["model"].keys()
    for name, value in saved["model"].items():
        assert torch.equal(restored["model"][name], value), name
    state, saved_state = restored["optimizer"]["state"], saved["optimizer"]["state"]
    assert state.keys() == saved_state.keys()
    for name, moments in saved_state.items():
        for k, v in moments.items():
            assert torch.equal(torch.as_tensor(state[name][k]), torch.as_tensor(v)), (name, k)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # three worlds of gloo ranks, whole training runs: minutes on 2 loaded cores
@pytest.mark.parametrize("world", [1, 4])
def test_an_fsdp_checkpoint_from_2_ranks_resumes_on_another_world_size(tmp_path, monkeypatch, world):
    """Saved on 2 ranks after epoch 1 (half the blocks frozen; epoch 2 unfreezes them), continued on
    1 and on 4 ranks with the same global batch: the restored weights and AdamW moments are the saved
    ones exactly, epoch 2 reads the same keys in the same order, and it ends where the run continued
    on 2 ranks ends (other ranks split each global batch differently: the same samples per epoch,
    other groupings per step, so weights agree to a stated tolerance, not exactly)."""
    (ref, _), workdir = scenario_results(fsdp_resume_scenario)
    saved = _saved(workdir / "stopped" / ckpt.LAST_DCP)
    frozen_then = set(ref["final"]) - set(saved["optimizer"]["state"])
    assert frozen_then, "the test needs blocks that were frozen when the checkpoint was written"
    _assert_same_state(ref["restored"], saved)

    run = tmp_path / f"on{world}"
    shutil.copytree(workdir / "stopped", run, symlinks=True)
    shutil.copytree(workdir / "shards", tmp_path / "shards")
    monkeypatch.setenv(FROM_ENV, str(run))
    spec = "tests.train.distributed.test_fsdp:fsdp_continue_scenario"
    other = run_world([spec], {spec}, tmp_path, world=world, timeout=600)[0][spec]
    assert other["world"] == world
    _assert_same_state(other["restored"], saved)
    assert other["summary"]["steps"] == ref["summary"]["steps"] == 24
    assert _train_keys(run, 1) == _train_keys(workdir / "on2", 1)
    assert len(_train_keys(run, 1)) == 96
    assert abs(other["summary"]["val_loss"] - ref["summary"]["val_loss"]) < 0.05
    for name, value in ref["final"].items():
        torch.testing.assert_close(other["final"][name], value, rtol=0, atol=0.05, msg=name)


# -- one process: the checkpoint folder's life cycle, and the strategy a run keeps --------------------


def test_a_sharded_checkpoint_replaces_the_last_only_when_complete(tmp_path):
    """One process (nothing to shard over, the same DCP checkpoint): last.dcp points at one complete
    folder; a save that died before its COMPLETE marker is not resumed from; switching
    strategy on --resume is refused (the checkpoint formats differ)."""
    from pipeline.core.errors import UsageError

    cfg = _cfg(tmp_path, "run", strategy="fsdp", epochs=1, max_steps=3, batch_size=8, checkpoint_every=1)
    _run(cfg)
    last = tmp_path / "run" / ckpt.LAST_DCP
    assert last.is_symlink() and ckpt.load(last)["step"] == 3
    assert sorted(p.name for p in (tmp_path / "run" / ckpt.DCP_FOLDER).iterdir()) == [Path(os.readlink(last)).name]
    assert ckpt.last_checkpoint(tmp_path / "run") == last
    torn = tmp_path / "run" / ckpt.DCP_FOLDER / "step-000000004-dead.tmp"
    shutil.copytree(os.path.realpath(last), torn)
    (torn / ckpt.DCP_COMPLETE).unlink()
    with pytest.raises(UsageError, match="not a complete checkpoint"):
        ckpt.load(torn)
    with pytest.raises(UsageError, match="--strategy fsdp"):
        _run(_cfg(tmp_path, "run", strategy="ddp", epochs=1, max_steps=3, batch_size=8, resume=True))
    summary = _run(_cfg(tmp_path, "run", strategy="fsdp", epochs=1, max_steps=3, batch_size=8, resume=True))
    assert summary["steps"] == 3  # resumed from last.dcp, not from the torn folder of a later step
