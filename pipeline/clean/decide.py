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

import os
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.clean.records import Decision, FileResult
from pipeline.formats.vocabulary import Kind, Reason, Status

KEEP = Decision(Status.KEPT)
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
    decisions: list[Decision]
    label_conflicts: list[dict] = field(default_factory=list)
    near: dict = field(default_factory=dict)  # near-duplicate search: candidates, confirmed


class Outputs:
    """Reads cleaned outputs back for confirmation: reduced images and texts, a few cached."""

    def __init__(self, clean_dir: Path, parked: str, resize_mode: str, cache: int = 4096):
        self.dirs = (Path(clean_dir), Path(clean_dir) / parked)
        self.resize_mode = resize_mode
        self._cache: OrderedDict = OrderedDict()
        self._size = cache

    def _path(self, r: FileResult) -> str | None:
        for d in self.dirs:
            p = d / r.output
            if r.output and p.is_file():
                return os.fspath(p)
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

    def view(self, r: FileResult):
        from pipeline.similarity.perceptual import load_view

        def load():
            p = self._path(r)
            return load_view(p, r.width, r.height, self.resize_mode) if p else None
        return self._cached(("v", r.source), load)

    def shingles(self, r: FileResult):
        from pipeline.similarity.minhash import shingles

        def load():
            p = self._path(r)
            try:
                return shingles(Path(p).read_text(encoding="utf-8")) if p else None
            except (OSError, UnicodeDecodeError):
                return None
        return self._cached(("t", r.source), load)


@dataclass
class Sample:
    files: list[int]
    image: int | None = None
    text: int | None = None
    label: str | None = None
    status: Status = Status.KEPT
    reason: Reason | None = None
    detail: str = ""
    of: int | None = None  # the sample this one duplicates (or conflicts with)


def decide(results: list[FileResult], s: DecideSettings = DecideSettings(), outputs: Outputs | None = None) -> Outcome:
    out: list[Decision] = [KEEP if r.reason is None else Decision(Status.QUARANTINED, r.reason, None, r.detail) for r in results]
    samples = _samples(results)
    _pairs_fail_together(results, samples)
    _labels(results, samples, s)
    rank = _ranks(results, samples)
    groups = _exact_duplicates(results, samples, rank)
    near = _near_duplicates(results, samples, rank, groups, s, outputs) if s.near_dedup else {}
    conflicts = _label_conflicts(results, samples, rank, groups, s.label_conflicts)
    _caption_notes(results, samples)
    _to_files(results, samples, out)
    return Outcome(out, conflicts, near)


# --- samples ------------------------------------------------------------------------------

# a text file with one of these reasons is no caption: binary bytes beside an image, or an empty
# caption (the image is good; it is kept without a caption, the text keeps its own reason)
NO_CAPTION = (Reason.BINARY_CONTENT, Reason.EMPTY_TEXT, Reason.ZERO_BYTES)


def _samples(results: list[FileResult]) -> list[Sample]:
    by_key: dict[str, Sample] = {}
    order: list[Sample] = []
    for i, r in enumerate(results):
        if r.kind == Kind.TEXT and r.reason in NO_CAPTION:
            order.append(Sample([i], text=i))  # no caption: alone, and the image is kept without one
            continue
        smp = by_key.get(r.key)
        if smp is None:
            smp = by_key[r.key] = Sample([])
            order.append(smp)
        smp.files.append(i)
        if r.kind == Kind.IMAGE and smp.image is None:
            smp.image = i
        elif r.kind == Kind.TEXT and smp.text is None:
            smp.text = i
    return order


def _is_pair(smp: Sample, results=None) -> bool:
    """An image with a caption: a caption file, or (given ``results``) a labels-file caption."""
    if smp.image is None:
        return False
    return smp.text is not None or (results is not None and results[smp.image].caption is not None)


def _pairs_fail_together(results, samples) -> None:
    for smp in samples:
        failed = [i for i in smp.files if results[i].reason]
        if not failed:
            if smp.image is not None and smp.text is None and results[smp.image].caption_reason:
                smp.status, smp.reason = Status.QUARANTINED, Reason.PAIR_REJECTED
                smp.detail = f"its caption in the labels file was rejected: {results[smp.image].caption_reason}"
            continue
        smp.status = Status.QUARANTINED
        if _is_pair(smp):
            f = results[failed[0]]
            half = "image" if f.kind == Kind.IMAGE else "caption"
            smp.reason, smp.detail = Reason.PAIR_REJECTED, f"its {half} was quarantined: {f.reason}"
        else:
            smp.reason = results[failed[0]].reason


def _labels(results, samples, s: DecideSettings) -> None:
    for smp in samples:
        labels = {results[i].label for i in smp.files if results[i].label is not None}
        smp.label = next(iter(labels)) if len(labels) == 1 else None
        if smp.status != Status.KEPT or not s.labels_required:
            continue
        if not labels:
            smp.status, smp.reason = Status.QUARANTINED, Reason.MISSING_LABEL
            smp.detail = "the labels file names neither the image nor its caption" if _is_pair(smp) \
                else "the labels file has no label for it"
        elif len(labels) > 1:
            smp.status, smp.reason = Status.QUARANTINED, Reason.LABEL_CONFLICT
            smp.detail = f"the image and its caption are labelled differently: {', '.join(sorted(labels))}"


