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

Under --strategy fsdp no rank holds the whole model, so the checkpoint is a folder written by every
rank through ``torch.distributed.checkpoint`` (DCP): each rank writes its shards of the model and
of the optimizer state (keyed by parameter name, `get_state_dict`), rank 0 the ``.metadata`` that
maps them and ``state.pt``, the same plain values as ``last.pt`` without model and optimizer.
DCP reshards on load, so a run saved on 2 ranks resumes on 1 or 4. Written as
``RUN_DIR/dcp/step-S-T.tmp`` (T: a token rank 0 draws), ``COMPLETE`` written last, renamed to
``RUN_DIR/dcp/step-S-T``, and then ``RUN_DIR/last.dcp`` (and ``best.dcp``) re-pointed to it, a
symbolic link replaced by rename: ``last.dcp`` is always a complete checkpoint, the previous or the
new one. Folders no link points to any more are deleted after.
"""

from __future__ import annotations

import errno
import math
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch

from pipeline.core.errors import StageFailed, UsageError
from train.components import safe_load

CHECKPOINT_FORMAT = "pipe-train-checkpoint/1"
LAST = "last.pt"
BEST = "best.pt"
LAST_DCP = "last.dcp"
BEST_DCP = "best.dcp"
DCP_FOLDER = "dcp"
DCP_STATE = "state.pt"
DCP_COMPLETE = "COMPLETE"


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


def _plain(*, scheduler, scaler, state: TrainState, reader: dict, rngs: list, config: dict, fingerprint: str,
           records: dict | None = None) -> dict:
    """What a checkpoint holds besides the model and the optimizer (both formats). ``records``:
    what the run's per-sample records were when it was written (`train.components.keys.Records`)."""
    return {
        "format": CHECKPOINT_FORMAT,
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "epoch": state.epoch, "step": state.step, "step_in_epoch": state.step_in_epoch,
        "best_val_loss": state.best_val_loss, "best_val_acc": state.best_val_acc,
        "reader": reader,
        "rng": rngs,
        "config": config,
        "dataset_fingerprint": fingerprint,
        "records": records or {},
    }


def save(run_dir: Path, *, model, optimizer, scheduler, scaler, state: TrainState, reader: dict, rngs: list,
         config: dict, fingerprint: str, best: bool, records: dict | None = None) -> None:
    """Write RUN_DIR/last.pt (rank 0 only); with ``best``, best.pt becomes that file too.
    ``model`` is the bare module (no DDP wrapper: its names carry no ``module.`` prefix);
    ``reader`` the train reader's position, ``rngs`` every rank's RNG states (rank order)."""
    plain = _plain(scheduler=scheduler, scaler=scaler, state=state, reader=reader, rngs=rngs, config=config,
                   fingerprint=fingerprint, records=records)
    save_atomic({"format": CHECKPOINT_FORMAT, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 **plain}, run_dir / LAST)
    if best:
        mark_best(run_dir)


