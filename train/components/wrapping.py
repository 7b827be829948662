"""The model as this rank trains it: on its device, in its memory format and precision, sharded
(--strategy fsdp) or wrapped in DDP, the wrapper rebuilt when freezing changes what trains; and the
gradient sync a micro-step skips under either (`no_sync`)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.core.errors import UsageError
from train.components.device import resolve_precision
from train.config import TrainConfig
from train.distributed import fsdp
from train.distributed import group as distributed
from train.distributed.group import Dist
from train.models import families


@dataclass(frozen=True)
class Placement:
    """How this rank computes with the model (`place`)."""

    precision: str
    channels_last: bool
    sharded: bool


def place(model: nn.Module, cfg: TrainConfig, d: Dist) -> Placement:
    """Put ``model`` on the rank's device, in place: channels-last where that is faster, sharded
    under --strategy fsdp (build the optimizer after this: its parameters become DTensors)."""
    model.to(d.device)
    channels_last = runs_channels_last(cfg, d.device)
    if channels_last:
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload, unused-ignore]  # torch 2.13 stubs omit memory_format, 2.14 has it
    precision = resolve_precision(cfg.precision, d.device)
    sharded = cfg.strategy == "fsdp"
    if sharded:
        if precision == "fp16":
            raise UsageError("--strategy fsdp with fp16: the gradient scaler would skip steps on some ranks' "
                             "shards only; use --precision bf16 (or fp32)")
        fsdp.shard(model, d, precision)  # in place: parameters become shards (DTensors)
    return Placement(precision, channels_last, sharded)


def runs_channels_last(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether the model computes channels-last on ``device`` (`place`; the reader's feed then
    normalises images straight into that layout, `train.data.device.DeviceFeed`).

    Channels-last on CPU: oneDNN's convolutions then skip a layout reorder per call, and a
    training step of the built-in image model takes ~1.4x less time. Only for the built-in
    models: a user's model may .view() its feature maps, which channels-last tensors refuse.
    (A torchvision ResNet-18 trained no faster with it: bench/train.py --resnet.)
    FSDP2 shards contiguous parameters only: no channels-last under --strategy fsdp."""
    return device.type == "cpu" and families.resolve(cfg.model).family.own_modules and cfg.strategy != "fsdp"


def for_trainable(model: nn.Module, wrapped: nn.Module | None, d: Dist, sharded: bool, trainable_params: int) -> nn.Module:
    """What a training step runs once freezing has set what trains (``wrapped``: the module it ran
    before, None at the start)."""
    if sharded:  # sharded once; each unit reduces what trains now
        if trainable_params == 0:
            raise UsageError("every parameter is frozen: lower --freeze so something trains")
        fsdp.refresh_after_freeze(model)
        return model
    # DDP registered the trainable parameters when it was built: a new set needs a new wrapper,
    # or the newly unfrozen parameters would never be all-reduced and ranks would drift apart.
    return distributed.wrap(model, d) if wrapped is None else distributed.rewrap(wrapped, d)


def no_sync(model: nn.Module, skip: bool) -> AbstractContextManager:
    """While ``skip`` (a micro-step that is not the last of an optimizer step), backward leaves the
    gradients unreduced to add up: DDP skips its all-reduce (`train.distributed.group.no_sync`), a
    sharded model its reduce-scatter (`train.distributed.fsdp.no_sync`). The last micro-step
    reduces the sum once."""
    if skip and fsdp.is_sharded(model):
        return fsdp.no_sync(model, skip)
    return distributed.no_sync(model, skip)
