"""Fine-tuning: start from other weights (--init-from) and freeze/unfreeze blocks on a schedule.

Loading is safe and honest: the file is read on the CPU with ``weights_only=True`` (no pickled
code runs), each tensor is kept only where both its name and its shape match the model, and a
report lists what was loaded, skipped for shape and missing. A classification head trained for
another number of classes is re-initialised rather than half-loaded.

Freezing works on *blocks* (see `train.models.builtin`): ``--freeze 0.7`` sets requires_grad=False on the
first 70% of each block group, counted from the input; the head is never frozen. DDP registers only
the parameters that require grad when it is built, so a change here means rebuilding the DDP
wrapper (`train.distributed.group.rewrap`), which the loop does.
"""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from pipeline.core.errors import UsageError
from train.components.checkpoint import CHECKPOINT_FORMAT

# Prefixes that wrappers add to parameter names: DDP/DataParallel, torch.compile.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


@dataclass
class InitReport:
    """What --init-from did, tensor by tensor."""

    source: str
    kind: str
    loaded: list[str] = field(default_factory=list)
    skipped_shape: list[tuple[str, tuple, tuple]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    head_reinitialised: str | None = None

    def rows(self) -> list[tuple[str, str]]:
        """(status, detail) lines for the table printed at start."""
        out = [("loaded", f"{len(self.loaded)} tensors")]
        for name, theirs, ours in self.skipped_shape:
            out.append(("skipped (shape)", f"{name}: file {list(theirs)} vs model {list(ours)}"))
        if self.missing:
            out.append(("missing (kept fresh)", _names(self.missing)))
        if self.unexpected:
            out.append(("not in model (ignored)", _names(self.unexpected)))
        if self.head_reinitialised:
            out.append(("head re-initialised", self.head_reinitialised))
        return out


def _names(names: list[str], limit: int = 6) -> str:
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _strip_prefixes(state: dict) -> dict:
    out = {}
    for k, v in state.items():
        for p in WRAPPER_PREFIXES:
            while k.startswith(p):
                k = k[len(p):]
        out[k] = v
    return out


def _is_state_dict(obj) -> bool:
    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def _looks_like_torch_file(path: Path) -> bool:
    """torch.save writes a zip (PK..) or, in the legacy format, a pickle (protocol opcode 0x80)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def _unpickler_reason(e: Exception) -> str:
    """The line of torch's long weights_only message that says what was refused."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if "WeightsUnpickler error" in line:
            rest = line.split("WeightsUnpickler error:", 1)[1].strip()
            rest = rest or (lines[i + 1] if i + 1 < len(lines) else "unsupported content")
            return rest.split(". ")[0]  # drop torch's advice to allowlist globals: not for untrusted files
    return lines[0] if lines else type(e).__name__


def read_state_dict(path: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors in ``path`` and what kind of file it was; refuses files that hold code."""
    try:
        # CPU first: a checkpoint saved on cuda:3 must load on a machine without that GPU, and
        # weights_only refuses pickles that would run arbitrary code on load.
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError(f"--init-from {path}: no such file") from None
    except pickle.UnpicklingError as e:
        if not _looks_like_torch_file(path):
            raise UsageError(f"--init-from {path}: not a readable torch file (neither a torch.save zip nor a pickle"
                             f"{'; safetensors files are not read yet' if path.suffix == '.safetensors' else ''})") from None
        raise UsageError(f"--init-from {path}: refused by weights_only=True ({_unpickler_reason(e)}): it holds Python "
                         "objects besides tensors; load it where you trust it and torch.save(model.state_dict())") from None
    except Exception as e:  # not a torch file at all: zip errors, truncation
        first = str(e).splitlines()[0] if str(e) else ""
        raise UsageError(f"--init-from {path}: not a readable torch file ({type(e).__name__}: {first})") from None
    if isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT:
        kind = f"pipe train checkpoint (epoch {obj.get('epoch')}, step {obj.get('step')})"
        return _strip_prefixes(obj["model"]), kind
    for key in ("model", "state_dict", "model_state_dict"):  # common wrappers (Lightning, timm, ...)
        if isinstance(obj, dict) and _is_state_dict(obj.get(key)):
            return _strip_prefixes(obj[key]), f"state dict (under {key!r})"
    if _is_state_dict(obj):
        return _strip_prefixes(obj), "state dict"
    raise UsageError(f"--init-from {path}: no state dict in it (expected a dict of tensors, or one under "
                     "'model' / 'state_dict')")


def load_init(model: nn.Module, path: Path) -> InitReport:
    """Copy every tensor of ``path`` whose name and shape match into ``model``; report the rest."""
    theirs, kind = read_state_dict(Path(path))
    ours = model.state_dict()
    report = InitReport(source=str(path), kind=kind)
    keep = {}
    for name, tensor in ours.items():
        if name not in theirs:
            report.missing.append(name)
        elif tuple(theirs[name].shape) != tuple(tensor.shape):
            report.skipped_shape.append((name, tuple(theirs[name].shape), tuple(tensor.shape)))
        else:
            keep[name] = theirs[name]
            report.loaded.append(name)
    report.unexpected = [k for k in theirs if k not in ours]
    if not keep:
        raise UsageError(f"--init-from {path}: none of its {len(theirs)} tensors matches the model's names and "
                         "shapes (was it written for another --model or --width?)")
    model.load_state_dict(keep, strict=False)  # copies (and casts) into the existing parameters
    head = getattr(model, "head", None)
    if isinstance(head, nn.Linear):
        skipped = {name for name, _, _ in report.skipped_shape}
        if "head.weight" in skipped or "head.bias" in skipped:
            old = theirs["head.weight"] if "head.weight" in theirs else theirs["head.bias"]  # one was skipped, so is there
            head.reset_parameters()  # a half-loaded head is worse than a fresh one
            report.head_reinitialised = f"file has {old.shape[0]} classes, this dataset {head.out_features}"
    return report


# -- freezing ---------------------------------------------------------------------------------


def block_groups(model: nn.Module) -> list[list[nn.Module]]:
    """The model's blocks from input to output, in groups (one per encoder); the head excluded."""
    groups = getattr(model, "block_groups", None)  # a method of our multi-encoder models, not a submodule
    if groups is not None:
        return [list(g) for g in groups()]
    head = getattr(model, "head", None)
    return [[m for m in model.children() if m is not head]]


@dataclass(frozen=True)
class FreezeState:
    fraction: float
    frozen_blocks: int
    total_blocks: int
    trainable_params: int
    total_params: int

    def describe(self) -> str:
        return (f"frozen {self.frozen_blocks} of {self.total_blocks} blocks ({self.fraction:.0%} asked); "
                f"{self.trainable_params:,} of {self.total_params:,} parameters train")


class Freezer:
    """Sets requires_grad per block for a frozen fraction; parameters that the model itself
    froze (requires_grad False when the Freezer was made) stay frozen whatever the fraction."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.groups = block_groups(model)
        self.trainable = {id(p) for p in model.parameters() if p.requires_grad}

    def apply(self, fraction: float) -> FreezeState:
        frozen_blocks = 0
        for group in self.groups:
            n_frozen = math.floor(fraction * len(group) + 1e-9)  # at most the fraction asked
            frozen_blocks += n_frozen
            for i, block in enumerate(group):
                for p in block.parameters():
                    p.requires_grad_(i >= n_frozen and id(p) in self.trainable)
        params = list(self.model.parameters())
        return FreezeState(fraction, frozen_blocks, sum(len(g) for g in self.groups),
                           sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params))


@dataclass(frozen=True)
class FreezeSchedule:
    """--freeze F and --unfreeze-at E[:G]: fraction F frozen before epoch E (counted from 1), G from then on."""

    initial: float = 0.0
    unfreeze_epoch: int | None = None
    unfreeze_to: float = 0.0

    def fraction_at(self, epoch_index: int) -> float:
        """``epoch_index`` counts from 0, as the loop does; epoch_index + 1 is what users see."""
        if self.unfreeze_epoch is not None and epoch_index + 1 >= self.unfreeze_epoch:
            return self.unfreeze_to
        return self.initial
