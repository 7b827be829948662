"""The rank's device: how many threads a CPU rank computes with, cuDNN's choice of kernels on a
GPU, the precision the model computes in (autocast), and batches moved onto the device."""

from __future__ import annotations

import os

import torch

from pipeline.core.cores import available_cores
from pipeline.core.errors import UsageError
from train.distributed.group import Dist


def set_device_flags(d: Dist, workers: int) -> None:
    """On a GPU, let cuDNN pick the fastest convolution for our fixed input size (bit-exact resume
    is promised on CPU only). On CPU, size the intra-op thread pool (`cpu_threads`)."""
    if d.device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    elif "OMP_NUM_THREADS" not in os.environ:  # set by the operator or torchrun: theirs to choose
        torch.set_num_threads(cpu_threads(d.local_world_size, workers))


def cpu_threads(local_ranks: int, workers: int, cores: int | None = None) -> int:
    """Intra-op threads for one CPU rank: its share of the node's cores, less one core for each of
    its dataloader workers. CPU ranks on one node share the cores; a rank that starts a thread per
    core, or threads that compete with its own decoding workers, spins in OpenMP barriers while
    the other threads are descheduled: on 2 shared cores one rank with 2 threads and a worker ran
    its steps 2-5x slower than with 1 thread (bench/train.py)."""
    if cores is None:
        cores = available_cores()  # the cgroup quota too: a --cpus=2 container on a 64-core host has 2
    return max(1, cores // max(1, local_ranks) - workers)


def resolve_precision(requested: str, device: torch.device) -> str:
    cuda = device.type == "cuda"
    if requested == "auto":
        return ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32"
    if requested == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        raise UsageError("--precision bf16: this GPU has no bfloat16; use --precision fp16")
    return requested


def autocast(precision: str, device: torch.device) -> torch.autocast:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype is not None)


def to_device(batch: dict, device: torch.device, channels_last: bool = False) -> dict:
    out = {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    image = out.get("image")
    if channels_last and isinstance(image, torch.Tensor) and image.dim() == 4:
        out["image"] = image.contiguous(memory_format=torch.channels_last)
    return out
