"""Candidate near-duplicate images: every pair of 64-bit perceptual hashes within a Hamming
distance, without comparing all pairs (multi-index hashing, Norouzi et al. 2012).

The 64 bits are cut into 3 bands (21, 21, 22 bits). If two hashes differ in at most ``t`` bits,
one band differs in at most ``r = t // 3`` bits (pigeonhole). So for each band, each hash looks
up every band value within ``r`` bits of its own (232 values for r = 2, t = 8) in a table of
that band, and the hashes found there are checked on all 64 bits.

The tables are counting-sort buckets (CSR): per band, the hash indices sorted by band value
(4 bytes each) and one 8-byte entry (bucket start and size) per band value. Bands are cut to
about log2(N) bits, so a bucket holds about one hash and the table about N entries. Index
memory: 8 bytes for the hash plus, for the band being searched, 4 for its order, 8 for its
sorted copy and about 8-16 for its table, so under 40 bytes per sample at any time. The work
per hash is about 3 x C(log2 N, <=2) lookups, so the total grows as N log^2 N.

Everything runs as numpy over all hashes at once, one (band, flip mask) pass at a time, in
chunks so a huge bucket (a thousand near-identical images) cannot blow up memory: a bucket
contributes at most ``max_bucket`` members to any one lookup (its first ones, in input order).
"""

from __future__ import annotations

import sys
from itertools import combinations

import numpy as np

BANDS = ((0, 21), (21, 21), (42, 22))  # (shift, bits)
CHUNK = 1 << 20  # candidate pairs materialised at once (about 40 MB of temporaries)


def popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64 in ``x`` (any shape): Hamming distances of XORed hashes."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(x)
    return np.unpackbits(np.ascontiguousarray(x)[..., None].view(np.uint8), axis=-1).sum(axis=-1)


