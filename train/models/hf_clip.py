"""``--model hf:PATH --objective contrastive``: a local Hugging Face CLIP or SigLIP folder, nothing
downloaded, in the image-caption contract of `train.models.clip` (`HFContrastive`).

The folder is what ``save_pretrained`` writes: ``config.json`` (``model_type`` clip or siglip, or any
model transformers' ``AutoModel`` builds with ``get_image_features`` and ``get_text_features``), the
weights, the tokenizer and ``preprocessor_config.json``. What the model is fed is the folder's own:

* images at its image processor's size, normalised with its mean and std (`train.models.hf.
  read_input_norm`; the reader decodes at most the shards' size, the model enlarges the rest);
* captions through its tokenizer, in the dataloader workers: CLIP's padded to the longest allowed
  and attended by the mask (``input_ids``, ``attention_mask``; --max-text-len caps the tokens);
  SigLIP's ``input_ids`` alone, padded to exactly its ``max_position_embeddings`` (its text tower
  pools the last position and was trained on that padding, as ``SiglipProcessor`` pads).

Embeddings are ``get_image_features`` / ``get_text_features`` (the projected, unnormalised
features, what transformers' own ``forward`` normalises), the scale ``exp(logit_scale)`` (clamped
at 100, `train.models.clip.scale`) and for SigLIP its ``logit_bias``; so an export of the weights
computes in transformers what pipe computed. ``block_groups()``: each tower's embeddings, then its
encoder layers; ``image_tower`` (--lock-image): the vision model and its projection.

Every load passes ``local_files_only=True`` and ``trust_remote_code=False``, with the hub switched off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.errors import UsageError
from train.models import families
from train.models.clip import FSDP_FORWARD_METHODS, scale
from train.models.finetune import InitReport
from train.models.hf import HFClassifier, Tokenize, _offline, build_hf, read_input_norm
from train.models.hf_files import folder_problem, has_tokenizer, weights_file
from train.models.norm import InputNorm

PREFIX = families.HF.prefix


def _features(out: Any) -> torch.Tensor:
    """``get_*_features``' embeddings: a tensor (transformers 4) or an output's ``pooler_output`` (5)."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


