"""The train/val split: per class, seeded, and near duplicates never on both sides.

Images whose perceptual hashes (`phash`, 64 bits) differ in at most ``max_distance`` bits are
joined into one group (transitively), and a group goes to one side as a whole, so a validation
image never has a near copy in training. Pairs are found without comparing all pairs: cut the
64 bits into m bands, and two hashes within the distance d differ in at most d // m bits on at
least one band (pigeonhole), so only hashes whose band values are that close are compared
(multi-index hashing; m chosen for the fewest lookups and comparisons).

Per class, a fraction ``val_fraction`` of the samples (rounded, at least one when the class has
two samples or more, never all of them) goes to validation, group by group in a seeded order.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from pipeline.core.rng import rng_for
from pipeline.similarity.near_images import candidate_pairs, pigeonhole_bands


def _close_pairs(hashes: np.ndarray, max_distance: int) -> np.ndarray:
    """Index pairs (i, j), i < j, of distinct hashes within ``max_distance`` bits, as a (k, 2)
    array: multi-index hashing (`candidate_pairs`, exact here: no bucket is capped) with the
    bands that cost least for this many hashes (`_bands`)."""
    bands = _bands(len(hashes), max_distance)
    return candidate_pairs(hashes, max_distance, max_bucket=len(hashes), bands=bands)[:, :2]


def _bands(n: int, max_distance: int) -> list[tuple[int, int]]:
    """The bands to search ``n`` hashes with: m bands, each searched within r = d // m bits,
    where m * masks(r) lookups per hash plus the hashes those find (n / 2^bits per lookup) are
    fewest. At 75,000 hashes and d = 6: 4 bands of 16 bits searched within 1 bit (~80 hashes
    compared per hash), not 7 bands of 9 bits matched exactly (~1,000 each)."""
    from math import comb

    width = max(10, int(np.ceil(np.log2(max(n, 2)))))  # candidate_pairs keeps at most this many bits of a band

    def cost(m: int) -> float:
        bits = min(64 // m, width)
        masks = sum(comb(bits, k) for k in range(max_distance // m + 1))
        return m * masks * (1 + n / 2**bits)

    m = min(range(1, min(max_distance + 1, 64) + 1), key=lambda m: (cost(m), -m))
    return pigeonhole_bands(m - 1)


def _components(n: int, pairs: np.ndarray) -> np.ndarray:
    """The smallest member of each item's connected component (items 0..n-1, edges ``pairs``):
    labels spread along the edges, then jump to their label's label, until nothing changes."""
    label = np.arange(n)
    if not len(pairs):
        return label
    a, b = pairs[:, 0], pairs[:, 1]
    while True:
        low = np.minimum(label[a], label[b])
        before = label.copy()
        np.minimum.at(label, a, low)
        np.minimum.at(label, b, low)
        label = label[label]
        if np.array_equal(label, before):
            return label


def group_ids(hashes: np.ndarray, has_hash: np.ndarray, max_distance: int) -> np.ndarray:
    """`near_duplicate_groups` of hashes given as arrays (uint64 values, and whether there is one)."""
    n = len(hashes)
    ids = np.arange(n)
    items = np.flatnonzero(has_hash)
    if max_distance < 0 or not len(items):
        return ids
    unique, inverse = np.unique(hashes[items], return_inverse=True)  # identical hashes join at once; compare each value once
    inverse = inverse.reshape(-1)
    pairs = _close_pairs(unique, max_distance) if len(unique) > 1 else np.zeros((0, 2), dtype=np.int64)
    of_item = _components(len(unique), pairs)[inverse]
    smallest = np.full(len(unique), n, dtype=np.int64)
    np.minimum.at(smallest, of_item, items)  # a group's id: its smallest member index
    ids[items] = smallest[of_item]
    return ids


def hash_arrays(phashes: list[int | None]) -> tuple[np.ndarray, np.ndarray]:
    """Hashes as a list (None: no hash) -> (uint64 values, whether there is one)."""
    has = np.array([h is not None for h in phashes], dtype=bool)
    return np.array([h or 0 for h in phashes], dtype=np.uint64), has


