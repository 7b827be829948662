"""`pipe labels RUN_DIR`: rank the samples whose labels are probably wrong. No torch here.

Two signals, both recorded by `pipe train` (`train/components/margins.py`):

* train samples: the area under the margin (AUM, Pleiss et al. 2020), the mean over epochs of the
  given label's logit minus the largest other. A mislabelled sample is pulled towards its true
  class by every similar sample and towards its given label only by its own gradient: its margin
  stays low or negative for many epochs, where a hard but correct sample's rises.
* val samples: out-of-sample probabilities, from which confident learning (Northcutt et al. 2021)
  estimates the joint of given and true labels: per-class thresholds (the mean probability of
  class j over samples labelled j), the confident joint (each sample counted under its given
  label and the most probable class whose probability reaches that class's threshold),
  calibrated so that its rows sum to the class counts. Its off-diagonal mass is the noise rate.

The estimated rate says how many to flag; AUM says which train samples (the lowest), confident
learning which val samples (per class pair, the ones most confidently of the other class).
Ranked, never thresholded: once a model memorises its training set every margin is high, so a
fixed margin threshold would flag nothing; the run then warns. Nothing is removed: the user
reviews ``label_issues.parquet`` and feeds corrections to `pipe clean --labels`.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.core.errors import UsageError
from pipeline.core.files import atomic_write_bytes, atomic_write_text

ISSUES = "label_issues.parquet"
SUMMARY = "label_issues.json"
COLUMNS = ["rank", "key", "source", "split", "given", "suggested", "score"]
RECORDS = "margins"  # RUN_DIR/margins/{train,val}-rank{R}-step{S}.parquet, written by pipe train
_RECORD = re.compile(r"^(train|val)-rank(\d+)-step(\d+)\.parquet$")
MEMORISED = 0.99  # last-epoch training accuracy from which margins stop separating wrong from right
NEAR_CHANCE = 0.25
"""A model whose last-epoch training accuracy has covered less than this share of the way from
chance (its commonest class's share) to 100% learned next to nothing: its margins rank noise."""
COLUMNS_OF = {"train": {"epoch": "integer", "key": "string", "label": "integer", "rival": "integer",
                        "margin": "floating", "prob": "floating"},
              "val": {"epoch": "integer", "key": "string", "label": "integer", "probs": "list"}}
"""The columns `pipe labels` reads from each kind of record file, and their kinds."""


# -- confident learning (val predictions) ----------------------------------------------------------


def confident_joint(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """C[i, j]: samples labelled i that confidently belong to j (counts, K x K)."""
    k = probs.shape[1]
    thresholds = per_class_thresholds(probs, labels)
    above = probs >= thresholds[None, :]
    masked = np.where(above, probs, -np.inf)
    assigned = masked.argmax(axis=1)
    has = above.any(axis=1)
    joint = np.zeros((k, k), dtype=np.int64)
    np.add.at(joint, (labels[has], assigned[has]), 1)
    return joint


def per_class_thresholds(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Mean predicted probability of class j over the samples labelled j (inf for an absent class:
    nothing is confidently assigned to a class nobody is labelled with)."""
    k = probs.shape[1]
    out = np.full(k, np.inf)
    for j in range(k):
        mine = labels == j
        if mine.any():
            out[j] = probs[mine, j].mean()
    return out


def calibrated_joint(joint: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The confident joint rescaled so row i sums to the count of label i, then to a distribution:
    Q[i, j] estimates P(given = i, true = j)."""
    counts = np.bincount(labels, minlength=joint.shape[0]).astype(float)
    rows = joint.sum(axis=1, keepdims=True).astype(float)
    cal = np.divide(joint * counts[:, None], rows, out=np.zeros(joint.shape), where=rows > 0)
    # a class with samples but no confident row keeps its samples on the diagonal
    empty = (rows[:, 0] == 0) & (counts > 0)
    cal[empty, empty] = counts[empty]
    total = cal.sum()
    return cal / total if total else cal


def noise_rate(q: np.ndarray) -> float:
    return float(1.0 - np.trace(q)) if q.sum() else 0.0


def prune_by_noise_rate(probs: np.ndarray, labels: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Indices of the val samples confident learning flags: for each pair (given i, true j), the
    n * Q[i, j] samples labelled i with the largest P(j) - P(i); never one the model agrees with."""
    n, k = probs.shape
    flagged: set[int] = set()
    for i in range(k):
        mine = np.flatnonzero(labels == i)
        for j in range(k):
            take = int(round(n * q[i, j])) if i != j else 0
            if take <= 0 or not len(mine):
                continue
            gap = probs[mine, j] - probs[mine, i]
            flagged.update(mine[np.argsort(-gap, kind="stable")[:take]].tolist())
    agrees = probs.argmax(axis=1) == labels
    return np.array(sorted(i for i in flagged if not agrees[i]), dtype=np.int64)


# -- reading the records ---------------------------------------------------------------------------


@dataclass
class TrainSignals:
    keys: list[str]
    label: np.ndarray
    aum: np.ndarray
    prob: np.ndarray  # mean probability of the given label over epochs
    rival: np.ndarray  # the commonest strongest-other class over epochs
    epochs: int
    last_epoch_accuracy: float


@dataclass
class ValSignals:
    keys: list[str]
    label: np.ndarray
    probs: np.ndarray
    epoch: int


def _read(paths: list[Path], split: str):
    """The record files as one table of the columns `COLUMNS_OF` names, each file checked: a file
    that is not such a record (damaged, or written by someone else) is one line, never a traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    canonical = pa.schema([(name, {"integer": pa.int64(), "string": pa.string(), "floating": pa.float64(),
                                   "list": pa.list_(pa.float64())}[kind]) for name, kind in COLUMNS_OF[split].items()])
    tables: list = []
    for p in paths:
        try:
            table = pq.read_table(p, columns=list(COLUMNS_OF[split]))
        except (OSError, ValueError, pa.ArrowException) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UsageError(f"{p} is not a readable {split} record of pipe train ({first[:200]})") from None
        wrong = [name for name, kind in COLUMNS_OF[split].items() if not _is_kind(table.schema.field(name).type, kind)]
        if wrong:
            raise UsageError(f"{p} is not a {split} record of pipe train: column {wrong[0]!r} is "
                             f"{table.schema.field(wrong[0]).type}, not {COLUMNS_OF[split][wrong[0]]}")
        try:  # one schema for all (pipe train writes int32 labels and float32 stats; a hand-made file may differ)
            tables.append(table.cast(canonical))
        except (ValueError, pa.ArrowException) as e:
            raise UsageError(f"{p} is not a {split} record of pipe train ({str(e)[:200]})") from None
    return pa.concat_tables(tables) if tables else None


def _is_kind(dtype, kind: str) -> bool:
    import pyarrow.types as t

    if kind == "list":
        return (t.is_list(dtype) or t.is_fixed_size_list(dtype) or t.is_large_list(dtype)) and t.is_floating(dtype.value_type)
    return {"integer": t.is_integer, "string": lambda d: t.is_string(d) or t.is_large_string(d),
            "floating": t.is_floating}[kind](dtype)


def _refuse_non_finite(run_dir: Path, split: str, values, epochs) -> None:
    """Records of a run whose outputs went NaN or inf say nothing about the labels: refused, so no
    "0 flagged" stands for "no label is wrong"."""
    bad = ~np.isfinite(values)
    if bad.ndim > 1:
        bad = bad.any(axis=tuple(range(1, bad.ndim)))
    if bad.any():
        raise UsageError(f"{Path(run_dir) / RECORDS}: {int(bad.sum())} of {len(bad)} {split} records hold NaN or inf "
                         f"(from epoch {int(np.asarray(epochs)[bad].min()) + 1} on): the run diverged and its outputs rank "
                         "nothing; train it again (a lower --lr, --grad-clip, or --precision fp32) before pipe labels")


def _refuse_negative(path: Path, split: str, name: str, values) -> None:
    if len(values) and int(np.min(values)) < 0:
        raise UsageError(f"{Path(path) / RECORDS}: a {split} record has the {name} {int(np.min(values))}: not "
                         "written by pipe train")


def record_files(run_dir: Path) -> list[tuple[str, int, int, Path]]:
    """(split, rank, step, path) of every record file under RUN_DIR/margins, in step order."""
    folder = Path(run_dir) / RECORDS
    if not folder.is_dir():
        return []
    out = []
    for p in folder.iterdir():
        m = _RECORD.match(p.name)
        if m:
            out.append((m.group(1), int(m.group(2)), int(m.group(3)), p))
    return sorted(out, key=lambda r: (r[2], r[1], r[0]))


def record_name(split: str, rank: int, step: int) -> str:
    return f"{split}-rank{rank}-step{step:09d}.parquet"


def load_train(run_dir: Path) -> TrainSignals | None:
    """Per train key: AUM over the epochs it was trained in. A (key, epoch) recorded twice keeps
    the later record (files come in step order)."""
    files = [p for split, _, _, p in record_files(run_dir) if split == "train"]
    table = _read(files, "train")
    if table is None or table.num_rows == 0:
        return None
    if table.column("key").null_count or table.column("label").null_count or table.column("epoch").null_count:
        raise UsageError(f"{Path(run_dir) / RECORDS}: a train record has no key, label or epoch: not written by pipe train")
    uniq, inverse = np.unique(np.asarray(table.column("key").to_pylist(), dtype=str), return_inverse=True)
    epoch = table.column("epoch").to_numpy().astype(np.int64)
    for name in ("epoch", "label", "rival"):
        _refuse_negative(run_dir, "train", name, table.column(name).to_numpy(zero_copy_only=False))
    _refuse_non_finite(run_dir, "train", np.stack([table.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
                                                   for c in ("margin", "prob")], axis=1), epoch)
    # one record per (key, epoch), the last written (a resumed epoch recorded again)
    pair = inverse.astype(np.int64) * (int(epoch.max()) + 1) + epoch
    _, last = np.unique(pair[::-1], return_index=True)
    keep = np.sort(len(pair) - 1 - last)
    inverse, epoch = inverse[keep], epoch[keep]
    label = table.column("label").to_numpy()[keep]
    margin = table.column("margin").to_numpy()[keep].astype(np.float64)
    prob = table.column("prob").to_numpy()[keep].astype(np.float64)
    rival = table.column("rival").to_numpy()[keep]
    n = len(uniq)
    seen = np.bincount(inverse, minlength=n)
    aum = np.bincount(inverse, weights=margin, minlength=n) / seen
    mean_prob = np.bincount(inverse, weights=prob, minlength=n) / seen
    lab = np.zeros(n, dtype=np.int64)
    lab[inverse] = label
    k = int(max(label.max(), rival.max())) + 1
    votes = np.zeros((n, k), dtype=np.int64)
    np.add.at(votes, (inverse, rival), 1)
    last_epoch = int(epoch.max())
    at_last = epoch == last_epoch
    return TrainSignals(keys=uniq.tolist(), label=lab, aum=aum, prob=mean_prob, rival=votes.argmax(axis=1),
                        epochs=int(len(np.unique(epoch))), last_epoch_accuracy=float((margin[at_last] > 0).mean()))


def load_val(run_dir: Path) -> ValSignals | None:
    """The val predictions of the last validation recorded (every rank's part of it)."""
    import pyarrow.compute as pc

    files = [(step, p) for split, _, step, p in record_files(run_dir) if split == "val"]
    if not files:
        return None
    last = max(step for step, _ in files)
    table = _read([p for step, p in files if step == last], "val")
    if table.num_rows == 0:
        return None
    if table.column("key").null_count or table.column("label").null_count or table.column("probs").null_count:
        raise UsageError(f"{Path(run_dir) / RECORDS}: a val record has no key, label or probabilities: not written by "
                         "pipe train")
    _refuse_negative(run_dir, "val", "label", table.column("label").to_numpy(zero_copy_only=False))
    widths = set(pc.list_value_length(table.column("probs")).to_pylist())
    if len(widths) != 1:
        raise UsageError(f"{Path(run_dir) / RECORDS}: val records with {sorted(widths)} probabilities: not written by "
                         "pipe train")
    keys = table.column("key").to_pylist()
    first: dict[str, int] = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    keep = np.array(sorted(first.values()), dtype=np.int64)
    probs = np.asarray(table.column("probs").combine_chunks().flatten().to_numpy(zero_copy_only=False), dtype=np.float64)
    probs = probs.reshape(table.num_rows, -1)[keep]
    _refuse_non_finite(run_dir, "val", probs, table.column("epoch").to_numpy()[keep])
    return ValSignals(keys=[keys[i] for i in keep], label=table.column("label").to_numpy()[keep].astype(np.int64),
                      probs=probs, epoch=int(table.column("epoch").to_numpy().max()))


# -- where each flagged sample came from -------------------------------------------------------------


def sources(shard_dir: Path, index: dict, wanted: set[str]) -> dict[str, str]:
    """key -> the source file (path relative to clean's INPUT) of the ``wanted`` keys, from the
    .json member of their shard sample."""
    from pipeline.formats.sample import META_EXT

    return {key: _source(data) for key, data in members(shard_dir, index, wanted, META_EXT).items()}


def members(shard_dir: Path, index: dict, wanted: set[str], ext: str) -> dict[str, bytes]:
    """key -> the bytes of the ``ext`` member of the ``wanted`` keys' samples. One 512-byte header
    read per sample finds the keys (index.json has each sample's offset); only the wanted samples
    are read whole."""
    from pipeline.formats import tarstream
    from pipeline.formats.sample import member_name, split_name

    found: dict[str, bytes] = {}
    for shard in index.get("shards", []):
        if len(found) == len(wanted):
            break
        offsets, end = shard["offsets"], shard["bytes"] - len(tarstream.END_OF_ARCHIVE)
        try:
            fd = os.open(Path(shard_dir) / shard["name"], os.O_RDONLY)
        except OSError:
            continue
        try:
            for i, at in enumerate(offsets):
                name = os.pread(fd, tarstream.MAX_NAME, at).split(b"\0", 1)[0].decode("ascii", "replace")
                try:
                    key = split_name(name)[0]
                except ValueError:  # in no sample
                    continue
                if key not in wanted or key in found:
                    continue
                stop = offsets[i + 1] if i + 1 < len(offsets) else end
                span = memoryview(os.pread(fd, stop - at, at))
                member = member_name(key, ext)
                for named, pos, size in tarstream.members(span):
                    if named == member:
                        found[key] = bytes(span[pos + tarstream.BLOCK: pos + tarstream.BLOCK + size])
        except (OSError, ValueError):
            pass  # a damaged shard: `pipe check` says so; its samples keep an empty source
        finally:
            os.close(fd)
    return found


def _source(meta: bytes) -> str:
    try:
        src = json.loads(meta).get("sources") or {}
    except (ValueError, AttributeError):
        return ""
    return str(src.get("image") or src.get("text") or "")


# -- the analysis ------------------------------------------------------------------------------------


@dataclass
class Findings:
    rows: list[dict]
    rate: float
    rate_from: str
    train_samples: int
    val_samples: int
    epochs: int
    train_accuracy: float | None
    pairs: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    kind: str = "labels"
    """labels (a classifier's label issues) or pairs (a contrastive run's mismatched pairs, `train.mismatched`)."""
    finding: str | None = None
    """What makes the flags themselves untrustworthy (a model near chance on its own training
    data): said first, before any flag, in the summary and on the terminal."""

    def interval(self) -> tuple[float, float]:
        """A rough 95% interval of the rate (normal approximation over the samples it came from):
        a small val split gives a wide one, and the flagged count is only as good as the rate."""
        n = self.val_samples if self.rate_from.startswith("validation") else self.train_samples
        half = 1.96 * (self.rate * (1 - self.rate) / n) ** 0.5 if n else 0.0
        return max(0.0, self.rate - half), min(1.0, self.rate + half)

    def summary(self) -> dict:
        by_split = Counter(r["split"] for r in self.rows)
        return {"estimated_noise_rate": round(self.rate, 6), "estimated_noise_rate_95": [round(x, 6) for x in self.interval()],
                "estimated_from": self.rate_from,
                "train_samples": self.train_samples, "val_samples": self.val_samples, "epochs_recorded": self.epochs,
                "last_epoch_train_accuracy": self.train_accuracy,
                "flagged": {"train": by_split.get("train", 0), "val": by_split.get("val", 0), "total": len(self.rows)},
                "pairs": self.pairs, "warnings": self.warnings, "finding": self.finding}


def analyse(train: TrainSignals | None, val: ValSignals | None, classes: list[str]) -> Findings:
    """Which samples to flag and how sure: see the module docstring."""
    if train is None and val is None:
        raise UsageError("the run recorded no margins (RUN_DIR/margins is empty): train it with this "
                         "version of pipe train, for at least one checkpoint")
    warnings: list[str] = []
    rows: list[dict] = []
    rate, rate_from = 0.0, "validation predictions (confident learning)"
    if val is not None and len(val.keys):
        q = calibrated_joint(confident_joint(val.probs, val.label), val.label)
        rate = noise_rate(q)
        for i in prune_by_noise_rate(val.probs, val.label, q):
            p = val.probs[i]
            others = p.copy()
            others[val.label[i]] = -np.inf
            rows.append({"key": val.keys[i], "split": "val", "given": int(val.label[i]),
                         "suggested": int(others.argmax()), "score": float(1.0 - p[val.label[i]])})
    elif train is not None:
        rate = float((train.aum < 0).mean())
        rate_from = "share of train samples with a negative AUM (no validation predictions)"
        warnings.append("no validation predictions were recorded (no val split?): the noise rate is the share "
                        "of train samples with a negative margin, a rougher estimate")
    if train is not None:
        flag = int(round(rate * len(train.keys)))
        for i in np.argsort(train.aum, kind="stable")[:flag]:
            rows.append({"key": train.keys[i], "split": "train", "given": int(train.label[i]),
                         "suggested": int(train.rival[i]), "score": float(1.0 - train.prob[i])})
        if train.last_epoch_accuracy >= MEMORISED:
            warnings.append(f"training accuracy in the last epoch is {train.last_epoch_accuracy:.1%}: the model "
                            "memorised its training set: its late margins are high for wrong labels too, so the "
                            "ranking rests on the earlier epochs (fewer epochs would sharpen it)")
    n_val = len(val.keys) if val is not None and len(val.keys) else 0
    half = 1.96 * (rate * (1 - rate) / n_val) ** 0.5 if n_val else 0.0
    if rate > 0 and half > rate / 3:
        warnings.append(f"the noise rate comes from only {n_val} val samples ({rate:.1%} +- {half:.1%}): "
                        "the number flagged is as uncertain; a larger val split (pipe shard --val-fraction) narrows it")
    rows.sort(key=lambda r: (-r["score"], r["split"], r["key"]))
    for rank, r in enumerate(rows, 1):
        r["rank"] = rank

    def name(c: int) -> str:
        return classes[c] if 0 <= c < len(classes) else str(c)

    pairs = Counter((name(r["given"]), name(r["suggested"])) for r in rows)
    for r in rows:
        r["given"], r["suggested"] = name(r["given"]), name(r["suggested"])
    return Findings(rows=rows, rate=rate, rate_from=rate_from, train_samples=len(train.keys) if train else 0,
                    val_samples=len(val.keys) if val else 0, epochs=train.epochs if train else 0,
                    train_accuracy=train.last_epoch_accuracy if train else None,
                    pairs=[{"given": g, "suggested": s, "count": n} for (g, s), n in
                           sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))],
                    warnings=warnings, finding=near_chance(train, len(rows)))


def near_chance(train: TrainSignals | None, flagged: int) -> str | None:
    """The finding for a model that learned next to nothing, even on the samples it trained on: its
    last-epoch training accuracy is within `NEAR_CHANCE` of the way from chance (the commonest given
    label's share: what answering that class always scores) to 100%. Its margins are low for every
    sample, right or wrong, so whatever it flags (and the class pairs "that look like" others) is
    noise; None for a model that learned."""
    if train is None or not len(train.keys):
        return None
    chance = float(np.bincount(train.label).max() / len(train.label))
    accuracy = train.last_epoch_accuracy
    if accuracy >= chance + NEAR_CHANCE * (1.0 - chance):
        return None
    return (f"the model is near chance on its own training data (last-epoch training accuracy {accuracy:.1%}; "
            f"always answering the commonest class scores {chance:.1%}): it learned too little for its margins to "
            f"say which labels are wrong, so the {flagged} flagged samples are not evidence; train longer, with a "
            "higher --lr or a larger model, then run pipe labels again")


def write(run_dir: Path, findings: Findings) -> None:
    """label_issues.parquet (the columns `pipe report` reads) and label_issues.json, atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = findings.rows
    table = pa.table({
        "rank": pa.array([r["rank"] for r in rows], pa.int64()),
        "key": pa.array([r["key"] for r in rows], pa.string()),
        "source": pa.array([r.get("source", "") for r in rows], pa.string()),
        "split": pa.array([r["split"] for r in rows], pa.string()),
        "given": pa.array([r["given"] for r in rows], pa.string()),
        "suggested": pa.array([r["suggested"] for r in rows], pa.string()),
        "score": pa.array([r["score"] for r in rows], pa.float64()),
    })
    buf = io.BytesIO()
    pq.write_table(table, buf)
    atomic_write_bytes(Path(run_dir) / ISSUES, buf.getvalue())
    atomic_write_text(Path(run_dir) / SUMMARY, json.dumps(findings.summary(), indent=2, ensure_ascii=False) + "\n")


def objective_of(run_dir: Path) -> str:
    """The run's --objective (config.json; classify for a run of an older pipe)."""
    try:
        return str(json.loads((Path(run_dir) / "config.json").read_text()).get("objective") or "classify")
    except (OSError, ValueError, AttributeError):
        return "classify"


def shard_dir_of(run_dir: Path, given: Path | None) -> Path:
    if given is not None:
        return given
    try:
        return Path(json.loads((Path(run_dir) / "config.json").read_text())["shard_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"{run_dir}/config.json does not name the run's SHARD_DIR: pass --shards") from None


def open_run(run_dir: Path, shard_dir: Path | None = None) -> tuple[Path, dict]:
    """The run's SHARD_DIR and its index, as the training loop read them; a clear error when gone."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a folder (a RUN_DIR written by pipe train)")
    shards = shard_dir_of(run_dir, shard_dir)
    from pipeline.formats import index as shard_index

    if not shard_index.exists(shards):
        raise UsageError(f"{shards} has no readable index.json (the run's SHARD_DIR moved?): pass --shards")
    return shards, shard_index.load(shards)  # the classes and the shards' offsets


def run(run_dir: Path, shard_dir: Path | None = None) -> Findings:
    """`pipe labels` on a classifier's run: read the records, flag, find sources, write (a
    contrastive run's mismatched pairs: `train.mismatched`)."""
    run_dir = Path(run_dir)
    shards, index = open_run(run_dir, shard_dir)
    classes = list(index["classes"])
    train, val = load_train(run_dir), load_val(run_dir)
    _refuse_other_classes(run_dir, train, val, len(classes))
    findings = analyse(train, val, classes)
    found = sources(shards, index, {r["key"] for r in findings.rows})
    for r in findings.rows:
        r["source"] = found.get(r["key"], "")
    write(run_dir, findings)
    return findings


def _refuse_other_classes(run_dir: Path, train: TrainSignals | None, val: ValSignals | None, k: int) -> None:
    """Records whose labels (or probability vectors) are not of the SHARD_DIR's ``k`` classes were
    made on other data, or not by pipe train: refused rather than named by number."""
    top = [int(train.label.max()), int(train.rival.max())] if train is not None and len(train.keys) else []
    if val is not None and len(val.keys):
        top.append(int(val.label.max()))
        if val.probs.shape[1] != k:
            raise UsageError(f"{Path(run_dir) / RECORDS}: val records over {val.probs.shape[1]} classes, the SHARD_DIR "
                             f"has {k}: the run was trained on other shards (pass its own with --shards)")
    if top and max(top) >= k:
        raise UsageError(f"{Path(run_dir) / RECORDS}: records name class {max(top)}, the SHARD_DIR has {k} classes: the "
                         "run was trained on other shards (pass its own with --shards)")


# -- the command -----------------------------------------------------------------------------------


def print_findings(findings: Findings, run_dir: Path) -> None:
    from rich.table import Table

    from pipeline.core import ui

    s = findings.summary()
    t = Table(title=ui.plain(f"pipe labels -> {run_dir / ISSUES}"), show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column(justify="right")
    lo, hi = findings.interval()
    t.add_row("flagged share" if findings.kind == "pairs" else "estimated noise rate",
              f"{findings.rate:.1%} (95%: {lo:.1%}-{hi:.1%})")
    t.add_row("from", findings.rate_from)
    t.add_row("train samples (epochs)", f"{findings.train_samples:,} ({findings.epochs})")
    t.add_row("val samples", f"{findings.val_samples:,}")
    t.add_row("flagged", f"{s['flagged']['total']:,} ({s['flagged']['train']:,} train, {s['flagged']['val']:,} val)")
    if findings.finding:  # before anything that reads like a result
        ui.out_console.print(f"finding: {ui.shown(findings.finding)}", highlight=False, markup=False)
    ui.out_console.print(t)
    for p in findings.pairs[:10] if not findings.finding else ():
        ui.out_console.print(f"{p['count']} labelled {ui.shown(p['given'])} look like {ui.shown(p['suggested'])}",
                             highlight=False, markup=False)
    if findings.kind == "pairs":
        for line in _pair_lines(findings):
            ui.out_console.print(f"caption fits other images better: {ui.shown(line)}", highlight=False, markup=False)
    for w in findings.warnings:
        ui.err_console.print(f"warning: {ui.shown(w)}", highlight=False, markup=False)
    if findings.kind == "pairs":
        ui.out_console.print("nothing was removed: review the file, then correct those captions in the input folder "
                             "and run pipe clean again", highlight=False, markup=False)
        return
    ui.out_console.print("nothing was removed: review the file, then pass corrected labels to "
                         "pipe clean --labels (see the README)", highlight=False, markup=False)


def _pair_lines(findings: Findings) -> list[str]:
    """The first flagged image-caption pairs, a line each."""
    return [f"{r['split']} {r['key']} ({r['source'] or 'source unknown'}): {json.dumps(r['given'], ensure_ascii=False)}"
            for r in findings.rows[:10]]
