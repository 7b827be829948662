"""The training loop of `pipe train`: one rank's view, from process group to last checkpoint.

Read `Trainer.__init__` and `Trainer.fit` top to bottom. Every rank executes the same code; rank 0 alone prints, writes
checkpoints and the metrics. Collectives (gradient all-reduce, metric gathers, validation sums,
checkpoint RNG gathers) happen at the same points on every rank because every rank runs the same
number of steps: the reader guarantees equal steps per epoch, and everything else is counted in
optimizer steps.

One optimizer step = ``accum`` micro-batches of ``batch_size`` samples on each of ``world_size``
ranks (`train.config.BatchPlan`). Gradients add up locally over the micro-steps and are
all-reduced once, in the last micro-step's backward (`train.components.step`).

--strategy fsdp shards the model over the ranks instead of copying it (`train.distributed.fsdp`):
the same loop, with the model sharded before the optimizer is built, reduce-scatters instead of
all-reduces, and checkpoints every rank writes (`train.components.checkpoint.save_sharded`).

The pieces with a role of their own are modules beside it: `train.data.loaders` (the readers),
`train.components.device` (threads, precision, batches onto the device), `wrapping` (device,
sharding, DDP rebuilt on unfreeze), `micro_batch` (--auto-micro-batch), `step` (one optimizer
step), `validation`, `resume` (which checkpoint a run continues from).
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
import uuid
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pipeline.core.errors import StageFailed, UsageError
from pipeline.core.files import atomic_write_text
from train.components import checkpoint as ckpt
from train.components import keys, micro_batch, resume, skipping, start, stopping, watchdog, wrapping
from train.components.checkpoint import TrainState
from train.components.console import TORCHRUN_STORE_WARNING, RunConsole, stderr_console
from train.components.device import set_device_flags
from train.components.monitor import Monitor
from train.components.optimizer import extend as extend_schedule
from train.components.optimizer import make_optimizer, make_scheduler, warmup_steps
from train.components.step import Step, step_seed
from train.components.validation import together
from train.config import TrainConfig, check_epoch_fits, parse_unfreeze_at, resolve_batch
from train.data.loaders import DataSource, open_shards, read_dataset
from train.data.skips import parse_limit
from train.distributed import group as distributed
from train.distributed import preflight
from train.distributed.group import Dist, unwrap
from train.distributed.launch import EveryRankStopped
from train.models import norm as input_norm
from train.models.builtin import build_model, reader_fields, reader_image_size
from train.models.finetune import Freezer, FreezeSchedule, load_init, lock_image, sync_batch_norm
from train.objectives import Validation
from train.objectives import make as make_objective

if TYPE_CHECKING:
    from rich.console import Console

# Fault injection for drills and tests: "STEP[,STEP...][:RANK]" SIGKILLs that rank (default 0) right
# after optimizer step STEP, once per step per RUN_DIR (a marker file, one line per kill, stops a
# restarted run from dying there again): "3,7:1" kills rank 1 after step 3 and, resumed, after step 7.
FAULT_ENV = "PIPE_FAULT_KILL_AT_STEP"
# The same spec for a preemption: a SIGTERM to that rank, or to the process that started it (our
# launcher's elastic agent, or torchrun), which passes it on to every rank.
# And a stall: SIGSTOP to that rank's dataloader workers (its next batches never come).
FAULT_SIGNALS = {FAULT_ENV: ("SIGKILL", "rank"), "PIPE_FAULT_TERM_AT_STEP": ("SIGTERM", "rank"),
                 "PIPE_FAULT_TERM_LAUNCHER_AT_STEP": ("SIGTERM", "launcher"),
                 "PIPE_FAULT_STALL_AT_STEP": ("SIGSTOP", "workers")}


def _majority_share(index: dict) -> float | None:
    """The share of the val split's commonest class: the accuracy of a model that learned nothing
    but the class balance (index.json's counts; None without val samples)."""
    per_class = index["counts"]["val"]["per_class"]
    total = sum(per_class.values())
    return max(per_class.values()) / total if total else None


def _maybe_inject_fault(run_dir: Path, step: int, d: Dist) -> None:
    for env, (name, to) in FAULT_SIGNALS.items():
        spec = os.environ.get(env)
        if not spec:
            continue
        at, _, rank = spec.partition(":")
        marker = run_dir / ".fault-injected"
        line = f"{name} {'' if to == 'rank' else f'the {to} of '}rank {d.rank} after step {step}\n"
        if step in {int(a) for a in at.split(",")} and d.rank == int(rank or 0) and (
                not marker.exists() or line not in marker.read_text()):
            with open(marker, "a") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            for pid in {"rank": [os.getpid()], "launcher": [os.getppid()], "workers": watchdog.children()}[to]:
                os.kill(pid, getattr(signal, name))


# -- the run ---------------------------------------------------------------------------------------


def main(cfg: TrainConfig) -> dict:
    """What each rank runs under `train.distributed.launch` (our launcher, torchrun, or in-process)."""
    previous = stopping.keep_sigterm()  # a preemption's SIGTERM before the loop, or while the rank ends, is the loop's
    try:
        return run(cfg)
    finally:
        stopping.restore_sigterm(previous)


def run(cfg: TrainConfig, open_data: Callable[..., DataSource] = open_shards, console: Console | None = None) -> dict:
    """Train on this rank; returns the summary (the same on every rank). Tears the group down always."""
    with distributed.process_group(cfg.backend, watchdog.collective_timeout(cfg.stall_timeout)) as d:
        return Trainer(cfg, d, open_data, console).fit()


class Trainer:
    """The state of one rank's run; `fit` is the loop."""

    def __init__(self, cfg: TrainConfig, d: Dist, open_data: Callable[..., DataSource], console: Console | None = None):
        self.cfg, self.d = cfg, d
        self.console = console or stderr_console()
        self.out = RunConsole(self.console, d.is_main)
        self.run_dir = Path(cfg.output)
        set_device_flags(d, cfg.workers)

        # 1. what, where, with which batch arithmetic; every rank agrees or nobody starts
        self.plan = resolve_batch(cfg.batch_size, cfg.global_batch, cfg.accum, d.world_size)
        self.index, self.fingerprint = read_dataset(cfg)  # several SHARD_DIRs: merged (`train.data.mix`)
        self.objective = make_objective(cfg.objective, loss=cfg.loss, classes=self.index["classes"],
                                        templates=cfg.zeroshot_prompt)

        # 2. the model, identical on every rank (same seed; DDP also broadcasts rank 0's weights);
        # built before the preflight, which compares the input it is fed (`train.models.norm`)
        torch.manual_seed(cfg.seed)
        self.model = build_model(cfg.model, len(self.index["classes"]), index=self.index, width=cfg.width,
                                 resolution=cfg.resolution, max_text_len=cfg.max_text_len,
                                 grad_checkpoint=cfg.grad_checkpoint, objective=cfg.objective, loss=cfg.loss)
        self.input_norm = input_norm.resolve(self.model, self.index)
        config_hash = preflight.config_hash(cfg.fingerprint(), self._model_input())
        reports = preflight.run(d, self.fingerprint, config_hash, self.console if d.is_main else None)
        self.hosts = [r["host"] for r in reports]
        resume_from = resume.checkpoint_to_resume(cfg, self.run_dir, self.fingerprint, d, self.plan)
        built = getattr(self.model, "init_report", None)  # the weights an hf: folder brought
        if built is not None and resume_from is None:
            self.out.init_report(built)
        loaded = [built] if built is not None else []
        if cfg.init_from is not None and resume_from is None:
            loaded.append(load_init(self.model, cfg.init_from))
            self.out.init_report(loaded[-1])
        # a library model whose pretrained weights were not given: random, and said so
        pretrained_from = getattr(self.model, "pretrained_from", None)
        self.random_weights = bool(pretrained_from) and cfg.init_from is None and resume_from is None
        if self.random_weights and pretrained_from:
            self.out.random_weights(cfg.model, pretrained_from)
        if d.is_main and resume_from is None:  # where the weights started: what pipe export --wise rebuilds
            start.record(self.run_dir, cfg.as_dict(), self.model, self.index["classes"], start.fresh(self.model, loaded))
        if cfg.sync_bn and d.is_distributed:  # before the Freezer: the layers become new modules
            self.out.say(f"sync-bn: {sync_batch_norm(self.model)} BatchNorm layers normalise over the global batch")
        locked = lock_image(self.model) if cfg.lock_image else []  # LiT: before sharding, which takes what trains
        unfreeze = parse_unfreeze_at(cfg.unfreeze_at)
        self.schedule = FreezeSchedule(cfg.freeze, *(unfreeze or (None, 0.0)))
        placed = wrapping.place(self.model, cfg, d)  # its device, memory format, precision; sharded under fsdp
        self.precision, self.channels_last, self.sharded = placed.precision, placed.channels_last, placed.sharded
        self.freezer = Freezer(self.model, locked)  # after sharding: it keeps the parameters the model trains
        if cfg.auto_micro_batch:
            self.plan = micro_batch.probe(self.model, self.index, cfg, self.plan, d, self.precision, self.out.say,
                                          self.objective)

        # 3. data, optimizer, schedule
        reader_input: dict[str, Any] = {}  # the model's own normalisation and tokenizer, when it has them
        if getattr(self.model, "input_norm", None) is not None:
            reader_input.update(mean=self.input_norm.mean, std=self.input_norm.std)
        if getattr(self.model, "tokenize", None) is not None:
            reader_input["tokenize"] = self.model.tokenize
        self.data = open_data(cfg, d, self.plan, self.objective.fields(self.model), self.index,
                              image_size=reader_image_size(self.model, self.index.get("image_size")),
                              channels_last=self.channels_last, **reader_input)
        check_epoch_fits(self.data.train.steps_per_epoch, self.plan)
        self.steps_per_epoch = self.data.train.steps_per_epoch // self.plan.accum
        per_epochs = cfg.epochs * self.steps_per_epoch
        self.total_steps = min(per_epochs, cfg.max_steps) if cfg.max_steps else per_epochs
        warmup = warmup_steps(cfg, self.total_steps)
        self.optimizer = make_optimizer(self.model, cfg)
        self.scheduler = make_scheduler(self.optimizer, cfg, self.total_steps, warmup)
        self.scaler = torch.amp.GradScaler(d.device.type, enabled=self.precision == "fp16")
        self.optimizer_step = Step(self.model, self.optimizer, self.scheduler, self.scaler, self.plan, d, self.precision,
                                   self.channels_last, cfg.grad_clip, cfg.grad_checkpoint, self.steps_per_epoch,
                                   self.objective)
        self.state = self._restore(resume_from) if resume_from is not None else TrainState()
        self.wrapped: nn.Module | None = None
        self.frozen: float | None = None
        self.stopped: stopping.Verdict | None = None  # set when a SIGTERM stopped the run
        self._saved_at: int | None = self.state.step if resume_from is not None else None  # step of the last checkpoint
        self.margins = self.objective.recorder(self.run_dir, d.rank, d.world_size, self.state.step)  # for pipe labels
        resumed = keys.Records.of(resume_from)  # --record-keys: what the continued checkpoint had trained on
        if d.is_main:
            keys.prepare(self.run_dir, resumed)
        self.keys = keys.KeyRecorder(self.run_dir, d.rank, keys.attempt_of(resumed), cfg.record_keys)
        limit = parse_limit(cfg.max_skipped, self.index["counts"]["train"]["samples"])
        self.skips = skipping.SkipTracker(self.run_dir, d, limit, cfg.max_skipped, self.console,
                                          ((resume_from or {}).get("records") or {}).get("skipped"))
        self._say_setup(warmup)
        if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            self.out.say(TORCHRUN_STORE_WARNING)
        if d.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.run_dir / "config.json", json.dumps(self._resolved(), indent=2) + "\n")

    # -- the loop ----------------------------------------------------------------------------------

    def fit(self) -> dict:
        cfg, d = self.cfg, self.d
        self.monitor = Monitor(self.run_dir, d, self.hosts, total_steps=self.total_steps, start_step=self.state.step,
                               global_batch=self.plan.global_batch, log_every=cfg.log_every, console=self.console)
        started, start_step, last_val = time.monotonic(), self.state.step, None
        self.stops = stopping.StopRequests(d)  # SIGTERM: a checkpoint at the next step boundary, then stop
        self.watchdog = watchdog.Watchdog(self.run_dir, d, cfg.stall_timeout)  # a batch that never comes
        try:
            while self.state.epoch < cfg.epochs and self.state.step < self.total_steps:
                self._apply_freeze(self.state.epoch)
                finished_epoch = self._train_epoch(self.state.epoch)
                if self.stopped and not finished_epoch:  # saved where it stopped, mid-epoch
                    break
                last_val = self._validate()
                if finished_epoch:
                    self.state.epoch += 1
                    self.state.step_in_epoch = 0
                self._save(best=last_val is not None and last_val[0] < self.state.best_val_loss, val=last_val)
                if self.stopped:
                    break
        except Exception as e:
            note = self.watchdog.peer_note() if d.is_distributed else None
            if note is not None:  # this rank's collective failed because another rank stalled: name it
                raise StageFailed(f"rank {d.rank} stopped with the others: {note}") from None
            if not isinstance(e, OSError):
                raise
            # a full disk under RUN_DIR, whichever write met it first: one line
            full = ckpt.space_error(e)
            if full is None:
                raise
            what = Path(full.filename).name if isinstance(full.filename, (str, os.PathLike)) else "the run's files"
            raise StageFailed(ckpt.no_space(self.run_dir, what, full)) from None
        finally:
            self.watchdog.close()
            self.stops.close()
            self.data.close()  # dataloader workers stop before the process group is torn down
            self.monitor.close()
        elapsed = time.monotonic() - started
        summary = {
            "epochs": self.state.epoch, "steps": self.state.step, "global_batch": self.plan.global_batch,
            "samples_per_s": (self.state.step - start_step) * self.plan.global_batch / max(elapsed, 1e-9),
            "val_loss": last_val[0] if last_val else None, "val_acc": last_val[1] if last_val else None,
            "best_val_loss": None if math.isinf(self.state.best_val_loss) else self.state.best_val_loss,
            "best_val_acc": self.state.best_val_acc, "seconds": elapsed, "run_dir": str(self.run_dir),
            "val_majority": _majority_share(self.index), "skipped": self.skips.total,
            "interrupted": "SIGTERM" if self.stopped else None,
        }
        if self.stopped:  # the command ends it as interrupted (exit 143), the closing table left out
            self.out.stopped(self.stopped.signalled, self.state.epoch, self.state.step, self._last_written())
            return summary
        best = self.run_dir / (ckpt.BEST_DCP if self.sharded else ckpt.BEST)
        self.out.summary(self.run_dir, summary, has_best=best.exists(), sharded=self.sharded)
        return summary

    def _train_epoch(self, epoch: int) -> bool:
        """Optimizer steps until the epoch ends (True) or --max-steps is reached (False)."""
        cfg, d, plan, state = self.cfg, self.d, self.plan, self.state
        # the reader continues mid-epoch: samples this rank already consumed in this epoch
        self.data.train.set_epoch(epoch, consumed=state.step_in_epoch * plan.accum * plan.batch_size)
        batches = self._recorded(self._batches(self.data.train, f"epoch {epoch + 1}"), epoch)
        self.freezer.train_mode()  # frozen BatchNorm layers stay in eval mode
        try:
            while state.step_in_epoch < self.steps_per_epoch:
                if state.step >= self.total_steps:
                    return False
                t0 = time.perf_counter()
                torch.manual_seed(step_seed(cfg.seed, state.step, d.rank))
                loss_sum, samples, wait = self.optimizer_step.run(self._wrapped(), batches, epoch, state.step_in_epoch,
                                                                  self.monitor, self.margins)
                verdict = self.stops.exchange(loss_sum)  # every rank learns every rank's SIGTERM and NaN
                if verdict.nonfinite:  # before anything is saved: the last checkpoint stays the last good one
                    raise EveryRankStopped(self._nonfinite(verdict, loss_sum, epoch))
                state.step += 1
                state.step_in_epoch += 1
                self.skips.exchange(count=True)  # every rank learns every skip; past --max-skipped all stop
                self.monitor.step_done(loss_sum, samples, wait, time.perf_counter() - t0)
                self.monitor.advance_bar(state.step, epoch, cfg.epochs)
                epoch_end = state.step_in_epoch == self.steps_per_epoch
                if self.monitor.should_log(state.step, epoch_end):
                    self.monitor.log(state.step, epoch, cfg.epochs, float(self.scheduler.get_last_lr()[0]))
                if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0 and not epoch_end:
                    self._save()
                _maybe_inject_fault(self.run_dir, state.step, d)
                if verdict.signalled:  # every rank stops here; at an epoch's end fit validates and saves
                    self.stopped = verdict
                    if not epoch_end:
                        if self._saved_at != state.step:
                            self._save()
                        return False
            return True
        finally:
            batches.close()  # drops the loader's iterator: non-persistent workers stop now, not at GC

    def _batches(self, reader: Any, where: str) -> Generator[dict, None, None]:
        """The loader's batches; bad data ends the run in one line that names the shard and key, a
        dead dataloader worker in one that names the rank and host, a wait past --stall-timeout
        too (`train.components.watchdog`)."""
        it = iter(self.data.loader(reader))
        got = 0

        def awaited() -> str:
            shards = watchdog.batch_shards(reader, got)
            return f"its next batch ({where}" + (f", from shard {', '.join(shards)}" if shards else "") + ")"

        try:
            while True:
                try:
                    with self.watchdog.waiting(awaited):
                        batch = next(it)
                except StopIteration:
                    return
                except self.data.errors as e:
                    raise StageFailed(f"rank {self.d.rank}, {where}: {e}") from None
                except RuntimeError as e:
                    if "DataLoader worker" not in str(e):
                        raise
                    raise StageFailed(f"rank {self.d.rank} on {self.d.host}, {where}: {str(e).strip()} (killed from "
                                      "outside or out of memory: see the kernel log, dmesg)") from None
                got += 1
                yield batch
        finally:  # the feed's prefetch thread stops here, not at garbage collection: before another
            close = getattr(it, "close", None)  # loader's workers fork, and before this one's iterator is reset
            if close is not None:
                close()

    def _recorded(self, batches: Generator[dict, None, None], epoch: int) -> Generator[dict, None, None]:
        """The train batches, each one's keys recorded as the step takes it (--record-keys)."""
        try:
            for batch in batches:
                if batch.get("skipped"):  # samples the reader could not read or decode (bad data)
                    self.skips.seen("train", epoch, self.state.step + 1, batch["skipped"])
                if batch.get("key") is not None:
                    self.keys.trained(epoch, batch["key"], skipping.skipped_slots(batch))
                yield batch
        finally:
            batches.close()

    def _val_batches(self, reader: Any) -> Generator[dict, None, None]:
        for batch in self._batches(reader, "validation"):
            if batch.get("skipped"):
                self.skips.seen("val", self.state.epoch, self.state.step, batch["skipped"])
            yield batch

    def _wrapped(self) -> nn.Module:
        if self.wrapped is None:  # wrapped at each epoch's start, before any step
            raise RuntimeError("internal: a training step before the model was wrapped for the epoch")
        return self.wrapped

    def _validate(self) -> tuple[float, float, int] | None:
        """Loss and accuracy over the val split, exact across ranks (the objective's: `train.objectives`);
        with several SHARD_DIRs mixed, over each one's val split apart and over all of them."""
        readers = self.data.val_parts or ({"": self.data.val} if self.data.val is not None else {})
        found: dict[str, Validation | None] = {}
        for name, reader in readers.items():
            reader.set_epoch(0)
            found[name] = self.objective.validate(self.model, self._val_batches(reader), self.d, self.precision,
                                                  self.channels_last, self.margins, self.state.epoch)
        self.skips.exchange(count=False)  # validation's skips: named and recorded, not counted
        self.freezer.train_mode()
        parts = {name: v for name, v in found.items() if v is not None}
        if not parts:
            return None
        whole = parts.get("")
        val = whole.as_tuple() if whole is not None else together([v.as_tuple() for v in parts.values()])
        metrics = whole.metrics if whole is not None else None  # mixed: loss and accuracy per source
        apart = None if whole is not None else {name: v.as_tuple() for name, v in parts.items()}
        self.monitor.validation(self.state.step, self.state.epoch, *val, metrics=metrics, parts=apart)
        self.out.validation(self.state.epoch, *val, metrics=metrics, parts=apart)
        return val

    # -- freezing --------------------------------------------------------------------------------

    def _apply_freeze(self, epoch: int) -> None:
        fraction = self.schedule.fraction_at(epoch)
        if fraction == self.frozen and self.wrapped is not None:
            return
        state = self.freezer.apply(fraction)
        self.wrapped = wrapping.for_trainable(self.model, self.wrapped, self.d, self.sharded, state.trainable_params)
        if self.d.is_main and self.cfg.freeze > 0:
            self.out.freeze(epoch, state)
            self.monitor.event(kind="freeze", step=self.state.step, epoch=epoch + 1, fraction=fraction,
                               frozen_blocks=state.frozen_blocks, trainable_params=state.trainable_params,
                               frozen_batch_norms=state.frozen_bn)
        if self.d.is_main and self.plan.accum > 1 and state.trainable_bn and self.frozen is None:
            self.out.say(f"warning: --accum {self.plan.accum} with {state.trainable_bn} BatchNorm layers that train: each "
                         f"normalises with its micro-batch of {self.plan.batch_size}, not the step's batch of "
                         f"{self.plan.batch_size * self.plan.accum}, so the gradients differ from one big batch's "
                         "(raise --batch-size, freeze those blocks, or use a model without BatchNorm)")
        self.frozen = fraction

    # -- checkpoints -------------------------------------------------------------------------------

    def _nonfinite(self, verdict: stopping.Verdict, loss_sum: torch.Tensor, epoch: int) -> str:
        last = self._last_written()
        return stopping.nonfinite_message(self.state.step + 1, epoch, verdict.nonfinite, float(loss_sum),
                                          self.optimizer_step.nonfinite_keys(), last, self._saved_at)

    def _last_written(self) -> Path | None:
        """RUN_DIR's last checkpoint, when there is one."""
        return ckpt.last_checkpoint(self.run_dir) if self._saved_at is not None else None

    def _save(self, best: bool = False, val: tuple | None = None) -> None:
        """Every rank calls this (the RNG states are gathered); rank 0 writes."""
        self._saved_at = self.state.step
        self.margins.flush(self.state.step)  # before the gather: every rank's records precede last.pt
        # every rank's RNG states and the key files it appended to (--record-keys), in one gather
        gathered = distributed.all_gather_object((ckpt.rng_state(), self.keys.flush()), self.d)
        rngs = [rng for rng, _ in gathered]
        records = {**keys.Records(self.keys.attempt, {n: size for _, files in gathered for n, size in files.items()}).as_dict(),
                   "skipped": self.skips.state()}
        if best and val is not None:  # a best checkpoint always comes with its validation
            self.state.best_val_loss, self.state.best_val_acc = val[0], val[1]
        # the train reader's position: the epoch in progress and the samples this rank consumed
        # (reader steps are micro-batches); it also records the layout it is valid for
        reader = {**self.data.train.state_dict(self.state.step_in_epoch * self.plan.accum), "epoch": self.state.epoch}
        if self.sharded:  # every rank writes its shards; one folder name for all of them
            token = distributed.broadcast_object(uuid.uuid4().hex[:8], self.d)
            ckpt.save_sharded(self.run_dir, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                              scaler=self.scaler, state=self.state, reader=reader, rngs=rngs, config=self._resolved(),
                              fingerprint=self.fingerprint, best=best, token=token, is_main=self.d.is_main,
                              records=records)
            return
        if not self.d.is_main:
            return
        ckpt.save(self.run_dir, model=unwrap(self.model), optimizer=self.optimizer, scheduler=self.scheduler,
                  scaler=self.scaler, state=self.state, reader=reader, rngs=rngs, config=self._resolved(),
                  fingerprint=self.fingerprint, best=best, records=records)

    def _restore(self, saved: dict) -> TrainState:
        """The weights, optimizer, schedule, scaler and RNG states of ``saved``, and the reader where
        it was: mid-epoch exactly, or from the epoch's start when the batch layout changed."""
        if ckpt.SHARDED_FROM in saved:  # DCP fills optimizer state for what trains now: make that what had trained
            self.freezer.apply(self.schedule.fraction_at(resume.last_trained_epoch(saved)))
        s = ckpt.restore(saved, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                         scaler=self.scaler, rank=self.d.rank, world_size=self.d.world_size)
        was = (saved.get("config") or {}).get("epochs")
        if isinstance(was, int) and self.cfg.epochs > was:  # --resume with more --epochs: the schedule goes on
            old_total, lr_before, lr_now = extend_schedule(self.scheduler, self.total_steps)
            self.out.extended(was, self.cfg.epochs, old_total, self.total_steps, s.step, lr_before, lr_now)
        if s.step_in_epoch:
            try:  # the same layout continues where it was; another one reads the epoch's unread samples
                self.data.train.load_state_dict(saved["reader"])
            except ValueError as e:  # a position that cannot be continued exactly: refused before any step
                raise UsageError(f"--resume: {e}") from None
            self.out.layout_changed(saved["reader"], self.data.train, s.epoch)
        self.out.resumed(self.run_dir / (ckpt.LAST_DCP if ckpt.SHARDED_FROM in saved else ckpt.LAST), s.epoch, s.step)
        return s

    def _resolved(self) -> dict:
        return {**self.cfg.as_dict(), "batch_size": self.plan.batch_size, "accum": self.plan.accum,
                "global_batch": self.plan.global_batch, "world_size": self.d.world_size,
                "precision": self.precision, "backend": self.d.backend or "none", "input": self._model_input()}

    def _model_input(self) -> dict:
        """What the model is fed: the normalisation and image size the reader applies, and the
        tokens per text when the model tokenizes (for config.json and the preflight)."""
        tokenize = getattr(self.model, "tokenize", None)
        return {**self.input_norm.as_dict(), "image_size": reader_image_size(self.model, self.index.get("image_size")),
                "tokens": getattr(tokenize, "max_len", None)}

    def _say_setup(self, warmup: int) -> None:
        reads_images = "image" in reader_fields(self.model)
        if reads_images:
            self.out.say(f"input: {self.input_norm.describe(self.data.train.image_size, self.random_weights)}")
        if reads_images and self.cfg.decode == "gpu" and self.d.device.type != "cuda":
            self.out.say("note: --decode gpu on a rank without a GPU: its dataloader workers decode the JPEGs, as with cpu")
        tokenize = getattr(self.model, "tokenize", None)
        if tokenize is not None and hasattr(tokenize, "describe"):
            self.out.say(f"input: {tokenize.describe()}")
        self.out.setup(self.cfg, self.plan, params=sum(p.numel() for p in self.model.parameters()),
                       precision=self.precision, backend=self.d.backend, steps_per_epoch=self.steps_per_epoch,
                       total_steps=self.total_steps, warmup=warmup,
                       decoded_at=self.data.train.image_size if reads_images else None,
                       stored=self.index.get("image_size"), threads=torch.get_num_threads())
