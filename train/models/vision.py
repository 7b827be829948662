"""``--model torchvision:NAME`` and ``--model timm:NAME``: the image models people fine-tune.

Built without weights (torchvision ``weights=None``, timm ``pretrained=False``): nothing is ever
downloaded. The pretrained weights are the user's own file, loaded by ``--init-from`` (a ``.pth``
or ``.safetensors`` of the original model, ImageNet head included): every tensor but the head's
loads, and the per-tensor report says the head was replaced for the dataset's classes.

What pretrained weights need besides the weights comes from the library's own metadata, offline:

* the normalisation and input size: torchvision's weights enum for that model name (its
  ``transforms()`` are constants, nothing is fetched), timm's ``pretrained_cfg`` (mean, std,
  input_size). The reader applies exactly that (`train.models.norm.InputNorm`), the run prints it
  and the preflight compares it across ranks.
* the classification head: torchvision's ``fc`` / ``classifier`` / ``heads`` / ``head``, timm's
  ``get_classifier()``; the model is built with one output per class of the dataset.
* the blocks ``--freeze`` counts from the input side (`block_groups`): the stem's modules, then
  the stages or layers: a ResNet's conv1, bn1, layer1..4; a ViT's patch embedding then each
  encoder layer; an EfficientNet's ``features`` stages; timm models by their ``feature_info``.
  Loose tensors at the input (a ViT's class token and position embedding) freeze with the first
  block (`input_params`).

Only models whose input must be one fixed size (ViTs, Swin) get their images enlarged in
``forward`` when the shards are stored smaller; a CNN takes what the reader decodes (at most the
model's size: the reader never enlarges).

torchvision and timm are imported only here, and only when such a model is asked for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.errors import UsageError
from train.models import families
from train.models.finetune import checkpoint_blocks
from train.models.norm import InputNorm

TORCHVISION, TIMM = families.TORCHVISION.prefix, families.TIMM.prefix


class VisionClassifier(nn.Module):
    """A torchvision or timm classifier in `pipe train`'s model contract (`train.models.builtin`).

    The library's model is ``self.model``, so state-dict names are the original ones under
    ``model.``, a prefix --init-from strips: a file saved from the bare model loads as it is."""

    inputs = None  # forward(images), the torchvision/timm convention

    def __init__(self, model: nn.Module, *, head_path: str, groups: Callable[[nn.Module], list[list[nn.Module]]],
                 input_params: Callable[[nn.Module], list[nn.Parameter]], input_norm: InputNorm, fixed_size: bool,
                 label: str, pretrained_from: str | None = None):
        super().__init__()
        self.model = model
        self.head_path = head_path
        self._groups, self._input_params = groups, input_params
        self.input_norm = input_norm
        self.fixed_size = fixed_size
        self.label = label
        # how to get the pretrained weights this normalisation was made for: without them the
        # model starts random, and the run says so loudly (`RunConsole.random_weights`)
        self.pretrained_from = pretrained_from

    @property
    def image_size(self) -> int | None:
        """The side the weights were trained at: the reader decodes at most that."""
        return self.input_norm.size

    @property
    def head(self) -> nn.Module:
        """The classification head (a property: not registered twice in the state dict)."""
        return self.model.get_submodule(self.head_path)

    def block_groups(self) -> list[list[nn.Module]]:
        return self._groups(self.model)

    def input_params(self) -> list[nn.Parameter]:
        """Parameters outside every block, on the input side: frozen with the first block."""
        return self._input_params(self.model)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Per block, the blocks --freeze counts, for torchvision and timm alike (timm's own switch
        would recompute BatchNorm's running statistics a second time each step)."""
        if enable:
            checkpoint_blocks(self)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        size = self.input_norm.size
        if self.fixed_size and size and (image.shape[-1] != size or image.shape[-2] != size):
            # stored smaller than the model's fixed input: enlarged here (the reader never
            # enlarges); bilinear is linear, so it commutes with the per-channel normalisation
            image = F.interpolate(image, size=(size, size), mode="bilinear", align_corners=False)
        return self.model(image)


# -- torchvision ---------------------------------------------------------------------------------


def _torchvision(label: str):
    try:
        import torchvision.models as models
    except ImportError:
        raise UsageError(f"--model {label} needs the torchvision package built for this torch "
                         "(pip install 'pipe-ml[models]')") from None
    except RuntimeError as e:  # a torchvision built for another torch: "operator torchvision::nms does not exist"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"--model {label}: torchvision does not load beside torch {torch.__version__} ({first}); "
                         "install the torchvision release built for this torch") from None
    return models


