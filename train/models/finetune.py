"""Fine-tuning: start from other weights (--init-from) and freeze/unfreeze blocks on a schedule.

Loading is safe and honest: the file is read on the CPU (``.pt``/``.pth`` with ``weights_only=True``,
so no pickled code runs; ``.safetensors`` holds nothing but tensors; a Hugging Face folder's
weights, or a folder `pipe export` wrote, are either; a --strategy fsdp checkpoint folder is put
together by `train.components.weights.read_dcp_model`, which unpickles nothing but its metadata's
types), names are compared without the prefixes wrappers add (`WRAPPER_PREFIXES`),
each tensor is kept only where both its name and its shape match the model, and a
report lists what was loaded, skipped for shape and missing. A classification head trained for
another number of classes is re-initialised rather than half-loaded.

Freezing works on *blocks* (see `train.models.builtin`): ``--freeze 0.7`` sets requires_grad=False on the
first 70% of each block group, counted from the input; the head is never frozen. DDP registers only
the parameters that require grad when it is built, so a change here means rebuilding the DDP
wrapper (`train.distributed.group.rewrap`), which the loop does.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from pipeline.core.errors import UsageError
from train.components.checkpoint import CHECKPOINT_FORMAT
from train.components.safe_load import check_torch_file, refusal, torch_file

# Prefixes that wrappers add to parameter names: DDP/DataParallel, a Lightning module or our
# Hugging Face wrapper (``model.``), a detection/timm-style feature extractor, torch.compile.
WRAPPER_PREFIXES = ("module.", "model.", "backbone.", "_orig_mod.")



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


def strip_prefix(name: str) -> str:
    """``name`` without any leading wrapper prefixes (``module.model.bert.x`` -> ``bert.x``)."""
    while True:
        for p in WRAPPER_PREFIXES:
            if name.startswith(p):
                name = name[len(p):]
                break
        else:
            return name


def _strip_prefixes(state: dict) -> dict:
    return {strip_prefix(k): v for k, v in state.items()}


def _is_state_dict(obj) -> bool:
    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise UsageError(f"--init-from {path}: reading .safetensors needs the safetensors package "
                         "(pip install 'pipe-ml[models]')") from None
    try:
        return load_file(str(path), device="cpu")
    except FileNotFoundError:
        raise UsageError(f"--init-from {path}: no such file") from None
    except Exception as e:  # safetensors raises its own SafetensorError for a damaged header
        first = str(e).splitlines()[0] if str(e) else ""
        raise UsageError(f"--init-from {path}: not a readable safetensors file ({type(e).__name__}: {first})") from None


def _read_hf_folder(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The weights of a Hugging Face model folder: one file, or the shards its index lists."""
    from train.models.hf_files import WEIGHTS, weight_shards, weights_file

    name = weights_file(folder)
    if name is None and any((folder / f).exists() for f in ("last.pt", "last.dcp", "best.pt", "best.dcp")):
        raise UsageError(f"--init-from {folder}: a RUN_DIR of pipe train; name its checkpoint ({folder}/best.pt, or "
                         "best.dcp under --strategy fsdp) or a folder pipe export wrote")
    if name is None:
        raise UsageError(f"--init-from {folder}: a folder, but no Hugging Face weights in it (looked for "
                         f"{', '.join(WEIGHTS)})")
    shards = weight_shards(folder)  # plain file names in the folder, or why not
    if isinstance(shards, str):
        raise UsageError(f"--init-from {folder}: {shards}")
    files = shards or [name]
    state: dict[str, torch.Tensor] = {}
    for f in files:
        part = _read_safetensors(folder / f) if f.endswith(".safetensors") else read_state_dict(folder / f)[0]
        state.update(part)
    return _strip_prefixes(state), f"Hugging Face folder ({name})"


def check_init(path: Path) -> None:
    """--init-from's file read through the restricted unpickler before any rank starts (tensors
    mapped, not read), so a refused file is one line and exit 2 however many ranks would load it."""
    from train.models.hf_files import pickle_weights, weight_shards

    path = Path(path)
    if path.is_dir():
        shards = weight_shards(path)
        if isinstance(shards, str):
            raise UsageError(f"--init-from {path}: {shards}")
        files = pickle_weights(path)
    elif path.suffix == ".safetensors":
        files = []  # tensors only, by format
    elif not path.exists():
        raise UsageError(f"--init-from {path}: no such file")
    else:
        files = [path]
    for f in files:
        check_torch_file(f, "--init-from ")


