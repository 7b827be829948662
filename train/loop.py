"""The training loop of `pipe train`: one rank's view, from process group to last checkpoint.

Read `run` top to bottom. Every rank executes the same code; rank 0 alone prints, writes
checkpoints and the metrics. Collectives (gradient all-reduce, metric gathers, validation sums,
checkpoint RNG gathers) happen at the same points on every rank because every rank runs the same
number of steps: the reader guarantees equal steps per epoch, and everything else is counted in
optimizer steps.

One optimizer step = ``accum`` micro-batches of ``batch_size`` samples on each of ``world_size``
ranks (`train.config.BatchPlan`). Gradients add up locally over the micro-steps and are
all-reduced once, in the last micro-step's backward (`train.distributed.group.no_sync`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.errors import StageFailed, UsageError
from pipeline.core.files import atomic_write_text
from train.components import checkpoint as ckpt
from train.distributed import group as distributed
from train.distributed import preflight
from train.config import BUILTIN_MODELS, BatchPlan, TrainConfig, parse_unfreeze_at, resolve_batch, resume_conflict
from train.distributed.group import Dist, no_sync, unwrap
from train.models.finetune import Freezer, FreezeSchedule, load_init
from train.models.builtin import build_model, forward, reader_fields, reader_image_size
from train.components.monitor import Monitor
from train.components.margins import MarginRecorder

# Fault injection for drills and tests: "STEP[:RANK]" SIGKILLs that rank (default 0) right after
# optimizer step STEP, once per RUN_DIR (a marker file stops a restarted run from dying again).
FAULT_ENV = "PIPE_FAULT_KILL_AT_STEP"


# -- what the loop needs from the data side ------------------------------------------------------


@dataclass
class DataSource:
    """Readers for the train and val splits and how to turn a reader into batches.

    A reader has ``set_epoch(epoch, consumed=0)`` and ``steps_per_epoch`` (per-rank batches per
    epoch, equal on every rank); the loader yields dicts: ``image`` [B,3,S,S] float normalised,
    ``text`` [B,L] int64 byte ids, ``text_len`` [B], ``label`` [B], ``key`` list[str], and for
    validation ``valid`` [B] bool (False for the repeats that fill the last batches so that
    every rank runs the same number of steps; they are not counted).
    """

    train: Any
    val: Any | None
    loader: Callable[[Any], Iterable[dict]]
    close: Callable[[], None] = lambda: None
    """Stop the loaders' worker processes (before the process group goes away)."""
    errors: tuple[type[BaseException], ...] = ()
    """What the loader raises for bad data (a sample that does not decode); it ends the run as a
    one-line failure naming the shard and key, not as an internal error."""


def read_index(shard_dir: Path) -> tuple[dict, str]:
    """index.json and its fingerprint (the hash every rank must agree on)."""
    raw = (Path(shard_dir) / "index.json").read_bytes()
    try:
        index = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{shard_dir}/index.json is not valid JSON ({e}); run `pipe shard` again") from None
    if not index.get("classes"):
        raise UsageError(f"{shard_dir}/index.json lists no classes: there is nothing to classify")
    return index, hashlib.sha256(raw).hexdigest()[:16]