def save_sharded(run_dir: Path, *, model, optimizer, scheduler, scaler, state: TrainState, reader: dict | None,
                 rngs: list, config: dict, fingerprint: str, best: bool, token: str, is_main: bool,
                 records: dict | None = None) -> None:
    """Write the --strategy fsdp checkpoint (every rank calls this, with the same ``token``): the
    model's and optimizer's shards through DCP into a temporary folder, then (rank 0) state.pt,
    COMPLETE, the rename, and last.dcp (best.dcp) pointed at it. ``reader`` is rank 0's position."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = Path(run_dir) / DCP_FOLDER
    name = f"step-{state.step:09d}-{token}"
    tmp = folder / f"{name}.tmp"
    model_sd, optim_sd = get_state_dict(model, optimizer)
    # every rank writes its shards; rank 0 then gathers what they wrote and writes .metadata last,
    # so when save returns on rank 0 the folder holds the whole model
    try:
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp))
    except Exception as e:  # every rank gets it: DCP gathers the ranks' write results
        full = space_error(e)
        if full is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise StageFailed(no_space(Path(run_dir), f"the checkpoint {DCP_FOLDER}/{name}", full)) from None
    if not is_main:
        return
    plain = _plain(scheduler=scheduler, scaler=scaler, state=state, reader=reader or {}, rngs=rngs, config=config,
                   fingerprint=fingerprint, records=records)
    save_atomic(plain, tmp / DCP_STATE)
    complete = tmp / DCP_COMPLETE
    complete.write_text(f"step {state.step}\n")
    _fsync_file(complete)
    _fsync_dir(tmp)
    os.replace(tmp, folder / name)
    _fsync_dir(folder)
    _point(run_dir, LAST_DCP, name)
    if best:
        _point(run_dir, BEST_DCP, name)
    _prune(run_dir)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _point(run_dir: Path, link: str, name: str) -> None:
    """RUN_DIR/``link`` -> dcp/``name``: a new symbolic link renamed over the old one (atomic)."""
    tmp = Path(run_dir) / f".{link}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    os.symlink(f"{DCP_FOLDER}/{name}", tmp)
    os.replace(tmp, Path(run_dir) / link)
    _fsync_dir(Path(run_dir))


def _prune(run_dir: Path) -> None:
    """Delete the checkpoint folders neither last.dcp nor best.dcp points to (older ones, and
    temporary ones a killed save left)."""
    keep = {os.path.realpath(Path(run_dir) / link) for link in (LAST_DCP, BEST_DCP) if (Path(run_dir) / link).exists()}
    for entry in (Path(run_dir) / DCP_FOLDER).iterdir():
        if os.path.realpath(entry) not in keep:
            shutil.rmtree(entry, ignore_errors=True)


def last_checkpoint(run_dir: Path) -> Path | None:
    """RUN_DIR's last checkpoint: last.pt (DDP, one process) or last.dcp (FSDP); None when it has none.
    When both are there (a run continued with the other strategy), the one of the later step."""
    found = [p for p in (Path(run_dir) / LAST, Path(run_dir) / LAST_DCP) if p.exists()]
    if len(found) < 2:
        return found[0] if found else None
    return max(found, key=lambda p: load(p, mmap=True)["step"])


def is_sharded(path: Path) -> bool:
    """Whether ``path`` is a --strategy fsdp checkpoint (a DCP folder) rather than a last.pt file."""
    return Path(path).is_dir()


def restore(saved: dict, *, model, optimizer, scheduler, scaler, rank: int, world_size: int) -> TrainState:
    """Put a checkpoint's weights, optimizer, schedule and scaler back, and this rank's RNG states
    when the world size is the one that saved them; returns where the run was. The reader's
    position (``saved["reader"]``) is the loop's to continue: it may have to restart the epoch.
    A sharded checkpoint (`load` of a last.dcp folder) is read through DCP into this rank's shards,
    whatever the world size that wrote it (every rank calls this then)."""
    if SHARDED_FROM in saved:
        _load_sharded_weights(Path(saved[SHARDED_FROM]), model, optimizer)
    else:
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
    """torch.save to a temporary name, fsync, rename over ``path``, fsync the folder. A full disk
    (or quota) is `StageFailed` in one line (`no_space`); ``path`` stays what it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writes = None
    try:
        try:
            with open(tmp, "wb") as f:
                writes = _Writes(f)
                torch.save(obj, cast(IO[bytes], writes))  # it calls write and flush only
                f.flush()
                os.fsync(f.fileno())
        except Exception as e:
            full = space_error(e, writes)
            if full is None:
                raise
            tmp.unlink(missing_ok=True)  # give the space back before saying how much there is
            raise StageFailed(no_space(path.parent, f"the checkpoint {path.name}", full)) from None
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""The errors of a write that found no room: the device is full, a quota is reached, a file limit."""


class _Writes:
    """The file torch.save writes through, keeping the OSError of a failed write: torch's own
    error for it is an assertion ("enforce fail at inline_container.cc ... unexpected pos")."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def space_error(e: BaseException, writes: _Writes | None = None) -> OSError | None:
    """The no-room OSError behind ``e`` (itself, the write that failed under it, or one a DCP
    exception carries for some rank: ``failures``, rank -> (exception, traceback)), or None when
    ``e`` is something else."""
    found = [e, getattr(writes, "error", None), e.__cause__, e.__context__]
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict):
        for failure in failures.values():
            failure = failure[0] if isinstance(failure, tuple) and failure else failure
            found += [failure, getattr(failure, "__cause__", None), getattr(failure, "__context__", None)]
    for x in found:
        if isinstance(x, OSError) and x.errno in NO_SPACE:
            return x
    return None


