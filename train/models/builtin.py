"""The models `pipe train` builds, and the small contract any model keeps to be trained by it.

Built in (all small enough for a CPU demo, all free of batch statistics):

* ``image``: a residual CNN. Inputs larger than ``resolution`` are area-resized down first.
* ``text``: byte-level (ids = byte + 1, 0 = padding), so no tokenizer is ever downloaded.
* ``image-text``: both encoders, their pooled features concatenated before one head.

Normalisation is GroupNorm/LayerNorm, never BatchNorm: a sample's output does not depend on the
other samples in its batch, so N micro-batches of b give the gradients of one batch of N x b,
recomputing a block under gradient checkpointing cannot update running statistics twice, and
ranks have no buffers to drift apart.

The families ``--model`` names (these built-ins, ``package.module:factory``, ``torchvision:NAME``,
``timm:NAME``, ``hf:PATH``) are declared in `train.models.families`; `build_model` builds any of them.

The contract for ``--model package.module:factory`` (``factory(num_classes=N)``, plus
``index=<index.json as a dict>`` when the factory names an ``index`` parameter; ``**kwargs`` alone
gets no ``index``):

* ``model.inputs`` (optional): the batch fields ``forward`` takes as keyword arguments, e.g.
  ``("image",)`` or ``("text", "text_len")``. Without it, ``forward(images)`` is called positionally
  (the torchvision/timm convention).
* ``model.image_size`` (optional): the side, in pixels, the model wants its images at; the reader
  then decodes them at that size (never larger than the shards hold) instead of the stored size.
  The built-in models have it (their ``resolution``).
* ``model.head`` (optional): the final ``nn.Linear``; re-initialised when --init-from's class
  count differs.
* ``model.block_groups()`` (optional): lists of blocks from input to output that --freeze counts;
  without it, the model's top-level children except the head. Every block is a registered
  submodule that forward calls (FSDP makes each one a unit).
* ``model.input_params()`` (optional): parameters outside every block on the input side (a ViT's
  class token and position embedding), frozen whenever the first block is.
* ``model.input_norm`` (optional): a `train.models.norm.InputNorm` (mean, std, size, source), the
  normalisation the model was trained with; the reader applies it instead of the index's mean/std.
* ``model.tokenize`` (optional): texts -> ``input_ids``/``attention_mask`` tensors, run in the
  dataloader workers (its ``inputs`` name those fields); without it, texts are byte ids.
* ``model.init_report`` (optional): a `train.models.finetune.InitReport` of the weights the model
  loaded when built (``hf:PATH``), printed at start like --init-from's.
* ``model.set_grad_checkpointing(True)`` (timm) or ``gradient_checkpointing_enable()`` (Hugging
  Face), for --grad-checkpoint.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from pipeline.core.errors import UsageError
from train.models import families


def _norm2d(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(8 if channels % 8 == 0 else 1, channels)


class Block(nn.Module):
    """A residual block that can recompute its activations in the backward pass."""

    grad_checkpoint: bool = False

    def forward(self, *args):
        if self.grad_checkpoint and self.training and torch.is_grad_enabled():
            # Non-reentrant: correct when the input does not require grad (a frozen block in front),
            # keeps autocast state, and lets DDP's hooks fire normally in the recomputed backward.
            return checkpoint(self.body, *args, use_reentrant=False)
        return self.body(*args)

    def body(self, *args):  # pragma: no cover - abstract
        raise NotImplementedError


class ConvBlock(Block):
    """conv3x3 - GN - ReLU - conv3x3 - GN, plus the input (1x1 conv when the shape changes), ReLU."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = _norm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = _norm2d(cout)
        self.skip = (nn.Identity() if cin == cout and stride == 1
                     else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm2d(cout)))

    def body(self, x):
        y = F.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        return F.relu(y + self.skip(x))


