"""Class-balance checks shared by clean and shard dirs: they look at samples per class only."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

from pipeline.check.policy import Policy
from pipeline.check.result import CheckResult, fail, ok, skip
from pipeline.formats.labels import similar_names


def min_samples(counts: Counter | None, p: Policy, what: str) -> CheckResult:
    name = "min_samples_per_class"
    if counts is None:
        return skip(name, "no readable sample list")
    if not counts:
        return ok(name, "no labels: nothing to count per class", classes=0)
    low = sorted((n, c) for c, n in counts.items() if n < p.min_samples_per_class)
    nums = dict(classes=len(counts), smallest=min(counts.values()), limit=p.min_samples_per_class)
    if not low:
        return ok(name, f"every one of {len(counts)} classes has at least {p.min_samples_per_class} {what} "
                        f"(smallest: {nums['smallest']})", **nums)
    return fail(name, f"{len(low)} of {len(counts)} classes have fewer than {p.min_samples_per_class} {what}: "
                      f"{low[0][1]!r} has {low[0][0]}", [f"{c}: {n}" for n, c in low], **nums)


def imbalance(counts: Counter | None, p: Policy) -> CheckResult:
    name = "class_imbalance"
    if counts is None:
        return skip(name, "no readable sample list")
    if len(counts) < 2:
        return ok(name, f"{len(counts)} class: nothing to balance", classes=len(counts))
    (big, nbig), (small, nsmall) = max(counts.items(), key=lambda kv: (kv[1], kv[0])), min(counts.items(), key=lambda kv: (kv[1], kv[0]))
    ratio = nbig / nsmall if nsmall else float("inf")
    nums = dict(classes=len(counts), largest=nbig, smallest=nsmall, ratio=round(ratio, 4) if nsmall else None,
                limit=p.max_class_imbalance)
    text = f"largest class {big!r} ({nbig}) / smallest {small!r} ({nsmall}) = {ratio:.2f}"
    if ratio <= p.max_class_imbalance:
        return ok(name, f"{text} <= {p.max_class_imbalance:g}", **nums)
    return fail(name, f"{text} > {p.max_class_imbalance:g}", [f"{c}: {n}" for c, n in counts.most_common()], **nums)


def distinct(names: Collection[str] | None) -> CheckResult:
    """No two class names differ only by case or character form (`pipeline.formats.labels`):
    "Cat" and "cat", or an NFD "café" from an older manifest beside an NFC one, are likelier one
    class spelled twice than two classes, and a model taught them apart learns noise."""
    name = "distinct_labels"
    if names is None:
        return skip(name, "no readable sample list")
    groups = similar_names(names)
    n = len(set(names))
    if not groups:
        return ok(name, f"no two of the {n} class names differ only by case or character form", classes=n)
    return fail(name, f"{len(groups)} groups of class names differ only by case or character form: "
                      f"{' and '.join(map(repr, groups[0]))}", [" and ".join(map(repr, g)) for g in groups],
                classes=n, groups=len(groups))
