"""--strategy fsdp: parameters, gradients and optimizer state sharded over the ranks (FSDP2).

DDP keeps a full copy of the model, its gradients and AdamW's two moments on every rank: about
16 bytes per parameter, so a 300M-parameter model needs ~5 GB per rank before any activation.
`fully_shard` (torch.distributed.fsdp, "FSDP2") keeps 1/world of each on a rank and all-gathers a
block's parameters just before the block runs, freeing them after; gradients are reduce-scattered
back to their shards. What a rank holds at once is its shards plus one or two full blocks.

How `pipe train` shards (`shard`), as torchtitan does for its transformers:

* one FSDP unit per *block*, the same blocks ``--freeze`` counts (`train.models.finetune.block_groups`),
  then the root for what is left (the head, loose parameters). A block is frozen or trainable as a
  whole, so every unit's parameters agree on requires_grad; the root may mix a model's own frozen
  parameters with trainable ones, which FSDP2 allows (it reduces only the trainable ones).
* a `MixedPrecisionPolicy` from --precision: blocks compute in bf16/fp16, the sharded master
  weights and the gradient reduction stay fp32 (a low-precision sum over many ranks loses bits).
* --grad-checkpoint is the model's own per-block recomputation (the built-in blocks, timm, Hugging
  Face), which composes with FSDP2: a recomputed block all-gathers its parameters again.

Freezing and unfreezing change requires_grad on the sharded parameters; FSDP2 copies it to the
unsharded ones at every all-gather, but (torch 2.13) fixes a unit's gradient dtypes once, at the first forward,
from the parameters that trained then. `refresh_after_freeze` redoes that, so a block unfrozen later
reduces its gradients in fp32 like the others.

Accumulation: on micro-steps that are not the last, `no_sync` turns the reduce-scatter off
(`set_requires_gradient_sync(False)`): gradients add up unsharded and are reduced once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeGuard

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

from pipeline.core.errors import UsageError
from train.distributed.group import Dist
from train.models.finetune import block_groups

PARAM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """Compute in the --precision dtype, keep master weights and gradient reduction in fp32."""
    return MixedPrecisionPolicy(param_dtype=PARAM_DTYPES.get(precision), reduce_dtype=torch.float32)


def units(model: nn.Module) -> list[nn.Module]:
    """The modules that become FSDP units, innermost first: every block that holds parameters."""
    return [block for group in block_groups(model) for block in group
            if any(True for _ in block.parameters())]


def shard(model: nn.Module, d: Dist, precision: str) -> nn.Module:
    """Shard ``model`` in place over every rank (one unit per block, then the root); the module stays
    the same object (its class becomes an FSDP subclass) and its parameters become DTensors, so
    build the optimizer after this. A single process has nothing to shard over: the model comes
    back as it was."""
    if not d.is_distributed:
        return model
    if not any(p.requires_grad for p in model.parameters()):
        raise UsageError("every parameter is frozen: lower --freeze so something trains")
    if d.device.type == "cpu":
        return_freed_buffers()
    mesh = init_device_mesh(d.device.type, (d.world_size,))
    policy = mixed_precision(precision)
    for block in units(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    # the root's parameters (head) are needed right after the last block: keep them gathered
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    for method in getattr(model, "fsdp_forward_methods", ()):  # called besides forward (an image-caption model's towers)
        register_fsdp_forward_method(model, method)
    return model


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD = 256 * 1024


def return_freed_buffers() -> bool:
    """On CPU, have glibc give large freed buffers back to the system at once.

    FSDP allocates a block's gathered parameters and its unreduced gradients for a moment, once
    per block per step. glibc serves allocations above a threshold with mmap (returned on free), but
    raises that threshold to the size of each such buffer it frees, up to 32 MB: from the first
    step on they come from the heap, which keeps the freed memory, and a rank's RSS grows past
    what DDP's whole copy needs (bench/train_memory.py: 1.28x DDP with the moving threshold,
    0.68x with a fixed 256 KiB one, 40M parameters, 2 ranks). Setting the threshold fixes it.
    False where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


def is_sharded(model: nn.Module) -> TypeGuard[FSDPModule]:
    return isinstance(model, FSDPModule)


def refresh_after_freeze(model: nn.Module) -> None:
    """After requires_grad changed: let every unit recompute the dtypes it reduces gradients in.

    torch 2.13's FSDP2 fixes them at its first forward from the parameters that trained then: a unit
    wholly frozen then gets none, and a block unfrozen later would reduce its gradients in the bf16
    compute dtype and hand bf16 gradients to fp32 master weights. (torch 2.14 derives them from all
    floating parameters when none trains, so there this only repeats what it has.) There is no
    public call for it: this uses FSDP2's per-unit state (``_get_fsdp_state()._fsdp_param_groups``,
    ``FSDPParamGroup._init_mp_dtypes``, the same in torch 2.13 and 2.14); a torch without them
    stops the run with one sentence instead of a traceback mid-training. Before a unit's first
    forward this is harmless: its lazy init computes the same again."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            for group in _param_groups(module):
                group._init_mp_dtypes()


def _param_groups(unit: FSDPModule) -> list:
    """The unit's FSDP2 parameter groups, each able to recompute its dtypes, or a UsageError."""
    try:
        groups = list(unit._get_fsdp_state()._fsdp_param_groups)
    except AttributeError:
        groups = None
    if groups is None or not all(callable(getattr(g, "_init_mp_dtypes", None)) for g in groups):
        raise UsageError(f"--strategy fsdp: torch {torch.__version__} lacks the FSDP2 internals pipe uses to "
                         "re-derive gradient dtypes after freezing (_fsdp_param_groups, _init_mp_dtypes; "
                         "present in torch 2.13 and 2.14): use one of those, or --strategy ddp")
    return groups


@contextmanager
def no_sync(model: FSDPModule, skip: bool) -> Iterator[None]:
    """FSDP2's no_sync: while ``skip``, backward leaves gradients unsharded and unreduced (they add
    up over the micro-steps); the last micro-step reduce-scatters the sum once."""
    if not skip:
        yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
