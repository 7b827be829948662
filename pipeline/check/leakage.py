"""Exact and near duplicates shared between two sets (train and val), without comparing all pairs.

Images: 64-bit perceptual hashes. Two hashes within ``d`` bits of each other agree exactly on at
least one of ``d + 1`` disjoint bit ranges (pigeonhole), so train hashes are indexed by each
range and a val hash is compared only with the train hashes that share a range with it.

Texts: the MinHash signatures `pipe clean` finds its near-duplicate texts with
(`similarity.minhash`: 64 values over character 5-grams of the case- and space-normalised
text). Banded LSH (16 bands of 4) finds candidate pairs; a candidate counts when the share of
equal signature values, an estimate of the Jaccard similarity, reaches the threshold.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from pipeline.similarity.minhash import BANDS, BINS, estimated_jaccard
from pipeline.similarity.near_images import pigeonhole_bands, popcount

ROWS = BINS // BANDS


def near_image_pairs(train: Sequence[int | None], val: Sequence[int | None], d: int,
                     block: int = 4096) -> list[tuple[int, int, int]]:
    """(val index, train index, distance) for each val hash within ``d`` bits of some train hash (the closest).

    Vectorised: per bit range, train hashes are sorted by that range's value; each block of val
    hashes finds its equal-range train hashes with searchsorted and checks them all at once.
    """
    t_idx = np.array([i for i, h in enumerate(train) if h is not None], dtype=np.int64)
    v_idx = np.array([j for j, h in enumerate(val) if h is not None], dtype=np.int64)
    if not len(t_idx) or not len(v_idx):
        return []
    t = np.array([train[i] for i in t_idx], dtype=np.uint64)
    v = np.array([val[j] for j in v_idx], dtype=np.uint64)
    tables = []
    for shift, w in pigeonhole_bands(d):
        key = (t >> np.uint64(shift)) & np.uint64((1 << w) - 1)
        order = np.argsort(key, kind="stable")
        tables.append((shift, w, key[order], order))
    best = np.full(len(v), 65, dtype=np.int64)
    best_at = np.full(len(v), -1, dtype=np.int64)
    for lo in range(0, len(v), block):
        vb = v[lo : lo + block]
        for shift, w, keys, order in tables:
            q = (vb >> np.uint64(shift)) & np.uint64((1 << w) - 1)
            left, right = np.searchsorted(keys, q, "left"), np.searchsorted(keys, q, "right")
            n = right - left
            if not n.sum():
                continue
            rows = np.repeat(np.arange(len(vb)), n)  # val position of each candidate pair
            starts = np.repeat(left - np.cumsum(n) + n, n)  # offset so that arange maps into [left, right)
            cand = order[np.arange(n.sum()) + starts]
            dist = popcount(vb[rows] ^ t[cand]).astype(np.int64)
            for r, c, dd in zip(rows[dist <= d], cand[dist <= d], dist[dist <= d]):
                if dd < best[lo + r] or (dd == best[lo + r] and t_idx[c] < best_at[lo + r]):
                    best[lo + r], best_at[lo + r] = dd, t_idx[c]
    hit = np.nonzero(best <= d)[0]
    return [(int(v_idx[k]), int(best_at[k]), int(best[k])) for k in hit]


def near_text_pairs(train: Sequence[bytes | None], val: Sequence[bytes | None], threshold: float) -> list[tuple[int, int, float]]:
    """(val index, train index, similarity) for each val signature with a train one at least ``threshold`` alike."""
    index: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    step = ROWS * 4  # bytes per band
    for i, s in enumerate(train):
        if s is not None:
            for b in range(BANDS):
                index[(b, s[b * step : (b + 1) * step])].append(i)
    out = []
    for j, s in enumerate(val):
        if s is None:
            continue
        candidates = {i for b in range(BANDS) for i in index.get((b, s[b * step : (b + 1) * step]), ())}
        scored = [(estimated_jaccard(s, train[i]), i) for i in sorted(candidates)]
        best = max(scored, default=None)
        if best is not None and best[0] >= threshold:
            out.append((j, best[1], best[0]))
    return out


def exact_pairs(train: Iterable[str | None], val: Sequence[str | None]) -> list[tuple[int, int]]:
    """(val index, train index) for each val content hash that also occurs in train."""
    first: dict[str, int] = {}
    for i, h in enumerate(train):
        if h is not None:
            first.setdefault(h, i)
    return [(j, first[h]) for j, h in enumerate(val) if h is not None and h in first]
