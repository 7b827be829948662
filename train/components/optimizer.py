"""The optimizer and its learning-rate schedule: AdamW with two parameter groups, warmup then cosine.

AdamW is built over *all* parameters, frozen ones included: a frozen parameter has no gradient,
so AdamW skips it until it is unfrozen, and the optimizer never needs rebuilding (its state in a
checkpoint keeps matching the model). The schedule is counted in optimizer steps, so it is the
same whatever the batch split (ranks, --accum) and survives a resume through LambdaLR's state.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from train.config import TrainConfig


class WarmupCosine:
    """LR multiplier: linear warmup to 1 over ``warmup`` steps, cosine down to ``floor`` at ``total``.
    A class (not a lambda) so LambdaLR's state_dict carries it into checkpoints."""

    def __init__(self, total: int, warmup: int, floor: float):
        self.total, self.warmup, self.floor = total, warmup, floor

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_steps(cfg: TrainConfig, total_steps: int) -> int:
    """--warmup below 1 is a fraction of all optimizer steps, from 1 up a number of steps."""
    return round(cfg.warmup * total_steps) if cfg.warmup < 1 else int(cfg.warmup)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over all parameters; no weight decay on biases and norm scales (1-d parameters).
    On CPU, AdamW's fused kernel (`fused_on_cpu`)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = fused_on_cpu(list(model.parameters())) or None  # None: torch's own choice
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, fused=fused)


def fused_on_cpu(params: list[torch.Tensor]) -> bool:
    """Whether AdamW should use its fused kernel: for plain parameters on the CPU.

    On CPU torch's default AdamW is the per-parameter loop, six element-wise passes over every
    parameter per step: 110 ms of a 2.3 s ResNet-18 step (batch 8 at 224 px, one thread), the
    fused kernel one pass, 20 ms (bench/train.py --resnet). GPUs already default to the
    multi-tensor kernels and stay as they are; sharded parameters (DTensors under --strategy
    fsdp) too. A resumed run keeps the kernel its checkpoint was made with (the optimizer's
    state dict carries the flag), so it stays bit-identical to the run it continues.
    """
    return bool(params) and all(type(p) is nn.Parameter and p.device.type == "cpu" and p.is_floating_point()
                                for p in params)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int,
                   warmup: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup then cosine from --lr down to --lr x min_lr_fraction at ``total_steps``."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(total_steps, max(warmup, 0), cfg.min_lr_fraction))


def extend(scheduler: torch.optim.lr_scheduler.LambdaLR, total_steps: int) -> tuple[int | None, float, float]:
    """Lay a restored schedule over a longer run (--resume with more --epochs): the cosine now ends
    at ``total_steps``, the warmup stays the one the run had, and the learning rate from the
    current step on is what a run planned this long from the start has there (a finished run had
    decayed to the floor: it climbs back to that point of the longer cosine). Returns the steps
    the schedule had, and the first parameter group's learning rate before and after."""
    before = float(scheduler.optimizer.param_groups[0]["lr"])
    was = None
    for fn in scheduler.lr_lambdas:  # one WarmupCosine shared by the parameter groups
        if isinstance(fn, WarmupCosine):
            was = fn.total if was is None else was
            fn.total = total_steps
    step = scheduler.last_epoch
    lrs = [float(base * fn(step)) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr
    shown: list[float | torch.Tensor] = list(lrs)
    scheduler._last_lr = shown  # what get_last_lr() reports (the metric lines' lr)
    return was, before, lrs[0]
