"""The training loop of `pipe train`: one rank's view, from process group to last checkpoint.

Read `Trainer.__init__` and `Trainer.fit` top to bottom. Every rank executes the same code; rank 0 alone prints, writes
checkpoints and the metrics. Collectives (gradient all-reduce, metric gathers, validation sums,
checkpoint RNG gathers) happen at the same points on every rank because every rank runs the same
number of steps: the reader guarantees equal steps per epoch, and everything else is counted in
optimizer steps.

One optimizer step = ``accum`` micro-batches of ``batch_size`` samples on each of ``world_size``
ranks (`train.config.BatchPlan`). Gradients add up locally over the micro-steps and are
all-reduced once, in the last micro-step's backward (`train.distributed.group.no_sync`).

--strategy fsdp shards the model over the ranks instead of copying it (`train.distributed.fsdp`):
the same loop, with the model sharded before the optimizer is built, reduce-scatters instead of
all-reduces, and checkpoints every rank writes (`train.components.checkpoint.save_sharded`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.cores import available_cores
from pipeline.core.errors import StageFailed, UsageError
from pipeline.core.files import atomic_write_text
from train.components import checkpoint as ckpt
from train.components.checkpoint import TrainState
from train.components.console import TORCHRUN_STORE_WARNING, RunConsole, stderr_console
from train.components.margins import MarginRecorder
from train.components.monitor import Monitor
from train.components.optimizer import make_optimizer, make_scheduler, warmup_steps
from train.config import (
    BUILTIN_MODELS,
    BatchPlan,
    TrainConfig,
    check_epoch_fits,
    continues_run,
    parse_unfreeze_at,
    resolve_batch,
    resume_conflict,
)
from train.distributed import fsdp, preflight
from train.distributed import group as distributed
from train.distributed.group import Dist, no_sync, unwrap
from train.models import norm as input_norm
from train.models.builtin import build_model, forward, reader_fields, reader_image_size
from train.models.finetune import Freezer, FreezeSchedule, load_init, sync_batch_norm

# Fault injection for drills and tests: "STEP[:RANK]" SIGKILLs that rank (default 0) right after
# optimizer step STEP, once per RUN_DIR (a marker file stops a restarted run from dying again).
FAULT_ENV = "PIPE_FAULT_KILL_AT_STEP"


# -- what the loop needs from the data side ------------------------------------------------------


@dataclass
class DataSource:
    """Readers for the train and val splits and how to turn a reader into batches.

    A reader is `train.data.reader.ShardReader`'s interface: ``steps_per_epoch`` (per-rank batches
    per epoch, equal on every rank), ``image_size`` (the side images are decoded at),
    ``set_epoch(epoch, consumed=0)``, ``state_dict(steps_done)`` (its position, for a checkpoint)
    and ``load_state_dict(state)`` (ValueError when that position cannot be continued exactly);
    the loader yields dicts: ``image`` [B,3,S,S] float normalised,
    ``text`` [B,L] int64 byte ids, ``text_len`` [B] (or, for a model with a ``tokenize``, what it
    returns: ``input_ids`` and ``attention_mask`` [B,L]), ``label`` [B], ``key`` list[str], and for
    validation ``valid`` [B] bool (False for the repeats that fill the last batches so that
    every rank runs the same number of steps; they are not counted).
    """

    train: Any
    val: Any | None
    loader: Callable[[Any], Iterable[dict]]
    close: Callable[[], None]
    """Stop the loaders' worker processes (before the process group goes away)."""
    errors: tuple[type[BaseException], ...]
    """What the loader raises for bad data (a sample that does not decode); it ends the run as a
    one-line failure naming the shard and key, not as an internal error."""


def read_index(shard_dir: str | Path) -> tuple[dict, str]:
    """index.json (schema-checked; from a folder or object storage) and its fingerprint (the hash every
    rank must agree on)."""
    from train.data import sources

    index, raw = sources.read_index(shard_dir)
    if not index["classes"]:
        raise UsageError(f"{shard_dir}/index.json lists no classes: there is nothing to classify")
    return index, hashlib.sha256(raw).hexdigest()[:16]


