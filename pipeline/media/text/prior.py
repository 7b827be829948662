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
from collections import Counter
from dataclasses import dataclass

from pipeline.media.text.decoded import Decoded
from pipeline.media.text.plausibility import penalty_of
from pipeline.media.text.scripts import SCRIPT_TAGS

# A file's evidence counts up to this many bytes beyond ASCII.
EVIDENCE_CAP = 64
# The leading encoding decides only with at least this many other files reading in it...
MIN_SUPPORT = 3
# ...and this many times the evidence of the file's own encoding among the other files.
LEAD = 2.0
# The confidence recorded for a reading the folder's prior decided.
PRIOR_CONFIDENCE = 0.9
# A file whose own reading is as plausible as the leader's keeps it from this many bytes beyond
# ASCII up: a KOI8-R caption of 30 Cyrillic letters in a cp866 folder is a KOI8-R caption, while
# one or two accented letters fit any neighbouring code page.
FEW_BYTES = 8


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

    def decoded(self) -> Decoded:
        """The prior's reading, for `clean.clean_text` to judge in place of its own detection."""
        return Decoded(self.text, self.encoding, PRIOR_CONFIDENCE, notes=[self.note] if self.note else [])


def by_folder(files: list[FolderFile]) -> list[Chosen]:
    """The reading of each of ``files`` (one folder's), in their order: its own, or the folder's
    leading encoding's where that reads it no less plausibly and the rest of the folder says so."""
    own = [_evidence(f) for f in files]
    names = sorted({enc for enc, w in own if enc is not None and w > 0})
    votes = [_votes(f, enc, w, names) for f, (enc, w) in zip(files, own, strict=True)]
    folder = _Folder(names)
    for f, v in zip(files, votes, strict=True):
        folder.add(f, v, +1)
    out = []
    for f, (enc, _w), v in zip(files, own, votes, strict=True):
        folder.add(f, v, -1)  # the others' evidence: the file's own left out
        out.append(_choose(f, enc, folder))
        folder.add(f, v, +1)
    return out


class _Folder:
    """What a folder's files say, summed: each encoding's evidence and how many files read in it;
    for each pair of encodings, the evidence of the files that read as their own text in the first
    and not in the second (a Spanish caption reads the same in cp1252 and cp1250: it tells them
    nothing; one with "ñ" does); and, for each encoding, how many of the files read in it show
    each character beyond ASCII, case folded (its alphabet in this folder: a reading that gives a
    caption characters no other file of the folder's leading encoding has is the odd one, and
    the alphabet of the files read in it, not of the whole folder, because the misread files
    agree with each other: MacCyrillic capitals read as cp1251 are quotes, "‘ирийский")."""

    def __init__(self, names: list[str]):
        self.total: dict[str, float] = dict.fromkeys(names, 0.0)
        self.support: dict[str, int] = dict.fromkeys(names, 0)
        self.over: dict[tuple[str, str], float] = {}
        self.letters: dict[str, Counter[str]] = {name: Counter() for name in names}

    def add(self, f: FolderFile, votes: dict[str, float], sign: int) -> None:
        for enc, w in votes.items():
            self.total[enc] += sign * w
            self.support[enc] += sign
            for other in self.total:
                if other not in votes:
                    self.over[enc, other] = self.over.get((enc, other), 0.0) + sign * w
        if f.text is not None and votes:
            shown = _letters(f.text)
            for enc in votes:
                self.letters[enc].update(dict.fromkeys(shown, sign))

    def unseen(self, text: str, enc: str) -> int:
        """How many of ``text``'s characters beyond ASCII no file read in ``enc`` shows."""
        seen = self.letters[enc]
        return sum(1 for ch in _letters(text) if seen[ch] <= 0)


def _letters(text: str) -> set[str]:
    """The characters beyond ASCII of ``text``, case folded, that a code page chooses among few:
    letters and signs of the alphabetic scripts; of CJK text, its script alone (its ideographs are
    thousands, most seen once, but an Arabic caption read as GB18030 ideographs is still odd in a
    folder with none)."""
    out = set()
    for ch in text.casefold():
        if ord(ch) < 0x3000:
            if ord(ch) > 0x7F and not ch.isspace():
                out.add(ch)
        elif SCRIPT_TAGS[ord(ch)] != " ":
            out.add(SCRIPT_TAGS[ord(ch)])
    return out


