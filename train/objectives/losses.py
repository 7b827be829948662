"""Contrastive losses over the global batch: CLIP's symmetric InfoNCE and SigLIP's sigmoid loss.

Every rank embeds its own B samples; the loss must be that of all N x B samples at once, so that
N ranks x B give the same loss and the same gradients as 1 rank x N·B (tests/train/objectives/
test_losses.py checks both, on real gloo ranks, in fp32). How (open_clip's ``gather_with_grad``
with ``local_loss``, `ClipLoss` and `SigLipLoss` in src/open_clip/loss.py):

* the embeddings of every rank are all-gathered *with their gradients* (`gather`): rank r's
  rows are a function of rank r's weights, and the loss of every other rank depends on them.
  Gathered without gradients (``torch.distributed.all_gather``), the other ranks' rows would be
  constants: each rank's features would get the gradient of its own rows' terms only.
* each rank takes the loss of its own rows against all N·B columns (``loss_r``: the mean over
  its B rows). The global loss is L = (1/N) sum_r loss_r, the mean over all rows.
* the scaling: rank r's embeddings appear in every rank's loss, so the backward of the gather
  *sums* the gradients that the N ranks' losses send to rank r's rows (`_Gather.backward`):
  sum_r' d loss_r' / d f_r = N dL/d f_r. DDP (and FSDP) then *average* the parameter gradients
  over the N ranks: (1/N) sum_r N dL/d f_r . d f_r/d theta = dL/d theta, the gradient of the
  global mean, exactly. (Averaging in the gather's backward as well would divide by N twice;
  summing the losses instead of averaging them would multiply by N.) The logit scale and bias
  are used on every rank directly: each rank's gradient d loss_r / d s, averaged by DDP, is
  dL/ds.

Samples that are the same pair twice over are never each other's negatives (`same_pairs`): the
same caption text (byte for byte) or the same near-duplicate group (`pipe shard` records it in a
pair's .json, the reader hands it over as ``group_id``). They are *masked*: left out of the
softmax's denominator (CLIP) and out of the sum (SigLIP), neither pushed apart nor pulled
together; each sample's one positive stays its own caption. On data where a caption is repeated
across many images ("a photo of a cat." 300 times), masking keeps those repeats from being
taught as mutual negatives (unmasked, the model is asked to tell apart identical texts: an
impossible target whose gradient only shrinks the logit scale); a row then has fewer negatives
than N·B - 1, which the loss tolerates (the denominator has what remains).

With --accum, each micro-batch (N ranks x B) is its own contrastive batch: its loss is taken as
above and the micro-batches' losses are averaged, as the classify objective averages its
micro-batches. The negatives of a sample are those of its micro-batch, not of the whole optimizer
step (GradCache would give the step's N·B·accum; not done: a second forward per step, and the
memory accumulation is meant to save).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F


class _Gather(torch.autograd.Function):
    """All-gather along dim 0, the backward summing every rank's gradient of this rank's rows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        world, rank = dist.get_world_size(), dist.get_rank()
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous())
        ctx.rank, ctx.rows = rank, x.shape[0]
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)  # SUM: every rank's loss sent gradients to these rows (see the module docstring)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` (equal shapes) concatenated in rank order, differentiable; ``x`` itself
    in a single process."""
    return _Gather.apply(x) if distributed() else x


def gather_ids(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` concatenated in rank order, no gradient (ids, masks)."""
    if not distributed():
        return x
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def rank_offset(rows: int) -> int:
    """Where this rank's rows start among the gathered ones."""
    return dist.get_rank() * rows if distributed() else 0


def same_pairs(caption: torch.Tensor, group: torch.Tensor, rows: slice) -> torch.Tensor:
    """[len(rows), N] bool: pairs (i in ``rows``, j) that are different samples but the same pair
    twice over: the same caption id, or the same near-duplicate group (-1: in none)."""
    cap_i, grp_i = caption[rows, None], group[rows, None]
    same = (cap_i == caption[None, :]) | ((grp_i == group[None, :]) & (grp_i >= 0))
    own = torch.arange(rows.start, rows.stop, device=caption.device)
    same[torch.arange(len(own), device=caption.device), own] = False
    return same


