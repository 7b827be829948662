"""The folder prior in `pipe clean`: a folder's texts as evidence for each other's encoding.

Twenty bytes of a caption cannot tell neighbouring code pages apart, but the captions of one
folder usually share their language and encoding (`pipeline.media.text.prior.by_folder`). This
step runs on the driver between processing and deciding, once every part is in: it picks, from
the parts' results, the folders where the prior can matter (at least `MIN_LEGACY` texts read in
a legacy code page or UTF-16 without a byte-order mark, and either more than one encoding or a
refused text), reads those files' bytes again through the input `Folder` (local or object
storage, whatever the executor), and for each file the folder decides, writes the output the
prior's reading gives and lays the changed fields over the file's row (`columns.Rows.patch`;
its hashes into the driver's columns).

The parts stay what each file said on its own: the prior is a deterministic function of them and
the input bytes, so a rerun (resumed or not, on any storage and executor) decides the same and writes the
same bytes. The outputs it wrote are listed in `output.PRIOR` (with the earlier run's, before it
writes any): a rerun reuses their files' results whatever their outputs' sizes, and writes back
the file's own reading where the prior no longer decides it (its folder changed).
"""

from __future__ import annotations

import base64
import codecs
from collections import defaultdict
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from pipeline.clean.columns import HAS_CHASH, HAS_MINHASH, TEXT, Columns, digest
from pipeline.clean.process import output_path
from pipeline.formats.vocabulary import Reason

if TYPE_CHECKING:
    from pipeline.media.text.prior import FolderFile

# a folder needs this many texts read in a legacy code page (or UTF-16 without a byte-order mark)
# before its prior says anything
MIN_LEGACY = 4
# per-file verdicts the prior may overturn: the bytes were read, no encoding fitted them well
REFUSED = frozenset(r.value for r in (Reason.UNDECODABLE_TEXT, Reason.BINARY_CONTENT, Reason.GARBLED_TEXT))
# readings settled per file, which say nothing about a neighbour (as `by_folder` weighs them);
# UTF-16 without a byte-order mark is a guess from the byte pattern, and its folder's evidence
_SETTLED = ("utf-8", "ascii")
# the fields of a text's result the prior's reading sets
FIELDS = ("source", "key", "encoding", "reason", "bytes", "output")
# ...and what the prior reads besides: how sure the file's own reading was
_FETCHED = (*FIELDS, "encoding_confidence")


class _Fact(NamedTuple):
    """One text's row number and its `_FETCHED` fields, as the prior reads them."""

    row: int
    source: str
    key: str
    encoding: str | None
    reason: str | None
    size: int
    output: str | None
    confidence: float | None


def apply(results: Columns, listing, place, settings) -> dict:
    """Decide the ambiguous texts of every folder whose others agree (``listing``: the run's
    `Listing`, where each file's bytes are; ``place``: its `CleanDir`; ``settings``: its
    `TextSettings`). Returns the report's note: how many files the prior decided, in how many
    folders (empty when none).

    Two passes over the texts' results, a part at a time (a run of millions of texts holds a few
    numbers per folder, never a row per file): which folders qualify, then their files; the
    files' bytes one folder at a time."""
    earlier = place.prior_wrote()
    wanted = {folder for folder, (legacy, read, refused) in _folder_stats(results).items()
              if legacy >= MIN_LEGACY and (len(read) > 1 or refused)}
    if not wanted and not earlier:
        return {}
    members, back = _members(results, wanted, set(earlier))
    # first: a run killed while writing knows what to write back (-1: a size no output has)
    _record(place, {**earlier, **{_output(f): -1 for facts in members.values() for f in facts}})
    written: dict[str, int] = {}
    decided: set[int] = set()
    folders = 0
    for folder in sorted(members):
        chosen = _decide_folder(listing, place, settings, members[folder])
        for row, (f, o) in chosen.items():
            written[_output(f)] = _patch(results, place, row, f, o)
        decided.update(chosen)
        folders += bool(chosen)
    _write_back(listing, place, settings, [f for f in back if f.row not in decided])
    _record(place, written)
    return {"files": len(decided), "folders": folders} if decided else {}


def _by_part(results: Columns, columns: tuple[str, ...]):
    """(rows, ``columns`` of them) of the texts of each part in turn."""
    texts = np.flatnonzero(results.kind == TEXT)
    starts = results.rows.starts
    for k in range(len(starts) - 1):
        rows = texts[(texts >= starts[k]) & (texts < starts[k + 1])]
        if len(rows):
            t = results.fetch(rows, columns)
            yield rows.tolist(), [t.column(name).to_pylist() for name in columns]


def _takes_part(encoding: str | None, reason: str | None) -> bool:
    """Whether a text is one its folder's prior weighs: read or refused on its own (a text read
    as ASCII reads the same in any code page it could be given)."""
    return reason in REFUSED or (reason is None and encoding is not None and _name(encoding) != "ascii")


def _folder_stats(results: Columns) -> dict[str, tuple[int, set, bool]]:
    """Each folder's texts read in a legacy code page (or UTF-16), the encodings its texts read
    in, and whether one was refused."""
    stats: dict[str, tuple[int, set, bool]] = {}
    for _rows, (sources, encodings, reasons) in _by_part(results, ("source", "encoding", "reason")):
        for source, enc, reason in zip(sources, encodings, reasons, strict=True):
            if not _takes_part(enc, reason):
                continue
            folder = source.rpartition("/")[0]
            legacy, read, refused = stats.get(folder, (0, set(), False))
            if reason is None:
                read.add(_name(enc))
            stats[folder] = (legacy + (reason is None and _legacy(enc)), read, refused or reason in REFUSED)
    return stats


