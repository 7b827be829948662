"""Sample keys: safe for webdataset (ASCII letters, digits, `_` and `-` only: no dots, no
separators), unique, stable, and shared by an image and its caption (same folder, same stem)."""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict

from pipeline.formats.vocabulary import Kind

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
MAX_STEM = 96


def slug(source: str) -> str:
    """``cats/Tabby Cat.01.JPG`` -> ``cats_Tabby_Cat_01``: the path without its extension."""
    folder, _, name = source.rpartition("/")
    stem = name.rsplit(".", 1)[0] if "." in name.lstrip(".") else name
    text = f"{folder}/{stem}" if folder else stem
    s = _UNSAFE.sub("_", text.replace("/", "__")).strip("_")
    return s[:MAX_STEM] or "x"


def short_hash(source: str) -> str:
    return hashlib.sha1(source.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def assign_keys(candidates) -> None:
    """Set ``.key`` on each candidate (anything with ``source`` and ``kind``), in place.

    Files whose slugs collide share the key only when they are one image and one text (a caption
    pair); otherwise every one of them gets its slug plus a short hash of its own path.
    """
    groups: dict[str, list] = defaultdict(list)
    for c in candidates:
        groups[slug(c.source)].append(c)
    taken = set(groups)
    for base, members in groups.items():
        for m, key in zip(members, group_keys(base, [(m.source, m.kind) for m in members], taken)):
            m.key = key


def group_keys(base: str, members: list[tuple[str, str]], taken) -> list[str]:
    """The keys of the files (``(source, kind)``, in order) whose slug is ``base``: the slug for
    a file alone or a caption pair, else the slug and a hash of each one's path, not in ``taken``
    (every slug and every key given so far; the keys given here are added)."""
    kinds = sorted(kind for _, kind in members)
    if len(members) == 1 or (len(members) == 2 and kinds == [Kind.IMAGE, Kind.TEXT] and _same_folder(members)):
        return [base] * len(members)
    keys = []
    for source, _ in members:
        key = f"{base}-{short_hash(source)}"
        while key in taken:  # astronomically unlikely; keep keys unique regardless
            key = f"{key}-{short_hash(key)}"
        taken.add(key)
        keys.append(key)
    return keys


def _same_folder(members: list[tuple[str, str]]) -> bool:
    return len({source.rpartition("/")[0] for source, _ in members}) == 1
