"""The model's weights as pipe wrote them, read back whole, in one process, safely.

`pipe export`, `--init-from` and `pipe eval` read the same three things, so they read them here:

* a ``last.pt`` / ``best.pt`` (`train.components.checkpoint.load`: ``weights_only``, the format marker);
* a ``last.dcp`` / ``best.dcp`` folder (--strategy fsdp): every rank's shards of the *model* gathered
  into full tensors, without a process group (`read_dcp_model`). The optimizer's state is not read;
* the run folder's checkpoint of a kind (`run_checkpoint`: ``best`` or ``last``, ``.pt`` or ``.dcp``).

Nothing here unpickles an arbitrary object. A DCP folder's ``.metadata`` is a pickle (torch writes it
with `pickle.dump`, and its reader loads it with `pickle.load`): it is read by `DCPMetadata`, an
unpickler that builds only the types a checkpoint's metadata holds (DCP's own dataclasses, torch's
sizes and dtypes, a path) and refuses any other global in one line. The tensors themselves are read by
DCP's ``torch.load(weights_only=True)``, and only tensors are asked for: DCP's "bytes" items, which its
planner would unpickle without ``weights_only``, are never requested.
"""

from __future__ import annotations

import os
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.core.errors import UsageError
from train.components import checkpoint as ckpt

DCP_METADATA = ".metadata"
MODEL_KEY = "model"  # the top-level entry of the state a sharded checkpoint saves (`checkpoint.save_sharded`)


# -- the metadata of a DCP folder, without pickle's arbitrary globals ---------------------------

_DCP = "torch.distributed.checkpoint"
ALLOWED_GLOBALS = {
    (f"{_DCP}.metadata", name) for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {
    (f"{_DCP}.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch._utils", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}
"""What DCP's metadata pickles (torch 2.x's filesystem writer, see ``torch/distributed/checkpoint/
metadata.py``): dataclasses and enums rebuilt field by field, nothing that runs code. dtypes
(``torch.float32`` ...) are allowed by `_is_dtype`."""


class DCPMetadata(pickle.Unpickler):
    """Unpickles a DCP ``.metadata`` file, building only `ALLOWED_GLOBALS` and torch dtypes."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS or _is_dtype(module, name):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a type a checkpoint's metadata holds")


def _is_dtype(module: str, name: str) -> bool:
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


def read_dcp_metadata(folder: Path) -> Any:
    """A DCP folder's `Metadata`, read by `DCPMetadata`; a one-line refusal when it holds anything else."""
    path = Path(folder) / DCP_METADATA
    try:
        with open(path, "rb") as f:
            metadata = DCPMetadata(f).load()
    except FileNotFoundError:
        raise UsageError(f"{folder}: no {DCP_METADATA} in it (not a checkpoint folder of --strategy fsdp)") from None
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as e:
        raise UsageError(f"{path} refused: {e}; a checkpoint's metadata holds nothing else") from None
    if type(metadata).__name__ != "Metadata" or not isinstance(getattr(metadata, "state_dict_metadata", None), dict):
        raise UsageError(f"{path} is not a checkpoint's metadata")
    return metadata


def _safe_reader(folder: Path) -> Any:
    """DCP's file-system reader with `read_metadata` through `DCPMetadata`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = read_dcp_metadata(Path(self.path))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(folder))


def is_dcp_folder(path: Path) -> bool:
    """Whether ``path`` is a DCP checkpoint folder (a last.dcp / best.dcp, or the step folder it points to)."""
    return Path(path).is_dir() and (Path(path) / DCP_METADATA).is_file()


def read_dcp_model(folder: Path) -> dict[str, torch.Tensor]:
    """The full model state dict of a --strategy fsdp checkpoint folder (every rank's shards put
    together, on the CPU, in one process). Refused unless its ``COMPLETE`` marker is there."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    real = Path(os.path.realpath(folder))
    if not (real / ckpt.DCP_COMPLETE).exists():
        raise UsageError(f"{folder} is not a complete checkpoint (no {ckpt.DCP_COMPLETE} marker in {real})")
    metadata = read_dcp_metadata(real)
    paths = metadata.planner_data or {}
    wanted: dict[str, torch.Tensor] = {}
    names: dict[str, str] = {}
    for fqn, meta in metadata.state_dict_metadata.items():
        path = paths.get(fqn)
        if not isinstance(meta, TensorStorageMetadata) or not path or path[0] != MODEL_KEY or len(path) != 2:
            continue  # the optimizer's state, and bytes items (never unpickled)
        wanted[fqn] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        names[fqn] = str(path[1])
    if not wanted:
        raise UsageError(f"{folder}: no model tensors in it (is it a checkpoint of pipe train --strategy fsdp?)")
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized, assuming ... a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        try:
            dcp.load(wanted, storage_reader=_safe_reader(real), planner=DefaultLoadPlanner(flatten_state_dict=False))
        except UsageError:
            raise
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UsageError(f"{folder}: its tensors cannot be read ({type(e).__name__}: {first})") from None
    return {names[fqn]: t for fqn, t in wanted.items()}


# -- a run folder's checkpoints -----------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a run: where it is, its plain values (config, epoch, step; no tensors)."""

    path: Path
    plain: dict

    @property
    def sharded(self) -> bool:
        return ckpt.is_sharded(self.path)

    def model_state(self) -> dict[str, torch.Tensor]:
        """Its model's full state dict (bare names: no DDP or FSDP prefix)."""
        if self.sharded:
            return read_dcp_model(self.path)
        return dict(ckpt.load(self.path)["model"])

    def describe(self) -> str:
        """``last.pt (epoch 2, step 40)``: the epoch (from 1) of its last step."""
        epoch = int(self.plain.get("epoch") or 0) + (1 if self.plain.get("step_in_epoch") else 0)
        return f"{self.path.name} (epoch {epoch}, step {self.plain.get('step')})"


WHICH = ("best", "last")


def run_checkpoint(run_dir: Path, which: str = "best") -> tuple[Checkpoint, str | None]:
    """RUN_DIR's ``which`` checkpoint (best or last; ``.pt``, or ``.dcp`` under --strategy fsdp: of
    two, the later step), and a note when it had to be the other one (a run without a val split has
    no best). A link out of RUN_DIR is refused: a checkpoint is the run's own."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such folder (RUN_DIR written by pipe train)")
    for kind in (which, *(k for k in WHICH if k != which)):
        found = [_checkpoint(run_dir, run_dir / name) for name in (f"{kind}.pt", f"{kind}.dcp")
                 if (run_dir / name).exists()]
        if found:
            chosen = max(found, key=lambda c: int(c.plain.get("step") or 0))
            note = None if kind == which else (f"RUN_DIR has no {which} checkpoint (best needs a val split); "
                                               f"{kind} it is")
            return chosen, note
    raise UsageError(f"{run_dir} has no checkpoint (best.pt, last.pt, best.dcp or last.dcp): is it a RUN_DIR of "
                     "pipe train that ran a step?")


def _checkpoint(run_dir: Path, path: Path) -> Checkpoint:
    real, inside = Path(os.path.realpath(path)), Path(os.path.realpath(run_dir))
    if inside not in real.parents:
        raise UsageError(f"{path} points out of {run_dir} (to {real}): refused, a run's checkpoint is in its own folder")
    plain = ckpt.load(path, mmap=True) if not ckpt.is_sharded(path) else ckpt.load(path)
    return Checkpoint(path, {k: v for k, v in plain.items() if k not in ("model", "optimizer")})