def open_shards(cfg: TrainConfig, d: Dist, plan: BatchPlan, fields: tuple[str, ...], index: dict,
                image_size: int | None = None, mean=None, std=None, tokenize=None) -> DataSource:
    """The real readers over SHARD_DIR (`train.data.reader`); images decoded at ``image_size`` (the
    model's input size) in the dataloader workers, not at the stored size, and normalised with
    ``mean``/``std`` when the model brings its own (else the index's); texts through the model's
    ``tokenize`` when it has one, there too."""
    from train.data.reader import SampleDecodeError, ShardReader, close_loader, make_loader

    if "image" in fields and index.get("image_size") is None:
        raise UsageError(f"{cfg.shard_dir} holds no images, but --model {cfg.model} reads them: use --model text")

    def reader(split: str):
        return ShardReader(cfg.shard_dir, split=split, rank=d.rank, world_size=d.world_size, batch_size=plan.batch_size,
                           seed=cfg.seed, shuffle_buffer=cfg.shuffle_buffer, fields=fields, max_text_len=cfg.max_text_len,
                           image_size=image_size, mean=mean, std=std, tokenize=tokenize,
                           cache_dir=cfg.cache_dir, cache_max_bytes=cfg.cache_max_bytes)

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
        # a tokenizer's ids: 1 is a valid id in every vocabulary; all positions attended (the worst case)
        "input_ids": torch.ones(size, cfg.max_text_len, dtype=torch.long, device=device),
        "attention_mask": torch.ones(size, cfg.max_text_len, dtype=torch.long, device=device),
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
        cores = available_cores()  # the cgroup quota too: a --cpus=2 container on a 64-core host has 2
    return max(1, cores // max(1, local_ranks) - workers)


def _majority_share(index: dict) -> float | None:
    """The share of the val split's commonest class: the accuracy of a model that learned nothing
    but the class balance (index.json's counts; None without val samples)."""
    per_class = index["counts"]["val"]["per_class"]
    total = sum(per_class.values())
    return max(per_class.values()) / total if total else None


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
    `pipe train` made the same checks before any rank started (`train.config.continues_run`,
    `resume_conflict`); here they also decide for a rank the elastic agent restarted, and the
    checkpoint must come from this dataset."""
    found = ckpt.last_checkpoint(run_dir)
    seen = distributed.broadcast_object(None if found is None else found.name, d)  # rank 0's view
    if not continues_run(run_dir, cfg.resume, seen is not None):
        return None
    last = run_dir / seen
    if not last.exists():
        raise StageFailed(f"rank {d.rank} on {d.host} cannot see {last} that rank 0 sees: RUN_DIR must be on storage "
                          "every node shares")
    state = ckpt.load(last)
    if ckpt.is_sharded(last) != (cfg.strategy == "fsdp"):
        made = "fsdp" if ckpt.is_sharded(last) else "ddp"
        raise UsageError(f"--resume: {last} was written by --strategy {made}; resume it with --strategy {made}")
    if state.get("dataset_fingerprint") != fingerprint:
        raise UsageError(f"{last} was trained on another dataset (index hash {state.get('dataset_fingerprint')}, now "
                         f"{fingerprint}); start a new run with -o and --init-from {last} to fine-tune from it")
    conflict = resume_conflict(state.get("config") or {}, {**cfg.as_dict(), "global_batch": plan.global_batch})
    if conflict:
        raise UsageError(conflict)
    return state


def _last_trained_epoch(saved: dict) -> int:
    """The last epoch (from 0) in which the checkpoint's run made an optimizer step. Blocks only
    ever unfreeze, so the parameters trainable then are all that have optimizer state (AdamW makes
    none for a parameter that never had a gradient)."""
    return saved["epoch"] if saved["step_in_epoch"] or saved["epoch"] == 0 else saved["epoch"] - 1


# -- the run ---------------------------------------------------------------------------------------


def main(cfg: TrainConfig) -> dict:
    """What each rank runs under `train.distributed.launch` (our launcher, torchrun, or in-process)."""
    return run(cfg)


def run(cfg: TrainConfig, open_data=open_shards, console=None) -> dict:
    """Train on this rank; returns the summary (the same on every rank). Tears the group down always."""
    with distributed.process_group(cfg.backend) as d:
        return Trainer(cfg, d, open_data, console).fit()


class Trainer:
    """The state of one rank's run; `fit` is the loop."""

    def __init__(self, cfg: TrainConfig, d: Dist, open_data, console=None):
        self.cfg, self.d = cfg, d
        self.console = console or stderr_console()
        self.out = RunConsole(self.console, d.is_main)
        self.run_dir = Path(cfg.output)
        _set_device_flags(d, cfg.workers)

        # 1. what, where, with which batch arithmetic; every rank agrees or nobody starts
        self.plan = resolve_batch(cfg.batch_size, cfg.global_batch, cfg.accum, d.world_size)
        self.index, self.fingerprint = read_index(cfg.shard_dir)

        # 2. the model, identical on every rank (same seed; DDP also broadcasts rank 0's weights);
        # built before the preflight, which compares the input it is fed (`train.models.norm`)
        torch.manual_seed(cfg.seed)
        self.model = build_model(cfg.model, len(self.index["classes"]), index=self.index, width=cfg.width,
                                 resolution=cfg.resolution, max_text_len=cfg.max_text_len,
                                 grad_checkpoint=cfg.grad_checkpoint)
        self.input_norm = input_norm.resolve(self.model, self.index)
        config_hash = preflight.config_hash(cfg.fingerprint(), self._model_input())
        reports = preflight.run(d, self.fingerprint, config_hash, self.console if d.is_main else None)
        self.hosts = [r["host"] for r in reports]
        resume_from = _checkpoint_to_resume(cfg, self.run_dir, self.fingerprint, d, self.plan)
        built = getattr(self.model, "init_report", None)  # the weights an hf: folder brought
        if built is not None and resume_from is None:
            self.out.init_report(built)
        if cfg.init_from is not None and resume_from is None:
            self.out.init_report(load_init(self.model, cfg.init_from))
        if cfg.sync_bn and d.is_distributed:  # before the Freezer: the layers become new modules
            self.out.say(f"sync-bn: {sync_batch_norm(self.model)} BatchNorm layers normalise over the global batch")
        unfreeze = parse_unfreeze_at(cfg.unfreeze_at)
        self.schedule = FreezeSchedule(cfg.freeze, *(unfreeze or (None, 0.0)))
        self.model.to(d.device)
        # Channels-last on CPU: oneDNN's convolutions then skip a layout reorder per call, and a
        # training step of the built-in image model takes ~1.4x less time. Only for the built-in
        # models: a user's model may .view() its feature maps, which channels-last tensors refuse.
        # (A torchvision ResNet-18 trained no faster with it: bench/train.py --resnet.)
        # FSDP2 shards contiguous parameters only: no channels-last under --strategy fsdp.
        self.channels_last = d.device.type == "cpu" and cfg.model in BUILTIN_MODELS and cfg.strategy != "fsdp"
        if self.channels_last:
            self.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload, unused-ignore]  # torch 2.13 stubs omit memory_format, 2.14 has it
        self.precision = resolve_precision(cfg.precision, d.device)
        self.sharded = cfg.strategy == "fsdp"
        if self.sharded:
            if self.precision == "fp16":
                raise UsageError("--strategy fsdp with fp16: the gradient scaler would skip steps on some ranks' "
                                 "shards only; use --precision bf16 (or fp32)")
            fsdp.shard(self.model, d, self.precision)  # in place: parameters become shards (DTensors)
        self.freezer = Freezer(self.model)  # after sharding: it keeps the parameters the model trains
        if cfg.auto_micro_batch:
            self._probe_batch()

        # 3. data, optimizer, schedule
        reader_input: dict[str, Any] = {}  # the model's own normalisation and tokenizer, when it has them
        if getattr(self.model, "input_norm", None) is not None:
            reader_input.update(mean=self.input_norm.mean, std=self.input_norm.std)
        if getattr(self.model, "tokenize", None) is not None:
            reader_input["tokenize"] = self.model.tokenize
        self.data = open_data(cfg, d, self.plan, reader_fields(self.model), self.index,
                              image_size=reader_image_size(self.model, self.index.get("image_size")), **reader_input)
        check_epoch_fits(self.data.train.steps_per_epoch, self.plan)
        self.steps_per_epoch = self.data.train.steps_per_epoch // self.plan.accum
        per_epochs = cfg.epochs * self.steps_per_epoch
        self.total_steps = min(per_epochs, cfg.max_steps) if cfg.max_steps else per_epochs
        warmup = warmup_steps(cfg, self.total_steps)
        self.optimizer = make_optimizer(self.model, cfg)
        self.scheduler = make_scheduler(self.optimizer, cfg, self.total_steps, warmup)
        self.scaler = torch.amp.GradScaler(d.device.type, enabled=self.precision == "fp16")
        self.state = self._restore(resume_from) if resume_from is not None else TrainState()
        self.wrapped: nn.Module | None = None
        self.frozen: float | None = None
        self.margins = MarginRecorder(self.run_dir, d.rank, d.world_size, start_step=self.state.step)  # for pipe labels
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
        best = self.run_dir / (ckpt.BEST_DCP if self.sharded else ckpt.BEST)
        self.out.summary(self.run_dir, summary, has_best=best.exists(), sharded=self.sharded)
        return summary

    def _train_epoch(self, epoch: int) -> bool:
        """Optimizer steps until the epoch ends (True) or --max-steps is reached (False)."""
        cfg, d, plan, state = self.cfg, self.d, self.plan, self.state
        # the reader continues mid-epoch: samples this rank already consumed in this epoch
        self.data.train.set_epoch(epoch, consumed=state.step_in_epoch * plan.accum * plan.batch_size)
        batches = self._batches(self.data.train, f"epoch {epoch + 1}")
        self.freezer.train_mode()  # frozen BatchNorm layers stay in eval mode
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
                    self.monitor.log(state.step, epoch, cfg.epochs, float(self.scheduler.get_last_lr()[0]))
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
        if model is None:  # wrapped at each epoch's start, before any step
            raise RuntimeError("internal: a training step before the model was wrapped for the epoch")
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
        self.freezer.train_mode()
        distributed.all_reduce_sum(sums, d)
        loss_sum, correct, n = sums.tolist()
        if n == 0:
            return None
        val = (loss_sum / n, correct / n, int(n))
        self.monitor.validation(self.state.step, self.state.epoch, *val)
        self.out.validation(self.state.epoch, *val)
        return val

    # -- freezing --------------------------------------------------------------------------------

    def _apply_freeze(self, epoch: int) -> None:
        fraction = self.schedule.fraction_at(epoch)
        if fraction == self.frozen and self.wrapped is not None:
            return
        state = self.freezer.apply(fraction)
        if self.sharded:  # sharded once; each unit reduces what trains now
            if state.trainable_params == 0:
                raise UsageError("every parameter is frozen: lower --freeze so something trains")
            fsdp.refresh_after_freeze(self.model)
            self.wrapped = self.model
        else:
            # DDP registered the trainable parameters when it was built: a new set needs a new wrapper,
            # or the newly unfrozen parameters would never be all-reduced and ranks would drift apart.
            self.wrapped = distributed.wrap(self.model, self.d) if self.wrapped is None else distributed.rewrap(self.wrapped, self.d)
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

    # -- auto micro-batch --------------------------------------------------------------------------

    def _probe_batch(self) -> None:
        if self.d.device.type != "cuda":
            self.out.say("auto-micro-batch: nothing to probe on CPU (an out-of-memory there is not recoverable); "
                         "keeping " + self.plan.describe())
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
        self.plan = probe_micro_batch(self.plan, try_batch, self.d, self.out.say,
                                      lambda p: oom_message(self.d, p, self.precision, self.cfg.grad_checkpoint))
        if self.plan != before:
            self.out.say(f"auto-micro-batch: training with {self.plan.describe()}")

    # -- checkpoints -------------------------------------------------------------------------------

    def _save(self, best: bool = False, val: tuple | None = None) -> None:
        """Every rank calls this (the RNG states are gathered); rank 0 writes."""
        self.margins.flush(self.state.step)  # before the gather: every rank's records precede last.pt
        rngs = distributed.all_gather_object(ckpt.rng_state(), self.d)
        if best and val is not None:  # a best checkpoint always comes with its validation
            self.state.best_val_loss, self.state.best_val_acc = val[0], val[1]
        # the train reader's position: the epoch in progress and the samples this rank consumed
        # (reader steps are micro-batches); it also records the layout it is valid for
        reader = {**self.data.train.state_dict(self.state.step_in_epoch * self.plan.accum), "epoch": self.state.epoch}
        if self.sharded:  # every rank writes its shards; one folder name for all of them
            token = distributed.broadcast_object(uuid.uuid4().hex[:8], self.d)
            ckpt.save_sharded(self.run_dir, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                              scaler=self.scaler, state=self.state, reader=reader, rngs=rngs, config=self._resolved(),
                              fingerprint=self.fingerprint, best=best, token=token, is_main=self.d.is_main)
            return
        if not self.d.is_main:
            return
        ckpt.save(self.run_dir, model=unwrap(self.model), optimizer=self.optimizer, scheduler=self.scheduler,
                  scaler=self.scaler, state=self.state, reader=reader, rngs=rngs, config=self._resolved(),
                  fingerprint=self.fingerprint, best=best)

    def _restore(self, saved: dict) -> TrainState:
        """The weights, optimizer, schedule, scaler and RNG states of ``saved``, and the reader where
        it was: mid-epoch exactly, or from the epoch's start when the batch layout changed."""
        if ckpt.SHARDED_FROM in saved:  # DCP fills optimizer state for what trains now: make that what had trained
            self.freezer.apply(self.schedule.fraction_at(_last_trained_epoch(saved)))
        s = ckpt.restore(saved, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                         scaler=self.scaler, rank=self.d.rank, world_size=self.d.world_size)
        if s.step_in_epoch:
            try:
                self.data.train.load_state_dict(saved["reader"])  # checks world size, batch, workers, seed, ...
            except ValueError as e:
                # the position is "samples each rank consumed" in the old layout; in a new one it means
                # other samples, so the epoch restarts rather than skipping samples silently
                self.out.epoch_restarts(str(e), s.epoch)
                s.step -= s.step_in_epoch
                s.step_in_epoch = 0
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
            self.out.say(f"input: {self.input_norm.describe(self.data.train.image_size)}")
        tokenize = getattr(self.model, "tokenize", None)
        if tokenize is not None and hasattr(tokenize, "describe"):
            self.out.say(f"input: {tokenize.describe()}")
        self.out.setup(self.cfg, self.plan, params=sum(p.numel() for p in self.model.parameters()),
                       precision=self.precision, backend=self.d.backend, steps_per_epoch=self.steps_per_epoch,
                       total_steps=self.total_steps, warmup=warmup,
                       decoded_at=self.data.train.image_size if reads_images else None,
                       stored=self.index.get("image_size"), threads=torch.get_num_threads())
