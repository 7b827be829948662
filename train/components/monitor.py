"""Watching a run: TensorBoard, metrics.jsonl, a progress bar, and the drift alarm.

Each rank sums its own numbers over a logging window (loss, per-channel input mean/std, time
waiting for data, step time, peak memory). Every ``log_every`` optimizer steps all ranks
all-gather those sums in one small tensor; rank 0 then writes:

* TensorBoard under RUN_DIR/tb: ``loss/train`` (global), ``loss/rank_R``, ``loss/val``,
  ``accuracy/val``, ``lr``, ``throughput/samples_per_s``, ``data/wait_share``, ``memory/peak_mb``;
* one JSON line per window (and per validation, per drift warning) to RUN_DIR/metrics.jsonl;
* the progress bar with ETA (a plain line per window when stderr is not a terminal);

and asks the `DriftDetector` whether a rank's loss or input statistics stray from the others'.
"""

from __future__ import annotations

import json
import math
import resource
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch
from rich.markup import escape

from train.distributed.group import Dist, all_gather_tensor

if TYPE_CHECKING:  # imported where used: TensorBoard loads on the main rank only
    from torch.utils.tensorboard import SummaryWriter

# layout of the per-rank window tensor that is all-gathered
_LOSS, _SAMPLES, _BATCHES, _MEAN, _STD, _WAIT, _TIME, _STEPS, _MEM = 0, 1, 2, slice(3, 6), slice(6, 9), 9, 10, 11, 12
_WIDTH = 13


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# -- the drift alarm ------------------------------------------------------------------------------


@dataclass
class DriftSettings:
    ema: float = 0.5
    """Weight of the newest window in each rank's running average."""
    min_windows: int = 2
    """Windows seen before a rank can be named (the first batches are noisy)."""
    loss_ratio: float = 1.5
    loss_margin: float = 0.25
    """A rank's loss drifts when above ratio x the others' median + margin (nats)."""
    mean_sigma: float = 0.5
    """Input channel mean further than this (in normalised units) from the others' median."""
    std_ratio: float = 1.5
    """Input channel std more than this factor above or below the others' median."""


