"""A saved model, for `pipe eval` (and anyone who measures one): a run folder, an export folder or
an ``hf:`` folder, built as `pipe train` built it and its weights loaded, in eval mode.

What MODEL may be (`load_model`):

* ``hf:PATH``: a Hugging Face CLIP or SigLIP folder as it is (`train.models.hf_clip.load_hf`), the
  starting point of a fine-tuning;
* a RUN_DIR of `pipe train`: its ``config.json`` (the run's resolved settings) says which model
  and with which sizes (``model``, ``objective``, ``loss``, ``width``, ``resolution``,
  ``max_text_len``); the weights are ``best.pt`` (else ``last.pt``), or ``best.dcp`` / ``last.dcp``
  under --strategy fsdp (gathered into one process here, no process group needed); ``which``
  picks ``best`` or ``last``;
* an export folder (`pipe export`): ``config.json`` with those same keys and ``model.safetensors``
  (the layout `pipe export` writes for the built-in models; the one contract the two commands share);
  or, exported from an ``hf:`` model, a folder transformers loads alone (``config.json`` with a
  ``model_type``): read as ``hf:``.

A model for another objective (a classifier) is refused in one line: pipe eval measures
image-caption models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import UsageError
from train.models import families

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
SIZE_KEYS = ("width", "resolution", "max_text_len")


def load_model(spec: str, which: str = "best") -> tuple[nn.Module, str]:
    """The model MODEL names (see the module docstring) in eval mode, and what it is, in words."""
    if spec.startswith(families.HF.prefix):
        options = families.Options(objective="contrastive")
        return families.load(spec, options), f"{spec} (as saved)"
    folder = Path(spec)
    if not (folder / CONFIG).is_file():
        raise UsageError(f"MODEL {spec}: neither hf:PATH nor a folder with a {CONFIG} (a RUN_DIR of pipe train, or "
                         "a folder pipe export wrote)")
    conf = _read_config(folder)
    if "model" not in conf and "model_type" in conf:  # an hf: model exported: a folder transformers loads alone
        return families.load(families.HF.prefix + str(folder), families.Options(objective="contrastive")), \
            f"{folder} (a Hugging Face folder)"
    model = load_saved(str(folder), families.Options(), which=which, conf=conf)
    return model, f"{getattr(model, 'loaded_from', folder)} (--model {conf.get('model')})"


def _read_config(folder: Path) -> dict:
    try:
        conf = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{folder / CONFIG} is not readable JSON ({e})") from None
    if not isinstance(conf, dict):
        raise UsageError(f"{folder / CONFIG} is not a JSON object")
    return conf


def load_saved(path: str, options: families.Options, which: str = "best", conf: dict | None = None) -> nn.Module:
    """A run folder's or an export folder's model (the clip family's ``load`` hook; any family built
    by `families.build` loads the same way)."""
    folder = Path(path)
    conf = conf if conf is not None else _read_config(folder)
    objective = conf.get("objective", "classify")
    if objective != "contrastive":
        raise UsageError(f"{folder} holds a --objective {objective} model ({conf.get('model')}): pipe eval measures "
                         "image-caption models (--objective contrastive)")
    spec = str(conf.get("model") or "")
    defaults = families.Options()
    width, resolution, max_text_len = (int(conf[k]) if isinstance(conf.get(k), int) else getattr(defaults, k)
                                       for k in SIZE_KEYS)
    built = families.Options(None, width, resolution, max_text_len, "contrastive", str(conf.get("loss") or "clip"))
    torch.manual_seed(0)
    model = families.build(spec, 0, built)
    state, source = _weights(folder, which)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:
        raise UsageError(f"{source} does not fit --model {spec} ({str(e).splitlines()[0]})") from None
    if missing:
        raise UsageError(f"{source} lacks {len(missing)} tensors of --model {spec} (e.g. {missing[0]}): written for "
                         "another model or size?")
    model.eval()
    model.loaded_from = source  # what pipe eval says it measured
    return model


def _weights(folder: Path, which: str) -> tuple[dict[str, torch.Tensor], str]:
    """The model's state dict from a run folder (``which`` first, then the other) or an export."""
    from train.components import checkpoint as ckpt

    if (folder / WEIGHTS).is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / WEIGHTS), device="cpu"), str(folder / WEIGHTS)
    order = [which, "last" if which == "best" else "best"]
    for name in order:
        for candidate in (folder / f"{name}.pt", folder / f"{name}.dcp"):
            if candidate.exists():
                return _checkpoint_model(candidate, ckpt), str(candidate)
    raise UsageError(f"{folder} has no {WEIGHTS}, best.pt, last.pt, best.dcp or last.dcp: is it a RUN_DIR of pipe train?")


def _checkpoint_model(path: Path, ckpt: Any) -> dict[str, torch.Tensor]:
    from train.components import weights

    # a DCP folder's shards put together without a process group, and without unpickling its metadata freely
    return weights.read_dcp_model(path) if ckpt.is_sharded(path) else dict(ckpt.load(path)["model"])
