"""Where a run's weights started, recorded so they can be built again (`pipe export --wise`).

WiSE-FT (Wortsman et al. 2022) interpolates the weights a fine-tuning started from and the ones it
ended with. A run starts from one of three places, all of which the run's settings name: the
weights ``--init-from`` loaded, the ``hf:`` folder the model was built from, or a random
initialisation drawn from ``--seed`` (and any tensor the pretrained weights lacked, such as a head
re-initialised for this dataset's classes, is drawn from the seed too). So the run records *where*
(``RUN_DIR/start.json``: the model, its sizes, the seed, the init file) rather than a copy of the
weights (one more model-sized file per run), plus a digest of the weights as they were: rebuilt at
export time they must have that digest, or the export stops with a line saying what changed (the
init file or the hf folder was modified, or another torch draws other random numbers).

Written by rank 0 of a fresh run (never on a resume, which does not start anywhere new), before
any step and before the model is sharded or cast.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import UsageError
from pipeline.core.files import atomic_write_text

START = "start.json"
FORMAT = "pipe-run-start/1"
BUILD_KEYS = ("model", "width", "resolution", "max_text_len", "objective", "loss")
"""The run settings the model is built from (`train.models.builtin.build_model`'s arguments); a
setting an older config lacks is left at its default."""


def digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor of ``state`` in name order: name, dtype, shape and bytes."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def record(run_dir: Path, settings: dict, model: nn.Module, classes: list[str], fresh: list[str] | None) -> dict:
    """Write RUN_DIR/start.json for ``model`` as built and loaded at the start of the run.
    ``settings``: the run's (`TrainConfig.as_dict`); ``fresh``: the tensors that did not come from
    the pretrained weights (None: no pretrained weights, all of them came from the seed)."""
    init_from = settings.get("init_from")
    doc = {
        "format": FORMAT,
        **{k: settings[k] for k in BUILD_KEYS if k in settings},
        "seed": settings.get("seed", 0),
        "init_from": str(init_from) if init_from else None,
        "from": _origin(str(settings.get("model", "")), init_from),
        "classes": list(classes),
        "fresh": sorted(fresh) if fresh is not None else None,
        "weights_sha256": digest(model.state_dict()),
    }
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(run_dir) / START, json.dumps(doc, indent=2) + "\n")
    return doc


def fresh(model: nn.Module, reports: list[Any]) -> list[str] | None:
    """The tensors of ``model`` that none of ``reports`` (`train.models.finetune.InitReport`: the hf:
    folder's, --init-from's) loaded: drawn from the seed. None without any report (all of them were)."""
    from train.models.finetune import strip_prefix

    if not reports:
        return None
    loaded = {strip_prefix(name) for report in reports for name in report.loaded}
    return [name for name in model.state_dict() if strip_prefix(name) not in loaded]


def _origin(model: str, init_from: Any) -> str:
    """In words, for messages: where the weights came from."""
    if init_from:
        return f"--init-from {init_from}"
    if model.startswith("hf:"):
        return f"the Hugging Face folder {model[3:]}"
    return "a random initialisation (--seed)"


def read(run_dir: Path) -> dict:
    """RUN_DIR/start.json, or a UsageError saying the run did not record its start."""
    path = Path(run_dir) / START
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{run_dir} did not record where its weights started ({START}; runs of pipe before "
                         "--wise existed did not): its starting weights cannot be rebuilt") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"{path} is not readable JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UsageError(f"{path} is not a start record of pipe train ({FORMAT})")
    return doc


def rebuild(doc: dict, index: dict | None = None) -> nn.Module:
    """The model as the run started: built from the seed as the run built it, the init file loaded
    as it was; a UsageError when its digest is not the recorded one. ``index``: the run's index.json
    when it can be read (a ``package.module:factory`` may take it), else its classes alone."""
    from train.models.builtin import build_model
    from train.models.finetune import load_init

    classes = list(doc.get("classes") or [])
    sizes = {k: doc[k] for k in BUILD_KEYS[1:] if k in doc}
    torch.manual_seed(int(doc.get("seed", 0)))
    model = build_model(str(doc["model"]), len(classes), index=index or {"classes": classes}, **sizes)
    if doc.get("init_from"):
        load_init(model, Path(doc["init_from"]))
    if digest(model.state_dict()) != doc.get("weights_sha256"):
        raise UsageError(f"the starting weights ({doc.get('from')}) cannot be rebuilt as the run had them: their digest "
                         "differs from the one recorded in start.json (the file or folder changed since, or this "
                         "torch draws other random numbers); --wise needs those very weights")
    return model
