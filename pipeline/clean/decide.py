"""Decisions that need every file at once: caption pairs, labels, duplicates, label conflicts.

Input: the per-file results in manifest order. Output: one `Decision` per result, plus what
report.json lists (label conflicts, near-duplicate counts). The unit is the *sample*: the files
sharing a key (an image, a text, or an image and its caption), kept or rejected together.

1. A file that failed its own checks keeps its reason; the other half of its pair is
   ``pair_rejected`` ("its image was quarantined: truncated").
2. With ``--labels``, a sample none of whose files has a label is ``missing_label``; an image and
   caption labelled differently are a ``label_conflict``.
3. Exact duplicates: same normalised content (decoded pixels for a sample with an image,
   normalised text for a text alone). A caption never makes an image unique: an image and its
   caption (a `.txt` or the labels file's text) are deduplicated as the image, and the pair's
   status follows its image, so the same photo under two captions, or with a caption and
   without, is one picture kept once. The duplicate's caption goes with its image
   (``duplicate``, ``duplicate_of`` naming the kept copy's caption, or its image when the kept
   copy has none): one picture with two captions is one sample with one caption, not two.
4. Near duplicates, among what is left: images (captioned or not) by perceptual hash
   (multi-index search, `near_images`), confirmed on pixels (`perceptual.same_picture`); texts
   alone by MinHash LSH (`minhash`), confirmed by the real Jaccard similarity. Each sample is
   compared with the *kept* copy of a group, never chained through others, so a series of
   small edits cannot drift from one picture to a different one.
5. The best copy is kept: the largest image (width x height), then one with a caption over one
   without (the caption is what a captioned dataset is for), then the first path.
6. Copies of one content under different labels are a ``label_conflict``, handled by policy:
   ``quarantine`` (every copy), ``majority`` (the most common label wins; a tie quarantines),
   ``first`` (the label of the first path wins). Each group is listed in report.json.
"""

from __future__ import annotations

import io
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.clean.columns import DUPLICATE, IMAGE, KEPT, KINDS, QUARANTINED, REASONS, TEXT, Columns, Decisions, OutputRef
from pipeline.clean.records import Decision, FileResult
from pipeline.formats.vocabulary import Reason

if TYPE_CHECKING:
    from pipeline.storage import Folder

MAX_TRIES = 16  # kept copies one sample is compared with at most (best copies first)


@dataclass(frozen=True)
class DecideSettings:
    label_conflicts: str = "quarantine"
    near_dedup: bool = True
    near_image_distance: int = 8  # phash bits
    near_text_jaccard: float = 0.8
    labels_required: bool = False  # --labels was given: every sample needs a label
    resize_mode: str = "pad"  # how outputs were made, to find the input inside them


@dataclass
class Outcome:
    decisions: Sequence[Decision]  # a `Decisions`: columns, one decision per file on demand
    label_conflicts: list[dict] = field(default_factory=list)
    near: dict = field(default_factory=dict)  # near-duplicate search: candidates, confirmed
    kept_samples: int = 0  # kept samples (an image and its caption file are one), what pipe shard counts


class Outputs:
    """Reads cleaned outputs back for confirmation: reduced images and texts, a few cached."""

    def __init__(self, clean_dir: Folder, parked: str, resize_mode: str, cache: int = 4096):
        self.folder, self.parked = clean_dir, parked
        self.resize_mode = resize_mode
        self._cache: OrderedDict = OrderedDict()
        self._size = cache

    def _bytes(self, r: OutputRef) -> bytes | None:
        """The output's bytes, from data/ or parked, through CLEAN_DIR's folder (None: not there)."""
        if not r.output:
            return None
        for rel in (r.output, f"{self.parked}/{r.output}"):
            try:
                return self.folder.read(rel)
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                continue
        return None

    def _cached(self, key, load):
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        value = load()
        self._cache[key] = value
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return value

    def view(self, r: OutputRef):
        from pipeline.similarity.perceptual import load_view

        def load():
            data = self._bytes(r)
            return load_view(io.BytesIO(data), r.width, r.height, self.resize_mode) if data is not None else None
        return self._cached(("v", r.source), load)

    def shingles(self, r: OutputRef):
        from pipeline.similarity.minhash import shingles

        def load():
            try:
                data = self._bytes(r)
                return shingles(data.decode("utf-8")) if data is not None else None
            except (OSError, UnicodeDecodeError):
                return None
        return self._cached(("t", r.source), load)


