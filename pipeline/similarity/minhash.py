"""Near-duplicate texts: character shingles, MinHash signatures and LSH band keys.

A text is a set of shingles (overlapping character n-grams of its casefolded, space-collapsed
form; characters rather than words so that Chinese and Japanese, which have no spaces, work
too). Two texts are near duplicates when the Jaccard similarity of their shingle sets reaches a
threshold; decide confirms every candidate with the real Jaccard (`jaccard`).

Candidates come from LSH: the signature (one-permutation MinHash with densification: a single
hash per shingle, the minimum kept per bin, empty bins borrowed from the next one, so a 50 KB
text costs one vectorised pass) is cut into bands; texts that agree on every value of some band
are candidates. With 16 bands of 4 values, a pair at Jaccard 0.8 becomes a candidate with
probability 1 - (1 - 0.8^4)^16 > 99.9%, at 0.7 98.8%, at 0.3 only 12%.

What a worker stores per text is just the band keys, 16 x uint32 = 64 bytes, base64 in the
journal (`encode_keys`), not a Python list of ints. `pipe check`'s leakage search, which has no
shingles at hand when it compares train with val, keeps the signature itself (`text_signature`)
to estimate the similarity (`estimated_jaccard`).
"""

from __future__ import annotations

import base64

import numpy as np

SHINGLE = 5  # characters per shingle
BINS = 64  # signature length
BANDS = 16  # LSH bands; BINS / BANDS values per band
_ROWS = BINS // BANDS
_BIN_SHIFT = np.uint64(64 - 6)  # top 6 bits choose one of 64 bins
_LOW = np.uint64((1 << 58) - 1)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_P = np.uint64(0x100000001B3)  # FNV prime, the rolling-hash multiplier


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads every input bit over the whole 64-bit word (wraps mod 2^64)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


# Texts are shingled in pieces of this many characters: the arrays shingling makes (about 40
# bytes a character while they exist) then stay a few tens of MB, whatever the text's length,
# instead of dozens of times the text (a 100 MB text took 3.4 GB). Results are the same.
PIECE = 1 << 19


def normalize_for_shingles(text: str) -> str:
    return " ".join(text.casefold().split())


def _normalised_pieces(text: str, piece: int = PIECE):
    """`normalize_for_shingles(text)` in consecutive pieces, each made from at most ``piece``
    characters of ``text``: their concatenation is exactly the whole. Casefolding maps each
    character on its own; a word cut by a piece boundary is joined again (no space between)."""
    if len(text) <= piece:
        yield normalize_for_shingles(text)
        return
    emitted, in_word = False, False  # in_word: the previous piece ended inside a word
    for i in range(0, len(text), piece):
        part = text[i : i + piece]
        words = part.casefold().split()
        if words:
            joined = not emitted or (in_word and not part[0].isspace())
            yield ("" if joined else " ") + " ".join(words)
            emitted = True
        in_word = not part[-1].isspace()


