"""--objective contrastive: image and caption embeddings matched over the global batch.

A batch carries each sample's image, its caption (byte ids, or the model's tokens) and the ids that
say which samples are the same pair twice over (`train.data.pairs`). The model (the contract in
`train.models.clip`) embeds both in one forward; the loss is CLIP's or SigLIP's (--loss) over every
rank's samples at once (`train.objectives.losses`: gathered with their gradients, scaled so that N
ranks x B equal 1 rank x N·B). Validation is `train.evaluation.contrastive`: zero-shot accuracy
over the classes (where the dataset has any), recall@1/@5 both ways, and the loss of the whole
split; `pipe labels` gets each pair's caption margin (`train.components.pair_records`).

A sample must be an image-caption pair; labels are optional (a pair without one has label -1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from train.components.device import autocast
from train.components.pair_records import PairRecorder
from train.distributed.group import Dist
from train.evaluation import contrastive as evaluation
from train.models.clip import inputs_of
from train.objectives import Validation
from train.objectives.losses import contrastive_loss

FIELDS = ("image", "text", "pairs")


class Contrastive:
    needs_classes = False

    def __init__(self, *, loss: str = "clip", classes: Sequence[str] = (), templates: Sequence[str] | None = None,
                 **_: Any):
        self.kind = loss
        self.classes = list(classes)
        self.templates = tuple(templates or evaluation.DEFAULT_TEMPLATES)

    def fields(self, model: nn.Module) -> tuple[str, ...]:
        return FIELDS

    def recorder(self, run_dir: Path, rank: int, world_size: int, start_step: int) -> PairRecorder:
        return PairRecorder(run_dir, rank, world_size, start_step)

    def loss(self, wrapped: nn.Module, model: nn.Module, batch: dict, epoch: int, recorder: PairRecorder,
             precision: str, d: Dist) -> torch.Tensor:
        with autocast(precision, d.device):
            out = wrapped(**{k: batch[k] for k in inputs_of(model)})
        res = contrastive_loss(self.kind, out["image"], out["text"], out["scale"], out["bias"], batch["caption_id"],
                               batch["group_id"], batch["valid"] if batch.get("skipped") else None)
        recorder.train(epoch, batch, res.caption_margin)
        return res.loss

    def validate(self, model: nn.Module, batches: Iterable[dict], d: Dist, precision: str, channels_last: bool,
                 recorder: PairRecorder, epoch: int) -> Validation | None:
        e = evaluation.embed(model, batches, d, precision, channels_last)
        if not len(e):
            return None
        classes = (evaluation.class_embeddings(model, self.classes, self.templates, d.device, precision)
                   if self.classes else None)
        m = evaluation.metrics(e, classes, self.kind)
        recorder.val(epoch, e.keys, evaluation.pair_margins(e))
        acc = m.get("zeroshot_acc", m["recall_i2t@1"])
        return Validation(m.pop("loss"), acc, int(m.pop("samples")), m)
