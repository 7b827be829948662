"""How well an image-caption model matches images and captions: one module for `pipe train`'s
validation of --objective contrastive and for `pipe eval` (any model `train.models.loading` loads).

* zero-shot accuracy: each class name put into every template (``--zeroshot-prompt``, {} for the
  name), the template embeddings normalised and averaged per class (then normalised again, as
  open_clip's ``build_zero_shot_classifier``); an image's class is the nearest class embedding.
  Samples without a class are left out of it (and in the recall).
* recall@1 and @5, image->text and text->image: for each image the captions of the split ranked
  by similarity, a hit when one of the first K *is the same text* as the image's own caption (a
  caption repeated on many images is the right answer for each of them); likewise each caption's
  images, a hit when one of them carries that same text.
* the contrastive loss of the whole split as one batch (`loss`), with the masking of training
  (`train.objectives.losses`): a number that does not depend on how val was cut into batches.

Exact across ranks: each rank embeds its part of the split (the reader's repeats that top up the
last batches are dropped by their ``valid`` flag), then every rank all-gathers every embedding and
computes the same numbers. Memory: every rank holds all val embeddings, 2 x N x D floats (N val
samples, D the embedding: 20k samples of 512 floats are 80 MB), and similarities a block of
`CHUNK` rows at a time (CHUNK x N floats), never the N x N matrix.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from train.components.device import autocast, to_device
from train.distributed import group as distributed
from train.distributed.group import Dist
from train.models.clip import encode_text, inputs_of, text_batch

DEFAULT_TEMPLATES = ("a photo of a {}.",)
CHUNK = 1024  # query rows whose similarities are computed at once
RECALL_AT = (1, 5)


@dataclass
class Embedded:
    """Every val sample's normalised embeddings (float32, on the CPU), in one order on every rank."""

    image: torch.Tensor  # [N, D]
    text: torch.Tensor  # [N, D]
    label: torch.Tensor  # [N] int64, -1 without a class
    caption: torch.Tensor  # [N] int64 caption ids (equal: the same text)
    group: torch.Tensor  # [N] int64 near-duplicate group ids, -1 in none
    keys: list[str]
    scale: float
    bias: float | None

    def __len__(self) -> int:
        return len(self.keys)


@torch.no_grad()
def embed(model: nn.Module, batches: Iterable[dict], d: Dist, precision: str, channels_last: bool = False) -> Embedded:
    """Embed this rank's val batches with ``model`` (the bare module, put in eval mode) and gather
    every rank's: the same `Embedded` on every rank."""
    model.eval()
    parts: dict[str, list] = {"image": [], "text": [], "label": [], "caption": [], "group": [], "valid": [], "keys": []}
    out: dict = {}
    for batch in batches:
        batch = to_device(batch, d.device, channels_last)
        with autocast(precision, d.device):
            out = model(**{k: batch[k] for k in inputs_of(model)})
        n = len(batch["key"])
        parts["image"].append(F.normalize(out["image"].float(), dim=-1))
        parts["text"].append(F.normalize(out["text"].float(), dim=-1))
        parts["label"].append(batch["label"])
        parts["caption"].append(batch["caption_id"])
        parts["group"].append(batch["group_id"])
        valid = batch.get("valid")
        parts["valid"].append(valid.bool() if valid is not None else torch.ones(n, dtype=torch.bool, device=d.device))
        parts["keys"] += list(batch["key"])
    scale, bias = _scale_and_bias(model, out)
    if not parts["keys"]:  # no batch on this rank, so on none (every rank reads as many): nothing to gather
        none = torch.zeros(0, dtype=torch.int64)
        return Embedded(torch.zeros(0, 0), torch.zeros(0, 0), none, none, none, [], scale, bias)
    local = {k: torch.cat(v) for k, v in parts.items() if k != "keys"}
    gathered = {k: _gather_rows(v, d) for k, v in local.items()}
    keys = [k for ks in distributed.all_gather_object(parts["keys"], d) for k in ks]
    valid = gathered.pop("valid").cpu()
    return Embedded(**{k: v.cpu()[valid] for k, v in gathered.items()}, keys=[k for k, ok in zip(keys, valid.tolist()) if ok],
                    scale=scale, bias=bias)


def _scale_and_bias(model: nn.Module, out: dict) -> tuple[float, float | None]:
    from train.models.clip import scale

    s = out.get("scale") if out else None
    logit_scale: Any = model.logit_scale
    value = float(s.float().reshape(-1)[0]) if s is not None else float(scale(logit_scale.detach()).reshape(-1)[0])
    b = out.get("bias") if out else getattr(model, "logit_bias", None)
    return value, (float(b.detach().float().reshape(-1)[0]) if b is not None else None)


