"""`index.json`: the only entry point of a shard folder, and the pixel statistics it carries.

Written last (atomically) by `pipe shard`: a folder without it is not a dataset yet. It lists
every shard with its split, sample count, size, sha256 and the byte offset of each sample's
first member (so a reader can start mid-shard), the class names, the image size and the
per-channel mean and std of the train split (on the 0-1 scale), computed exactly from integer
pixel sums. `schemas/index.schema.json` is its schema.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from pipeline.core.errors import UsageError

SCHEMA_VERSION = 1
INDEX_NAME = "index.json"


@dataclass
class PixelStats:
    """Exact per-channel sums of pixel values and their squares (Python ints: no rounding)."""

    n: int = 0  # pixels per channel
    sums: list[int] = field(default_factory=lambda: [0, 0, 0])
    squares: list[int] = field(default_factory=lambda: [0, 0, 0])

    def add(self, n: int, sums, squares) -> None:
        self.n += n
        for c in range(3):
            self.sums[c] += int(sums[c])
            self.squares[c] += int(squares[c])

    def mean_std(self) -> tuple[list[float], list[float]] | tuple[None, None]:
        """Per-channel mean and std of pixel values scaled to 0-1; (None, None) without pixels."""
        if self.n == 0:
            return None, None
        mean, std = [], []
        for c in range(3):
            m = Fraction(self.sums[c], self.n)
            var = Fraction(self.squares[c], self.n) - m * m
            mean.append(float(m / 255))
            std.append(math.sqrt(var) / 255)
        return mean, std


@dataclass
class ShardEntry:
    name: str
    split: str
    count: int
    bytes: int
    sha256: str
    offsets: list[int]

    def as_dict(self) -> dict:
        return {"name": self.name, "split": self.split, "count": self.count, "bytes": self.bytes,
                "sha256": self.sha256, "offsets": self.offsets}


def load(shard_dir: Path) -> dict:
    """The parsed index.json of ``shard_dir``, schema-checked; UsageError (one line) otherwise."""
    from pipeline.core.schemas import validate_or_usage_error

    path = Path(shard_dir) / INDEX_NAME
    if not path.is_file():
        hint = " (pipe shard writes it last: was the run interrupted?)" if Path(shard_dir).is_dir() else ""
        raise UsageError(f"{path} not found{hint}")
    doc, problem = parse(shard_dir)
    if problem is not None:
        raise UsageError(f"{path} is not valid JSON: {problem}")
    validate_or_usage_error(doc, "index", what=str(path))
    if doc["schema_version"] != SCHEMA_VERSION:
        raise UsageError(f"{path} has schema_version {doc['schema_version']}; this pipe reads version {SCHEMA_VERSION}")
    return doc


def parse(shard_dir: Path | Any) -> tuple[Any, str | None]:
    """index.json read but not judged: (the document, None), or (None, why it is not JSON).

    For `pipe check`, which judges a shard folder with a broken index (its schema is one of the
    checks) rather than refusing it; every reader that needs a usable index takes `load`."""
    try:
        return json.loads(_read(shard_dir).decode("utf-8")), None
    except (OSError, UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        return None, str(e)
    except RecursionError:  # a hostile index of 100,000 nested [
        return None, "nested too deeply to parse"


def _read(shard_dir: Path | Any) -> bytes:
    """index.json's bytes from a folder path, or from a storage folder (anything with ``read``)."""
    if hasattr(shard_dir, "read"):
        return shard_dir.read(INDEX_NAME)
    return (Path(shard_dir) / INDEX_NAME).read_bytes()


def dumps(doc: dict) -> str:
    """Stable text: same document, same bytes; readable, with one line per shard (offsets and all)."""
    head = json.dumps({k: v for k, v in doc.items() if k != "shards"}, ensure_ascii=False, indent=1)
    shards = ",\n  ".join(json.dumps(s, ensure_ascii=False, separators=(",", ":")) for s in doc.get("shards", []))
    return f'{head[:-2]},\n "shards": [\n  {shards}\n ]\n}}\n'