class ImageEncoder(nn.Module):
    """Stem (stride 2) and five residual blocks over three widths; global average pool."""

    def __init__(self, width: int = 32, resolution: int = 64):
        super().__init__()
        self.resolution = resolution
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 2, 1, bias=False), _norm2d(w), nn.ReLU())
        self.blocks = nn.ModuleList([
            ConvBlock(w, w), ConvBlock(w, 2 * w, 2), ConvBlock(2 * w, 2 * w),
            ConvBlock(2 * w, 4 * w, 2), ConvBlock(4 * w, 4 * w),
        ])
        self.out_dim = 4 * w

    def block_list(self) -> list[nn.Module]:
        return [self.stem, *self.blocks]

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        if image.shape[-1] > self.resolution or image.shape[-2] > self.resolution:
            # area = averaging whole input pixels: no aliasing, and exact for integer factors
            image = F.interpolate(image, size=(self.resolution, self.resolution), mode="area")
        x = self.stem(image)
        for block in self.blocks:
            x = block(x)
        return x.mean(dim=(2, 3))


class ByteConvBlock(Block):
    """Pre-norm residual block over a byte sequence [B, L, C]: LayerNorm, dilated depthwise conv,
    GELU, pointwise linear. Padding positions are zeroed before the conv, so a sample's output
    does not depend on how far its batch was padded."""

    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.norm = nn.LayerNorm(channels)
        self.conv = nn.Conv1d(channels, channels, 5, padding=2 * dilation, dilation=dilation, groups=channels)
        self.mix = nn.Linear(channels, channels)

    def body(self, x, mask):
        y = self.norm(x) * mask
        y = self.conv(y.transpose(1, 2)).transpose(1, 2)
        return x + self.mix(F.gelu(y)) * mask


class TextEncoder(nn.Module):
    """Byte embedding (257 ids: 0 = padding) and four dilated residual blocks; masked mean pool."""

    def __init__(self, width: int = 32, max_text_len: int = 256):
        super().__init__()
        c = 2 * width
        self.max_text_len = max_text_len
        self.embed = nn.Embedding(257, c, padding_idx=0)
        self.blocks = nn.ModuleList([ByteConvBlock(c, d) for d in (1, 2, 4, 8)])
        self.out_dim = c

    def block_list(self) -> list[nn.Module]:
        return [self.embed, *self.blocks]

    def forward(self, text: torch.Tensor, text_len: torch.Tensor) -> torch.Tensor:
        text = text[:, : self.max_text_len]
        positions = torch.arange(text.shape[1], device=text.device)
        mask = (positions[None, :] < text_len[:, None]).unsqueeze(-1).to(self.embed.weight.dtype)
        x = self.embed(text) * mask
        for block in self.blocks:
            x = block(x, mask)
        # an empty text (length 0) pools to zeros instead of dividing by zero
        return (x * mask).sum(1) / mask.sum(1).clamp(min=1.0)


class Classifier(nn.Module):
    """One or two encoders, their pooled features concatenated, one linear head."""

    def __init__(self, num_classes: int, image: ImageEncoder | None = None, text: TextEncoder | None = None):
        super().__init__()
        self.image = image
        self.text = text
        self.inputs = (("image",) if image else ()) + (("text", "text_len") if text else ())
        dim = (image.out_dim if image else 0) + (text.out_dim if text else 0)
        self.head = nn.Linear(dim, num_classes)

    @property
    def image_size(self) -> int | None:
        """The side the image encoder works at: the reader decodes images at this size."""
        return self.image.resolution if self.image is not None else None

    def block_groups(self) -> list[list[nn.Module]]:
        return [enc.block_list() for enc in (self.image, self.text) if enc is not None]

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for m in self.modules():
            if isinstance(m, Block):
                m.grad_checkpoint = enable

    def forward(self, image=None, text=None, text_len=None) -> torch.Tensor:
        feats = []
        if self.image is not None:
            feats.append(self.image(image))
        if self.text is not None:
            feats.append(self.text(text, text_len))
        return self.head(torch.cat(feats, dim=1))


def build_builtin(name: str, num_classes: int, width: int = 32, resolution: int = 64, max_text_len: int = 256) -> Classifier:
    if name not in families.BUILTIN_INPUTS:
        raise families.unknown(name)
    reads = families.BUILTIN_INPUTS[name]
    image = ImageEncoder(width, resolution) if "image" in reads else None
    text = TextEncoder(width, max_text_len) if "text" in reads else None
    return Classifier(num_classes, image, text)


def build_named(name: str, num_classes: int, options: families.Options) -> Classifier:
    """The built-in family's builder (`train.models.families.BUILTIN`)."""
    return build_builtin(name, num_classes, options.width, options.resolution, options.max_text_len)


