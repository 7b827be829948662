"""Validation that is exact across ranks: every rank sums the loss, the correct answers and the
samples of its part of the val split (the repeats that fill the last batches not counted), and the
sums are all-reduced, so the metrics are those of one pass over the whole split."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from train.components.device import autocast, to_device
from train.distributed import group as distributed
from train.distributed.group import Dist
from train.models.builtin import forward


def together(parts: list[tuple[float, float, int]]) -> tuple[float, float, int]:
    """Loss and accuracy over several val splits validated apart, as one pass over all of them."""
    n = sum(p[2] for p in parts)
    return sum(p[0] * p[2] for p in parts) / n, sum(p[1] * p[2] for p in parts) / n, n


def validate(model: nn.Module, batches: Iterable[dict], d: Dist, precision: str, channels_last: bool,
             record: Callable[[dict, torch.Tensor], None]) -> tuple[float, float, int] | None:
    """Loss and accuracy over the val split and its samples (None without any). ``model`` is the
    bare module (no DDP hooks in evaluation), left in eval mode; ``record`` sees each batch's logits."""
    sums = torch.zeros(3, dtype=torch.float64, device=d.device)  # loss sum, correct, samples
    model.eval()
    with torch.no_grad():
        for batch in batches:
            batch = to_device(batch, d.device, channels_last)
            with autocast(precision, d.device):
                logits = forward(model, model, batch)
            record(batch, logits)
            labels = batch["label"]
            valid = batch.get("valid")
            keep = valid.to(torch.float64) if valid is not None else torch.ones(len(labels), dtype=torch.float64, device=d.device)
            losses = F.cross_entropy(logits.float(), labels, reduction="none").double()
            sums[0] += (losses * keep).sum()
            sums[1] += ((logits.argmax(dim=1) == labels).double() * keep).sum()
            sums[2] += keep.sum()
    distributed.all_reduce_sum(sums, d)
    loss_sum, correct, n = sums.tolist()
    if n == 0:
        return None
    return loss_sum / n, correct / n, int(n)