def open_shards(cfg: TrainConfig, d: Dist, plan: BatchPlan, fields: tuple[str, ...], index: dict,
                image_size: int | None = None) -> DataSource:
    """The real readers over SHARD_DIR (`train.data.reader`); images decoded at ``image_size`` (the
    model's input size) in the dataloader workers, not at the stored size."""
    from train.data.reader import SampleDecodeError, ShardReader, close_loader, make_loader

    if "image" in fields and index.get("image_size") is None:
        raise UsageError(f"{cfg.shard_dir} holds no images, but --model {cfg.model} reads them: use --model text")

    def reader(split: str):
        return ShardReader(cfg.shard_dir, split=split, rank=d.rank, world_size=d.world_size, batch_size=plan.batch_size,
                           seed=cfg.seed, shuffle_buffer=cfg.shuffle_buffer, fields=fields, max_text_len=cfg.max_text_len,
                           image_size=image_size)

    has_val = any(s.get("split") == "val" and s.get("count", 0) > 0 for s in index.get("shards", []))
    readers = [reader("train")] + ([reader("val")] if has_val else [])
    # one DataLoader per reader, made now (the reader's resume position depends on its worker
    # count) and kept: persistent workers survive from epoch to epoch
    loaders = {id(r): make_loader(r, cfg.workers, persistent_workers=cfg.workers > 0,
                                  pin_memory=d.device.type == "cuda")  # page-locked: async copies to the GPU
               for r in readers}

    def close():
        for ld in loaders.values():
            close_loader(ld)

    return DataSource(train=readers[0], val=readers[1] if has_val else None, loader=lambda r: loaders[id(r)],
                      close=close, errors=(SampleDecodeError,))


# -- small pieces --------------------------------------------------------------------------------


@dataclass
class TrainState:
    """Where the run is; saved in every checkpoint."""

    epoch: int = 0
    """Index (from 0) of the epoch in progress."""
    step: int = 0
    """Optimizer steps done in total."""
    step_in_epoch: int = 0
    """Optimizer steps done in the current epoch."""
    best_val_loss: float = math.inf
    best_val_acc: float = 0.0


def resolve_precision(requested: str, device: torch.device) -> str:
    cuda = device.type == "cuda"
    if requested == "auto":
        return ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32"
    if requested == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        raise UsageError("--precision bf16: this GPU has no bfloat16; use --precision fp16")
    return requested


def autocast(precision: str, device: torch.device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype is not None)


class WarmupCosine:
    """LR multiplier: linear warmup to 1 over ``warmup`` steps, cosine down to ``floor`` at ``total``.
    A class (not a lambda) so LambdaLR's state_dict carries it into checkpoints."""

    def __init__(self, total: int, warmup: int, floor: float):
        self.total, self.warmup, self.floor = total, warmup, floor

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over *all* parameters (frozen ones have no grad, so AdamW skips them until they are
    unfrozen: the optimizer never needs rebuilding); no weight decay on biases and norm scales."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr)


def step_seed(seed: int, step: int, rank: int) -> int:
    """The RNG seed of one optimizer step on one rank. Reseeding per step makes dropout and any
    other randomness independent of history (a DataLoader iterator also draws from the global RNG),
    so a resumed run draws exactly what the uninterrupted run drew."""
    return (seed * 1_000_003 + step * 7919 + rank) % (2**63 - 1)


def oom_message(d: Dist, plan: BatchPlan, precision: str, grad_checkpoint: bool) -> str:
    return (f"CUDA out of memory on rank {d.rank} ({d.host}) at per-rank batch {plan.batch_size} "
            f"(precision {precision}, gradient checkpointing {'on' if grad_checkpoint else 'off'}, "
            f"{plan.describe()}): lower --batch-size and raise --accum to keep the global batch, or pass "
            "--auto-micro-batch to find the largest batch that fits; --precision bf16 and --grad-checkpoint "
            "also cut activation memory")


def probe_micro_batch(plan: BatchPlan, try_batch: Callable[[int], None], d: Dist, say, describe_oom) -> BatchPlan:
    """Find the largest per-rank batch (halving) whose forward+backward fits on every rank.

    Every rank tries the same size and the out-of-memory flags are max-reduced, so all ranks
    agree on the result (one rank training with another batch would hang the all-reduce).
    """
    while True:
        oom = 0
        try:
            try_batch(plan.batch_size)
        except torch.OutOfMemoryError:
            oom = 1
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        flag = distributed.all_reduce_max(torch.tensor([oom], device=d.device), d)
        if not flag.item():
            return plan
        if plan.batch_size % 2:
            raise StageFailed(describe_oom(plan) + f" (--auto-micro-batch cannot halve the odd batch {plan.batch_size} "
                              "and keep the global batch)")
        smaller = plan.halved()
        say(f"auto-micro-batch: per-rank batch {plan.batch_size} ran out of memory; trying {smaller.batch_size} "
            f"with --accum {smaller.accum} (global batch {smaller.global_batch} kept)")
        plan = smaller


