"""The one gate every pickle pipe train reads goes through: nothing in a checkpoint or model file runs.

Whoever can write to a folder pipe reads (a run folder, a model folder, a shared disk) can leave a
pickle there, and a pickle is a program: unpickled by Python's own `pickle`, it calls whatever its
``GLOBAL``/``REDUCE`` opcodes name. So every file that may hold one is read here, and here only:

* torch files (last.pt, best.pt, a DCP folder's state.pt, --init-from's .pt/.pth/.bin, a Hugging
  Face folder's pytorch_model.bin): `torch_file`, ``torch.load(weights_only=True)``, torch's
  restricted unpickler (tensors, containers, numbers, strings); a file it refuses is `refusal`'s
  one line.
* a DCP checkpoint folder (--strategy fsdp): torch's reader unpickles ``.metadata`` with plain
  ``pickle.load`` and its planner loads the non-tensor items (the optimizer's param groups) with
  ``weights_only=False``. Here ``.metadata`` is read by `MetadataUnpickler`, which builds only the
  types a DCP checkpoint's metadata holds (read from torch/distributed/checkpoint/{metadata,
  filesystem}.py), every file it names must be a plain name inside the folder, and the non-tensor
  items go through ``weights_only=True`` (`dcp_load`). The metadata is read once per rank and that
  object is the one the load uses: the file is not read again between the check and the use.
* a checkpoint reached through a link (last.dcp, or a last.pt someone replaced by one) must stay in
  its run folder (`inside_run`).

Every refusal is a `Refused` (a `UsageError`: exit 2 before any rank starts, one line from a rank).
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch

from pipeline.core.errors import UsageError

ADVICE = ("it holds Python objects besides tensors and plain values, and pipe never runs code from a file; "
          "load it where you trust it and torch.save its state_dict alone")


class Refused(UsageError):
    """A file that would run code, or a link that leaves its folder: not read."""


# -- torch files ---------------------------------------------------------------------------------


def torch_file(path: Path | str | io.BytesIO, *, mmap: bool = False) -> Any:
    """``torch.load`` on the CPU with torch's restricted unpickler (no code runs). Its errors are
    the caller's to phrase (`refusal` says which kind a failure is); ``mmap`` leaves the tensors in
    the file until touched. torch's warnings about what it reads (a pickle protocol it did not
    write) are dropped: a refusal is one line, and a file it reads needs no remark."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def check_torch_file(path: Path, where: str) -> None:
    """Read ``path`` through `torch_file` and drop it: for a pickled file another library is about to
    load (a Hugging Face folder's pytorch_model.bin, before transformers), so that a refusal is this
    one line and the file's code never reaches a less careful reader. A zip's tensors are mapped,
    not read."""
    try:
        with open(path, "rb") as f:
            zipped = f.read(4) == b"PK\x03\x04"
        torch_file(path, mmap=zipped)
    except Exception as e:
        raise refusal(where, path, e) from None


def looks_like_torch_file(path: Path) -> bool:
    """torch.save writes a zip (PK..) or, in the legacy format, a pickle (protocol opcode 0x80);
    torch's restricted unpickler says "weights only load failed" for any other bytes too."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def is_refusal(e: BaseException) -> bool:
    """Whether ``e`` is the restricted unpickler refusing content (rather than a damaged file)."""
    return isinstance(e, Refused) or (isinstance(e, pickle.UnpicklingError) and "weights only" in str(e).lower())


def unpickler_reason(e: BaseException) -> str:
    """The line of torch's long weights_only message that says what was refused."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if "WeightsUnpickler error" in line:
            rest = line.split("WeightsUnpickler error:", 1)[1].strip()
            rest = rest or (lines[i + 1] if i + 1 < len(lines) else "unsupported content")
            return rest.split(". ")[0]  # drop torch's advice to allowlist globals: not for untrusted files
    return lines[0] if lines else type(e).__name__


