"""--objective classify: cross-entropy over index.json's classes (what pipe train always did).

The loss of a micro-batch is the mean cross-entropy of its samples; validation is
`train.components.validation.validate` (sums all-reduced: exact across ranks); the per-sample
margins `pipe labels` ranks are recorded by `train.components.margins.MarginRecorder`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from train.components.device import autocast
from train.components.margins import MarginRecorder
from train.components.skipping import masked_loss
from train.components.validation import validate
from train.distributed.group import Dist
from train.models.builtin import forward, reader_fields
from train.objectives import Validation


class Classify:
    needs_classes = True

    def __init__(self, **_: Any):
        pass

    def fields(self, model: nn.Module) -> tuple[str, ...]:
        return reader_fields(model)

    def recorder(self, run_dir: Path, rank: int, world_size: int, start_step: int) -> MarginRecorder:
        return MarginRecorder(run_dir, rank, world_size, start_step)

    def loss(self, wrapped: nn.Module, model: nn.Module, batch: dict, epoch: int, recorder: MarginRecorder,
             precision: str, d: Dist) -> torch.Tensor:
        with autocast(precision, d.device):
            logits = forward(wrapped, model, batch)
        loss = masked_loss(logits.float(), batch)  # skipped samples (bad data) add nothing
        recorder.train(epoch, batch, logits)
        return loss

    def validate(self, model: nn.Module, batches: Iterable[dict], d: Dist, precision: str, channels_last: bool,
                 recorder: MarginRecorder, epoch: int) -> Validation | None:
        val = validate(model, batches, d, precision, channels_last, lambda batch, logits: recorder.val(epoch, batch, logits))
        return None if val is None else Validation(*val)