def _synthetic_batch(model: nn.Module, index: dict, cfg: TrainConfig, size: int, device) -> dict:
    side = reader_image_size(model, index.get("image_size")) or int(index.get("image_size") or 64)
    return {
        "image": torch.randn(size, 3, side, side, device=device),
        "text": torch.randint(1, 257, (size, cfg.max_text_len), device=device),
        "text_len": torch.full((size,), cfg.max_text_len, device=device),
        "label": torch.zeros(size, dtype=torch.long, device=device),
    }


def _to_device(batch: dict, device: torch.device, channels_last: bool = False) -> dict:
    out = {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    image = out.get("image")
    if channels_last and isinstance(image, torch.Tensor) and image.dim() == 4:
        out["image"] = image.contiguous(memory_format=torch.channels_last)
    return out


def _set_device_flags(d: Dist, workers: int) -> None:
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
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_ranks) - workers)


def _majority_share(index: dict) -> float | None:
    """The share of the val split's commonest class: the accuracy of a model that learned nothing
    but the class balance (index.json's counts; None when it has none)."""
    per_class = ((index.get("counts") or {}).get("val") or {}).get("per_class") or {}
    total = sum(per_class.values())
    return max(per_class.values()) / total if total else None


def _console():
    """stderr; in logs (not a terminal) wide enough that tables keep whole hashes and versions."""
    from rich.console import Console

    c = Console(stderr=True)
    return c if c.is_terminal else Console(stderr=True, width=160)


def _maybe_inject_fault(run_dir: Path, step: int, d: Dist) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    at, _, rank = spec.partition(":")
    marker = run_dir / ".fault-injected"
    if step == int(at) and d.rank == int(rank or 0) and not marker.exists():
        marker.write_text(f"SIGKILL rank {d.rank} after step {step}\n")
        os.kill(os.getpid(), signal.SIGKILL)


# -- resume ----------------------------------------------------------------------------------------


def _checkpoint_to_resume(cfg: TrainConfig, run_dir: Path, fingerprint: str, d: Dist, plan: BatchPlan) -> dict | None:
    """The checkpoint this run continues from, or None for a fresh run; the same answer on every rank.
    `pipe train` checked the settings before any rank started; checked again here for callers of `run`."""
    last = run_dir / ckpt.LAST
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
    exists = distributed.broadcast_object(last.exists(), d)  # rank 0's view decides
    if not exists:
        if cfg.resume and not restarted:
            raise UsageError(f"--resume: {run_dir} has no {ckpt.LAST} to continue from")
        return None
    if not (cfg.resume or restarted):
        raise UsageError(f"{run_dir} already holds a run ({ckpt.LAST}); add --resume to continue it, or choose a new -o")
    if not last.exists():
        raise StageFailed(f"rank {d.rank} on {d.host} cannot see {last} that rank 0 sees: RUN_DIR must be on storage "
                          "every node shares")
    state = ckpt.load(last)
    if state.get("dataset_fingerprint") != fingerprint:
        raise UsageError(f"{last} was trained on another dataset (index hash {state.get('dataset_fingerprint')}, now "
                         f"{fingerprint}); start a new run with -o and --init-from {last} to fine-tune from it")
    conflict = resume_conflict(state.get("config") or {}, {**cfg.as_dict(), "global_batch": plan.global_batch})
    if conflict:
        raise UsageError(conflict)
    return state


# -- the run ---------------------------------------------------------------------------------------


def main(cfg: TrainConfig) -> dict:
    """What each rank runs under `train.distributed.launch` (our launcher, torchrun, or in-process)."""
    return run(cfg)


