"""What a run optimises (``--objective``), one table like the model families (`train.models.families`).

An objective is what differs between training a classifier and training image and caption
embeddings; everything else (the reader, the batch arithmetic, accumulation, DDP/FSDP, checkpoints,
resume, monitoring) is the loop's and the same for both. Each one says:

* ``needs_classes``: index.json must list classes (a classifier's head has one output each);
* ``fields(model)``: what the reader decodes for it (`train.data.reader.FIELDS`);
* ``recorder(run_dir, rank, world, start_step)``: the per-sample records `pipe labels` reads, with
  ``flush(step)`` at every checkpoint (`train.components.margins`);
* ``loss(wrapped, model, batch, epoch, recorder)``: this rank's loss of one micro-batch (a mean
  over its samples; the step divides by --accum), computed under the run's autocast;
* ``validate(model, batches, d, precision, channels_last, recorder, epoch)``: a `Validation`,
  exact across ranks, or None without val samples.

``classify`` (`train.objectives.classify`) is today's cross-entropy over the classes;
``contrastive`` (`train.objectives.contrastive`) the CLIP or SigLIP loss over the global batch.
Modules are imported when their objective is used.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

OBJECTIVES = {"classify": "train.objectives.classify:Classify",
              "contrastive": "train.objectives.contrastive:Contrastive"}


@dataclass
class Validation:
    """One pass over the val split, every rank's samples counted once."""

    loss: float
    acc: float
    """The accuracy the run reports: classify's accuracy, contrastive's zero-shot accuracy (or its
    image->text recall@1 where the dataset has no classes)."""
    samples: int
    metrics: dict[str, float] = field(default_factory=dict)
    """More numbers for metrics.jsonl (as ``val_<name>``) and TensorBoard (zero-shot, recall)."""

    def as_tuple(self) -> tuple[float, float, int]:
        return self.loss, self.acc, self.samples


def make(name: str, **kwargs: Any) -> Any:
    """The objective ``name`` (--objective), built with ``kwargs`` (the run's config, index, ...)."""
    module, _, cls = OBJECTIVES[name].partition(":")
    return getattr(importlib.import_module(module), cls)(**kwargs)
