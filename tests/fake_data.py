"""A stand-in for `train.data.reader`'s reader in the loop's tests: the same API, synthetic samples.

It keeps the reader's promises the loop relies on: a new order every epoch from (seed, epoch),
one contiguous span per rank, equal steps on every rank, ``set_epoch(epoch, consumed)`` resuming
mid-epoch. Samples are learnable: the label's quadrant of the image is brighter, and the text names it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from pipeline.core.files import atomic_write_text
from train.data.loaders import DataSource

CLASSES = ["red", "green", "blue"]


def write_index(shard_dir: Path, image_size: int = 16, classes=CLASSES, tag: str = "") -> Path:
    """A schema-valid index.json without shards (the loop reads classes, image_size and hashes the
    file; the fake readers make the samples). ``tag`` makes another dataset's index."""
    shard_dir.mkdir(parents=True, exist_ok=True)
    counts = {"samples": 0, "shards": 0, "per_class": {}, "images": 0, "texts": 0}
    doc = {"schema_version": 1, "created_by": f"tests.fake_data {tag}".strip(), "manifest_sha256": "0" * 64,
           "settings": {"val_fraction": 0.2, "max_count": 1000, "max_size": 1 << 20, "seed": 0, "split_distance": 0,
                        "expected_ranks": 1, "expected_workers": 0},
           "classes": list(classes), "image_size": image_size, "mean": [0.5] * 3, "std": [0.25] * 3,
           "counts": {"train": counts, "val": counts}, "excluded": {"unlabelled": 0},
           "near_duplicate_groups": {"groups": 0, "samples": 0, "max_distance": 0}, "shards": []}
    atomic_write_text(shard_dir / "index.json", json.dumps(doc))  # ranks may write it at once
    return shard_dir


class FakeReader:
    def __init__(self, n: int, rank: int, world: int, batch_size: int, seed: int, *, split: str = "train",
                 num_classes: int = 3, image_size: int = 16, scale: float = 1.0, shift: float = 0.0, text_len: int = 24):
        self.n, self.rank, self.world, self.batch_size, self.seed = n, rank, world, batch_size, seed
        self.split, self.num_classes, self.image_size, self.text_len = split, num_classes, image_size, text_len
        self.scale, self.shift = scale, shift
        if split == "train":  # every rank the same whole number of batches; the rest waits for another epoch
            self.steps_per_epoch = (n // world) // batch_size
        else:  # validation reads everything, topping the last batches up with repeats marked invalid
            self.steps_per_epoch = -(-n // (world * batch_size))
        self.epoch, self.consumed = 0, 0
        self.index = {"classes": CLASSES[:num_classes], "image_size": image_size}

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        self.epoch, self.consumed = epoch, consumed

    def state_dict(self, steps_done: int) -> dict:
        """The position after ``steps_done`` batches of this epoch, and the layout it is valid for."""
        return {"epoch": self.epoch, "consumed": steps_done * self.batch_size, "world_size": self.world,
                "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        """Continue a mid-epoch position; ValueError when the ranks or the batch changed (the
        position would then name other samples), as the real reader's."""
        if (state["world_size"], state["batch_size"]) != (self.world, self.batch_size):
            raise ValueError(f"the checkpoint is mid-epoch with {state['world_size']} ranks x batch "
                             f"{state['batch_size']}, now {self.world} x {self.batch_size}")
        self.set_epoch(state["epoch"], state["consumed"])

    def sample(self, i: int) -> dict:
        g = torch.Generator().manual_seed(1_000_003 * (1 if self.split == "train" else 2) + i)
        label = i % self.num_classes
        image = torch.randn(3, self.image_size, self.image_size, generator=g) * 0.8
        h = self.image_size // 2  # a bright quadrant per class: a spatial pattern, as in real images
        image[:, (label // 2 % 2) * h:(label // 2 % 2 + 1) * h, (label % 2) * h:(label % 2 + 1) * h] += 1.5
        text = f"a {CLASSES[label % 3]} thing, number {i}".encode()[: self.text_len]
        ids = torch.zeros(self.text_len, dtype=torch.long)
        ids[: len(text)] = torch.tensor(list(text)) + 1
        return {"image": image * self.scale + self.shift, "text": ids, "text_len": len(text), "label": label,
                "key": f"{self.split}{i:06d}"}

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
        order = torch.randperm(self.n, generator=g).tolist() if self.split == "train" else list(range(self.n))
        per_rank = self.steps_per_epoch * self.batch_size
        slots = range(self.rank * per_rank, (self.rank + 1) * per_rank)
        span = [(order[s % self.n], s < self.n) for s in slots][self.consumed:]
        for start in range(0, len(span) - self.batch_size + 1, self.batch_size):
            chunk = span[start:start + self.batch_size]
            samples = [self.sample(i) for i, _ in chunk]
            yield {
                "valid": torch.tensor([v for _, v in chunk]),
                "image": torch.stack([s["image"] for s in samples]),
                "text": torch.stack([s["text"] for s in samples]),
                "text_len": torch.tensor([s["text_len"] for s in samples]),
                "label": torch.tensor([s["label"] for s in samples]),
                "key": [s["key"] for s in samples],
            }


def open_fake(cfg, d, plan, fields, index, image_size=None, *, n_train: int = 96, n_val: int = 30,
              skew_rank: int | None = None, channels_last: bool = False) -> DataSource:
    """`train.data.loaders.open_shards`' signature; ``skew_rank`` gets differently normalised images.
    (``channels_last`` is the real reader's layout hint; these batches are NCHW, as to_device takes any.)"""
    size = image_size or int(index.get("image_size", 16))
    skew = {"scale": 3.0, "shift": 1.0} if d.rank == skew_rank else {}
    train = FakeReader(n_train, d.rank, d.world_size, plan.batch_size, cfg.seed, image_size=size,
                       num_classes=len(index["classes"]), **skew)
    val = FakeReader(n_val, d.rank, d.world_size, plan.batch_size, cfg.seed, split="val", image_size=size,
                     num_classes=len(index["classes"])) if n_val else None
    return DataSource(train=train, val=val, loader=lambda r: r, close=lambda: None, errors=())


def fake_source(**kw):
    return functools.partial(open_fake, **kw)


def train_config(tmp: Path, name: str = "run", **values):
    """A TrainConfig over the fake shards in ``tmp/shards`` (written on first use), the run in
    ``tmp/name``: in-process, no dataloader workers, a tiny model; ``values`` set the rest."""
    from train.config import TrainConfig

    shards = tmp / "shards"
    if not (shards / "index.json").exists():
        write_index(shards)
    return TrainConfig(**{"shard_dir": shards, "output": tmp / name, "batch_size": 8, "workers": 0, "width": 8,
                          **values})