@dataclass
class LossOut:
    """One rank's loss and what `pipe labels` records per sample of its rows."""

    loss: torch.Tensor
    """Mean over this rank's rows (its share of the global loss: average over ranks for the whole)."""
    caption_margin: torch.Tensor
    """[B] cosine similarity of each caption with its own image minus its best other image's (near
    copies left out, `caption_margins`): below 0, the caption fits another image of the batch better."""


def contrastive_loss(kind: str, image: torch.Tensor, text: torch.Tensor, scale: torch.Tensor,
                     bias: torch.Tensor | None, caption: torch.Tensor, group: torch.Tensor,
                     valid: torch.Tensor | None = None) -> LossOut:
    """``kind`` (clip or siglip) over the global batch, for this rank's ``image`` and ``text``
    embeddings [B, D] (unnormalised), ``caption`` and ``group`` ids [B]; in float32. ``valid``
    [B] bool (None: all): a sample the reader skipped (bad data, its slot holding a copy of another
    sample) is no row and no column: it adds nothing, and the mean stays over B rows, as the
    classify objective's `masked_loss` keeps it."""
    image = F.normalize(image.float(), dim=-1)
    text = F.normalize(text.float(), dim=-1)
    all_image, all_text = gather(image), gather(text)
    b = image.shape[0]
    start = rank_offset(b)
    rows = slice(start, start + b)
    mask = same_pairs(gather_ids(caption), gather_ids(group), rows)
    targets = torch.arange(start, start + b, device=image.device)
    weight = torch.ones(b, device=image.device)
    if valid is not None:
        mask = mask | ~gather_ids(valid.to(torch.int64)).bool()[None, :]  # a skipped sample is no one's negative
        mask[torch.arange(b, device=image.device), targets] = False  # its own row is weighted 0 below
        weight = valid.to(image.device, torch.float32)
    text_to_image = text @ all_image.T  # [B, N]: each caption against every image
    s = scale.float().reshape(())
    if kind == "clip":
        i2t = (s * (image @ all_text.T)).masked_fill(mask, float("-inf"))
        t2i = (s * text_to_image).masked_fill(mask, float("-inf"))
        per_row = (F.cross_entropy(i2t, targets, reduction="none") + F.cross_entropy(t2i, targets, reduction="none")) / 2
        loss = (per_row * weight).sum() / b
    elif kind == "siglip":
        logits = s * (image @ all_text.T) + (bias.float().reshape(()) if bias is not None else 0.0)
        labels = -torch.ones_like(logits)
        labels[torch.arange(b, device=image.device), targets] = 1.0
        loss = -(F.logsigmoid(labels * logits).masked_fill(mask, 0.0) * weight[:, None]).sum() / b
    else:
        raise ValueError(f"unknown contrastive loss {kind!r}")
    copies = same_group(gather_ids(group), rows)
    return LossOut(loss, caption_margins(text_to_image.detach(), targets, copies))


def same_group(group: torch.Tensor, rows: slice) -> torch.Tensor:
    """[len(rows), N] bool: pairs (i in ``rows``, j) in one near-duplicate group (-1: in none), i != j."""
    same = (group[rows, None] == group[None, :]) & (group[rows, None] >= 0)
    own = torch.arange(rows.start, rows.stop, device=group.device)
    same[torch.arange(len(own), device=group.device), own] = False
    return same


def caption_margins(text_to_image: torch.Tensor, targets: torch.Tensor, copies: torch.Tensor) -> torch.Tensor:
    """Each caption's similarity with its own image minus that with the best other image, near
    copies of its own image (``copies``) left out. Images with the same caption are *not* left out,
    unlike in the loss: a caption that fits the images it sits on elsewhere better than this one is
    what a mismatched pair looks like ("a photo of a dog." on a cat, next to ten dogs with it)."""
    rows = torch.arange(len(targets), device=targets.device)
    own = text_to_image[rows, targets]
    others = text_to_image.masked_fill(copies, float("-inf"))
    others[rows, targets] = float("-inf")
    best = others.max(dim=1).values
    return own - torch.where(torch.isfinite(best), best, own)  # no other image at all: 0
