"""DDP on real gloo process groups: one all-reduce per optimizer step, micro-batches that add up
to the big batch, and a wrapper rebuilt on unfreeze so ranks stay identical."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from pipeline.core.errors import UsageError
from tests.gloo import random_batch, scenario_results, tiny_model
from train.distributed import group as distributed
from train.distributed.group import no_sync
from train.models.builtin import forward
from train.models.finetune import Freezer

ACCUM, MICRO, WORLD = 3, 2, 2


def _accumulate(d, accum: int, use_no_sync: bool):
    """Gradients of one optimizer step made of ``accum`` micro-batches, and the all-reduces it cost."""
    model = tiny_model()
    ddp = distributed.wrap(model, d)
    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.index())
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(dist.group.WORLD, counting_hook)
    x, y = random_batch(WORLD * accum * MICRO)
    per_rank = accum * MICRO
    x, y = x[d.rank * per_rank:(d.rank + 1) * per_rank], y[d.rank * per_rank:(d.rank + 1) * per_rank]
    for i in range(accum):
        sl = slice(i * MICRO, (i + 1) * MICRO)
        with no_sync(ddp, skip=use_no_sync and i < accum - 1):
            loss = F.cross_entropy(forward(ddp, model, {"image": x[sl]}), y[sl]) / accum
            loss.backward()
    return {"grads": {n: p.grad.clone() for n, p in model.named_parameters()}, "allreduces": len(calls)}


def accumulation_scenario(d, workdir):
    return {
        "one_micro": _accumulate(d, 1, True),
        "accum_no_sync": _accumulate(d, ACCUM, True),
        "accum_always_sync": _accumulate(d, ACCUM, False),
    }


@pytest.mark.slow
def test_micro_batches_equal_one_big_batch_with_one_allreduce():
    ranks, _ = scenario_results(accumulation_scenario)
    # the reference: one process, one batch of world x accum x micro samples
    model = tiny_model()
    x, y = random_batch(WORLD * ACCUM * MICRO)
    F.cross_entropy(model(image=x), y).backward()
    for r in ranks:
        for name, p in model.named_parameters():
            torch.testing.assert_close(r["accum_no_sync"]["grads"][name], p.grad, rtol=1e-5, atol=1e-7, msg=name)
    # gradients are all-reduced once per optimizer step: as often with 3 micro-steps as with 1 ...
    once = ranks[0]["one_micro"]["allreduces"]
    assert once >= 1
    assert ranks[0]["accum_no_sync"]["allreduces"] == once
    # ... where DDP left alone would all-reduce on every micro-step (the counter does count)
    assert ranks[0]["accum_always_sync"]["allreduces"] == ACCUM * once


def _unfreeze_rank(d, rewrap: bool):
    model = tiny_model()
    model.set_grad_checkpointing(True)  # fine-tuning with checkpointing: the combination users run
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    freezer = Freezer(model)
    freezer.apply(0.7)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    ddp = distributed.wrap(model, d)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def train(wrapper, steps: int, seed: int):
        for s in range(steps):
            x, y = random_batch(4, seed=100 * seed + 10 * s + d.rank)  # every rank its own data
            F.cross_entropy(forward(wrapper, model, {"image": x}), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    train(ddp, 2, seed=1)
    freezer.apply(0.0)
    if rewrap:
        ddp = distributed.rewrap(ddp, d)
    train(ddp, 2, seed=2)
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()}, "frozen": frozen, "initial": initial}


def unfreeze_scenario(d, workdir):
    return {"rewrapped": _unfreeze_rank(d, True), "stale": _unfreeze_rank(d, False)}


@pytest.mark.slow
def test_ranks_hold_identical_parameters_after_unfreeze_and_training():
    (r0, r1), _ = scenario_results(unfreeze_scenario)
    good0, good1 = r0["rewrapped"], r1["rewrapped"]
    assert good0["frozen"], "the test needs frozen blocks"
    for name in good0["params"]:
        assert torch.equal(good0["params"][name], good1["params"][name]), f"ranks differ on {name}"
    for name in good0["frozen"]:  # unfrozen parameters trained after the rebuild
        assert not torch.equal(good0["params"][name], good0["initial"][name]), f"{name} never trained"
    # the control: without rebuilding DDP, the unfrozen parameters are never all-reduced and drift
    stale0, stale1 = r0["stale"], r1["stale"]
    assert any(not torch.equal(stale0["params"][n], stale1["params"][n]) for n in stale0["frozen"])


def test_nccl_without_cuda_is_a_usage_error():
    with pytest.raises(UsageError, match="needs CUDA"):
        distributed.choose_backend("nccl", cuda_available=False)
    assert distributed.choose_backend("auto", cuda_available=False) == "gloo"
    with pytest.raises(UsageError):
        distributed.choose_backend("mpi", cuda_available=False)


def test_single_process_needs_no_group(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    d = distributed.setup("auto")
    assert (d.rank, d.world_size, d.backend) == (0, 1, None) and not dist.is_initialized()
    model = torch.nn.Linear(2, 2)
    assert distributed.wrap(model, d) is model
    distributed.teardown(d)


def test_a_launched_single_rank_joins_a_real_group(monkeypatch):
    """One rank under a launcher still initialises its backend (NCCL on a GPU box fails here, not
    later on the cluster), but needs no DDP wrapper; teardown leaves no group behind."""
    from tests.gloo import free_port

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    d = distributed.setup("gloo")
    try:
        assert dist.is_initialized() and d.backend == "gloo" and not d.is_distributed
        model = torch.nn.Linear(2, 2)
        assert distributed.wrap(model, d) is model
    finally:
        distributed.teardown(d)
    assert not dist.is_initialized()
