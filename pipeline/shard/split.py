"""The train/val split: per class, seeded, and near duplicates never on both sides.

Images whose perceptual hashes (`phash`, 64 bits) differ in at most ``max_distance`` bits are
joined into one group (transitively), and a group goes to one side as a whole, so a validation
image never has a near copy in training. Pairs are found without comparing all pairs: with
``max_distance + 1`` bands of the 64 bits, two hashes within the distance agree on at least one
band (pigeonhole), so only hashes sharing a band value are compared.

Per class, a fraction ``val_fraction`` of the samples (rounded, at least one when the class has
two samples or more, never all of them) goes to validation, group by group in a seeded order.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from pipeline.core.rng import rng_for
from pipeline.similarity.near_images import pigeonhole_bands, popcount

CHUNK = 2048  # rows per block when comparing the hashes inside one band bucket


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _close_pairs(hashes: np.ndarray, max_distance: int) -> set[tuple[int, int]]:
    """Index pairs (i < j) of distinct hashes within ``max_distance`` bits."""
    pairs: set[tuple[int, int]] = set()
    for shift, width in pigeonhole_bands(max_distance):
        band = (hashes >> np.uint64(shift)) & np.uint64((1 << width) - 1)
        order = np.argsort(band, kind="stable")
        sorted_band = band[order]
        cuts = np.flatnonzero(np.diff(sorted_band)) + 1
        for bucket in np.split(order, cuts):
            if len(bucket) < 2:
                continue
            bucket = np.sort(bucket)
            h = hashes[bucket]
            for lo in range(0, len(bucket), CHUNK):
                rows = h[lo : lo + CHUNK]
                dist = popcount(rows[:, None] ^ h[None, :])
                ii, jj = np.nonzero(dist <= max_distance)
                for a, b in zip(ii + lo, jj):
                    if a < b:
                        pairs.add((int(bucket[a]), int(bucket[b])))
    return pairs


def near_duplicate_groups(phashes: list[int | None], max_distance: int) -> list[int]:
    """Group id (the smallest member index) of every item; items without a hash stand alone."""
    uf = _UnionFind(len(phashes))
    if max_distance < 0:
        return list(range(len(phashes)))
    first_of: dict[int, int] = {}
    for i, h in enumerate(phashes):  # identical hashes join at once; compare each value once
        if h is None:
            continue
        if h in first_of:
            uf.union(first_of[h], i)
        else:
            first_of[h] = i
    values = list(first_of)
    if len(values) > 1:
        arr = np.array(values, dtype=np.uint64)
        for a, b in _close_pairs(arr, max_distance):
            uf.union(first_of[values[a]], first_of[values[b]])
    return [uf.find(i) for i in range(len(phashes))]


def val_target(n: int, fraction: float) -> int:
    """How many of a class's ``n`` samples go to validation."""
    if fraction <= 0 or n < 2:
        return 0
    return min(n - 1, max(1, int(n * fraction + 0.5)))


@dataclass
class SplitResult:
    is_val: list[bool]
    groups: int  # number of near-duplicate groups with more than one member
    grouped_samples: int  # samples in those groups
    classes_without_val: list[str]  # classes with >= 2 samples that still have none in val


def split(labels: list[str], phashes: list[int | None], val_fraction: float, seed: int, max_distance: int) -> SplitResult:
    """Decide train or val for each sample (given in canonical order: sorted by key)."""
    group_of = near_duplicate_groups(phashes, max_distance)
    members: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(group_of):
        members[g].append(i)
    n_class = Counter(labels)
    target = {c: val_target(n, val_fraction) for c, n in n_class.items()}
    by_primary: dict[str, list[int]] = defaultdict(list)
    for g, idx in members.items():
        counts = Counter(labels[i] for i in idx)
        primary = min(counts, key=lambda c: (-counts[c], c))  # most common label, then by name
        by_primary[primary].append(g)

    in_val: dict[int, bool] = {}
    taken: Counter = Counter()
    rng = rng_for(seed, 1)
    for c in sorted(by_primary):
        groups = sorted(by_primary[c])
        for k in rng.permutation(len(groups)):
            g = groups[int(k)]
            need = Counter(labels[i] for i in members[g])
            if all(taken[x] + n <= target[x] for x, n in need.items()):
                in_val[g] = True
                taken.update(need)
    for c in sorted(by_primary):  # a class left out of val by big groups: its smallest group, if one fits
        if target[c] == 0 or taken[c] > 0:
            continue
        for g in sorted(by_primary[c], key=lambda g: (len(members[g]), g)):
            need = Counter(labels[i] for i in members[g])
            if not in_val.get(g) and all(taken[x] + n <= n_class[x] - 1 for x, n in need.items()):
                in_val[g] = True
                taken.update(need)
                break
    is_val = [bool(in_val.get(group_of[i])) for i in range(len(labels))]
    multi = [idx for idx in members.values() if len(idx) > 1]
    missing = sorted(c for c in n_class if target[c] > 0 and taken[c] == 0)
    return SplitResult(is_val, len(multi), sum(map(len, multi)), missing)
