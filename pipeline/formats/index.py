"""`index.json`: the only entry point of a shard folder, and the pixel statistics it carries.

The one reader of it: `load` (schema-checked, a usable index: pipe train, pipe labels, the
streaming reader) and `parse` (read but not judged: pipe check, pipe report), from a local
path or any `pipeline.storage.Folder` (object storage too), never more than `MAX_BYTES`.

Written last (atomically) by `pipe shard`: a folder without it is not a dataset yet. It lists
every shard with its split, sample count, size, sha256 and the byte offset of each sample's
first member (so a reader can start mid-shard), the class names, the image size and the
per-channel mean and std of the train split (on the 0-1 scale), computed exactly from integer
pixel sums. `schemas/index.schema.json` is its schema.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from pipeline.core.errors import UsageError
from pipeline.storage import Folder, TooLarge, open_folder

SCHEMA_VERSION = 1
INDEX_NAME = "index.json"
MAX_BYTES = 1 << 30  # an index.json larger than this is not one pipe shard wrote: refused unread


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


Where = Folder | str | os.PathLike
"""A shard folder: a `pipeline.storage.Folder` (local or object storage) or a local path."""


def load(where: Where) -> dict:
    """The index of a shard folder, schema-checked and of this pipe's version: what every reader
    that needs a usable index takes. UsageError (one line) otherwise."""
    return load_bytes(where)[0]


def load_bytes(where: Where) -> tuple[dict, bytes]:
    """`load`, and the file's bytes (whose hash is the dataset's fingerprint for pipe train)."""
    from pipeline.core.schemas import validate_or_usage_error

    folder = _folder(where)
    name = _shown(folder)
    try:
        raw = folder.read(INDEX_NAME, max_bytes=MAX_BYTES)
    except (FileNotFoundError, IsADirectoryError):
        hint = " (pipe shard writes it last: was the run interrupted?)" if folder.local_path is None or folder.local_path.is_dir() else ""
        raise UsageError(f"{name} not found{hint}") from None
    except TooLarge:
        raise UsageError(f"{name} is larger than {MAX_BYTES} bytes: not an index pipe shard wrote") from None
    except OSError as e:
        raise UsageError(f"{name} cannot be read: {e.strerror or e}") from None
    doc, problem = _decode(raw)
    if problem is not None:
        raise UsageError(f"{name} is not valid JSON: {problem}")
    validate_or_usage_error(doc, "index", what=name)
    if doc["schema_version"] != SCHEMA_VERSION:
        raise UsageError(f"{name} has schema_version {doc['schema_version']}; this pipe reads version {SCHEMA_VERSION}")
    return doc, raw


def parse(where: Where) -> tuple[Any, str | None]:
    """index.json read but not judged: (the document, None), or (None, why it is not JSON).

    For `pipe check`, which judges a shard folder with a broken index (its schema is one of the
    checks) rather than refusing it, and `pipe report`, which shows what it can; every reader
    that needs a usable index takes `load`. Both read folders anyone may have written: an index
    that is a link out of its folder is not read (`Folder.read_contained`)."""
    try:
        raw = _folder(where).read_contained(INDEX_NAME, max_bytes=MAX_BYTES)
    except TooLarge:
        return None, f"larger than {MAX_BYTES} bytes: not an index pipe shard wrote"
    except OSError as e:
        return None, str(e)
    return _decode(raw)


def exists(where: Where) -> bool:
    """Whether the folder has an index (pipe shard finished): what makes it a shard folder."""
    return _folder(where).exists(INDEX_NAME)


def _decode(raw: bytes) -> tuple[Any, str | None]:
    try:
        return json.loads(raw.decode("utf-8")), None
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        return None, str(e)
    except RecursionError:  # a hostile index of 100,000 nested [
        return None, "nested too deeply to parse"


def _folder(where: Where) -> Folder:
    if isinstance(where, Folder):
        return where
    return open_folder(where if isinstance(where, str) else Path(where))


def _shown(folder: Folder) -> str:
    """The index's name in messages: its path, or its URL (never a credential)."""
    if folder.local_path is not None:
        return str(folder.local_path / INDEX_NAME)
    return f"{folder.url.rstrip('/')}/{INDEX_NAME}"


def dumps(doc: dict) -> str:
    """Stable text: same document, same bytes; readable, with one line per shard (offsets and all)."""
    head = json.dumps({k: v for k, v in doc.items() if k != "shards"}, ensure_ascii=False, indent=1)
    shards = ",\n  ".join(json.dumps(s, ensure_ascii=False, separators=(",", ":")) for s in doc.get("shards", []))
    return f'{head[:-2]},\n "shards": [\n  {shards}\n ]\n}}\n'
