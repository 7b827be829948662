"""Facts about a SHARD_DIR for the page: index.json's counts per split and class, and a few
previews per class read from the start of the train shards (bounded: a few thousand members).

index.json is checked against its schema before any of it is shown: an index that breaks it (a
count that is text, a shard name that leaves the folder) is named on the page, not drawn."""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field

from pipeline.core.errors import StageFailed, UsageError
from pipeline.formats import index as shard_index
from pipeline.formats.sample import CLASS_EXT, IMAGE_LIKE, split_name
from pipeline.report import records, thumbs
from pipeline.report.clean import Item
from pipeline.storage import Folder, Location, open_folder

PER_CLASS = 4
CLASSES_WITH_THUMBS = 24
MAX_MEMBERS = 4000  # tar members read for previews, over all shards


@dataclass
class ShardFacts:
    path: str  # the folder as given (a path, or a URL)
    problems: list[str] = field(default_factory=list)
    index: dict | None = None
    classes: list[str] = field(default_factory=list)
    per_class: dict[str, dict[str, int]] = field(default_factory=dict)  # split -> class -> count
    samples: dict[str, int] = field(default_factory=dict)
    shards: dict[str, int] = field(default_factory=dict)
    imbalance: float | None = None
    class_items: dict[str, list[Item]] = field(default_factory=dict)


def gather(where: Location | Folder, previews: bool = True) -> ShardFacts:
    root = open_folder(where)
    f = ShardFacts(root.url)
    index, unreadable = shard_index.parse(root)
    if unreadable is not None:
        f.problems.append(f"index.json is not readable JSON: {unreadable}")
        return f
    wrong = records.errors(index, "index")
    if wrong:
        f.problems += ["index.json breaks schemas/index.schema.json, so none of it is shown:", *wrong]
        return f
    f.index = index
    f.classes = [str(c) for c in index.get("classes") or []]
    for split, c in (index.get("counts") or {}).items():
        if isinstance(c, dict):
            f.samples[split] = int(c.get("samples") or 0)
            f.shards[split] = int(c.get("shards") or 0)
            per = c.get("per_class")
            per = per if isinstance(per, dict) else {}
            f.per_class[split] = {str(k): int(v) for k, v in per.items() if isinstance(v, (int, float))}
    train = [v for v in f.per_class.get("train", {}).values()]
    if train and min(train) > 0:
        f.imbalance = max(train) / min(train)
    if previews:
        _previews(f, root, index)
    return f


def _previews(f: ShardFacts, root: Folder, index: dict) -> None:
    """The first images of each class in the train shards, in index order (deterministic)."""
    wanted = set(_largest(f)[:CLASSES_WITH_THUMBS])
    found: dict[str, list[Item]] = {c: [] for c in wanted}
    budget = MAX_MEMBERS
    for shard in index.get("shards") or []:
        if budget <= 0 or not any(len(v) < PER_CLASS for v in found.values()):
            break
        name = shard.get("name") if isinstance(shard, dict) else None
        if not isinstance(name, str) or shard.get("split") != "train":
            continue
        if not root.contained(name):
            continue
        budget = _scan(root, name, f.classes, found, budget)
    f.class_items = {c: found[c] for c in _largest(f) if c in found}


def _scan(root: Folder, name: str, classes: list[str], found: dict[str, list[Item]], budget: int) -> int:
    """Previews from the first members of one shard, streamed from its folder."""
    pending: dict[str, dict] = {}
    try:
        with root.open(name) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for m in tar:
                budget -= 1
                if budget <= 0:
                    break
                if not m.isfile() or m.size > thumbs.MAX_FILE_BYTES:
                    continue
                try:
                    key, ext = split_name(m.name)
                except ValueError:  # in no sample
                    continue
                ext = ext.lower()
                if ext == CLASS_EXT or ext in IMAGE_LIKE:
                    member = tar.extractfile(m)
                    if member is None:  # only for members that are not files, skipped above
                        continue
                    data = member.read()
                    s = pending.setdefault(key, {})
                    s["cls" if ext == CLASS_EXT else "img"] = data
                    _take(key, s, classes, found, pending)
    except (OSError, tarfile.TarError, UsageError, StageFailed):
        pass  # pipe check says what is wrong with a shard; previews are a courtesy
    return budget


def _take(key: str, s: dict, classes: list[str], found: dict[str, list[Item]], pending: dict) -> None:
    if "cls" not in s or "img" not in s:
        return
    pending.pop(key, None)
    try:
        label = classes[int(s["cls"].decode("ascii").strip())]
    except (ValueError, IndexError, UnicodeDecodeError):
        return
    if label in found and len(found[label]) < PER_CLASS:
        found[label].append(Item(source=key, label=label, kind="image", thumb=thumbs.from_bytes(s["img"])))


def _largest(f: ShardFacts) -> list[str]:
    train = f.per_class.get("train", {})
    return sorted(f.classes, key=lambda c: (-train.get(c, 0), c))