def _first_linear_path(model: nn.Module, path: str) -> str:
    """``path`` itself when it is a Linear, else its last Linear (``classifier`` -> ``classifier.1``)."""
    module = model.get_submodule(path)
    if isinstance(module, nn.Linear):
        return path
    names = [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise UsageError(f"no Linear layer in {path}")
    return f"{path}.{names[-1]}"


def _tv_head(model: nn.Module, label: str) -> str:
    """fc (ResNet, RegNet, Inception), classifier (EfficientNet, MobileNet, DenseNet, ConvNeXt, VGG),
    heads (ViT), head (Swin, MaxViT): the last Linear of the first that exists."""
    for path in ("fc", "classifier", "heads", "head"):
        if isinstance(getattr(model, path, None), nn.Module):
            try:
                return _first_linear_path(model, path)
            except UsageError:
                continue
    raise UsageError(f"--model {label}: no classification head found (looked for fc, classifier, heads, head)")


def _tv_groups(model: nn.Module) -> list[list[nn.Module]]:
    """ResNet-like: conv1, bn1, layer1..4; ViT: conv_proj then each encoder layer; models with a
    ``features`` Sequential (EfficientNet, MobileNet, ConvNeXt, VGG, DenseNet): its stages; Swin
    likewise. Otherwise the top-level children in order, the head excluded."""
    if all(hasattr(model, n) for n in ("conv1", "layer1", "layer4")):
        stem = [getattr(model, n) for n in ("conv1", "bn1") if isinstance(getattr(model, n, None), nn.Module)]
        return [stem + [getattr(model, f"layer{i}") for i in range(1, 5)]]
    encoder = getattr(model, "encoder", None)
    if hasattr(model, "conv_proj") and encoder is not None and hasattr(encoder, "layers"):
        return [[model.conv_proj, *encoder.layers]]
    features = getattr(model, "features", None)
    head_roots = {"fc", "classifier", "heads", "head", "avgpool"}
    blocks = list(features) if isinstance(features, nn.Sequential) else \
        [m for n, m in model.named_children() if n not in head_roots]
    return [[m for m in blocks if any(True for _ in m.parameters())]]  # a ReLU or pooling is no block


def _tv_input_params(model: nn.Module) -> list[nn.Parameter]:
    """A torchvision ViT's class token and position embedding (they sit outside every block)."""
    found = [getattr(model, "class_token", None), getattr(getattr(model, "encoder", None), "pos_embedding", None)]
    return [p for p in found if isinstance(p, nn.Parameter)]


def _tv_weights(default) -> str:
    """Where torchvision's default weights for the model are downloaded from, and the flag that loads them."""
    url = str(getattr(default, "url", "") or "")
    if not url:
        return f"the {default} weights saved as a state dict: --init-from FILE.pth"
    return f"{default}: download {url}, then --init-from {url.rsplit('/', 1)[-1]}"


def build_torchvision(name: str, num_classes: int, options: families.Options | None = None) -> VisionClassifier:
    """The torchvision family's builder (``options``: nothing a library model takes)."""
    label = TORCHVISION + name
    models = _torchvision(label)
    try:
        builder = models.get_model_builder(name)
        weights = models.get_model_weights(name)
    except (ValueError, KeyError):
        known = ", ".join(models.list_models(module=models)[:12])
        raise UsageError(f"--model {label}: torchvision has no classification model {name!r} (e.g. {known}, ...)") from None
    default = weights.DEFAULT  # every weights enum has DEFAULT
    try:
        model = builder(weights=None, num_classes=num_classes)
    except (TypeError, ValueError) as e:
        raise UsageError(f"--model {label}: torchvision could not build it ({e})") from None
    transforms = default.transforms()
    size = int(transforms.crop_size[0])
    norm = InputNorm(tuple(float(v) for v in transforms.mean), tuple(float(v) for v in transforms.std), size,
                     f"{label} ({default} transforms)")
    min_size = default.meta.get("min_size", (1, 1))
    fixed = tuple(min_size) == (size, size)  # a ViT/Swin takes exactly its size; CNNs take any
    norm = dataclasses.replace(norm, enlarged=fixed)
    return VisionClassifier(model, head_path=_tv_head(model, label), groups=_tv_groups, input_params=_tv_input_params,
                            input_norm=norm, fixed_size=fixed, label=label, pretrained_from=_tv_weights(default))


# -- timm ---------------------------------------------------------------------------------------


def _timm(label: str):
    try:
        import timm
    except ImportError:
        raise UsageError(f"--model {label} needs the timm package (pip install 'pipe-ml[models]')") from None
    except RuntimeError as e:  # timm imports torchvision: the same mismatch
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"--model {label}: timm does not load beside torch {torch.__version__} ({first})") from None
    return timm