def _ngram_hashes(t: str, n: int) -> np.ndarray:
    """The mixed 64-bit hash of every character n-gram of ``t`` (len(t) >= n), in text order."""
    cps = np.frombuffer(t.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = np.zeros(len(cps) - n + 1, dtype=np.uint64)
        for k in range(n):
            h = h * _P + cps[k : len(cps) - n + 1 + k]
        return _mix(h)


def _sorted_unique(h: np.ndarray) -> np.ndarray:
    h.sort()
    return h[np.r_[True, h[1:] != h[:-1]]]  # unique (np.unique is several times slower)


def _piece_hashes(text: str, n: int):
    """Hashes of all n-grams of the normalised text, piece by piece (sorted unique per piece):
    each piece is preceded by the last n - 1 characters before it, so every n-gram is counted;
    a normalised text shorter than ``n`` is one shingle."""
    tail, total = "", 0
    for p in _normalised_pieces(text, PIECE):
        total += len(p)
        s = tail + p
        if len(s) >= n:
            yield _sorted_unique(_ngram_hashes(s, n))
        tail = s[-(n - 1):] if n > 1 else ""
    if 0 < total < n:
        yield _ngram_hashes(tail, total)


def shingles(text: str, n: int = SHINGLE) -> np.ndarray:
    """Sorted unique 64-bit hashes of the character n-grams of ``text`` (normalised first)."""
    parts = list(_piece_hashes(text, n))
    if not parts:
        return np.zeros(0, dtype=np.uint64)
    if len(parts) == 1:
        return parts[0]
    h = np.concatenate(parts)
    del parts
    return _sorted_unique(h)


def signature(hashes: np.ndarray) -> np.ndarray:
    """One-permutation MinHash with rotation densification: ``BINS`` uint64 values."""
    mins, filled = _bin_minima(np.sort(hashes) if len(hashes) else hashes)
    return _densify(mins, filled)


def text_signature_values(text: str) -> np.ndarray:
    """`signature(shingles(text))`, computed piece by piece: the minimum per bin of each piece's
    hashes, without ever holding the whole text's shingles."""
    mins = np.full(BINS, np.iinfo(np.uint64).max, dtype=np.uint64)
    filled = np.zeros(BINS, dtype=bool)
    for h in _piece_hashes(text, SHINGLE):
        m, f = _bin_minima(np.sort(h))
        mins[f] = np.minimum(mins[f], m[f])
        filled |= f
    return _densify(mins, filled)


def _bin_minima(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the smallest of the sorted ``hashes`` in each bin, which bins have any)."""
    mins = np.zeros(BINS, dtype=np.uint64)
    filled = np.zeros(BINS, dtype=bool)
    if len(hashes) == 0:
        return mins, filled
    bins = (hashes >> _BIN_SHIFT).astype(np.int64)  # hashes are sorted, so each bin is a contiguous run
    first = np.searchsorted(bins, np.arange(BINS))
    ok = first < len(hashes)
    ok[ok] = bins[first[ok]] == np.arange(BINS)[ok]
    mins[ok] = hashes[first[ok]]
    filled[ok] = True
    return mins, filled


def _densify(mins: np.ndarray, filled: np.ndarray) -> np.ndarray:
    sig = np.zeros(BINS, dtype=np.uint64)
    if not filled.any():
        return sig
    sig[filled] = mins[filled] & _LOW
    if not filled.all():
        # an empty bin takes the value of the next filled bin to its right (circularly), marked
        # with the distance, so two texts with the same shingles fill it the same way
        idx = np.flatnonzero(filled)
        pos = np.arange(BINS)
        nxt = idx[np.searchsorted(idx, pos) % len(idx)]
        dist = ((nxt - pos) % BINS).astype(np.uint64)
        with np.errstate(over="ignore"):
            sig = np.where(filled, sig, _mix(sig[nxt] + dist * _P))
    return sig


def band_keys(sig: np.ndarray) -> np.ndarray:
    """``BANDS`` uint32 keys: texts sharing a key in the same band are LSH candidates."""
    rows = sig.reshape(BANDS, _ROWS)
    with np.errstate(over="ignore"):
        k = np.zeros(BANDS, dtype=np.uint64)
        for j in range(_ROWS):
            k = _mix(k * _P + rows[:, j])
    return (k >> np.uint64(32)).astype(np.uint32)


def text_keys(text: str) -> np.ndarray:
    return band_keys(text_signature_values(text))


def encode_keys(keys: np.ndarray) -> str:
    return base64.b64encode(keys.astype("<u4").tobytes()).decode("ascii")


def decode_keys(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype="<u4")


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard similarity of two shingle sets (sorted unique hash arrays)."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


def text_signature(text: str) -> bytes:
    """The text's signature, ``BINS`` little-endian uint32 values (the low half of each value: two
    texts that differ in a value still differ there but for a 1 in 2^32 chance)."""
    return text_signature_values(text).astype("<u4").tobytes()


def estimated_jaccard(a: bytes, b: bytes) -> float:
    """The share of equal values of two `text_signature`s: an estimate of the texts' Jaccard
    similarity (within about 0.05 with 64 values)."""
    return float(np.mean(np.frombuffer(a, "<u4") == np.frombuffer(b, "<u4")))


def candidate_pairs(keys: np.ndarray) -> np.ndarray:
    """Pairs (i, j), i < j, of rows of ``keys`` (n x BANDS uint32) equal in at least one band.

    Sorting each band groups equal keys; each member of a group is paired with the group's
    first member and with its neighbour in the sorted order (a chain, not all pairs, so a
    thousand copies of one boilerplate text give a thousand pairs, not half a million).
    Confirmation against the kept copy happens in decide.
    """
    n = len(keys)
    if n < 2:
        return np.zeros((0, 2), dtype=np.int64)
    out = []
    for b in range(keys.shape[1]):
        col = keys[:, b]
        order = np.argsort(col, kind="stable")
        s = col[order]
        same = s[1:] == s[:-1]
        if not same.any():
            continue
        # previous element in the same group
        left, right = order[:-1][same], order[1:][same]
        out.append(np.stack([left, right], axis=1))
        # first member of the group
        starts = np.r_[True, ~same]
        group_first = order[np.maximum.accumulate(np.where(starts, np.arange(n), 0))]
        members = order[1:][same]
        heads = group_first[1:][same]
        out.append(np.stack([heads, members], axis=1))
    if not out:
        return np.zeros((0, 2), dtype=np.int64)
    pairs = np.concatenate(out).astype(np.int64)
    pairs = np.sort(pairs, axis=1)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return np.unique(pairs, axis=0)
