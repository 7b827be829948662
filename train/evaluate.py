"""`pipe eval MODEL SHARD_DIR`: the numbers pipe train's validation reports, for any model pipe can
load (`train.models.loading`), on any split of any SHARD_DIR: the starting model and the fine-tuned
one side by side. One process, the GPU when there is one; the same code as training's validation
(`train.evaluation.contrastive`), fed by the same reader with the model's own input (its size,
normalisation and tokenizer, as `pipe train` feeds it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from pipeline.core.errors import UsageError
from train.distributed.group import Dist
from train.evaluation import contrastive as evaluation
from train.models import norm as input_norm
from train.models.builtin import reader_image_size
from train.models.loading import load_model

BATCH = 64


def evaluate(model_spec: str, shard_dir: str | Path, split: str = "val", templates: Sequence[str] | None = None,
             which: str = "best", workers: int = 0) -> dict:
    """{"model": what was measured, "split", "metrics": {...}} (`train.evaluation.contrastive.metrics`)."""
    from train.data.reader import ShardReader, close_loader, make_loader
    from train.data.sources import read_index

    index, _ = read_index(shard_dir)
    if not any(s["split"] == split and s["count"] for s in index["shards"]):
        raise UsageError(f"{shard_dir} has no {split} samples")
    model, described = load_model(model_spec, which)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    norm = input_norm.resolve(model, index)
    reader = ShardReader(shard_dir, split=split, batch_size=BATCH, fields=("image", "text", "pairs"),
                         max_text_len=int(getattr(model, "max_text_len", 256) or 256),
                         image_size=reader_image_size(model, index.get("image_size")), mean=norm.mean, std=norm.std,
                         tokenize=getattr(model, "tokenize", None))
    reader.set_epoch(0)
    loader = make_loader(reader, workers)
    d = Dist(rank=0, world_size=1, local_rank=0, local_world_size=1, backend=None, device=device, host="")
    precision = "fp32"
    try:
        e = evaluation.embed(model, loader, d, precision)
    finally:
        close_loader(loader)
    classes = list(index["classes"])
    class_emb = (evaluation.class_embeddings(model, classes, tuple(templates or evaluation.DEFAULT_TEMPLATES), device,
                                             precision) if classes else None)
    kind = "siglip" if getattr(model, "logit_bias", None) is not None else "clip"
    metrics = evaluation.metrics(e, class_emb, kind)
    return {"model": described, "split": split, "metrics": metrics}
