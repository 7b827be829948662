"""Checkpoints that survive a SIGKILL at any instant and hold everything a resume needs.

A checkpoint is one ``torch.save`` file written under a temporary name in RUN_DIR, flushed and
fsynced, then renamed over ``last.pt`` (and the folder fsynced), so ``last.pt`` is always either the
previous complete checkpoint or the new complete one. ``best.pt`` is a hard link to the ``last.pt``
of the best validation so far (a copy where links are not possible): no second write.

Contents (``CHECKPOINT_FORMAT``): model (unwrapped state dict), optimizer, scheduler, grad scaler,
epoch / step / step_in_epoch, the reader's position (epoch, samples each rank consumed, and the
world size and per-rank batch that position is valid for), every rank's RNG states, the resolved
config, the batch plan, the dataset fingerprint and the best validation so far. Everything is
tensors and plain Python values, so it loads with ``weights_only=True``. `save` writes exactly
that; `restore` puts it back (the reader's position is the loop's to continue).
"""

from __future__ import annotations

import math
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.core.errors import UsageError

CHECKPOINT_FORMAT = "pipe-train-checkpoint/1"
LAST = "last.pt"
BEST = "best.pt"


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


# -- what a run's checkpoint holds, and putting it back -----------------------------------------


def save(run_dir: Path, *, model, optimizer, scheduler, scaler, state: TrainState, reader: dict, rngs: list,
         config: dict, fingerprint: str, best: bool) -> None:
    """Write RUN_DIR/last.pt (rank 0 only); with ``best``, best.pt becomes that file too.
    ``model`` is the bare module (no DDP wrapper: its names carry no ``module.`` prefix);
    ``reader`` the train reader's position, ``rngs`` every rank's RNG states (rank order)."""
    save_atomic({
        "format": CHECKPOINT_FORMAT,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "epoch": state.epoch, "step": state.step, "step_in_epoch": state.step_in_epoch,
        "best_val_loss": state.best_val_loss, "best_val_acc": state.best_val_acc,
        "reader": reader,
        "rng": rngs,
        "config": config,
        "dataset_fingerprint": fingerprint,
    }, run_dir / LAST)
    if best:
        mark_best(run_dir)


def restore(saved: dict, *, model, optimizer, scheduler, scaler, rank: int, world_size: int) -> TrainState:
    """Put a checkpoint's weights, optimizer, schedule and scaler back, and this rank's RNG states
    when the world size is the one that saved them; returns where the run was. The reader's
    position (``saved["reader"]``) is the loop's to continue: it may have to restart the epoch."""
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    scaler.load_state_dict(saved["scaler"])
    rngs = saved.get("rng") or []
    if len(rngs) == world_size:
        set_rng_state(rngs[rank])
    return TrainState(epoch=saved["epoch"], step=saved["step"], step_in_epoch=saved["step_in_epoch"],
                      best_val_loss=saved["best_val_loss"], best_val_acc=saved["best_val_acc"])


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(obj: dict, path: Path) -> None:
    """torch.save to a temporary name, fsync, rename over ``path``, fsync the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def mark_best(run_dir: Path) -> None:
    """Make best.pt the current last.pt: a hard link (last.pt is replaced by rename, never
    rewritten in place, so the link keeps this version), else a copy; both via rename."""
    last, best = run_dir / LAST, run_dir / BEST
    tmp = run_dir / f".{BEST}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    try:
        os.link(last, tmp)
    except OSError:
        shutil.copyfile(last, tmp)
    os.replace(tmp, best)
    _fsync_dir(run_dir)


def load(path: Path, mmap: bool = False) -> dict:
    """A checkpoint written by `save_atomic`, on the CPU, refusing anything but tensors and plain values.
    ``mmap``: tensors stay in the file until touched (cheap when only the plain values are wanted)."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise UsageError(f"no checkpoint at {path}") from None
    except Exception as e:
        raise UsageError(f"{path} is not a readable checkpoint ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(obj, dict) or obj.get("format") != CHECKPOINT_FORMAT:
        raise UsageError(f"{path} was not written by pipe train (no {CHECKPOINT_FORMAT!r} marker)")
    return obj


# -- RNG states: plain values so weights_only can load them -------------------------------------


def rng_state() -> dict:
    np_state = np.random.get_state()  # legacy=True (the default): a tuple for numpy's global MT19937 generator
    if not isinstance(np_state, tuple):
        raise AssertionError("numpy's global generator state is not the legacy MT19937 tuple")
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
