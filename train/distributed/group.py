"""Process groups and DDP: which backend, how a rank joins, how the wrapper is (re)built, and a
teardown that lets every finished run exit 0.

A rank learns its place from the environment torchrun (or our launcher, `train.distributed.launch`) sets:
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Without them it is a
single process and no process group is made.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from pipeline.core.errors import StageFailed, UsageError


@dataclass(frozen=True)
class Dist:
    """Where this process stands in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str | None
    device: torch.device
    host: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def choose_backend(requested: str, cuda_available: bool) -> str:
    """nccl when CUDA is there, gloo otherwise; a forced choice is checked, not trusted."""
    if requested == "auto":
        return "nccl" if cuda_available and dist.is_nccl_available() else "gloo"
    if requested == "nccl":
        if not cuda_available:
            raise UsageError("--backend nccl needs CUDA, and no GPU is visible to this process; use --backend gloo")
        if not dist.is_nccl_available():
            raise UsageError("--backend nccl: this torch build has no NCCL; install a CUDA build or use --backend gloo")
        return "nccl"
    if requested == "gloo":
        if not dist.is_gloo_available():
            raise UsageError("--backend gloo: this torch build has no gloo")
        return "gloo"
    raise UsageError(f"--backend must be auto, nccl or gloo, got {requested!r}")


COLLECTIVE_TIMEOUT_S = 600.0
"""How long a collective waits for the other ranks before the group gives up (a dead peer)."""


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def setup(requested_backend: str = "auto", timeout_s: float = COLLECTIVE_TIMEOUT_S) -> Dist:
    """Join the process group named by the environment (or run alone without one); its collectives
    give up on a missing rank after ``timeout_s``."""
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", 1 if world == 1 else world)
    cuda = torch.cuda.is_available()
    backend = choose_backend(requested_backend, cuda)
    if cuda:
        if local_rank >= torch.cuda.device_count():
            raise UsageError(f"rank {rank} has LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are "
                             "visible: --nproc-per-node must not exceed the GPUs per node")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    host = socket.gethostname()
    if world == 1 and not os.environ.get("MASTER_ADDR"):
        return Dist(0, 1, 0, 1, None, device, host)  # a plain process (tests, notebooks): no group needed
    # Launched (torchrun, our launcher, even with one rank): join a real group, so that a single-GPU
    # run initialises NCCL exactly as a large one does and fails here, not on the cluster.
    try:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s),
                                device_id=device if backend == "nccl" else None)
    except Exception as e:
        addr, port = os.environ.get("MASTER_ADDR", "?"), os.environ.get("MASTER_PORT", "?")
        raise StageFailed(f"rank {rank} on {host} could not join the process group at {addr}:{port} "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); check that rank 0's "
                          f"host is reachable at {addr}, that port {port} is open in its firewall and not taken, and "
                          "that every node uses the same --master-addr/--master-port (set NCCL_SOCKET_IFNAME / "
                          "GLOO_SOCKET_IFNAME to the network interface when a machine has several)") from None
    return Dist(rank, world, local_rank, local_world, backend, device, host)


@contextmanager
def process_group(requested_backend: str = "auto", timeout_s: float = COLLECTIVE_TIMEOUT_S) -> Iterator[Dist]:
    """`setup`, and `teardown` on the way out: the final barrier only when the body finished (after
    an exception the other ranks may never reach it). The body stops its dataloader workers first."""
    d, ok = None, False
    try:
        d = setup(requested_backend, timeout_s)
        yield d
        ok = True
    finally:
        teardown(d, ok)


def teardown(d: Dist | None, ok: bool = True) -> None:
    """Leave the process group in order. On success every rank first meets at a barrier, so no
    rank closes its connections while another still talks to it; then the group is destroyed
    before interpreter exit (gloo left to the interpreter's shutdown can abort with 'terminate
    called without an active exception'). On failure we skip the barrier: the others may be gone."""
    if d is None or not dist.is_available() or not dist.is_initialized():
        return
    try:
        if ok:
            dist.barrier()
    finally:
        dist.destroy_process_group()


# -- DDP --------------------------------------------------------------------------------------


def wrap(model: nn.Module, d: Dist) -> nn.Module:
    """DDP around ``model`` when there are several ranks; the bare model otherwise.

    DDP registers the parameters that require grad *now*: after freezing or unfreezing, call
    `rewrap` or the newly trainable parameters are never all-reduced and ranks drift apart.
    """
    if not d.is_distributed:
        return model
    if not any(p.requires_grad for p in model.parameters()):
        raise UsageError("every parameter is frozen: lower --freeze so something trains")
    return DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None,
               gradient_as_bucket_view=True)


def rewrap(wrapped: nn.Module, d: Dist) -> nn.Module:
    """A fresh DDP wrapper for the same module (after requires_grad changed)."""
    module = unwrap(wrapped)
    del wrapped  # the old reducer removes its autograd hooks when it is freed
    return wrap(module, d)


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DDP) else model


def no_sync(model: nn.Module, skip: bool):
    """DDP all-reduces gradients inside backward(); on a micro-step that is not the last of an
    optimizer step that would be wasted bandwidth (the gradients are still adding up), so we
    skip it there. The last micro-step all-reduces the accumulated sum once. A sharded model
    (--strategy fsdp) has its own (`train.distributed.fsdp.no_sync`); the loop's step asks
    `train.components.wrapping.no_sync`, which picks the one for the model."""
    if skip and isinstance(model, DDP):
        return model.no_sync()
    return nullcontext()


# -- small collectives that are no-ops for a single process -------------------------------------


def all_reduce_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.is_distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.is_distributed:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def all_gather_tensor(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """[world, *t.shape]: every rank's ``t``, in rank order."""
    if not d.is_distributed:
        return t.unsqueeze(0)
    out = [torch.empty_like(t) for _ in range(d.world_size)]
    dist.all_gather(out, t)
    return torch.stack(out)


def all_gather_object(obj, d: Dist) -> list:
    if not d.is_distributed:
        return [obj]
    out = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, d: Dist, src: int = 0):
    if not d.is_distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