def no_space(folder: Path, what: str, e: OSError) -> str:
    """The one line for a write into RUN_DIR (``folder``) that found no room (``what``: the file),
    and which checkpoint stays."""
    folder = Path(folder)
    try:
        free = f", {shutil.disk_usage(folder).free / 1e6:.1f} MB free"
    except OSError:
        free = ""
    kept = "nothing yet: no checkpoint was written before this one"
    for name in (LAST, LAST_DCP):
        previous = folder / name
        if previous.exists():
            try:
                kept = f"{previous} (step {load(previous, mmap=True)['step']}), intact"
            except Exception:  # the line is about the disk; the checkpoint speaks for itself on --resume
                kept = f"{previous}, as it was"
            break
    return (f"no room to write {what} in {folder} ({e.strerror or e}{free}); the last "
            f"checkpoint stays {kept}: free some space (or give -o a larger disk) and run the same command with "
            "--resume")


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


SHARDED_FROM = "sharded_from"
"""The key `load` adds to a sharded checkpoint's plain values: the folder its tensors are in."""


def _load_sharded_weights(folder: Path, model, optimizer) -> None:
    """DCP reads the saved shards into this rank's (possibly differently sharded) parameters and
    optimizer state, keyed by parameter name. The optimizer's state must exist to be filled:
    `get_state_dict` makes it (a zero step) for the parameters that train now, so the caller
    freezes as the checkpoint's epoch did first (frozen parameters have no state in the file)."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    sd: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd}
    try:
        safe_load.dcp_load(sd, folder)  # never torch's own reader: it would unpickle whatever the folder holds
    except UsageError:
        raise
    except (Exception, CheckpointException) as e:
        raise UsageError(f"{folder} does not fit this model ({type(e).__name__}: "
                         f"{_last_line(e)})") from None
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])


def _last_line(e: BaseException) -> str:
    """The last non-empty line of ``e`` (a CheckpointException ends with its rank's own error)."""
    return next((ln.strip() for ln in reversed(str(e).splitlines()) if ln.strip()), "")


def _load_sharded_plain(path: Path) -> dict:
    """A last.dcp folder's plain values (state.pt), refused unless its COMPLETE marker is there; its
    .metadata is read (through `safe_load.dcp_metadata`) here too, so that a planted one is refused
    wherever the checkpoint is first looked at (before any rank starts, or on a restarted rank)."""
    folder = safe_load.inside_run(Path(path))
    if not (folder / DCP_COMPLETE).exists():
        raise UsageError(f"{path} is not a complete checkpoint (no {DCP_COMPLETE} marker in {folder})")
    safe_load.dcp_check_items(folder, safe_load.dcp_metadata(folder))
    if not safe_load.inside(folder / DCP_STATE, folder):
        raise safe_load.Refused(f"{folder / DCP_STATE} is a link out of its checkpoint folder: refused")
    return {**load(folder / DCP_STATE), SHARDED_FROM: str(folder)}


def load(path: Path, mmap: bool = False) -> dict:
    """A checkpoint written by `save_atomic`, on the CPU, refusing anything but tensors and plain values
    (`safe_load`), and a link out of its run folder.
    ``mmap``: tensors stay in the file until touched (cheap when only the plain values are wanted).
    A last.dcp folder gives its plain values and, under `SHARDED_FROM`, where its tensors are."""
    if Path(path).is_dir():
        return _load_sharded_plain(Path(path))
    if Path(path).is_symlink():
        safe_load.inside_run(Path(path))
    try:
        obj = safe_load.torch_file(path, mmap=mmap)
    except FileNotFoundError:
        raise UsageError(f"no checkpoint at {path}") from None
    except Exception as e:
        raise safe_load.refusal("", path, e, readable="a readable checkpoint") from None
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