def run(cfg: TrainConfig, open_data=open_shards, console=None) -> dict:
    """Train on this rank; returns the summary (the same on every rank). Tears the group down always."""
    d, ok = None, False
    try:
        d = distributed.setup(cfg.backend)
        summary = Trainer(cfg, d, open_data, console).fit()
        ok = True
        return summary
    finally:
        distributed.teardown(d, ok)


class Trainer:
    """The state of one rank's run; `fit` is the loop."""

    def __init__(self, cfg: TrainConfig, d: Dist, open_data, console=None):
        self.cfg, self.d = cfg, d
        self.console = console or _console()
        self.run_dir = Path(cfg.output)
        _set_device_flags(d, cfg.workers)

        # 1. what, where, with which batch arithmetic; every rank agrees or nobody starts
        self.plan = resolve_batch(cfg.batch_size, cfg.global_batch, cfg.accum, d.world_size)
        self.index, self.fingerprint = read_index(cfg.shard_dir)
        reports = preflight.run(d, self.fingerprint, cfg.fingerprint(), self.console if d.is_main else None)
        self.hosts = [r["host"] for r in reports]
        resume_from = _checkpoint_to_resume(cfg, self.run_dir, self.fingerprint, d, self.plan)

        # 2. the model, identical on every rank (same seed; DDP also broadcasts rank 0's weights)
        torch.manual_seed(cfg.seed)
        self.model = build_model(cfg.model, len(self.index["classes"]), index=self.index, width=cfg.width,
                                 resolution=cfg.resolution, max_text_len=cfg.max_text_len,
                                 grad_checkpoint=cfg.grad_checkpoint)
        if cfg.init_from is not None and resume_from is None:
            self._report_init(load_init(self.model, cfg.init_from))
        self.freezer = Freezer(self.model)
        unfreeze = parse_unfreeze_at(cfg.unfreeze_at)
        self.schedule = FreezeSchedule(cfg.freeze, *(unfreeze or (None, 0.0)))
        self.model.to(d.device)
        # Channels-last on CPU: oneDNN's convolutions then skip a layout reorder per call, and a
        # training step of the built-in image model takes ~1.4x less time. Only for the built-in
        # models: a user's model may .view() its feature maps, which channels-last tensors refuse.
        self.channels_last = d.device.type == "cpu" and cfg.model in BUILTIN_MODELS
        if self.channels_last:
            self.model.to(memory_format=torch.channels_last)
        self.precision = resolve_precision(cfg.precision, d.device)
        if cfg.auto_micro_batch:
            self._probe_batch()

        # 3. data, optimizer, schedule
        self.data = open_data(cfg, d, self.plan, reader_fields(self.model), self.index,
                              image_size=reader_image_size(self.model, self.index.get("image_size")))
        self.steps_per_epoch = self.data.train.steps_per_epoch // self.plan.accum
        if self.steps_per_epoch < 1:
            raise UsageError(f"one epoch gives each rank {self.data.train.steps_per_epoch} batches of "
                             f"{self.plan.batch_size}, fewer than one optimizer step needs ({self.plan.accum}): "
                             f"lower --global-batch/--batch-size or --accum ({self.plan.describe()})")
        per_epochs = cfg.epochs * self.steps_per_epoch
        self.total_steps = min(per_epochs, cfg.max_steps) if cfg.max_steps else per_epochs
        warmup = round(cfg.warmup * self.total_steps) if cfg.warmup < 1 else int(cfg.warmup)
        self.optimizer = make_optimizer(self.model, cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, WarmupCosine(self.total_steps, max(warmup, 0), cfg.min_lr_fraction))
        self.scaler = torch.amp.GradScaler(d.device.type, enabled=self.precision == "fp16")
        self.state = TrainState()
        if resume_from is not None:
            self._restore(resume_from)
        self.wrapped: nn.Module | None = None
        self.frozen: float | None = None
        self.margins = MarginRecorder(self.run_dir, d.rank, d.world_size, start_step=self.state.step)  # for pipe labels
        self._say_setup(warmup)
        if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            self._say("warning: torchrun shares its rendezvous store with the ranks; after a restart a rank can read "
                      "a dead rank's address and fail to connect (pytorch/pytorch#135712): export "
                      "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun --max-restarts")
        if d.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.run_dir / "config.json", json.dumps(self._resolved(), indent=2) + "\n")

    # -- the loop ----------------------------------------------------------------------------------

    def fit(self) -> dict:
        cfg, d = self.cfg, self.d
        self.monitor = Monitor(self.run_dir, d, self.hosts, total_steps=self.total_steps, start_step=self.state.step,
                               global_batch=self.plan.global_batch, log_every=cfg.log_every, console=self.console)
        started, start_step, last_val = time.monotonic(), self.state.step, None
        try:
            while self.state.epoch < cfg.epochs and self.state.step < self.total_steps:
                self._apply_freeze(self.state.epoch)
                finished_epoch = self._train_epoch(self.state.epoch)
                last_val = self._validate()
                if finished_epoch:
                    self.state.epoch += 1
                    self.state.step_in_epoch = 0
                self._save(best=last_val is not None and last_val[0] < self.state.best_val_loss, val=last_val)
        finally:
            self.data.close()  # dataloader workers stop before the process group is torn down
            self.monitor.close()
        elapsed = time.monotonic() - started
        summary = {
            "epochs": self.state.epoch, "steps": self.state.step, "global_batch": self.plan.global_batch,
            "samples_per_s": (self.state.step - start_step) * self.plan.global_batch / max(elapsed, 1e-9),
            "val_loss": last_val[0] if last_val else None, "val_acc": last_val[1] if last_val else None,
            "best_val_loss": None if math.isinf(self.state.best_val_loss) else self.state.best_val_loss,
            "best_val_acc": self.state.best_val_acc, "seconds": elapsed, "run_dir": str(self.run_dir),
            "val_majority": _majority_share(self.index),
        }
        if d.is_main:
            self._say_summary(summary)
        return summary

    def _train_epoch(self, epoch: int) -> bool:
        """Optimizer steps until the epoch ends (True) or --max-steps is reached (False)."""
        cfg, d, plan, state = self.cfg, self.d, self.plan, self.state
        # the reader continues mid-epoch: samples this rank already consumed in this epoch
        self.data.train.set_epoch(epoch, consumed=state.step_in_epoch * plan.accum * plan.batch_size)
        batches = self._batches(self.data.train, f"epoch {epoch + 1}")
        self.model.train()
        try:
            while state.step_in_epoch < self.steps_per_epoch:
                if state.step >= self.total_steps:
                    return False
                t0 = time.perf_counter()
                torch.manual_seed(step_seed(cfg.seed, state.step, d.rank))
                loss_sum, samples, wait = self._step(batches, epoch)
                state.step += 1
                state.step_in_epoch += 1
                self.monitor.step_done(loss_sum, samples, wait, time.perf_counter() - t0)
                self.monitor.advance_bar(state.step, epoch, cfg.epochs)
                epoch_end = state.step_in_epoch == self.steps_per_epoch
                if self.monitor.should_log(state.step, epoch_end):
                    self.monitor.log(state.step, epoch, cfg.epochs, self.scheduler.get_last_lr()[0])
                if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0 and not epoch_end:
                    self._save()
                _maybe_inject_fault(self.run_dir, state.step, d)
            return True
        finally:
            batches.close()  # drops the loader's iterator: non-persistent workers stop now, not at GC

    def _batches(self, reader, where: str):
        """The loader's batches; bad data ends the run in one line that names the shard and key."""
        it = iter(self.data.loader(reader))
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except self.data.errors as e:
                raise StageFailed(f"rank {self.d.rank}, {where}: {e}") from None
            yield batch

    def _step(self, batches, epoch: int):
        """One optimizer step: ``accum`` micro-batches, one all-reduce, one update."""
        plan, d, model = self.plan, self.d, self.wrapped
        loss_sum = torch.zeros((), device=d.device)
        samples, wait = 0, 0.0
        try:
            for micro in range(plan.accum):
                t = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    raise StageFailed(f"the reader ended epoch {epoch + 1} early on rank {d.rank}: "
                                      f"{self.state.step_in_epoch * plan.accum + micro} batches, expected "
                                      f"{self.steps_per_epoch * plan.accum}") from None
                wait += time.perf_counter() - t
                batch = _to_device(batch, d.device, self.channels_last)
                self.monitor.observe_inputs(batch.get("image"))
                # all but the last micro-step skip DDP's gradient all-reduce (see distributed.no_sync)
                with no_sync(model, skip=micro < plan.accum - 1):
                    with autocast(self.precision, d.device):
                        logits = forward(model, self.model, batch)
                    loss = F.cross_entropy(logits.float(), batch["label"])
                    self.margins.train(epoch, batch, logits)
                    # / accum: the summed micro-gradients become the gradient of the mean over the step
                    self.scaler.scale(loss / plan.accum).backward()
                n = len(batch["label"])
                loss_sum += loss.detach() * n
                samples += n
            self._update()
        except torch.OutOfMemoryError:
            raise StageFailed(oom_message(d, plan, self.precision, self.cfg.grad_checkpoint)) from None
        return loss_sum, samples, wait

    def _update(self) -> None:
        self.scaler.unscale_(self.optimizer)  # no-op unless fp16: clip the true gradients
        if self.cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.optimizer)  # skipped by the scaler when fp16 gradients overflowed
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def _validate(self) -> tuple[float, float, int] | None:
        """Loss and accuracy over the val split, exact across ranks: sums and counts are all-reduced."""
        if self.data.val is None:
            return None
        d, model = self.d, self.model  # the bare module: no DDP hooks in evaluation
        self.data.val.set_epoch(0)
        sums = torch.zeros(3, dtype=torch.float64, device=d.device)  # loss sum, correct, samples
        model.eval()
        with torch.no_grad():
            for batch in self._batches(self.data.val, "validation"):
                batch = _to_device(batch, d.device, self.channels_last)
                with autocast(self.precision, d.device):
                    logits = forward(model, model, batch)
                self.margins.val(self.state.epoch, batch, logits)
                labels = batch["label"]
                valid = batch.get("valid")
                keep = valid.to(torch.float64) if valid is not None else torch.ones(len(labels), dtype=torch.float64, device=d.device)
                losses = F.cross_entropy(logits.float(), labels, reduction="none").double()
                sums[0] += (losses * keep).sum()
                sums[1] += ((logits.argmax(dim=1) == labels).double() * keep).sum()
                sums[2] += keep.sum()
        model.train()
        distributed.all_reduce_sum(sums, d)
        loss_sum, correct, n = sums.tolist()
        if n == 0:
            return None
        val = (loss_sum / n, correct / n, int(n))
        self.monitor.validation(self.state.step, self.state.epoch, *val)
        if d.is_main:
            self.console.print(f"epoch {self.state.epoch + 1}: val loss {val[0]:.4f} acc {val[1]:.1%} "
                               f"({val[2]} samples, all ranks)", highlight=False)
        return val

    # -- freezing --------------------------------------------------------------------------------

    def _apply_freeze(self, epoch: int) -> None:
        fraction = self.schedule.fraction_at(epoch)
        if fraction == self.frozen and self.wrapped is not None:
            return
        state = self.freezer.apply(fraction)
        # DDP registered the trainable parameters when it was built: a new set needs a new wrapper,
        # or the newly unfrozen parameters would never be all-reduced and ranks would drift apart.
        self.wrapped = distributed.wrap(self.model, self.d) if self.wrapped is None else distributed.rewrap(self.wrapped, self.d)
        if self.d.is_main and self.cfg.freeze > 0:
            self.console.print(f"epoch {epoch + 1}: {state.describe()}", highlight=False)
            self.monitor.event(kind="freeze", step=self.state.step, epoch=epoch + 1, fraction=fraction,
                               frozen_blocks=state.frozen_blocks, trainable_params=state.trainable_params)
        self.frozen = fraction

    # -- auto micro-batch --------------------------------------------------------------------------

    def _probe_batch(self) -> None:
        if self.d.device.type != "cuda":
            if self.d.is_main:
                self.console.print("auto-micro-batch: nothing to probe on CPU (an out-of-memory there is not "
                                   "recoverable); keeping " + self.plan.describe(), highlight=False)
            return
        model = self.model

        def try_batch(size: int) -> None:
            batch = _synthetic_batch(model, self.index, self.cfg, size, self.d.device)
            try:
                with autocast(self.precision, self.d.device):
                    loss = F.cross_entropy(forward(model, model, batch).float(), batch["label"])
                loss.backward()
            finally:
                model.zero_grad(set_to_none=True)

        before = self.plan
        self.plan = probe_micro_batch(self.plan, try_batch, self.d, self._say,
                                      lambda p: oom_message(self.d, p, self.precision, self.cfg.grad_checkpoint))
        if self.plan != before:
            self._say(f"auto-micro-batch: training with {self.plan.describe()}")

    # -- checkpoints -------------------------------------------------------------------------------

    def _save(self, best: bool = False, val: tuple | None = None) -> None:
        """Every rank calls this (the RNG states are gathered); rank 0 writes."""
        self.margins.flush(self.state.step)  # before the gather: every rank's records precede last.pt
        rngs = distributed.all_gather_object(ckpt.rng_state(), self.d)
        if best:
            self.state.best_val_loss, self.state.best_val_acc = val[0], val[1]
        if not self.d.is_main:
            return
        ckpt.save_atomic({
            "format": ckpt.CHECKPOINT_FORMAT,
            "model": unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": self.state.epoch, "step": self.state.step, "step_in_epoch": self.state.step_in_epoch,
            "best_val_loss": self.state.best_val_loss, "best_val_acc": self.state.best_val_acc,
            "reader": self._reader_state(),
            "rng": rngs,
            "config": self._resolved(),
            "dataset_fingerprint": self.fingerprint,
        }, self.run_dir / ckpt.LAST)
        if best:
            ckpt.mark_best(self.run_dir)

    def _restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        s = self.state
        s.epoch, s.step, s.step_in_epoch = state["epoch"], state["step"], state["step_in_epoch"]
        s.best_val_loss, s.best_val_acc = state["best_val_loss"], state["best_val_acc"]
        changed = self._reader_layout_change(state["reader"]) if s.step_in_epoch else None
        if changed:
            # the position is "samples each rank consumed" in the old layout; in a new one it means
            # other samples, so the epoch restarts rather than skipping samples silently
            self._say(f"resume: {changed}; epoch {s.epoch + 1} starts again from its beginning (no sample "
                      "skipped; the ones already seen this epoch are seen twice)")
            s.step -= s.step_in_epoch
            s.step_in_epoch = 0
        rngs = state.get("rng") or []
        if len(rngs) == self.d.world_size:
            ckpt.set_rng_state(rngs[self.d.rank])
        self._say(f"resumed from {self.run_dir / ckpt.LAST}: epoch {s.epoch + 1}, step {s.step}")

    def _reader_state(self) -> dict:
        """The train reader's position: the epoch in progress and the samples this rank consumed."""
        steps_done = self.state.step_in_epoch * self.plan.accum  # reader steps are micro-batches
        reader = self.data.train
        if hasattr(reader, "state_dict"):  # the real reader also records its layout (workers, seed, ...)
            return {**reader.state_dict(steps_done), "epoch": self.state.epoch}
        return {"epoch": self.state.epoch, "consumed": steps_done * self.plan.batch_size,
                "world_size": self.d.world_size, "batch_size": self.plan.batch_size}

    def _reader_layout_change(self, saved: dict) -> str | None:
        """Why the saved mid-epoch position cannot be continued exactly now, or None."""
        reader = self.data.train
        if hasattr(reader, "load_state_dict"):
            try:
                reader.load_state_dict(saved)  # checks world size, batch, workers, seed, shuffle buffer
            except ValueError as e:
                return str(e)
            return None
        if (saved["world_size"], saved["batch_size"]) != (self.d.world_size, self.plan.batch_size):
            return (f"the checkpoint is mid-epoch with {saved['world_size']} ranks x batch {saved['batch_size']}, "
                    f"now {self.d.world_size} x {self.plan.batch_size}")
        return None

    # -- talking -----------------------------------------------------------------------------------

    def _say(self, message: str) -> None:
        if self.d.is_main:
            self.console.print(message, highlight=False)

    def _resolved(self) -> dict:
        return {**self.cfg.as_dict(), "batch_size": self.plan.batch_size, "accum": self.plan.accum,
                "global_batch": self.plan.global_batch, "world_size": self.d.world_size,
                "precision": self.precision, "backend": self.d.backend or "none"}

    def _report_init(self, report) -> None:
        if not self.d.is_main:
            return
        from rich.table import Table

        t = Table(title=f"--init-from {report.source} ({report.kind})", title_justify="left", show_header=False)
        t.add_column(style="bold")
        t.add_column()
        for status, detail in report.rows():
            t.add_row(status, detail)
        self.console.print(t)

    def _say_setup(self, warmup: int) -> None:
        params = sum(p.numel() for p in self.model.parameters())
        self._say(f"batch: {self.plan.describe()}")
        self._say(f"model: {self.cfg.model}, {params:,} parameters, precision {self.precision}, gradient "
                  f"checkpointing {'on' if self.cfg.grad_checkpoint else 'off'}, backend {self.d.backend or 'none (1 process)'}")
        self._say(f"schedule: {self.steps_per_epoch} steps per epoch, {self.total_steps} in total, warmup {warmup}, "
                  f"AdamW lr {self.cfg.lr:g} (cosine to {self.cfg.lr * self.cfg.min_lr_fraction:g}), weight decay "
                  f"{self.cfg.weight_decay:g}")
        reader = self.data.train
        size, stored = getattr(reader, "image_size", None), self.index.get("image_size")
        if size and "image" in reader_fields(self.model):
            where = f"{self.cfg.workers} dataloader worker{'s' if self.cfg.workers != 1 else ''}" if self.cfg.workers else "the rank"
            self._say(f"data: images decoded at {size} px (stored {stored} px) in {where}; "
                      f"{torch.get_num_threads()} compute thread{'s' if torch.get_num_threads() != 1 else ''} per rank")

    def _say_summary(self, s: dict) -> None:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"pipe train -> {self.run_dir}", show_header=False, title_justify="left")
        t.add_column(style="bold")
        t.add_column(justify="right")
        rows = [("epochs", s["epochs"]), ("optimizer steps", s["steps"]), ("global batch", s["global_batch"]),
                ("samples/s", f"{s['samples_per_s']:.1f}")]
        if s["val_loss"] is not None:
            rows += [("val loss", f"{s['val_loss']:.4f}"), ("val accuracy", f"{s['val_acc']:.1%}")]
            if s["val_majority"] is not None:  # what always answering the commonest class would score
                rows.append(("val majority class", f"{s['val_majority']:.1%}"))
            rows.append(("best val loss", f"{s['best_val_loss']:.4f}"))
        rows += [("time", f"{s['seconds']:.1f} s"), ("checkpoints", "last.pt" + (", best.pt" if (self.run_dir / ckpt.BEST).exists() else "")),
                 ("metrics", "metrics.jsonl, tb/")]
        for k, v in rows:
            t.add_row(k, str(v))
        Console().print(t)
