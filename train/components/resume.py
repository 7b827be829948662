"""Where a run continues from: the checkpoint to resume (the same answer on every rank, checked
against this run's dataset, strategy and settings), and the last epoch its run trained in."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import StageFailed, UsageError
from train.components import checkpoint as ckpt
from train.config import BatchPlan, TrainConfig, continues_run, resume_conflict
from train.distributed import group as distributed
from train.distributed.group import Dist


def checkpoint_to_resume(cfg: TrainConfig, run_dir: Path, fingerprint: str, d: Dist, plan: BatchPlan) -> dict | None:
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


def last_trained_epoch(saved: dict) -> int:
    """The last epoch (from 0) in which the checkpoint's run made an optimizer step. Blocks only
    ever unfreeze, so the parameters trainable then are all that have optimizer state (AdamW makes
    none for a parameter that never had a gradient)."""
    return saved["epoch"] if saved["step_in_epoch"] or saved["epoch"] == 0 else saved["epoch"] - 1
