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
the input bytes, so a rerun (resumed or not, local, Ray or S3) decides the same and writes the
same bytes. The outputs it wrote are listed in `output.PRIOR` (with the earlier run's, before it
writes any): a rerun reuses their files' results whatever their outputs' sizes, and writes back
the file's own reading where the prior no longer decides it (its folder changed).
"""

from __future__ import annotations

import base64
import codecs
from collections import defaultdict

import numpy as np

from pipeline.clean.columns import HAS_CHASH, HAS_MINHASH, TEXT, Columns, digest
from pipeline.clean.process import output_path
from pipeline.formats.vocabulary import Reason

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


def apply(results: Columns, listing, place, settings) -> dict:
    """Decide the ambiguous texts of every folder whose others agree (``listing``: the run's
    `Listing`, where each file's bytes are; ``place``: its `CleanDir`; ``settings``: its
    `TextSettings`). Returns the report's note: how many
    files the prior decided, in how many folders (empty when none)."""
    earlier = place.prior_wrote()
    facts = _texts(results)
    chosen = {}
    for members in _folders(facts):
        chosen.update(_decide_folder(listing, place, settings, members))
    if not chosen and not earlier:
        return {}
    written = {_output(f): len(o.text.encode("utf-8")) for f, o in chosen.values()}
    _record(place, {**earlier, **written})  # first: a run killed while writing knows what to write back
    for row, (f, o) in chosen.items():
        _patch(results, place, row, f, o)
    _write_back(listing, place, settings, [f for f in facts if f[6] in earlier and f[0] not in chosen])
    _record(place, written)
    folders = {f[1].rpartition("/")[0] for f, _o in chosen.values()}
    return {"files": len(chosen), "folders": len(folders)} if chosen else {}


def _texts(results: Columns) -> list[tuple]:
    """(row, its `FIELDS`...) of every text."""
    texts = np.flatnonzero(results.kind == TEXT)
    if not len(texts):
        return []
    t = results.fetch(texts, FIELDS)
    return list(zip(texts.tolist(), *(t.column(name).to_pylist() for name in FIELDS), strict=True))


def _folders(facts: list[tuple]):
    """The texts of each folder where the prior can matter, in path order: those read or refused
    on their own (a text read as ASCII reads the same in any code page it could be given)."""
    groups: dict[str, list[tuple]] = defaultdict(list)
    for f in facts:
        if f[4] in REFUSED or (f[4] is None and f[3] is not None and _name(f[3]) != "ascii"):
            groups[f[1].rpartition("/")[0]].append(f)
    for folder in sorted(groups):
        members = groups[folder]
        read = {_name(f[3]) for f in members if f[4] is None}  # (a short Chinese caption may read as UTF-8)
        refused = any(f[4] in REFUSED for f in members)
        if sum(f[4] is None and _legacy(f[3]) for f in members) >= MIN_LEGACY and (len(read) > 1 or refused):
            yield members


def _decide_folder(listing, place, settings, facts: list[tuple]) -> dict[int, tuple]:
    """by_folder over one folder's texts: {row: (its facts, the text stage's
    outcome on the prior's reading)} of each file it decides."""
    from pipeline.media.text.clean import clean_text
    from pipeline.media.text.prior import FolderFile, by_folder

    data, files = [], []
    for f in facts:
        b = _read(place, listing[f[0]].path) if f[5] <= settings.max_bytes else b""
        o = clean_text(b, settings)  # the per-file reading again (deterministic): its text is not kept
        data.append(b)
        files.append(FolderFile(b, o.text if o.reason is None else None, o.encoding, o.confidence))
    out = {}
    for f, b, chosen in zip(facts, data, by_folder(files), strict=True):
        if chosen.by_prior and b:
            o = clean_text(b, settings, reading=chosen.decoded())
            if o.reason is None and o.text is not None:
                out[f[0]] = (f, o)
    return out


def _patch(results: Columns, place, row: int, fact: tuple, o) -> None:
    """The prior's reading of ``row`` written to its output and laid over its result."""
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


def _write_back(listing, place, settings, facts: list[tuple]) -> None:
    """The file's own reading into each output the prior wrote in an earlier run and no longer
    decides (its result, reused, names that output)."""
    from pipeline.media.text.clean import clean_text

    for f in facts:
        b = _read(place, listing[f[0]].path)
        o = clean_text(b, settings) if b else None
        if o is not None and o.text is not None:
            _write(place, f[6], o.text.encode("utf-8"))


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


def _output(fact: tuple) -> str:
    """Where the prior's reading of a text goes: its own output, or where a kept text's goes."""
    _row, source, key, _enc, _reason, _size, output = fact
    return output or output_path(source, key, "txt")


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