def near_duplicate_groups(phashes: list[int | None], max_distance: int) -> list[int]:
    """Group id (the smallest member index) of every item; items without a hash stand alone."""
    return group_ids(*hash_arrays(phashes), max_distance).tolist()


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
    group: np.ndarray | None = None  # int64: each sample's group as its first member's index, -1 for one alone


def split(labels: list[str], phashes: list[int | None], val_fraction: float, seed: int, max_distance: int) -> SplitResult:
    """Decide train or val for each sample (given in canonical order: sorted by key)."""
    names = sorted(set(labels))
    index = {c: i for i, c in enumerate(names)}
    lab = np.fromiter((index[x] for x in labels), dtype=np.int64, count=len(labels))
    return split_arrays(lab, names, *hash_arrays(phashes), val_fraction, seed, max_distance)


def split_arrays(lab: np.ndarray, names: list[str], hashes: np.ndarray, has_hash: np.ndarray,
                 val_fraction: float, seed: int, max_distance: int) -> SplitResult:
    """`split` of samples given as arrays: class indices into ``names`` (sorted), hashes as `group_ids` takes them.

    Per class (in name order), its groups in a seeded order go to val while the counts of every
    class they hold stay within target. Most groups are one sample (no near duplicate): those
    are handled as arrays, and only classes with bigger groups take the loop over groups."""
    gid = group_ids(hashes, has_hash, max_distance)
    size = np.bincount(gid, minlength=len(lab))
    n_class = np.bincount(lab, minlength=len(names))
    target = np.array([val_target(int(n), val_fraction) for n in n_class], dtype=np.int64)
    members = _multi_members(gid, size)
    need = {g: Counter(lab[idx].tolist()) for g, idx in members.items()}  # class -> count, of groups of two or more
    groups = np.flatnonzero(size)  # every group's id, ascending
    primary = lab[groups]  # a group of one: its sample's class
    mixed = set()  # classes that are the primary of a group of two or more
    for g, counts in need.items():
        c = min(counts, key=lambda c: (-counts[c], c))  # most common label, then by name
        primary[np.searchsorted(groups, g)] = c
        mixed.add(c)
    in_val = np.zeros(len(lab), dtype=bool)  # by group id
    taken = np.zeros(len(names), dtype=np.int64)
    rng = rng_for(seed, 1)
    by_primary = [groups[primary == c] for c in range(len(names))]
    for c, mine in enumerate(by_primary):
        if not len(mine):
            continue
        order = mine[rng.permutation(len(mine))]
        if c not in mixed:  # all groups of one: the first that fit go
            room = max(0, int(target[c] - taken[c]))
            in_val[order[:room]] = True
            taken[c] += min(room, len(order))
            continue
        for g in order.tolist():
            want = need.get(g) or {c: 1}
            if all(taken[x] + n <= target[x] for x, n in want.items()):
                in_val[g] = True
                for x, n in want.items():
                    taken[x] += n
    for c, mine in enumerate(by_primary):  # a class left out of val by big groups: its smallest group, if one fits
        if target[c] == 0 or taken[c] > 0:
            continue
        for g in sorted(mine.tolist(), key=lambda g: (size[g], g)):
            want = need.get(g) or {c: 1}
            if not in_val[g] and all(taken[x] + n <= n_class[x] - 1 for x, n in want.items()):
                in_val[g] = True
                for x, n in want.items():
                    taken[x] += n
                break
    missing = [names[c] for c in range(len(names)) if target[c] > 0 and taken[c] == 0]
    return SplitResult(in_val[gid].tolist(), len(members), int(size[size > 1].sum()), missing,
                       np.where(size[gid] > 1, gid, -1))


def _multi_members(gid: np.ndarray, size: np.ndarray) -> dict[int, np.ndarray]:
    """Group id -> its member indices (ascending), for the groups of two or more."""
    multi = np.flatnonzero(size[gid] > 1)
    if not len(multi):
        return {}
    order = multi[np.argsort(gid[multi], kind="stable")]
    cuts = np.flatnonzero(np.diff(gid[order])) + 1
    return {int(gid[part[0]]): part for part in np.split(order, cuts)}