def read_state_dict(path: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors in ``path`` (a torch file, a ``.safetensors`` file or a Hugging Face folder) and
    what kind it was; refuses files that hold code."""
    path = Path(path)
    if path.is_dir():
        from train.components import weights

        if weights.is_dcp_folder(path):  # --strategy fsdp's last.dcp / best.dcp: the model's shards put together
            return _strip_prefixes(weights.read_dcp_model(path)), "pipe train checkpoint (--strategy fsdp, DCP)"
        return _read_hf_folder(path)
    if path.suffix == ".safetensors":
        return _strip_prefixes(_read_safetensors(path)), "safetensors"
    try:
        # CPU first: a checkpoint saved on cuda:3 must load on a machine without that GPU; the
        # restricted unpickler (`safe_load`) refuses pickles that would run code on load
        obj = torch_file(path)
    except FileNotFoundError:
        raise UsageError(f"--init-from {path}: no such file") from None
    except Exception as e:  # refused (code in it), or not a torch file at all: zip errors, truncation
        raise refusal("--init-from ", path, e) from None
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


def _our_names(model: nn.Module) -> dict[str, str]:
    """The model's state-dict names by the name they are matched under (wrapper prefixes stripped);
    exact names when stripping would make two of them one."""
    names = list(model.state_dict())
    stripped = {strip_prefix(n): n for n in names}
    return stripped if len(stripped) == len(names) else {n: n for n in names}


def load_init(model: nn.Module, path: Path) -> InitReport:
    """Copy every tensor of ``path`` whose name and shape match into ``model``; report the rest."""
    theirs, kind = read_state_dict(Path(path))
    ours = model.state_dict()
    report = InitReport(source=str(path), kind=kind)
    keep = {}
    for key, name in _our_names(model).items():
        tensor = ours[name]
        if key not in theirs:
            report.missing.append(name)
        elif tuple(theirs[key].shape) != tuple(tensor.shape):
            report.skipped_shape.append((name, tuple(theirs[key].shape), tuple(tensor.shape)))
        else:
            keep[name] = theirs[key]
            report.loaded.append(name)
    matched = set(_our_names(model))
    report.unexpected = [k for k in theirs if k not in matched]
    if not keep:
        raise UsageError(f"--init-from {path}: none of its {len(theirs)} tensors matches the model's names and "
                         "shapes (was it written for another --model or --width?)")
    model.load_state_dict(keep, strict=False)  # copies (and casts) into the existing parameters
    head = head_of(model)
    if head is not None:
        prefix = head[0] + "."
        skipped = [(name, theirs_shape) for name, theirs_shape, _ in report.skipped_shape if name.startswith(prefix)]
        if skipped:
            reset_head(head[1])  # a half-loaded head is worse than a fresh one
            report.head_reinitialised = f"file has {skipped[0][1][0]} classes, this dataset {num_outputs(head[1])}"
    return report


def head_of(model: nn.Module) -> tuple[str, nn.Module] | None:
    """(qualified name, module) of the model's classification head (``model.head``), or None."""
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Module):
        return None
    return next(((name, m) for name, m in model.named_modules() if m is head), None)


def reset_head(head: nn.Module) -> None:
    """Fresh weights for every layer of the head (a plain Linear, or a small MLP head)."""
    for m in head.modules():
        reset = getattr(m, "reset_parameters", None)
        if callable(reset):
            reset()


def num_outputs(head: nn.Module) -> int | None:
    """The classes a head predicts: its last Linear's out_features."""
    linears = [m for m in head.modules() if isinstance(m, nn.Linear)]
    return linears[-1].out_features if linears else None


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
    frozen_bn: int = 0
    trainable_bn: int = 0

    def describe(self) -> str:
        bn = (f"; {self.frozen_bn} BatchNorm layers frozen in eval mode (running statistics kept)"
              if self.frozen_bn else "")
        return (f"frozen {self.frozen_blocks} of {self.total_blocks} blocks ({self.fraction:.0%} asked); "
                f"{self.trainable_params:,} of {self.total_params:,} parameters train{bn}")