@dataclass
class DriftDetector:
    """Names ranks whose running loss or input statistics stray from the other ranks'.

    Inputs are normalised with the index's mean/std on every rank, so every rank's batches should
    have channel means near 0 and stds near 1, and above all the *same* statistics. A rank is
    compared with the median of the others. With two ranks both differ from "the other"; then
    the one further from the normalised target (mean 0, std 1) is named.
    """

    world: int
    hosts: list[str]
    settings: DriftSettings = field(default_factory=DriftSettings)

    def __post_init__(self) -> None:
        # each rank's running averages; None until its first window
        self.loss: list[float | None] = [None] * self.world
        self.mean: list[list[float] | None] = [None] * self.world
        self.std: list[list[float] | None] = [None] * self.world
        self.windows = 0
        self.active: set[tuple[int, str]] = set()

    def _ema(self, old, new):
        return new if old is None else [self.settings.ema * n + (1 - self.settings.ema) * o for o, n in zip(old, new)]

    def update(self, step: int, losses: list[float], means: list[list[float]] | None,
               stds: list[list[float]] | None) -> list[dict]:
        """Feed one window; returns new warnings as dicts (rank, host, what, message, numbers)."""
        s = self.settings
        self.windows += 1
        found: dict[tuple[int, str], dict] = {}
        for r, x in enumerate(losses):
            if not math.isfinite(x):
                found[(r, "loss")] = self._warn(step, r, "loss", f"loss is {x} (the others: "
                                                f"{[round(v, 4) for i, v in enumerate(losses) if i != r]})")
        self.loss = [x if old is None or not math.isfinite(x) else s.ema * x + (1 - s.ema) * old
                     for old, x in zip(self.loss, losses)]
        if means is not None and stds is not None:  # both or neither: one gather makes them
            self.mean = [self._ema(self.mean[r], means[r]) for r in range(self.world)]
            self.std = [self._ema(self.std[r], stds[r]) for r in range(self.world)]
        if self.world > 1 and self.windows >= s.min_windows:
            found.update({k: v for k, v in self._loss_drift(step).items() if k not in found})
            if means is not None:
                found.update(self._input_drift(step))
        new = [w for k, w in found.items() if k not in self.active]
        self.active = set(found)  # warn again only after a rank recovered and drifted anew
        return new

    def _warn(self, step, rank, what, detail) -> dict:
        return {"step": step, "rank": rank, "host": self.hosts[rank], "what": what,
                "message": f"drift: rank {rank} on {self.hosts[rank]}: {detail} at step {step}"}

    def _loss_drift(self, step) -> dict:
        s, out = self.settings, {}
        loss = _every_rank(self.loss)
        for r in range(self.world):
            others = [x for i, x in enumerate(loss) if i != r and math.isfinite(x)]
            if not others or not math.isfinite(loss[r]):
                continue
            ref = statistics.median(others)
            if loss[r] > s.loss_ratio * ref + s.loss_margin:
                out[(r, "loss")] = self._warn(step, r, "loss", f"running loss {loss[r]:.4f} vs the other ranks' "
                                              f"median {ref:.4f}")
        return out

    def _input_drift(self, step) -> dict:
        s, flagged = self.settings, {}
        mean, std = _every_rank(self.mean), _every_rank(self.std)
        for r in range(self.world):
            others = [i for i in range(self.world) if i != r]
            ref_mean = [statistics.median(mean[i][c] for i in others) for c in range(3)]
            ref_std = [statistics.median(std[i][c] for i in others) for c in range(3)]
            off_mean = any(abs(mean[r][c] - ref_mean[c]) > s.mean_sigma for c in range(3))
            off_std = any(not (1 / s.std_ratio <= std[r][c] / max(ref_std[c], 1e-6) <= s.std_ratio) for c in range(3))
            if off_mean or off_std:
                flagged[r] = (ref_mean, ref_std)
        if len(flagged) * 2 >= self.world and len(flagged) > 1:
            # no minority to blame (e.g. two ranks): keep the rank(s) furthest from mean 0 / std 1
            def distance(r):
                return max(max(abs(m) for m in mean[r]), max(abs(math.log(max(v, 1e-6))) for v in std[r]))
            worst = max(distance(r) for r in flagged)
            flagged = {r: v for r, v in flagged.items() if distance(r) == worst}
        out = {}
        for r, (ref_mean, ref_std) in flagged.items():
            out[(r, "inputs")] = self._warn(step, r, "inputs", (
                f"input statistics stray from the other ranks': channel means {_fmt(mean[r])} vs {_fmt(ref_mean)}, "
                f"stds {_fmt(std[r])} vs {_fmt(ref_std)} (is it reading differently normalised or other data?)"))
        return out


T = TypeVar("T")


def _every_rank(values: list[T | None]) -> list[T]:
    """Every rank's running value, once each has seen a window (`update` fills all of them before
    it compares any)."""
    if any(v is None for v in values):
        raise AssertionError("internal: a rank's running average compared before its first window")
    return [v for v in values if v is not None]


def _fmt(xs) -> str:
    return "[" + ", ".join(f"{x:.3f}" for x in xs) + "]"


# -- the monitor --------------------------------------------------------------------------------


