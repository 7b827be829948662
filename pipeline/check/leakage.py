"""Exact and near duplicates shared between two sets (train and val), or inside one set (copies
within a split, one content under two labels), without comparing all pairs.

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.similarity.minhash import BANDS, BINS, estimated_jaccard
from pipeline.similarity.near_images import pigeonhole_bands, popcount

ROWS = BINS // BANDS
MAX_TRIES = 16  # candidates one sample is confirmed against at most (as `pipe clean` does)


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
        scored = [(estimated_jaccard(s, _indexed(train[i])), i) for i in sorted(candidates)]
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


@dataclass
class Copies:
    """What `copies` found inside one set: sample index -> (index of the earlier copy, how alike)."""

    same_group: dict[int, tuple[int, str]] = field(default_factory=dict)
    """A copy of an earlier sample of its own group (split) and label: the same sample trained on twice."""
    other_label: dict[int, tuple[int, str]] = field(default_factory=dict)
    """A copy of an earlier sample under another label, in any group: one content, two answers."""
    unconfirmed: int = 0
    """Candidates the pixels or the real Jaccard said were not the same content."""


def copies(exact: Sequence[str | None], hashes: Sequence[int | None], sigs: Sequence[bytes | None],
           groups: Sequence[str], labels: Sequence[str | int | None], d: int, threshold: float,
           same_picture: Callable[[int, int], tuple[bool, str]],
           text_similarity: Callable[[int, int], float | None]) -> Copies:
    """Exact and near copies among one set of samples, for the two findings that matter inside a set:
    a copy in the same group (split) under the same label, and a copy under another label (in any
    group; a sample without a label conflicts with none).

    Exact copies are grouped by content hash; near candidates come from the same indexes as
    `near_image_pairs` and `near_text_pairs` and are confirmed (``same_picture(i, j)``, the real
    Jaccard ``text_similarity(i, j)``) only when they would be a finding.
    """
    found = Copies()

    def conflict(i: int, j: int) -> bool:
        return labels[i] is not None and labels[j] is not None and labels[i] != labels[j]

    def note(j: int, i: int, how: str) -> None:
        (found.other_label if conflict(i, j) else found.same_group).setdefault(j, (i, how))

    tries: dict[int, int] = defaultdict(int)

    def matters(i: int, j: int) -> bool:
        """Worth confirming: it would be a finding not yet made, and ``j`` has tries left (a
        picture with thousands of look-alikes must not cost thousands of decodes)."""
        new = j not in found.other_label if conflict(i, j) else (groups[i] == groups[j] and j not in found.same_group)
        if not new or tries[j] >= MAX_TRIES:
            return False
        tries[j] += 1
        return True

    _exact_copies(exact, groups, labels, found)
    # near search among the first sample of each content only: a thousand exact copies of one
    # text are already found above and would otherwise be a million candidate pairs
    seen: set[str] = set()
    first = []
    for h in exact:
        first.append(h is None or h not in seen)
        if h is not None:
            seen.add(h)
    hashes = [h if f else None for h, f in zip(hashes, first)]
    sigs = [g if f else None for g, f in zip(sigs, first)]
    for i, j, dist in _near_image_candidates(hashes, d):
        if matters(i, j):
            same, how = same_picture(i, j)
            if same:
                note(j, i, f"image, {dist} bits apart{how}")
            else:
                found.unconfirmed += 1
    for i, j, estimate in _near_text_candidates(sigs, max(0.0, threshold - 0.1)):
        if matters(i, j):
            real = text_similarity(i, j)
            sim = real if real is not None else estimate
            if sim >= threshold:
                note(j, i, f"text, {sim:.0%} alike")
            else:
                found.unconfirmed += 1
    return found


def _exact_copies(exact, groups, labels, found: Copies) -> None:
    """Each sample against the first of its content in its group and under each other label
    (linear however many copies one content has)."""
    first_in: dict[str, dict[tuple, int]] = defaultdict(dict)  # content -> (group, label) -> first sample
    first_as: dict[str, dict[object, int]] = defaultdict(dict)  # content -> label -> first sample
    for j, h in enumerate(exact):
        if h is None:
            continue
        i = first_in[h].setdefault((groups[j], labels[j]), j)
        if i != j:
            found.same_group.setdefault(j, (i, "exact"))
        if labels[j] is not None:
            other = next((i for lab, i in first_as[h].items() if lab != labels[j]), None)
            if other is not None:
                found.other_label.setdefault(j, (other, "exact"))
            first_as[h].setdefault(labels[j], j)


def _near_image_candidates(hashes: Sequence[int | None], d: int) -> list[tuple[int, int, int]]:
    """(i, j, distance), i < j, for hashes within ``d`` bits of each other (identical ones included)."""
    from pipeline.similarity.near_images import candidate_pairs

    at = [i for i, h in enumerate(hashes) if h is not None]
    if len(at) < 2:
        return []
    pairs = candidate_pairs(np.array([hashes[i] for i in at], dtype=np.uint64), d)
    return sorted((at[a], at[b], int(dist)) for a, b, dist in pairs)


def _near_text_candidates(sigs: Sequence[bytes | None], threshold: float) -> list[tuple[int, int, float]]:
    """(i, j, estimated similarity), i < j, for MinHash signatures sharing a band and estimated alike enough."""
    index: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    step = ROWS * 4
    out = []
    for j, s in enumerate(sigs):
        if s is None:
            continue
        bands = [(b, s[b * step : (b + 1) * step]) for b in range(BANDS)]
        for i in sorted({i for band in bands for i in index.get(band, ())}):
            sim = estimated_jaccard(s, _indexed(sigs[i]))
            if sim >= threshold:
                out.append((i, j, sim))
        for band in bands:
            index[band].append(j)
    return out


def same_views(va, vb) -> tuple[bool, str]:
    """Whether two perceptual views show the same picture (`perceptual.same_picture`), with how
    alike. A view that could not be made stays a finding: a check does not pass on what it could
    not look at."""
    from pipeline.similarity.perceptual import same_picture

    if va is None or vb is None:
        return True, ""
    same, how = same_picture(va, vb)
    return same, f", {how}"


def _indexed(sig: bytes | None) -> bytes:
    """A signature found through the band index: only samples that have one are indexed."""
    if sig is None:
        raise AssertionError("a sample without a MinHash signature was found in the band index")
    return sig