def build_from_factory(spec: str, num_classes: int, options: families.Options) -> nn.Module:
    """``package.module:factory``'s builder (`train.models.families.FACTORY`)."""
    model = _call_factory(spec, load_factory(spec), num_classes, options.index)
    if not isinstance(model, nn.Module):
        raise UsageError(f"--model {spec} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def load_factory(spec: str):
    """``package.module:factory`` -> the callable, or a usage error that says what went wrong."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"--model {spec!r}: expected package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the user's module failing at import
        raise UsageError(f"--model {spec}: cannot import {module_name} ({type(e).__name__}: {e})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError(f"--model {spec}: {module_name} has no callable {attr!r}")
    return factory


def _call_factory(spec: str, factory, num_classes: int, index: dict | None):
    """``factory(num_classes=N)``, plus ``index=`` only when the factory names an ``index``
    parameter: a ``**kwargs`` factory (every torchvision and timm constructor) passes what it gets
    on to a model class that has no such argument. A failure says what pipe passed, since the
    user did not write that call."""
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C extension without a signature
        params = {}
    kwargs: dict[str, Any] = {"num_classes": num_classes}
    index_param = params.get("index")
    if index_param is not None and index_param.kind in (index_param.POSITIONAL_OR_KEYWORD, index_param.KEYWORD_ONLY):
        kwargs["index"] = index
    call = ", ".join(["num_classes=" + str(num_classes)] + (["index=<SHARD_DIR/index.json as a dict>"] if "index" in kwargs else []))
    try:
        return factory(**kwargs)
    except Exception as e:
        raise UsageError(f"--model {spec}: pipe called {spec.partition(':')[2]}({call}) and it failed: "
                         f"{type(e).__name__}: {e}") from None


def build_model(spec: str, num_classes: int, *, index: dict | None = None, width: int = 32, resolution: int = 64,
                max_text_len: int = 256, grad_checkpoint: bool = False, objective: str = "classify",
                loss: str = "clip") -> nn.Module:
    """The model named by --model (built by its family, `train.models.families`: torchvision, timm
    and transformers imported only for theirs) for --objective (a classifier, or image and caption
    embeddings: `train.models.clip`), with gradient checkpointing switched on when asked."""
    options = families.Options(index, width, resolution, max_text_len, objective, loss)
    model: nn.Module = families.build(spec, num_classes, options)
    if grad_checkpoint:
        switch = getattr(model, "set_grad_checkpointing", None)
        enable = getattr(model, "gradient_checkpointing_enable", None)
        if callable(switch):
            switch(True)
        elif callable(enable):
            enable()
        else:
            raise UsageError(f"--grad-checkpoint: model {spec} has neither set_grad_checkpointing() nor "
                             "gradient_checkpointing_enable()")
    return model


def model_inputs(model: nn.Module) -> tuple[str, ...] | None:
    """The batch fields the model takes by name, or None for ``forward(images)``."""
    inputs = getattr(model, "inputs", None)
    return tuple(inputs) if inputs is not None else None


def reader_fields(model: nn.Module) -> tuple[str, ...]:
    """What the reader must decode for this model (``text_len`` comes with ``text``; ``input_ids``
    and ``attention_mask`` come from the text by the model's ``tokenize``)."""
    inputs = model_inputs(model) or ("image",)
    return tuple(f for f in ("image", "text") if f in inputs or (f == "text" and "input_ids" in inputs))


def reader_image_size(model: nn.Module, stored: int | None) -> int | None:
    """The side the reader should decode images at: the model's ``image_size`` when it has one,
    capped at the shards' ``stored`` size (enlarging adds nothing); None: as stored."""
    want = getattr(model, "image_size", None)
    if stored is None or not isinstance(want, int) or want < 1:
        return None
    return min(want, stored)


def forward(model: nn.Module, inner: nn.Module, batch: dict) -> torch.Tensor:
    """Call ``model`` (maybe DDP-wrapped; ``inner`` is the bare module) on a batch dict."""
    inputs = model_inputs(inner)
    if inputs is None:
        return model(batch["image"])
    return model(**{k: batch[k] for k in inputs})