class Monitor:
    """Per-rank window sums; every `log_every` steps a gather and, on rank 0, the writers."""

    def __init__(self, run_dir: Path, d: Dist, hosts: list[str], *, total_steps: int, start_step: int,
                 global_batch: int, log_every: int, console):
        self.d, self.hosts, self.log_every = d, hosts, log_every
        self.total_steps, self.global_batch = total_steps, global_batch
        self.window = torch.zeros(_WIDTH, dtype=torch.float64, device=d.device)
        self.drift = DriftDetector(d.world_size, hosts)
        self.console = console
        self.last_loss = float("nan")
        self.started, self.start_step = time.monotonic(), start_step
        self.tb = self.metrics = self.bar = None
        if d.is_main:
            from torch.utils.tensorboard import SummaryWriter

            run_dir.mkdir(parents=True, exist_ok=True)
            # purge_step: after a resume, drop points that the killed run wrote past the checkpoint
            self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=start_step + 1 if start_step else None)
            self.metrics_path = run_dir / "metrics.jsonl"
            _truncate_metrics(self.metrics_path, start_step)
            self.metrics = open(self.metrics_path, "a", encoding="utf-8")
            if console is not None and console.is_terminal:
                self.bar = _progress_bar(console, total_steps, start_step)

    # -- per step, local --------------------------------------------------------------------

    def observe_inputs(self, image: torch.Tensor | None) -> None:
        """Per-channel mean and std of one micro-batch of images (already normalised)."""
        if image is None:
            return
        with torch.no_grad():
            # reduced in place over (batch, height, width): a channel-first copy of the whole batch
            # (transpose + reshape) cost a full pass over it in memory every step
            x = image.detach()[:, :3]
            std, mean = torch.std_mean(x.float(), dim=(0, 2, 3))  # (.float() of a float32 batch is the batch)
            self.window[_MEAN] += mean.double()
            self.window[_STD] += std.double()
            self.window[_BATCHES] += 1

    def step_done(self, loss_sum: torch.Tensor, samples: int, data_wait: float, step_time: float) -> None:
        """``loss_sum``: summed (not averaged) loss of this rank's samples in the step, on device."""
        self.window[_LOSS] += loss_sum.detach().double()
        self.window[_SAMPLES] += samples
        self.window[_WAIT] += data_wait
        self.window[_TIME] += step_time
        self.window[_STEPS] += 1

    def should_log(self, step: int, epoch_end: bool = False) -> bool:
        """The same answer on every rank (the gather is a collective)."""
        return step % self.log_every == 0 or epoch_end or step == self.total_steps

    def advance_bar(self, step: int, epoch: int, epochs: int) -> None:
        if self.bar is not None:
            self.bar.update(self.bar.task_ids[0], completed=step,
                            info=f"epoch {epoch + 1}/{epochs} loss {self.last_loss:.4f}")

    # -- every log_every steps, collective ------------------------------------------------------

    def log(self, step: int, epoch: int, epochs: int, lr: float) -> None:
        self.window[_MEM] = peak_memory_mb(self.d.device)
        per_rank = all_gather_tensor(self.window, self.d).cpu().tolist()  # [world, _WIDTH]
        self.window.zero_()
        if not self.d.is_main:
            return
        losses = [r[_LOSS] / max(r[_SAMPLES], 1) for r in per_rank]
        loss = sum(r[_LOSS] for r in per_rank) / max(sum(r[_SAMPLES] for r in per_rank), 1)
        steps = max(r[_STEPS] for r in per_rank) or 1
        seconds = max(r[_TIME] for r in per_rank) or 1e-9
        waits = [r[_WAIT] / r[_TIME] if r[_TIME] else 0.0 for r in per_rank]
        has_inputs = all(r[_BATCHES] > 0 for r in per_rank)
        means = [[m / r[_BATCHES] for m in r[_MEAN]] for r in per_rank] if has_inputs else None
        stds = [[v / r[_BATCHES] for v in r[_STD]] for r in per_rank] if has_inputs else None
        row = {
            "kind": "train", "step": step, "epoch": epoch + 1, "loss": loss, "loss_per_rank": losses, "lr": lr,
            "samples_per_s": self.global_batch * steps / seconds, "data_wait_share": sum(waits) / len(waits),
            "data_wait_share_per_rank": waits, "memory_mb": max(r[_MEM] for r in per_rank),
            "memory_mb_per_rank": [r[_MEM] for r in per_rank], "time": time.time(),
        }
        if means is not None:
            row["input_mean_per_rank"], row["input_std_per_rank"] = means, stds
        self.last_loss = loss
        self._write(row)
        tb = self._tensorboard()
        tb.add_scalar("loss/train", loss, step)
        for r, x in enumerate(losses):
            tb.add_scalar(f"loss/rank_{r}", x, step)
        tb.add_scalar("lr", lr, step)
        tb.add_scalar("throughput/samples_per_s", row["samples_per_s"], step)
        tb.add_scalar("data/wait_share", row["data_wait_share"], step)
        tb.add_scalar("memory/peak_mb", row["memory_mb"], step)
        for warning in self.drift.update(step, losses, means, stds):
            self._write({"kind": "drift", **warning})
            self.console.print(f"[yellow]warning:[/] {escape(warning['message'])}")  # "[" in it is no markup
        if self.bar is None and self.console is not None:
            self.console.print(self._line(row, epochs), highlight=False)

    def validation(self, step: int, epoch: int, loss: float, acc: float, samples: int,
                   metrics: dict[str, float] | None = None, parts: dict[str, tuple[float, float, int]] | None = None) -> None:
        """One validation. ``metrics``: the objective's other numbers (zero-shot accuracy,
        recall@K), written as ``val_<name>`` and as TensorBoard's ``<name before _>/<rest>``
        (``recall/i2t@1``); ``parts``: each mixed source's own (``val_loss/SOURCE`` ... in metrics.jsonl)."""
        if not self.d.is_main:
            return
        more = metrics or {}
        apart = {f"{k}/{name}": v for name, (lo, ac, n) in (parts or {}).items()
                 for k, v in (("val_loss", lo), ("val_acc", ac), ("val_samples", n))}
        self._write({"kind": "val", "step": step, "epoch": epoch + 1, "val_loss": loss, "val_acc": acc,
                     "val_samples": samples, **{f"val_{k}": v for k, v in more.items()}, **apart, "time": time.time()})
        tb = self._tensorboard()
        tb.add_scalar("loss/val", loss, step)
        tb.add_scalar("accuracy/val", acc, step)
        for name, value in more.items():
            group, _, rest = name.partition("_")
            tb.add_scalar(f"{group}/{rest or 'val'}", value, step)
        for name, (lo, ac, _) in (parts or {}).items():
            tb.add_scalar(f"loss/val/{name}", lo, step)
            tb.add_scalar(f"accuracy/val/{name}", ac, step)

    def event(self, **row) -> None:
        if self.d.is_main:
            self._write({**row, "time": time.time()})

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self.tb is not None:
            self.tb.close()
        if self.metrics is not None:
            self.metrics.close()

    # -- helpers ----------------------------------------------------------------------------------

    def _write(self, row: dict) -> None:
        if self.metrics is None:
            raise AssertionError("only the main rank writes metrics.jsonl")
        self.metrics.write(json.dumps(row) + "\n")
        self.metrics.flush()

    def _tensorboard(self) -> SummaryWriter:
        if self.tb is None:
            raise AssertionError("only the main rank writes TensorBoard events")
        return self.tb

    def _line(self, row: dict, epochs: int) -> str:
        done = row["step"] - self.start_step
        elapsed = time.monotonic() - self.started
        eta = elapsed / done * (self.total_steps - row["step"]) if done > 0 else float("nan")
        return (f"epoch {row['epoch']}/{epochs} step {row['step']}/{self.total_steps} loss {row['loss']:.4f} "
                f"lr {row['lr']:.2e} {row['samples_per_s']:.1f} samples/s data-wait {row['data_wait_share']:.0%} "
                f"mem {row['memory_mb']:.0f} MB eta {_clock(eta)}")


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _progress_bar(console, total: int, start: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console)
    bar.add_task("train", total=total, completed=start, info="")
    bar.start()
    return bar


def _truncate_metrics(path: Path, keep_upto_step: int) -> None:
    """After a resume from step S, drop lines a killed run wrote past S (they are redone)."""
    if not path.exists():
        return
    from pipeline.core.files import atomic_write_text

    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line).get("step", 0) <= keep_upto_step:
                kept.append(line)
        except json.JSONDecodeError:  # a line cut by the kill
            continue
    atomic_write_text(path, "".join(k + "\n" for k in kept))
