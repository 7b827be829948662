"""The learning-rate schedule: linear warmup, then a cosine down to the floor; AdamW's kernel on CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from train.components.optimizer import WarmupCosine, fused_on_cpu, make_optimizer
from train.config import TrainConfig


def test_warmup_then_cosine():
    f = WarmupCosine(total=100, warmup=10, floor=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(55) == pytest.approx(0.55) and f(100) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(10, 120))


def _grads_for(model: torch.nn.Module, step: int) -> None:
    gen = torch.Generator().manual_seed(step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen) * 0.1


def test_adamw_on_cpu_is_the_fused_kernel_and_trains_like_the_per_parameter_loop():
    """On CPU the default AdamW walks every parameter six times per step (~5% of a ResNet-18 step at
    batch 8); pipe train uses the fused kernel, which must update the weights as the loop does:
    same decay groups (none on 1-d parameters), same schedule of values, to float rounding."""
    torch.manual_seed(0)
    ours = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
    loop, start = copy.deepcopy(ours), copy.deepcopy(ours)
    cfg = TrainConfig(lr=1e-2, weight_decay=0.1)
    optimizer = make_optimizer(ours, cfg)
    assert all(g["fused"] for g in optimizer.param_groups)
    reference = torch.optim.AdamW([{"params": [p for p in loop.parameters() if p.dim() >= 2], "weight_decay": 0.1},
                                   {"params": [p for p in loop.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=1e-2, foreach=False)
    for step in range(5):
        _grads_for(ours, step)
        _grads_for(loop, step)
        optimizer.step()
        reference.step()
    for a, b in zip(ours.parameters(), loop.parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ours[0].weight, start[0].weight, atol=1e-3)  # and it did train


def test_fused_adamw_only_for_plain_cpu_parameters():
    """A sharded parameter (a DTensor under --strategy fsdp) or a GPU's keeps torch's default."""
    plain = torch.nn.Parameter(torch.zeros(3))
    assert fused_on_cpu([plain])
    assert not fused_on_cpu([plain, torch.nn.Parameter(torch.zeros(3, device="meta"))])
    assert not fused_on_cpu([])