def _gather_rows(x: torch.Tensor, d: Dist) -> torch.Tensor:
    """Every rank's rows of ``x`` in rank order (the ranks may hold different counts)."""
    if not d.is_distributed:
        return x
    counts = [int(n) for n in distributed.all_gather_tensor(torch.tensor([x.shape[0]], device=d.device), d).view(-1).tolist()]
    most = max(counts)
    padded = torch.zeros((most, *x.shape[1:]), dtype=x.dtype, device=x.device)
    padded[: x.shape[0]] = x
    every = distributed.all_gather_tensor(padded, d)  # [world, most, ...]
    return torch.cat([every[r, :n] for r, n in enumerate(counts)])


@torch.no_grad()
def class_embeddings(model: nn.Module, classes: Sequence[str], templates: Sequence[str], device: torch.device,
                     precision: str) -> torch.Tensor:
    """[C, D]: per class, its templates' text embeddings normalised, averaged, normalised again."""
    out = []
    for name in classes:
        texts = [t.replace("{}", name) for t in templates]
        fields = {k: v.to(device) for k, v in text_batch(model, texts).items()}
        with autocast(precision, device):
            e = encode_text(model, fields)
        e = F.normalize(e.float(), dim=-1).mean(dim=0)
        out.append(F.normalize(e, dim=-1))
    return torch.stack(out).cpu() if out else torch.zeros(0, 0)


def zero_shot_accuracy(e: Embedded, classes: torch.Tensor) -> float | None:
    """Share of the samples with a class whose nearest class embedding is theirs (None: no such sample)."""
    labelled = e.label >= 0
    if not labelled.any() or not len(classes):
        return None
    predicted = torch.cat([(e.image[labelled][i : i + CHUNK] @ classes.T).argmax(dim=1)
                           for i in range(0, int(labelled.sum()), CHUNK)])
    return float((predicted == e.label[labelled]).double().mean())


def recall(e: Embedded, at: Sequence[int] = RECALL_AT) -> dict[str, float]:
    """``recall_i2t@K`` and ``recall_t2i@K``: a hit when one of the K nearest has the same caption text."""
    n = len(e)
    out: dict[str, float] = {}
    if n == 0:
        return out
    top = min(max(at), n)
    for name, queries, items in (("i2t", e.image, e.text), ("t2i", e.text, e.image)):
        hits = torch.zeros(len(at), dtype=torch.float64)
        for i in range(0, n, CHUNK):
            nearest = (queries[i : i + CHUNK] @ items.T).topk(top, dim=1).indices  # [c, top]
            same = e.caption[nearest] == e.caption[i : i + CHUNK, None]
            for j, k in enumerate(at):
                hits[j] += same[:, :k].any(dim=1).double().sum()
        for j, k in enumerate(at):
            out[f"recall_{name}@{k}"] = float(hits[j] / n)
    return out


def pair_margins(e: Embedded) -> torch.Tensor:
    """[N] each caption's cosine similarity with its own image minus that with the best other image
    of the split (near copies of its own left out, `train.objectives.losses.caption_margins`): below
    0, it fits another image better."""
    from train.objectives.losses import caption_margins, same_group

    out = []
    for i in range(0, len(e), CHUNK):
        rows = slice(i, min(i + CHUNK, len(e)))
        sims = e.text[rows] @ e.image.T
        out.append(caption_margins(sims, torch.arange(rows.start, rows.stop), same_group(e.group, rows)))
    return torch.cat(out) if out else torch.zeros(0)


def loss(e: Embedded, kind: str) -> float:
    """The contrastive loss of the whole split as one batch (masked as in training)."""
    from train.objectives.losses import same_pairs

    n = len(e)
    if n == 0:
        return float("nan")
    total = 0.0
    for i in range(0, n, CHUNK):
        rows = slice(i, min(i + CHUNK, n))
        mask = same_pairs(e.caption, e.group, rows)
        targets = torch.arange(rows.start, rows.stop)
        i2t, t2i = e.image[rows] @ e.text.T, e.text[rows] @ e.image.T
        if kind == "siglip":
            logits = e.scale * i2t + (e.bias or 0.0)
            labels = -torch.ones_like(logits)
            labels[torch.arange(len(targets)), targets] = 1.0
            total += float(-(F.logsigmoid(labels * logits).masked_fill(mask, 0.0)).sum())
        else:
            a = F.cross_entropy((e.scale * i2t).masked_fill(mask, float("-inf")), targets, reduction="sum")
            b = F.cross_entropy((e.scale * t2i).masked_fill(mask, float("-inf")), targets, reduction="sum")
            total += float(a + b) / 2
    return total / n


def metrics(e: Embedded, classes: torch.Tensor | None, kind: str) -> dict[str, float]:
    """Every number of this module for one split: ``loss``, ``zeroshot_acc`` (where there are
    classes and samples with one), ``recall_*``, ``samples``."""
    out: dict[str, float] = {"loss": loss(e, kind), "samples": float(len(e))}
    acc = zero_shot_accuracy(e, classes) if classes is not None else None
    if acc is not None:
        out["zeroshot_acc"] = acc
    out.update(recall(e))
    return out
