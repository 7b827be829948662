"""Checkpoints that survive a SIGKILL at any instant and hold everything a resume needs.

A checkpoint is one ``torch.save`` file written under a temporary name in RUN_DIR, flushed and
fsynced, then renamed over ``last.pt`` (and the folder fsynced), so ``last.pt`` is always either the
previous complete checkpoint or the new complete one. ``best.pt`` is a hard link to the ``last.pt``
of the best validation so far (a copy where links are not possible): no second write.

Contents (``CHECKPOINT_FORMAT``): model (unwrapped state dict), optimizer, scheduler, grad scaler,
epoch / step / step_in_epoch, the reader's position (epoch, samples each rank consumed, and the
world size and per-rank batch that position is valid for), every rank's RNG states, the resolved
config, the batch plan, the dataset fingerprint and the best validation so far. Everything is
tensors and plain Python values, so it loads with ``weights_only=True``.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from pipeline.core.errors import UsageError

CHECKPOINT_FORMAT = "pipe-train-checkpoint/1"
LAST = "last.pt"
BEST = "best.pt"


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
    np_state = np.random.get_state()
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
