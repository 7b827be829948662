"""Image-caption models for ``--objective contrastive``: the contract, and the built-in ``--model clip``.

The contract (what `train.objectives.contrastive`, `train.evaluation.contrastive`, ``pipe eval``
and ``pipe export`` rely on; `ClipModel` keeps it, and so does `train.models.hf_clip.HFContrastive`
for Hugging Face CLIP and SigLIP folders):

* ``forward(**batch fields named by inputs)`` -> a dict: ``"image"`` [B, D] and ``"text"`` [B, D]
  embeddings, *unnormalised* (the loss and the evaluation normalise them), ``"scale"`` (the
  logit scale, exp'd and clamped: `scale`) and ``"bias"`` (SigLIP's logit bias, or None). One
  call computes both towers, so DDP and FSDP see one forward per step (calling the towers
  separately would skip their hooks).
* ``encode_image(image)`` -> [B, D] and ``encode_text(**text fields)`` -> [B, D], the same
  embeddings one tower at a time (evaluation: zero-shot class prompts have no image). Under
  --strategy fsdp the methods ``fsdp_forward_methods`` names are registered as FSDP forward
  methods (the root's parameters, the projections among them, gathered when they run).
* ``logit_scale`` (a parameter, the log of the scale) and ``logit_bias`` (a parameter, or None).
* ``inputs``: the batch fields ``forward`` takes: ``("image", "text", "text_len")`` for byte-level
  text, ``("image", "input_ids", "attention_mask")`` (or without the mask) for a tokenizer's.
  ``text_inputs``: the text ones alone, which ``encode_text`` takes.
* ``tokenize`` (optional): texts -> the text fields, as in `train.models.builtin`'s contract; without
  it texts are byte ids (`byte_ids`). ``input_norm``, ``image_size``: as there.
* ``block_groups()``: ``[image tower blocks, text tower blocks]``, each from its input side:
  ``--freeze F`` freezes the first ``floor(F x n)`` blocks of *each* tower (`train.models.finetune.Freezer`),
  and --strategy fsdp makes every block of both towers an FSDP unit.
* ``image_tower``: the module(s) ``--lock-image`` freezes and keeps in eval mode (the image
  encoder and its projection: LiT's locked tower).

`ClipModel`, the built-in: the built-in image encoder (a residual CNN with GroupNorm,
`train.models.builtin.ImageEncoder`) and byte-level text encoder (any script, no tokenizer file:
`CaptionEncoder`, the built-in `TextEncoder` pooled by mean and max), each followed by a linear
projection to a shared embedding of ``4 x width``; ``logit_scale`` starts at log(1/0.07) for
clip (CLIP's) and log(10) with a bias of -10 for siglip (SigLIP's).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from train.models import families
from train.models.builtin import Block, ImageEncoder, TextEncoder

MAX_SCALE = math.log(100.0)  # CLIP's clamp: a temperature below 0.01 makes the softmax a hard max
FSDP_FORWARD_METHODS = ("encode_image", "encode_text")
BYTE_INPUTS = ("image", "text", "text_len")


def scale(logit_scale: torch.Tensor) -> torch.Tensor:
    """exp(logit_scale), the log clamped at log(100) as CLIP and open_clip do. Clamped in the
    forward, not after each optimizer step: the same on every rank and on a resume, and no
    loop code of its own; past the clamp its gradient is zero, so it stays there."""
    return logit_scale.clamp(max=MAX_SCALE).exp()


class CaptionEncoder(TextEncoder):
    """The built-in byte-level text encoder, pooled by mean *and* max over the caption: a caption's
    class often sits in one word among many shared ones ("rot: Heute war das Wetter..."); averaged
    over every byte its signal is a few percent of the vector, while a feature that detects it peaks
    wherever the word sits (a text classifier of such captions learned ~3x faster in steps)."""

    def __init__(self, width: int = 32, max_text_len: int = 256):
        super().__init__(width, max_text_len)
        self.out_dim = 2 * self.out_dim

    def forward(self, text: torch.Tensor, text_len: torch.Tensor) -> torch.Tensor:
        text = text[:, : self.max_text_len]
        positions = torch.arange(text.shape[1], device=text.device)
        present = positions[None, :] < text_len[:, None]
        mask = present.unsqueeze(-1).to(self.embed.weight.dtype)
        x = self.embed(text) * mask
        for block in self.blocks:
            x = block(x, mask)
        mean = (x * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        peak = x.masked_fill(~present.unsqueeze(-1), torch.finfo(x.dtype).min).amax(1)
        peak = torch.where(present.any(1, keepdim=True), peak, torch.zeros_like(peak))  # an empty caption: zeros
        return torch.cat([mean, peak], dim=1)


class _Tower(nn.Module):
    """An encoder and its projection to the shared embedding."""

    def __init__(self, encoder: nn.Module, out_dim: int, embed_dim: int):
        super().__init__()
        self.encoder = encoder
        self.proj = nn.Linear(out_dim, embed_dim, bias=False)

    def forward(self, *args):
        return self.proj(self.encoder(*args))


class ClipModel(nn.Module):
    """The built-in image-caption model (see the module docstring)."""

    inputs = BYTE_INPUTS
    text_inputs = ("text", "text_len")
    fsdp_forward_methods = FSDP_FORWARD_METHODS

    def __init__(self, width: int = 32, resolution: int = 64, max_text_len: int = 256, loss: str = "clip"):
        super().__init__()
        embed = 4 * width
        image, text = ImageEncoder(width, resolution), CaptionEncoder(width, max_text_len)
        self.image_tower = _Tower(image, image.out_dim, embed)
        self.text_tower = _Tower(text, text.out_dim, embed)
        siglip = loss == "siglip"
        # shape [1], not a scalar: FSDP shards parameters along their first dimension
        self.logit_scale = nn.Parameter(torch.full((1,), math.log(10.0) if siglip else math.log(1 / 0.07)))
        self.logit_bias = nn.Parameter(torch.full((1,), -10.0)) if siglip else None
        self.max_text_len = max_text_len

    @property
    def image_size(self) -> int:
        return self._encoders()[0].resolution

    def _encoders(self) -> tuple[ImageEncoder, TextEncoder]:
        image, text = self.image_tower.encoder, self.text_tower.encoder
        assert isinstance(image, ImageEncoder) and isinstance(text, TextEncoder)
        return image, text

    def block_groups(self) -> list[list[nn.Module]]:
        image, text = self._encoders()
        return [image.block_list(), text.block_list()]

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for m in self.modules():
            if isinstance(m, Block):
                m.grad_checkpoint = enable

    def encode_image(self, image: torch.Tensor) -> torch.Tensor:
        return self.image_tower(image)

    def encode_text(self, text: torch.Tensor, text_len: torch.Tensor) -> torch.Tensor:
        return self.text_tower(text, text_len)

    def forward(self, image: torch.Tensor, text: torch.Tensor, text_len: torch.Tensor) -> dict:
        return {"image": self.encode_image(image), "text": self.encode_text(text, text_len),
                "scale": scale(self.logit_scale), "bias": self.logit_bias}


def build_clip(name: str, num_classes: int, options: families.Options) -> ClipModel:
    """The clip family's builder (`train.models.families.CLIP`); the class count is not used: the
    classes, where there are any, are zero-shot prompts."""
    return ClipModel(options.width, options.resolution, options.max_text_len, options.loss)


def clip_inputs(name: str) -> tuple[str, ...]:
    return ("image", "text")


def byte_ids(texts: list[str], max_len: int) -> dict[str, torch.Tensor]:
    """Texts as the reader gives them to a byte-level model: UTF-8 byte + 1 (0 = padding), cut at
    ``max_len`` bytes, and their lengths (`train.data.reader.ShardReader._texts`)."""
    ids = torch.zeros(len(texts), max_len, dtype=torch.int64)
    lengths = torch.zeros(len(texts), dtype=torch.int64)
    for i, t in enumerate(texts):
        raw = t.encode("utf-8")[:max_len]
        ids[i, : len(raw)] = torch.tensor(list(raw), dtype=torch.int64) + 1
        lengths[i] = len(raw)
    return {"text": ids, "text_len": lengths}


def text_batch(model: nn.Module, texts: list[str]) -> dict[str, torch.Tensor]:
    """``texts`` as the fields ``model.encode_text`` takes: its ``tokenize``, else byte ids."""
    tokenize: Any = getattr(model, "tokenize", None)
    if tokenize is not None:
        return dict(tokenize(texts))
    return byte_ids(texts, int(getattr(model, "max_text_len", 256)))


def inputs_of(model: nn.Module) -> tuple[str, ...]:
    """The batch fields ``model``'s forward takes (its ``inputs``)."""
    return tuple(getattr(model, "inputs", BYTE_INPUTS))


def text_inputs_of(model: nn.Module) -> tuple[str, ...]:
    """The fields ``model.encode_text`` takes (its ``text_inputs``)."""
    return tuple(getattr(model, "text_inputs", ("text", "text_len")))


def encode_text(model: nn.Module, fields: dict) -> torch.Tensor:
    """``model.encode_text`` on the fields it takes of ``fields``."""
    encode: Any = model.encode_text
    return encode(**{k: fields[k] for k in text_inputs_of(model) if k in fields})


def is_contrastive(model: nn.Module) -> bool:
    """Whether ``model`` keeps the contract above (the parts the loop calls)."""
    return all(callable(getattr(model, n, None)) for n in ("encode_image", "encode_text")) and hasattr(model, "logit_scale")