class Samples:
    """The samples as columns (sample k: the files sharing a key, in file order; a text that is
    no caption is a sample alone), ordered by their first file, and what decide says of each."""

    def __init__(self, c: Columns):
        n = c.n
        kind, reason = c.kind, c.reason
        alone = (kind == TEXT) & np.isin(reason, [REASONS.index(r) for r in NO_CAPTION])
        rows = np.flatnonzero(~alone)
        # a sample starts at a text that is no caption, or at the first file of its key
        codes, first = np.unique(c.key[rows], return_index=True)
        starts = alone.copy()
        starts[rows[first]] = True
        self.first = np.flatnonzero(starts)  # files[0] of each sample
        at_start = np.full(n, -1, dtype=np.int64)
        at_start[self.first] = np.arange(len(self.first))
        first_of_code = np.full(int(c.key.max()) + 1 if n else 0, -1, dtype=np.int64)
        first_of_code[codes] = rows[first]
        sid = at_start.copy()
        sid[rows] = at_start[first_of_code[c.key[rows]]]
        self.of_row = sid
        s = len(self.first)
        self.n = s
        self.count = np.bincount(sid, minlength=s)
        self.image = self._first_where(kind == IMAGE, s)
        self.text = self._first_where(kind == TEXT, s)
        self.status = np.full(s, KEPT, dtype=np.int8)
        self.reason = np.full(s, -1, dtype=np.int16)
        self.detail = np.full(s, "", dtype=object)
        self.of = np.full(s, -1, dtype=np.int64)
        self.label = np.full(s, -1, dtype=np.int64)
        self._order: np.ndarray | None = None
        self._offsets: np.ndarray | None = None

    def _first_where(self, mask: np.ndarray, s: int) -> np.ndarray:
        """Per sample, its first file where ``mask`` holds (-1: none)."""
        rows = np.flatnonzero(mask)
        out = np.full(s, -1, dtype=np.int64)
        k, first = np.unique(self.of_row[rows], return_index=True)
        out[k] = rows[first]
        return out

    def files(self, k: int) -> list[int]:
        if self.count[k] == 1:
            return [int(self.first[k])]
        if self._order is None:
            self._order = np.argsort(self.of_row, kind="stable")
            self._offsets = np.concatenate(([0], np.cumsum(self.count)))
        assert self._offsets is not None
        return self._order[self._offsets[k]:self._offsets[k + 1]].tolist()

    def quarantine(self, k: int, reason: Reason, detail: str = "") -> None:
        self.status[k], self.reason[k], self.detail[k] = QUARANTINED, REASONS.index(reason), detail


def decide(results: Sequence[FileResult] | Columns, s: DecideSettings = DecideSettings(),
           outputs: Outputs | None = None) -> Outcome:
    c = results if isinstance(results, Columns) else Columns.from_results(results)
    out = Decisions(c)
    smp = Samples(c)
    caption = np.zeros(c.n, dtype=bool)
    caption[list(c.caption)] = True
    _pairs_fail_together(c, smp)
    _labels(c, smp, s)
    rank = _ranks(c, smp, caption)
    sig = _signatures(c, smp)
    groups = _exact_duplicates(smp, rank, sig)
    near = _near_duplicates(c, smp, rank, groups, s, outputs) if s.near_dedup else {}
    conflicts = _label_conflicts(c, smp, rank, groups, sig, s.label_conflicts)
    _caption_notes(c, smp, caption)
    _to_files(c, smp, out, caption)
    return Outcome(out, conflicts, near, int(np.count_nonzero(smp.status == KEPT)))


