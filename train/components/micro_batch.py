"""The per-rank batch that fits: what an out-of-memory says to change, and --auto-micro-batch, which
halves the per-rank batch (doubling the accumulation, so the global batch stays) until a forward
and backward of a synthetic batch fits on every rank."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.errors import StageFailed
from train.components.device import autocast
from train.config import BatchPlan, TrainConfig
from train.distributed import group as distributed
from train.distributed.group import Dist
from train.models.builtin import forward, reader_image_size


def oom_message(d: Dist, plan: BatchPlan, precision: str, grad_checkpoint: bool) -> str:
    return (f"CUDA out of memory on rank {d.rank} ({d.host}) at per-rank batch {plan.batch_size} "
            f"(precision {precision}, gradient checkpointing {'on' if grad_checkpoint else 'off'}, "
            f"{plan.describe()}): lower --batch-size and raise --accum to keep the global batch, or pass "
            "--auto-micro-batch to find the largest batch that fits; --precision bf16 and --grad-checkpoint "
            "also cut activation memory")


def probe(model: nn.Module, index: dict, cfg: TrainConfig, plan: BatchPlan, d: Dist, precision: str,
          say: Callable[[str], None], objective: Any = None) -> BatchPlan:
    """--auto-micro-batch: the plan to train with (on CPU, ``plan`` itself: nothing to probe).
    ``objective``: the run's (`train.objectives`), whose loss the probe's step takes (a contrastive
    loss gathers every rank's embeddings: memory a cross-entropy does not need); None: classify."""
    if d.device.type != "cuda":
        say("auto-micro-batch: nothing to probe on CPU (an out-of-memory there is not recoverable); "
            "keeping " + plan.describe())
        return plan

    def try_batch(size: int) -> None:
        batch = _synthetic_batch(model, index, cfg, size, d.device)
        try:
            if objective is not None:
                loss = objective.loss(model, model, batch, 0, _NoRecords(), precision, d)
            else:
                with autocast(precision, d.device):
                    loss = F.cross_entropy(forward(model, model, batch).float(), batch["label"])
            loss.backward()
        finally:
            model.zero_grad(set_to_none=True)

    found = probe_micro_batch(plan, try_batch, d, say, lambda p: oom_message(d, p, precision, cfg.grad_checkpoint))
    if found != plan:
        say(f"auto-micro-batch: training with {found.describe()}")
    return found


def probe_micro_batch(plan: BatchPlan, try_batch: Callable[[int], None], d: Dist, say: Callable[[str], None],
                      describe_oom: Callable[[BatchPlan], str]) -> BatchPlan:
    """Find the largest per-rank batch (halving) whose forward+backward fits on every rank.

    Every rank tries the same size and the out-of-memory flags are max-reduced, so all ranks
    agree on the result (one rank training with another batch would hang the all-reduce).
    """
    while True:
        oom = 0
        try:
            try_batch(plan.batch_size)
        except torch.OutOfMemoryError:
            oom = 1
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        flag = distributed.all_reduce_max(torch.tensor([oom], device=d.device), d)
        if not flag.item():
            return plan
        if plan.batch_size % 2:
            raise StageFailed(describe_oom(plan) + f" (--auto-micro-batch cannot halve the odd batch {plan.batch_size} "
                              "and keep the global batch)")
        smaller = plan.halved()
        say(f"auto-micro-batch: per-rank batch {plan.batch_size} ran out of memory; trying {smaller.batch_size} "
            f"with --accum {smaller.accum} (global batch {smaller.global_batch} kept)")
        plan = smaller


def _synthetic_batch(model: nn.Module, index: dict, cfg: TrainConfig, size: int, device: torch.device) -> dict:
    side = reader_image_size(model, index.get("image_size")) or int(index.get("image_size") or 64)
    return {
        "image": torch.randn(size, 3, side, side, device=device),
        "text": torch.randint(1, 257, (size, cfg.max_text_len), device=device),
        "text_len": torch.full((size,), cfg.max_text_len, device=device),
        "label": torch.zeros(size, dtype=torch.long, device=device),
        # a tokenizer's ids: 1 is a valid id in every vocabulary; all positions attended (the worst case)
        "input_ids": torch.ones(size, cfg.max_text_len, dtype=torch.long, device=device),
        "attention_mask": torch.ones(size, cfg.max_text_len, dtype=torch.long, device=device),
        # a contrastive batch's pair ids: every caption another, no near copies
        "caption_id": torch.arange(size, device=device), "group_id": torch.full((size,), -1, device=device),
    }


class _NoRecords:
    """The probe's step records nothing for pipe labels."""

    def train(self, *args: Any) -> None:
        pass
