"""The folder prior in `pipe clean`: a folder's texts as evidence for each other's encoding.

Twenty bytes of a caption cannot tell neighbouring code pages apart, but the captions of one
folder usually share their language and encoding (`pipeline.media.text.prior.by_folder`). This
step runs on the driver between processing and deciding, once every part is in: it picks, from
the parts' results, the folders where the prior can matter (at least `MIN_LEGACY` texts read in
a legacy code page, and either more than one such code page or a refused text), reads those
files' bytes again through the input `Folder` (local or object storage, whatever the executor),
and for each file the folder decides, writes the output the prior's reading gives and lays the
changed fields over the file's row (`columns.Rows.patch`; its hashes into the driver's columns).

The parts stay what each file said on its own: the prior is a deterministic function of them and
the input bytes, so a rerun (resumed or not, local, Ray or S3) decides the same and writes the
same bytes.
"""

from __future__ import annotations

import base64
import codecs
from collections import defaultdict

import numpy as np

from pipeline.clean.columns import HAS_CHASH, HAS_MINHASH, TEXT, Columns, digest
from pipeline.clean.process import output_path
from pipeline.formats.vocabulary import Reason

# a folder needs this many texts read in a legacy code page before its prior says anything
MIN_LEGACY = 4
# per-file verdicts the prior may overturn: the bytes were read, no encoding fitted them well
REFUSED = frozenset(r.value for r in (Reason.UNDECODABLE_TEXT, Reason.BINARY_CONTENT, Reason.GARBLED_TEXT))
_UNICODE = ("utf-8", "ascii", "utf-16", "utf-32")
# the fields of a text's result the prior's reading sets
FIELDS = ("source", "key", "encoding", "reason", "bytes", "output")


def apply(results: Columns, listing, place, settings) -> dict:
    """Decide the ambiguous texts of every folder whose others agree (``listing``: the run's
    `Listing`, where each file's bytes are; ``place``: its `CleanDir`; ``settings``: its
    `TextSettings`). Returns the report's note: how many
    files the prior decided, in how many folders (empty when none)."""
    decided, folders = 0, 0
    for rows, facts in _folders(results):
        n = _decide_folder(results, listing, place, settings, rows, facts)
        decided += n
        folders += n > 0
    return {"files": decided, "folders": folders} if decided else {}


def _folders(results: Columns):
    """(rows, their `FIELDS`) of each folder where the prior can matter, in path order."""
    texts = np.flatnonzero(results.kind == TEXT)
    if not len(texts):
        return
    t = results.fetch(texts, FIELDS)
    facts = list(zip(texts.tolist(), *(t.column(name).to_pylist() for name in FIELDS), strict=True))
    groups: dict[str, list[tuple]] = defaultdict(list)
    for f in facts:
        groups[f[1].rpartition("/")[0]].append(f)
    for folder in sorted(groups):
        members = [f for f in groups[folder] if _legacy(f[3]) or f[4] in REFUSED]
        legacy = {_name(f[3]) for f in members if _legacy(f[3])}
        refused = any(f[4] in REFUSED for f in members)
        if sum(_legacy(f[3]) for f in members) >= MIN_LEGACY and (len(legacy) > 1 or refused):
            yield [f[0] for f in members], members


def _decide_folder(results: Columns, listing, place, settings, rows: list[int], facts: list[tuple]) -> int:
    """by_folder over the folder's legacy and refused texts; each file it decides patched in. The
    number decided."""
    from pipeline.media.text.clean import clean_text
    from pipeline.media.text.prior import FolderFile, by_folder

    data, files = [], []
    for row, _source, _key, _enc, _reason, size, _out in facts:
        b = _read(place, listing[row].path) if size <= settings.max_bytes else b""
        o = clean_text(b, settings)  # the per-file reading again (deterministic): its text is not kept
        data.append(b)
        files.append(FolderFile(b, o.text if o.reason is None else None, o.encoding, o.confidence))
    n = 0
    for row, fact, b, chosen in zip(rows, facts, data, by_folder(files), strict=True):
        if chosen.by_prior and b:
            o = clean_text(b, settings, reading=chosen.decoded())
            if o.reason is None and o.text is not None:
                _patch(results, place, row, fact, o)
                n += 1
    return n


def _patch(results: Columns, place, row: int, fact: tuple, o) -> None:
    """The prior's reading of ``row`` written to its output and laid over its result."""
    from pipeline.clean.output import PARKED

    _row, source, key, _enc, _reason, _size, old_output = fact
    payload = o.text.encode("utf-8")
    output = old_output or output_path(source, key, "txt")
    place.write_if_changed(output, payload)
    if place.sizes().get(f"{PARKED}/{output}") is not None:  # an earlier run parked it: finalize moves that copy back
        place.write_if_changed(f"{PARKED}/{output}", payload)
    results.rows.patch(row, {"encoding": o.encoding, "encoding_confidence": o.confidence, "reason": None,
                             "detail": "", "notes": list(o.notes), "content_hash": o.content_hash,
                             "minhash": o.minhash, "output": output, "output_bytes": len(payload)})
    results.reason[row] = -1
    results.flags[row] |= HAS_CHASH | HAS_MINHASH
    results.disk.write("chash", row, digest([o.content_hash]))
    results.bands.add(np.asarray([row]), [base64.b64decode(o.minhash)])


def _read(place, path: str) -> bytes:
    """The file's bytes again (b"": gone since its worker read it; it takes no part)."""
    try:
        return place.inp.read(path)
    except OSError:
        return b""


def _legacy(encoding: str | None) -> bool:
    name = _name(encoding)
    return name is not None and not name.startswith(_UNICODE)


def _name(encoding: str | None) -> str | None:
    try:
        return codecs.lookup(encoding).name if encoding else None
    except LookupError:
        return None

