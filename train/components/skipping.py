"""Bad samples mid-stream, on the loop's side: named, recorded, left out of the loss, bounded.

The reader (with ``skip_bad``, `train.data.skips`) hands on a batch whose bad slots are marked
``valid=False`` and listed in ``skipped``. Here:

* `masked_loss`: the mean over the nominal batch with the skipped slots counted as zero. Every
  rank keeps the same steps and collectives and nothing extra is reduced before the backward; the
  step's gradient is that of the global batch without the skipped samples, scaled by its valid
  share (1 - 1/G for one skip in a global batch of G: a smaller step, not another direction).
  Renormalising by the valid count instead would need an all-reduce of the counts before every
  backward. A batch without skips takes the plain path, bit for bit what it was.
* `SkipTracker`: every rank names its skips on its own stderr at once; after every optimizer step
  the ranks add up how many they met (one small all-reduce), and only when there were any they
  gather the entries, so every rank knows every skipped sample: rank 0 appends them to
  ``RUN_DIR/skipped.jsonl`` (shard, key, rank, epoch, step, reason, split, offset), and every
  rank reaches the same verdict on ``--max-skipped`` at the same step (EveryRankStopped on all of
  them, exit 1, naming the samples: no rank left waiting in a collective).

``--max-skipped`` counts distinct train samples (a bad image met in every epoch is one bad
image): ``N`` of them, or ``P%`` of the train split (at least one). Validation skips are named
and recorded but not counted. A checkpoint keeps the file's length and the samples counted so
far (`state`); a resume cuts skipped.jsonl back to that length, like the key record
(`train.components.keys`): the steps after the checkpoint run again and meet their skips again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from train.distributed import group as distributed
from train.distributed.group import Dist
from train.distributed.launch import EveryRankStopped

if TYPE_CHECKING:
    from rich.console import Console

SKIPPED = "skipped.jsonl"
NAMED = 10  # samples a failure names in its one line (the rest are in skipped.jsonl)


def masked_loss(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """Cross-entropy of a training micro-batch; its skipped slots (``valid`` False, listed in
    ``skipped``) add nothing, the mean still over the batch's size (see the module docstring)."""
    labels = batch["label"]
    if not batch.get("skipped"):  # a Python list the reader filled: no device sync to find out
        return F.cross_entropy(logits, labels)
    losses = F.cross_entropy(logits, labels, reduction="none")
    return (losses * batch["valid"].to(losses.dtype)).sum() / len(labels)


def skipped_slots(batch: dict) -> set[int]:
    return {entry[0] for entry in batch.get("skipped") or ()}


class SkipTracker:
    """One rank's view of the run's skipped samples (every rank holds the same after `exchange`)."""

    def __init__(self, run_dir: Path, d: Dist, limit: int, limit_spec: str, console: Console, saved: dict | None):
        self.path = Path(run_dir) / SKIPPED
        self.d, self.limit, self.limit_spec, self.console = d, limit, limit_spec, console
        self._new: list[dict] = []  # this rank's, since the last exchange
        saved = saved or {}
        self.counted: dict[tuple[str, str], dict] = {(s, k): {"shard": s, "key": k} for s, k in saved.get("samples", [])}
        self.size = int(saved.get("bytes", 0))
        if d.is_main:
            self._cut_back(saved)

    def _cut_back(self, saved: dict) -> None:
        """skipped.jsonl as the continued checkpoint left it (rank 0): cut to its length; a fresh run
        (nothing saved) starts an empty one."""
        if not self.path.exists():
            return
        if not saved:
            self.path.unlink()
        elif self.path.stat().st_size != self.size:
            os.truncate(self.path, self.size)

    def seen(self, split: str, epoch: int, step: int, skipped: list) -> None:
        """A batch's ``skipped`` entries (slot, shard, key, offset, reason): named now, exchanged later."""
        for _, shard, key, offset, reason in skipped:
            row = {"shard": shard, "key": key, "rank": self.d.rank, "epoch": epoch + 1, "step": step, "reason": reason,
                   "split": split, "offset": offset}
            self._new.append(row)
            self.console.print(f"skipped: rank {self.d.rank}, {split} epoch {epoch + 1}, step {step}: {shard}: sample "
                               f"{key} (byte offset {offset}): {reason}", highlight=False, markup=False)

    def exchange(self, count: bool) -> None:
        """Every rank calls this at the same point: the new skips of all ranks become every rank's
        (rank 0 appends them to skipped.jsonl); with ``count`` (train), past ``--max-skipped``
        every rank stops (EveryRankStopped, exit 1; not restarted)."""
        n = torch.tensor([len(self._new)], dtype=torch.int64, device=self.d.device)
        if int(distributed.all_reduce_sum(n, self.d).item()) == 0:
            return
        rows = [row for part in distributed.all_gather_object(self._new, self.d) for row in part]
        self._new = []
        if self.d.is_main:
            self._append(rows)
        if count:
            for row in rows:
                if row["split"] == "train":
                    self.counted.setdefault((row["shard"], row["key"]), row)
            if len(self.counted) > self.limit:
                raise EveryRankStopped(self._exceeded())

    def _append(self, rows: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
            f.flush()
            os.fsync(f.fileno())
            self.size = f.tell()

    def _exceeded(self) -> str:
        rows = list(self.counted.values())
        named = ", ".join(f"{r['shard']}:{r['key']}" + (f" ({r['reason']})" if "reason" in r else "") for r in rows[:NAMED])
        more = f" and {len(rows) - NAMED} more" if len(rows) > NAMED else ""
        return (f"--max-skipped {self.limit_spec} ({self.limit} sample{'s' if self.limit != 1 else ''}) exceeded: "
                f"{len(rows)} train sample{'s' if len(rows) != 1 else ''} could not be read or decoded: {named}{more}; "
                f"every one is in {self.path}")

    def state(self) -> dict:
        """For the checkpoint (rank 0's view is every rank's after an exchange)."""
        return {"bytes": self.size, "samples": [[s, k] for s, k in self.counted]}

    @property
    def total(self) -> int:
        return len(self.counted)
