"""`pipe export RUN_DIR -o DIR`: a run's model as a folder its library loads, pipe not needed.

1. The checkpoint (`train.components.weights.run_checkpoint`): ``--which best`` (the best
   validation; a run without val has only ``last``, which is taken with a note) or ``last``, a
   ``.pt`` or, under --strategy fsdp, a DCP folder gathered into one full state dict.
2. ``--wise ALPHA`` (WiSE-FT): ``(1 - ALPHA) x start + ALPHA x fine-tuned`` for every floating-point
   tensor (1: the fine-tuned model, 0: where it started), the start rebuilt from the run's record
   (`train.components.start`); integer buffers are the fine-tuned model's.
3. The model's family writes it (`train.models.families.Family.export`): a Hugging Face folder for
   ``hf:`` models (`train.models.hf_export`), ``model.safetensors`` + ``config.json`` for the others
   (`train.models.exported`).

The folder is written under a temporary name beside DIR and renamed into place once complete, so
DIR is either absent, the previous export, or the whole new one. It carries pipe's marker
(``.pipe/state.json``, tool ``pipe export``): ``--overwrite`` replaces only a folder pipe export wrote.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline import __version__
from pipeline.core.errors import UsageError
from pipeline.core.files import STATE_DIR, atomic_write_text, occupied, read_marker
from train.components import start, weights
from train.models import families
from train.models.exported import Job

TOOL = "pipe export"


@dataclass
class Exported:
    """What `run` wrote, for the lines printed."""

    folder: Path
    files: list[str]
    checkpoint: str
    note: str | None
    wise: float | None
    start: str | None
    fresh: int = 0


def interpolate(begin: dict[str, torch.Tensor], end: dict[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    """WiSE-FT: ``(1 - alpha) x begin + alpha x end`` per floating-point tensor, in float32 and cast
    back; other tensors (integer buffers, counters) are ``end``'s. Both must name the same tensors."""
    if set(begin) != set(end):
        odd = sorted(set(begin) ^ set(end))
        raise UsageError(f"the starting and the fine-tuned weights name different tensors (e.g. {odd[0]}): --wise "
                         "interpolates one model with itself")
    out = {}
    for name, b in end.items():
        a = begin[name]
        if a.shape != b.shape:
            raise UsageError(f"--wise: {name} is {list(a.shape)} at the start and {list(b.shape)} fine-tuned")
        if b.is_floating_point():
            mixed = (1.0 - alpha) * a.to(torch.float32) + alpha * b.to(torch.float32)
            out[name] = mixed.to(b.dtype)
        else:
            out[name] = b
    return out


def _index(settings: dict, classes: list[str]) -> dict:
    """The run's index.json when it is still where the run read it (a factory may take it), else
    the classes alone (all the built-in, torchvision, timm and hf builders read)."""
    from pipeline.formats import index as shard_index

    try:
        return dict(shard_index.load(settings["shard_dir"]))
    except Exception:  # moved, on storage not reachable now, or never there: the classes suffice
        return {"classes": classes}


def _classes(run_dir: Path, settings: dict) -> list[str]:
    """The dataset's class names: the start record's, else the run's index.json's."""
    try:
        return list(start.read(run_dir).get("classes") or [])
    except UsageError:
        index = _index(settings, [])
        if "shards" not in index:
            raise UsageError(f"{run_dir}: its class names are neither in {start.START} nor in the index of "
                             f"{settings.get('shard_dir')} (moved?)") from None
        return list(index.get("classes") or [])


def run(run_dir: Path, output: Path, which: str = "best", wise: float | None = None,
        overwrite: bool = False) -> Exported:
    """Export RUN_DIR's model into ``output`` (see the module docstring)."""
    run_dir, output = Path(run_dir), Path(output)
    _refuse_target(output, run_dir, overwrite)
    checkpoint, note = weights.run_checkpoint(run_dir, which)
    settings = dict(checkpoint.plain.get("config") or {})
    spec = str(settings.get("model") or "")
    if not spec:
        raise UsageError(f"{checkpoint.path}: its config names no --model")
    s = families.resolve(spec)
    if s.family.export is None:
        raise UsageError(f"pipe export cannot write --model {spec} models ({s.family.name})")
    state = checkpoint.model_state()
    classes = _classes(run_dir, settings)
    index = _index(settings, classes)
    provenance: dict = {"exported_from": {"run": str(run_dir.resolve()), "checkpoint": checkpoint.path.name,
                                          "epoch": checkpoint.plain.get("epoch"), "step": checkpoint.plain.get("step")},
                        "wise": None}
    origin, fresh = None, 0
    if wise is not None:
        record = start.read(run_dir)
        began = start.rebuild(record, index).state_dict()
        state = interpolate(began, state, wise)
        origin, fresh = str(record.get("from")), len(record.get("fresh") or [])
        provenance["wise"] = {"alpha": wise, "start": origin, "start_sha256": record.get("weights_sha256")}
    job = Job(spec, s.arg, state, settings, classes, index, provenance)
    files = _write(output, run_dir, which, wise, lambda folder: families.call(s.family.export, s.arg, job, folder))
    return Exported(output, files, checkpoint.describe(), note, wise, origin, fresh)


def _refuse_target(output: Path, run_dir: Path, overwrite: bool) -> None:
    """Before any weights are read: DIR is new, empty, or (with --overwrite) an earlier export."""
    if output.exists() and not output.is_dir():
        raise UsageError(f"-o {output} exists and is not a folder")
    inside = run_dir.resolve()
    if output.resolve() == inside or inside in output.resolve().parents:
        raise UsageError(f"-o {output} is inside RUN_DIR {run_dir}; write the export elsewhere")
    if not occupied(output):
        return
    marker = read_marker(output)
    if marker is None or marker.get("tool") != TOOL:
        raise UsageError(f"{output} is not empty and was not written by {TOOL}; choose an empty folder "
                         f"(--overwrite replaces only a folder {TOOL} wrote)")
    if not overwrite:
        raise UsageError(f"{output} already holds an export; pass --overwrite to replace it, or choose another folder")


def _write(output: Path, run_dir: Path, which: str, wise: float | None, fill) -> list[str]:
    """``fill(folder)`` into a temporary folder beside ``output``, then renamed into place (an
    earlier export moved aside first and removed after)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        files = list(fill(tmp))
        marker = {"schema_version": 1, "tool": TOOL, "version": __version__, "input": str(run_dir.resolve()),
                  "settings": {"which": which, "wise": wise}}
        atomic_write_text(tmp / STATE_DIR / "state.json", json.dumps(marker, indent=2, sort_keys=True) + "\n")
        old = output.with_name(f".{output.name}.{os.getpid()}.old")
        if output.exists():
            os.replace(output, old)
        os.replace(tmp, output)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return files
