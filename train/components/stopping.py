"""Stopping a run early on purpose, on every rank at the same step: a SIGTERM, and a non-finite loss.

A SIGTERM is what Slurm, Kubernetes and spot instances send before they kill (they wait some
seconds: Slurm's KillWait and Kubernetes' grace period default to 30, as does torch's elastic
agent, which passes its own SIGTERM on to the ranks and kills them 30 s later). Here the signal
only sets a flag; after every optimizer step the ranks exchange their flags (one all-gather of two
numbers, on top of the step's gradient all-reduce), so one rank's SIGTERM stops every rank at the
same step boundary: the loop then writes a checkpoint there and ends the run as interrupted
(`pipeline.cli.common.interrupted`: exit 143, the "--resume" line).

The same exchange carries whether this rank's loss of the step was finite: a non-finite loss stops
every rank at the first such step, before anything is saved (the update it made is garbage; last.pt
stays the last good checkpoint), naming the step, the ranks and the keys of the micro-batches whose
loss was not finite (`Step.nonfinite_keys`). Reading the verdict syncs the device once a step, which
the skipped-sample count (`train.components.skipping`) already does at the same point.
"""

from __future__ import annotations

import math
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from train.distributed import group as distributed
from train.distributed.group import Dist

NAMED = 10  # keys a non-finite loss names in its line


@dataclass(frozen=True)
class Verdict:
    """What every rank learned after a step (the same on every rank)."""

    signalled: list[int]
    """Ranks that received a SIGTERM since the run started."""
    nonfinite: list[int]
    """Ranks whose loss of this step was NaN or infinite."""


class _Received:
    signalled = False


def _on_sigterm(signum, frame) -> None:
    # a dataloader worker forked from this rank inherits the handler: it only sets its own copy
    # of the flag, and keeps serving batches until the rank closes it
    _Received.signalled = True


def keep_sigterm() -> Any:
    """For a rank's whole run (`train.loop.main`): a SIGTERM before the loop runs is kept for it
    (it stops after its first step), and one during the rank's teardown (an agent ending the ranks
    after another failed) lets it finish and say why, instead of killing it. Returns the handler
    before, for `restore_sigterm`."""
    _Received.signalled = False
    if threading.current_thread() is threading.main_thread():
        return signal.signal(signal.SIGTERM, _on_sigterm)
    return None


def restore_sigterm(previous: Any) -> None:
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)


class StopRequests:
    """This rank's SIGTERM flag (the handler installed for the run, the previous one put back by
    `close`) and the exchange that turns every rank's flags into one verdict."""

    def __init__(self, d: Dist):
        self.d = d
        self.pid = os.getpid()
        self._previous = None
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            self._previous = signal.signal(signal.SIGTERM, _on_sigterm)
            if self._previous is not _on_sigterm:  # not a launched rank that kept an earlier one: a fresh flag
                _Received.signalled = False

    @property
    def signalled(self) -> bool:
        return _Received.signalled

    def exchange(self, loss_sum: torch.Tensor) -> Verdict:
        """Every rank calls this after each optimizer step, with the step's summed loss."""
        flags = torch.stack([torch.tensor(float(self.signalled), device=loss_sum.device),
                             (~torch.isfinite(loss_sum.detach().float())).float()])
        every = distributed.all_gather_tensor(flags, self.d).cpu().tolist()
        return Verdict(signalled=[r for r, f in enumerate(every) if f[0]], nonfinite=[r for r, f in enumerate(every) if f[1]])

    def close(self) -> None:
        if os.getpid() != self.pid:
            return
        _Received.signalled = False  # honoured (or the run ended): a later run in this process starts afresh
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


def nonfinite_message(step: int, epoch: int, ranks: list[int], loss: float | None, keys: list[str],
                      last_good: Path | None, saved_step: int | None) -> str:
    """The one line a non-finite loss ends the run with (``keys``: this rank's micro-batches whose
    loss was not finite; ``last_good``: the checkpoint that stays, of step ``saved_step``, or None
    when none was written). A resume keeps --lr: going on with other settings is a new run."""
    value = "NaN" if loss is None or math.isnan(loss) else f"{loss}"
    where = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    named = ""
    if keys:
        more = f" and {len(keys) - NAMED} more" if len(keys) > NAMED else ""
        named = f", in a batch of keys {', '.join(keys[:NAMED])}{more}"
    kept = (f"{last_good} (step {saved_step}) is the last good checkpoint, kept as it was" if last_good
            else "no checkpoint was written before it")
    again = f"to go on from it, start a new run (-o) with --init-from {last_good} and" if last_good else "start again with"
    return (f"the loss became {value} at step {step} (epoch {epoch + 1}) on {where}{named}: stopped before saving; "
            f"{kept}; {again} a lower --lr (or [train] grad_clip in a --config file, or --precision fp32/bf16)")