def pigeonhole_bands(max_distance: int) -> list[tuple[int, int]]:
    """(shift, width) of ``max_distance + 1`` disjoint bit ranges covering the 64 bits: two
    hashes within ``max_distance`` bits agree exactly on at least one of them (pigeonhole)."""
    n = min(max_distance + 1, 64)
    widths = [64 // n + (i < 64 % n) for i in range(n)]
    shifts = [sum(widths[:i]) for i in range(n)]
    return list(zip(shifts, widths))


def _masks(bits: int, radius: int) -> np.ndarray:
    out = [0]
    for r in range(1, radius + 1):
        out += [sum(1 << b for b in combo) for combo in combinations(range(bits), r)]
    return np.array(out, dtype=np.int64)


def candidate_pairs(hashes: np.ndarray, max_distance: int, max_bucket: int = 256,
                    bands: tuple[tuple[int, int], ...] | list[tuple[int, int]] = BANDS) -> np.ndarray:
    """All pairs (i, j, distance), i < j, with Hamming distance <= ``max_distance``.

    Exact for buckets of up to ``max_bucket`` hashes; returns an (n, 3) int64 array sorted by
    (i, j). ``bands``: (shift, bits) of disjoint bit ranges covering the 64 bits; one of them
    differs in at most ``max_distance // len(bands)`` bits (the radius searched).
    """
    h = np.ascontiguousarray(hashes, dtype=np.uint64)
    n = len(h)
    if n < 2 or max_distance < 0:
        return np.zeros((0, 3), dtype=np.int64)
    radius = max_distance // len(bands)
    # A table the size of the data: a band keeps only its low `bits` bits, about log2(n), so
    # buckets hold about one hash and the table stays in cache. Dropping bits only widens the
    # buckets (the full 64-bit check decides); hashes within r bits on the whole band are
    # within r bits on any part of it, so nothing is missed, and fewer masks are needed.
    width = max(10, int(np.ceil(np.log2(n))))
    found: list[np.ndarray] = []
    for shift, full_bits in bands:
        bits = min(full_bits, width)
        band = ((h >> np.uint64(shift)) & np.uint64((1 << bits) - 1)).astype(np.int32)
        order = np.argsort(band, kind="stable").astype(np.int32)  # input order within a bucket
        band, hs = band[order], h[order]  # queries in band order: table reads become near-sequential
        counts = np.bincount(band, minlength=1 << bits)
        table = np.zeros(1 << bits, dtype=np.int64)
        np.cumsum(counts[:-1], out=table[1:])
        # Within a bucket (mask 0): each hash pairs with the ones after it in its bucket.
        k = np.flatnonzero(counts[band] > 1)  # hashes that share their bucket (few)
        after = np.minimum(table[band[k]] + counts[band[k]] - k - 1, max_bucket)
        found.extend(_expand(hs, order, k, k + 1, after, max_distance))
        del k, after
        # one 8-byte read per lookup: bucket start (high 32 bits) and size (low 32 bits)
        table <<= 32  # (in place: at ten million hashes each of these arrays is 130 MB)
        table |= np.minimum(counts, max_bucket, out=counts)
        del counts
        # Across buckets: a pair (a, b) with band_a ^ band_b == mask is seen from both ends;
        # only the end whose band has a 0 at the mask's top bit looks (the other half is skipped).
        for mask in _masks(bits, radius)[1:]:
            top = 1 << (int(mask).bit_length() - 1)
            packed = table[band ^ np.int32(mask)]
            packed[(band & top) != 0] = 0  # the other end of these pairs looks instead
            cnt = _low32(packed)
            hit = np.flatnonzero(cnt)
            found.extend(_expand(hs, order, hit, packed[hit] >> 32, cnt[hit].astype(np.int64), max_distance))
            del packed, cnt, hit
        del band, hs, table, order
    if not found:
        return np.zeros((0, 3), dtype=np.int64)
    pairs = np.concatenate(found)
    # a pair close in several bands is found once per band
    key = pairs[:, 0] * n + pairs[:, 1]
    _, first = np.unique(key, return_index=True)
    return pairs[first]


def _low32(a: np.ndarray) -> np.ndarray:
    """The low 32 bits of an int64 array, as a view where the byte order allows (no copy)."""
    if sys.byteorder == "little":
        return a.view(np.uint32)[0::2]
    return (a & 0xFFFFFFFF).astype(np.uint32)


def _expand(hs, order, k, lo, cnt, max_distance):
    """Turn lookups (query position k, bucket start lo, count), in band order, into the pairs of
    input indices within ``max_distance``, a chunk of lookups at a time."""
    keep = cnt > 0
    if not keep.all():
        k, lo, cnt = k[keep], lo[keep], cnt[keep]
    if len(k) == 0:
        return
    ends = np.cumsum(cnt)
    begin = 0
    while begin < len(k):
        base = ends[begin - 1] if begin else 0
        stop = max(int(np.searchsorted(ends, base + CHUNK, side="right")), begin + 1)
        sz = cnt[begin:stop]
        a = np.repeat(k[begin:stop], sz)
        b = np.repeat(lo[begin:stop] - (np.cumsum(sz) - sz), sz) + np.arange(int(sz.sum()))
        d = popcount(hs[a] ^ hs[b])
        close = np.flatnonzero(d <= max_distance)  # few: map back to input indices only these
        if len(close):
            i, j = order[a[close]].astype(np.int64), order[b[close]].astype(np.int64)
            yield np.stack([np.minimum(i, j), np.maximum(i, j), d[close].astype(np.int64)], axis=1)
        begin = stop


def all_pairs(hashes: np.ndarray, max_distance: int) -> np.ndarray:
    """The naive way, for benchmarks and tests: every pair compared. O(n^2)."""
    h = np.ascontiguousarray(hashes, dtype=np.uint64)
    out = []
    for i in range(len(h) - 1):
        d = popcount(h[i] ^ h[i + 1 :])
        j = np.flatnonzero(d <= max_distance)
        if len(j):
            out.append(np.stack([np.full(len(j), i), j + i + 1, d[j].astype(np.int64)], axis=1))
    return np.concatenate(out) if out else np.zeros((0, 3), dtype=np.int64)
