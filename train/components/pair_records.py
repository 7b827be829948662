"""Per-pair training signals of a contrastive run, for `pipe labels` (`train.mismatched`).

The same files, lifecycle and guarantees as `train.components.margins.MarginRecorder` (written by
each rank at every checkpoint, before its RNG gather; records after a resumed step deleted), with
one number per sample: its *caption margin*, the cosine similarity of the caption with its own
image minus that with the best other image it was compared with (pairs with the same caption or
near-duplicate group left out). Below 0, the caption fits another image better than its own.

* train: per micro-batch, against the images of the whole global batch (the loss computes the
  similarities anyway: `train.objectives.losses.LossOut.caption_margin`), per epoch;
* val: at each validation, against every image of the val split (`train.evaluation.contrastive.
  pair_margins`), recorded by rank 0 alone (every rank holds the same gathered embeddings).
"""

from __future__ import annotations

from pathlib import Path

import torch

from train.components.margins import MarginRecorder


class PairRecorder(MarginRecorder):
    """One rank's recorder of caption margins (see the module docstring)."""

    def __init__(self, run_dir: Path, rank: int, world_size: int, start_step: int):
        super().__init__(run_dir, rank, world_size, start_step)
        self._pairs_train: list[tuple[int, list[str], torch.Tensor]] = []
        self._pairs_val: list[tuple[int, list[str], torch.Tensor]] = []

    @torch.no_grad()
    def train(self, epoch: int, batch: dict, margins: torch.Tensor) -> None:
        keys = batch.get("key")
        if keys is not None:
            self._pairs_train.append((epoch, list(keys), margins.detach().float()))

    @torch.no_grad()
    def val(self, epoch: int, keys: list[str], margins: torch.Tensor) -> None:  # type: ignore[override]
        if self.rank == 0 and keys:
            self._pairs_val.append((epoch, list(keys), margins.detach().float()))

    def flush(self, step: int) -> None:
        if self._pairs_train:
            self._write("train", step, self._table(self._pairs_train))
        if self._pairs_val:
            last = max(e for e, _, _ in self._pairs_val)  # only the last validation: earlier ones came from an older model
            self._write("val", step, self._table([v for v in self._pairs_val if v[0] == last]))
        self._pairs_train, self._pairs_val = [], []

    @staticmethod
    def _table(parts: list[tuple[int, list[str], torch.Tensor]]):
        import pyarrow as pa

        return pa.table({"epoch": pa.array([e for e, keys, _ in parts for _ in keys], pa.int32()),
                         "key": pa.array([k for _, keys, _ in parts for k in keys], pa.string()),
                         "caption_margin": pa.array(torch.cat([m for _, _, m in parts]).cpu().numpy())})
