"""--auto-micro-batch: the per-rank batch halves until a step fits, and the global batch stays."""

from __future__ import annotations

import pytest
import torch

from pipeline.core.errors import StageFailed
from train.components.micro_batch import probe_micro_batch
from train.config import BatchPlan
from train.distributed.group import Dist


def test_auto_micro_batch_halves_until_it_fits_and_keeps_the_global_batch():
    d = Dist(0, 1, 0, 1, None, torch.device("cpu"), "host")
    tried, said = [], []

    def try_batch(size):
        tried.append(size)
        if size > 16:
            raise torch.OutOfMemoryError("out of memory")

    plan = probe_micro_batch(BatchPlan(64, 2, 1), try_batch, d, said.append, str)
    assert tried == [64, 32, 16]
    assert (plan.batch_size, plan.accum, plan.global_batch) == (16, 4, 128)
    assert "global batch 128 kept" in said[0]
    with pytest.raises(StageFailed, match="odd batch 3"):
        probe_micro_batch(BatchPlan(3, 1, 1), lambda s: (_ for _ in ()).throw(torch.OutOfMemoryError()), d,
                          said.append, lambda p: "oom")


def test_the_probes_synthetic_batch_feeds_a_contrastive_step():
    """The probe's step takes the run's objective's loss: its synthetic batch carries what a
    contrastive loss reads (pair ids), so --auto-micro-batch works for --objective contrastive."""
    from train.components.micro_batch import _NoRecords, _synthetic_batch
    from train.config import TrainConfig
    from train.models.clip import ClipModel
    from train.objectives.contrastive import Contrastive

    d = Dist(0, 1, 0, 1, None, torch.device("cpu"), "host")
    model = ClipModel(8, 16, 32)
    cfg = TrainConfig(shard_dir=".", max_text_len=32)
    batch = _synthetic_batch(model, {"image_size": 16}, cfg, 4, d.device)
    loss = Contrastive().loss(model, model, batch, 0, _NoRecords(), "fp32", d)
    loss.backward()
    assert torch.isfinite(loss) and model.logit_scale.grad is not None
