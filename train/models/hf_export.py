"""`pipe export` of an ``hf:`` model: a folder transformers loads alone.

The model is built as the run built it (from the run's ``hf:`` folder, which must still be there:
its config and architecture are the export's), the checkpoint's weights are loaded into it, every
one of them (a missing or misshapen tensor stops the export), and transformers' own
``save_pretrained`` writes it: ``config.json`` (with the dataset's class names as ``id2label`` for a
classifier) and ``model.safetensors``. The folder's preprocessing is saved beside it by
transformers too (``AutoProcessor`` where the folder has a tokenizer and an image processor, as a
CLIP does, else the one it has), so ``AutoModel.from_pretrained(DIR)`` and
``AutoProcessor.from_pretrained(DIR)`` need nothing else, and pipe is not needed to use it.

``pipe_export.json`` records where the weights came from (the run, its checkpoint, ``--wise``).
Every load passes ``local_files_only=True`` and ``trust_remote_code=False``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from pipeline.core.errors import UsageError
from pipeline.core.files import atomic_write_text
from train.models.exported import Job
from train.models.hf_files import PREPROCESSOR, SAFE_LOAD, has_tokenizer

RECORD = "pipe_export.json"


def rebuilt(job: Job) -> Any:
    """The run's model (pipe's wrapper) with the checkpoint's weights, every tensor of them."""
    from train.models.builtin import build_model
    from train.models.exported import SIZE_KEYS

    extra = {k: job.settings[k] for k in ("objective", "loss") if k in job.settings}
    sizes = {k: job.settings[k] for k in SIZE_KEYS if k in job.settings}
    torch.manual_seed(int(job.settings.get("seed", 0)))
    model = build_model(job.spec, len(job.classes), index=job.index, **sizes, **extra)
    try:
        model.load_state_dict(job.state)
    except RuntimeError as e:
        raise UsageError(f"the checkpoint does not fit {job.spec} as it is now ({str(e).splitlines()[0]}): was the "
                         "folder changed since the run?") from None
    return model


def save_preprocessing(source: Path, folder: Path) -> list[str]:
    """The source folder's tokenizer and image processor, saved into ``folder`` by transformers."""
    from train.models.hf import _offline

    transformers = _offline()
    text, image = has_tokenizer(source), (source / PREPROCESSOR).is_file()
    before = set(p.name for p in folder.iterdir())
    if text and image:  # transformers 5 writes the two as processor_config.json ...
        transformers.AutoProcessor.from_pretrained(source, **SAFE_LOAD).save_pretrained(folder)
    elif text:
        transformers.AutoTokenizer.from_pretrained(source, **SAFE_LOAD).save_pretrained(folder)
    if image:  # ... and the image processor alone as preprocessor_config.json, which older ones and hf: read
        transformers.AutoImageProcessor.from_pretrained(source, **SAFE_LOAD).save_pretrained(folder)
    return sorted(set(p.name for p in folder.iterdir()) - before)


def export_hf(arg: str, job: Job, folder: Path) -> list[str]:
    """The hf family's ``export`` hook (see the module docstring)."""
    model = rebuilt(job)
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "save_pretrained"):
        raise UsageError(f"{job.spec}: the model holds no transformers model to save")
    inner.save_pretrained(folder, safe_serialization=True)
    written = sorted(p.name for p in folder.iterdir())
    written += save_preprocessing(Path(arg), folder)
    atomic_write_text(folder / RECORD, json.dumps({"model": job.spec, **job.provenance}, indent=2) + "\n")
    return [*written, RECORD]