def refusal(where: str, path: Path | str, e: BaseException, readable: str = "a readable torch file") -> UsageError:
    """One line for a torch file that did not load: refused (it would run code), or not ``readable``
    (damaged, cut, not a torch file at all). ``where`` prefixes it (``--init-from ``, or nothing)."""
    if isinstance(e, Refused):
        return e
    if is_refusal(e) and looks_like_torch_file(Path(path)):
        return Refused(f"{where}{path}: refused by weights_only=True ({unpickler_reason(e)}): {ADVICE}")
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return UsageError(f"{where}{path}: not {readable} ({type(e).__name__}: {first})")


# -- links ---------------------------------------------------------------------------------------


def inside(path: Path | str, root: Path | str) -> bool:
    """Whether ``path``, every link on its way followed, lies strictly inside ``root`` (followed too)."""
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    return real != top and real.is_relative_to(top)


def inside_run(path: Path) -> Path:
    """RUN_DIR/last.dcp (or last.pt, best.*) resolved, refused when a link takes it out of RUN_DIR: a
    checkpoint is read from the run folder it is in, never from wherever a planted link points."""
    path = Path(path)
    if not inside(path, path.parent):
        raise Refused(f"{path} is a link to {os.path.realpath(path)}, outside its run folder "
                      f"{os.path.realpath(path.parent)}: refused (a checkpoint is read only from its own run folder)")
    return Path(os.path.realpath(path))


# -- DCP checkpoints -------------------------------------------------------------------------------

METADATA = ".metadata"
_DCP = "torch.distributed.checkpoint.metadata"
ALLOWED = {
    (_DCP, "Metadata"), (_DCP, "TensorStorageMetadata"), (_DCP, "BytesStorageMetadata"),
    (_DCP, "ChunkStorageMetadata"), (_DCP, "TensorProperties"), (_DCP, "MetadataIndex"), (_DCP, "StorageMeta"),
    (_DCP, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # looks a torch.layout up by name (torch pickles layouts so)
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}
"""What a DCP checkpoint's .metadata holds (torch 2.13-2.14): its dataclasses, torch.Size, dtypes
(``torch.float32``: looked up by name, see `MetadataUnpickler.find_class`), layouts by name, the
checkpoint id (a path) and ordered dicts. Nothing here runs code when built."""


class MetadataUnpickler(pickle.Unpickler):
    """A pickle reader that builds only the `ALLOWED` types (and torch dtypes): any other global,
    and persistent ids, are refused before anything is called."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a type a DCP checkpoint holds")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not part of a DCP checkpoint's metadata")


def dcp_metadata(folder: Path) -> Any:
    """A DCP checkpoint folder's metadata, read by `MetadataUnpickler` and checked: what it maps
    (a dict of names to tensor or bytes entries) and where (plain file names inside ``folder``,
    non-negative offsets). A `Refused` otherwise."""
    from torch.distributed.checkpoint.metadata import Metadata

    folder = Path(folder)
    path = folder / METADATA
    if not inside(path, folder):
        raise Refused(f"{path} is a link out of its checkpoint folder: refused")
    try:
        with open(path, "rb") as f:
            metadata = MetadataUnpickler(f).load()
    except FileNotFoundError:
        raise UsageError(f"{folder} is not a complete checkpoint (no {METADATA} in it)") from None
    except pickle.UnpicklingError as e:
        raise Refused(f"{path}: refused ({str(e).strip() or 'not a pickle'}): it names code to run, not a DCP "
                      f"checkpoint's metadata; pipe never runs code from a checkpoint") from None
    except Exception as e:  # a damaged pickle: EOFError, a bad opcode, a type built with wrong arguments
        raise UsageError(f"{path} is not a readable DCP checkpoint's metadata ({type(e).__name__}: "
                         f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})") from None
    if not isinstance(metadata, Metadata):
        raise Refused(f"{path} holds a {type(metadata).__name__}, not a DCP checkpoint's metadata: refused")
    problem = _metadata_problem(metadata, folder)
    if problem:
        raise Refused(f"{path}: {problem}: refused")
    return metadata


def _metadata_problem(metadata: Any, folder: Path) -> str | None:
    """What is wrong with an unpickled Metadata (built from allowed types, but in any arrangement)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex, TensorStorageMetadata

    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict) or not all(
            isinstance(k, str) and isinstance(v, (TensorStorageMetadata, BytesStorageMetadata)) for k, v in entries.items()):
        return "its state_dict_metadata is not a map of names to tensor and bytes entries"
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        return "its storage_data is not a map"
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            return "its storage_data maps something other than items to file spans"
        name = info.relative_path
        if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
            return f"item {index.fqn!r} names the file {name!r}, not a file in the checkpoint folder"
        if not inside(folder / name, folder):
            return f"item {index.fqn!r} is in {name}, a link out of the checkpoint folder"
        if not (type(info.offset) is int and type(info.length) is int and info.offset >= 0 and info.length >= 0):
            return f"item {index.fqn!r} has the span {info.offset!r}+{info.length!r}"
        if info.transform_descriptors:  # compression and the like: not what pipe writes, and more code to trust
            return f"item {index.fqn!r} needs the stream transforms {list(info.transform_descriptors)!r}"
    return None