def _ranks(results, samples) -> np.ndarray:
    """Position of each sample in keep-preference order: largest image, then captioned, then first path."""
    def area(smp):
        r = results[smp.image] if smp.image is not None else None
        return (r.width or 0) * (r.height or 0) if r else 0
    order = sorted(range(len(samples)), key=lambda k: (-area(samples[k]), not _is_pair(samples[k], results), samples[k].files[0]))
    rank = np.empty(len(samples), dtype=np.int64)
    rank[order] = np.arange(len(samples))
    return rank


def _signature(results, smp: Sample):
    """What makes two samples the same content: the image's decoded pixels when there is an
    image (its caption does not count), else the text's normalised content; None when unknown."""
    i = smp.image if smp.image is not None else smp.text
    if i is None or not results[i].content_hash:
        return None
    return (results[i].kind, results[i].content_hash)


# --- duplicates ---------------------------------------------------------------------------

def _exact_duplicates(results, samples, rank) -> dict[int, list[int]]:
    """Group samples of equal content; return kept sample -> all members (itself first)."""
    by_sig: dict[tuple, list[int]] = defaultdict(list)
    for k, smp in enumerate(samples):
        if smp.status == Status.KEPT:
            sig = _signature(results, smp)
            if sig is not None:
                by_sig[sig].append(k)
    groups: dict[int, list[int]] = {}
    for members in by_sig.values():
        members.sort(key=lambda k: rank[k])
        best = members[0]
        groups[best] = members
        for k in members[1:]:
            samples[k].status, samples[k].reason, samples[k].of = Status.DUPLICATE, Reason.EXACT_DUPLICATE, best
    return groups


def _near_duplicates(results, samples, rank, groups, s: DecideSettings, outputs: Outputs | None) -> dict:
    stats = {"candidates": 0, "confirmed": 0, "unconfirmable": 0}
    live = [k for k in groups if samples[k].status == Status.KEPT]
    images = [k for k in live if samples[k].image is not None and results[samples[k].image].phash is not None]
    texts = [k for k in live if samples[k].image is None and samples[k].text is not None and results[samples[k].text].minhash]
    for members, finder in ((images, _image_candidates), (texts, _text_candidates)):
        if len(members) < 2:
            continue
        # images with and without a caption are one population: a caption never hides a copy
        pairs = finder(results, samples, members, s)
        stats["candidates"] += len(pairs)
        _cluster(results, samples, rank, groups, members, pairs, s, outputs, stats)
    return stats


def _image_candidates(results, samples, members, s):
    from pipeline.similarity.near_images import candidate_pairs

    hashes = np.array([results[samples[k].image].phash for k in members], dtype=np.uint64)
    pairs = candidate_pairs(hashes, s.near_image_distance)
    return [(int(a), int(b), f"perceptual hash {int(d)} bits apart") for a, b, d in pairs]


def _text_candidates(results, samples, members, s):
    from pipeline.similarity.minhash import BANDS, candidate_pairs, decode_keys

    keys = np.zeros((len(members), BANDS), dtype=np.uint32)
    for row, k in enumerate(members):
        keys[row] = decode_keys(results[samples[k].text].minhash)
    return [(int(a), int(b), "") for a, b in candidate_pairs(keys)]


def _cluster(results, samples, rank, groups, members, pairs, s, outputs, stats) -> None:
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
        for cand, why in sorted(neighbours.get(k, ()), key=lambda c: rank[leader.get(c[0], c[0])]):
            target = leader.get(cand, cand)
            if target in tried or len(tried) >= MAX_TRIES:
                continue
            tried.add(target)
            same, detail = _confirm(results, samples[k], samples[target], s, outputs, stats)
            if same:
                leader[k] = target
                smp = samples[k]
                smp.status, smp.reason, smp.of = Status.DUPLICATE, Reason.NEAR_DUPLICATE, target
                smp.detail = "; ".join(x for x in (why, detail) if x)
                stats["confirmed"] += 1
                groups[target].extend(groups.pop(k, [k]))
                break


def _confirm(results, a: Sample, b: Sample, s, outputs: Outputs | None, stats) -> tuple[bool, str]:
    """Whether ``a`` is the same content as ``b``: the same picture on pixels for samples with an
    image (whatever their captions), a real Jaccard similarity over the limit for texts alone."""
    if outputs is None:
        stats["unconfirmable"] += 1
        return False, ""
    if a.image is not None:
        va, vb = outputs.view(results[a.image]), outputs.view(results[b.image])
        if va is None or vb is None:
            stats["unconfirmable"] += 1
            return False, ""
        from pipeline.similarity.perceptual import same_picture

        return same_picture(vb, va)
    from pipeline.similarity.minhash import jaccard

    sa, sb = outputs.shingles(results[a.text]), outputs.shingles(results[b.text])
    if sa is None or sb is None:
        stats["unconfirmable"] += 1
        return False, ""
    j = jaccard(sa, sb)
    return j >= s.near_text_jaccard, f"Jaccard similarity {j:.2f}"


