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
    """AdamW over all parameters; no weight decay on biases and norm scales (1-d parameters)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int,
                   warmup: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup then cosine from --lr down to --lr x min_lr_fraction at ``total_steps``."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(total_steps, max(warmup, 0), cfg.min_lr_fraction))