class HFContrastive(nn.Module):
    """A transformers image-text model in `pipe train`'s image-caption contract."""

    model: Any  # a transformers PreTrainedModel (typed loosely: transformers is optional)
    fsdp_forward_methods = FSDP_FORWARD_METHODS

    def __init__(self, model: nn.Module, tokenize: Tokenize, input_norm: InputNorm | None, siglip: bool,
                 use_bias: bool | None = None):
        super().__init__()
        self.model = model
        self.tokenize = tokenize
        self.input_norm = input_norm
        self.siglip = siglip
        self.use_bias = siglip if use_bias is None else use_bias
        self.text_inputs = ("input_ids",) if siglip else ("input_ids", "attention_mask")
        self.inputs = ("image", *self.text_inputs)
        self.max_text_len = tokenize.max_len
        self.init_report: InitReport | None = None

    @property
    def image_size(self) -> int | None:
        size = self.input_norm.size if self.input_norm else None
        return size or getattr(getattr(self.model.config, "vision_config", None), "image_size", None)

    @property
    def logit_scale(self) -> nn.Parameter:
        return self.model.logit_scale

    @property
    def logit_bias(self) -> nn.Parameter | None:
        return getattr(self.model, "logit_bias", None) if self.use_bias else None

    @property
    def image_tower(self) -> nn.ModuleList:
        """The vision model and its projection (a property: not registered a second time)."""
        parts = [self.model.vision_model]
        projection = getattr(self.model, "visual_projection", None)
        if isinstance(projection, nn.Module):
            parts.append(projection)
        return nn.ModuleList(parts)

    def block_groups(self) -> list[list[nn.Module]]:
        """Per tower, from its input side: its embeddings, then its encoder's layers."""
        return [[tower.embeddings, *tower.encoder.layers] for tower in (self.model.vision_model, self.model.text_model)]

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        if enable:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            self.model.gradient_checkpointing_disable()

    def encode_image(self, image: torch.Tensor) -> torch.Tensor:
        size = self.image_size
        if size and (image.shape[-1] != size or image.shape[-2] != size):
            # shards stored smaller than the model's input: enlarged here (the reader never enlarges)
            image = F.interpolate(image, size=(size, size), mode="bilinear", align_corners=False)
        return _features(self.model.get_image_features(pixel_values=image))

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.siglip:
            return _features(self.model.get_text_features(input_ids=input_ids))
        return _features(self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask))

    def forward(self, image: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict:
        return {"image": self.encode_image(image), "text": self.encode_text(input_ids, attention_mask),
                "scale": scale(self.model.logit_scale), "bias": self.logit_bias}


def _report(label: str, folder: Path, model: nn.Module, info: dict) -> InitReport:
    missing = sorted(info.get("missing_keys") or [])
    mismatched = sorted(info.get("mismatched_keys") or [], key=lambda t: t[0])
    skipped = {k for k, _, _ in mismatched}
    return InitReport(source=label, kind=f"Hugging Face folder ({weights_file(folder)})",
                      loaded=[k for k in model.state_dict() if k not in set(missing) | skipped],
                      skipped_shape=[(k, tuple(a), tuple(b)) for k, a, b in mismatched], missing=missing,
                      unexpected=sorted(info.get("unexpected_keys") or []))


def build_contrastive(path: str, options: families.Options) -> HFContrastive:
    """The CLIP or SigLIP model in the local folder ``path`` (`build` hands
    --objective contrastive here)."""
    label = PREFIX + str(path)
    problem = folder_problem(path)
    if problem:
        raise UsageError(problem)
    folder = Path(path)
    if not has_tokenizer(folder):
        raise UsageError(f"--model {label}: no tokenizer in it: an image-caption model needs one for its captions")
    transformers = _offline()
    try:
        model, info = transformers.AutoModel.from_pretrained(folder, local_files_only=True, trust_remote_code=False,
                                                             output_loading_info=True, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"--model {label}: transformers cannot build it ({first})") from None
    if not all(callable(getattr(model, n, None)) for n in ("get_image_features", "get_text_features")) or \
            not isinstance(getattr(model, "logit_scale", None), nn.Parameter):
        raise UsageError(f"--model {label} is a {type(model).__name__}, not an image-text model with image and text "
                         "features and a logit scale (CLIP, SigLIP) that --objective contrastive trains")
    model.train()
    siglip = getattr(model.config, "model_type", "") == "siglip" or isinstance(getattr(model, "logit_bias", None), nn.Parameter)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    limit = int(getattr(model.config.text_config, "max_position_embeddings", 0) or options.max_text_len)
    tokens = limit if siglip else min(options.max_text_len, limit)
    bias = getattr(model, "logit_bias", None)
    use_bias = isinstance(bias, nn.Parameter) and options.loss != "clip"
    if isinstance(bias, nn.Parameter) and not use_bias:
        # --loss clip on a SigLIP model: its bias takes no part in the loss (and DDP refuses a
        # trainable parameter without a gradient): kept as it is
        bias.requires_grad_(False)
    wrapped = HFContrastive(model, Tokenize(tokenizer, tokens, label), read_input_norm(folder, label), siglip, use_bias)
    wrapped.init_report = _report(label, folder, model, info)
    return wrapped


def build(path: str, num_classes: int, options: families.Options | None = None) -> HFClassifier | HFContrastive:
    """The hf family's builder: a CLIP or SigLIP folder's two towers for --objective contrastive
    (image and caption embeddings, no head), else `train.models.hf.build_hf`'s classifier."""
    options = options or families.Options()
    if options.objective == "contrastive":
        return build_contrastive(path, options)
    return build_hf(path, num_classes, options)


def load_hf(path: str, options: families.Options) -> HFContrastive:
    """The hf family's ``load`` for pipe eval: the folder's model as it is, in eval mode."""
    model = build_contrastive(path, families.Options(objective="contrastive", max_text_len=options.max_text_len,
                                                     loss="auto"))  # its bias, where it has one
    model.eval()
    return model
