"""A folder's files as evidence for each other: a soft prior over their encodings.

Twenty bytes of a caption cannot tell neighbouring code pages apart (a Turkish caption reads as
clean cp1252, a short GB2312 one as CP949), but the captions of one folder come from one source
and usually share their language and encoding. `by_folder` pools the readings of a folder's
files, each weighted by the evidence it rests on (its bytes beyond ASCII, capped so that one long
file does not outvote the rest, times its confidence), and lets the folder's leading encoding
decide a file only where the file itself cannot: its bytes must decode strictly in that encoding
to text no less plausible (`plausibility.penalty_of`) than its own reading. A file whose own
reading is more plausible keeps it (folders do mix encodings), and so does every file of a folder
without a clear leader. The choice is a deterministic function of the files' bytes and readings,
whatever order they come in.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from pipeline.media.text.plausibility import penalty_of

# A file's evidence counts up to this many bytes beyond ASCII.
EVIDENCE_CAP = 64
# The leading encoding decides only with at least this many other files reading in it...
MIN_SUPPORT = 3
# ...and this many times the evidence of the file's own encoding among the other files.
LEAD = 2.0


@dataclass(frozen=True)
class FolderFile:
    """One file of a folder as the per-file decode left it: its bytes, its text (None when
    refused), the encoding named and the confidence."""

    data: bytes
    text: str | None
    encoding: str | None
    confidence: float | None


@dataclass(frozen=True)
class Chosen:
    """The reading taken for a file; ``by_prior`` when the folder's prior replaced its own."""

    text: str | None
    encoding: str | None
    by_prior: bool = False
    note: str = ""


def by_folder(files: list[FolderFile]) -> list[Chosen]:
    """The reading of each of ``files`` (one folder's), in their order: its own, or the folder's
    leading encoding's where that reads it no less plausibly and the rest of the folder says so."""
    weights = [_evidence(f) for f in files]
    total: dict[str, float] = {}
    support: dict[str, int] = {}
    for (enc, w) in weights:
        if enc is not None and w > 0:
            total[enc] = total.get(enc, 0.0) + w
            support[enc] = support.get(enc, 0) + 1
    return [_choose(f, own, total, support) for f, own in zip(files, weights, strict=True)]


def _evidence(f: FolderFile) -> tuple[str | None, float]:
    """(the file's encoding, canonical name; how much its reading says about the folder)."""
    if f.text is None or f.encoding is None:
        return None, 0.0
    name = _name(f.encoding)
    if name is None or name in ("utf-8", "ascii"):
        return name, 0.0  # UTF-8 is settled per file, and says nothing about a legacy neighbour
    beyond = sum(1 for ch in f.text if ord(ch) > 0x7F)
    return name, min(EVIDENCE_CAP, beyond) * float(f.confidence or 0.0)


def _choose(f: FolderFile, own: tuple[str | None, float], total: dict[str, float], support: dict[str, int]) -> Chosen:
    """``f``'s reading: the folder's leader (the others' evidence, ``f``'s own left out) where it
    leads clearly and reads ``f`` at least as plausibly."""
    kept = Chosen(f.text, f.encoding)
    enc, w = own
    others = {e: t - (w if e == enc else 0.0) for e, t in total.items()}
    count = {e: n - (1 if e == enc and w > 0 else 0) for e, n in support.items()}
    leader = max(sorted(others), key=lambda e: others[e], default=None)
    if leader is None or leader == enc or count[leader] < MIN_SUPPORT:
        return kept
    if enc is not None and others.get(enc, 0.0) * LEAD > others[leader]:
        return kept
    try:
        text = f.data.decode(leader)
    except UnicodeDecodeError:
        return kept
    if text == f.text:
        return kept
    if f.text is not None and f.encoding is not None:
        if penalty_of(text, f.data, leader) > penalty_of(f.text, f.data, f.encoding):
            return kept
    elif penalty_of(text, f.data, leader):
        return kept  # a refused file is read in the leader only when nothing in it looks out of place
    what = f"read as {f.encoding}" if f.text is not None else "refused"
    return Chosen(text, leader, True, f"decoded as {leader}, the encoding of {count[leader]} other files of its "
                                        f"folder, which reads it as plausibly (on its own: {what})")


def _name(codec: str) -> str | None:
    try:
        return codecs.lookup(codec).name
    except LookupError:
        return None