# --- label conflicts ----------------------------------------------------------------------

def _label_conflicts(results, samples, rank, groups, policy: str) -> list[dict]:
    report = []
    for _, members in sorted(groups.items(), key=lambda g: rank[g[0]]):
        if len(members) < 2:
            continue
        counts = Counter(samples[k].label for k in members)
        if len(counts) < 2:
            continue
        members = sorted(members, key=lambda k: rank[k])
        winner = _winning_label(samples, members, counts, policy)

        def name(lab: str | None) -> str:
            return "(none)" if lab is None else lab

        summary = ", ".join(f"{name(lab)} x{n}" for lab, n in sorted(counts.items(), key=lambda x: (-x[1], name(x[0]))))
        entry: dict[str, Any] = {"files": sorted(results[samples[k].files[0]].source for k in members),
                 "labels": {name(lab): n for lab, n in sorted(counts.items(), key=lambda x: name(x[0]))},
                 "policy": policy}
        if winner is _NO_WINNER:
            for k in members:
                smp = samples[k]
                other = next(m for m in members if samples[m].label != smp.label)
                smp.status, smp.reason, smp.of = Status.QUARANTINED, Reason.LABEL_CONFLICT, other
                smp.detail = f"copies of this content carry different labels ({summary}); all quarantined"
            entry.update(action="quarantined every copy", kept=None)
        else:
            keep = next(k for k in members if samples[k].label == winner)
            samples[keep].status, samples[keep].reason, samples[keep].of, samples[keep].detail = Status.KEPT, None, None, ""
            for k in members:
                if k == keep:
                    continue
                smp = samples[k]
                if smp.label == winner:
                    exact = _signature(results, smp) == _signature(results, samples[keep])
                    smp.status, smp.reason, smp.of = Status.DUPLICATE, Reason.EXACT_DUPLICATE if exact else Reason.NEAR_DUPLICATE, keep
                else:
                    smp.status, smp.reason, smp.of = Status.QUARANTINED, Reason.LABEL_CONFLICT, keep
                    smp.detail = f"labelled {name(smp.label)}, but {policy} of its copies says {name(winner)} ({summary})"
            entry.update(action=f"kept label {name(winner)} ({policy})", kept=results[samples[keep].files[0]].source)
        report.append(entry)
    return report


_NO_WINNER = object()


def _winning_label(samples, members, counts: Counter, policy: str):
    if policy == "majority":
        (top, n), *rest = counts.most_common()
        return _NO_WINNER if rest and rest[0][1] == n else top
    if policy == "first":
        return samples[min(members, key=lambda k: samples[k].files[0])].label
    return _NO_WINNER


# --- captions of duplicate images ------------------------------------------------------------

def _caption_of(results, smp: Sample) -> str | None:
    """The identity of a sample's caption (its normalised text's hash), None without one."""
    if smp.text is not None:
        return results[smp.text].content_hash or f"file:{smp.text}"
    caption = results[smp.image].caption if smp.image is not None else None
    if caption is None:
        return None
    from pipeline.media.text.clean import text_hash

    return text_hash(caption)


def _caption_notes(results, samples) -> None:
    """Say so when a duplicate image's caption is not the kept copy's: the caption is dropped
    with its image, and a user looking for it should learn why from the row."""
    for smp in samples:
        if smp.status != Status.DUPLICATE or smp.of is None or smp.image is None:
            continue
        mine, kept = _caption_of(results, smp), _caption_of(results, samples[smp.of])
        if mine is None or mine == kept:
            continue
        note = ("image and caption dropped together; the kept copy has no caption" if kept is None
                else "image and caption dropped together; the kept copy has another caption")
        smp.detail = "; ".join(x for x in (smp.detail, note) if x)


# --- back to files ------------------------------------------------------------------------

INLINE_CAPTION = "with its caption from the labels file"


def _to_files(results, samples, out: list[Decision]) -> None:
    for smp in samples:
        if smp.status == Status.KEPT:
            if smp.image is not None and smp.text is None and results[smp.image].caption is not None \
                    and not results[smp.image].reason:
                out[smp.image] = Decision(Status.KEPT, None, None, INLINE_CAPTION)
            continue
        other = samples[smp.of] if smp.of is not None else None
        for i in smp.files:
            if results[i].reason:
                continue  # keeps its own reason
            twin = _twin(results, other, results[i].kind) if other else None
            out[i] = Decision(smp.status, smp.reason, twin, smp.detail)


def _twin(results, other: Sample, kind: Kind) -> str | None:
    """The file of ``other`` that corresponds to a file of this kind (image to image, ...)."""
    i = other.image if kind == Kind.IMAGE else other.text if kind == Kind.TEXT else None
    i = i if i is not None else other.files[0]
    return results[i].source
