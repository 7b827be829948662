"""What `pipe export` writes for the models that are not Hugging Face ones, and reads back.

An export folder of a built-in model (``image``, ``text``, ``image-text``, ``clip``), a
``torchvision:``/``timm:`` classifier or a ``package.module:factory`` model holds two files:

* ``model.safetensors``: the state dict, tensors only. torchvision and timm models are written
  under their library's own names (``fc.weight``, not pipe's wrapper's ``model.fc.weight``), so
  ``torchvision.models.get_model(NAME, num_classes=N).load_state_dict(load_file(...))`` and
  ``timm.create_model(NAME, num_classes=N)`` take them as they are;
* ``config.json`` (`CONFIG_FORMAT`): what builds the model again, the family's way (``model``, the
  --model value; ``objective``, ``loss``; the built-ins' sizes ``width``, ``resolution``,
  ``max_text_len``; ``num_classes``, ``classes``), the input it was trained with (``input``: mean,
  std and size, which a built-in model takes from its dataset's index.json), and where the weights
  came from (``exported_from``, and ``wise`` when they were interpolated).

`pipe train --init-from DIR` reads such a folder (its ``model.safetensors``), `pipe eval` builds
and loads it (`train.models.loading`), and so does `load` here for anyone else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import UsageError
from pipeline.core.files import atomic_write_text

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
CONFIG_FORMAT = "pipe-export/1"
SIZE_KEYS = ("width", "resolution", "max_text_len")
LIBRARY_PREFIX = "model."  # `train.models.vision.VisionClassifier` holds the library's model as ``model``


@dataclass
class Job:
    """What a family's ``export`` hook writes: the weights and what the run knew of them."""

    spec: str
    """The run's --model."""
    arg: str
    """Its family's argument (``resnet18`` of ``torchvision:resnet18``)."""
    state: dict[str, torch.Tensor]
    """The model's full state dict, as pipe's model names it (bare: no DDP/FSDP prefix)."""
    settings: dict
    """The run's resolved settings, as its checkpoint holds them."""
    classes: list[str]
    index: dict
    """The run's index.json where it could be read, else ``{"classes": classes}``."""
    provenance: dict = field(default_factory=dict)
    """``exported_from`` (run, checkpoint, epoch, step) and ``wise``, for the folder's own record."""

    def model_config(self) -> dict[str, Any]:
        """The settings that build the model again (`train.models.builtin.build_model`'s)."""
        out: dict[str, Any] = {"model": self.spec, "objective": self.settings.get("objective", "classify")}
        if "loss" in self.settings:
            out["loss"] = self.settings["loss"]
        out.update({k: self.settings[k] for k in SIZE_KEYS if k in self.settings})
        return out


def _save(state: dict[str, torch.Tensor], path: Path) -> None:
    """safetensors, written under a temporary name and renamed (tensors copied out of any shared
    storage: safetensors refuses two names over one buffer)."""
    from safetensors.torch import save_file

    tmp = path.with_name(f".{path.name}.tmp")
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}, str(tmp),
              metadata={"format": "pt"})
    tmp.replace(path)


def write(job: Job, folder: Path, state: dict[str, torch.Tensor], family: str) -> list[str]:
    """``model.safetensors`` and ``config.json`` into ``folder``; the names written."""
    _save(state, folder / WEIGHTS)
    conf = {"format": CONFIG_FORMAT, "family": family, **job.model_config(), "num_classes": len(job.classes),
            "classes": list(job.classes), "input": job.settings.get("input") or {}, **job.provenance}
    atomic_write_text(folder / CONFIG, json.dumps(conf, indent=2, ensure_ascii=False) + "\n")
    return [WEIGHTS, CONFIG]


def export_builtin(arg: str, job: Job, folder: Path) -> list[str]:
    """The built-in and factory families' ``export`` hook: the state dict under pipe's own names."""
    from train.models import families

    return write(job, folder, job.state, families.resolve(job.spec).family.name)


def export_library(arg: str, job: Job, folder: Path) -> list[str]:
    """The torchvision and timm families' ``export`` hook: the library model's state dict, under
    its own names."""
    from train.models import families

    state = {k[len(LIBRARY_PREFIX):]: v for k, v in job.state.items() if k.startswith(LIBRARY_PREFIX)}
    if len(state) != len(job.state):
        odd = next(k for k in job.state if not k.startswith(LIBRARY_PREFIX))
        raise UsageError(f"{job.spec}: tensor {odd} is not under the library model's names")
    return write(job, folder, state, families.resolve(job.spec).family.name)


def read_config(folder: Path) -> dict:
    """An export folder's config.json (`CONFIG_FORMAT`), or a UsageError."""
    path = Path(folder) / CONFIG
    try:
        conf = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(conf, dict) or conf.get("format") != CONFIG_FORMAT:
        raise UsageError(f"{path} was not written by pipe export ({CONFIG_FORMAT})")
    return conf


def load(folder: Path) -> nn.Module:
    """The model of an export folder of this layout, built its family's way and every tensor loaded
    (a tensor missing or of another shape is an error, not a half-loaded model), in eval mode."""
    from train.models.builtin import build_model
    from train.models.finetune import load_init

    folder = Path(folder)
    conf = read_config(folder)
    classes = list(conf.get("classes") or [])
    sizes = {k: conf[k] for k in SIZE_KEYS if k in conf}
    extra = {k: conf[k] for k in ("objective", "loss") if k in conf}
    torch.manual_seed(0)
    model = build_model(str(conf["model"]), len(classes), index={"classes": classes}, **sizes, **extra)
    report = load_init(model, folder / WEIGHTS)
    if report.missing or report.skipped_shape:
        wrong = report.missing[:1] or [report.skipped_shape[0][0]]
        raise UsageError(f"{folder / WEIGHTS} does not fit --model {conf['model']} (e.g. {wrong[0]})")
    return model.eval()