def _evidence(f: FolderFile) -> tuple[str | None, float]:
    """(the file's encoding, canonical name; how much its reading says about the folder)."""
    if f.text is None or f.encoding is None:
        return None, 0.0
    name = _name(f.encoding)
    if name is None or name in ("utf-8", "ascii"):
        return name, 0.0  # UTF-8 is settled per file, and says nothing about a legacy neighbour
    return name, min(EVIDENCE_CAP, _beyond_ascii(f.data)) * float(f.confidence or 0.0)


def _votes(f: FolderFile, enc: str | None, w: float, names: list[str]) -> dict[str, float]:
    """The file's evidence, for its own encoding and every other of the folder's that reads it as
    the same text (Estonian "õ" is the same byte in cp1257 and ISO-8859-4: such a file says
    nothing between them)."""
    if enc is None or w <= 0 or f.text is None:
        return {}
    out = {enc: w}
    for other in names:
        if other == enc:
            continue
        text = _decode(f.data, other)
        if text is None:
            continue
        if text != f.text:
            continue
        out[other] = w
    return out


def _choose(f: FolderFile, enc: str | None, folder: _Folder) -> Chosen:
    """``f``'s reading: the folder's leader (``folder``: the others' evidence) where it leads
    clearly over ``f``'s own encoding among the files that tell the two apart, and reads ``f``
    with no more letters the folder never shows and more plausibly, or as plausibly when ``f``'s
    own reading rests on few bytes beyond ASCII (`FEW_BYTES`) or shows letters the folder never
    does where the leader's shows none."""
    kept = Chosen(f.text, f.encoding)
    others, count = folder.total, folder.support
    leader = max(sorted(others), key=lambda e: others[e], default=None)
    if leader is None or leader == enc or count[leader] < MIN_SUPPORT or others[leader] <= 0:
        return kept
    if enc is not None and enc in others and folder.over.get((enc, leader), 0.0) * LEAD >= folder.over.get((leader, enc), 0.0):
        return kept
    text = _decode(f.data, leader)
    if text is None or text == f.text:
        return kept
    mine = penalty_of(text, f.data, leader)
    if f.text is not None and f.encoding is not None:
        theirs = penalty_of(f.text, f.data, f.encoding)
        strange, own_strange = folder.unseen(text, leader), folder.unseen(f.text, leader)
        if strange > own_strange:
            return kept  # the leader's reading gives it letters the folder never shows; its own does not
        if mine > theirs or (mine == theirs and strange == own_strange and _beyond_ascii(f.data) > FEW_BYTES
                             and _script(text) in ("", _script(f.text))):
            return kept  # its own reading is more plausible, or as plausible, of the same script, and rests on enough
    elif mine or folder.unseen(text, leader):
        return kept  # a refused file is read in the leader only when nothing in it looks out of place
    what = f"read as {f.encoding}" if f.text is not None else "refused"
    return Chosen(text, leader, True, f"decoded as {leader}, the encoding of {count[leader]} other files of its "
                                        f"folder, which reads it as plausibly (on its own: {what})")


def _script(text: str) -> str:
    """The script of most of the text's letters beyond ASCII (a tag of `SCRIPT_TAGS`): a 14-letter
    Hebrew caption read as Cyrillic is as clean, but in a folder of Hebrew readings it is the odd one."""
    tags = Counter(SCRIPT_TAGS[ord(ch)] for ch in text if ord(ch) > 0x7F)
    tags.pop(" ", None)
    return max(sorted(tags), key=lambda t: tags[t], default="")


def _decode(data: bytes, codec: str) -> str | None:
    try:
        return data.decode(codec)
    except (UnicodeDecodeError, LookupError):
        return None


def _beyond_ascii(data: bytes) -> int:
    return len(data) - len(data.translate(None, _HIGH_BYTES))


_HIGH_BYTES = bytes(range(0x80, 0x100))


def _name(codec: str) -> str | None:
    try:
        return codecs.lookup(codec).name
    except LookupError:
        return None
