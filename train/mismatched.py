"""`pipe labels RUN_DIR` on a contrastive run: the image-caption pairs whose caption looks like it
belongs to another image. No torch here (like `train.labels`).

The signal, recorded by `pipe train` (`train.components.pair_records`), is each pair's *caption
margin*: the cosine similarity of the caption with its own image minus that with the best other
image it was compared with (the images of its global batch in training, every image of the split
at validation; near copies of its own image left out, images with the same caption not: a caption
that fits the images it sits on elsewhere better than this one is the mismatch). A correct pair's
margin is near 0 (other images like its own fit about as well), a mismatched one's well below: its
caption fits the images of its own kind better than the image it sits on.

What is flagged is what stands out from the run's own pairs, not a fixed threshold (margins
depend on the model, the batch and the epoch): per epoch the margins are put on a robust scale
(minus their median, divided by 1.4826 x their median absolute deviation: a standard deviation for
the bulk, unmoved by the few outliers), averaged per pair over the epochs it was trained in (as the
area under the margin averages a classifier's, `train.labels`); a pair is flagged when that mean is
below -`THRESHOLD` *and* its mean margin is below 0 (another image fits its caption better). Val
pairs are judged the same way on the last validation (out of sample: one record each). Ranked by
how far below, most first. Measured on tests/captioned.py's colours with 5% of the captions moved
to another class's pictures: precision and recall 1.0 on 400 pairs (test_mismatched).

Rows go to the same ``label_issues.parquet`` as label issues: ``given`` is the caption (cut at
`CAPTION_CHARS`), ``suggested`` empty (no caption to suggest), ``source`` the image's source file,
``score`` the robust deviations below the run's typical margin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.core.errors import UsageError
from train.labels import Findings, members, record_files, sources

THRESHOLD = 3.0  # robust standard deviations below the run's typical caption margin
CAPTION_CHARS = 200
MAD_TO_SD = 1.4826  # the median absolute deviation of a normal distribution, in standard deviations


def _table(run_dir: Path, split: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = [(step, p) for s, _, step, p in record_files(run_dir) if s == split]
    if split == "val" and files:  # the last validation only
        last = max(step for step, _ in files)
        files = [(step, p) for step, p in files if step == last]
    tables = [pq.read_table(p) for _, p in files]
    if not tables:
        return None
    table = pa.concat_tables(tables)
    if "caption_margin" not in table.column_names:
        raise UsageError(f"{run_dir}/margins holds a classifier's records, but config.json says --objective contrastive")
    return table


def robust_z(values: np.ndarray) -> np.ndarray:
    """``values`` minus their median, over MAD_TO_SD x their median absolute deviation."""
    med = np.median(values)
    spread = MAD_TO_SD * np.median(np.abs(values - med))
    return (values - med) / max(spread, 1e-12)


def scores(keys: list[str], epochs: np.ndarray, margins: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray, int]:
    """Per key: its mean robust z over the epochs (each epoch scaled on its own), its mean margin,
    and how many epochs there were. A (key, epoch) recorded twice keeps the later record."""
    uniq, inverse = np.unique(np.asarray(keys, dtype=str), return_inverse=True)
    pair = inverse.astype(np.int64) * (int(epochs.max()) + 1) + epochs
    _, last = np.unique(pair[::-1], return_index=True)
    keep = np.sort(len(pair) - 1 - last)
    inverse, epochs, margins = inverse[keep], epochs[keep], margins[keep].astype(np.float64)
    z = np.empty(len(margins))
    for e in np.unique(epochs):
        at = epochs == e
        z[at] = robust_z(margins[at])
    seen = np.bincount(inverse, minlength=len(uniq))
    mean_z = np.bincount(inverse, weights=z, minlength=len(uniq)) / seen
    mean_margin = np.bincount(inverse, weights=margins, minlength=len(uniq)) / seen
    return uniq.tolist(), mean_z, mean_margin, len(np.unique(epochs))


def analyse(train, val) -> Findings:
    """The flagged pairs of the train and val records (pyarrow tables, or None)."""
    if train is None and val is None:
        raise UsageError("the run recorded no caption margins (RUN_DIR/margins is empty): train it with this "
                         "version of pipe train, for at least one checkpoint")
    rows: list[dict] = []
    counts = {"train": 0, "val": 0}
    epochs = 0
    for split, table in (("train", train), ("val", val)):
        if table is None or table.num_rows == 0:
            continue
        keys, z, margin, n_epochs = scores(table.column("key").to_pylist(), table.column("epoch").to_numpy().astype(np.int64),
                                           table.column("caption_margin").to_numpy())
        counts[split] = len(keys)
        epochs = max(epochs, n_epochs) if split == "train" else epochs
        for i in np.flatnonzero((z < -THRESHOLD) & (margin < 0)):
            rows.append({"key": keys[i], "split": split, "given": "", "suggested": "", "score": float(-z[i]),
                         "margin": float(margin[i])})
    rows.sort(key=lambda r: (-r["score"], r["split"], r["key"]))
    for rank, r in enumerate(rows, 1):
        r["rank"] = rank
    total = counts["train"] + counts["val"]
    warnings = []
    if epochs == 1:
        warnings.append("the run trained one epoch: each train pair's margin comes from one batch, a noisy signal "
                        "(more epochs average it)")
    return Findings(rows=rows, rate=len(rows) / total if total else 0.0,
                    rate_from=f"caption margins more than {THRESHOLD:g} robust deviations below the run's typical pair",
                    train_samples=counts["train"], val_samples=counts["val"], epochs=epochs, train_accuracy=None,
                    warnings=warnings, kind="pairs")


def run(run_dir: Path, shards: Path, index: dict) -> Findings:
    """Flag the run's mismatched pairs and fill in each one's image source and caption."""
    findings = analyse(_table(run_dir, "train"), _table(run_dir, "val"))
    wanted = {r["key"] for r in findings.rows}
    found = sources(shards, index, wanted)
    captions = members(shards, index, wanted, "txt")
    for r in findings.rows:
        r["source"] = found.get(r["key"], "")
        r["given"] = captions.get(r["key"], b"").decode("utf-8", errors="replace")[:CAPTION_CHARS]
        r.pop("margin", None)
    return findings
