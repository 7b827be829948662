"""One optimizer step: ``accum`` micro-batches of ``batch_size`` samples, their gradients added up
locally and reduced once, in the last micro-batch's backward (`wrapping.no_sync`); then clipped
(unscaled first under fp16), one update, the schedule advanced. And the RNG seed of each step
(`step_seed`), so a resumed run draws what the uninterrupted run drew."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import StageFailed
from train.components.device import to_device
from train.components.margins import MarginRecorder
from train.components.micro_batch import oom_message
from train.components.monitor import Monitor
from train.components.wrapping import no_sync
from train.config import BatchPlan
from train.distributed.group import Dist


def step_seed(seed: int, step: int, rank: int) -> int:
    """The RNG seed of one optimizer step on one rank. Reseeding per step makes dropout and any
    other randomness independent of history (a DataLoader iterator also draws from the global RNG),
    so a resumed run draws exactly what the uninterrupted run drew."""
    return (seed * 1_000_003 + step * 7919 + rank) % (2**63 - 1)


@dataclass
class Step:
    """What every optimizer step of a run uses; `run` makes one."""

    model: nn.Module
    """The bare module: its parameters are clipped, and it says how batches are fed (`forward`)."""
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    plan: BatchPlan
    d: Dist
    precision: str
    channels_last: bool
    grad_clip: float | None
    grad_checkpoint: bool
    steps_per_epoch: int
    objective: Any = None
    """What the loss of a micro-batch is (`train.objectives`; None: classify)."""
    _micro: list[tuple[list[str], torch.Tensor]] = field(default_factory=list, init=False, repr=False)
    """The last step's micro-batches: their keys and loss (`nonfinite_keys`)."""

    def __post_init__(self) -> None:
        if self.objective is None:
            from train.objectives.classify import Classify

            self.objective = Classify()

    def run(self, wrapped: nn.Module, batches: Iterator[dict], epoch: int, step_in_epoch: int, monitor: Monitor,
            margins: MarginRecorder) -> tuple[torch.Tensor, int, float]:
        """One optimizer step of ``wrapped`` (DDP, the sharded model or the bare one) on the next
        ``accum`` batches: the loss summed over its samples, their number, and the seconds spent
        waiting for batches. ``monitor`` sees each batch's inputs, ``margins`` (the objective's
        recorder) what each sample's loss says of it."""
        plan, d = self.plan, self.d
        loss_sum = torch.zeros((), device=d.device)
        samples, wait = 0, 0.0
        self._micro = []
        try:
            for micro in range(plan.accum):
                t = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    raise StageFailed(f"the reader ended epoch {epoch + 1} early on rank {d.rank}: "
                                      f"{step_in_epoch * plan.accum + micro} batches, expected "
                                      f"{self.steps_per_epoch * plan.accum}") from None
                wait += time.perf_counter() - t
                batch = to_device(batch, d.device, self.channels_last)
                monitor.observe_inputs(batch.get("image"))
                # all but the last micro-step skip the gradient all-reduce (see wrapping.no_sync)
                with no_sync(wrapped, skip=micro < plan.accum - 1):
                    loss = self.objective.loss(wrapped, self.model, batch, epoch, margins, self.precision, d)
                    # / accum: the summed micro-gradients become the gradient of the mean over the step
                    self.scaler.scale(loss / plan.accum).backward()
                n = len(batch["label"])
                loss_sum += loss.detach() * n
                self._micro.append((list(batch.get("key") or ()), loss.detach()))
                samples += n
            self._update()
        except torch.OutOfMemoryError:
            raise StageFailed(oom_message(d, plan, self.precision, self.grad_checkpoint)) from None
        return loss_sum, samples, wait

    def nonfinite_keys(self) -> list[str]:
        """The keys of the last step's micro-batches whose loss was NaN or infinite (read only when
        the step's loss was: it syncs the device)."""
        return [k for keys, loss in self._micro if not torch.isfinite(loss.float()) for k in keys]

    def _update(self) -> None:
        self.scaler.unscale_(self.optimizer)  # no-op unless fp16: clip the true gradients
        if self.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.scaler.step(self.optimizer)  # skipped by the scaler when fp16 gradients overflowed
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