# --- samples ------------------------------------------------------------------------------

# a text file with one of these reasons is no caption: binary bytes beside an image, or an empty
# caption (the image is good; it is kept without a caption, the text keeps its own reason)
NO_CAPTION = (Reason.BINARY_CONTENT, Reason.EMPTY_TEXT, Reason.ZERO_BYTES)


def _first_per_sample(smp: Samples, rows: np.ndarray) -> np.ndarray:
    out = np.full(smp.n, -1, dtype=np.int64)
    k, first = np.unique(smp.of_row[rows], return_index=True)
    out[k] = rows[first]
    return out


def _pairs_fail_together(c: Columns, smp: Samples) -> None:
    failed = _first_per_sample(smp, np.flatnonzero(c.reason >= 0))
    pair = (smp.image >= 0) & (smp.text >= 0)  # an image with a caption file
    for row, why in c.caption_reason.items():  # a labels-file caption of a sample's image, rejected
        k = smp.of_row[row]
        if why and failed[k] < 0 and smp.image[k] == row and smp.text[k] < 0:
            smp.quarantine(k, Reason.PAIR_REJECTED, f"its caption in the labels file was rejected: {why}")
    alone = np.flatnonzero((failed >= 0) & ~pair)
    smp.status[alone] = QUARANTINED
    smp.reason[alone] = c.reason[failed[alone]]
    for k in np.flatnonzero((failed >= 0) & pair).tolist():
        f = int(failed[k])
        half = "image" if c.kind[f] == IMAGE else "caption"
        smp.quarantine(k, Reason.PAIR_REJECTED, f"its {half} was quarantined: {REASONS[c.reason[f]]}")


