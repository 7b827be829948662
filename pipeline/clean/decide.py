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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.clean.columns import (
    DUPLICATE,
    HAS_CHASH,
    HAS_MINHASH,
    HAS_PHASH,
    IMAGE,
    KEPT,
    KINDS,
    QUARANTINED,
    REASONS,
    TEXT,
    Columns,
    Decisions,
    OutputRef,
    Rows,
    Strings,
    index_type,
)
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
    label_conflicts: Sequence[dict] = field(default_factory=list)  # a `Conflicts`
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
    no caption is a sample alone), ordered by their first file, and what decide says of each.
    Row and sample numbers are 4-byte integers up to two billion files (`index_type`)."""

    def __init__(self, c: Columns):
        n = c.n
        self.idx = idx = index_type(n)
        alone = (c.kind == TEXT) & np.isin(c.reason, [REASONS.index(r) for r in NO_CAPTION])
        # a sample starts at a text that is no caption, or at the first other file of its key
        start = np.arange(n, dtype=idx)  # each file's sample's first file
        rows = np.flatnonzero(~alone).astype(idx)
        del alone
        lead = c.lead[rows]
        first = np.full(n, n, dtype=idx)  # by the key's first row: its first file that is not alone
        np.minimum.at(first, lead, rows)
        start[rows] = first[lead]
        del rows, lead, first
        starts = start == np.arange(n, dtype=idx)
        self.first = np.flatnonzero(starts).astype(idx)  # files[0] of each sample
        number = np.cumsum(starts, dtype=idx) - 1
        del starts
        self.of_row = number[start]
        del number, start
        s = len(self.first)
        self.n = s
        self.image = self._first_where(c.kind == IMAGE)
        self.text = self._first_where(c.kind == TEXT)
        self.status = np.full(s, KEPT, dtype=np.int8)
        self.reason = np.full(s, -1, dtype=np.int8)
        self.detail: dict[int, str] = {}  # by sample, only where there is one
        self.of = np.full(s, -1, dtype=idx)
        self.label = np.full(s, -1, dtype=c.label.dtype)
        self.rank = np.zeros(0, dtype=idx)  # each sample's place in keep-preference order (`_ranks`)

    def _first_where(self, mask: np.ndarray) -> np.ndarray:
        """Per sample, its first file where ``mask`` holds (-1: none)."""
        return _first_per_sample(self, np.flatnonzero(mask))

    def files_of(self, ks: Sequence[int]) -> dict[int, list[int]]:
        """The files of samples ``ks``, in file order."""
        wanted = np.zeros(self.n, dtype=bool)
        wanted[np.asarray(ks, dtype=np.int64)] = True
        rows = np.flatnonzero(wanted[self.of_row])
        out: dict[int, list[int]] = {int(k): [] for k in ks}
        for r, k in zip(rows.tolist(), self.of_row[rows].tolist()):
            out[k].append(r)
        return out

    def quarantine(self, k: int, reason: Reason, detail: str = "") -> None:
        self.status[k], self.reason[k] = QUARANTINED, REASONS.index(reason)
        self.set_detail(k, detail)

    def set_detail(self, k: int, detail: str) -> None:
        if detail:
            self.detail[k] = detail
        else:
            self.detail.pop(k, None)


def decide(results: Sequence[FileResult] | Columns, s: DecideSettings = DecideSettings(),
           outputs: Outputs | None = None) -> Outcome:
    """The decisions over every file. Given `Columns`, decide frees each column once it is done
    with it (`Columns.drop`: a run of millions holds only what the step at hand needs), so it is
    called once per `Columns`; ``label``, the captions and the parts stay for the manifest."""
    c = results if isinstance(results, Columns) else Columns.from_results(results)
    smp = Samples(c)
    c.drop("lead")
    caption = np.zeros(c.n, dtype=bool)
    caption[list(c.caption)] = True
    _pairs_fail_together(c, smp)
    _labels(c, smp, s)
    smp.rank = _ranks(c, smp, caption)
    c.drop("area")
    groups = _exact_duplicates(c, smp)
    c.drop("chash")
    near = _near_duplicates(c, smp, groups, s, outputs) if s.near_dedup else {}
    c.drop("phash", "flags")
    conflicts = _label_conflicts(c, smp, groups, s.label_conflicts)
    _caption_notes(c, smp, caption)
    out = Decisions(c)
    _to_files(c, smp, out, caption)
    return Outcome(out, conflicts, near, int(np.count_nonzero(smp.status == KEPT)))


# --- samples ------------------------------------------------------------------------------

# a text file with one of these reasons is no caption: binary bytes beside an image, or an empty
# caption (the image is good; it is kept without a caption, the text keeps its own reason)
NO_CAPTION = (Reason.BINARY_CONTENT, Reason.EMPTY_TEXT, Reason.ZERO_BYTES)


def _first_per_sample(smp: Samples, rows: np.ndarray) -> np.ndarray:
    """Per sample, the first of ``rows`` (ascending) that is one of its files (-1: none)."""
    none = np.iinfo(smp.idx).max
    out = np.full(smp.n, none, dtype=smp.idx)
    np.minimum.at(out, smp.of_row[rows], rows.astype(smp.idx))
    out[out == none] = -1
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
    kind = c.label.dtype
    lo = np.full(smp.n, np.iinfo(kind).max, dtype=kind)
    hi = np.full(smp.n, -1, dtype=kind)
    np.minimum.at(lo, smp.of_row[rows], c.label[rows])
    np.maximum.at(hi, smp.of_row[rows], c.label[rows])
    del rows
    labelled = hi >= 0
    smp.label = np.where(labelled & (lo == hi), hi, -1).astype(kind)
    if not s.labels_required:
        return
    kept = smp.status == KEPT
    pair = (smp.image >= 0) & (smp.text >= 0)
    missing = kept & ~labelled
    smp.status[missing], smp.reason[missing] = QUARANTINED, REASONS.index(Reason.MISSING_LABEL)
    for k in np.flatnonzero(missing & pair).tolist():
        smp.detail[k] = "the labels file names neither the image nor its caption"
    for k in np.flatnonzero(missing & ~pair).tolist():
        smp.detail[k] = "the labels file has no label for it"
    differ = np.flatnonzero(kept & labelled & (lo != hi)).tolist()
    for k, files in smp.files_of(differ).items():
        labels = sorted({c.label_names[c.label[i]] for i in files if c.label[i] >= 0})
        smp.quarantine(k, Reason.LABEL_CONFLICT, f"the image and its caption are labelled differently: {', '.join(labels)}")


def _ranks(c: Columns, smp: Samples, caption: np.ndarray) -> np.ndarray:
    """Position of each sample in keep-preference order: largest image, then captioned, then first
    path (samples are numbered in path order, so the sort's own order settles the last)."""
    has = smp.image >= 0
    img = np.where(has, smp.image, 0)
    unpaired = ~(has & ((smp.text >= 0) | caption[img]))
    smaller = c.take("area", img)
    del img
    smaller[~has] = 0
    np.negative(smaller, out=smaller)
    del has
    order = np.lexsort((unpaired, smaller))
    del smaller, unpaired
    rank = np.empty(smp.n, dtype=smp.idx)
    rank[order] = np.arange(smp.n, dtype=smp.idx)
    return rank


# --- duplicates ---------------------------------------------------------------------------

@dataclass
class Groups:
    """Samples of equal content: ``best[k]`` is the kept copy of k's exact group (-1: in none),
    ``keys`` those kept copies in order of their content's first sample, ``merged`` the kept
    copies that became near duplicates of another (their whole group goes with them)."""

    best: np.ndarray
    keys: np.ndarray
    merged: dict[int, int] = field(default_factory=dict)


def _exact_duplicates(c: Columns, smp: Samples) -> Groups:
    """Samples of the same content (the image's decoded pixels when there is an image, its
    caption aside, else the text's normalised content): the same kind and content hash. Grouped
    by the hashes' digests, each group then confirmed on the full hashes read from the parts."""
    rep = _content_file(smp, np.arange(smp.n, dtype=smp.idx))
    grouped = (smp.status == KEPT) & (rep >= 0)
    grouped &= (c.flags[np.maximum(rep, 0)] & HAS_CHASH) != 0
    del rep
    by_rank = np.empty(smp.n, dtype=smp.idx)
    by_rank[smp.rank] = np.arange(smp.n, dtype=smp.idx)
    ks = by_rank[grouped[by_rank]]  # the samples with a content, best copy first
    del by_rank, grouped
    content = _content(c, _content_file(smp, ks))
    order = np.argsort(content, kind="stable")  # by content, best copy first
    ks = ks[order]
    del order
    content.sort()  # (in place: the same as content[order])
    same = content[1:] == content[:-1]
    full = _full_contents(c, _content_file(smp, ks), same)
    if full is not None:  # two contents with one digest: grouped by the full hashes instead
        order = np.lexsort((smp.rank[ks], full, content))
        ks, content, full = ks[order], content[order], full[order]
        same = (content[1:] == content[:-1]) & (full[1:] == full[:-1])
    del content, full
    start = np.ones(len(ks), dtype=bool)
    start[1:] = ~same
    del same
    heads = np.flatnonzero(start)
    best = np.full(smp.n, -1, dtype=smp.idx)
    best[ks] = ks[heads][np.cumsum(start) - 1]
    dup = ks[~start]
    smp.status[dup], smp.reason[dup], smp.of[dup] = DUPLICATE, REASONS.index(Reason.EXACT_DUPLICATE), best[dup]
    first_seen = np.minimum.reduceat(ks, heads) if len(ks) else heads
    return Groups(best, ks[heads][np.argsort(first_seen, kind="stable")])


def _content_file(smp: Samples, ks: np.ndarray) -> np.ndarray:
    """The file whose content stands for each of samples ``ks``: its image, else its text (-1: neither)."""
    return np.where(smp.image[ks] >= 0, smp.image[ks], smp.text[ks])


def _content(c: Columns, rows: np.ndarray) -> np.ndarray:
    """Each file's content as one 64-bit key: its kind and its content hash's digest (wrapping)."""
    content = c.take("chash", rows)
    with np.errstate(over="ignore"):
        content *= np.uint64(len(KINDS))
        np.add(content, c.kind[rows], out=content, casting="unsafe")
    return content


def _full_contents(c: Columns, rows: np.ndarray, same: np.ndarray) -> np.ndarray | None:
    """None when every run of equal digests (``same``: row i + 1 continues row i's run) holds one
    kind and full content hash, as it almost surely does; else a code per row of its kind and
    full hash (-1 for rows alone in their run), to group by."""
    grouped = np.zeros(len(rows), dtype=bool)
    grouped[1:] |= same
    grouped[:-1] |= same
    at = np.flatnonzero(grouped)
    if not len(at):
        return None
    import pyarrow as pa
    import pyarrow.compute as pc

    kinds = [str(k) for k in c.kind[rows[at]].tolist()]
    contents = [f"{k}:{h}" for k, h in zip(kinds, c.content_hashes(rows[at]))]
    codes = pc.dictionary_encode(pa.array(contents, pa.string())).indices.to_numpy().astype(np.int64)
    run = np.cumsum(np.r_[True, ~same][:len(rows)])[at]  # the run of each grouped row
    heads = np.r_[True, run[1:] != run[:-1]]
    if (codes == codes[np.maximum.accumulate(np.where(heads, np.arange(len(at)), 0))]).all():
        return None
    full = np.full(len(rows), -1, dtype=np.int64)
    full[at] = codes
    return full


def _near_duplicates(c: Columns, smp: Samples, groups: Groups, s: DecideSettings, outputs: Outputs | None) -> dict:
    stats = {"candidates": 0, "confirmed": 0, "unconfirmable": 0}
    live = groups.keys[smp.status[groups.keys] == KEPT]
    img, txt = smp.image[live], smp.text[live]
    members = SimpleNamespace(images=live[(img >= 0) & ((c.flags[np.where(img >= 0, img, 0)] & HAS_PHASH) != 0)],
                              texts=live[(img < 0) & (txt >= 0) & ((c.flags[np.where(txt >= 0, txt, 0)] & HAS_MINHASH) != 0)])
    del live, img, txt
    for name, finder in (("images", _image_candidates), ("texts", _text_candidates)):
        if len(getattr(members, name)) < 2:
            continue
        # images with and without a caption are one population: a caption never hides a copy
        pairs = finder(c, smp, getattr(members, name), s, (c, smp, groups, members))
        stats["candidates"] += len(pairs)
        _cluster(c, smp, groups, getattr(members, name), pairs, s, outputs, stats)
    return stats


def _image_candidates(c: Columns, smp: Samples, members: np.ndarray, s: DecideSettings, held: tuple):
    from pipeline.similarity.near_images import candidate_pairs

    hashes = np.ascontiguousarray(c.take("phash", smp.image[members]), dtype=np.uint64)
    c.drop("phash")
    del members
    with parked(c.where, *held):  # the search's index (~70 B a hash) alone in memory, beside the hashes
        pairs = candidate_pairs(hashes, s.near_image_distance)
    return [(int(a), int(b), f"perceptual hash {int(d)} bits apart") for a, b, d in pairs]


def _text_candidates(c: Columns, smp: Samples, members: np.ndarray, s: DecideSettings, held: tuple):
    from typing import cast

    from pipeline.similarity.minhash import candidate_pairs

    keys = c.bands.of(smp.text[members])  # read from the disk a band at a time
    del members
    with parked(c.where, *held):
        pairs = candidate_pairs(cast(np.ndarray, keys))
    return [(int(a), int(b), "") for a, b in pairs]


@contextmanager
def parked(where: Path | None, *holders: Any) -> Iterator[None]:
    """Every large NumPy array attribute of ``holders`` written to an unnamed file on the
    driver's disk and dropped for the block, read back after it: the near-duplicate search's
    index needs more memory than any other step, and nothing else is needed while it is built."""
    import tempfile

    saved: list[tuple[Any, str]] = []
    with tempfile.TemporaryFile(dir=str(where) if where is not None and where.is_dir() else None,
                                prefix=".pipe-decide-") as f:
        for h in holders:
            for name, value in list(vars(h).items()):
                if isinstance(value, np.ndarray) and value.nbytes >= 1 << 16:
                    np.save(f, value, allow_pickle=False)
                    saved.append((h, name))
                    setattr(h, name, None)
        value = None  # (the loop's last array, let go too)
        try:
            yield
        finally:
            f.seek(0)
            for h, name in saved:
                setattr(h, name, np.load(f, allow_pickle=False))


def _cluster(c: Columns, smp: Samples, groups: Groups, members, pairs, s, outputs, stats) -> None:
    """Leader clustering: in keep order, each sample becomes a near duplicate of the first kept
    copy among its candidates that the pixels/text confirm, or is kept itself."""
    if not pairs:
        return
    rank = smp.rank
    neighbours: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for a, b, why in pairs:
        ka, kb = int(members[a]), int(members[b])
        later, earlier = (ka, kb) if rank[ka] > rank[kb] else (kb, ka)
        neighbours[later].append((earlier, why))
    involved = sorted(neighbours.keys() | {e for v in neighbours.values() for e, _ in v}, key=lambda k: rank[k])
    views = _views(c, smp, involved) if outputs is not None else {}
    leader: dict[int, int] = {}
    for k in involved:
        tried: set[int] = set()
        for cand, why in sorted(neighbours.get(k, ()), key=lambda x: rank[leader.get(x[0], x[0])]):
            target = leader.get(cand, cand)
            if target in tried or len(tried) >= MAX_TRIES:
                continue
            tried.add(target)
            same, detail = _confirm(smp, k, target, s, outputs, stats, views)
            if same:
                leader[k] = target
                smp.status[k], smp.reason[k], smp.of[k] = DUPLICATE, REASONS.index(Reason.NEAR_DUPLICATE), target
                smp.set_detail(k, "; ".join(x for x in (why, detail) if x))
                stats["confirmed"] += 1
                groups.merged[k] = target
                break


def _views(c: Columns, smp: Samples, ks: list[int]) -> dict[int, OutputRef]:
    """The outputs of samples ``ks``' images (texts, for texts alone), read from the parts at once."""
    files = [int(smp.image[k]) if smp.image[k] >= 0 else int(smp.text[k]) for k in ks]
    return c.views([f for f in files if f >= 0])


def _confirm(smp: Samples, a: int, b: int, s, outputs: Outputs | None, stats, views: dict[int, OutputRef]) -> tuple[bool, str]:
    """Whether sample ``a`` is the same content as ``b``: the same picture on pixels for samples
    with an image (whatever their captions), a real Jaccard similarity over the limit for texts alone."""
    if outputs is None:
        stats["unconfirmable"] += 1
        return False, ""
    if smp.image[a] >= 0:
        va, vb = outputs.view(views[int(smp.image[a])]), outputs.view(views[int(smp.image[b])])
        if va is None or vb is None:
            stats["unconfirmable"] += 1
            return False, ""
        from pipeline.similarity.perceptual import same_picture

        return same_picture(vb, va)
    from pipeline.similarity.minhash import jaccard

    sa, sb = outputs.shingles(views[int(smp.text[a])]), outputs.shingles(views[int(smp.text[b])])
    if sa is None or sb is None:
        stats["unconfirmable"] += 1
        return False, ""
    j = jaccard(sa, sb)
    return j >= s.near_text_jaccard, f"Jaccard similarity {j:.2f}"


# --- label conflicts ----------------------------------------------------------------------

def _final_groups(smp: Samples, groups: Groups) -> tuple[np.ndarray, np.ndarray]:
    """Every grouped sample and the kept copy of its group after near duplicates merged groups,
    sorted by group, then by rank is left to the caller."""
    ks = np.flatnonzero(groups.best >= 0).astype(smp.idx)
    final = np.arange(smp.n, dtype=smp.idx)
    if groups.merged:
        final[list(groups.merged)] = list(groups.merged.values())
    return ks, final[groups.best[ks]]


def _label_conflicts(c: Columns, smp: Samples, groups: Groups, policy: str) -> Conflicts:
    ks, final = _final_groups(smp, groups)
    kind = smp.label.dtype
    lo = np.full(smp.n, np.iinfo(kind).max, dtype=kind)
    hi = np.full(smp.n, np.iinfo(kind).min, dtype=kind)
    np.minimum.at(lo, final, smp.label[ks])  # a missing label (-1) counts as a label of its own
    np.maximum.at(hi, final, smp.label[ks])
    mixed = lo[final] != hi[final]
    del lo, hi
    ks, final = ks[mixed], final[mixed]
    order = np.lexsort((smp.rank[ks], smp.rank[final]))  # groups in keep order, each group's members too
    ks, final = ks[order], final[order]
    heads = np.flatnonzero(np.concatenate(([True], final[1:] != final[:-1]))) if len(ks) else np.zeros(0, np.int64)

    def label(k: int) -> str | None:
        return None if smp.label[k] < 0 else c.label_names[smp.label[k]]

    kept = np.full(len(heads), -1, dtype=np.int64)
    for g, members in enumerate(np.split(ks, heads[1:]) if len(ks) else []):
        members = members.tolist()
        counts = Counter(label(k) for k in members)
        winner = _winning_label(smp, label, members, counts, policy)
        summary = ", ".join(f"{_name(lab)} x{n}" for lab, n in sorted(counts.items(), key=lambda x: (-x[1], _name(x[0]))))
        if winner is _NO_WINNER:
            said = f"copies of this content carry different labels ({summary}); all quarantined"  # one string a group
            for k in members:
                other = next(m for m in members if label(m) != label(k))
                smp.quarantine(k, Reason.LABEL_CONFLICT, said)
                smp.of[k] = other
        else:
            keep = next(k for k in members if label(k) == winner)
            kept[g] = smp.first[keep]
            smp.status[keep], smp.reason[keep], smp.of[keep] = KEPT, -1, -1
            smp.set_detail(keep, "")
            wrong: dict[str | None, str] = {}
            for k in members:
                if k == keep:
                    continue
                if label(k) == winner:
                    exact = groups.best[k] == groups.best[keep]  # one exact group: the same content hash
                    smp.status[k], smp.of[k] = DUPLICATE, keep
                    smp.reason[k] = REASONS.index(Reason.EXACT_DUPLICATE if exact else Reason.NEAR_DUPLICATE)
                else:
                    lab = label(k)
                    if lab not in wrong:
                        wrong[lab] = f"labelled {_name(lab)}, but {policy} of its copies says {_name(winner)} ({summary})"
                    smp.quarantine(k, Reason.LABEL_CONFLICT, wrong[lab])
                    smp.of[k] = keep
    return Conflicts(smp.first[ks], smp.label[ks], heads, kept, c.label_names, policy, c.rows)


def _name(label: str | None) -> str:
    return "(none)" if label is None else label


class Conflicts(Sequence[dict]):
    """report.json's ``label_conflicts``, one entry a group of copies under different labels (in
    keep order): its files, their labels, the policy and what it did. Kept as arrays of rows
    and label codes until the report is written (`list(...)`): an entry as Python objects costs
    ~1 KB, and a dataset copied under other labels has hundreds of thousands of groups."""

    def __init__(self, rows: np.ndarray, labels: np.ndarray, heads: np.ndarray, kept: np.ndarray,
                 label_names: list[str], policy: str, source: Rows):
        self.rows, self.labels, self.heads, self.kept = rows, labels, heads, kept
        self.label_names, self.policy, self._source = label_names, policy, source

    def __len__(self) -> int:
        return len(self.heads)

    def __getitem__(self, g):
        if isinstance(g, slice):
            return [self[i] for i in range(*g.indices(len(self)))]
        if not -len(self) <= g < len(self):
            raise IndexError(g)
        g %= len(self)
        return next(self._entries(g, g + 1))

    def __iter__(self) -> Iterator[dict]:
        return self._entries(0, len(self))

    def _entries(self, first: int, last: int) -> Iterator[dict]:
        """The entries of groups first .. last, their files' sources read at once."""
        bounds = [*self.heads.tolist(), len(self.rows)]
        begin, end = bounds[first], bounds[last]
        kept = self.kept[first:last]
        sources = Strings.of(self._source, np.concatenate((self.rows[begin:end], kept[kept >= 0])), "source")
        names = sources.take(self.rows[begin:end]).to_pylist()
        for g in range(first, last):
            lo, hi = bounds[g], bounds[g + 1]
            labels = [None if x < 0 else self.label_names[x] for x in self.labels[lo:hi].tolist()]
            counts = Counter(labels)
            entry: dict[str, Any] = {"files": sorted(names[lo - begin:hi - begin]),
                                     "labels": {_name(lab): n for lab, n in sorted(counts.items(), key=lambda x: _name(x[0]))},
                                     "policy": self.policy}
            if self.kept[g] < 0:
                entry.update(action="quarantined every copy", kept=None)
            else:
                winner = labels[self.rows[lo:hi].tolist().index(int(self.kept[g]))]
                entry.update(action=f"kept label {_name(winner)} ({self.policy})",
                             kept=sources.take(self.kept[g:g + 1]).to_pylist()[0])
            yield entry


_NO_WINNER = object()


def _winning_label(smp: Samples, label, members: list[int], counts: Counter, policy: str):
    if policy == "majority":
        (top, n), *rest = counts.most_common()
        return _NO_WINNER if rest and rest[0][1] == n else top
    if policy == "first":
        return label(min(members, key=lambda k: smp.first[k]))
    return _NO_WINNER


# --- captions of duplicate images ------------------------------------------------------------

def _caption_of(c: Columns, smp: Samples, k: int, hashes: dict[int, str | None]) -> str | None:
    """The identity of a sample's caption (its normalised text's hash), None without one."""
    if smp.text[k] >= 0:
        t = int(smp.text[k])
        return hashes[t] or f"file:{t}"
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
    if not len(ks):
        return
    texts = np.concatenate((smp.text[ks], smp.text[smp.of[ks]]))
    texts = np.unique(texts[texts >= 0])
    hashes = dict(zip(texts.tolist(), c.content_hashes(texts)))  # the captions' hashes, read at once
    for k in ks.tolist():
        mine, kept = _caption_of(c, smp, k, hashes), _caption_of(c, smp, int(smp.of[k]), hashes)
        if mine is None or mine == kept:
            continue
        note = ("image and caption dropped together; the kept copy has no caption" if kept is None
                else "image and caption dropped together; the kept copy has another caption")
        smp.set_detail(k, "; ".join(x for x in (smp.detail.get(k, ""), note) if x))


# --- back to files ------------------------------------------------------------------------

INLINE_CAPTION = "with its caption from the labels file"


def _to_files(c: Columns, smp: Samples, out: Decisions, caption: np.ndarray) -> None:
    img = smp.image[(smp.status == KEPT) & (smp.image >= 0) & (smp.text < 0)]
    for r in img[caption[img] & (c.reason[img] < 0)].tolist():
        out.detail[r] = INLINE_CAPTION
    rows = np.flatnonzero((smp.status[smp.of_row] != KEPT) & (c.reason < 0))  # a file with its own reason keeps it
    k = smp.of_row[rows]
    out.status[rows], out.reason[rows] = smp.status[k], smp.reason[k]
    if smp.detail:
        said = np.zeros(smp.n, dtype=bool)
        said[list(smp.detail)] = True
        for r, kk in zip(rows[said[k]].tolist(), k[said[k]].tolist()):
            out.detail[r] = smp.detail[kk]
    # the file of the other sample that corresponds to each (image to image, ...), else its first
    other = smp.of[k]
    has = other >= 0
    o = np.where(has, other, 0)
    kind = c.kind[rows]
    twin = np.where(kind == IMAGE, smp.image[o], np.where(kind == TEXT, smp.text[o], -1))
    twin = np.where(twin >= 0, twin, smp.first[o])
    out.twin[rows] = np.where(has, twin, -1)