def batch_norms(module: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The BatchNorm layers in ``module`` (SyncBatchNorm included)."""
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


class Freezer:
    """Sets requires_grad per block for a frozen fraction; parameters that the model itself
    froze (requires_grad False when the Freezer was made) stay frozen whatever the fraction.

    A frozen block's BatchNorm layers must also stop *updating*: in train mode they would keep
    moving their running mean and variance toward this dataset's batches (the weights frozen, the
    statistics not), so the block would drift from the pretrained one after all. `train_mode`
    puts the model in train mode and those layers back in eval mode; the loop calls it wherever
    it would call ``model.train()``.
    """

    def __init__(self, model: nn.Module, locked: list[nn.Module] | None = None):
        self.model = model
        self.locked = list(locked or [])  # --lock-image's tower: frozen (by `lock_image`) and always in eval mode
        self.groups = block_groups(model)
        self.trainable = {id(p) for p in model.parameters() if p.requires_grad}
        loose = getattr(model, "input_params", None)
        self.input_params = list(loose()) if callable(loose) else []
        self.frozen_bn: list[nn.Module] = []

    def apply(self, fraction: float) -> FreezeState:
        frozen_blocks = 0
        self.frozen_bn = []
        for g, group in enumerate(self.groups):
            n_frozen = math.floor(fraction * len(group) + 1e-9)  # at most the fraction asked
            frozen_blocks += n_frozen
            if g == 0:
                for p in self.input_params:
                    p.requires_grad_(n_frozen == 0 and id(p) in self.trainable)
            for i, block in enumerate(group):
                for p in block.parameters():
                    p.requires_grad_(i >= n_frozen and id(p) in self.trainable)
                if i < n_frozen:
                    self.frozen_bn += batch_norms(block)
        params = list(self.model.parameters())
        frozen = {id(m) for m in self.frozen_bn}
        self.train_mode(self.model.training)
        return FreezeState(fraction, frozen_blocks, sum(len(g) for g in self.groups),
                           sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params),
                           frozen_bn=len(self.frozen_bn),
                           trainable_bn=sum(1 for m in batch_norms(self.model) if id(m) not in frozen))

    def train_mode(self, mode: bool = True) -> None:
        """``model.train(mode)``, with the frozen blocks' BatchNorm layers left in eval mode."""
        self.model.train(mode)
        for m in [*self.frozen_bn, *self.locked]:
            m.eval()


def lock_image(model: nn.Module) -> list[nn.Module]:
    """--lock-image (LiT, Zhai et al. 2022): every parameter of the model's ``image_tower`` (the
    image encoder and its projection, `train.models.clip`) stops training, whatever --freeze and
    --unfreeze-at say; returns the tower for the `Freezer`, which keeps it in eval mode (its norm
    layers' statistics and any dropout as pretrained). Call before the Freezer is made."""
    tower = getattr(model, "image_tower", None)
    if not isinstance(tower, nn.Module):
        raise UsageError(f"--lock-image: {type(model).__name__} has no image_tower to lock (an image-caption model has one)")
    for p in tower.parameters():
        p.requires_grad_(False)
    return [tower]


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


def sync_batch_norm(model: nn.Module) -> int:
    """--sync-bn: every BatchNorm layer of ``model`` (in place) becomes a SyncBatchNorm, which
    normalises with the statistics of the whole global batch instead of each rank's share; returns
    how many. For BatchNorm models trained from scratch across ranks with small per-rank batches;
    a pretrained model fine-tuned with frozen BatchNorm has nothing to gain. Call it before the
    Freezer and the optimizer are made: the layers are new modules (the same parameters)."""
    count = len(batch_norms(model))
    for name, child in list(model.named_children()):
        setattr(model, name, nn.SyncBatchNorm.convert_sync_batchnorm(child))
    return count


# -- activation checkpointing ----------------------------------------------------------------------


def checkpoint_blocks(model: nn.Module) -> int:
    """--grad-checkpoint for a model that has no switch of its own (torchvision's): each block
    ``--freeze`` counts recomputes its activations in the backward pass instead of keeping them
    from the forward, so activation memory is about one block's instead of the whole model's.
    Returns how many blocks. A single layer (a ResNet's stem conv) is left alone: its output is
    kept as the next block's input either way.

    The block's ``forward`` is replaced on the instance, not wrapped in a new module (as torch's
    ``checkpoint_wrapper`` does), so state-dict names stay the original ones for --init-from,
    checkpoints and --resume, and FSDP still shards the block itself."""
    blocks = [b for group in block_groups(model) for b in group if any(True for _ in b.children())]
    for block in blocks:
        block.forward = _recomputed(block, block.forward)
    return len(blocks)


def _recomputed(block: nn.Module, forward):
    """``forward`` under torch's non-reentrant checkpoint while training (the built-in blocks' way:
    correct for a frozen block in front, keeps autocast, lets DDP's and FSDP's hooks fire)."""
    from torch.utils.checkpoint import checkpoint

    def run(*args, **kwargs):
        if not (block.training and torch.is_grad_enabled()):
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False,
                          context_fn=lambda: (contextlib.nullcontext(), _untracked(block)), **kwargs)

    return run


@contextlib.contextmanager
def _untracked(block: nn.Module):
    """The recompute must not count as a second step for BatchNorm: in training mode it moves the
    running mean and variance again with the same batch (twice the momentum per step). The
    recompute must also run the very ops of the forward (checkpoint compares what they save), so
    the layers update as usual and get their statistics back afterwards. The layers are looked up
    now, not when the forward was replaced: --sync-bn swaps them for SyncBatchNorm afterwards."""
    kept = [(buffer, buffer.clone()) for m in batch_norms(block) if m.training and m.track_running_stats
            for buffer in (m.running_mean, m.running_var, m.num_batches_tracked) if buffer is not None]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in kept:
                buffer.copy_(value)