def _labels(c: Columns, smp: Samples, s: DecideSettings) -> None:
    rows = np.flatnonzero(c.label >= 0)
    lo = np.full(smp.n, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(smp.n, -1, dtype=np.int64)
    np.minimum.at(lo, smp.of_row[rows], c.label[rows])
    np.maximum.at(hi, smp.of_row[rows], c.label[rows])
    labelled = hi >= 0
    smp.label = np.where(labelled & (lo == hi), hi, -1)
    if not s.labels_required:
        return
    kept = smp.status == KEPT
    pair = (smp.image >= 0) & (smp.text >= 0)
    missing = kept & ~labelled
    smp.status[missing], smp.reason[missing] = QUARANTINED, REASONS.index(Reason.MISSING_LABEL)
    smp.detail[missing & pair] = "the labels file names neither the image nor its caption"
    smp.detail[missing & ~pair] = "the labels file has no label for it"
    for k in np.flatnonzero(kept & labelled & (lo != hi)).tolist():
        labels = sorted({c.label_names[c.label[i]] for i in smp.files(k) if c.label[i] >= 0})
        smp.quarantine(k, Reason.LABEL_CONFLICT, f"the image and its caption are labelled differently: {', '.join(labels)}")


def _ranks(c: Columns, smp: Samples, caption: np.ndarray) -> np.ndarray:
    """Position of each sample in keep-preference order: largest image, then captioned, then first path."""
    has = smp.image >= 0
    img = np.where(has, smp.image, 0)
    area = np.where(has, np.maximum(c.width[img], 0) * np.maximum(c.height[img], 0), 0)
    pair = has & ((smp.text >= 0) | caption[img])
    order = np.lexsort((smp.first, ~pair, -area))
    rank = np.empty(smp.n, dtype=np.int64)
    rank[order] = np.arange(smp.n)
    return rank


def _signatures(c: Columns, smp: Samples) -> np.ndarray:
    """What makes two samples the same content: the image's decoded pixels when there is an
    image (its caption does not count), else the text's normalised content, as one code per
    sample (kind and content hash); -1 when unknown."""
    i = np.where(smp.image >= 0, smp.image, smp.text)
    ok = i >= 0
    i = np.where(ok, i, 0)
    h = c.chash[i].astype(np.int64)
    return np.where(ok & (h >= 0), h * len(KINDS) + c.kind[i], -1)


# --- duplicates ---------------------------------------------------------------------------

@dataclass
class Groups:
    """Samples of equal content: ``best[k]`` is the kept copy of k's exact group (-1: in none),
    ``keys`` those kept copies in order of their content's first sample, ``merged`` the kept
    copies that became near duplicates of another (their whole group goes with them)."""

    best: np.ndarray
    keys: np.ndarray
    merged: dict[int, int] = field(default_factory=dict)


def _exact_duplicates(smp: Samples, rank: np.ndarray, sig: np.ndarray) -> Groups:
    ks = np.flatnonzero((smp.status == KEPT) & (sig >= 0))
    ks = ks[np.lexsort((rank[ks], sig[ks]))]  # by content, best copy first
    start = np.ones(len(ks), dtype=bool)
    start[1:] = sig[ks[1:]] != sig[ks[:-1]]
    heads = np.flatnonzero(start)
    group = np.cumsum(start) - 1
    best = np.full(smp.n, -1, dtype=np.int64)
    best[ks] = ks[heads][group]
    dup = ks[~start]
    smp.status[dup], smp.reason[dup], smp.of[dup] = DUPLICATE, REASONS.index(Reason.EXACT_DUPLICATE), best[dup]
    first_seen = np.minimum.reduceat(ks, heads) if len(ks) else heads
    return Groups(best, ks[heads][np.argsort(first_seen, kind="stable")])


def _near_duplicates(c: Columns, smp: Samples, rank, groups: Groups, s: DecideSettings, outputs: Outputs | None) -> dict:
    stats = {"candidates": 0, "confirmed": 0, "unconfirmable": 0}
    live = groups.keys[smp.status[groups.keys] == KEPT]
    img, txt = smp.image[live], smp.text[live]
    images = live[(img >= 0) & c.phash_valid[np.where(img >= 0, img, 0)]].tolist()
    texts = live[(img < 0) & (txt >= 0) & c.minhash_valid[np.where(txt >= 0, txt, 0)]].tolist()
    for members, finder in ((images, _image_candidates), (texts, _text_candidates)):
        if len(members) < 2:
            continue
        # images with and without a caption are one population: a caption never hides a copy
        pairs = finder(c, smp, members, s)
        stats["candidates"] += len(pairs)
        _cluster(c, smp, rank, groups, members, pairs, s, outputs, stats)
    return stats


def _image_candidates(c: Columns, smp: Samples, members: list[int], s: DecideSettings):
    from pipeline.similarity.near_images import candidate_pairs

    hashes = np.ascontiguousarray(c.phash[smp.image[members]], dtype=np.uint64)
    pairs = candidate_pairs(hashes, s.near_image_distance)
    return [(int(a), int(b), f"perceptual hash {int(d)} bits apart") for a, b, d in pairs]


def _text_candidates(c: Columns, smp: Samples, members: list[int], s: DecideSettings):
    from pipeline.similarity.minhash import BANDS, candidate_pairs, decode_keys

    keys = np.zeros((len(members), BANDS), dtype=np.uint32)
    for row, k in enumerate(members):
        keys[row] = decode_keys(c.minhash(int(smp.text[k])) or "")  # members have one (minhash_valid)
    return [(int(a), int(b), "") for a, b in candidate_pairs(keys)]


def _cluster(c: Columns, smp: Samples, rank, groups: Groups, members, pairs, s, outputs, stats) -> None:
    """Leader clustering: in keep order, each sample becomes a near duplicate of the first kept
    copy among its candidates that the pixels/text confirm, or is kept itself."""
    if not pairs:
        return
    neighbours: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for a, b, why in pairs:
        ka, kb = members[a], members[b]
        later, earlier = (ka, kb) if rank[ka] > rank[kb] else (kb, ka)
        neighbours[later].append((earlier, why))
    leader: dict[int, int] = {}
    for k in sorted(neighbours.keys() | {e for v in neighbours.values() for e, _ in v}, key=lambda k: rank[k]):
        tried: set[int] = set()
        for cand, why in sorted(neighbours.get(k, ()), key=lambda x: rank[leader.get(x[0], x[0])]):
            target = leader.get(cand, cand)
            if target in tried or len(tried) >= MAX_TRIES:
                continue
            tried.add(target)
            same, detail = _confirm(c, smp, k, target, s, outputs, stats)
            if same:
                leader[k] = target
                smp.status[k], smp.reason[k], smp.of[k] = DUPLICATE, REASONS.index(Reason.NEAR_DUPLICATE), target
                smp.detail[k] = "; ".join(x for x in (why, detail) if x)
                stats["confirmed"] += 1
                groups.merged[k] = target
                break


def _confirm(c: Columns, smp: Samples, a: int, b: int, s, outputs: Outputs | None, stats) -> tuple[bool, str]:
    """Whether sample ``a`` is the same content as ``b``: the same picture on pixels for samples
    with an image (whatever their captions), a real Jaccard similarity over the limit for texts alone."""
    if outputs is None:
        stats["unconfirmable"] += 1
        return False, ""
    if smp.image[a] >= 0:
        va, vb = outputs.view(c.view(int(smp.image[a]))), outputs.view(c.view(int(smp.image[b])))
        if va is None or vb is None:
            stats["unconfirmable"] += 1
            return False, ""
        from pipeline.similarity.perceptual import same_picture

        return same_picture(vb, va)
    from pipeline.similarity.minhash import jaccard

    sa, sb = outputs.shingles(c.view(int(smp.text[a]))), outputs.shingles(c.view(int(smp.text[b])))
    if sa is None or sb is None:
        stats["unconfirmable"] += 1
        return False, ""
    j = jaccard(sa, sb)
    return j >= s.near_text_jaccard, f"Jaccard similarity {j:.2f}"


# --- label conflicts ----------------------------------------------------------------------

def _final_groups(smp: Samples, groups: Groups) -> tuple[np.ndarray, np.ndarray]:
    """Every grouped sample and the kept copy of its group after near duplicates merged groups,
    sorted by group, then by rank is left to the caller."""
    ks = np.flatnonzero(groups.best >= 0)
    final = np.arange(smp.n, dtype=np.int64)
    if groups.merged:
        final[list(groups.merged)] = list(groups.merged.values())
    return ks, final[groups.best[ks]]


def _label_conflicts(c: Columns, smp: Samples, rank, groups: Groups, sig: np.ndarray, policy: str) -> list[dict]:
    ks, final = _final_groups(smp, groups)
    lo = np.full(smp.n, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(smp.n, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lo, final, smp.label[ks])  # a missing label (-1) counts as a label of its own
    np.maximum.at(hi, final, smp.label[ks])
    mixed = lo[final] != hi[final]
    ks, final = ks[mixed], final[mixed]
    order = np.lexsort((rank[ks], rank[final]))  # groups in keep order, each group's members too
    ks, final = ks[order], final[order]
    heads = np.flatnonzero(np.concatenate(([True], final[1:] != final[:-1]))) if len(ks) else np.zeros(0, np.int64)

    def label(k: int) -> str | None:
        return None if smp.label[k] < 0 else c.label_names[smp.label[k]]

    def name(lab: str | None) -> str:
        return "(none)" if lab is None else lab

    report = []
    for members in np.split(ks, heads[1:]) if len(ks) else []:
        members = members.tolist()
        counts = Counter(label(k) for k in members)
        winner = _winning_label(smp, label, members, counts, policy)
        summary = ", ".join(f"{name(lab)} x{n}" for lab, n in sorted(counts.items(), key=lambda x: (-x[1], name(x[0]))))
        entry: dict[str, Any] = {"files": sorted(c.source(int(smp.first[k])) for k in members),
                                 "labels": {name(lab): n for lab, n in sorted(counts.items(), key=lambda x: name(x[0]))},
                                 "policy": policy}
        if winner is _NO_WINNER:
            for k in members:
                other = next(m for m in members if label(m) != label(k))
                smp.quarantine(k, Reason.LABEL_CONFLICT, f"copies of this content carry different labels ({summary}); all quarantined")
                smp.of[k] = other
            entry.update(action="quarantined every copy", kept=None)
        else:
            keep = next(k for k in members if label(k) == winner)
            smp.status[keep], smp.reason[keep], smp.of[keep], smp.detail[keep] = KEPT, -1, -1, ""
            for k in members:
                if k == keep:
                    continue
                if label(k) == winner:
                    exact = sig[k] == sig[keep]
                    smp.status[k], smp.of[k] = DUPLICATE, keep
                    smp.reason[k] = REASONS.index(Reason.EXACT_DUPLICATE if exact else Reason.NEAR_DUPLICATE)
                else:
                    smp.quarantine(k, Reason.LABEL_CONFLICT,
                                   f"labelled {name(label(k))}, but {policy} of its copies says {name(winner)} ({summary})")
                    smp.of[k] = keep
            entry.update(action=f"kept label {name(winner)} ({policy})", kept=c.source(int(smp.first[keep])))
        report.append(entry)
    return report


_NO_WINNER = object()


def _winning_label(smp: Samples, label, members: list[int], counts: Counter, policy: str):
    if policy == "majority":
        (top, n), *rest = counts.most_common()
        return _NO_WINNER if rest and rest[0][1] == n else top
    if policy == "first":
        return label(min(members, key=lambda k: smp.first[k]))
    return _NO_WINNER


# --- captions of duplicate images ------------------------------------------------------------

def _caption_of(c: Columns, smp: Samples, k: int) -> str | None:
    """The identity of a sample's caption (its normalised text's hash), None without one."""
    if smp.text[k] >= 0:
        t = int(smp.text[k])
        return c.content_hash(t) or f"file:{t}"
    caption = c.caption.get(int(smp.image[k])) if smp.image[k] >= 0 else None
    if caption is None:
        return None
    from pipeline.media.text.clean import text_hash

    return text_hash(caption)


def _caption_notes(c: Columns, smp: Samples, caption: np.ndarray) -> None:
    """Say so when a duplicate image's caption is not the kept copy's: the caption is dropped
    with its image, and a user looking for it should learn why from the row."""
    ks = np.flatnonzero((smp.status == DUPLICATE) & (smp.of >= 0) & (smp.image >= 0))
    ks = ks[(smp.text[ks] >= 0) | caption[smp.image[ks]]]  # the others have no caption to lose
    for k in ks.tolist():
        mine, kept = _caption_of(c, smp, k), _caption_of(c, smp, int(smp.of[k]))
        if mine is None or mine == kept:
            continue
        note = ("image and caption dropped together; the kept copy has no caption" if kept is None
                else "image and caption dropped together; the kept copy has another caption")
        smp.detail[k] = "; ".join(x for x in (smp.detail[k], note) if x)


# --- back to files ------------------------------------------------------------------------

INLINE_CAPTION = "with its caption from the labels file"


def _to_files(c: Columns, smp: Samples, out: Decisions, caption: np.ndarray) -> None:
    img = smp.image[(smp.status == KEPT) & (smp.image >= 0) & (smp.text < 0)]
    out.detail[img[caption[img] & (c.reason[img] < 0)]] = INLINE_CAPTION
    rows = np.flatnonzero((smp.status[smp.of_row] != KEPT) & (c.reason < 0))  # a file with its own reason keeps it
    k = smp.of_row[rows]
    out.status[rows], out.reason[rows], out.detail[rows] = smp.status[k], smp.reason[k], smp.detail[k]
    # the file of the other sample that corresponds to each (image to image, ...), else its first
    other = smp.of[k]
    has = other >= 0
    o = np.where(has, other, 0)
    kind = c.kind[rows]
    twin = np.where(kind == IMAGE, smp.image[o], np.where(kind == TEXT, smp.text[o], -1))
    twin = np.where(twin >= 0, twin, smp.first[o])
    out.twin[rows] = np.where(has, twin, -1)
