"""Several SHARD_DIRs trained on together, by weight: `pipe train A_DIR B_DIR --mix 3,1`.

What a mix promises, and how:

* Classes are merged by name: the run's classes are the first source's, then each later source's
  new ones, in their order; every source's class numbers are mapped onto them as its samples are
  read (`Sources.label_maps`).
* Each source's share of every epoch is exact: an epoch is ``K`` samples (all sources' train
  samples together, or ``--epoch-samples``, cut to whole global batches) and source ``i`` gives
  ``n_i`` of them, its weight's share of ``K`` rounded by largest remainders (`shares`): within
  one sample of exact, the same every epoch. Inside the epoch the sources are interleaved a global
  batch's worth at a time, so any stretch of the epoch holds them in those proportions too.
* A source is read as an endless sequence of passes, each a fresh order of all its samples (the
  single-source epoch order, from its own seed and the pass number), and epoch ``e`` takes the
  next ``n_i`` samples of it. Up-sampled (``n_i`` above its size) it shows every sample once before
  any twice; down-sampled, the next epoch continues the pass where this one stopped, instead of
  starting it over (and over-sampling its beginning).
* It is deterministic by seed and resumable exactly, also on another world size: the epoch's
  sequence depends on the sample counts, weights, seed, epoch and global batch only, and the
  reader's plan (`train.data.plan`) cuts it for ranks and workers, and re-cuts what a resume on
  another layout left unread, as it does a single source's.

The sources are read through one combined shard list (source after source; a shard is named
``SOURCE/NAME`` in messages and skipped.jsonl) and one `MultiSource` routing each read to its
folder. The normalisation is the mixture's: each source's mean and variance weighted by its
share. Validation reads each source's val split apart (`only`), so metrics come per source and
together. The dataset fingerprint the preflight compares and a checkpoint keeps covers every
source's index.json, the weights and ``--epoch-samples``.

No torch here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from pipeline.core.errors import UsageError
from train.data import sources as storage
from train.data.plan import Segment, cut, epoch_sequence, rng

MIX_STREAM = 5  # the rng stream each source's passes are drawn from (after the plan's 1-3)


def parse_weights(text: str | None, n: int) -> tuple[Fraction, ...]:
    """``--mix 3,1`` -> (3, 1); one positive number per source (default: all equal)."""
    if text is None or not str(text).strip():
        return tuple(Fraction(1) for _ in range(n))
    parts = [p.strip() for p in str(text).split(",")]
    try:
        weights = tuple(Fraction(p) for p in parts)
    except (ValueError, ZeroDivisionError):
        raise UsageError(f"--mix {text!r} is not a comma-separated list of numbers, e.g. 3,1") from None
    if len(weights) != n:
        raise UsageError(f"--mix {text} gives {len(weights)} weight{'s' if len(weights) != 1 else ''} for {n} SHARD_DIRs: "
                         "give one per folder, in their order")
    if any(w <= 0 for w in weights):
        raise UsageError(f"--mix {text}: every weight must be positive (leave a folder out rather than weigh it 0)")
    return weights


def shares(total: int, weights: tuple[Fraction, ...]) -> list[int]:
    """``total`` samples apportioned by ``weights``: floors of the exact quotas, the rest one each
    to the largest remainders (the earlier source on a tie). Sums to ``total``; each share is
    within one sample of its exact quota."""
    whole = sum(weights)
    quotas = [total * w / whole for w in weights]
    out = [math.floor(q) for q in quotas]
    for i in sorted(range(len(weights)), key=lambda i: (-(quotas[i] - out[i]), i))[: total - sum(out)]:
        out[i] += 1
    return out


@dataclass(frozen=True)
class Mix:
    """The plan's view of a mix (`train.data.plan.epoch_plan`'s ``mix``): which of the combined
    shards each source owns (``bounds[i]`` to ``bounds[i + 1]``), its weight, the epoch's size."""

    bounds: tuple[int, ...]
    weights: tuple[Fraction, ...]
    epoch_samples: int | None = None

    def epoch_size(self, counts: list[int], per_step: int) -> int:
        """Samples per epoch: all sources' (or ``epoch_samples``), in whole global batches."""
        total = self.epoch_samples if self.epoch_samples is not None else sum(counts)
        return total // per_step * per_step

    def sequence(self, counts: list[int], per_step: int, seed: int, epoch: int) -> list[Segment]:
        """Epoch ``epoch``'s train samples in reading order (combined shard numbers): each
        source's next ``n_i`` samples of its passes, interleaved a global batch at a time."""
        size = self.epoch_size(counts, per_step)
        steps = size // per_step
        runs = []
        for i, n in enumerate(shares(size, self.weights)):
            mine = counts[self.bounds[i] : self.bounds[i + 1]]
            stream = [Segment(s.shard + self.bounds[i], s.begin, s.end)
                      for s in source_stream(mine, _source_seed(seed, i), epoch * n, n)]
            runs.append(cut(stream, [n * (j + 1) // steps - n * j // steps for j in range(steps)]))
        return [seg for j in range(steps) for source in runs for seg in source[j]]


def _source_seed(seed: int, source: int) -> int:
    return int(rng(seed, MIX_STREAM, source).integers(2**62))


def source_stream(counts: list[int], seed: int, start: int, n: int) -> list[Segment]:
    """Samples ``start`` to ``start + n`` of a source's endless sequence of passes (pass ``p``: all
    its samples in the order a single-source epoch ``p`` would read them, nothing left out)."""
    total = sum(counts)
    if total == 0:
        raise UsageError("a SHARD_DIR of the mix has no train samples")
    cum = [0]
    for c in counts:
        cum.append(cum[-1] + c)
    out: list[Segment] = []
    while n > 0:
        p, at = divmod(start, total)
        take = min(n, total - at)
        whole, _ = epoch_sequence(counts, cum, 1, seed, p)
        out.extend(cut(whole, [at, take])[1])
        start, n = start + take, n - take
    return out


def source_names(dirs: list[str]) -> list[str]:
    """Short names for the sources, unique: each folder's name, with its parent's where two agree,
    else ``source{i}``; only letters, digits and ``._-/`` (they prefix keys and metric names)."""
    def clean(text: str) -> str:
        return "".join(c if c.isalnum() or c in "._-/" else "_" for c in text) or "source"

    parts = [str(d).rstrip("/").split("/") for d in dirs]
    for depth in (1, 2):
        names = [clean("/".join(p[-depth:])) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"source{i + 1}" for i in range(len(dirs))]


@dataclass
class Sources:
    """The folders of a mixed run, their indexes merged (`index`) and what reading them needs."""

    dirs: list[str]
    weights: tuple[Fraction, ...]
    epoch_samples: int | None = None
    names: list[str] = field(init=False)
    indexes: list[dict] = field(init=False)
    raws: list[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.names = source_names(self.dirs)
        loaded = [storage.read_index(d) for d in self.dirs]
        self.indexes, self.raws = [i for i, _ in loaded], [r for _, r in loaded]
        sizes = {n: i.get("image_size") for n, i in zip(self.names, self.indexes)}
        if len(set(sizes.values())) > 1:
            raise UsageError("the SHARD_DIRs of a mix hold images of different sizes ("
                             + ", ".join(f"{n} {s}" for n, s in sizes.items()) + "): shard them at one --size")
        self.classes = merged_classes(self.indexes)
        self.index = self._merged()

    @property
    def fingerprint(self) -> str:
        """The hash every rank agrees on and a checkpoint keeps: every index.json, the weights, the epoch size."""
        h = hashlib.sha256()
        for raw in self.raws:
            h.update(hashlib.sha256(raw).digest())
        h.update(json.dumps([[w.numerator, w.denominator] for w in self.weights] + [self.epoch_samples]).encode())
        return h.hexdigest()

    def train_shares(self) -> list[Fraction]:
        """Each source's share of an epoch (the weights, normalised)."""
        whole = sum(self.weights)
        return [w / whole for w in self.weights]

    def _merged(self) -> dict:
        """One index.json for the loop and the model: merged classes, the common image size, the
        mixture's mean and std, counts added up per class name, the shards of every source."""
        first = self.indexes[0]
        shares = self.train_shares()
        mean = std = None
        if all(i.get("mean") for i in self.indexes):
            mean = [sum(float(s) * i["mean"][c] for s, i in zip(shares, self.indexes)) for c in range(3)]
            second = [sum(float(s) * (i["std"][c] ** 2 + i["mean"][c] ** 2) for s, i in zip(shares, self.indexes))
                      for c in range(3)]
            std = [math.sqrt(max(second[c] - mean[c] ** 2, 0.0)) for c in range(3)]
        return {**first, "classes": list(self.classes), "mean": mean or first.get("mean"),
                "std": std or first.get("std"), "counts": {split: self._counts(split) for split in ("train", "val")},
                "shards": [{**s, "name": f"{n}/{s['name']}"} for n, i in zip(self.names, self.indexes) for s in i["shards"]]}

    def _counts(self, split: str) -> dict:
        out: dict = {"samples": 0, "shards": 0, "per_class": {}, "images": 0, "texts": 0}
        for index in self.indexes:
            c = index["counts"][split]
            for k in ("samples", "shards", "images", "texts"):
                out[k] += c.get(k, 0)
            for label, n in c.get("per_class", {}).items():
                out["per_class"][label] = out["per_class"].get(label, 0) + n
        return out

    def shards(self, split: str, only: int | None = None) -> list[dict]:
        """The ``split`` shards of every source (or of source ``only``), named SOURCE/NAME."""
        return [{**s, "name": f"{n}/{s['name']}"} for i, (n, index) in enumerate(zip(self.names, self.indexes))
                if only is None or i == only for s in index["shards"] if s["split"] == split]

    def mix(self, split: str, epoch_samples: int | None = None) -> Mix:
        """The plan's view of the train split (combined shard numbers per source)."""
        bounds = [0]
        for index in self.indexes:
            bounds.append(bounds[-1] + sum(1 for s in index["shards"] if s["split"] == split))
        return Mix(tuple(bounds), self.weights, self.epoch_samples)

    def label_maps(self) -> dict[str, list[int]]:
        """SOURCE/NAME of every shard -> its source's class numbers in the run's classes."""
        out = {}
        for n, index in zip(self.names, self.indexes):
            table = [self.classes.index(c) for c in index["classes"]]
            out.update({f"{n}/{s['name']}": table for s in index["shards"]})
        return out

    def key_prefixes(self) -> dict[str, str]:
        """SOURCE/NAME of every shard -> what its keys are prefixed with (``SOURCE:``): keys of two
        sources may be equal."""
        return {f"{n}/{s['name']}": f"{n}:" for n, index in zip(self.names, self.indexes) for s in index["shards"]}

    def open_source(self, cache_dir: str | os.PathLike | None = None, cache_max_bytes: int | None = None) -> MultiSource:
        parts = {}
        for d, n, index in zip(self.dirs, self.names, self.indexes):
            shards = {s["name"]: (s["bytes"], s["sha256"]) for s in index["shards"]}
            cache = None if cache_dir is None else Path(cache_dir)
            parts[n] = storage.open_source(d, cache, cache_max_bytes, shards)
        return MultiSource(parts)


def merged_classes(indexes: list[dict]) -> tuple[str, ...]:
    """Every source's classes by name: the first source's in its order, then each later one's new ones."""
    out: list[str] = []
    for index in indexes:
        out.extend(c for c in index["classes"] if c not in out)
    return tuple(out)


class MultiSource:
    """The sources of a mix behind one source: ``SOURCE/NAME`` is shard NAME of source SOURCE."""

    def __init__(self, parts: dict):
        self.parts = parts
        self.cap = min(p.cap for p in parts.values())
        self.ahead = max(p.ahead for p in parts.values())

    def _route(self, rel: str) -> tuple[object, str]:
        name, _, shard = rel.rpartition("/")
        while name not in self.parts and "/" in name:  # a source's name may hold "/" too
            name, _, rest = name.rpartition("/")
            shard = f"{rest}/{shard}"
        return self.parts[name], shard

    def read_range(self, rel: str, start: int, length: int):
        part, shard = self._route(rel)
        return part.read_range(shard, start, length)  # type: ignore[attr-defined]

    def transient(self, exc: BaseException) -> bool:
        return any(p.transient(exc) for p in self.parts.values())

    def url(self, rel: str) -> str:
        part, shard = self._route(rel)
        url = part.url(shard)  # type: ignore[attr-defined]
        return url if "://" in url else rel  # a local shard by its SOURCE/NAME

    def close(self) -> None:
        for p in self.parts.values():
            p.close()
