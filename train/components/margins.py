"""Per-sample training signals for `pipe labels`: margins, given-label probabilities, losses.

Every rank records, for each train sample it trains on, the logit margin (the given label's logit
minus the largest other one), the probability of the given label and the loss, keyed by sample
key and epoch; and, at each validation, the full probability vector of every val sample it
evaluated (out-of-sample predictions, what confident learning needs). All from the logits the
step computed anyway: a few element-wise operations on a [B, classes] tensor, kept on the device
until the next checkpoint (no host sync per step) and no collective of its own.

Files: ``RUN_DIR/margins/{train,val}-rank{R}-step{S}.parquet``, written atomically by each rank
at every checkpoint, *before* the checkpoint's RNG gather: when rank 0 writes ``last.pt`` at step
S, every rank's records up to S are already on disk. A run resumed from step S deletes the
records written after S (a crash between the records and the checkpoint leaves some): the steps
after S run again and record again, so no sample is counted twice or lost. `train.labels` reads
the folder (no torch).
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from pipeline.core.files import atomic_write_bytes
from train.components.skipping import skipped_slots
from train.labels import RECORDS, record_files, record_name


class MarginRecorder:
    """One rank's recorder; the loop calls `train` per micro-batch, `val` per validation batch,
    `flush` at every checkpoint."""

    def __init__(self, run_dir: Path, rank: int, world_size: int, start_step: int):
        self.folder = Path(run_dir) / RECORDS
        self.rank = rank
        self._train: list[tuple[int, list[str], torch.Tensor, torch.Tensor]] = []  # epoch, keys, [label, rival], [margin, prob, loss]
        self._val: list[tuple[int, list[str], torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        self._forget_after(start_step, world_size)

    def _forget_after(self, step: int, world_size: int) -> None:
        """Delete this rank's records from after ``step`` (rank 0 also those of ranks that no longer
        exist): they belong to steps this run does again."""
        for _, rank, at, path in record_files(self.folder.parent):
            if at > step and (rank == self.rank or (self.rank == 0 and rank >= world_size)):
                path.unlink(missing_ok=True)

    @torch.no_grad()
    def train(self, epoch: int, batch: dict, logits: torch.Tensor) -> None:
        keys = batch.get("key")
        if keys is None:  # a data source without keys (a user's reader): nothing to key records by
            return
        x = logits.detach().float()
        y = batch["label"].view(-1, 1)
        skipped = skipped_slots(batch)
        if skipped:  # bad samples the reader skipped were not trained on: nothing to record
            keep = [i for i in range(len(keys)) if i not in skipped]
            x, y, keys = x[keep], y[keep], [keys[i] for i in keep]
        given = x.gather(1, y)[:, 0]
        # the strongest other class: its logit makes the margin, its index the suggested label
        other, rival = x.scatter(1, y, float("-inf")).max(dim=1) if x.shape[1] > 1 else (given, y[:, 0])
        log_p = x.log_softmax(dim=1).gather(1, y)[:, 0]
        self._train.append((epoch, list(keys), torch.stack([y[:, 0], rival], dim=1),
                            torch.stack([given - other, log_p.exp(), -log_p], dim=1)))

    @torch.no_grad()
    def val(self, epoch: int, batch: dict, logits: torch.Tensor) -> None:
        keys = batch.get("key")
        if keys is None:
            return
        probs = logits.detach().float().softmax(dim=1)
        self._val.append((epoch, list(keys), batch["label"], probs, batch.get("valid")))

    def flush(self, step: int) -> None:
        """Write what was recorded since the last flush (every rank, before the checkpoint)."""
        if self._train:
            self._write("train", step, self._train_table())
        if self._val:
            self._write("val", step, self._val_table())
        self._train, self._val = [], []

    def _train_table(self):
        import pyarrow as pa

        epochs = [e for e, keys, _, _ in self._train for _ in keys]
        keys = [k for _, ks, _, _ in self._train for k in ks]
        classes = torch.cat([c for _, _, c, _ in self._train]).cpu().numpy()
        stats = torch.cat([s for _, _, _, s in self._train]).cpu().numpy()
        return pa.table({"epoch": pa.array(epochs, pa.int32()), "key": pa.array(keys, pa.string()),
                         "label": pa.array(classes[:, 0], pa.int32()), "rival": pa.array(classes[:, 1], pa.int32()),
                         "margin": pa.array(stats[:, 0]),
                         "prob": pa.array(stats[:, 1]), "loss": pa.array(stats[:, 2])})

    def _val_table(self):
        import pyarrow as pa

        # only the last validation since the flush: earlier ones came from an older model
        last = max(e for e, *_ in self._val)
        parts = [v for v in self._val if v[0] == last]
        keep = torch.cat([v if v is not None else torch.ones(len(k), dtype=torch.bool, device=y.device)
                          for _, k, y, _, v in parts]).cpu().numpy()
        keys = [k for _, ks, _, _, _ in parts for k in ks]
        labels = torch.cat([y for _, _, y, _, _ in parts]).cpu().numpy()
        probs = torch.cat([p for _, _, _, p, _ in parts]).cpu().numpy()
        flat = pa.array(probs[keep].reshape(-1))
        return pa.table({"epoch": pa.array([last] * int(keep.sum()), pa.int32()),
                         "key": pa.array([k for k, ok in zip(keys, keep) if ok], pa.string()),
                         "label": pa.array(labels[keep], pa.int32()),
                         "probs": pa.FixedSizeListArray.from_arrays(flat, probs.shape[1])})

    def _write(self, split: str, step: int, table) -> None:
        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(table, buf)
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.folder / record_name(split, self.rank, step), buf.getvalue())