def _classifier(model: nn.Module) -> nn.Module | None:
    """timm's ``get_classifier()``, when the model has it."""
    get = getattr(model, "get_classifier", None)
    head = get() if callable(get) else None
    return head if isinstance(head, nn.Module) else None


def _timm_head(model: nn.Module, label: str) -> str:
    head = _classifier(model)
    path = next((n for n, m in model.named_modules() if m is head and n), None) if isinstance(head, nn.Module) else None
    if path is None:
        cfg_path = (getattr(model, "pretrained_cfg", None) or {}).get("classifier")
        path = cfg_path if isinstance(cfg_path, str) else None
    if path is None:
        raise UsageError(f"--model {label}: timm names no classifier for it")
    return path


def _timm_groups(model: nn.Module) -> list[list[nn.Module]]:
    """The stages timm's ``feature_info`` names (a ResNet's act1, layer1..4; a ViT's blocks), with
    every top-level module before the first of them (the stem, a ViT's patch embedding) as blocks
    of their own."""
    info = getattr(model, "feature_info", None)
    names = [f["module"] for f in info] if isinstance(info, list) else []
    modules = [model.get_submodule(n) for n in names if n]
    stages = [m for m in modules if any(True for _ in m.parameters())]  # act1 and friends hold nothing
    if not stages:
        head = _classifier(model)
        return [[m for m in model.children() if m is not head]]
    first_top = names[0].split(".")[0]
    stem = []
    for n, m in model.named_children():
        if n == first_top:
            break
        if any(True for _ in m.parameters()):
            stem.append(m)
    return [[m for m in stem if m not in stages] + stages]


def _timm_input_params(model: nn.Module) -> list[nn.Parameter]:
    found = [getattr(model, n, None) for n in ("cls_token", "pos_embed", "reg_token", "dist_token")]
    return [p for p in found if isinstance(p, nn.Parameter)]


def _timm_weights(cfg: dict) -> str:
    """Where timm's weights for the model's pretrained_cfg are downloaded from (its Hugging Face
    repository's model.safetensors, else the cfg's url), and the flag that loads them."""
    hub = cfg.get("hf_hub_id")
    if isinstance(hub, str) and hub:
        return f"download https://huggingface.co/{hub}/resolve/main/model.safetensors, then --init-from model.safetensors"
    url = cfg.get("url")
    if isinstance(url, str) and url:
        return f"download {url}, then --init-from {url.rsplit('/', 1)[-1]}"
    return "a state dict or .safetensors of its pretrained weights: --init-from FILE"


def build_timm(name: str, num_classes: int, options: families.Options | None = None) -> VisionClassifier:
    """The timm family's builder (``options``: nothing a library model takes)."""
    label = TIMM + name
    timm = _timm(label)
    try:
        model = timm.create_model(name, pretrained=False, num_classes=num_classes)
    except RuntimeError as e:  # timm's "Unknown model (NAME)"
        raise UsageError(f"--model {label}: {e}") from None
    cfg: dict[str, Any] = dict(getattr(model, "pretrained_cfg", None) or {})
    size = cfg.get("input_size", (3, 224, 224))[-1]
    mean, std = cfg.get("mean", (0.485, 0.456, 0.406)), cfg.get("std", (0.229, 0.224, 0.225))
    tag, fixed = cfg.get("tag"), bool(cfg.get("fixed_input_size"))
    norm = InputNorm(tuple(float(v) for v in mean), tuple(float(v) for v in std), int(size),
                     f"{label} pretrained_cfg" + (f" ({cfg.get('architecture', name)}.{tag})" if tag else ""), fixed)
    return VisionClassifier(model, head_path=_timm_head(model, label), groups=_timm_groups,
                            input_params=_timm_input_params, input_norm=norm, fixed_size=fixed, label=label,
                            pretrained_from=_timm_weights(cfg))


def check_torchvision(name: str) -> None:
    """torchvision loads and knows the name (nothing built): for the command line, before any rank."""
    spec = TORCHVISION + name
    models = _torchvision(spec)
    if name not in models.list_models(module=models):
        known = ", ".join(models.list_models(module=models)[:12])
        raise UsageError(f"--model {spec}: torchvision has no classification model {name!r} (e.g. {known}, ...)")


def check_timm(name: str) -> None:
    """timm loads and knows the name (nothing built): for the command line, before any rank."""
    spec = TIMM + name
    if not _timm(spec).is_model(name):
        raise UsageError(f"--model {spec}: timm has no model {name!r} (timm.list_models() lists them)")
