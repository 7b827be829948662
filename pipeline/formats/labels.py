"""Class names as pipe keeps them: one spelling per name, whatever the bytes it arrived in.

"café" typed on Linux (NFC: é is one code point) and "café" from a macOS folder name (NFD: e and a
combining accent) look the same and were two classes, silently, through clean, shard and check.
Every label is NFC where it enters pipe (a class folder's name, a labels file's cell, a manifest's
label column read by pipe shard): `label_name`. Names that still differ only by case or by
compatibility form ("Cat" and "cat", a full-width "ｃａｔ") are likelier one class spelled twice than
two: they are not merged (that is the user's call), but said (`similar_names`): a warning from
pipe clean and pipe shard, and pipe check's `distinct_labels` finding.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable


def label_name(text: str) -> str:
    """A label as pipe keeps it: NFC (a name that already is comes back as it is)."""
    return text if unicodedata.is_normalized("NFC", text) else unicodedata.normalize("NFC", text)


def similar_names(names: Iterable[str | None]) -> list[list[str]]:
    """Groups of two or more distinct names that differ only by case or compatibility form
    (NFKC, then case-folded), each sorted, in order of their first name."""
    groups: dict[str, set[str]] = {}
    for name in names:
        if name:
            groups.setdefault(unicodedata.normalize("NFKC", name).casefold(), set()).add(name)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def similar_names_warning(names: Iterable[str | None]) -> str | None:
    """The one sentence pipe clean and pipe shard say about `similar_names`, or None."""
    groups = similar_names(names)
    if not groups:
        return None
    shown = "; ".join(" and ".join(repr(n) for n in g) for g in groups[:5])
    more = f" (and {len(groups) - 5} more groups)" if len(groups) > 5 else ""
    return (f"labels that differ only by case or character form are separate classes: {shown}{more}; if each group "
            "is one class, relabel it with one spelling (pipe clean --labels)")