def dcp_check_items(folder: Path, metadata: Any) -> None:
    """Read every non-tensor item of the checkpoint (the optimizer's settings: a few small pickles)
    through the restricted unpickler now, so that a planted one is refused where the checkpoint is
    first looked at (before any rank starts), not in the middle of every rank's load. Tensor items
    torch reads with weights_only=True itself; the load reads both through the gate again."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    for index, info in metadata.storage_data.items():
        if not isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        try:
            with open(Path(folder) / info.relative_path, "rb") as f:
                f.seek(info.offset)
                data = f.read(info.length)
        except OSError as e:
            raise UsageError(f"{folder}: item {index.fqn!r} cannot be read ({e.strerror or e})") from None
        _bytes_item(index.fqn, io.BytesIO(data))


def _bytes_item(fqn: str, value: io.BytesIO) -> Any:
    """One non-tensor DCP item, through the restricted unpickler."""
    try:
        return torch_file(value)
    except Exception as e:
        if is_refusal(e):
            raise Refused(f"DCP item {fqn!r}: refused by weights_only=True ({unpickler_reason(e)}): {ADVICE}") from None
        raise UsageError(f"DCP item {fqn!r} is not readable ({type(e).__name__}: "
                         f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})") from None


def dcp_load(state_dict: dict, folder: Path) -> None:
    """``torch.distributed.checkpoint.load`` of ``folder`` into ``state_dict`` (every rank calls it),
    through `dcp_metadata` and `_Planner`; a refusal on any rank is that `Refused` on every rank."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader = _reader(folder, dcp_metadata(folder))
    try:
        dcp.load(state_dict, storage_reader=reader, planner=_planner())
    except CheckpointException as e:  # the failures of every rank, each (exception, traceback)
        for failure in e.failures.values():
            exc = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(exc, UsageError):
                raise type(exc)(str(exc)) from None
            if is_refusal(exc):  # torch's reader loads the tensor items with weights_only=True itself
                raise Refused(f"{folder}: a tensor item refused by weights_only=True ({unpickler_reason(exc)}): "
                              f"{ADVICE}") from None
        raise


def _reader(folder: Path, metadata: Any):
    """torch's FileSystemReader of ``folder``, answering with the metadata already read and checked."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("rank") is not None:  # a per-rank metadata file: pipe writes the global one only
                raise Refused(f"{folder}: no global {METADATA}")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return Reader(str(folder))


def _planner():
    """torch's DefaultLoadPlanner, reading non-tensor items with weights_only=True (its own uses
    weights_only=False: a planted item would run)."""
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            obj = _bytes_item(fqn, value)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj

    return Planner()
