"""Decisions that need every file at once: duplicates, caption pairs, label conflicts.

Input: the per-file results in manifest order. Output: one `Decision` per result. A file that
failed its own checks is quarantined with its own reason; the rest are judged here.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from pipeline.records import DUPLICATE, KEPT, QUARANTINED, Decision, FileResult

KEEP = Decision(KEPT)


@dataclass(frozen=True)
class DecideSettings:
    label_conflicts: str = "quarantine"


def decide(results: list[FileResult], s: DecideSettings) -> list[Decision]:
    out: list[Decision] = [KEEP if r.reason is None else Decision(QUARANTINED, r.reason, None, r.detail) for r in results]
    _exact_duplicates(results, out)
    return out


def _quality(r: FileResult) -> int:
    return (r.width or 0) * (r.height or 0)


def _exact_duplicates(results: list[FileResult], out: list[Decision]) -> None:
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(results):
        if out[i] is KEEP and r.content_hash:
            groups[(r.kind, r.content_hash)].append(i)
    for members in groups.values():
        if len(members) < 2:
            continue
        best = max(members, key=lambda i: (_quality(results[i]), -i))  # largest, then first path
        for i in members:
            if i != best:
                out[i] = Decision(DUPLICATE, "exact_duplicate", results[best].source)