def _members(results: Columns, wanted: set[str], earlier: set[str]) -> tuple[dict[str, list[_Fact]], list[_Fact]]:
    """The (row, `_FETCHED`...) of the texts of each ``wanted`` folder the prior weighs, and of the
    texts whose outputs are ``earlier`` ones."""
    members: dict[str, list[_Fact]] = defaultdict(list)
    back = []
    for rows, columns in _by_part(results, _FETCHED):
        for f in map(_Fact._make, zip(rows, *columns, strict=True)):
            folder = f.source.rpartition("/")[0]
            if folder in wanted and _takes_part(f.encoding, f.reason):
                members[folder].append(f)
            if f.output and f.output in earlier:
                back.append(f)
    return members, back


def _decide_folder(listing, place, settings, facts: list[_Fact]) -> dict[int, tuple]:
    """by_folder over one folder's texts: {row: (its facts, the text stage's
    outcome on the prior's reading)} of each file it decides."""
    from pipeline.media.text.clean import clean_text
    from pipeline.media.text.prior import by_folder

    data, files = [], []
    for f in facts:
        b = _read(place, listing[f.row].path) if f.size <= settings.max_bytes else b""
        data.append(b)
        files.append(_own(b, f, settings))
    out = {}
    for f, b, chosen in zip(facts, data, by_folder(files), strict=True):
        if chosen.by_prior and b:
            o = clean_text(b, settings, reading=chosen.decoded())
            if o.reason is None and o.text is not None:
                out[f.row] = (f, o)
    return out


def _own(data: bytes, fact: _Fact, settings) -> FolderFile:
    """The file's own reading, as its worker made it: its row's encoding and confidence, and the
    text stage's text of its bytes decoded strictly in that encoding (what the detection decoded:
    detecting again would cost ten times as much; bytes that no longer decode so, changed since,
    are detected again)."""
    from pipeline.media.text.clean import clean_text
    from pipeline.media.text.decoded import Decoded
    from pipeline.media.text.prior import FolderFile

    encoding, confidence = fact.encoding, fact.confidence
    if fact.reason is not None or not data:
        return FolderFile(data, None, encoding, confidence)
    o = None
    if encoding is not None:
        try:
            o = clean_text(data, settings, reading=Decoded(data.decode(encoding), encoding, confidence), fingerprints=False)
        except (UnicodeDecodeError, LookupError):
            pass  # changed since, or a codec this Python lacks: detected again
    if o is None:
        o = clean_text(data, settings, fingerprints=False)
    return FolderFile(data, o.text if o.reason is None else None, o.encoding, o.confidence)


def _patch(results: Columns, place, row: int, fact: _Fact, o) -> int:
    """The prior's reading of ``row`` written to its output and laid over its result; its size."""
    payload = o.text.encode("utf-8")
    output = _output(fact)
    _write(place, output, payload)
    results.rows.patch(row, {"encoding": o.encoding, "encoding_confidence": o.confidence, "reason": None,
                             "detail": "", "notes": list(o.notes), "content_hash": o.content_hash,
                             "minhash": o.minhash, "output": output, "output_bytes": len(payload)})
    results.reason[row] = -1
    results.flags[row] |= HAS_CHASH | HAS_MINHASH
    results.disk.write("chash", row, digest([o.content_hash]))
    results.bands.add(np.asarray([row]), [base64.b64decode(o.minhash)])
    return len(payload)


def _write_back(listing, place, settings, facts: list[_Fact]) -> None:
    """The file's own reading into each output the prior wrote in an earlier run and no longer
    decides (its result, reused, names that output)."""
    from pipeline.media.text.clean import clean_text

    for f in facts:
        b = _read(place, listing[f.row].path)
        o = clean_text(b, settings) if b else None
        if o is not None and o.text is not None and f.output:
            _write(place, f.output, o.text.encode("utf-8"))


def _write(place, output: str, payload: bytes) -> None:
    """``payload`` as ``output`` (unless it is that already), and as its parked copy where an
    earlier run parked one: finalize moves that copy back when the file ends kept."""
    from pipeline.clean.output import PARKED

    place.write_if_changed(output, payload)
    if place.sizes().get(f"{PARKED}/{output}") is not None:
        place.write_if_changed(f"{PARKED}/{output}", payload)


def _record(place, outputs: dict[str, int]) -> None:
    """`output.PRIOR`: the outputs the prior wrote (or may have), with their sizes; none: no file."""
    import json

    from pipeline.clean.output import PRIOR

    if outputs:
        place.out.write(PRIOR, json.dumps({"outputs": dict(sorted(outputs.items()))}, indent=1).encode())
    else:
        place.out.delete(PRIOR)
    place.forget_prior()


def _output(fact: _Fact) -> str:
    """Where the prior's reading of a text goes: its own output, or where a kept text's goes."""
    return fact.output or output_path(fact.source, fact.key, "txt")


def _read(place, path: str) -> bytes:
    """The file's bytes again (b"": gone since its worker read it; it takes no part)."""
    try:
        return place.inp.read(path)
    except OSError:
        return b""


def _legacy(encoding: str | None) -> bool:
    name = _name(encoding)
    return name is not None and not name.startswith(_SETTLED)


def _name(encoding: str | None) -> str | None:
    try:
        return codecs.lookup(encoding).name if encoding else None
    except LookupError:
        return None

